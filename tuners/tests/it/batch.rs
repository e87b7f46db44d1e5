//! Batch: the listed parameter sets in order, each once; spaces it cannot use.

use expect_test::expect;
use knob_plugin_api::{Generated, Tuner};
use knob_tuners::BatchTuner;
use serde_json::{json, Value};

use crate::drive::as_imported;
use crate::{class_args_error, generate, parse, tuner};

const SETS: &str = r#"{"combine_params": {"_type": "choice", "_value": [
    {"optimizer": "Adam", "learning_rate": 0.001},
    {"optimizer": "Adam", "learning_rate": 0.0001},
    {"optimizer": "SGD", "learning_rate": 0.01},
    {"optimizer": "Adam", "learning_rate": 0.001},
    {"optimizer": "SGD", "learning_rate": 0.005}
]}}"#;

#[test]
fn hands_out_each_set_in_order_then_no_more() {
    let mut batch: BatchTuner = tuner("{}", SETS);
    let (sets, no_more) = generate(&mut batch, 10);
    assert!(no_more);
    // The repeated fourth set is handed out once.
    assert_eq!(
        sets,
        [
            json!({"optimizer": "Adam", "learning_rate": 0.001}),
            json!({"optimizer": "Adam", "learning_rate": 0.0001}),
            json!({"optimizer": "SGD", "learning_rate": 0.01}),
            json!({"optimizer": "SGD", "learning_rate": 0.005}),
        ]
    );
    batch.receive_trial_result(0, &sets[0], 0.5).unwrap();
    assert_eq!(batch.generate_parameters(11).unwrap(), Generated::NoMore);
}

#[test]
fn a_resumed_run_skips_the_imported_sets() {
    let mut uninterrupted: BatchTuner = tuner("{}", SETS);
    let (all, _) = generate(&mut uninterrupted, 10);
    let mut resumed: BatchTuner = tuner(r#"{"optimize_mode": "maximize"}"#, SETS);
    let done: Vec<(Value, f64)> = all[..2].iter().map(|p| (p.clone(), 1.0)).collect();
    resumed.import_data(&as_imported(&done)).unwrap();
    assert_eq!(generate(&mut resumed, 10), (all[2..].to_vec(), true));
}

#[test]
fn spaces_it_cannot_use_and_class_args_are_clear_errors() {
    let error = |space: &str| {
        let mut batch = BatchTuner::new(&Value::Null).unwrap();
        batch
            .update_search_space(&parse(space))
            .unwrap_err()
            .message()
            .to_owned()
    };
    expect![[r#"Batch: the search space has 2 parameters; Batch's search space is one choice whose values are parameters objects, e.g. {"combine_params": {"_type": "choice", "_value": [{"lr": 0.1}, {"lr": 0.01}]}}"#]]
        .assert_eq(&error(r#"{"a": {"_type": "choice", "_value": [{"x": 1}]}, "b": {"_type": "choice", "_value": [{"x": 2}]}}"#));
    expect![[r#"Batch: lr is uniform, not a choice; Batch's search space is one choice whose values are parameters objects, e.g. {"combine_params": {"_type": "choice", "_value": [{"lr": 0.1}, {"lr": 0.01}]}}"#]]
        .assert_eq(&error(r#"{"lr": {"_type": "uniform", "_value": [0, 1]}}"#));
    expect![[r#"Batch: value 1 of combine_params is 3, not a parameters object; Batch's search space is one choice whose values are parameters objects, e.g. {"combine_params": {"_type": "choice", "_value": [{"lr": 0.1}, {"lr": 0.01}]}}"#]]
        .assert_eq(&error(r#"{"combine_params": {"_type": "choice", "_value": [{"x": 1}, 3]}}"#));
    expect![[r#"Batch: combine_params lists objects with "_name", which make a nested choice, not parameter sets; Batch's search space is one choice whose values are parameters objects, e.g. {"combine_params": {"_type": "choice", "_value": [{"lr": 0.1}, {"lr": 0.01}]}}"#]]
        .assert_eq(&error(r#"{"combine_params": {"_type": "choice", "_value": [{"_name": "a"}]}}"#));
    expect!["classArgs of Batch: unknown field `seed`, expected `optimize_mode`"]
        .assert_eq(&class_args_error::<BatchTuner>(r#"{"seed": 1}"#));
}
