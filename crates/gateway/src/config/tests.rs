//! Loading whole configuration files: defaults, key names in errors, environment overrides,
//! and the checks of each section seen through `Config::from_toml_str`.

use std::time::Duration;

use base64::Engine;

use super::*;

const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

fn minimal() -> String {
    format!("[[state.keys]]\nid = \"k1\"\nsecret = \"{KEY}\"\n")
}

#[test]
fn minimal_file_gets_documented_defaults() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.listen.addr.to_string(), "127.0.0.1:8080");
    assert_eq!(c.listen.path, "/mcp");
    assert_eq!(c.state.ttl, Duration::from_secs(600));
    assert_eq!(c.state.max_bytes, 65536);
    assert_eq!(c.state.max_rounds, 16);
    assert_eq!(c.state.keys[0].secret[31], 31);
}

fn err_of(text: &str) -> ConfigError {
    Config::from_toml_str(text, &[], None).unwrap_err()
}

#[test]
fn each_bad_input_names_its_key() {
    let e = err_of(&format!(
        "{}\n[state]\nttl = \"soon\"\n",
        "[listen]\naddr=\"x\""
    ));
    assert_eq!(e.key, "listen.addr");
    let e = err_of(&format!("{}[mrtr]\ngather_window = \"soon\"\n", minimal()));
    assert_eq!(e.key, "mrtr.gather_window");
    let e = err_of(&format!("{}[listen]\nbogus = 1\n", minimal()));
    assert!(e.key.starts_with("listen"), "{e}");
    assert!(e.message.contains("bogus"), "{e}");
    let e = err_of("[state]\nttl = \"1m\"\n");
    assert_eq!(e.key, "state.keys");
    let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret = \"%%%\"\n");
    assert_eq!(e.key, "state.keys[0].secret");
    let e = err_of(&format!(
        "{}[[state.keys]]\nid = \"k1\"\nsecret = \"{KEY}\"\n",
        minimal()
    ));
    assert_eq!(e.key, "state.keys[1].id");
    assert!(e.message.contains("duplicate"));
    let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret_file = \"/nonexistent/key\"\n");
    assert_eq!(e.key, "state.keys[0].secret_file");
    let e = err_of("[[state.keys]]\nid = \"k1\"\nsecret = \"AAAA\"\n");
    assert!(e.message.contains("32 bytes"), "{e}");
}

#[test]
fn environment_overrides_win_and_are_named_in_errors() {
    let vars = vec![("MRTR_GATEWAY__STATE__TTL".to_string(), "30s".to_string())];
    let text = format!("[state]\nttl = \"5m\"\n{}", minimal());
    let c = Config::from_toml_str(&text, &vars, None).unwrap();
    assert_eq!(c.state.ttl, Duration::from_secs(30));
    let bad = vec![(
        "MRTR_GATEWAY__STATE__TTL".to_string(),
        "forever".to_string(),
    )];
    let e = Config::from_toml_str(&text, &bad, None).unwrap_err();
    assert_eq!(e.key, "state.ttl");
    assert_eq!(e.env_var.as_deref(), Some("MRTR_GATEWAY__STATE__TTL"));
}

#[test]
fn keys_dir_orders_by_primary_then_newest_and_skips_kubernetes_internals() {
    let dir = std::env::temp_dir().join(format!("mrtr-keys-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("..2026_12_02")).unwrap();
    std::fs::write(dir.join("k2026-11-01"), KEY).unwrap();
    std::fs::write(dir.join("k2026-12-01"), KEY).unwrap();
    std::fs::write(dir.join("..data"), "ignored").unwrap();
    let ids = |ks: Vec<StateKeySpec>| ks.into_iter().map(|k| k.id).collect::<Vec<_>>();
    assert_eq!(
        ids(load_keys_dir(&dir).unwrap()),
        vec!["k2026-12-01", "k2026-11-01"]
    );
    std::fs::write(dir.join("primary"), "k2026-11-01\n").unwrap();
    assert_eq!(
        ids(load_keys_dir(&dir).unwrap()),
        vec!["k2026-11-01", "k2026-12-01"]
    );
    std::fs::write(dir.join("primary"), "nope").unwrap();
    assert_eq!(load_keys_dir(&dir).unwrap_err().key, "state.keys_dir");
    std::fs::remove_file(dir.join("primary")).unwrap();
    std::fs::write(dir.join("bad"), "%%%").unwrap();
    assert!(load_keys_dir(&dir).unwrap_err().message.contains("bad"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn upstream_tls_files_are_checked_naming_key_and_variable() {
    let https = |rest: &str| {
        format!(
            "[upstream]\nurl = \"https://legacy.internal/mcp\"\n{rest}\n{}",
            minimal()
        )
    };
    // From the environment: the error names the variable too.
    let vars = [(
        "MRTR_GATEWAY__UPSTREAM__CA_FILE".to_string(),
        "/nonexistent/ca.pem".to_string(),
    )];
    let e = Config::from_toml_str(&https(""), &vars, None).unwrap_err();
    assert_eq!(e.key, "upstream.ca_file");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__UPSTREAM__CA_FILE")
    );
    let e = err_of(&https("client_cert_file = \"/nonexistent.pem\""));
    assert_eq!(e.key, "upstream.client_key_file", "{e}");
    // Refused where they would be unused.
    let e = err_of(&format!(
        "[upstream]\nurl = \"http://127.0.0.1:9001/mcp\"\nca_file = \"/x.pem\"\n{}",
        minimal()
    ));
    assert_eq!(e.key, "upstream.ca_file");
    assert!(e.message.contains("https"), "{e}");
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert!(c.upstream.tls.is_none());
}

#[test]
fn upstream_pins_are_checked_naming_the_key() {
    let https = |rest: &str| {
        format!(
            "[upstream]\nurl = \"https://legacy.internal/mcp\"\n{rest}\n{}",
            minimal()
        )
    };
    let pin = "sha256//47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=";
    let c = Config::from_toml_str(&https(&format!("pin_sha256 = [{pin:?}]")), &[], None).unwrap();
    assert_eq!(c.upstream.tls.as_ref().unwrap().pins.len(), 1);
    let e = err_of(&https(&format!("pin_sha256 = [{pin:?}, \"AAAA\"]")));
    assert_eq!(e.key, "upstream.pin_sha256[1]", "{e}");
    assert!(e.message.contains("32"), "{e}");
    let e = err_of(&https("pin_sha256 = [\"not base64!\"]"));
    assert_eq!(e.key, "upstream.pin_sha256[0]", "{e}");
    // With the CA file: one or the other.
    let e = err_of(&https(&format!(
        "pin_sha256 = [{pin:?}]\nca_file = \"/nonexistent.pem\""
    )));
    assert_eq!(e.key, "upstream.pin_sha256", "{e}");
    // Unused with a plain-http upstream.
    let e = err_of(&format!(
        "[upstream]\nurl = \"http://127.0.0.1:9001/mcp\"\npin_sha256 = [{pin:?}]\n{}",
        minimal()
    ));
    assert_eq!(e.key, "upstream.pin_sha256", "{e}");
    // From the environment, as a TOML array: the error names the variable.
    let vars = [(
        "MRTR_GATEWAY__UPSTREAM__PIN_SHA256".to_string(),
        "[\"short\"]".to_string(),
    )];
    let e = Config::from_toml_str(&https(""), &vars, None).unwrap_err();
    assert_eq!(e.key, "upstream.pin_sha256[0]");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__UPSTREAM__PIN_SHA256")
    );
}

#[test]
fn upstream_check_timings_are_bounded() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.admin.upstream_check_cache, Duration::from_secs(2));
    assert_eq!(c.admin.upstream_check_wait, Duration::from_millis(1500));
    for (line, key) in [
        (
            "upstream_check_cache = \"0s\"",
            "admin.upstream_check_cache",
        ),
        (
            "upstream_check_cache = \"11m\"",
            "admin.upstream_check_cache",
        ),
        ("upstream_check_wait = \"0s\"", "admin.upstream_check_wait"),
        ("upstream_check_wait = \"2m\"", "admin.upstream_check_wait"),
    ] {
        let e = err_of(&format!("[admin]\n{line}\n{}", minimal()));
        assert_eq!(e.key, key, "{line}: {e}");
    }
}

#[test]
fn tls_and_admin_sections_are_checked() {
    let e = err_of(&format!(
        "[tls]\ncert_file = \"/nonexistent.pem\"\nkey_file = \"/nonexistent.key\"\n{}",
        minimal()
    ));
    assert_eq!(e.key, "tls.cert_file");
    let e = err_of(&format!("[tls]\nclient_auth = \"required\"\n{}", minimal()));
    assert_eq!(e.key, "tls.cert_file");
    let e = err_of(&format!("[admin]\naddr = \"nowhere\"\n{}", minimal()));
    assert_eq!(e.key, "admin.addr");
    let c =
        Config::from_toml_str(&format!("[admin]\naddr = \"\"\n{}", minimal()), &[], None).unwrap();
    assert!(c.admin.addr.is_none() && c.tls.is_none());
    let e = err_of(&format!(
        "[listen]\nallowed_origins = [\"https://a.example/path\"]\n{}",
        minimal()
    ));
    assert_eq!(e.key, "listen.allowed_origins[0]");
}

#[test]
fn listen_idle_release_after_is_checked() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.listen.idle_release_after, Some(Duration::from_secs(1)));
    let listen = |rest: &str| format!("[listen]\n{rest}\n{}", minimal());
    let c = Config::from_toml_str(&listen("idle_release_after = \"0s\""), &[], None).unwrap();
    assert_eq!(c.listen.idle_release_after, None);
    let c = Config::from_toml_str(&listen("idle_release_after = \"1h\""), &[], None).unwrap();
    assert_eq!(c.listen.idle_release_after, Some(Duration::from_secs(3600)));
    for bad in ["\"2h\"", "\"soon\""] {
        assert_eq!(
            err_of(&listen(&format!("idle_release_after = {bad}"))).key,
            "listen.idle_release_after"
        );
    }
}

#[test]
fn upstream_transport_keys_are_checked() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.upstream.transport, UpstreamTransport::StreamableHttp);
    assert_eq!(c.upstream.stdio.max_line_bytes, 4 * 1024 * 1024);
    assert_eq!(c.upstream.stdio.max_children, 8);
    assert_eq!(c.upstream.stdio.spawn_backoff, Duration::from_secs(5));
    assert_eq!(c.upstream.stdio.shutdown_grace, Duration::from_secs(3));
    assert_eq!(c.upstream.resume_attempts, 5);
    assert_eq!(c.upstream.max_idle_connections, 1024);
    assert_eq!(c.upstream.connection_idle_timeout, Duration::from_secs(30));
    let upstream = |rest: &str| format!("[upstream]\n{rest}\n{}", minimal());
    let c = Config::from_toml_str(&upstream("max_idle_connections = 0"), &[], None).unwrap();
    assert_eq!(c.upstream.max_idle_connections, 0);
    assert_eq!(
        err_of(&upstream("max_idle_connections = 65537")).key,
        "upstream.max_idle_connections"
    );
    for bad in ["\"0s\"", "\"2h\""] {
        assert_eq!(
            err_of(&upstream(&format!("connection_idle_timeout = {bad}"))).key,
            "upstream.connection_idle_timeout"
        );
    }
    let stdio = |rest: &str| format!("[upstream]\ntransport = \"stdio\"\n{rest}\n{}", minimal());
    let c = Config::from_toml_str(
        &stdio("command = [\"python3\", \"s.py\"]\nenv = { A = \"1\" }"),
        &[],
        None,
    )
    .unwrap();
    assert_eq!(c.upstream.transport, UpstreamTransport::Stdio);
    assert_eq!(c.upstream.stdio.command, ["python3", "s.py"]);
    assert_eq!(c.upstream.stdio.env, [("A".to_string(), "1".to_string())]);
    assert_eq!(err_of(&stdio("")).key, "upstream.command");
    assert_eq!(
        err_of(&stdio("command = [\"\"]")).key,
        "upstream.command[0]"
    );
    assert_eq!(
        err_of(&stdio("command = [\"x\"]\ncwd = \"/nonexistent/dir\"")).key,
        "upstream.cwd"
    );
    assert_eq!(
        err_of(&stdio("command = [\"x\"]\nstdio_max_children = 0")).key,
        "upstream.stdio_max_children"
    );
    let e = err_of(&format!("[upstream]\ncommand = [\"x\"]\n{}", minimal()));
    assert_eq!(e.key, "upstream.command");
    assert!(e.message.contains("stdio"), "{e}");
    assert_eq!(
        err_of(&format!("[upstream]\ntransport = \"ws\"\n{}", minimal())).key,
        "upstream.transport"
    );
    assert_eq!(
        err_of(&format!("[upstream]\nresume_attempts = 0\n{}", minimal())).key,
        "upstream.resume_attempts"
    );
}

#[test]
fn subscriptions_keys_have_defaults_and_limits() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.subscriptions.keepalive, Duration::from_secs(15));
    assert_eq!(c.subscriptions.max_streams, 256);
    assert_eq!(c.subscriptions.max_resource_subscriptions, 64);
    for (body, key) in [
        ("keepalive = \"10ms\"", "subscriptions.keepalive"),
        ("keepalive = \"2h\"", "subscriptions.keepalive"),
        ("keepalive = \"often\"", "subscriptions.keepalive"),
        ("max_streams = 0", "subscriptions.max_streams"),
        (
            "max_resource_subscriptions = 0",
            "subscriptions.max_resource_subscriptions",
        ),
    ] {
        let e = err_of(&format!("[subscriptions]\n{body}\n{}", minimal()));
        assert_eq!(e.key, key, "{body}: {e}");
    }
}

#[test]
fn edge_limits_have_defaults_and_bounds_and_name_their_key_and_variable() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.listen.body_read_timeout, Duration::from_secs(10));
    assert_eq!(
        (
            c.listen.max_connections,
            c.listen.max_connections_per_source
        ),
        (4096, 1024)
    );
    assert_eq!(c.listen.http2_max_concurrent_streams, 100);
    // A quarter of each pool per caller, an eighth kept for newcomers.
    assert_eq!(c.subscriptions.stream_share.per_caller, 64);
    assert_eq!(c.subscriptions.stream_share.reserve, 32);
    assert_eq!(
        (
            c.legacy_clients.max_get_streams,
            c.legacy_clients.get_stream_share.per_caller
        ),
        (256, 64)
    );
    assert_eq!(
        (
            c.parking.call_share.per_caller,
            c.parking.call_share.reserve
        ),
        (250, 125)
    );
    assert_eq!(
        c.pool.idle_share.per_caller, 256,
        "a quarter of pool.max_idle"
    );
    assert_eq!(c.pool.idle_share.reserve, 0, "the idle pool evicts instead");
    assert_eq!(c.listen.ipv6_source_prefix, 64);
    assert_eq!(
        (
            c.admin.max_connections,
            c.admin.header_read_timeout,
            c.admin.idle_timeout
        ),
        (64, Duration::from_secs(5), Duration::from_secs(30))
    );
    // A quarter of the stdio children, at least one.
    assert_eq!(c.parking.stdio_reserved_children, 2);
    let stdio = |children: u64, reserved: &str| {
        format!(
            "[upstream]\ntransport = \"stdio\"\ncommand = [\"x\"]\nstdio_max_children = {children}\n\
             [parking]\n{reserved}\n{}",
            minimal()
        )
    };
    let one = Config::from_toml_str(&stdio(1, ""), &[], None).unwrap();
    assert_eq!(one.parking.stdio_reserved_children, 1);
    let zero = Config::from_toml_str(&stdio(4, "stdio_reserved_children = 0"), &[], None);
    assert_eq!(zero.unwrap().parking.stdio_reserved_children, 0);
    assert_eq!(
        err_of(&stdio(4, "stdio_reserved_children = 5")).key,
        "parking.stdio_reserved_children"
    );
    for (section, body, key) in [
        (
            "listen",
            "body_read_timeout = \"0s\"",
            "listen.body_read_timeout",
        ),
        (
            "listen",
            "body_read_timeout = \"11m\"",
            "listen.body_read_timeout",
        ),
        ("listen", "max_connections = 0", "listen.max_connections"),
        (
            "listen",
            "max_connections_per_source = 0",
            "listen.max_connections_per_source",
        ),
        (
            "listen",
            "http2_max_concurrent_streams = 0",
            "listen.http2_max_concurrent_streams",
        ),
        ("admin", "max_connections = 0", "admin.max_connections"),
        ("admin", "idle_timeout = \"0s\"", "admin.idle_timeout"),
        (
            "admin",
            "allowed_hosts = [\"http://x\"]",
            "admin.allowed_hosts[0]",
        ),
        (
            "subscriptions",
            "max_streams_per_principal = 0",
            "subscriptions.max_streams_per_principal",
        ),
        (
            "legacy_clients",
            "max_get_streams = 0",
            "legacy_clients.max_get_streams",
        ),
        (
            "legacy_clients",
            "max_get_streams_per_principal = 0",
            "legacy_clients.max_get_streams_per_principal",
        ),
        (
            "listen",
            "ipv6_source_prefix = 0",
            "listen.ipv6_source_prefix",
        ),
        (
            "listen",
            "ipv6_source_prefix = 129",
            "listen.ipv6_source_prefix",
        ),
        (
            "parking",
            "max_per_principal = 0",
            "parking.max_per_principal",
        ),
        (
            "pool",
            "max_idle_per_principal = 0",
            "pool.max_idle_per_principal",
        ),
        ("quotas", "caller_share = 0.0", "quotas.caller_share"),
        ("quotas", "caller_share = 1.5", "quotas.caller_share"),
        (
            "quotas",
            "newcomer_reserve = 0.6",
            "quotas.newcomer_reserve",
        ),
        (
            "quotas",
            "newcomer_reserve = -0.1",
            "quotas.newcomer_reserve",
        ),
    ] {
        let e = err_of(&format!("[{section}]\n{body}\n{}", minimal()));
        assert_eq!(e.key, key, "{body}: {e}");
    }
    let vars = vec![(
        "MRTR_GATEWAY__LISTEN__MAX_CONNECTIONS_PER_SOURCE".to_string(),
        "0".to_string(),
    )];
    let e = Config::from_toml_str(&minimal(), &vars, None).unwrap_err();
    assert_eq!(e.key, "listen.max_connections_per_source");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__LISTEN__MAX_CONNECTIONS_PER_SOURCE")
    );
}

#[test]
fn roots_refresh_keys_have_defaults_bounds_and_environment_overrides() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.pool.roots_refresh_wait, Duration::from_secs(1));
    assert_eq!(c.pool.roots_refresh_probes, 3);
    let c = Config::from_toml_str(
        &format!("[pool]\nroots_refresh_wait = \"0s\"\n{}", minimal()),
        &[],
        None,
    )
    .unwrap();
    assert!(c.pool.roots_refresh_wait.is_zero(), "0s: never wait");
    for (body, key) in [
        ("roots_refresh_wait = \"61s\"", "pool.roots_refresh_wait"),
        ("roots_refresh_wait = \"soon\"", "pool.roots_refresh_wait"),
        ("roots_refresh_probes = 0", "pool.roots_refresh_probes"),
        ("roots_refresh_probes = 1001", "pool.roots_refresh_probes"),
    ] {
        let e = err_of(&format!("[pool]\n{body}\n{}", minimal()));
        assert_eq!(e.key, key, "{body}: {e}");
    }
    let vars = vec![(
        "MRTR_GATEWAY__POOL__ROOTS_REFRESH_WAIT".to_string(),
        "2m".to_string(),
    )];
    let e = Config::from_toml_str(&minimal(), &vars, None).unwrap_err();
    assert_eq!(e.key, "pool.roots_refresh_wait");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__POOL__ROOTS_REFRESH_WAIT")
    );
}

#[test]
fn idle_read_after_has_a_default_and_bounds() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.pool.idle_read_after, Duration::from_millis(25));
    let c = Config::from_toml_str(
        &format!("[pool]\nidle_read_after = \"0s\"\n{}", minimal()),
        &[],
        None,
    )
    .unwrap();
    assert!(c.pool.idle_read_after.is_zero(), "0s: read at once");
    for body in ["idle_read_after = \"2s\"", "idle_read_after = \"later\""] {
        let e = err_of(&format!("[pool]\n{body}\n{}", minimal()));
        assert_eq!(e.key, "pool.idle_read_after", "{body}: {e}");
    }
}

#[test]
fn worker_threads_default_to_the_cpus_and_are_bounded() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.runtime.worker_threads, None, "0: one per CPU");
    let c = Config::from_toml_str(
        &format!("[runtime]\nworker_threads = 3\n{}", minimal()),
        &[],
        None,
    )
    .unwrap();
    assert_eq!(c.runtime.worker_threads.map(|n| n.get()), Some(3));
    let e = err_of(&format!("[runtime]\nworker_threads = 257\n{}", minimal()));
    assert_eq!(e.key, "runtime.worker_threads", "{e}");
    for body in ["worker_threads = -1", "worker_threads = \"2\""] {
        let e = err_of(&format!("[runtime]\n{body}\n{}", minimal()));
        assert!(e.to_string().contains("worker_threads"), "{body}: {e}");
    }
}

#[test]
fn secrets_accept_both_alphabets() {
    assert!(decode_secret(KEY).is_ok());
    assert!(decode_secret(KEY.trim_end_matches('=')).is_ok());
    let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xfbu8; 32]);
    assert_eq!(decode_secret(&url_safe).unwrap(), [0xfb; 32]);
}

#[test]
fn quotas_divide_every_pool_and_a_share_that_never_binds_is_reported() {
    let c = Config::from_toml_str(
        &format!(
            "[quotas]\ncaller_share = 0.5\nnewcomer_reserve = 0.0\n\
             [subscriptions]\nmax_streams = 10\n[listen]\nipv6_source_prefix = 56\n{}",
            minimal()
        ),
        &[],
        None,
    )
    .unwrap();
    assert_eq!(
        (
            c.subscriptions.stream_share.per_caller,
            c.subscriptions.stream_share.reserve
        ),
        (5, 0)
    );
    assert_eq!(c.single_use.entry_share.per_caller, 50_000);
    assert_eq!(c.listen.ipv6_source_prefix, 56);
    assert!(crate::config::ineffective_quotas(&c).is_empty());
    // A pool's own key set at (or beyond) the pool less its reserve never binds.
    let wide = Config::from_toml_str(
        &format!(
            "[single_use]\nmax_entries = 20\nmax_entries_per_principal = 10000\n\
             [parking]\nmax_calls = 8\nmax_per_principal = 2\n{}",
            minimal()
        ),
        &[],
        None,
    )
    .unwrap();
    let warnings = crate::config::ineffective_quotas(&wide);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("single_use.max_entries_per_principal: 20 of"),
        "{warnings:?}"
    );
    assert!(warnings[0].contains("no effect"), "{warnings:?}");
    // Environment overrides reach the new section too.
    let vars = vec![(
        "MRTR_GATEWAY__QUOTAS__CALLER_SHARE".to_string(),
        "2".to_string(),
    )];
    let e = Config::from_toml_str(&minimal(), &vars, None).unwrap_err();
    assert_eq!(e.key, "quotas.caller_share");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__QUOTAS__CALLER_SHARE")
    );
}

#[test]
fn trace_export_is_off_by_default_and_its_keys_are_checked() {
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.tracing.otlp, None);
    let on = Config::from_toml_str(
        &format!(
            "{}[tracing]\notlp_endpoint = \"http://collector:4318/v1/traces\"\n",
            minimal()
        ),
        &[],
        None,
    )
    .unwrap();
    let otlp = on.tracing.otlp.expect("export on");
    assert_eq!(otlp.endpoint.as_str(), "http://collector:4318/v1/traces");
    assert_eq!(otlp.service_name, "mrtr-gateway");
    assert_eq!(otlp.sample_ratio, 1.0);
    assert_eq!(otlp.export_timeout, Duration::from_secs(10));
    assert_eq!((otlp.max_queue_spans, otlp.max_batch_spans), (2048, 512));
    for (value, says) in [
        ("not a url", "not a URL"),
        ("ftp://collector/v1/traces", "http or https"),
        ("http://collector:4318", "full traces path"),
        ("http://collector:4318/", "full traces path"),
        ("https://user:secret@collector/v1/traces", "credentials"),
    ] {
        let e = err_of(&format!(
            "{}[tracing]\notlp_endpoint = \"{value}\"\n",
            minimal()
        ));
        assert_eq!(e.key, "tracing.otlp_endpoint", "{value}");
        assert!(e.message.contains(says), "{value}: {}", e.message);
    }
    for (text, key) in [
        ("sample_ratio = 1.5", "tracing.sample_ratio"),
        ("export_timeout = \"0s\"", "tracing.export_timeout"),
        ("export_interval = \"2h\"", "tracing.export_interval"),
        ("max_queue_spans = 0", "tracing.max_queue_spans"),
        ("max_batch_spans = 4096", "tracing.max_batch_spans"),
        ("service_name = \"\"", "tracing.service_name"),
        ("bogus = 1", "tracing.bogus"),
    ] {
        assert_eq!(
            err_of(&format!("{}[tracing]\n{text}\n", minimal())).key,
            key,
            "{text}"
        );
    }
    // From the environment, named by its variable.
    let vars = [(
        "MRTR_GATEWAY__TRACING__OTLP_ENDPOINT".to_string(),
        "collector:4318".to_string(),
    )];
    let e = Config::from_toml_str(&minimal(), &vars, None).unwrap_err();
    assert_eq!(e.key, "tracing.otlp_endpoint");
    assert_eq!(
        e.env_var.as_deref(),
        Some("MRTR_GATEWAY__TRACING__OTLP_ENDPOINT")
    );
}

#[test]
fn the_idle_pool_can_keep_a_session_for_every_request_admitted_at_once_by_default() {
    // Below the requests the gateway admits at once, the pool's bound makes every call past it
    // open a session of its own: with 256, at 1,024 distinct callers a third of the calls did
    // (docs/performance.md).
    let c = Config::from_toml_str(&minimal(), &[], None).unwrap();
    assert_eq!(c.pool.max_idle, 1024);
    assert_eq!(c.pool.max_idle, c.listen.max_concurrent_requests);
    assert_eq!(
        c.pool.idle_share.per_caller, 256,
        "quotas.caller_share of it"
    );
}
