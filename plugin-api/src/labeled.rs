//! How a label (the parameter id a trial sees, e.g. NNI Hyperband's `"0-4_0_3"`) crosses the
//! ABI with its parameters without changing the ABI's layout.
//!
//! Parameters cross as JSON text (`AbiGenerated::Parameters`, `AbiSuggestion::parameters`). A
//! labeled answer is the object `{"$knob_labeled": {"label": "<label>", "parameters": {...}}}`
//! instead of the parameters object. It cannot be a trial's parameters: a parameters object's
//! keys are search-space names, and `SearchSpace::parse` refuses a top-level parameter named
//! `$knob_labeled`. Plugins built before labels existed
//! never send it, so they load and behave as before; a host that predates labels would hand the
//! envelope to the trial, which is why only the built-in tuners, shipped with their host, label.

use serde_json::{Map, Value};

pub(crate) const ENVELOPE_KEY: &str = "$knob_labeled";

/// The JSON text of labeled parameters.
pub(crate) fn wrap(parameters: Value, label: String) -> String {
    let mut inner = Map::new();
    inner.insert("label".into(), Value::String(label));
    inner.insert("parameters".into(), parameters);
    let mut outer = Map::new();
    outer.insert(ENVELOPE_KEY.into(), Value::Object(inner));
    Value::Object(outer).to_string()
}

/// Splits what a plugin sent into parameters and label (`None` for plain parameters).
pub(crate) fn unwrap(value: Value) -> (Value, Option<String>) {
    let Value::Object(mut outer) = value else {
        return (value, None);
    };
    let is_envelope = outer.len() == 1
        && outer.get(ENVELOPE_KEY).is_some_and(|inner| {
            inner.as_object().is_some_and(|inner| {
                inner.len() == 2
                    && inner.get("label").is_some_and(Value::is_string)
                    && inner.contains_key("parameters")
            })
        });
    if !is_envelope {
        return (Value::Object(outer), None);
    }
    let Some(Value::Object(mut inner)) = outer.remove(ENVELOPE_KEY) else {
        unreachable!("checked above")
    };
    let label = match inner.remove("label") {
        Some(Value::String(label)) => label,
        _ => unreachable!("checked above"),
    };
    (
        inner.remove("parameters").unwrap_or(Value::Null),
        Some(label),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn labeled_parameters_round_trip_and_plain_ones_pass_through() {
        let parameters = json!({"lr": 0.1, "TRIAL_BUDGET": 3});
        let text = wrap(parameters.clone(), "0-4_0_3".into());
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(unwrap(value), (parameters.clone(), Some("0-4_0_3".into())));
        assert_eq!(unwrap(parameters.clone()), (parameters, None));
        // Near misses stay parameters.
        for plain in [
            json!({"$knob_labeled": {"label": "x", "parameters": {}, "extra": 1}}),
            json!({"$knob_labeled": {"label": 3, "parameters": {}}}),
            json!({"$knob_labeled": {"label": "x", "parameters": {}}, "other": 1}),
            json!({"$knob_labeled": 1}),
            json!([1, 2]),
        ] {
            assert_eq!(unwrap(plain.clone()), (plain, None));
        }
    }

    #[test]
    fn no_search_space_produces_the_envelope() {
        let space = r#"{"$knob_labeled": {"_type": "choice", "_value": [{"label": "a", "parameters": {}}]}}"#;
        assert_eq!(
            crate::space::SearchSpace::parse(space).unwrap_err().to_string(),
            "search space parameter \"$knob_labeled\": this name is reserved by knob; rename the parameter"
        );
        // Nested, the name is an ordinary one: it never reaches the top level of parameters.
        let nested = r#"{"opt": {"_type": "choice", "_value": [{"_name": "a", "$knob_labeled": {"_type": "uniform", "_value": [0, 1]}}]}}"#;
        assert!(crate::space::SearchSpace::parse(nested).is_ok());
    }
}
