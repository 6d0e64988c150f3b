//! Processes the tests start: `redis-server`, and the gateway binary itself (replicas).

use std::process::Stdio;
use std::time::Duration;

use super::eventually;

/// A `redis-server` child (killed on drop) and its port.
pub struct Redis {
    _child: tokio::process::Child,
    pub port: u16,
}

pub async fn start_redis() -> Redis {
    let port = super::free_port();
    let child = tokio::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("redis-server is installed (scripts/test.sh installs it)");
    assert!(
        eventually(Duration::from_secs(10), || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok())
        .await,
        "redis-server did not start"
    );
    Redis {
        _child: child,
        port,
    }
}

pub async fn spawn_gateway(
    config: &str,
    dir: &std::path::Path,
    name: &str,
) -> (tokio::process::Child, String, u16) {
    spawn_gateway_via(&[], config, dir, name).await
}

/// [`spawn_gateway`], started through `launcher` (a program and its arguments, to which the
/// gateway's own command line is appended), e.g. a shell that opens a descriptor first.
pub async fn spawn_gateway_via(
    launcher: &[&str],
    config: &str,
    dir: &std::path::Path,
    name: &str,
) -> (tokio::process::Child, String, u16) {
    let port = super::free_port();
    let admin = super::free_port();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!("[listen]\naddr = \"127.0.0.1:{port}\"\n[admin]\naddr = \"127.0.0.1:{admin}\"\n[replica]\nid = \"{name}\"\n{config}"),
    )
    .unwrap();
    let log = dir.join(format!("{name}.log"));
    let gateway = env!("CARGO_BIN_EXE_mrtr-gateway");
    let mut command = match launcher.split_first() {
        Some((program, args)) => {
            let mut c = tokio::process::Command::new(program);
            c.args(args).arg(gateway);
            c
        }
        None => tokio::process::Command::new(gateway),
    };
    let mut child = command
        .args(["serve", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", admin)).is_ok() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "gateway {name} exited with {status}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gateway {name} did not start"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (child, format!("http://127.0.0.1:{port}/mcp"), admin)
}

/// The Prometheus text of a gateway's admin listener.
pub async fn scrape(admin: u16) -> String {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("http://127.0.0.1:{admin}/metrics").parse().unwrap())
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

/// One metric of a gateway process.
pub async fn remote_metric(admin: u16, name: &str, labels: &[(&str, &str)]) -> f64 {
    super::sample(&scrape(admin).await, name, labels)
}
