//! knob-tuners' one integration-test binary: the tuners through their rlib, as the host's
//! adaptor calls them.

mod abi;
mod anneal;
mod batch;
mod cmaes;
mod drive;
mod evolution;
mod gp;
mod grid;
mod hyperband;
mod multi_objective;
mod pbt;
mod random;
mod tpe;

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, ImportedTrial, Tuner};
use serde_json::Value;

/// A tuner built from `class_args` and given `space` (NNI search-space JSON).
fn tuner<T: Tuner>(class_args: &str, space: &str) -> T {
    let args: Value = serde_json::from_str(class_args).expect("test classArgs are JSON");
    let mut tuner = T::new(&args).unwrap_or_else(|e| panic!("classArgs {class_args}: {e}"));
    tuner
        .update_search_space(&parse(space))
        .expect("the tuner takes the space");
    tuner
}

fn parse(space: &str) -> SearchSpace {
    SearchSpace::parse(space).unwrap_or_else(|e| panic!("test space is invalid: {e}"))
}

/// Up to `limit` parameters objects, stopping early at `NoMore` (`true` when it came).
fn generate(tuner: &mut impl Tuner, limit: usize) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    for id in 0..limit as u64 {
        match tuner.generate_parameters(id).expect("generate_parameters") {
            Generated::Parameters(params) => out.push(params),
            Generated::NoMore => return (out, true),
            Generated::Deferred | Generated::Labeled { .. } | Generated::Member { .. } => {
                panic!("neither Random nor GridSearch defers or labels")
            }
        }
    }
    (out, false)
}

/// One line per parameters object, then `NoMore` or `...` when `limit` was reached first.
fn listing(params: &[Value], no_more: bool) -> String {
    let mut text: String = params.iter().map(|p| format!("{p}\n")).collect();
    text.push_str(if no_more { "NoMore\n" } else { "...\n" });
    text
}

/// The message a constructor fails with.
fn class_args_error<T: Tuner + std::fmt::Debug>(class_args: &str) -> String {
    let args: Value = serde_json::from_str(class_args).expect("test classArgs are JSON");
    T::new(&args)
        .expect_err("classArgs should be rejected")
        .message()
        .to_owned()
}

fn imported(params: &[Value]) -> Vec<ImportedTrial> {
    params
        .iter()
        .map(|p| ImportedTrial::new(p.clone(), 0.5))
        .collect()
}

/// Canonical text of each point, to compare sets and find repeats.
fn keys(params: &[Value]) -> Vec<String> {
    params.iter().map(canonical).collect()
}

/// Object keys sorted, so that key order does not matter.
fn canonical(value: &Value) -> String {
    fn sort(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.clone(), sort(v)))
                        .collect(),
                )
            }
            Value::Array(items) => Value::Array(items.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(value).to_string()
}

fn assert_no_repeats(params: &[Value]) {
    let mut seen = std::collections::HashSet::new();
    for key in keys(params) {
        assert!(seen.insert(key.clone()), "{key} was handed out twice");
    }
}
