//! The container image, built and run on this machine. `scripts/build-image.sh` builds it (the
//! stripped release binary on a root filesystem of Debian packages, no registry); podman runs
//! it as the image's own non-root user, with every capability dropped, a read-only root
//! filesystem and nothing writable at all (no tmpfs either, as with Kubernetes'
//! `readOnlyRootFilesystem`), its configuration and key directory mounted read-only, on the
//! host's network. The official Python SDKs are the peers on both sides of an elicitation.
//!
//! Needs podman and runc (`scripts/test.sh` installs them) and the Python peers. The OCI
//! runtime is runc unless `MRTR_IMAGE_RUNTIME` names another: Debian 12's crun 1.8 refuses to
//! start any container on a host whose cgroup v2 hierarchy holds a controller while v1 holds
//! the others ("cgroups in hybrid mode not supported"), as these machines do; runc runs there.
//! File and process limits are passed explicitly (within this process's own hard limits)
//! because podman otherwise asks for more than a process without CAP_SYS_RESOURCE may set.
//!
//! `scripts/test.sh` builds the release binary before the suite, so that the build here is a
//! no-op and no 2-core build competes with the other tests; run alone, this test builds it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::peers::tempdir::TempDir;
use crate::support::peers::{
    PyLegacyServer, assert_ok, input_rounds, modern_scenario, repo, result_text,
};
use crate::support::procs::remote_metric;
use crate::support::{TEST_KEY, free_port};

/// The goal for the image's size (podman's figure: the uncompressed layer).
const MAX_IMAGE_BYTES: u64 = 40_000_000;

/// A cold release build on a busy 2-core machine takes minutes; this is the bound.
const BUILD_TIMEOUT: Duration = Duration::from_secs(45 * 60);

/// The unprivileged user the image declares.
const IMAGE_UID: u32 = 65532;

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("podman is installed (scripts/test.sh installs it)")
}

/// `podman ARGS`, asserted to succeed; its trimmed stdout.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} exited {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The container and the image this test made, removed when it ends, whatever happens.
struct Made {
    container: String,
    image: String,
}

impl Drop for Made {
    fn drop(&mut self) {
        let _ = podman(&["rm", "--force", "--time", "0", &self.container]);
        let _ = podman(&["rmi", "--force", &self.image]);
    }
}

/// cargo's target directory for this build of the tests (`<target>/<profile>/mrtr-gateway`),
/// so that the release build shares the suite's dependency downloads and lands where
/// `scripts/test.sh` built it.
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .ancestors()
        .nth(2)
        .expect("the binary sits in <target>/<profile>/")
        .to_path_buf()
}

/// The hard limit `name` (as /proc/self/limits spells it) of this process.
fn hard_limit(name: &str) -> u64 {
    std::fs::read_to_string("/proc/self/limits")
        .unwrap()
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l[name.len()..].split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(u64::MAX) // "unlimited"
}

/// The `podman run` options the gateway container runs with (before the image).
fn run_options(name: &str, config: &Path, keys: &Path) -> Vec<String> {
    let runtime = std::env::var("MRTR_IMAGE_RUNTIME").unwrap_or_else(|_| "runc".into());
    let nofile = hard_limit("Max open files").min(65536);
    let nproc = hard_limit("Max processes").min(4096);
    [
        "run",
        "--detach",
        "--name",
        name,
        "--runtime",
        &runtime,
        "--network=host",
        "--read-only",
        "--read-only-tmpfs=false",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        &format!("--ulimit=nofile={nofile}:{nofile}"),
        &format!("--ulimit=nproc={nproc}:{nproc}"),
        "--volume",
        &format!("{}:/etc/mrtr-gateway/gateway.toml:ro", config.display()),
        "--volume",
        &format!("{}:/etc/mrtr-gateway/keys:ro", keys.display()),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Runs `scripts/build-image.sh` naming the image `image`; what it printed last, and how long
/// it took.
async fn build_image(image: &str) -> (String, Duration) {
    let t0 = Instant::now();
    let out = tokio::time::timeout(
        BUILD_TIMEOUT,
        tokio::process::Command::new(repo().join("scripts/build-image.sh"))
            .env("CARGO_TARGET_DIR", target_dir())
            .env("MRTR_IMAGE", image)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("scripts/build-image.sh did not finish in {BUILD_TIMEOUT:?}"))
    .expect("scripts/build-image.sh runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "scripts/build-image.sh exited {}: {stdout}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default().trim().to_owned();
    (last, t0.elapsed())
}

/// One GET on the container's admin listener: the status, or None while nothing answers.
async fn admin_status(admin: u16, path: &str) -> Option<u16> {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let url = format!("http://127.0.0.1:{admin}{path}").parse().unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), client.get(url))
        .await
        .ok()?
        .ok()?;
    Some(resp.status().as_u16())
}

/// The ids of a `/proc/PID/status` line such as `Uid:` (real, effective, saved, filesystem)
/// as the process itself sees them: translated through its user namespace's `map`
/// (`uid_map` or `gid_map`), which matters when podman runs rootless.
fn ids_inside(pid: &str, field: &str, map: &str) -> Vec<u64> {
    let ranges: Vec<[u64; 3]> = std::fs::read_to_string(format!("/proc/{pid}/{map}"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let v: Vec<u64> = l
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            Some([*v.first()?, *v.get(1)?, *v.get(2)?])
        })
        .collect();
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|x| x.parse::<u64>().ok())
        .map(|outside| {
            ranges
                .iter()
                .find(|[_, start, count]| (*start..start + count).contains(&outside))
                .map_or(u64::MAX, |[inside, start, _]| inside + (outside - start))
        })
        .collect()
}

/// The mount options of the mount at `point` as the process `pid` sees it (the topmost, when
/// several are stacked there), if any.
fn mount_options(pid: &str, point: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap()
        .lines()
        .rev()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&point)).then(|| f.get(5).unwrap_or(&"").to_string())
        })
}

#[tokio::test]
async fn the_image_runs_read_only_as_non_root_and_carries_an_elicitation_round_trip() {
    let mut tag = [0u8; 6];
    getrandom::fill(&mut tag).unwrap();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let made = Made {
        container: format!("mrtr-image-test-{tag}"),
        image: format!("localhost/mrtr-gateway-test:{tag}"),
    };

    // ---- build ----
    let (printed, took) = build_image(&made.image).await;
    assert_eq!(
        printed, made.image,
        "the script's last line names the image"
    );
    let size: u64 = podman_ok(&["image", "inspect", "--format", "{{.Size}}", &made.image])
        .parse()
        .unwrap();
    eprintln!(
        "image {}: {size} bytes ({:.1} MB), built in {:.1} s",
        made.image,
        size as f64 / 1e6,
        took.as_secs_f64()
    );
    assert!(
        size <= MAX_IMAGE_BYTES,
        "the image is {size} bytes, more than {MAX_IMAGE_BYTES}"
    );
    assert_eq!(
        podman_ok(&[
            "image",
            "inspect",
            "--format",
            "{{.Config.User}}",
            &made.image
        ]),
        format!("{IMAGE_UID}:{IMAGE_UID}")
    );

    // ---- run, in front of the Python FastMCP legacy server ----
    let legacy = PyLegacyServer::start(&[]).await;
    let dir = TempDir::new("mrtr-image");
    let keys = dir.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("k-image"), TEST_KEY).unwrap();
    let (port, admin) = (free_port(), free_port());
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\naddr = \"127.0.0.1:{port}\"\n\
             [admin]\naddr = \"127.0.0.1:{admin}\"\n\
             [upstream]\nurl = \"{}\"\n\
             [state]\nkeys_dir = \"/etc/mrtr-gateway/keys\"\n\
             [mrtr]\ngather_window = \"400ms\"\ngather_quiet = \"100ms\"\n\
             [drain]\nreadiness_delay = \"100ms\"\ndeadline = \"5s\"\n\
             [log]\nformat = \"json\"\n",
            legacy.url()
        ),
    )
    .unwrap();
    let mut run = run_options(&made.container, &config, &keys);
    run.push(made.image.clone());
    let started = Instant::now();
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    podman_ok(&run);

    let logs = || {
        let out = podman(&["logs", &made.container]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if admin_status(admin, "/healthz").await == Some(200) {
            break;
        }
        let running = podman_ok(&["inspect", "--format", "{{.State.Running}}", &made.container]);
        assert_eq!(running, "true", "the container stopped:\n{}", logs());
        assert!(
            Instant::now() < deadline,
            "/healthz did not answer 200 within 30 s:\n{}",
            logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "healthy {:.1} s after podman run",
        started.elapsed().as_secs_f64()
    );
    // Ready means the gateway inside initialized the legacy server outside.
    assert_eq!(
        admin_status(admin, "/readyz").await,
        Some(200),
        "{}",
        logs()
    );

    // What the process inside is: the image's user, no capabilities, a read-only root and
    // no writable scratch space.
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &made.container]);
    let image_id = vec![u64::from(IMAGE_UID); 4];
    assert_eq!(ids_inside(&pid, "Uid:", "uid_map"), image_id, "uids");
    assert_eq!(ids_inside(&pid, "Gid:", "gid_map"), image_id, "gids");
    let cap_eff = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_owned()))
        .unwrap();
    assert_eq!(cap_eff, "0000000000000000");
    let root = mount_options(&pid, "/").expect("the container has a root mount");
    assert!(root.split(',').any(|o| o == "ro"), "root mounted {root}");
    assert_eq!(mount_options(&pid, "/tmp"), None, "a /tmp was mounted");

    // ---- one MRTR flow: the legacy server's elicitation, as input_required and a retry ----
    let url = format!("http://127.0.0.1:{port}/mcp");
    let report = modern_scenario(&url, "greet", &["--raw"]).await;
    assert_ok(&report);
    assert_eq!(result_text(&report), "Hello, Ada!", "{}", logs());
    assert_eq!(input_rounds(&report), vec![vec!["elicitation/create"]]);
    let state_len = report["rounds"][0]["requestStateLength"]
        .as_u64()
        .unwrap_or(0);
    assert!(state_len > 0, "the first round carried no requestState");
    let tools = [("method", "tools/call")];
    for (outcome, want) in [("input_required", 1.0), ("complete", 1.0)] {
        let labels = [tools[0], ("outcome", outcome)];
        assert_eq!(
            remote_metric(admin, "mrtr_gateway_requests_total", &labels).await,
            want,
            "tools/call {outcome}"
        );
    }

    // ---- SIGTERM to PID 1: the gateway drains and exits 0 ----
    let t0 = Instant::now();
    podman_ok(&["stop", "--time", "15", &made.container]);
    let exit = podman_ok(&[
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &made.container,
    ]);
    assert_eq!(exit, "0", "exit status after SIGTERM:\n{}", logs());
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "stopping took {:?}: SIGTERM was not handled (podman sent SIGKILL)",
        t0.elapsed()
    );
    legacy.kill().await;
}
