//! The shipped binary's allocator settings: jemalloc (the default `jemalloc` feature) built
//! with the repository's `.cargo/config.toml`, so that pages a resting connection frees go
//! back to the kernel about a second later, on jemalloc's own thread. Built only with that
//! feature (`tests/it/main.rs`).

use std::process::Command;

#[test]
fn the_gateway_binary_returns_freed_pages_within_a_second() {
    // `stats_print` makes jemalloc print its settings to stderr as the process exits; it
    // changes no other setting.
    let out = Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for setting in ["opt.dirty_decay_ms: 1000 ", "opt.background_thread: true "] {
        assert!(
            stderr.contains(setting),
            "missing {setting:?} in:\n{stderr}"
        );
    }
}
