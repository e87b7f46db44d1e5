//! Running model-based tuners against objective functions, for the TPE, Anneal and Evolution
//! tests: sequential runs, parallel batches, and the search spaces they share.

use std::collections::HashSet;

use knob_plugin_api::{Generated, ImportedTrial, Tuner};
use serde_json::Value;

use crate::{canonical, parse};

/// Every `_type`, a nested choice with sub-parameters, and a choice of mixed JSON values.
pub const EVERY_TYPE: &str = r#"{
    "c": {"_type": "choice", "_value": [1, "two", 3.5, {"k": 1}]},
    "r": {"_type": "randint", "_value": [-3, 4]},
    "u": {"_type": "uniform", "_value": [-1, 1]},
    "qu": {"_type": "quniform", "_value": [0, 10, 2.5]},
    "lu": {"_type": "loguniform", "_value": [0.001, 1]},
    "qlu": {"_type": "qloguniform", "_value": [1, 1000, 10]},
    "n": {"_type": "normal", "_value": [0, 2]},
    "qn": {"_type": "qnormal", "_value": [5, 3, 1]},
    "ln": {"_type": "lognormal", "_value": [0, 1]},
    "qln": {"_type": "qlognormal", "_value": [1, 0.5, 0.5]},
    "net": {"_type": "choice", "_value": [
        {"_name": "conv", "kernel": {"_type": "randint", "_value": [1, 8]},
                          "width": {"_type": "quniform", "_value": [8, 64, 8]}},
        {"_name": "mlp", "depth": {"_type": "choice", "_value": [1, 2, 3]},
                         "act": {"_type": "choice", "_value": [
                             {"_name": "relu"},
                             {"_name": "leaky", "slope": {"_type": "uniform", "_value": [0, 0.3]}}]}},
        {"_name": "none"}]}
}"#;

/// Two continuous parameters; the objective [`bowl`] has its minimum 0 at (0.3, -0.2).
pub const PLANE: &str = r#"{
    "x": {"_type": "uniform", "_value": [-1, 1]},
    "y": {"_type": "uniform", "_value": [-1, 1]}
}"#;

pub fn bowl(p: &Value) -> f64 {
    let x = p["x"].as_f64().unwrap();
    let y = p["y"].as_f64().unwrap();
    (x - 0.3).powi(2) + (y + 0.2).powi(2)
}

/// A smooth function of every parameter of [`EVERY_TYPE`] (numbers by value, others by kind).
pub fn every_type_objective(p: &Value) -> f64 {
    let number = |key: &str| p[key].as_f64().unwrap_or(0.0);
    let mut f = (number("u") - 0.5).powi(2) + (number("r") - 1.0).abs() / 3.0;
    f += (number("qu") / 10.0 - 0.25).powi(2) + (number("lu").ln() + 3.0).powi(2) / 10.0;
    f += number("n").abs() / 5.0 + number("qln") / 10.0;
    f += match &p["c"] {
        Value::String(_) => 0.0,
        _ => 0.3,
    };
    f += match p["net"]["_name"].as_str() {
        Some("mlp") => 0.1 * number_in(&p["net"], "depth"),
        Some("conv") => 0.2,
        _ => 0.5,
    };
    f
}

fn number_in(object: &Value, key: &str) -> f64 {
    object[key].as_f64().unwrap_or(0.0)
}

/// Parameters for `id`, which must not be deferred.
pub fn ask(tuner: &mut impl Tuner, id: u64) -> Option<Value> {
    match tuner.generate_parameters(id).expect("generate_parameters") {
        Generated::Parameters(p) => Some(p),
        Generated::NoMore => None,
        Generated::Deferred => panic!("parameter id {id} was deferred"),
        Generated::Labeled { .. } | Generated::Member { .. } => {
            panic!("parameter id {id} was labeled")
        }
    }
}

/// `n` trials one after another, each result reported before the next is asked for; ids from
/// `first_id`. Returns each trial's parameters and value.
pub fn run_sequential(
    tuner: &mut impl Tuner,
    first_id: u64,
    n: usize,
    objective: impl Fn(&Value) -> f64,
) -> Vec<(Value, f64)> {
    let mut out = Vec::new();
    for id in first_id..first_id + n as u64 {
        let Some(params) = ask(tuner, id) else { break };
        let value = objective(&params);
        tuner
            .receive_trial_result(id, &params, value)
            .expect("receive_trial_result");
        tuner.trial_end(id, "SUCCEEDED").expect("trial_end");
        out.push((params, value));
    }
    out
}

pub fn as_imported(trials: &[(Value, f64)]) -> Vec<ImportedTrial> {
    trials
        .iter()
        .map(|(p, v)| ImportedTrial::new(p.clone(), *v))
        .collect()
}

pub fn best(trials: &[(Value, f64)]) -> f64 {
    trials.iter().map(|t| t.1).fold(f64::INFINITY, f64::min)
}

/// Panics unless every point is in `space` and none repeats.
pub fn assert_valid_and_distinct(space: &str, points: impl IntoIterator<Item = Value>) {
    let space = parse(space);
    let mut seen = HashSet::new();
    for p in points {
        space
            .validate_parameters(&p)
            .unwrap_or_else(|e| panic!("{p} is not in the space: {e}"));
        assert!(seen.insert(canonical(&p)), "{p} was handed out twice");
    }
}

/// The median of `values`.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
