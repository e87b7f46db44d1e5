//! knob-assessors' one integration-test binary: each rule through its rlib, called as the
//! manager calls it (one `assess_trial` per intermediate result with the whole history so far,
//! then `trial_end`), and the built plugin library through the ABI.

mod abi;
mod args;
mod asha;
mod curvefitting;
mod direction;
mod medianstop;
mod patience;
mod retries;
mod threshold;

use knob_plugin_api::{status, Assessor};
use serde_json::Value;

/// An assessor built from `class_args` (JSON text).
fn assessor<A: Assessor>(class_args: &str) -> A {
    let args: Value = serde_json::from_str(class_args).expect("test classArgs are JSON");
    match A::new(&args) {
        Ok(assessor) => assessor,
        Err(e) => panic!("classArgs {class_args}: {e}"),
    }
}

/// The message the constructor fails with.
fn class_args_error<A: Assessor>(class_args: &str) -> String {
    let args: Value = serde_json::from_str(class_args).expect("test classArgs are JSON");
    match A::new(&args) {
        Ok(_) => panic!("classArgs {class_args} should be rejected"),
        Err(e) => e.message().to_owned(),
    }
}

/// Feeds `curve` to the assessor one result at a time, as the manager does, until the end or
/// the first stop verdict, then ends the trial (SUCCEEDED or EARLY_STOPPED). Returns
/// "ran to the end" or "stopped: <reason>".
fn run_trial(assessor: &mut impl Assessor, trial_id: &str, curve: &[f64]) -> String {
    for step in 1..=curve.len() {
        let verdict = assessor
            .assess_trial(trial_id, &curve[..step])
            .unwrap_or_else(|e| panic!("{trial_id} at step {step}: {e}"));
        if !verdict.keep_going {
            assert!(
                !verdict.reason.is_empty() && !verdict.reason.contains('\n'),
                "a stop needs a one-line reason: {:?}",
                verdict.reason
            );
            assessor.trial_end(trial_id, status::EARLY_STOPPED).unwrap();
            return format!("stopped: {}", verdict.reason);
        }
        assert!(verdict.reason.is_empty(), "{verdict:?}");
    }
    assessor.trial_end(trial_id, status::SUCCEEDED).unwrap();
    "ran to the end".into()
}

/// Runs `curves` one after another (each ends before the next starts); one outcome line each.
fn run_in_sequence(assessor: &mut impl Assessor, curves: &[&[f64]]) -> String {
    curves
        .iter()
        .enumerate()
        .map(|(i, curve)| format!("t{i}: {}\n", run_trial(assessor, &format!("t{i}"), curve)))
        .collect()
}

/// The verdict on one history, as "go on" or "stop: <reason>".
fn judge(assessor: &mut impl Assessor, trial_id: &str, history: &[f64]) -> String {
    let verdict = assessor.assess_trial(trial_id, history).unwrap();
    if verdict.keep_going {
        "go on".into()
    } else {
        format!("stop: {}", verdict.reason)
    }
}

/// Mirrors curves for minimize-mode tests: a loss of 1 − accuracy.
fn mirrored(curve: &[f64]) -> Vec<f64> {
    curve.iter().map(|v| 1.0 - v).collect()
}
