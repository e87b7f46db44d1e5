//! What a tuner hands out is checked before any trial sees it: every parameter set must be a
//! member of the current search space (`SearchSpace::validate_parameters`: an object with every
//! parameter and no other, each value of its type and in its range). What a refusal does is the
//! experiment's `tunerErrorPolicy` (see `TunerErrorPolicy`).

use knob_plugin_api::space::SearchSpace;
use serde_json::Value;

/// The key NNI's multi-fidelity tuners (Hyperband, BOHB) add to a trial's parameters: the budget
/// the trial runs with. It is no parameter of the space, and trials read it, so it passes.
pub(crate) const TRIAL_BUDGET: &str = "TRIAL_BUDGET";

/// The one-line refusal of `parameters` handed out by `tuner` (its label, "tuner TPE") for
/// `parameter_id`, naming the parameter and the rule; `None` when the space holds them.
pub(crate) fn refusal(
    tuner: &str,
    parameter_id: u64,
    space: &SearchSpace,
    parameters: &Value,
) -> Option<String> {
    let budget_allowed = !space.parameters().iter().any(|p| p.name() == TRIAL_BUDGET);
    let checked = match parameters {
        Value::Object(map) if budget_allowed && map.contains_key(TRIAL_BUDGET) => {
            if !map[TRIAL_BUDGET].is_number() {
                return Some(format!(
                    "{tuner} handed out parameters the search space does not hold (parameter id {parameter_id}): {TRIAL_BUDGET} must be a number, got {}",
                    map[TRIAL_BUDGET]
                ));
            }
            let mut without = map.clone();
            without.shift_remove(TRIAL_BUDGET);
            std::borrow::Cow::Owned(Value::Object(without))
        }
        _ => std::borrow::Cow::Borrowed(parameters),
    };
    space.validate_parameters(&checked).err().map(|error| {
        format!(
            "{tuner} handed out parameters the search space does not hold (parameter id {parameter_id}): {error}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};
    use serde_json::json;

    fn check(parameters: Value, expect: Expect) {
        let space = SearchSpace::from_value(&json!({
            "lr": {"_type": "loguniform", "_value": [0.0001, 0.1]},
            "layers": {"_type": "randint", "_value": [1, 5]},
            "act": {"_type": "choice", "_value": ["relu", "tanh"]},
        }))
        .unwrap();
        let actual =
            refusal("tuner Halton", 7, &space, &parameters).unwrap_or_else(|| "accepted".into());
        expect.assert_eq(&actual);
    }

    #[test]
    fn each_kind_of_bad_output_gets_one_line_naming_tuner_parameter_and_rule() {
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu"}),
            expect!["accepted"],
        );
        check(
            json!({"lr": 0.5, "layers": 2, "act": "relu"}),
            expect![[
                r#"tuner Halton handed out parameters the search space does not hold (parameter id 7): trial parameter "lr": 0.5 is outside loguniform [0.0001, 0.1]"#
            ]],
        );
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu", "momentum": 0.9}),
            expect![[
                r#"tuner Halton handed out parameters the search space does not hold (parameter id 7): trial parameter "momentum": not in the search space; expected only [lr, layers, act]"#
            ]],
        );
        check(
            json!({"lr": 0.01, "act": "relu"}),
            expect![[
                r#"tuner Halton handed out parameters the search space does not hold (parameter id 7): trial parameter "layers": missing; the search space has it as randint [1, 5)"#
            ]],
        );
        check(
            json!([1, 2, 3]),
            expect!["tuner Halton handed out parameters the search space does not hold (parameter id 7): trial parameters: must be a JSON object of parameter values, got [1,2,3]"],
        );
    }

    #[test]
    fn a_multi_fidelity_budget_passes_but_must_be_a_number() {
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu", "TRIAL_BUDGET": 3}),
            expect!["accepted"],
        );
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu", "TRIAL_BUDGET": "all"}),
            expect![[
                r#"tuner Halton handed out parameters the search space does not hold (parameter id 7): TRIAL_BUDGET must be a number, got "all""#
            ]],
        );
    }
}
