//! The Tasks extension (`[tasks]`, `crate::tasks`): a task-supporting tool call from a client
//! that declared the extension returns a task at once; `tasks/get` shows its questions and its
//! end, `tasks/update` answers, `tasks/cancel` stops it; the tool body runs once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;
use mrtr_testkit::client::ModernClient;
use mrtr_testkit::legacy_server::{Handlers, RpcError};

const EXTENSION: &str = "io.modelcontextprotocol/tasks";

const RULES: &str = "[[tasks.rules]]\nname = \"build\"\nsupport = \"required\"\n\
    [[tasks.rules]]\nname = \"ask\"\nsupport = \"optional\"\n\
    [[tasks.rules]]\nname = \"broken\"\nsupport = \"optional\"\n\
    [[tasks.rules]]\nname = \"slow\"\nsupport = \"optional\"\n\
    [[tasks.rules]]\nname = \"nap\"\nsupport = \"optional\"\n";

/// `build` (counted: how many times its body ran) reports progress and answers "built";
/// `ask` asks a name and a colour, then greets; `broken` fails with a JSON-RPC error, or with
/// a tool error (`isError`) when asked to; `slow` waits until cancelled.
fn handlers(runs: Arc<AtomicUsize>) -> Handlers {
    Handlers::new()
        .tool(
            "build",
            "builds",
            json!({"type": "object"}),
            move |ctx, _args| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    ctx.progress(1.0, Some(2.0), Some("compiling"));
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok(tool_text("built"))
                }
            },
        )
        .tool(
            "ask",
            "asks twice",
            json!({"type": "object"}),
            |ctx, _args| async move {
                let name = ctx.elicit_form("Your name?", form("name")).await?;
                let colour = ctx.elicit_form("Your colour?", form("colour")).await?;
                Ok(tool_text(format!(
                    "{} likes {}",
                    name["content"]["name"].as_str().unwrap_or("?"),
                    colour["content"]["colour"].as_str().unwrap_or("?")
                )))
            },
        )
        .tool(
            "broken",
            "fails",
            json!({"type": "object"}),
            |_ctx, args| async move {
                if args["tool_error"] == true {
                    Ok(json!({"content": [{"type": "text", "text": "no"}], "isError": true}))
                } else {
                    Err(RpcError::new(-32603, "the build farm is down"))
                }
            },
        )
        .tool(
            "nap",
            "sleeps ms",
            json!({"type": "object"}),
            |_ctx, args| async move {
                let ms = args["ms"].as_u64().unwrap_or(100);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(tool_text(format!("napped {ms}")))
            },
        )
        .tool(
            "slow",
            "waits",
            json!({"type": "object"}),
            |ctx, _args| async move {
                tokio::select! {
                    () = ctx.cancelled() => Err(RpcError::new(-32603, "cancelled")),
                    () = tokio::time::sleep(Duration::from_secs(20)) => Ok(tool_text("late")),
                }
            },
        )
}

struct Counters {
    runs: Arc<AtomicUsize>,
}

/// A gateway with [`RULES`]; `tasks_keys` go in `[tasks]`, `extra` after it.
async fn tasks_env(tasks_keys: &str, extra: &str) -> (Env, Counters) {
    let c = Counters {
        runs: Arc::new(AtomicUsize::new(0)),
    };
    let env = env_with(
        Default::default(),
        handlers(c.runs.clone()),
        "",
        &format!("[tasks]\npoll_interval = \"20ms\"\n{tasks_keys}{RULES}{extra}"),
    )
    .await;
    (env, c)
}

/// A client declaring the extension (and form elicitation).
fn task_client(env: &Env) -> ModernClient {
    env.client()
        .with_capabilities(json!({"elicitation": {"form": {}}, "extensions": {EXTENSION: {}}}))
}

async fn call(client: &ModernClient, tool: &str, args: Value) -> Value {
    let ex = client
        .request("tools/call", json!({"name": tool, "arguments": args}))
        .await
        .unwrap();
    ex.result()
        .cloned()
        .unwrap_or_else(|| panic!("{tool}: {:?}", ex.error()))
}

/// Calls `tool` with `args`, which must become a task; its id.
async fn start(client: &ModernClient, tool: &str, args: Value) -> String {
    let created = call(client, tool, args).await;
    assert_eq!(created["resultType"], "task", "{tool}: {created}");
    created["taskId"].as_str().unwrap().to_owned()
}

async fn get(client: &ModernClient, id: &str) -> Value {
    let ex = client
        .request("tasks/get", json!({"taskId": id}))
        .await
        .unwrap();
    ex.result()
        .cloned()
        .unwrap_or_else(|| panic!("tasks/get: {:?}", ex.error()))
}

/// Polls until the task's status is `status` (or terminal); at most 10 s.
async fn wait_for(client: &ModernClient, id: &str, status: &str) -> Value {
    for _ in 0..500 {
        let t = get(client, id).await;
        let s = t["status"].as_str().unwrap().to_owned();
        if s == status || ["completed", "failed", "cancelled"].contains(&s.as_str()) {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("task {id} never reached {status}");
}

fn task_metric(env: &Env, status: &str) -> f64 {
    task_metric_of(&env.gw, status)
}

#[tokio::test]
async fn a_required_task_tool_runs_once_as_a_task_and_refuses_clients_without_the_extension() {
    let (env, c) = tasks_env("", "").await;
    // Without the extension: -32021 naming it, and the tool does not run.
    let plain = env.client();
    let ex = plain
        .request("tools/call", json!({"name": "build", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.error_code(), Some(-32021), "{:?}", ex.error());
    assert!(
        ex.error().unwrap()["data"]["requiredCapabilities"]["extensions"][EXTENSION].is_object()
    );

    let client = task_client(&env);
    let created = call(&client, "build", json!({})).await;
    assert_eq!(created["resultType"], "task", "{created}");
    assert_eq!(created["status"], "working");
    assert_eq!(created["pollIntervalMs"], 20);
    assert_eq!(created["ttlMs"], 3_600_000);
    let id = created["taskId"].as_str().unwrap().to_owned();
    let mid = wait_for(&client, &id, "completed").await;
    let done = if mid["status"] == "completed" {
        mid
    } else {
        wait_for(&client, &id, "completed").await
    };
    assert_eq!(done["resultType"], "complete");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "built");
    // Asked again, the same answer; the body ran once.
    assert_eq!(get(&client, &id).await["result"], done["result"]);
    assert_eq!(c.runs.load(Ordering::SeqCst), 1);
    assert_eq!(task_metric(&env, "completed"), 1.0);
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_requests_total",
            &[("method", "tools/call"), ("outcome", "task")]
        ),
        1.0
    );
    env.stop().await;
}

#[tokio::test]
async fn progress_shows_as_the_status_message_while_working() {
    let (env, _c) = tasks_env("", "").await;
    let client = task_client(&env);
    let id = start(&client, "build", json!({})).await;
    let mut seen = None;
    for _ in 0..100 {
        let t = get(&client, &id).await;
        if t["status"] == "working" && t["statusMessage"].is_string() {
            seen = Some(t["statusMessage"].as_str().unwrap().to_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(seen.as_deref(), Some("compiling (1.0/2.0)"));
    env.stop().await;
}

#[tokio::test]
async fn questions_come_through_tasks_get_and_answers_through_tasks_update() {
    let (env, _c) = tasks_env("", "").await;
    let client = task_client(&env);
    let id = start(&client, "ask", json!({})).await;
    let mut keys = Vec::new();
    for (round, field, answer) in [(1, "name", "Ada"), (2, "colour", "green")] {
        let t = wait_for(&client, &id, "input_required").await;
        assert_eq!(t["status"], "input_required", "{t}");
        let requests = t["inputRequests"].as_object().unwrap();
        assert_eq!(requests.len(), 1, "{t}");
        let (key, request) = requests.iter().next().unwrap();
        assert!(key.starts_with(&format!("{round}-")), "{key}");
        assert!(!keys.contains(key), "a key is never reused: {key}");
        keys.push(key.clone());
        assert_eq!(request["method"], "elicitation/create");
        assert!(request["params"]["requestedSchema"]["properties"][field].is_object());
        // An answer to a key that is not outstanding is ignored: still waiting.
        let ack = client
            .request(
                "tasks/update",
                json!({"taskId": id, "inputResponses": {"9-nope": {"action": "accept"}}}),
            )
            .await
            .unwrap();
        assert_eq!(ack.result().unwrap()["resultType"], "complete");
        assert_eq!(get(&client, &id).await["status"], "input_required");
        let ack = client
            .request(
                "tasks/update",
                json!({"taskId": id, "inputResponses": {
                    key: {"action": "accept", "content": {field: answer}}
                }}),
            )
            .await
            .unwrap();
        assert_eq!(ack.result().unwrap()["resultType"], "complete");
        // Back to working (or further) before the next round's question.
        let after = get(&client, &id).await;
        assert!(
            after.get("inputRequests").is_none() || after["inputRequests"] != t["inputRequests"]
        );
    }
    let done = wait_for(&client, &id, "completed").await;
    assert_eq!(text(&done["result"]), "Ada likes green", "{done}");
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_task_input_rounds_total", &[]),
        2.0
    );
    env.stop().await;
}

#[tokio::test]
async fn a_tool_error_completes_and_a_json_rpc_error_fails() {
    let (env, _c) = tasks_env("", "").await;
    let client = task_client(&env);
    let id = start(&client, "broken", json!({"tool_error": true})).await;
    let t = wait_for(&client, &id, "completed").await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["result"]["isError"], true);

    let id = start(&client, "broken", json!({})).await;
    let t = wait_for(&client, &id, "failed").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["error"]["code"], -32603, "{t}");
    assert!(t.get("result").is_none());
    assert_eq!(task_metric(&env, "failed"), 1.0);
    env.stop().await;
}

#[tokio::test]
async fn tasks_cancel_stops_the_legacy_call() {
    let (env, c) = tasks_env("", "").await;
    let client = task_client(&env);
    let id = start(&client, "slow", json!({})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ack = client
        .request("tasks/cancel", json!({"taskId": id}))
        .await
        .unwrap();
    assert_eq!(ack.result().unwrap()["resultType"], "complete");
    assert_eq!(get(&client, &id).await["status"], "cancelled");
    for _ in 0..200 {
        if !env.legacy.stats().cancellations().is_empty() && task_metric(&env, "cancelled") == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        env.legacy.stats().cancellations().len(),
        1,
        "the legacy call was cancelled upstream (notifications/cancelled)"
    );
    assert_eq!(c.runs.load(Ordering::SeqCst), 0);
    assert_eq!(task_metric(&env, "cancelled"), 1.0);
    assert_eq!(get(&client, &id).await["status"], "cancelled");
    env.stop().await;
}

#[tokio::test]
async fn an_optional_task_tool_is_an_ordinary_call_for_a_client_without_the_extension() {
    let (env, _c) = tasks_env("", "").await;
    let result = call(&env.client(), "broken", json!({"tool_error": true})).await;
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["isError"], true);
    assert_eq!(
        metric(&env.gw, "mrtr_gateway_tasks_created_total", &[]),
        0.0
    );
    env.stop().await;
}

#[tokio::test]
async fn a_task_is_unknown_to_another_principal_and_after_nothing_at_all() {
    let (env, _c) = tasks_env("", "[auth]\nmode = \"header\"\n").await;
    let as_user = |user: &str| {
        let mut c = task_client(&env);
        c.headers
            .insert("x-authenticated-user", user.parse().unwrap());
        c
    };
    let alice = as_user("alice");
    let bob = as_user("bob");
    let id = start(&alice, "build", json!({})).await;
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let ex = bob
            .request(method, json!({"taskId": id, "inputResponses": {}}))
            .await
            .unwrap();
        assert_eq!(ex.error_code(), Some(-32602), "{method}: {:?}", ex.error());
        let never = bob
            .request(
                method,
                json!({"taskId": "no-such-task", "inputResponses": {}}),
            )
            .await
            .unwrap();
        assert_eq!(
            never.error().unwrap()["message"],
            ex.error().unwrap()["message"],
            "another's task looks like none at all"
        );
    }
    // Bob's cancel did nothing: Alice's task finishes.
    assert_eq!(
        wait_for(&alice, &id, "completed").await["status"],
        "completed"
    );
    env.stop().await;
}

#[tokio::test]
async fn unfinished_tasks_are_bounded_per_caller_and_the_call_does_not_run() {
    let (env, c) = tasks_env("max_running_per_principal = 1\n", "").await;
    let client = task_client(&env);
    let first = call(&client, "slow", json!({})).await;
    assert_eq!(first["resultType"], "task");
    let ex = client
        .request("tools/call", json!({"name": "build", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.status.as_u16(), 429, "{:?}", ex.error());
    assert_eq!(
        c.runs.load(Ordering::SeqCst),
        0,
        "the refused call did not run"
    );
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_limit_hits_total",
            &[("limit", "tasks_max_running_per_principal")]
        ),
        1.0
    );
    // Once the first is cancelled, its place is free.
    let id = first["taskId"].as_str().unwrap();
    client
        .request("tasks/cancel", json!({"taskId": id}))
        .await
        .unwrap();
    let mut created = None;
    for _ in 0..100 {
        let ex = client
            .request("tools/call", json!({"name": "build", "arguments": {}}))
            .await
            .unwrap();
        if let Some(r) = ex.result() {
            created = Some(r.clone());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(created.unwrap()["resultType"], "task");
    env.stop().await;
}

#[tokio::test]
async fn a_task_past_its_ttl_fails_and_its_legacy_call_is_cancelled() {
    let (env, _c) = tasks_env("ttl = \"1s\"\n", "").await;
    let client = task_client(&env);
    let id = start(&client, "slow", json!({})).await;
    let t = wait_for(&client, &id, "failed").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert!(t["statusMessage"].as_str().unwrap().contains("TTL"), "{t}");
    assert!(!env.legacy.stats().cancellations().is_empty());
    env.stop().await;
}

#[tokio::test]
async fn a_drain_waits_for_tasks_then_fails_the_unfinished_ones() {
    let (env, _c) = tasks_env("", "").await;
    let client = task_client(&env);
    let quick = start(&client, "build", json!({})).await;
    let stuck = start(&client, "slow", json!({})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(800);
    let given_up = env.gw.finish_tasks(deadline).await;
    assert_eq!(given_up, 1, "only the stuck task was left at the deadline");
    assert_eq!(get(&client, &quick).await["status"], "completed");
    let t = get(&client, &stuck).await;
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["error"]["code"], -32603, "{t}");
    assert_eq!(metric(&env.gw, "mrtr_gateway_tasks_running", &[]), 0.0);
    env.stop().await;
}

#[tokio::test]
async fn the_policy_reviews_a_tasks_questions_like_any_other() {
    // `ask` may not elicit: its questions never reach the client, the legacy server is told
    // "decline", and the tool finishes without an answer.
    let (env, _c) = tasks_env(
        "",
        "[[policy.rules]]\nmethod = \"tools/call\"\nname = \"ask\"\nallow = []\n",
    )
    .await;
    let client = task_client(&env);
    let id = start(&client, "ask", json!({})).await;
    let mut seen = Vec::new();
    let done = loop {
        let t = get(&client, &id).await;
        seen.push(t["status"].as_str().unwrap().to_owned());
        if ["completed", "failed"].contains(&t["status"].as_str().unwrap()) {
            break t;
        }
        assert!(seen.len() < 500, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(!seen.iter().any(|s| s == "input_required"), "{seen:?}");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(text(&done["result"]), "? likes ?", "{done}");
    assert_eq!(
        metric(
            &env.gw,
            "mrtr_gateway_policy_refusals_total",
            &[("kind", "elicitation_form"), ("reason", "kind_not_allowed")]
        ),
        2.0
    );
    env.stop().await;
}

#[tokio::test]
async fn a_tool_whose_legacy_descriptor_supports_tasks_becomes_one_after_the_caller_listed_it() {
    let described = |name: &str, support: &str| {
        json!({"name": name, "description": "", "inputSchema": {"type": "object"},
               "execution": {"taskSupport": support}})
    };
    let h = Handlers::new()
        .tool_definition(described("report", "optional"), |_ctx, _| async move {
            Ok(tool_text("reported"))
        })
        .tool_definition(described("migrate", "required"), |_ctx, _| async move {
            Ok(tool_text("migrated"))
        })
        .tool_definition(described("quick", "forbidden"), |_ctx, _| async move {
            Ok(tool_text("quick"))
        });
    // A rule still wins over the descriptor.
    let env = env_with(
        Default::default(),
        h,
        "",
        "[[tasks.rules]]\nname = \"quick\"\nsupport = \"forbidden\"\n[auth]\nmode = \"header\"\n",
    )
    .await;
    let as_user = |user: &str, extension: bool| {
        // The same capabilities with and without the extension (tool lists are learned per
        // capability set, as sessions are kept).
        let mut c = if extension {
            task_client(&env)
        } else {
            env.client()
                .with_capabilities(json!({"elicitation": {"form": {}}}))
        };
        c.headers
            .insert("x-authenticated-user", user.parse().unwrap());
        c
    };
    let alice = as_user("alice", true);
    // Before the caller listed the tools, nothing is known: an ordinary call.
    assert_eq!(
        call(&alice, "migrate", json!({})).await["resultType"],
        "complete"
    );
    let list = alice.request("tools/list", json!({})).await.unwrap();
    assert_eq!(
        list.result().unwrap()["tools"][0]["execution"]["taskSupport"],
        "optional"
    );
    let created = call(&alice, "migrate", json!({})).await;
    assert_eq!(created["resultType"], "task", "{created}");
    let done = wait_for(&alice, created["taskId"].as_str().unwrap(), "completed").await;
    assert_eq!(text(&done["result"]), "migrated");
    assert_eq!(
        call(&alice, "report", json!({})).await["resultType"],
        "task"
    );
    assert_eq!(
        call(&alice, "quick", json!({})).await["resultType"],
        "complete"
    );
    // A required one refuses the same caller without the extension.
    let ex = as_user("alice", false)
        .request("tools/call", json!({"name": "migrate", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.error_code(), Some(-32021));
    // Learned per caller: Alice's list taught nothing about what the server tells Bob, nor
    // about what it tells Alice declaring other capabilities.
    assert_eq!(
        call(&as_user("bob", true), "migrate", json!({})).await["resultType"],
        "complete"
    );
    let mut sampling_alice =
        task_client(&env).with_capabilities(json!({"sampling": {}, "extensions": {EXTENSION: {}}}));
    sampling_alice
        .headers
        .insert("x-authenticated-user", "alice".parse().unwrap());
    assert_eq!(
        call(&sampling_alice, "migrate", json!({})).await["resultType"],
        "complete"
    );
    // A reload that leaves [upstream] as it was keeps what was learned; one that changes it
    // (another server, or an upgraded one) forgets it until the caller lists the tools again.
    env.gw
        .apply_config(env.gw.config().as_ref().clone())
        .unwrap();
    assert_eq!(
        call(&alice, "report", json!({})).await["resultType"],
        "task"
    );
    let mut changed = env.gw.config().as_ref().clone();
    changed.upstream.response_timeout += std::time::Duration::from_secs(1);
    env.gw.apply_config(changed).unwrap();
    assert_eq!(
        call(&alice, "report", json!({})).await["resultType"],
        "complete"
    );
    alice.request("tools/list", json!({})).await.unwrap();
    assert_eq!(
        call(&alice, "report", json!({})).await["resultType"],
        "task"
    );
    env.stop().await;
}

#[tokio::test]
async fn a_draining_replica_takes_no_new_task() {
    let (env, c) = tasks_env("", "").await;
    env.gw.start_draining();
    let ex = task_client(&env)
        .request("tools/call", json!({"name": "build", "arguments": {}}))
        .await
        .unwrap();
    assert_eq!(ex.status.as_u16(), 503, "{:?}", ex.error());
    assert!(ex.headers.contains_key("retry-after"));
    assert_eq!(c.runs.load(Ordering::SeqCst), 0, "the call did not run");
    env.stop().await;
}

#[tokio::test]
async fn discover_advertises_the_extension_unless_tasks_are_off() {
    for (extra, advertised) in [("", true), ("enabled = false\n", false)] {
        let (env, _c) = tasks_env(extra, "").await;
        let d = env
            .client()
            .request("server/discover", json!({}))
            .await
            .unwrap();
        let d = d.result().unwrap();
        assert_eq!(
            d["capabilities"]["extensions"][EXTENSION].is_object(),
            advertised,
            "{d}"
        );
        if !advertised {
            let ex = task_client(&env)
                .request("tasks/get", json!({"taskId": "x"}))
                .await
                .unwrap();
            assert_eq!(ex.error_code(), Some(-32601));
            let plain = call(&task_client(&env), "build", json!({})).await;
            assert_eq!(plain["resultType"], "complete", "{plain}");
        }
        env.stop().await;
    }
}

/// A real peer: the official Python SDK (`mcp==2.3.0` `Client`, `tests/peers/tasks_client.py`)
/// drives a task in front of the Python FastMCP legacy server: `tools/call` comes back as a
/// task, `tasks/get` shows the tool's question, `tasks/update` answers it, and the task
/// completes with what the tool returns; the tool body ran once.
#[tokio::test]
async fn the_official_python_sdk_drives_a_task_with_a_question_end_to_end() {
    use crate::support::peers::{PyLegacyServer, modern_python, repo, successful_stdout};

    let legacy = PyLegacyServer::start(&[]).await;
    let cfg = config(
        &legacy.url(),
        "",
        "",
        "[tasks]\npoll_interval = \"50ms\"\n\
         [[tasks.rules]]\nname = \"slow_then_ask\"\nsupport = \"required\"\n",
    );
    let (_gw, running, url) = start_gateway(cfg).await;
    let out = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new(modern_python())
            .arg(repo().join("tests/peers/tasks_client.py"))
            .args(["--url", &url, "--tool", "slow_then_ask"])
            .args(["--args", r#"{"seconds": 0.3}"#])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("tasks_client.py finishes within 90 s")
    .expect("tasks_client.py runs");
    let stdout = successful_stdout(&out, "tasks_client.py");
    let r: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bad report ({e}): {stdout}"));

    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["created"]["resultType"], "task", "{r:#}");
    assert_eq!(r["created"]["status"], "working", "{r:#}");
    assert_eq!(r["created"]["pollIntervalMs"], 50, "{r:#}");
    let statuses: Vec<&str> = r["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(statuses.first(), Some(&"working"), "{r:#}");
    assert!(statuses.contains(&"input_required"), "{r:#}");
    assert_eq!(statuses.last(), Some(&"completed"), "{r:#}");
    let keys = r["inputRequestKeys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "one question: {r:#}");
    assert!(keys[0].as_str().unwrap().starts_with("1-"), "{r:#}");
    assert_eq!(r["questions"], json!(["What is your name?"]), "{r:#}");
    assert_eq!(r["callbacks"]["elicitation"], 1, "{r:#}");
    assert_eq!(r["updates"], json!([{"resultType": "complete"}]), "{r:#}");
    assert_eq!(
        crate::support::peers::result_text(&r),
        "Hello after 0.3s, Ada!",
        "{r:#}"
    );
    // The SDK named the task in Mcp-Name on every tasks/* request, and each was accepted.
    let id = r["created"]["taskId"].as_str().unwrap();
    let tasks_posts: Vec<&Value> = r["http"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["method"]
                .as_str()
                .is_some_and(|m| m.starts_with("tasks/"))
        })
        .collect();
    assert!(tasks_posts.len() >= 3, "{r:#}");
    for e in tasks_posts {
        assert_eq!(e["status"], 200, "{e}");
        assert_eq!(e["headers"]["mcp-name"], id, "{e}");
        assert_eq!(e["headers"]["mcp-method"], e["method"], "{e}");
        assert_eq!(e["headers"]["mcp-protocol-version"], "2026-07-28", "{e}");
    }
    assert_eq!(legacy.starts("slow_then_ask"), 1, "the tool body ran once");
    running.stop().await;
    legacy.kill().await;
}

/// Two gateways sharing a real Redis (`[single_use] store = "redis"`), `tasks_keys` in
/// `[tasks]` and `extra` after it.
async fn fleet(
    tasks_keys: &str,
    extra: &str,
) -> (
    crate::support::procs::Redis,
    mrtr_testkit::legacy_server::LegacyServer,
    Vec<Replica>,
) {
    let redis = crate::support::procs::start_redis().await;
    let legacy = mrtr_testkit::legacy_server::LegacyServer::start(
        Default::default(),
        handlers(Arc::new(AtomicUsize::new(0))),
    )
    .await
    .unwrap();
    let cfg = format!(
        "[tasks]\npoll_interval = \"20ms\"\n{tasks_keys}{RULES}[single_use]\nstore = \"redis\"\n\
         [single_use.redis]\nurls = [\"redis://127.0.0.1:{}\"]\n{extra}",
        redis.port
    );
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(start_gateway(config(&legacy.url(), "", "", &cfg)).await);
    }
    (redis, legacy, replicas)
}

type Replica = (
    Arc<mrtr_gateway::gateway::Gateway>,
    mrtr_gateway::front::listener::Running,
    String,
);

async fn stop_fleet(replicas: Vec<Replica>, legacy: mrtr_testkit::legacy_server::LegacyServer) {
    for (_, running, _) in replicas {
        running.stop().await;
    }
    legacy.shutdown().await;
}

fn fleet_client(url: &str, user: &str) -> ModernClient {
    let mut c = ModernClient::new(url)
        .with_capabilities(json!({"elicitation": {"form": {}}, "extensions": {EXTENSION: {}}}));
    c.headers
        .insert("x-authenticated-user", user.parse().unwrap());
    c
}

#[tokio::test]
async fn with_redis_any_replica_shows_answers_and_finishes_a_task_the_body_runs_once() {
    let (_redis, legacy, replicas) = fleet("", "[auth]\nmode = \"header\"\n").await;
    let a = fleet_client(&replicas[0].2, "alice");
    let b = fleet_client(&replicas[1].2, "alice");
    let id = start(&a, "ask", json!({})).await;
    // Another principal, on either replica: unknown.
    let mallory = fleet_client(&replicas[1].2, "mallory");
    for method in ["tasks/get", "tasks/update", "tasks/cancel"] {
        let ex = mallory
            .request(method, json!({"taskId": id, "inputResponses": {}}))
            .await
            .unwrap();
        assert_eq!(ex.error_code(), Some(-32602), "{method}: {:?}", ex.error());
    }
    // The questions show on the replica not running the call too; answers are given on
    // either, alternating.
    for (asker, answerer, field, answer) in [(&a, &b, "name", "Ada"), (&b, &a, "colour", "green")] {
        let t = wait_for(asker, &id, "input_required").await;
        assert_eq!(t["status"], "input_required", "{t}");
        let (key, request) = t["inputRequests"]
            .as_object()
            .unwrap()
            .iter()
            .next()
            .unwrap();
        assert!(
            request["params"]["requestedSchema"]["properties"][field].is_object(),
            "{t}"
        );
        let ack = answerer
            .request(
                "tasks/update",
                json!({"taskId": id, "inputResponses": {
                    key: {"action": "accept", "content": {field: answer}}
                }}),
            )
            .await
            .unwrap();
        assert_eq!(ack.result().unwrap()["resultType"], "complete");
        // The question goes away once the runner took the answer.
        let mut gone = false;
        for _ in 0..200 {
            let now = get(&b, &id).await;
            if now.get("inputRequests").and_then(|r| r.get(key)).is_none() {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "{key} still asked");
    }
    let done = wait_for(&b, &id, "completed").await;
    assert_eq!(text(&done["result"]), "Ada likes green", "{done}");
    assert_eq!(get(&a, &id).await["result"], done["result"]);
    assert_eq!(
        legacy.stats().tool_starts("ask"),
        1,
        "the tool body ran once"
    );
    stop_fleet(replicas, legacy).await;
}

#[tokio::test]
async fn with_redis_a_cancel_on_another_replica_stops_the_call() {
    let (_redis, legacy, replicas) = fleet("", "").await;
    let a = fleet_client(&replicas[0].2, "anyone");
    let b = fleet_client(&replicas[1].2, "anyone");
    let id = start(&a, "slow", json!({})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ack = b
        .request("tasks/cancel", json!({"taskId": id}))
        .await
        .unwrap();
    assert_eq!(ack.result().unwrap()["resultType"], "complete");
    assert_eq!(get(&a, &id).await["status"], "cancelled");
    // A learns it at its next heartbeat (within a second) and cancels the legacy call.
    for _ in 0..150 {
        if !legacy.stats().cancellations().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        legacy.stats().cancellations().len(),
        1,
        "cancelled upstream"
    );
    assert_eq!(get(&b, &id).await["status"], "cancelled");
    stop_fleet(replicas, legacy).await;
}

#[tokio::test]
async fn with_redis_a_running_task_outlives_its_lease_through_heartbeats() {
    let (_redis, legacy, replicas) = fleet("lease = \"1s\"\n", "").await;
    let a = fleet_client(&replicas[0].2, "anyone");
    let b = fleet_client(&replicas[1].2, "anyone");
    let id = start(&a, "nap", json!({"ms": 2500})).await;
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(get(&b, &id).await["status"], "working", "renewed, not lost");
    let done = wait_for(&b, &id, "completed").await;
    assert_eq!(text(&done["result"]), "napped 2500", "{done}");
    assert_eq!(legacy.stats().tool_starts("nap"), 1);
    stop_fleet(replicas, legacy).await;
}

/// A replica that dies leaves its task's record with a lease nobody renews: the next reader,
/// on any replica, fails the task (it is never run again).
#[tokio::test]
async fn with_redis_a_task_whose_replica_died_fails_at_the_next_read() {
    use mrtr_gateway::tasks::fleet::FleetTasks;
    use mrtr_gateway::tasks::record::Task;
    let (_redis, legacy, replicas) = fleet("", "[auth]\nmode = \"header\"\n").await;
    let store = FleetTasks::new(replicas[0].0.engine.single_use().redis().unwrap());
    // What the dead replica last wrote: working, vouched for until a moment ago.
    let principal = "alice";
    let caller =
        mrtr_gateway::caller_scope::Caller::of(principal, [127, 0, 0, 1].into(), false, 64);
    let task = Task::new(
        "dead-replica-task".into(),
        principal.into(),
        caller,
        Duration::from_secs(3600),
        Duration::from_secs(1),
    );
    let lapsed = std::time::SystemTime::now() - Duration::from_secs(1);
    assert!(store.put(&task, lapsed).await.unwrap());
    let b = fleet_client(&replicas[1].2, principal);
    let t = get(&b, "dead-replica-task").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["error"]["code"], -32603, "{t}");
    assert!(
        t["statusMessage"].as_str().unwrap().contains("stopped"),
        "{t}"
    );
    assert_eq!(task_metric_of(&replicas[1].0, "failed"), 1.0);
    // Read again, on the other replica: the same failure, counted once.
    let again = get(
        &fleet_client(&replicas[0].2, principal),
        "dead-replica-task",
    )
    .await;
    assert_eq!(again["status"], "failed");
    assert_eq!(again["lastUpdatedAt"], t["lastUpdatedAt"]);
    assert_eq!(task_metric_of(&replicas[0].0, "failed"), 0.0);
    // The dead replica's late write cannot bring it back.
    let later = std::time::SystemTime::now() + Duration::from_secs(60);
    assert!(!store.put(&task, later).await.unwrap());
    assert_eq!(get(&b, "dead-replica-task").await["status"], "failed");
    stop_fleet(replicas, legacy).await;
}

fn task_metric_of(gw: &mrtr_gateway::gateway::Gateway, status: &str) -> f64 {
    metric(
        gw,
        "mrtr_gateway_tasks_finished_total",
        &[("status", status)],
    )
}

/// The real thing: a gateway process holding a task is killed (SIGKILL, no drain); the other
/// replica fails the task once the dead one's lease has run out, and nothing runs it again.
#[tokio::test]
async fn with_redis_a_killed_replicas_task_fails_and_never_runs_again() {
    let redis = crate::support::procs::start_redis().await;
    let legacy = mrtr_testkit::legacy_server::LegacyServer::start(
        Default::default(),
        handlers(Arc::new(AtomicUsize::new(0))),
    )
    .await
    .unwrap();
    let dir = crate::support::peers::tempdir::TempDir::new("mrtr-tasks-kill");
    let shared = format!(
        "[upstream]\nurl = \"{}\"\n[single_use]\nstore = \"redis\"\n\
         [single_use.redis]\nurls = [\"redis://127.0.0.1:{}\"]\n\
         [[state.keys]]\nid = \"k1\"\nsecret = \"{TEST_KEY}\"\n\
         [tasks]\nlease = \"1s\"\npoll_interval = \"50ms\"\n{RULES}",
        legacy.url(),
        redis.port
    );
    let (mut doomed, url_a, _) =
        crate::support::procs::spawn_gateway(&shared, dir.path(), "tasks-a").await;
    let (_b, url_b, _) = crate::support::procs::spawn_gateway(&shared, dir.path(), "tasks-b").await;
    let a = fleet_client(&url_a, "anyone");
    let b = fleet_client(&url_b, "anyone");
    let id = start(&a, "slow", json!({})).await;
    // Running on A, visible on B.
    for _ in 0..100 {
        if legacy.stats().tool_starts("slow") == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(&b, &id).await["status"], "working");
    doomed.start_kill().unwrap();
    doomed.wait().await.unwrap();
    let t = wait_for(&b, &id, "failed").await;
    assert_eq!(t["status"], "failed", "{t}");
    assert_eq!(t["error"]["code"], -32603, "{t}");
    assert_eq!(legacy.stats().tool_starts("slow"), 1, "never run again");
    legacy.shutdown().await;
}
