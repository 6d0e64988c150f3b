//! The gateway added to an existing Deployment (`deploy/k8s/components/gateway-*`, applied in
//! `deploy/k8s/examples/existing-deployment`): the NetworkPolicies, the added container kept
//! in step with the base's, and each check shown to catch what it is about. Rendering, schema
//! validation and the pod invariants shared with the overlays are in `deploy.rs`.

use serde_json::Value;

use super::gateway_configs::KeyDir;
use super::network_policy_checks::{egress_problems, ingress_problems};
use super::pod_checks::{
    INJECT_ANNOTATION, gateway_pod_problems, hardening_problems, wiring_problems,
};
use super::render::{Rendered, render};
use super::{EXISTING_DEPLOYMENT, assert_none, expect_caught, read};

const LEGACY: &str = "legacy-mcp-server";

fn deployment(r: &mut Rendered) -> &mut Value {
    r.objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == LEGACY)
        .unwrap()
}

fn container<'a>(r: &'a mut Rendered, name: &str) -> &'a mut Value {
    deployment(r)["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == name)
        .unwrap()
}

fn object<'a>(r: &'a mut Rendered, kind: &str, name: &str) -> &'a mut Value {
    r.objects
        .iter_mut()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

#[test]
fn example_network_policies_admit_the_gateway_ports_and_let_out_what_its_config_names() {
    let keys = KeyDir::new();
    let r = render(EXISTING_DEPLOYMENT, false);
    assert_none("ingress", ingress_problems(&r, &keys));
    assert_none("egress", egress_problems(&r, &keys));
}

/// The container the component adds is the base's gateway container under other names (and
/// with seccomp on the container, since the pod is the operator's); the example's
/// configuration is the base's but for the upstream. A change to one that is not made to
/// the other fails here.
#[test]
fn the_added_gateway_is_the_base_gateway_under_other_names() {
    let base = render("deploy/k8s/base", false);
    let mut added = render(EXISTING_DEPLOYMENT, false);

    let base_dep = base.get("Deployment", "mrtr-gateway").unwrap();
    let base_pod = &base_dep["spec"]["template"]["spec"];
    let mut want = base_pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gateway")
        .unwrap()
        .clone();
    // The pod name as replica.id: left out of the added container on purpose (the operator's
    // Deployment name may leave no room for it in replica.id's 32 characters).
    want["env"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != "MRTR_GATEWAY__REPLICA__ID");
    want["securityContext"]["seccompProfile"] =
        base_pod["securityContext"]["seccompProfile"].clone();

    let renamed = |v: &Value| -> Value {
        let text = serde_json::to_string(v)
            .unwrap()
            .replace("\"mrtr-mcp\"", "\"http\"")
            .replace("\"mrtr-admin\"", "\"admin\"")
            .replace("\"mrtr-gateway-config\"", "\"config\"")
            .replace("\"mrtr-gateway-keys\"", "\"state-keys\"")
            .replace("\"name\":\"mrtr-gateway\"", "\"name\":\"gateway\"");
        serde_json::from_str(&text).unwrap()
    };
    let got = renamed(container(&mut added, "mrtr-gateway"));
    assert_eq!(
        got,
        want,
        "the added gateway container differs from the base's:\n added {}\n base  {}",
        serde_json::to_string_pretty(&got).unwrap(),
        serde_json::to_string_pretty(&want).unwrap()
    );

    let pod = &deployment(&mut added)["spec"]["template"]["spec"];
    assert_eq!(
        pod["terminationGracePeriodSeconds"],
        base_pod["terminationGracePeriodSeconds"]
    );
    assert_eq!(
        pod["securityContext"]["fsGroup"],
        base_pod["securityContext"]["fsGroup"]
    );
    let volume = |pod: &Value, name: &str| -> Value {
        let mut v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone();
        v.as_object_mut().unwrap().remove("name");
        v
    };
    assert_eq!(
        volume(pod, "mrtr-gateway-keys"),
        volume(base_pod, "state-keys")
    );

    // The configuration: the base's, but for the upstream (the operator's port) and comments.
    let table = |rel: &str| -> toml::Table {
        let mut t: toml::Table = read(rel).parse().unwrap();
        t["upstream"].as_table_mut().unwrap().remove("url");
        t
    };
    assert_eq!(
        table(&format!("{EXISTING_DEPLOYMENT}/gateway.toml")),
        table("deploy/k8s/base/gateway.toml")
    );
}

#[test]
fn a_broken_existing_deployment_example_is_caught() {
    let keys = KeyDir::new();
    let pristine = render(EXISTING_DEPLOYMENT, false);
    let fresh = || Rendered {
        objects: pristine.objects.clone(),
        problems: vec![],
        unvalidated: vec![],
        tools: Value::Null,
    };
    let pod_problems = |r: &Rendered| gateway_pod_problems(r, &keys, true);
    let network_problems = |r: &Rendered| {
        let mut p = ingress_problems(r, &keys);
        p.extend(egress_problems(r, &keys));
        p
    };
    assert_none("the pristine example", pod_problems(&fresh()));
    assert_none(
        "the pristine example's wiring",
        wiring_problems(&fresh(), &keys),
    );
    assert_none(
        "the pristine example's policies",
        network_problems(&fresh()),
    );

    // The legacy server stops while the gateway drains.
    let mut r = fresh();
    container(&mut r, LEGACY)
        .as_object_mut()
        .unwrap()
        .remove("lifecycle");
    expect_caught(pod_problems(&r), "has no preStop sleep");
    let mut r = fresh();
    container(&mut r, LEGACY)["lifecycle"]["preStop"]["sleep"]["seconds"] = 20.into();
    expect_caught(pod_problems(&r), "is shorter than drain.readiness_delay");
    let mut r = fresh();
    container(&mut r, LEGACY)["lifecycle"]["preStop"]["sleep"]["seconds"] = 50.into();
    expect_caught(
        pod_problems(&r),
        "does not end before terminationGracePeriodSeconds",
    );

    // The legacy container without its probes.
    for probe in ["livenessProbe", "readinessProbe"] {
        let mut r = fresh();
        container(&mut r, LEGACY)
            .as_object_mut()
            .unwrap()
            .remove(probe);
        expect_caught(pod_problems(&r), &format!("has no {probe}"));
    }

    // upstream.url left at a port the legacy server does not listen on.
    let mut r = fresh();
    let cm = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    let toml = cm["data"]["gateway.toml"].as_str().unwrap().to_owned();
    cm["data"]["gateway.toml"] = toml.replace("127.0.0.1:8000", "127.0.0.1:9001").into();
    expect_caught(
        pod_problems(&r),
        "names a port no other container of the pod declares",
    );

    // Key files the gateway cannot read: group-readable with no fsGroup on the pod.
    let mut r = fresh();
    deployment(&mut r)["spec"]["template"]["spec"]["securityContext"]
        .as_object_mut()
        .unwrap()
        .remove("fsGroup");
    expect_caught(pod_problems(&r), "the pod sets no fsGroup");

    // A legacy server on the gateway's port.
    let mut r = fresh();
    container(&mut r, LEGACY)["ports"][0]["containerPort"] = 8080.into();
    expect_caught(
        pod_problems(&r),
        "port 8080 of the gateway is also container",
    );

    // A Service whose variables the gateway would read as its own settings.
    let mut r = fresh();
    let mut svc = object(&mut r, "Service", LEGACY).clone();
    svc["metadata"]["name"] = "mrtr-gateway--upstream".into();
    svc["spec"]["ports"] = serde_json::json!([{"name": "x", "port": 1, "targetPort": "http"}]);
    r.objects.push(svc);
    expect_caught(pod_problems(&r), "would inject MRTR_GATEWAY__");

    // The component applied to a Deployment nobody annotated (e.g. the annotation removed
    // after the fact): the checks refuse to guess.
    let mut r = fresh();
    deployment(&mut r)["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    expect_caught(
        pod_problems(&r),
        &format!("without the {INJECT_ANNOTATION} annotation"),
    );

    // The Service's gateway port sent to the legacy server.
    let mut r = fresh();
    for x in object(&mut r, "Service", LEGACY)["spec"]["ports"]
        .as_array_mut()
        .unwrap()
    {
        if x["name"] == "mrtr-mcp" {
            x["targetPort"] = "http".into();
        }
    }
    expect_caught(
        wiring_problems(&r, &keys),
        "Service port mrtr-mcp does not reach container port mrtr-mcp",
    );

    // The HPA left on its placeholder, and the ServiceMonitor selecting nothing.
    let mut r = fresh();
    object(&mut r, "HorizontalPodAutoscaler", "mrtr-gateway")["spec"]["scaleTargetRef"]["name"] =
        "set-to-your-deployment".into();
    expect_caught(
        wiring_problems(&r, &keys),
        "does not scale the gateway Deployment",
    );
    let mut r = fresh();
    object(&mut r, "ServiceMonitor", "mrtr-gateway")["spec"]["selector"]["matchLabels"] =
        serde_json::json!({"app.kubernetes.io/name": "mrtr-gateway"});
    expect_caught(
        wiring_problems(&r, &keys),
        "not exactly Service/legacy-mcp-server",
    );

    // The gateway container loses its hardening like any other.
    let mut r = fresh();
    container(&mut r, "mrtr-gateway")["securityContext"]
        .as_object_mut()
        .unwrap()
        .remove("seccompProfile");
    deployment(&mut r)["spec"]["template"]["spec"]["securityContext"]
        .as_object_mut()
        .unwrap()
        .remove("seccompProfile");
    expect_caught(
        hardening_problems(&r),
        "seccompProfile is not RuntimeDefault",
    );

    // NetworkPolicies: the legacy port let in, every port let in, admin from everywhere,
    // no policy at all, Redis or DNS not let out.
    let ingress = |r: &mut Rendered| -> Vec<Value> {
        object(r, "NetworkPolicy", "mrtr-gateway-ingress")["spec"]["ingress"]
            .as_array()
            .unwrap()
            .clone()
    };
    let set_ingress = |r: &mut Rendered, rules: Vec<Value>| {
        object(r, "NetworkPolicy", "mrtr-gateway-ingress")["spec"]["ingress"] = rules.into();
    };
    let mut r = fresh();
    let mut rules = ingress(&mut r);
    rules[0]["ports"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"protocol": "TCP", "port": "http"}));
    set_ingress(&mut r, rules);
    expect_caught(
        network_problems(&r),
        "admits port \"http\", not one of the gateway's",
    );
    let mut r = fresh();
    let mut rules = ingress(&mut r);
    rules[0].as_object_mut().unwrap().remove("ports");
    set_ingress(&mut r, rules);
    expect_caught(
        network_problems(&r),
        "admits every port, the legacy server's too",
    );
    let mut r = fresh();
    let mut rules = ingress(&mut r);
    rules[1].as_object_mut().unwrap().remove("from");
    set_ingress(&mut r, rules);
    expect_caught(
        network_problems(&r),
        "admits the admin port from everywhere",
    );
    let mut r = fresh();
    r.objects
        .retain(|o| o["metadata"]["name"] != "mrtr-gateway-ingress");
    expect_caught(network_problems(&r), "no NetworkPolicy governs ingress");

    let mut r = fresh();
    object(&mut r, "NetworkPolicy", "mrtr-gateway-egress")["spec"]["egress"]
        .as_array_mut()
        .unwrap()
        .retain(|rule| !rule.to_string().contains("6380"));
    expect_caught(
        network_problems(&r),
        "refuse Redis redis.example.internal (TCP 6380)",
    );
    let mut r = fresh();
    object(&mut r, "NetworkPolicy", "mrtr-gateway-egress")["spec"]["egress"]
        .as_array_mut()
        .unwrap()
        .retain(|rule| !rule.to_string().contains("kube-dns"));
    expect_caught(network_problems(&r), "refuse DNS (UDP 53)");
}
