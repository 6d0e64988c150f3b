//! The NetworkPolicies around the gateway pods (the gateway-networkpolicy component), checked
//! on rendered manifests against the gateway's own configuration: what they admit in is the
//! gateway's two ports and nothing else (the legacy server beside it is reached over the
//! pod's loopback only), and what they let out covers every destination the configuration
//! names.

use serde_json::Value;

use super::gateway_configs::KeyDir;
use super::pod_checks::{GatewayPod, gateway_pod, is_loopback_url, port_of};
use super::render::{Rendered, selects};

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

/// Whether `np` applies to pods labelled `labels` (an empty `podSelector` selects them all).
fn applies_to(np: &Value, labels: &Value) -> bool {
    let sel = &np["spec"]["podSelector"];
    let everything = sel["matchLabels"].as_object().is_none_or(|m| m.is_empty())
        && arr(&sel["matchExpressions"]).is_empty();
    everything || selects(&sel["matchLabels"], labels)
}

/// Whether `np` governs `direction` ("Ingress" / "Egress"); without `policyTypes`, a policy
/// governs ingress, and egress only when it has egress rules.
fn governs(np: &Value, direction: &str) -> bool {
    match np["spec"]["policyTypes"].as_array() {
        Some(types) => types.iter().any(|t| t == direction),
        None => direction == "Ingress" || !np["spec"]["egress"].is_null(),
    }
}

/// The policies that govern `direction` for the gateway pods.
fn policies<'a>(r: &'a Rendered, gp: &GatewayPod, direction: &str) -> Vec<&'a Value> {
    r.all("NetworkPolicy")
        .into_iter()
        .filter(|np| applies_to(np, gp.labels()) && governs(np, direction))
        .collect()
}

/// The pod's port a NetworkPolicy port refers to (a name is looked up in every container).
fn pod_port(gp: &GatewayPod, port: &Value) -> Option<u64> {
    match port {
        Value::Number(n) => n.as_u64(),
        _ => std::iter::once(gp.gateway)
            .chain(gp.others())
            .find_map(|c| port_of(c, port)),
    }
}

/// Ingress: at least one policy; every rule names its ports, and those are the gateway's
/// MCP and admin ports; each of the two is admitted, never in the same rule (clients and
/// monitoring come from different places), and the admin port never from everywhere.
pub fn ingress_problems(r: &Rendered, keys: &KeyDir) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let (http, admin) = (gp.http_port(), gp.admin_port());
    let nps = policies(r, &gp, "Ingress");
    let mut p = Vec::new();
    if nps.is_empty() {
        p.push("no NetworkPolicy governs ingress to the gateway pods".into());
    }
    let (mut http_admitted, mut admin_admitted) = (false, false);
    for np in nps {
        let name = np["metadata"]["name"].as_str().unwrap_or("?");
        for rule in arr(&np["spec"]["ingress"]) {
            let ports = arr(&rule["ports"]);
            if ports.is_empty() {
                p.push(format!(
                    "NetworkPolicy/{name} admits every port, the legacy server's too"
                ));
                continue;
            }
            let numbers: Vec<Option<u64>> =
                ports.iter().map(|x| pod_port(&gp, &x["port"])).collect();
            for (x, n) in ports.iter().zip(&numbers) {
                if n.is_none() || (*n != http && *n != admin) {
                    p.push(format!(
                        "NetworkPolicy/{name} admits port {}, not one of the gateway's",
                        x["port"]
                    ));
                }
            }
            let has_http = http.is_some() && numbers.contains(&http);
            let has_admin = admin.is_some() && numbers.contains(&admin);
            http_admitted |= has_http;
            admin_admitted |= has_admin;
            if has_http && has_admin {
                p.push(format!(
                    "NetworkPolicy/{name} admits the MCP and admin ports from the same sources"
                ));
            }
            if has_admin && arr(&rule["from"]).is_empty() {
                p.push(format!(
                    "NetworkPolicy/{name} admits the admin port from everywhere"
                ));
            }
        }
    }
    if !http_admitted {
        p.push("no NetworkPolicy admits clients to the gateway's MCP port".into());
    }
    if !admin_admitted {
        p.push("no NetworkPolicy admits Prometheus to the gateway's admin port".into());
    }
    p
}

/// Egress, when a policy governs it: DNS and every destination the configuration names (the
/// Redis URLs, a JWKS URL, an upstream off the pod) is admitted, by protocol and port.
pub fn egress_problems(r: &Rendered, keys: &KeyDir) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let nps = policies(r, &gp, "Egress");
    if nps.is_empty() {
        return Vec::new();
    }
    let rules: Vec<&Value> = nps
        .iter()
        .flat_map(|np| arr(&np["spec"]["egress"]))
        .collect();
    let admits = |protocol: &str, port: u64| {
        rules.iter().any(|rule| {
            let ports = arr(&rule["ports"]);
            ports.is_empty()
                || ports.iter().any(|x| {
                    x["protocol"].as_str().unwrap_or("TCP") == protocol
                        && (x["port"].is_null() || x["port"].as_u64() == Some(port))
                })
        })
    };
    let cfg = &gp.loaded.config;
    let mut needed: Vec<(String, &str, u64)> = vec![("DNS".into(), "UDP", 53)];
    if cfg.single_use.store == mrtr_gateway::single_use::StoreKind::Redis {
        for u in &cfg.single_use.redis.urls {
            if let Ok(url) = url::Url::parse(u.as_str()) {
                let port = u64::from(url.port().unwrap_or(6379));
                needed.push((
                    format!("Redis {}", url.host_str().unwrap_or("?")),
                    "TCP",
                    port,
                ));
            }
        }
    }
    if let mrtr_gateway::auth::config::ModeConfig::Jwt(jwt) = &cfg.auth.mode
        && let Some(remote) = &jwt.remote
    {
        let port = u64::from(remote.url.port_or_known_default().unwrap_or(443));
        needed.push(("the JWKS URL".into(), "TCP", port));
    }
    let upstream = &cfg.upstream.url;
    if !is_loopback_url(upstream)
        && let Some(port) = upstream.port_or_known_default()
    {
        needed.push(("upstream.url".into(), "TCP", u64::from(port)));
    }
    needed
        .into_iter()
        .filter(|(_, protocol, port)| !admits(protocol, *port))
        .map(|(what, protocol, port)| {
            format!("the egress NetworkPolicies refuse {what} ({protocol} {port})")
        })
        .collect()
}
