//! Checks of the Grafana dashboard (`deploy/grafana/mrtr-gateway.json`): its variables, and
//! that every query names known metrics and is scoped to the selected instances.

use serde_json::Value;

use super::metric_names::{metric_of, referenced};

/// The metrics the dashboard must chart (one or more panels each).
pub const REQUIRED: &[&str] = &[
    "requests_total",
    "input_required_total",
    "retries_total",
    "state_opens_total",
    "state_bytes",
    "single_use_claims_total",
    "single_use_errors_total",
    "parked_calls",
    "legacy_sessions_active",
    "legacy_sessions_failed_total",
    "upstream_duration_seconds",
    "active_requests",
    "active_connections",
    "limit_hits_total",
    "config_reloads_total",
    "draining",
];

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten());
        out.push(p);
    }
    out
}

pub fn problems(dashboard: &Value) -> Vec<String> {
    let mut p = Vec::new();
    let vars = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name).cloned();
    match var("datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        _ => p.push("no `datasource` variable of type datasource (prometheus)".into()),
    }
    match var("instance_id") {
        Some(v) if v["type"] == "query" && v["includeAll"] == true && v["multi"] == true => {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            if !q.contains("label_values(") || !q.contains("instance_id") {
                p.push(format!(
                    "the instance_id variable does not list instance_id values: {q}"
                ));
            }
        }
        _ => p.push("no multi-value `instance_id` query variable with All".into()),
    }

    let mut charted = std::collections::BTreeSet::new();
    let mut ids = std::collections::BTreeSet::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("?").to_owned();
        if let Some(id) = panel["id"].as_u64()
            && !ids.insert(id)
        {
            p.push(format!("panel id {id} is used twice"));
        }
        if panel["type"] == "row" {
            continue;
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            p.push(format!(
                "panel {title:?} does not use the datasource variable"
            ));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            p.push(format!("panel {title:?} has no query"));
        }
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or("");
            let names = referenced(expr);
            if names.is_empty() {
                p.push(format!(
                    "panel {title:?} queries no mrtr_gateway_ metric: {expr}"
                ));
            }
            for n in names {
                match metric_of(&n) {
                    Some(m) => {
                        charted.insert(m);
                    }
                    None => p.push(format!(
                        "panel {title:?} queries unknown metric mrtr_gateway_{n}"
                    )),
                }
            }
            // Every selector is scoped to the chosen instances.
            let selectors = expr.matches("mrtr_gateway_").count();
            let scoped = expr.matches("instance_id=~\"$instance_id\"").count();
            if selectors != scoped {
                p.push(format!(
                    "panel {title:?}: a selector is not scoped by instance_id: {expr}"
                ));
            }
        }
    }
    for m in REQUIRED {
        if !charted.contains(m) {
            p.push(format!("no panel charts mrtr_gateway_{m}"));
        }
    }
    p
}
