//! Patience: no improvement over the last patience + 1 results.

use expect_test::expect;
use knob_assessors::PatienceAssessor;

use crate::{assessor, mirrored, run_in_sequence};

/// With patience 2 the window is the last 3 results. t0 peaks at 0.7 (step 3) and its last
/// three by step 6 reach only 0.69; t1 ties its earlier best in the window (goes on); t2 keeps
/// improving.
const CURVES: [&[f64]; 3] = [
    &[0.5, 0.6, 0.7, 0.65, 0.68, 0.69, 0.9],
    &[0.5, 0.7, 0.6, 0.6, 0.7, 0.6, 0.6],
    &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7],
];

#[test]
fn maximize_stops_a_trial_that_stopped_improving() {
    let mut patience: PatienceAssessor = assessor(r#"{"patience": 2}"#);
    expect![[r#"
        t0: stopped: step 6: the best of the last 3 results, 0.69, is worse than 0.7 before them (patience 2)
        t1: ran to the end
        t2: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut patience, &CURVES));
}

#[test]
fn minimize_gives_the_mirror_verdicts() {
    let mut patience: PatienceAssessor =
        assessor(r#"{"patience": 2, "optimize_mode": "minimize"}"#);
    let curves: Vec<Vec<f64>> = CURVES.iter().map(|c| mirrored(c)).collect();
    let curves: Vec<&[f64]> = curves.iter().map(Vec::as_slice).collect();
    expect![[r#"
        t0: stopped: step 6: the best of the last 3 results, 0.31, is worse than 0.3 before them (patience 2)
        t1: ran to the end
        t2: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut patience, &curves));
}

#[test]
fn min_delta_tolerates_a_small_shortfall() {
    // 0.69 is 0.01 short of 0.7: within a tolerance of 0.02, not of 0.005.
    let mut lenient: PatienceAssessor = assessor(r#"{"patience": 2, "min_delta": 0.02}"#);
    let mut strict: PatienceAssessor = assessor(r#"{"patience": 2, "min_delta": 0.005}"#);
    let curve: &[f64] = &[0.5, 0.6, 0.7, 0.65, 0.68, 0.69];
    expect![[r#"
        t0: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut lenient, &[curve]));
    expect![[r#"
        t0: stopped: step 6: the best of the last 3 results, 0.69, is worse than 0.7 before them by more than min_delta 0.005 (patience 2)
    "#]]
    .assert_eq(&run_in_sequence(&mut strict, &[curve]));
}

#[test]
fn patience_zero_compares_the_last_result_with_all_before() {
    let mut patience: PatienceAssessor = assessor(r#"{"patience": 0}"#);
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 3: the last result, 0.55, is worse than 0.6 before it (patience 0)
    "#]]
    .assert_eq(&run_in_sequence(
        &mut patience,
        &[&[0.5, 0.6, 0.6, 0.7], &[0.5, 0.6, 0.55]],
    ));
}

#[test]
fn nan_is_never_an_improvement() {
    let mut patience: PatienceAssessor = assessor(r#"{"patience": 1}"#);
    expect![[r#"
        t0: stopped: step 4: the last 2 results are all NaN; the best before was 0.6 (patience 1)
        t1: ran to the end
        t2: stopped: step 4: the best of the last 2 results, 0.55, is worse than 0.6 before them (patience 1)
    "#]]
    .assert_eq(&run_in_sequence(
        &mut patience,
        &[
            &[0.5, 0.6, f64::NAN, f64::NAN],
            // Nothing before the window is a number: nothing to fall short of.
            &[f64::NAN, f64::NAN, 0.1, 0.1],
            &[0.5, 0.6, f64::NAN, 0.55],
        ],
    ));
}
