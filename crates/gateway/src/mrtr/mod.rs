//! Multi Round-Trip Requests on top of a blocking legacy server: the engine and its parts.

pub mod answers;
pub mod at_most_once;
pub mod call;
pub mod claimed_runs;
pub mod deps;
pub mod engine;
mod gather;
pub mod input_key;
pub mod input_request;
pub mod input_response;
pub mod long_call;
pub mod origin;
pub mod parking;
mod round;
pub mod round_shapes;
pub mod run;
pub mod shape;
mod start;
pub mod state_size;
pub mod url_required;
