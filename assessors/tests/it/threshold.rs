//! Threshold: the latest result against fixed bounds.

use expect_test::expect;
use knob_assessors::ThresholdAssessor;

use crate::{assessor, run_in_sequence};

#[test]
fn a_lower_bound_for_a_maximized_metric_after_the_warm_up() {
    let mut threshold: ThresholdAssessor = assessor(r#"{"lower": 0.3, "n_warmup_steps": 2}"#);
    expect![[r#"
        t0: stopped: step 4: result 0.25 below the lower threshold 0.3
        t1: ran to the end
        t2: stopped: step 3: result 0.1 below the lower threshold 0.3
    "#]]
    .assert_eq(&run_in_sequence(
        &mut threshold,
        &[
            // Below the bound during the warm-up: not judged yet.
            &[0.1, 0.2, 0.35, 0.25],
            &[0.1, 0.2, 0.3, 0.9],
            &[0.5, 0.5, 0.1],
        ],
    ));
}

#[test]
fn an_upper_bound_for_a_minimized_metric() {
    let mut threshold: ThresholdAssessor = assessor(r#"{"upper": 10}"#);
    expect![[r#"
        t0: stopped: step 2: result 12 above the upper threshold 10
        t1: ran to the end
        t2: stopped: step 1: result 10.001 above the upper threshold 10
    "#]]
    .assert_eq(&run_in_sequence(
        &mut threshold,
        &[&[5.0, 12.0, 1.0], &[10.0, 9.0, 2.0], &[10.001]],
    ));
}

#[test]
fn both_bounds_and_nan() {
    let mut threshold: ThresholdAssessor = assessor(r#"{"lower": 0, "upper": 1}"#);
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 2: result -0.5 below the lower threshold 0
        t2: stopped: step 3: result NaN
        t3: stopped: step 1: result inf above the upper threshold 1
    "#]]
    .assert_eq(&run_in_sequence(
        &mut threshold,
        &[
            &[0.0, 1.0, 0.5],
            &[0.5, -0.5],
            &[0.5, 0.5, f64::NAN],
            &[f64::INFINITY],
        ],
    ));
}

#[test]
fn interval_steps_judges_every_interval_th_result_after_the_warm_up() {
    let mut threshold: ThresholdAssessor =
        assessor(r#"{"lower": 0.3, "n_warmup_steps": 1, "interval_steps": 2}"#);
    // Judged at steps 2, 4, 6, …: a dip at step 3 or 5 is not seen.
    let dip_at = |step: usize| -> Vec<f64> {
        let mut curve = vec![0.5; 6];
        curve[step - 1] = 0.1;
        curve
    };
    let curves: Vec<Vec<f64>> = (1..=6).map(dip_at).collect();
    let curves: Vec<&[f64]> = curves.iter().map(Vec::as_slice).collect();
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 2: result 0.1 below the lower threshold 0.3
        t2: ran to the end
        t3: stopped: step 4: result 0.1 below the lower threshold 0.3
        t4: ran to the end
        t5: stopped: step 6: result 0.1 below the lower threshold 0.3
    "#]]
    .assert_eq(&run_in_sequence(&mut threshold, &curves));
}
