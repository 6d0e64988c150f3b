//! The deployment artifacts, validated offline: the kustomize overlays and examples under
//! `deploy/k8s` (rendered by kubectl's built-in kustomize, validated against Kubernetes'
//! strict schemas by kubernetes-validate, then checked for the pod invariants the gateway
//! relies on, whether it has a Deployment of its own or was added to an existing one), every
//! TOML configuration loaded with the gateway's own loader and checked with `check-config` as
//! documented, the Dockerfile checked statically, the Grafana dashboard and the operations
//! guide checked against the metric list.
//!
//! Needs the tools venv (`tests/peers/setup.sh`, run by `scripts/test.sh`).

mod dashboard_checks;
mod dockerfile_checks;
mod existing_deployment;
mod gateway_configs;
mod metric_names;
mod network_policy_checks;
mod pod_checks;
mod render;

use serde_json::Value;

use gateway_configs::{KeyDir, load, toml_files};
use mrtr_gateway::config::EXAMPLE_SECRET;
use pod_checks::{
    REDIS_SECRET, gateway_pod, gateway_pod_problems, hardening_problems, prometheus_duration,
    redis_store_problems, secret_problems, secret_value, single_use_problems, wiring_problems,
};
use render::{KUBERNETES_VERSIONS, Rendered, render, repo};

/// The gateway added to an existing Deployment by the gateway-sidecar component.
const EXISTING_DEPLOYMENT: &str = "deploy/k8s/examples/existing-deployment";
/// The same without the optional components (HPA, ServiceMonitor, NetworkPolicies).
const SIDECAR_ONLY: &str = "tests/k8s/gateway-sidecar-only";

/// Every kustomization that renders a deployable whole: the overlays, the example, and the
/// gateway-sidecar component on its own.
const RENDERINGS: &[&str] = &[
    "deploy/k8s/overlays/sidecar",
    "deploy/k8s/overlays/fleet-redis",
    EXISTING_DEPLOYMENT,
    SIDECAR_ONLY,
];

fn assert_none(what: &str, problems: Vec<String>) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

#[test]
fn overlays_and_examples_render_and_every_object_is_schema_valid() {
    for overlay in RENDERINGS {
        let r = render(overlay, true);
        eprintln!(
            "{overlay}: {} objects, tools {}, Kubernetes {KUBERNETES_VERSIONS:?}",
            r.objects.len(),
            r.tools
        );
        assert_none(
            &format!("{overlay} against the Kubernetes schemas"),
            r.problems.clone(),
        );
        // Only custom resources go unvalidated, and those are checked structurally in
        // `wiring_problems` (ServiceMonitor).
        for name in &r.unvalidated {
            let kind = name.split('/').next().unwrap();
            assert_eq!(
                kind, "ServiceMonitor",
                "{overlay}: {name} was not validated"
            );
        }
        assert_eq!(
            r.unvalidated.is_empty(),
            *overlay == SIDECAR_ONLY,
            "{overlay}: a ServiceMonitor where none belongs, or none where one does"
        );
    }
}

#[test]
fn gateway_pod_invariants_hold_in_every_overlay_and_example() {
    let keys = KeyDir::new();
    for overlay in RENDERINGS {
        let r = render(overlay, false);
        assert_none(
            &format!("{overlay} gateway pod"),
            gateway_pod_problems(&r, &keys, true),
        );
        assert_none(&format!("{overlay} hardening"), hardening_problems(&r));
        assert_none(&format!("{overlay} wiring"), wiring_problems(&r, &keys));
    }
}

#[test]
fn base_leaves_the_keys_to_the_operator_and_overlays_carry_only_the_public_example() {
    let keys = KeyDir::new();
    let base = render("deploy/k8s/base", true);
    assert_none("base against the Kubernetes schemas", base.problems.clone());
    assert!(
        base.all("Secret").is_empty(),
        "the base must not carry a key Secret"
    );
    assert_none(
        "base gateway pod",
        gateway_pod_problems(&base, &keys, false),
    );
    for overlay in RENDERINGS {
        let r = render(overlay, false);
        let (problems, seen) = secret_problems(&r, EXAMPLE_SECRET);
        assert_none(&format!("{overlay} secrets"), problems);
        assert!(seen > 0, "{overlay}: no key entries");
    }
}

#[test]
fn fleet_overlay_claims_states_in_its_redis_with_a_password() {
    let keys = KeyDir::new();
    let r = render("deploy/k8s/overlays/fleet-redis", false);
    assert_none(
        "fleet-redis single-use store",
        redis_store_problems(&r, &keys),
    );
    assert!(secret_value(&r, REDIS_SECRET, "password").is_some());
}

#[test]
fn every_manifest_with_more_than_one_replica_claims_states_in_redis() {
    let keys = KeyDir::new();
    for dir in ["deploy/k8s/base"].iter().chain(RENDERINGS) {
        let r = render(dir, false);
        assert_none(&format!("{dir} single use"), single_use_problems(&r, &keys));
    }
    // The sidecar overlay and the example point at the operator's Redis: its Secret is not in
    // the manifests.
    for dir in ["deploy/k8s/overlays/sidecar", EXISTING_DEPLOYMENT] {
        let r = render(dir, false);
        assert!(r.get("Secret", REDIS_SECRET).is_none(), "{dir}");
        assert!(r.get("Service", "mrtr-gateway-redis").is_none(), "{dir}");
    }
}

#[test]
fn fleet_overlay_runs_the_base_configuration_unchanged() {
    let toml = |dir: &str| {
        let r = render(dir, false);
        r.all("ConfigMap")[0]["data"]["gateway.toml"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        toml("deploy/k8s/overlays/fleet-redis"),
        read("deploy/k8s/base/gateway.toml")
    );
}

#[test]
fn every_toml_config_loads_with_the_gateway_loader() {
    let keys = KeyDir::new();
    let mut files = toml_files(&repo().join("config"));
    files.extend(toml_files(&repo().join("deploy")));
    assert!(files.len() >= 2, "found only {files:?}");
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        load(&text, f.parent(), &[], &keys).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    }
    // The TOML embedded in the rendered manifests, with the pod's environment.
    for overlay in RENDERINGS {
        let r = render(overlay, false);
        let gp = gateway_pod(&r, &keys).unwrap_or_else(|e| panic!("{overlay}: {e}"));
        assert_eq!(
            gp.loaded.config.state.keys_dir.as_deref(),
            Some(keys.path()),
            "{overlay}: keys_dir was not taken from the environment"
        );
        for cm in r.all("ConfigMap") {
            for (name, text) in cm["data"].as_object().unwrap() {
                if name.ends_with(".toml") {
                    load(text.as_str().unwrap(), None, &[], &keys)
                        .unwrap_or_else(|e| panic!("{overlay} ConfigMap {name}: {e}"));
                }
            }
        }
    }
}

/// `scripts/check-configs.sh`, the off-cluster `check-config` the operations guide documents,
/// passes every shipped configuration (each named in its output), and fails a broken one.
#[test]
fn check_config_passes_every_shipped_config_off_cluster() {
    let script = repo().join("scripts/check-configs.sh");
    let run = |args: &[&std::path::Path]| {
        std::process::Command::new(&script)
            .args(args)
            .env("MRTR_GATEWAY_BIN", env!("CARGO_BIN_EXE_mrtr-gateway"))
            .output()
            .expect("scripts/check-configs.sh runs")
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = toml_files(&repo().join("config"));
    files.extend(toml_files(&repo().join("deploy")));
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("existing-deployment/gateway.toml")),
        "{files:?}"
    );
    for f in &files {
        let rel = f.strip_prefix(repo()).unwrap().display().to_string();
        assert!(
            stdout.contains(&format!("== {rel}\n")),
            "{rel} was not checked:\n{stdout}"
        );
    }

    // A configuration an operator got wrong: the script says so with check-config's status.
    let dir = crate::support::TempDir::new("mrtr-check-configs");
    let broken = dir.path().join("gateway.toml");
    let text = read(&format!("{EXISTING_DEPLOYMENT}/gateway.toml"));
    std::fs::write(
        &broken,
        text.replace("http://127.0.0.1:8000/mcp", "127.0.0.1:8000"),
    )
    .unwrap();
    let out = run(&[&broken]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("upstream.url"),
        "{out:?}"
    );
}

#[test]
fn dockerfile_builds_the_cargo_binary_as_non_root_on_distroless() {
    let cargo: toml::Table = read("Cargo.toml").parse().unwrap();
    let bin = cargo["bin"].as_array().unwrap()[0]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let license = cargo["package"]["license"].as_str().unwrap().to_owned();
    let keys = KeyDir::new();
    let base = load(&read("deploy/k8s/base/gateway.toml"), None, &[], &keys)
        .unwrap()
        .config;
    let ports = [base.listen.addr.port(), base.admin.addr.unwrap().port()];
    let expect = dockerfile_checks::Expect {
        repo: &repo(),
        bin_name: &bin,
        license: &license,
        ports: &ports,
    };
    let problems = dockerfile_checks::problems(
        &read("deploy/Dockerfile"),
        &read("deploy/Dockerfile.dockerignore"),
        &expect,
    );
    assert_none("deploy/Dockerfile", problems);
}

#[test]
fn the_local_containerfile_gives_a_container_what_the_dockerfile_gives() {
    assert_none(
        "deploy/Containerfile.local",
        dockerfile_checks::local_problems(
            &read("deploy/Containerfile.local"),
            &read("deploy/Dockerfile"),
        ),
    );
}

#[test]
fn grafana_dashboard_charts_every_required_metric_and_only_known_ones() {
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/mrtr-gateway.json"))
        .expect("the dashboard is valid JSON");
    assert_none(
        "deploy/grafana/mrtr-gateway.json",
        dashboard_checks::problems(&dashboard),
    );
}

#[test]
fn operations_guide_names_only_known_metrics_and_links_the_metric_list() {
    let doc = read("docs/operations.md");
    assert!(
        doc.contains("(metrics.md)"),
        "docs/operations.md does not link metrics.md"
    );
    let unknown: Vec<String> = metric_names::referenced(&doc)
        .into_iter()
        .filter(|n| metric_names::metric_of(n).is_none())
        .collect();
    assert!(
        unknown.is_empty(),
        "docs/operations.md names unknown metrics: {unknown:?}"
    );
}

// ---- the checks catch broken artifacts ---------------------------------------------------
// Each test breaks one thing in a rendered overlay (in memory) or in an artifact's text and
// shows that the check above would fail on it.

fn gateway_container(r: &mut Rendered) -> &mut Value {
    let dep = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "mrtr-gateway")
        .unwrap();
    dep["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|c| c["name"] == "gateway")
        .unwrap()
}

fn gateway_pod_spec(r: &mut Rendered) -> &mut Value {
    let dep = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "mrtr-gateway")
        .unwrap();
    &mut dep["spec"]["template"]["spec"]
}

fn config_map_toml(r: &mut Rendered) -> &mut Value {
    let cm = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    &mut cm["data"]["gateway.toml"]
}

fn expect_caught(problems: Vec<String>, needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "expected a problem mentioning {needle:?}, got {problems:?}"
    );
}

#[test]
fn broken_probes_mounts_and_hardening_are_caught() {
    let keys = KeyDir::new();
    let pristine = render("deploy/k8s/overlays/sidecar", false);
    let fresh = || Rendered {
        objects: pristine.objects.clone(),
        problems: vec![],
        unvalidated: vec![],
        tools: Value::Null,
    };

    let mut r = fresh();
    gateway_container(&mut r)["readinessProbe"]["httpGet"]["path"] = "/healthz".into();
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "readinessProbe does not GET /readyz",
    );

    let mut r = fresh();
    gateway_container(&mut r)["livenessProbe"]["httpGet"]["port"] = "http".into();
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "livenessProbe is not on the admin port",
    );

    let mut r = fresh();
    for m in gateway_container(&mut r)["volumeMounts"]
        .as_array_mut()
        .unwrap()
    {
        if m["name"] == "state-keys" {
            m["mountPath"] = "/etc/mrtr-gateway/secret-keys".into();
        }
    }
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "nothing is mounted at state.keys_dir",
    );

    let mut r = fresh();
    gateway_pod_spec(&mut r)["terminationGracePeriodSeconds"] = 35.into();
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "does not exceed drain.readiness_delay",
    );

    // The grace period is compared with the drain in the config, not a constant.
    let mut r = fresh();
    let toml = config_map_toml(&mut r);
    *toml = toml
        .as_str()
        .unwrap()
        .replace("deadline = \"30s\"", "deadline = \"60s\"")
        .into();
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "does not exceed drain.readiness_delay",
    );

    let mut r = fresh();
    let toml = config_map_toml(&mut r);
    *toml = toml
        .as_str()
        .unwrap()
        .replace("0.0.0.0:9090", "127.0.0.1:9090")
        .into();
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "admin.addr 127.0.0.1:9090 is not reachable",
    );

    let mut r = fresh();
    gateway_container(&mut r)["securityContext"]["readOnlyRootFilesystem"] = false.into();
    expect_caught(hardening_problems(&r), "readOnlyRootFilesystem is not true");

    let mut r = fresh();
    gateway_container(&mut r)["securityContext"]["runAsUser"] = 0.into();
    expect_caught(hardening_problems(&r), "runs as uid 0");

    let mut r = fresh();
    let pod = gateway_pod_spec(&mut r);
    let legacy = pod["initContainers"][0].clone();
    pod["containers"].as_array_mut().unwrap().push(legacy);
    pod["initContainers"] = Value::Array(vec![]);
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "not a native sidecar",
    );

    let mut r = fresh();
    r.objects.retain(|o| o["kind"] != "Secret");
    expect_caught(
        gateway_pod_problems(&r, &keys, true),
        "(the keys) is not in the manifests",
    );

    let mut r = fresh();
    let svc = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Service")
        .unwrap();
    svc["spec"]["ports"][1]["name"] = "metrics".into();
    expect_caught(
        wiring_problems(&r, &keys),
        "endpoint port \"admin\" is not the Service's `admin`",
    );

    let mut r = fresh();
    gateway_pod_spec(&mut r); // the Deployment exists
    for o in r.objects.iter_mut().filter(|o| o["kind"] == "Deployment") {
        o["spec"]["replicas"] = 2.into();
    }
    expect_caught(wiring_problems(&r, &keys), "sets replicas although the HPA");

    // A real key committed into the example Secret.
    let mut r = fresh();
    let secret = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Secret")
        .unwrap();
    secret["stringData"]["k2026-12-02"] = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=".into();
    expect_caught(
        secret_problems(&r, EXAMPLE_SECRET).0,
        "k2026-12-02 is not the public example",
    );

    // The per-replica memory store with more than one replica.
    let mut r = fresh();
    let toml = config_map_toml(&mut r);
    *toml = toml
        .as_str()
        .unwrap()
        .replace("store = \"redis\"", "store = \"memory\"")
        .into();
    expect_caught(single_use_problems(&r, &keys), "per-replica memory store");

    // Redis URLs that do not come from the Secret.
    let mut r = fresh();
    let env = gateway_container(&mut r)["env"].as_array_mut().unwrap();
    env.retain(|e| e["name"] != pod_checks::REDIS_URLS_VAR);
    expect_caught(
        single_use_problems(&r, &keys),
        "do not come from Secret/mrtr-gateway-redis",
    );
}

#[test]
fn a_fleet_without_redis_claims_is_caught() {
    let keys = KeyDir::new();
    let pristine = render("deploy/k8s/overlays/fleet-redis", false);
    let fresh = || Rendered {
        objects: pristine.objects.clone(),
        problems: vec![],
        unvalidated: vec![],
        tools: Value::Null,
    };

    let mut r = fresh();
    let toml = config_map_toml(&mut r);
    *toml = toml
        .as_str()
        .unwrap()
        .replace("store = \"redis\"", "store = \"memory\"")
        .into();
    expect_caught(redis_store_problems(&r, &keys), "store is not \"redis\"");
    expect_caught(single_use_problems(&r, &keys), "per-replica memory store");

    // A Redis that requires no password, or a URL without the one it requires.
    let mut r = fresh();
    let args = redis_args(&mut r.objects);
    let at = args.iter().position(|a| a == "--requirepass").unwrap();
    args.drain(at..at + 2);
    expect_caught(redis_store_problems(&r, &keys), "requires no password");
    let mut r = fresh();
    let args = redis_args(&mut r.objects);
    let at = args.iter().position(|a| a == "--requirepass").unwrap();
    args[at + 1] = "hunter2".into();
    expect_caught(
        redis_store_problems(&r, &keys),
        "password is not taken from a Secret",
    );
    let mut r = fresh();
    let secret = r
        .objects
        .iter_mut()
        .find(|o| o["kind"] == "Secret" && o["metadata"]["name"] == REDIS_SECRET)
        .unwrap();
    secret["stringData"]["urls"] = r#"["redis://mrtr-gateway-redis:6379/0"]"#.into();
    expect_caught(
        redis_store_problems(&r, &keys),
        "does not carry the password Redis requires",
    );

    let mut r = fresh();
    r.objects
        .retain(|o| !(o["kind"] == "Service" && o["metadata"]["name"] == "mrtr-gateway-redis"));
    expect_caught(
        redis_store_problems(&r, &keys),
        "no Service named mrtr-gateway-redis",
    );

    let mut r = fresh();
    for o in r
        .objects
        .iter_mut()
        .filter(|o| o["metadata"]["name"] == "mrtr-gateway-redis" && o["kind"] == "Deployment")
    {
        let args = o["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array_mut()
            .unwrap();
        for a in args.iter_mut() {
            if a == "noeviction" {
                *a = "allkeys-lru".into();
            }
        }
    }
    expect_caught(redis_store_problems(&r, &keys), "may evict claims");
}

/// The fleet Redis container's `args`.
fn redis_args(objects: &mut [Value]) -> &mut Vec<Value> {
    objects
        .iter_mut()
        .find(|o| o["metadata"]["name"] == "mrtr-gateway-redis" && o["kind"] == "Deployment")
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array_mut()
        .unwrap()
}

#[test]
fn broken_dockerfiles_are_caught() {
    let good = read("deploy/Dockerfile");
    let ignore = read("deploy/Dockerfile.dockerignore");
    let expect = dockerfile_checks::Expect {
        repo: &repo(),
        bin_name: "mrtr-gateway",
        license: "Apache-2.0",
        ports: &[8080, 9090],
    };
    let check = |text: &str, ignore: &str| dockerfile_checks::problems(text, ignore, &expect);
    assert_none("the pristine Dockerfile", check(&good, &ignore));
    expect_caught(
        check(&good.replace("USER 65532:65532", "USER root"), &ignore),
        "USER root",
    );
    expect_caught(
        check(&good.replace("USER 65532:65532\n", ""), &ignore),
        "no USER",
    );
    expect_caught(
        check(
            &good.replace(
                "FROM gcr.io/distroless/cc-debian12:nonroot",
                "FROM debian:12-slim",
            ),
            &ignore,
        ),
        "not distroless",
    );
    expect_caught(
        check(
            &good.replace("COPY src ./src", "COPY source ./src"),
            &ignore,
        ),
        "source source does not exist",
    );
    expect_caught(
        check(&good, &format!("{ignore}\n/src\n")),
        "excluded by the .dockerignore",
    );
    expect_caught(
        check(
            &good.replace("release/mrtr-gateway /usr", "release/gateway /usr"),
            &ignore,
        ),
        "the final stage copies",
    );
    expect_caught(
        check(&good.replace("EXPOSE 8080 9090", "EXPOSE 8080"), &ignore),
        "port 9090",
    );
    // Short names, which podman resolves only through a host's search registries.
    expect_caught(
        check(&good.replace("docker.io/library/rust:", "rust:"), &ignore),
        "FROM rust:1.95-bookworm is not a fully qualified",
    );
    expect_caught(
        check(
            &good.replace("gcr.io/distroless/cc-debian12", "distroless/cc-debian12"),
            &ignore,
        ),
        "FROM distroless/cc-debian12:nonroot is not a fully qualified",
    );
    assert!(dockerfile_checks::fully_qualified(
        "localhost/mrtr-gateway:0.1.0"
    ));
    assert!(dockerfile_checks::fully_qualified(
        "registry.example:5000/gw:1"
    ));
    assert!(!dockerfile_checks::fully_qualified("library/rust:1.95"));
}

#[test]
fn a_local_containerfile_that_drifts_from_the_dockerfile_is_caught() {
    let good = read("deploy/Containerfile.local");
    let dockerfile = read("deploy/Dockerfile");
    let check = |text: &str| dockerfile_checks::local_problems(text, &dockerfile);
    assert_none("the pristine Containerfile.local", check(&good));
    let broken = |from: &str, to: &str| {
        assert!(good.contains(from), "Containerfile.local has no {from:?}");
        check(&good.replace(from, to))
    };
    expect_caught(broken("USER 65532:65532", "USER 1000:1000"), "USER");
    expect_caught(
        broken("FROM scratch", "FROM docker.io/library/debian:12-slim"),
        "not a single stage FROM scratch",
    );
    expect_caught(
        broken("COPY rootfs/ /", "COPY rootfs/ /\nRUN ls"),
        "RUN ls: the image is built without a runtime",
    );
    expect_caught(
        broken("COPY rootfs/ /", "COPY . /"),
        "only `COPY rootfs/ /`",
    );
    expect_caught(broken("EXPOSE 8080 9090", "EXPOSE 8080"), "EXPOSE [8080]");
    expect_caught(
        broken("\"/etc/mrtr-gateway/gateway.toml\"]", "\"/gateway.toml\"]"),
        "CMD",
    );
    expect_caught(
        broken("licenses=\"Apache-2.0\"", "licenses=\"MIT\""),
        "label org.opencontainers.image.licenses is Some(\"MIT\")",
    );
    // And the other way round: the Dockerfile moving on without it.
    let moved = dockerfile.replace(
        "ENTRYPOINT [\"/usr/local/bin/mrtr-gateway\"]",
        "ENTRYPOINT [\"/app/mrtr-gateway\"]",
    );
    expect_caught(
        dockerfile_checks::local_problems(&good, &moved),
        "ENTRYPOINT",
    );
}

#[test]
fn broken_dashboards_are_caught() {
    let good: Value = serde_json::from_str(&read("deploy/grafana/mrtr-gateway.json")).unwrap();
    let text = serde_json::to_string(&good).unwrap();
    let broken = |from: &str, to: &str| -> Vec<String> {
        assert!(text.contains(from), "the dashboard has no {from:?}");
        dashboard_checks::problems(&serde_json::from_str(&text.replace(from, to)).unwrap())
    };
    expect_caught(
        broken("mrtr_gateway_draining", "mrtr_gateway_drained"),
        "unknown metric mrtr_gateway_drained",
    );
    expect_caught(
        broken("mrtr_gateway_draining", "mrtr_gateway_active_requests"),
        "no panel charts mrtr_gateway_draining",
    );
    expect_caught(
        broken("{instance_id=~\\\"$instance_id\\\"}", "{}"),
        "not scoped by instance_id",
    );
    expect_caught(
        broken("${datasource}", "prometheus"),
        "does not use the datasource variable",
    );
}

#[test]
fn prometheus_durations_parse_like_the_crd_pattern() {
    let d = |s: &str| prometheus_duration(&Value::from(s)).map(|d| d.as_millis());
    assert_eq!(d("30s"), Some(30_000));
    assert_eq!(d("1m30s"), Some(90_000));
    assert_eq!(d("500ms"), Some(500));
    assert_eq!(d("1h5m10s250ms"), Some(3_910_250));
    assert_eq!(d("0"), Some(0));
    for bad in ["", "30", "s", "30sec", "1s1m", "1m1m", "thirty", "-1s"] {
        assert_eq!(d(bad), None, "{bad:?} was accepted");
    }
}
