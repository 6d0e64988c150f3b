//! The answers one execution of a call may use, and which of them it used.
//!
//! Sources, in order of authority: answers already in the presented state (validated when
//! they were first received, and never replaced), then this retry's `inputResponses`. Answers
//! to keys the state asked for are validated up front (a bad one is refused before anything
//! reaches the legacy server); answers to other keys are validated when, and if, the server
//! asks for them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::input_response::validate;
use crate::error::{Rejection, RejectionKind};
use crate::state::{Answer, InputKind, StatePayload};

/// An answer the book knows: carried in the presented state (its text, read when the server
/// asks for it), or sent with this retry.
enum Known {
    Carried(Answer),
    Sent(Value),
}

impl Known {
    fn value(&self) -> Value {
        match self {
            Known::Carried(a) => a.to_value(),
            Known::Sent(v) => v.clone(),
        }
    }

    fn carry(&self) -> Answer {
        match self {
            Known::Carried(a) => a.clone(),
            Known::Sent(v) => Answer::from_value(v),
        }
    }
}

pub struct AnswerBook {
    known: BTreeMap<String, Known>,
    validated: BTreeSet<String>,
    /// Answers to carry into the next state even if this execution does not reach them.
    keep: BTreeSet<String>,
    consumed: BTreeSet<String>,
}

pub fn bad_answer(key: &str, message: &str) -> Rejection {
    Rejection::new(
        RejectionKind::BadInputResponse,
        format!("inputResponses[{key:?}]: {message}"),
    )
}

impl AnswerBook {
    pub fn new(
        prior: Option<&StatePayload>,
        responses: &Map<String, Value>,
    ) -> Result<AnswerBook, Rejection> {
        let mut book = AnswerBook {
            known: BTreeMap::new(),
            validated: BTreeSet::new(),
            keep: BTreeSet::new(),
            consumed: BTreeSet::new(),
        };
        if let Some(p) = prior {
            for (k, v) in &p.ans {
                book.known.insert(k.clone(), Known::Carried(v.clone()));
                book.validated.insert(k.clone());
                book.keep.insert(k.clone());
            }
        }
        for (key, answer) in responses {
            // An answer already in the state cannot be changed afterwards.
            if book.known.contains_key(key) {
                continue;
            }
            if let Some(pending) = prior.and_then(|p| p.pnd.get(key)) {
                validate(pending.kind, answer).map_err(|m| bad_answer(key, &m))?;
                book.validated.insert(key.clone());
                book.keep.insert(key.clone());
            }
            book.known.insert(key.clone(), Known::Sent(answer.clone()));
        }
        Ok(book)
    }

    /// The answer for `key`, validated as `kind`; `Ok(None)` when the client has not answered.
    pub fn answer(&mut self, key: &str, kind: InputKind) -> Result<Option<Value>, Rejection> {
        let Some(known) = self.known.get(key) else {
            return Ok(None);
        };
        let answer = known.value();
        if !self.validated.contains(key) {
            validate(kind, &answer).map_err(|m| bad_answer(key, &m))?;
            self.validated.insert(key.to_string());
        }
        self.consumed.insert(key.to_string());
        Ok(Some(answer))
    }

    /// The answer for `key`, if any, without using it.
    pub fn peek(&self, key: &str) -> Option<Value> {
        self.known.get(key).map(Known::value)
    }

    /// Answers the next state carries (those from the presented state as they came, as text).
    pub fn carry(&self) -> BTreeMap<String, Answer> {
        self.known
            .iter()
            .filter(|(k, _)| self.consumed.contains(*k) || self.keep.contains(*k))
            .map(|(k, v)| (k.clone(), v.carry()))
            .collect()
    }
}
