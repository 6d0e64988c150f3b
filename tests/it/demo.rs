//! The README's first command: `cargo run -- demo` runs the demo binary through its three
//! rounds; the release binary carries no demo and says where it is.

use std::process::Command;

#[test]
fn the_demo_binary_walks_plan_trip_through_three_rounds() {
    let out = Command::new(env!("CARGO_BIN_EXE_mrtr-gateway-demo"))
        .arg("demo")
        .output()
        .unwrap();
    let stdout = crate::support::peers::successful_stdout(&out, "mrtr-gateway-demo demo");
    for line in [
        "round 1: input_required",
        "round 2: input_required",
        "round 3: input_required",
        "final result after 3 round(s): Trip for Ada to Lisbon",
        "legacy tool executions: 1",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

#[test]
fn the_release_binary_has_no_demo_and_says_where_it_is() {
    let out = Command::new(env!("CARGO_BIN_EXE_mrtr-gateway"))
        .arg("demo")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cargo run --locked -- demo"), "{stderr}");
    assert!(out.stdout.is_empty());
}
