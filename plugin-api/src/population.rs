//! Population-based training across the unchanged ABI (issue 15): how a tuner hands out the
//! members of a population, hears their intermediate results and stops the ones it replaces.
//!
//! Four JSON envelopes, like the label's (`crate::labeled`), in texts that already cross:
//! - a tuner's parameters may be `{"$knob_member": {"parameters": {...}, "label": "...",
//!   "lineage": {...}}}` ([`crate::Generated::Member`], [`crate::Suggestion::lineage`]): the trial is a
//!   *member*, and its [`Lineage`] says which member's checkpoint it starts from;
//! - the host then hands each intermediate result of a member to the tuner through
//!   `receive_trial_result`, whose parameters text is `{"$knob_intermediate": {"step": n,
//!   "checkpoint": bool}}` ([`crate::Tuner::receive_intermediate_result`]); a tuner that never
//!   hands out members never receives one;
//! - a tuner asks the host to stop a member by emitting, from `take_suggestions`, the member's
//!   parameter id with `{"$knob_stop": {"reason": "..."}}` ([`crate::Tuner::take_suggestions`]);
//! - a tuner that deferred ids tells the host it has nothing for them, nor any more to try, by
//!   emitting each such id with `{"$knob_no_more": {}}` ([`crate::Suggestion::no_more`]), as
//!   [`crate::Generated::NoMore`] answers an id asked for now: a population whose every member
//!   has ended owes nothing, and its experiment ends as one whose tuner ran out.
//!
//! No search space can produce these objects (`SearchSpace::parse` refuses the four names at the
//! top level). A host that predates members would hand the member envelope to the trial (and
//! take the no-more one for parameters outside the space), which is why only the built-in `PBT`
//! tuner, shipped with its host, makes them.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub(crate) const MEMBER_KEY: &str = "$knob_member";
pub(crate) const INTERMEDIATE_KEY: &str = "$knob_intermediate";
pub(crate) const STOP_KEY: &str = "$knob_stop";
pub(crate) const NO_MORE_KEY: &str = "$knob_no_more";

/// Where a population member comes from. The host records it with the trial, shows it
/// (`knob trial ls`, export, the dashboard), and starts the trial with `KNOB_RESTORE_FROM` set to
/// the parent's checkpoint folder.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lineage {
    /// The parameter id of the member whose checkpoint this one starts from; `None` for a member
    /// of the first generation, which starts from scratch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// The parameter id of the member this one replaces (stopped by the tuner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaces: Option<u64>,
    /// How many intermediate results the parent had reported when it was cloned: the step its
    /// checkpoint is at least at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_step: Option<u64>,
}

/// What the host says with a member's intermediate result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Intermediate {
    /// The result's number among the intermediate results of this attempt of the trial: 0, 1, …
    pub step: u64,
    /// Whether the member's checkpoint folder held anything when the result was reported (the
    /// checkpoint protocol: a trial saves, then reports).
    pub checkpoint: bool,
}

/// A tuner's request to stop a member (it is recorded EARLY_STOPPED with `reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stop {
    pub parameter_id: u64,
    pub reason: String,
}

/// What a tuner emitted unprompted ([`crate::Suggestion`]), as the host reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum Emitted {
    /// Plain parameters (with the label, if any, that the suggestion carries).
    Parameters(crate::Suggestion),
    /// A population member ([`crate::Suggestion::member`]).
    Member {
        parameter_id: u64,
        parameters: Value,
        label: String,
        lineage: Lineage,
    },
    /// A request to stop a member ([`crate::Suggestion::stop`]).
    Stop(Stop),
    /// Nothing for this deferred id, nor any more to try ([`crate::Suggestion::no_more`]).
    NoMore { parameter_id: u64 },
}

/// Reads a suggestion the host took from a tuner.
pub fn read_suggestion(suggestion: crate::Suggestion) -> Emitted {
    let crate::Suggestion {
        parameter_id,
        parameters,
        label,
    } = suggestion;
    if label.is_some() {
        return Emitted::Parameters(crate::Suggestion {
            parameter_id,
            parameters,
            label,
        });
    }
    let parameters = match single(parameters, NO_MORE_KEY) {
        Ok(_) => return Emitted::NoMore { parameter_id },
        Err(parameters) => parameters,
    };
    let parameters = match unwrap_stop(parameters) {
        Ok(reason) => {
            return Emitted::Stop(Stop {
                parameter_id,
                reason,
            })
        }
        Err(parameters) => parameters,
    };
    match unwrap_member(parameters) {
        Ok((parameters, label, lineage)) => Emitted::Member {
            parameter_id,
            parameters,
            label,
            lineage,
        },
        Err(parameters) => Emitted::Parameters(crate::Suggestion {
            parameter_id,
            parameters,
            label: None,
        }),
    }
}

pub(crate) fn is_reserved(name: &str) -> bool {
    matches!(name, MEMBER_KEY | INTERMEDIATE_KEY | STOP_KEY | NO_MORE_KEY)
}

fn single(value: Value, key: &str) -> Result<Value, Value> {
    match value {
        Value::Object(mut outer) if outer.len() == 1 && outer.contains_key(key) => {
            Ok(outer.remove(key).expect("checked"))
        }
        other => Err(other),
    }
}

fn envelope(key: &str, inner: Value) -> String {
    let mut outer = Map::new();
    outer.insert(key.into(), inner);
    Value::Object(outer).to_string()
}

/// The JSON text of a member's parameters.
pub(crate) fn wrap_member(parameters: Value, label: String, lineage: &Lineage) -> String {
    envelope(
        MEMBER_KEY,
        serde_json::json!({
            "parameters": parameters,
            "label": label,
            "lineage": lineage,
        }),
    )
}

/// A member's parameters, label and lineage, or the value back when it is no member envelope.
pub(crate) fn unwrap_member(value: Value) -> Result<(Value, String, Lineage), Value> {
    let inner = single(value, MEMBER_KEY)?;
    let parsed = (|| {
        let object = inner.as_object()?;
        let label = object.get("label")?.as_str()?.to_string();
        let lineage = serde_json::from_value(object.get("lineage")?.clone()).ok()?;
        Some((object.get("parameters")?.clone(), label, lineage))
    })();
    parsed.ok_or_else(|| {
        let mut outer = Map::new();
        outer.insert(MEMBER_KEY.into(), inner.clone());
        Value::Object(outer)
    })
}

/// The parameters text of an intermediate result handed to a tuner.
#[cfg_attr(not(feature = "host"), allow(dead_code))]
pub(crate) fn wrap_intermediate(intermediate: Intermediate) -> String {
    envelope(
        INTERMEDIATE_KEY,
        serde_json::to_value(intermediate).expect("plain struct"),
    )
}

/// An intermediate result's details, or the parameters back when they are no such envelope.
pub(crate) fn unwrap_intermediate(value: Value) -> Result<Intermediate, Value> {
    let inner = single(value, INTERMEDIATE_KEY)?;
    serde_json::from_value(inner.clone()).map_err(|_| {
        let mut outer = Map::new();
        outer.insert(INTERMEDIATE_KEY.into(), inner);
        Value::Object(outer)
    })
}

pub(crate) fn wrap_no_more() -> String {
    envelope(NO_MORE_KEY, serde_json::json!({}))
}

pub(crate) fn wrap_stop(reason: &str) -> String {
    envelope(STOP_KEY, serde_json::json!({ "reason": reason }))
}

/// A stop's reason, or the parameters back when they are no stop envelope.
pub(crate) fn unwrap_stop(value: Value) -> Result<String, Value> {
    let inner = single(value, STOP_KEY)?;
    match inner.get("reason").and_then(Value::as_str) {
        Some(reason) => Ok(reason.to_string()),
        None => {
            let mut outer = Map::new();
            outer.insert(STOP_KEY.into(), inner);
            Err(Value::Object(outer))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn envelopes_round_trip_and_plain_parameters_pass_through() {
        let lineage = Lineage {
            parent: Some(3),
            replaces: Some(5),
            parent_step: Some(10),
        };
        let text = wrap_member(json!({"lr": 0.1}), "m5".into(), &lineage);
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            unwrap_member(value).unwrap(),
            (json!({"lr": 0.1}), "m5".to_string(), lineage)
        );
        let step = Intermediate {
            step: 4,
            checkpoint: true,
        };
        let value: Value = serde_json::from_str(&wrap_intermediate(step)).unwrap();
        assert_eq!(unwrap_intermediate(value).unwrap(), step);
        let value: Value = serde_json::from_str(&wrap_stop("exploited")).unwrap();
        assert_eq!(unwrap_stop(value).unwrap(), "exploited");
        for plain in [
            json!({"lr": 0.1}),
            json!({"$knob_member": 1}),
            json!({"$knob_stop": {}}),
            json!({"$knob_intermediate": {"step": "x"}}),
            json!([1]),
        ] {
            assert_eq!(unwrap_member(plain.clone()).unwrap_err(), plain);
            assert_eq!(unwrap_stop(plain.clone()).unwrap_err(), plain);
            assert_eq!(unwrap_intermediate(plain.clone()).unwrap_err(), plain);
        }
    }

    #[test]
    fn no_search_space_produces_an_envelope() {
        for name in [MEMBER_KEY, INTERMEDIATE_KEY, STOP_KEY] {
            let space = format!(r#"{{"{name}": {{"_type": "uniform", "_value": [0, 1]}}}}"#);
            assert!(crate::space::SearchSpace::parse(&space).is_err(), "{name}");
        }
    }
}
