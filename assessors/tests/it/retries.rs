//! A retried trial: the manager requeues a failed attempt without `trial_end` and the same
//! trial id reports a new history from step 1.

use expect_test::expect;
use knob_assessors::{
    AshaAssessor, CurvefittingAssessor, MedianstopAssessor, PatienceAssessor, ThresholdAssessor,
};
use knob_plugin_api::Assessor;

use crate::{assessor, judge, run_trial};

/// 12 steps, then the same trial from step 1 again: no rule may panic or refuse.
fn start_over(assessor: &mut impl Assessor) {
    let first: Vec<f64> = (1..=12).map(|s| 0.5 + 0.01 * s as f64).collect();
    for step in 1..=first.len() {
        assessor.assess_trial("again", &first[..step]).unwrap();
    }
    let second: Vec<f64> = (1..=12).map(|s| 0.4 + 0.02 * s as f64).collect();
    for step in 1..=second.len() {
        assessor.assess_trial("again", &second[..step]).unwrap();
    }
}

#[test]
fn every_rule_takes_a_history_that_starts_over() {
    start_over(&mut assessor::<MedianstopAssessor>("{}"));
    start_over(&mut assessor::<CurvefittingAssessor>(
        r#"{"epoch_num": 20, "start_step": 3, "gap": 4}"#,
    ));
    start_over(&mut assessor::<AshaAssessor>(r#"{"eta": 2}"#));
    start_over(&mut assessor::<ThresholdAssessor>(r#"{"lower": 0}"#));
    start_over(&mut assessor::<PatienceAssessor>(r#"{"patience": 2}"#));
}

#[test]
fn asha_replaces_a_retried_trials_result_at_a_rung() {
    let mut asha: AshaAssessor = assessor(r#"{"eta": 2}"#);
    run_trial(&mut asha, "ref", &[0.5]);
    // First attempt: 0.9 at rung 1; the retry reports 0.6 there instead.
    assert_eq!(judge(&mut asha, "retried", &[0.9]), "go on");
    assert_eq!(judge(&mut asha, "retried", &[0.9, 0.9]), "go on");
    assert_eq!(judge(&mut asha, "retried", &[0.6]), "go on");
    // Rung 1 now holds 0.5 and 0.6, not 0.9.
    expect!["stop: step 1: 0.55 below 0.6, the best of 3 results at this rung (top 1/2 go on)"]
        .assert_eq(&judge(&mut asha, "next", &[0.55]));
}
