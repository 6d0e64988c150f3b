//! Input-key minting (`KeyMinter::mint`) for the three kinds of legacy server request, with
//! params shaped as real servers send them: a form elicitation with a four-field schema, a
//! sampling request with a short conversation and model preferences, and `roots/list`
//! (no params). Each iteration uses a fresh minter, as each execution of a call does.
//!
//! ```sh
//! cargo bench --bench input_keys
//! ```

use std::time::Duration;

use divan::{Bencher, black_box};
use mrtr_gateway::mrtr::input_key::KeyMinter;
use serde_json::{Value, json};

fn main() {
    divan::Divan::default()
        .max_time(Duration::from_millis(700))
        .config_with_args()
        .main();
}

fn elicitation() -> Value {
    json!({
        "mode": "form",
        "message": "Where should the trip go, and when?",
        "requestedSchema": {
            "type": "object",
            "properties": {
                "destination": {"type": "string", "title": "Destination", "minLength": 2},
                "start": {"type": "string", "format": "date", "title": "First day"},
                "nights": {"type": "integer", "minimum": 1, "maximum": 30},
                "budget": {"type": "string", "enum": ["low", "mid", "high"]}
            },
            "required": ["destination", "start"]
        },
        "_meta": {"progressToken": 7}
    })
}

fn sampling() -> Value {
    json!({
        "messages": [
            {"role": "user", "content": {"type": "text", "text": "Summarise the itinerary below in three sentences. ".repeat(6)}},
            {"role": "assistant", "content": {"type": "text", "text": "Day 1: arrive, check in, walk the old town. Day 2: museum and river cruise."}},
            {"role": "user", "content": {"type": "text", "text": "Now make it shorter and mention the budget."}}
        ],
        "systemPrompt": "You are a concise travel assistant.",
        "modelPreferences": {"hints": [{"name": "claude"}], "speedPriority": 0.5, "intelligencePriority": 0.8},
        "includeContext": "none",
        "temperature": 0.2,
        "maxTokens": 400
    })
}

#[divan::bench]
fn elicitation_form(bencher: Bencher) {
    let params = elicitation();
    bencher.bench_local(|| KeyMinter::new().mint("elicitation/create", Some(black_box(&params))));
}

#[divan::bench]
fn sampling_create_message(bencher: Bencher) {
    let params = sampling();
    bencher
        .bench_local(|| KeyMinter::new().mint("sampling/createMessage", Some(black_box(&params))));
}

#[divan::bench]
fn roots_list(bencher: Bencher) {
    bencher.bench_local(|| KeyMinter::new().mint(black_box("roots/list"), None));
}
