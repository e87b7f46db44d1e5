//! What a tuner hands out is checked before any trial sees it: every parameter set must be a
//! member of the current search space (`SearchSpace::validate_parameters`: an object with every
//! parameter and no other, each value of its type and in its range). What a refusal does is the
//! experiment's `tunerErrorPolicy` (see `TunerErrorPolicy`).
//!
//! One form of space is read differently: NNI's BatchTuner space, a single `choice` whose values
//! are all parameters objects. Its tuner hands out one of those objects whole (NNI's trials get
//! `{"lr": 0.1}`, not `{"combine_params": {"lr": 0.1}}`), so a listed object is a member too.

use knob_plugin_api::space::{ParamType, SearchSpace};
use serde_json::Value;

/// The key NNI's multi-fidelity tuners (Hyperband, BOHB) add to a trial's parameters: the budget
/// the trial runs with. It is no parameter of the space, and trials read it, so it passes.
pub(crate) const TRIAL_BUDGET: &str = "TRIAL_BUDGET";

/// The keys NNI's PBTTuner adds to a trial's parameters: the folders its trial saves its
/// checkpoint to and loads one from. No parameters of the space; they pass as strings.
pub(crate) const NNI_PBT_CHECKPOINT_KEYS: [&str; 2] =
    ["save_checkpoint_dir", "load_checkpoint_dir"];

/// The one-line refusal of `parameters` handed out by `tuner` (its label, "tuner TPE") for
/// `parameter_id`, naming the parameter and the rule; `None` when the space holds them.
pub fn refusal(
    tuner: &str,
    parameter_id: u64,
    space: &SearchSpace,
    parameters: &Value,
) -> Option<String> {
    let budget_allowed = !space.parameters().iter().any(|p| p.name() == TRIAL_BUDGET);
    let in_space = |key: &str| space.parameters().iter().any(|p| p.name() == key);
    let pbt_keys: Vec<&str> = NNI_PBT_CHECKPOINT_KEYS
        .into_iter()
        .filter(|key| !in_space(key))
        .filter(|key| parameters.get(*key).is_some_and(Value::is_string))
        .collect();
    let without_pbt_keys;
    let parameters = match parameters {
        Value::Object(map) if !pbt_keys.is_empty() => {
            let mut map = map.clone();
            for key in &pbt_keys {
                map.shift_remove(*key);
            }
            without_pbt_keys = Value::Object(map);
            &without_pbt_keys
        }
        _ => parameters,
    };
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
    if is_listed_parameter_set(space, &checked) {
        return None;
    }
    space.validate_parameters(&checked).err().map(|error| {
        format!(
            "{tuner} handed out parameters the search space does not hold (parameter id {parameter_id}): {error}"
        )
    })
}

/// Whether `parameters` is one of the objects a BatchTuner-form space lists (a single choice
/// whose values are all objects).
fn is_listed_parameter_set(space: &SearchSpace, parameters: &Value) -> bool {
    let [param] = space.parameters() else {
        return false;
    };
    let ParamType::Choice { values } = param.param_type() else {
        return false;
    };
    values.iter().all(Value::is_object) && values.contains(parameters)
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
    fn nni_pbt_checkpoint_folders_pass_as_strings() {
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu",
                   "save_checkpoint_dir": "/c/1", "load_checkpoint_dir": "/c/0"}),
            expect!["accepted"],
        );
        check(
            json!({"lr": 0.01, "layers": 2, "act": "relu", "save_checkpoint_dir": 3}),
            expect![[
                r#"tuner Halton handed out parameters the search space does not hold (parameter id 7): trial parameter "save_checkpoint_dir": not in the search space; expected only [lr, layers, act]"#
            ]],
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

    #[test]
    fn a_batch_space_lists_whole_parameter_sets() {
        let space = SearchSpace::from_value(&json!({
            "combine_params": {"_type": "choice", "_value": [{"lr": 0.1, "bs": 16}, {"lr": 0.01}]},
        }))
        .unwrap();
        let check = |parameters: Value| refusal("tuner Batch", 0, &space, &parameters);
        assert_eq!(check(json!({"lr": 0.01})), None);
        assert_eq!(check(json!({"lr": 0.1, "bs": 16})), None);
        assert_eq!(check(json!({"combine_params": {"lr": 0.01}})), None);
        expect![[r#"tuner Batch handed out parameters the search space does not hold (parameter id 0): trial parameter "combine_params": missing; the search space has it as choice [{"lr":0.1,"bs":16}, {"lr":0.01}]"#]]
        .assert_eq(&check(json!({"lr": 0.5})).unwrap());
        // A choice of plain values is no list of sets: its value alone is not a member.
        let space = SearchSpace::from_value(
            &json!({"act": {"_type": "choice", "_value": ["relu", "tanh"]}}),
        )
        .unwrap();
        assert!(refusal("tuner Batch", 0, &space, &json!("relu")).is_some());
    }
}
