//! The invariants of the gateway pod and the objects wired to it, checked on rendered
//! manifests. Each check returns the problems it found (empty = fine) rather than panicking,
//! so the tests can also show that a deliberately broken manifest is caught.

use std::time::Duration;

use serde_json::Value;

use super::gateway_configs::{KeyDir, Loaded, load};
use super::render::{Rendered, selects};

/// The gateway Deployment's (and Service's, PDB's, HPA's, ServiceMonitor's) name in the base;
/// the HPA's and ServiceMonitor's in the gateway-sidecar components too.
pub const GATEWAY: &str = "mrtr-gateway";

/// The annotation that picks the Deployment and Service the gateway-sidecar component changes.
pub const INJECT_ANNOTATION: &str = "mrtr-gateway/inject";

/// Where the gateway container sits in a rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The base: a Deployment of its own (`mrtr-gateway`), the legacy server a loopback-only
    /// native sidecar, and the Service, PDB, HPA and ServiceMonitor named after it.
    Own,
    /// The gateway-sidecar component: a container added to the operator's Deployment beside
    /// the legacy server's, ports on the operator's Service, named apart from theirs.
    Injected,
}

impl Layout {
    pub fn container(self) -> &'static str {
        match self {
            Layout::Own => "gateway",
            Layout::Injected => "mrtr-gateway",
        }
    }

    pub fn http_port(self) -> &'static str {
        match self {
            Layout::Own => "http",
            Layout::Injected => "mrtr-mcp",
        }
    }

    pub fn admin_port(self) -> &'static str {
        match self {
            Layout::Own => "admin",
            Layout::Injected => "mrtr-admin",
        }
    }
}

/// What Kubernetes appends to a Deployment's name to name a pod: "-" + pod-template-hash
/// (up to 10 characters) + "-" + 5 random characters.
const POD_NAME_SUFFIX: &str = "-7d9f8b6c5d-x2x9z";

/// The Secret holding the single-use store's URLs (and, in fleet-redis, Redis's password).
pub const REDIS_SECRET: &str = "mrtr-gateway-redis";
/// The environment variable the gateways read their Redis URLs from.
pub const REDIS_URLS_VAR: &str = "MRTR_GATEWAY__SINGLE_USE__REDIS__URLS";
/// The public password of `deploy/k8s/components/example-redis-auth`.
pub const EXAMPLE_REDIS_PASSWORD: &str = "example-public-redis-password";
/// What a Secret the manifests do not carry (the operator's) stands in for when the
/// configuration is loaded, by variable.
const OPERATOR_SECRET_STAND_INS: &[(&str, &str)] = &[(
    REDIS_URLS_VAR,
    r#"["rediss://gateway:operator-secret@redis.example.internal:6380/0"]"#,
)];

/// The value of `key` in the Secret `name` that `r` carries (`stringData` or `data`).
pub fn secret_value(r: &Rendered, name: &str, key: &str) -> Option<String> {
    use base64::Engine;
    let secret = r.get("Secret", name)?;
    if let Some(v) = secret["stringData"][key].as_str() {
        return Some(v.to_owned());
    }
    let encoded = secret["data"][key].as_str()?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    String::from_utf8(bytes).ok()
}

/// A container's environment as Kubernetes would give it: plain values, Secret references
/// resolved from `r` (`None` when the Secret is not in the manifests), in order.
fn container_env(r: &Rendered, c: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    arr(&c["env"])
        .iter()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or("").to_owned();
            let secret = &e["valueFrom"]["secretKeyRef"];
            match (e["value"].as_str(), secret["name"].as_str()) {
                (Some(v), _) => (name, Some(v.to_owned()), None),
                (None, Some(s)) => {
                    let key = secret["key"].as_str().unwrap_or("");
                    (name, secret_value(r, s, key), Some(s.to_owned()))
                }
                _ => (name, None, None),
            }
        })
        .collect()
}

/// Replaces `$(VAR)` references with the container's environment, as Kubernetes does in
/// `args`; `None` when one cannot be resolved.
fn expand(text: &str, env: &[(String, Option<String>, Option<String>)]) -> Option<String> {
    let mut out = text.to_owned();
    for (name, value, _) in env {
        let reference = format!("$({name})");
        if out.contains(&reference) {
            out = out.replace(&reference, value.as_deref()?);
        }
    }
    (!out.contains("$(")).then_some(out)
}

fn arr(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    arr(&pod["initContainers"])
        .iter()
        .chain(arr(&pod["containers"]))
}

/// The gateway pod, its gateway container and its configuration as loaded.
pub struct GatewayPod<'a> {
    pub layout: Layout,
    pub deployment: &'a Value,
    pub pod: &'a Value,
    pub gateway: &'a Value,
    pub loaded: Loaded,
    /// `state.keys_dir` as the pod sees it (the loaded config's points at the test's keys).
    pub keys_dir: Option<String>,
    /// Variables set from a Secret: (variable, Secret name, whether `r` carries the Secret).
    pub from_secrets: Vec<(String, String, bool)>,
}

/// The port of `container` a probe, Service or NetworkPolicy refers to, by name or number.
pub fn port_of(container: &Value, port: &Value) -> Option<u64> {
    let ports = arr(&container["ports"]);
    match port {
        Value::String(name) => ports
            .iter()
            .find(|p| p["name"] == name.as_str())
            .and_then(|p| p["containerPort"].as_u64()),
        Value::Number(n) => n
            .as_u64()
            .filter(|n| ports.iter().any(|p| p["containerPort"] == *n)),
        _ => None,
    }
}

impl GatewayPod<'_> {
    /// The gateway container's port a probe or Service refers to, by name or number.
    pub fn container_port(&self, port: &Value) -> Option<u64> {
        port_of(self.gateway, port)
    }

    /// The gateway's MCP port (`http` / `mrtr-mcp`), as a number.
    pub fn http_port(&self) -> Option<u64> {
        self.container_port(&Value::from(self.layout.http_port()))
    }

    /// The gateway's admin port (`admin` / `mrtr-admin`), as a number.
    pub fn admin_port(&self) -> Option<u64> {
        self.container_port(&Value::from(self.layout.admin_port()))
    }

    /// The pod's other containers: the legacy server (and whatever else the operator runs).
    pub fn others(&self) -> impl Iterator<Item = &Value> {
        containers(self.pod).filter(|c| c["name"] != self.gateway["name"])
    }

    /// The labels of the gateway's pods.
    pub fn labels(&self) -> &Value {
        &self.deployment["spec"]["template"]["metadata"]["labels"]
    }
}

/// The Deployment carrying the gateway: the base's own, or the one the gateway-sidecar
/// component was applied to (exactly one, annotated, with the component's container).
fn find_gateway_deployment(r: &Rendered) -> Result<(Layout, &Value), String> {
    if let Some(d) = r.get("Deployment", GATEWAY) {
        return Ok((Layout::Own, d));
    }
    let container = Layout::Injected.container();
    let carrying: Vec<&Value> = r
        .all("Deployment")
        .into_iter()
        .filter(|d| {
            arr(&d["spec"]["template"]["spec"]["containers"])
                .iter()
                .any(|c| c["name"] == container)
        })
        .collect();
    match carrying[..] {
        [d] if d["metadata"]["annotations"][INJECT_ANNOTATION] == "true" => {
            Ok((Layout::Injected, d))
        }
        [d] => Err(format!(
            "Deployment/{} carries the gateway without the {INJECT_ANNOTATION} annotation",
            d["metadata"]["name"].as_str().unwrap_or("?")
        )),
        [] => Err("no Deployment/mrtr-gateway and no Deployment the gateway was added to".into()),
        _ => Err(format!(
            "the gateway was added to {} Deployments; the components expect one",
            carrying.len()
        )),
    }
}

/// Finds the gateway pod in `r` and loads the TOML it mounts with the environment it sets.
pub fn gateway_pod<'a>(r: &'a Rendered, keys: &KeyDir) -> Result<GatewayPod<'a>, String> {
    let (layout, deployment) = find_gateway_deployment(r)?;
    let pod = &deployment["spec"]["template"]["spec"];
    let gateway = arr(&pod["containers"])
        .iter()
        .find(|c| c["name"] == layout.container())
        .ok_or_else(|| format!("no container named {}", layout.container()))?;
    let args: Vec<&str> = arr(&gateway["args"])
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let config_path = args
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| w[1])
        .ok_or("the gateway container passes no --config")?;
    let mount = arr(&gateway["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"] == config_path)
        .ok_or_else(|| format!("nothing is mounted at --config {config_path}"))?;
    let volume = arr(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == mount["name"])
        .ok_or("the config mount names no volume")?;
    let cm_name = volume["configMap"]["name"]
        .as_str()
        .ok_or("the config volume is not a ConfigMap")?;
    let key = mount["subPath"]
        .as_str()
        .ok_or("the config file is not mounted with subPath")?;
    let text = r
        .get("ConfigMap", cm_name)
        .and_then(|cm| cm["data"][key].as_str())
        .ok_or_else(|| format!("ConfigMap/{cm_name} has no {key}"))?;

    let deployment_name = deployment["metadata"]["name"].as_str().unwrap_or("");
    let mut env = Vec::new();
    let mut from_secrets = Vec::new();
    for e in arr(&gateway["env"]) {
        let name = e["name"].as_str().unwrap_or("").to_owned();
        let secret = &e["valueFrom"]["secretKeyRef"];
        if let Some(v) = e["value"].as_str() {
            env.push((name, v.to_owned()));
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            // The longest name a pod of this Deployment can get.
            env.push((name, format!("{deployment_name}{POD_NAME_SUFFIX}")));
        } else if let Some(secret_name) = secret["name"].as_str() {
            let carried = secret_value(r, secret_name, secret["key"].as_str().unwrap_or(""));
            from_secrets.push((name.clone(), secret_name.to_owned(), carried.is_some()));
            // The operator's Secret: a stand-in of the documented shape.
            let value = carried.or_else(|| {
                OPERATOR_SECRET_STAND_INS
                    .iter()
                    .find(|(var, _)| *var == name)
                    .map(|(_, v)| (*v).to_owned())
            });
            if let Some(v) = value {
                env.push((name, v));
            }
        }
    }
    let loaded = load(text, None, &env, keys)
        .map_err(|e| format!("ConfigMap/{cm_name} {key} does not load in the pod: {e}"))?;
    let keys_dir = env
        .iter()
        .find(|(k, _)| k == "MRTR_GATEWAY__STATE__KEYS_DIR")
        .map(|(_, v)| v.clone())
        .or_else(|| {
            let dir = loaded.table.get("state")?.get("keys_dir")?;
            dir.as_str().map(str::to_owned)
        });
    Ok(GatewayPod {
        layout,
        deployment,
        pod,
        gateway,
        loaded,
        keys_dir,
        from_secrets,
    })
}

/// Non-root, read-only root filesystem, no privilege escalation, no capabilities, seccomp,
/// resources and pinned images, for every container of every Deployment in `r`.
pub fn hardening_problems(r: &Rendered) -> Vec<String> {
    let mut p = Vec::new();
    for dep in r.all("Deployment") {
        let dname = dep["metadata"]["name"].as_str().unwrap_or("?");
        let pod = &dep["spec"]["template"]["spec"];
        let psc = &pod["securityContext"];
        if pod["automountServiceAccountToken"] != false {
            p.push(format!(
                "{dname}: automountServiceAccountToken is not false"
            ));
        }
        if psc["runAsUser"] == 0 {
            p.push(format!("{dname}: pod runs as uid 0"));
        }
        for c in containers(pod) {
            let at = format!("{dname}/{}", c["name"].as_str().unwrap_or("?"));
            let sc = &c["securityContext"];
            let non_root = sc["runAsNonRoot"] == true
                || (psc["runAsNonRoot"] == true && sc["runAsNonRoot"] != false);
            if !non_root {
                p.push(format!("{at}: runAsNonRoot is not set"));
            }
            if sc["runAsUser"] == 0 {
                p.push(format!("{at}: runs as uid 0"));
            }
            if sc["readOnlyRootFilesystem"] != true {
                p.push(format!("{at}: readOnlyRootFilesystem is not true"));
            }
            if sc["allowPrivilegeEscalation"] != false {
                p.push(format!("{at}: allowPrivilegeEscalation is not false"));
            }
            if sc["privileged"] == true {
                p.push(format!("{at}: privileged"));
            }
            if !arr(&sc["capabilities"]["drop"]).contains(&Value::from("ALL")) {
                p.push(format!("{at}: capabilities do not drop ALL"));
            }
            if !arr(&sc["capabilities"]["add"]).is_empty() {
                p.push(format!("{at}: adds capabilities"));
            }
            let seccomp = sc["seccompProfile"]["type"]
                .as_str()
                .or(psc["seccompProfile"]["type"].as_str());
            if seccomp != Some("RuntimeDefault") {
                p.push(format!("{at}: seccompProfile is not RuntimeDefault"));
            }
            for (what, v) in [
                ("requests.cpu", &c["resources"]["requests"]["cpu"]),
                ("requests.memory", &c["resources"]["requests"]["memory"]),
                ("limits.memory", &c["resources"]["limits"]["memory"]),
            ] {
                if v.is_null() {
                    p.push(format!("{at}: no resources.{what}"));
                }
            }
            let image = c["image"].as_str().unwrap_or("");
            let tag = image.rsplit('/').next().unwrap_or("").split_once(':');
            if tag.is_none_or(|(_, t)| t.is_empty() || t == "latest") {
                p.push(format!("{at}: image {image:?} is not pinned to a tag"));
            }
        }
    }
    p
}

pub fn is_loopback_url(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The gateway pod: config mounted where `--config` says, the keys Secret at `state.keys_dir`
/// and readable by the gateway, probes on the admin port, listen/admin bound where the Service
/// and kubelet reach them on ports no other container declares, a grace period longer than
/// the drain, and a legacy server that outlives the drain: a loopback-only native sidecar
/// (the base), or, beside an added gateway, a container with probes of its own, a preStop
/// pause as long as the drain and the port `upstream.url` names. `secret_required`: whether
/// the keys Secret must be part of `r` (overlays, examples) or is provided by the operator
/// (the base).
pub fn gateway_pod_problems(r: &Rendered, keys: &KeyDir, secret_required: bool) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let cfg = &gp.loaded.config;
    let mut p = Vec::new();

    // Where the listeners bind, and the ports the kubelet and the Service use.
    let listen = cfg.listen.addr;
    if !listen.ip().is_unspecified() {
        p.push(format!(
            "listen.addr {listen} is not reachable from the Service"
        ));
    }
    let (http_name, admin_name) = (gp.layout.http_port(), gp.layout.admin_port());
    if gp.http_port() != Some(u64::from(listen.port())) {
        p.push(format!(
            "container port `{http_name}` is not listen.addr's port {}",
            listen.port()
        ));
    }
    let admin_port = match cfg.admin.addr {
        Some(a) if a.ip().is_unspecified() => Some(u64::from(a.port())),
        Some(a) => {
            p.push(format!("admin.addr {a} is not reachable by the kubelet"));
            None
        }
        None => {
            p.push("admin.addr is disabled: no probes, no metrics".into());
            None
        }
    };
    if gp.admin_port() != admin_port {
        p.push(format!(
            "container port `{admin_name}` is not admin.addr's port"
        ));
    }
    // The containers of a pod share its network: a port another container declares is taken.
    for port in [Some(u64::from(listen.port())), admin_port]
        .into_iter()
        .flatten()
    {
        for other in gp.others() {
            if arr(&other["ports"])
                .iter()
                .any(|x| x["containerPort"] == port)
            {
                p.push(format!(
                    "port {port} of the gateway is also container {}'s",
                    other["name"]
                ));
            }
        }
    }
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        let get = &gp.gateway[probe]["httpGet"];
        if get["path"] != path {
            p.push(format!("{probe} does not GET {path}: {}", get["path"]));
        }
        if admin_port.is_none() || gp.container_port(&get["port"]) != admin_port {
            p.push(format!("{probe} is not on the admin port: {}", get["port"]));
        }
    }

    // The keys Secret at state.keys_dir, as a whole directory so that updates arrive.
    match &gp.keys_dir {
        None => p.push("state.keys_dir is not set".into()),
        Some(dir) => {
            let mount = arr(&gp.gateway["volumeMounts"])
                .iter()
                .find(|m| m["mountPath"] == dir.as_str());
            match mount {
                None => p.push(format!("nothing is mounted at state.keys_dir {dir}")),
                Some(m) => {
                    if !m["subPath"].is_null() {
                        p.push("the keys are mounted with subPath: no live rotation".into());
                    }
                    if m["readOnly"] != true {
                        p.push("the keys mount is not readOnly".into());
                    }
                    let vol = arr(&gp.pod["volumes"])
                        .iter()
                        .find(|v| v["name"] == m["name"]);
                    match vol.and_then(|v| v["secret"]["secretName"].as_str()) {
                        None => p.push("the keys volume is not a Secret".into()),
                        Some(s) if secret_required && r.get("Secret", s).is_none() => {
                            p.push(format!("Secret/{s} (the keys) is not in the manifests"));
                        }
                        Some(_) => {
                            let mode = vol.unwrap()["secret"]["defaultMode"].as_u64();
                            if mode.is_none_or(|m| m & 0o007 != 0) {
                                p.push("the key files are readable by others".into());
                            }
                            // Kubernetes writes them owned by root, group fsGroup (a group
                            // every container of the pod is in); the gateway is not root.
                            let fs_group = gp.pod["securityContext"]["fsGroup"].as_u64();
                            if mode.is_some_and(|m| m & 0o040 != 0) && fs_group.is_none() {
                                p.push(
                                    "the key files are group-readable, but the pod sets no \
                                     fsGroup: the gateway cannot read them"
                                        .into(),
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    // Drain: SIGTERM -> readiness_delay -> deadline -> exit, all inside the grace period.
    let drain = cfg.drain.readiness_delay + cfg.drain.deadline;
    let grace = Duration::from_secs(
        gp.pod["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30),
    );
    if grace <= drain {
        p.push(format!(
            "terminationGracePeriodSeconds {grace:?} does not exceed drain.readiness_delay + \
             drain.deadline = {drain:?}"
        ));
    }

    // The legacy server, reached over the pod's loopback, outlives the gateway's drain.
    if !is_loopback_url(&cfg.upstream.url) {
        p.push(format!(
            "upstream.url {} is not the pod's loopback",
            cfg.upstream.url
        ));
    }
    match gp.layout {
        Layout::Own => {
            let sidecars = arr(&gp.pod["initContainers"])
                .iter()
                .filter(|c| c["restartPolicy"] == "Always")
                .count();
            if sidecars == 0 {
                p.push(
                    "the legacy server is not a native sidecar (initContainers, restartPolicy: \
                     Always)"
                        .into(),
                );
            }
            // The pod name becomes replica.id (checked by loading above); Service links
            // off, since a Service named like "mrtr-gateway--x" would inject MRTR_GATEWAY__X_…
            // variables.
            if gp.pod["enableServiceLinks"] != false {
                p.push("enableServiceLinks is not false".into());
            }
        }
        Layout::Injected => {
            p.extend(legacy_beside_gateway_problems(&gp, drain, grace));
            // The operator's pod keeps its Service links (their server may read them): no
            // Service here may be named so that its variables look like the gateway's.
            for svc in r.all("Service") {
                let name = svc["metadata"]["name"].as_str().unwrap_or("");
                if name.starts_with("mrtr-gateway--") {
                    p.push(format!(
                        "Service/{name} would inject MRTR_GATEWAY__… variables into the pod"
                    ));
                }
            }
        }
    }
    p
}

/// The legacy server beside an added gateway (both regular containers, both sent SIGTERM at
/// once): it pauses in preStop for at least the drain, inside the grace period; it has
/// liveness and readiness probes; it declares the port `upstream.url` names.
fn legacy_beside_gateway_problems(
    gp: &GatewayPod,
    drain: Duration,
    grace: Duration,
) -> Vec<String> {
    let mut p = Vec::new();
    let upstream_port = gp.loaded.config.upstream.url.port_or_known_default();
    let mut serves_upstream = false;
    for c in gp.others() {
        let at = format!("container {}", c["name"]);
        for probe in ["livenessProbe", "readinessProbe"] {
            let pr = &c[probe];
            if pr.is_null() {
                p.push(format!("{at} has no {probe}"));
                continue;
            }
            for kind in ["httpGet", "tcpSocket", "grpc"] {
                let port = &pr[kind]["port"];
                if !pr[kind].is_null() && port_of(c, port).is_none() && !port.is_number() {
                    p.push(format!("{at}: {probe} names no port of its own: {port}"));
                }
            }
        }
        match c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64() {
            None => p.push(format!(
                "{at} has no preStop sleep: it stops while the gateway drains"
            )),
            Some(s) if Duration::from_secs(s) < drain => p.push(format!(
                "{at}'s preStop sleep ({s}s) is shorter than drain.readiness_delay + \
                 drain.deadline = {drain:?}"
            )),
            Some(s) if Duration::from_secs(s) >= grace => p.push(format!(
                "{at}'s preStop sleep ({s}s) does not end before terminationGracePeriodSeconds \
                 ({grace:?})"
            )),
            Some(_) => {}
        }
        if upstream_port.is_some_and(|port| {
            arr(&c["ports"])
                .iter()
                .any(|x| x["containerPort"] == u64::from(port))
        }) {
            serves_upstream = true;
        }
    }
    if !serves_upstream {
        p.push(format!(
            "upstream.url {} names a port no other container of the pod declares",
            gp.loaded.config.upstream.url
        ));
    }
    p
}

/// The Service in front of the gateway: the base's own, or the operator's that the
/// gateway-sidecar component gave the gateway's ports (exactly one selecting the pods).
pub fn gateway_service<'a>(r: &'a Rendered, gp: &GatewayPod) -> Result<&'a Value, String> {
    if gp.layout == Layout::Own {
        return r
            .get("Service", GATEWAY)
            .ok_or("no Service/mrtr-gateway".into());
    }
    let http = gp.layout.http_port();
    let carrying: Vec<&Value> = r
        .all("Service")
        .into_iter()
        .filter(|s| arr(&s["spec"]["ports"]).iter().any(|x| x["name"] == http))
        .collect();
    match carrying[..] {
        [s] => Ok(s),
        [] => Err(format!("no Service has a port named {http}")),
        _ => Err(format!(
            "{} Services have a port named {http}; the components expect one",
            carrying.len()
        )),
    }
}

/// The Service, PodDisruptionBudget, HorizontalPodAutoscaler and ServiceMonitor point at the
/// gateway pods and ports. The base must carry all four; beside an added gateway the Service
/// is the operator's and the others are optional (checked when present).
pub fn wiring_problems(r: &Rendered, keys: &KeyDir) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let own = gp.layout == Layout::Own;
    let labels = gp.labels();
    let mut p = Vec::new();
    if !selects(&gp.deployment["spec"]["selector"]["matchLabels"], labels) {
        p.push("the Deployment's selector does not match its pods".into());
    }
    let admin_port = gp.admin_port();

    // Service: both gateway ports, by name, onto the gateway container (never the legacy
    // server); in the base no other port, beside an added gateway the operator's ports onto
    // their containers.
    let service = gateway_service(r, &gp);
    match &service {
        Err(e) => p.push(e.clone()),
        Ok(svc) => {
            let sname = svc["metadata"]["name"].as_str().unwrap_or("?");
            if !selects(&svc["spec"]["selector"], labels) {
                p.push(format!("Service/{sname} does not select the gateway pods"));
            }
            let target_of = |x: &Value| -> Value {
                if x["targetPort"].is_null() {
                    x["port"].clone()
                } else {
                    x["targetPort"].clone()
                }
            };
            for want in [gp.layout.http_port(), gp.layout.admin_port()] {
                let port = arr(&svc["spec"]["ports"])
                    .iter()
                    .find(|x| x["name"] == want);
                match port {
                    None => p.push(format!("Service/{sname} has no port named {want}")),
                    Some(x) => {
                        if gp.container_port(&target_of(x)) != gp.container_port(&Value::from(want))
                        {
                            p.push(format!(
                                "Service port {want} does not reach container port {want}"
                            ));
                        }
                    }
                }
            }
            for x in arr(&svc["spec"]["ports"]) {
                let target = target_of(x);
                let reached = if own {
                    gp.container_port(&target).is_some()
                } else {
                    containers(gp.pod).any(|c| port_of(c, &target).is_some())
                };
                if !reached {
                    p.push(format!(
                        "Service port {} reaches no {} port",
                        x["name"],
                        if own { "gateway" } else { "container" }
                    ));
                }
            }
        }
    }

    // PDB: selects the pods and lets one go at a time.
    let min_replicas = r
        .get("HorizontalPodAutoscaler", GATEWAY)
        .and_then(|h| h["spec"]["minReplicas"].as_u64())
        .unwrap_or(1);
    let pdbs: Vec<&Value> = if own {
        r.get("PodDisruptionBudget", GATEWAY).into_iter().collect()
    } else {
        r.all("PodDisruptionBudget")
            .into_iter()
            .filter(|pdb| selects(&pdb["spec"]["selector"]["matchLabels"], labels))
            .collect()
    };
    if own && pdbs.is_empty() {
        p.push("no PodDisruptionBudget/mrtr-gateway".into());
    }
    for pdb in pdbs {
        if pdb["apiVersion"] != "policy/v1" {
            p.push("the PodDisruptionBudget is not policy/v1".into());
        }
        if !selects(&pdb["spec"]["selector"]["matchLabels"], labels) {
            p.push("the PodDisruptionBudget does not select the gateway pods".into());
        }
        let allows_one = match (
            pdb["spec"]["maxUnavailable"].as_u64(),
            pdb["spec"]["minAvailable"].as_u64(),
        ) {
            (Some(n), None) => n >= 1,
            (None, Some(n)) => n < min_replicas,
            _ => false,
        };
        if !allows_one {
            p.push("the PodDisruptionBudget never allows a disruption at minReplicas".into());
        }
    }

    // HPA: autoscaling/v2 on the Deployment, at least two replicas, CPU requests to scale on.
    match r.get("HorizontalPodAutoscaler", GATEWAY) {
        None if own => p.push("no HorizontalPodAutoscaler/mrtr-gateway".into()),
        None => {}
        Some(hpa) => {
            let target = &hpa["spec"]["scaleTargetRef"];
            if hpa["apiVersion"] != "autoscaling/v2"
                || target["kind"] != "Deployment"
                || target["name"] != gp.deployment["metadata"]["name"]
            {
                p.push(format!(
                    "the HorizontalPodAutoscaler does not scale the gateway Deployment \
                     (autoscaling/v2): it scales {}",
                    target["name"]
                ));
            }
            if !gp.deployment["spec"]["replicas"].is_null() {
                p.push("the Deployment sets replicas although the HPA owns the count".into());
            }
            if min_replicas < 2 {
                p.push("minReplicas is below 2".into());
            }
            if hpa["spec"]["maxReplicas"].as_u64().unwrap_or(0) < min_replicas {
                p.push("maxReplicas is below minReplicas".into());
            }
        }
    }

    // ServiceMonitor, checked structurally (no CRD schema is bundled).
    let monitors = r.all("ServiceMonitor");
    if own && monitors.is_empty() {
        p.push("no ServiceMonitor".into());
    }
    let service_name = service
        .ok()
        .and_then(|s| s["metadata"]["name"].as_str())
        .unwrap_or(GATEWAY);
    for sm in monitors {
        p.extend(service_monitor_problems(
            r,
            sm,
            service_name,
            gp.layout.admin_port(),
            admin_port,
        ));
    }
    p
}

/// A ServiceMonitor (monitoring.coreos.com/v1) checked field by field: the fields this
/// project uses are typed as in the prometheus-operator CRD (durations in its
/// `1h30m`/`30s`/`500ms` format), unknown fields are refused, and it must select exactly the
/// gateway's Service (`service`) and scrape its admin port (named `admin_name`) at `/metrics`.
fn service_monitor_problems(
    r: &Rendered,
    sm: &Value,
    service: &str,
    admin_name: &str,
    admin_port: Option<u64>,
) -> Vec<String> {
    const SPEC_FIELDS: &[&str] = &["selector", "endpoints", "namespaceSelector", "jobLabel"];
    const ENDPOINT_FIELDS: &[&str] = &[
        "port",
        "path",
        "interval",
        "scrapeTimeout",
        "scheme",
        "honorLabels",
        "relabelings",
        "metricRelabelings",
    ];
    let mut p = Vec::new();
    let name = sm["metadata"]["name"].as_str().unwrap_or("?");
    let at = format!("ServiceMonitor/{name}");
    if sm["apiVersion"] != "monitoring.coreos.com/v1" {
        p.push(format!("{at}: apiVersion is not monitoring.coreos.com/v1"));
    }
    for k in sm["spec"].as_object().into_iter().flat_map(|o| o.keys()) {
        if !SPEC_FIELDS.contains(&k.as_str()) {
            p.push(format!("{at}: unknown field spec.{k}"));
        }
    }
    let selected: Vec<&Value> = r
        .all("Service")
        .into_iter()
        .filter(|s| {
            selects(
                &sm["spec"]["selector"]["matchLabels"],
                &s["metadata"]["labels"],
            )
        })
        .collect();
    if selected.len() != 1 || selected[0]["metadata"]["name"] != service {
        p.push(format!(
            "{at}: selects {:?}, not exactly Service/{service}",
            selected
                .iter()
                .map(|s| &s["metadata"]["name"])
                .collect::<Vec<_>>()
        ));
    }
    let endpoints = arr(&sm["spec"]["endpoints"]);
    if endpoints.is_empty() {
        p.push(format!("{at}: no endpoints"));
    }
    for ep in endpoints {
        for k in ep.as_object().into_iter().flat_map(|o| o.keys()) {
            if !ENDPOINT_FIELDS.contains(&k.as_str()) {
                p.push(format!("{at}: unknown endpoint field {k}"));
            }
        }
        let port = ep["port"].as_str();
        let svc_port = selected.first().and_then(|s| {
            arr(&s["spec"]["ports"])
                .iter()
                .find(|x| x["name"].as_str() == port)
        });
        if port != Some(admin_name) || svc_port.is_none() {
            p.push(format!(
                "{at}: endpoint port {} is not the Service's `{admin_name}`",
                ep["port"]
            ));
        }
        if admin_port.is_none() {
            p.push(format!("{at}: the gateway has no admin port to scrape"));
        }
        if ep["path"] != "/metrics" {
            p.push(format!(
                "{at}: endpoint path {} is not /metrics",
                ep["path"]
            ));
        }
        let interval = prometheus_duration(&ep["interval"]);
        let timeout = prometheus_duration(&ep["scrapeTimeout"]);
        match (interval, timeout) {
            (Some(i), Some(t)) if t <= i => {}
            _ => p.push(format!(
                "{at}: interval {} / scrapeTimeout {} are not durations with timeout <= interval",
                ep["interval"], ep["scrapeTimeout"]
            )),
        }
    }
    p
}

/// Parses the duration format of prometheus-operator's CRDs (`[0-9]+` followed by y, w, d, h,
/// m, s or ms, units in that order, each at most once; or "0").
pub fn prometheus_duration(v: &Value) -> Option<Duration> {
    const UNITS: &[(&str, u64)] = &[
        ("y", 365 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ];
    let mut rest = v.as_str()?;
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0u64;
    let mut next_unit = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        // Longest unit name first, so "ms" is not read as "m" then "s".
        let (i, (unit, ms)) = UNITS
            .iter()
            .enumerate()
            .skip(next_unit)
            .find(|(_, (u, _))| rest.starts_with(u) && !(*u == "m" && rest.starts_with("ms")))?;
        rest = &rest[unit.len()..];
        total += n * ms;
        next_unit = i + 1;
    }
    (next_unit > 0).then_some(Duration::from_millis(total))
}

/// Every Secret that `r` carries holds only public examples: the example state key, and in
/// Secret/mrtr-gateway-redis the example Redis password (alone, or in every URL). No real key
/// material or password is ever committed. Returns the problems and how many entries were
/// seen.
pub fn secret_problems(r: &Rendered, example_secret: &str) -> (Vec<String>, usize) {
    use base64::Engine;
    let mut p = Vec::new();
    let mut seen = 0;
    for s in r.all("Secret") {
        let name = s["metadata"]["name"].as_str().unwrap_or("?");
        let plain = s["stringData"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()));
        let encoded = s["data"].as_object().into_iter().flatten().map(|(k, v)| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or(""))
                .unwrap_or_default();
            (k.clone(), String::from_utf8_lossy(&bytes).into_owned())
        });
        for (key, value) in plain.chain(encoded) {
            seen += 1;
            let public = if name == REDIS_SECRET {
                match key.as_str() {
                    "password" => value == EXAMPLE_REDIS_PASSWORD,
                    "urls" => format!("v = {value}")
                        .parse::<toml::Table>()
                        .ok()
                        .and_then(|mut t| t.remove("v"))
                        .and_then(|v| v.as_array().cloned())
                        .is_some_and(|urls| {
                            !urls.is_empty()
                                && urls.iter().all(|u| {
                                    u.as_str()
                                        .and_then(|u| url::Url::parse(u).ok())
                                        .is_some_and(|u| {
                                            u.password() == Some(EXAMPLE_REDIS_PASSWORD)
                                        })
                                })
                        }),
                    _ => false,
                }
            } else {
                value.trim() == example_secret
            };
            if !public {
                p.push(format!(
                    "Secret/{name} entry {key} is not the public example"
                ));
            }
        }
    }
    (p, seen)
}

/// The fleet's single-use store: the config claims in Redis, at an address that is a Service
/// of the overlay, served by a Redis that refuses to evict and admits the gateway pods.
pub fn redis_store_problems(r: &Rendered, keys: &KeyDir) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let gateway_labels = &gp.deployment["spec"]["template"]["metadata"]["labels"];
    let mut p = Vec::new();
    let single_use = &gp.loaded.config.single_use;
    if single_use.store != mrtr_gateway::single_use::StoreKind::Redis {
        p.push("the config's [single_use] store is not \"redis\"".into());
    }
    for u in &single_use.redis.urls {
        let u = u.as_str();
        let Ok(url) = url::Url::parse(u) else {
            p.push(format!("{u:?} is not a URL"));
            continue;
        };
        let host = url.host_str().unwrap_or("");
        let port = u64::from(url.port().unwrap_or(6379));
        let Some(svc) = r.get("Service", host) else {
            p.push(format!("{host}: no Service named {host} in the manifests"));
            continue;
        };
        let Some(svc_port) = arr(&svc["spec"]["ports"])
            .iter()
            .find(|x| x["port"] == port)
        else {
            p.push(format!("Service/{host} has no port {port}"));
            continue;
        };
        let backing = r
            .all("Deployment")
            .into_iter()
            .chain(r.all("StatefulSet"))
            .find(|d| {
                selects(
                    &svc["spec"]["selector"],
                    &d["spec"]["template"]["metadata"]["labels"],
                )
            });
        let Some(redis) = backing else {
            p.push(format!(
                "Service/{host} selects no Deployment or StatefulSet"
            ));
            continue;
        };
        let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
        let container = arr(&redis["spec"]["template"]["spec"]["containers"])
            .iter()
            .find(|c| {
                arr(&c["ports"]).iter().any(|cp| {
                    cp["name"] == svc_port["targetPort"]
                        || cp["containerPort"] == svc_port["targetPort"]
                })
            });
        let Some(container) = container else {
            p.push(format!(
                "Service/{host} port {port} reaches no Redis container port"
            ));
            continue;
        };
        let args: Vec<&str> = arr(&container["args"])
            .iter()
            .filter_map(Value::as_str)
            .collect();
        if !args
            .windows(2)
            .any(|w| w == ["--maxmemory-policy", "noeviction"])
        {
            p.push("Redis may evict claims (--maxmemory-policy is not noeviction)".into());
        }
        // Authentication: a password Redis requires, from a Secret, and the same one in the
        // gateways' URL.
        let env = container_env(r, container);
        match args.windows(2).find(|w| w[0] == "--requirepass") {
            None => p.push("Redis requires no password (--requirepass)".into()),
            Some(w) => {
                let from_secret = env.iter().any(|(name, _, secret)| {
                    secret.is_some() && w[1].contains(&format!("$({name})"))
                });
                if !from_secret {
                    p.push("the Redis password is not taken from a Secret".into());
                }
                match expand(w[1], &env) {
                    None => p.push("the Redis password's Secret is not in the manifests".into()),
                    Some(password) if url.password() != Some(password.as_str()) => p.push(
                        "the gateways' Redis URL does not carry the password Redis requires".into(),
                    ),
                    Some(_) => {}
                }
            }
        }
        let admitted = r.all("NetworkPolicy").into_iter().any(|np| {
            selects(&np["spec"]["podSelector"]["matchLabels"], redis_labels)
                && arr(&np["spec"]["ingress"]).iter().any(|rule| {
                    arr(&rule["from"])
                        .iter()
                        .any(|f| selects(&f["podSelector"]["matchLabels"], gateway_labels))
                })
        });
        if !admitted {
            p.push("no NetworkPolicy admits the gateway pods to Redis".into());
        }
    }
    p
}

/// Single use is fleet-wide wherever more than one replica runs: with more than one replica
/// (HPA `minReplicas`, or `replicas`), the store is Redis, and the gateways read its URLs
/// (credentials included) from a Secret, never from the ConfigMap.
pub fn single_use_problems(r: &Rendered, keys: &KeyDir) -> Vec<String> {
    let gp = match gateway_pod(r, keys) {
        Ok(gp) => gp,
        Err(e) => return vec![e],
    };
    let replicas = r
        .get("HorizontalPodAutoscaler", GATEWAY)
        .and_then(|h| h["spec"]["minReplicas"].as_u64())
        .into_iter()
        .chain(gp.deployment["spec"]["replicas"].as_u64())
        .max()
        .unwrap_or(1);
    if replicas <= 1 {
        return Vec::new();
    }
    let mut p = Vec::new();
    if gp.loaded.config.single_use.store != mrtr_gateway::single_use::StoreKind::Redis {
        p.push(format!(
            "{replicas} replicas keep single-use claims in the per-replica memory store: a \
             duplicate retry reaching another replica would run again"
        ));
    }
    if !gp
        .from_secrets
        .iter()
        .any(|(var, secret, _)| var == REDIS_URLS_VAR && secret == REDIS_SECRET)
    {
        p.push(format!(
            "the Redis URLs do not come from Secret/{REDIS_SECRET} ({REDIS_URLS_VAR})"
        ));
    }
    if gp
        .loaded
        .table
        .get("single_use")
        .and_then(|s| s.get("redis"))
        .and_then(|s| s.get("urls"))
        .is_some()
    {
        p.push("the ConfigMap carries Redis URLs (credentials belong in the Secret)".into());
    }
    p
}
