//! ASHA on hand-made curves: rungs at steps 1, 2, 4 (eta 2), each trial judged against the
//! results recorded at a rung before it, its own included.

use expect_test::expect;
use knob_assessors::AshaAssessor;

use crate::{assessor, judge, mirrored, run_in_sequence};

/// At rung 1 the results arrive as 0.5, 0.4, 0.6, 0.55, 0.3, 0.52: the top ⌊n/2⌋ (at least 1)
/// go on, so t1 (0.4 < best 0.5) and t4 (0.3 < 2nd best 0.55) stop; t3 and t5 tie the cutoff
/// and go on. At rung 2, t3 (0.62 < best 0.65 of 3) stops; at rung 4, t5 (0.8 < 0.85) stops.
const CURVES: [&[f64]; 6] = [
    &[0.5, 0.6, 0.7, 0.8, 0.8, 0.8],
    &[0.4, 0.5, 0.6, 0.7, 0.7, 0.7],
    &[0.6, 0.65, 0.75, 0.85, 0.9, 0.9],
    &[0.55, 0.62, 0.7, 0.75, 0.8, 0.8],
    &[0.3, 0.5, 0.7, 0.9, 0.95, 0.95],
    &[0.52, 0.7, 0.78, 0.8, 0.81, 0.82],
];

#[test]
fn maximize_keeps_the_top_half_at_each_rung() {
    let mut asha: AshaAssessor = assessor(r#"{"reduction_factor": 2, "max_resource": 8}"#);
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 1: 0.4 below 0.5, the best of 2 results at this rung (top 1/2 go on)
        t2: ran to the end
        t3: stopped: step 2: 0.62 below 0.65, the best of 3 results at this rung (top 1/2 go on)
        t4: stopped: step 1: 0.3 below 0.55, the 2nd best of 5 results at this rung (top 1/2 go on)
        t5: stopped: step 4: 0.8 below 0.85, the best of 3 results at this rung (top 1/2 go on)
    "#]]
    .assert_eq(&run_in_sequence(&mut asha, &CURVES));
}

#[test]
fn minimize_gives_the_mirror_verdicts() {
    let mut asha: AshaAssessor =
        assessor(r#"{"eta": 2, "max_resource": 8, "optimize_mode": "minimize"}"#);
    let curves: Vec<Vec<f64>> = CURVES.iter().map(|c| mirrored(c)).collect();
    let curves: Vec<&[f64]> = curves.iter().map(Vec::as_slice).collect();
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 1: 0.6 above 0.5, the best of 2 results at this rung (top 1/2 go on)
        t2: ran to the end
        t3: stopped: step 2: 0.38 above 0.35, the best of 3 results at this rung (top 1/2 go on)
        t4: stopped: step 1: 0.7 above 0.45, the 2nd best of 5 results at this rung (top 1/2 go on)
        t5: stopped: step 4: 0.2 above 0.15, the best of 3 results at this rung (top 1/2 go on)
    "#]]
    .assert_eq(&run_in_sequence(&mut asha, &curves));
}

#[test]
fn no_stop_before_the_grace_period_nor_at_or_above_max_resource() {
    // grace_period 2: rung 1 judges nobody, so t1 and t4 reach rung 2.
    let mut asha: AshaAssessor = assessor(r#"{"eta": 2, "grace_period": 2}"#);
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 2: 0.5 below 0.6, the best of 2 results at this rung (top 1/2 go on)
        t2: ran to the end
        t3: stopped: step 4: 0.75 below 0.85, the best of 3 results at this rung (top 1/2 go on)
        t4: stopped: step 2: 0.5 below 0.62, the 2nd best of 5 results at this rung (top 1/2 go on)
        t5: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut asha, &CURVES));

    // max_resource 4: rungs 1 and 2 only; t5 is not judged at step 4.
    let mut asha: AshaAssessor = assessor(r#"{"eta": 2, "max_resource": 4}"#);
    let outcomes = run_in_sequence(&mut asha, &CURVES);
    assert!(outcomes.ends_with("t5: ran to the end\n"), "{outcomes}");
}

#[test]
fn rungs_follow_min_resource_times_powers_of_eta() {
    // min_resource 3, eta 3: rungs at 3, 9, 27. Each probe is as good as the best except for
    // one dip; only a dip at a rung is seen.
    let mut asha: AshaAssessor = assessor(r#"{"eta": 3, "min_resource": 3}"#);
    let judged_at: Vec<usize> = (1..=30)
        .filter(|&dip| {
            let mut curve = vec![0.6; 30];
            curve[dip - 1] = 0.4;
            let outcome = crate::run_trial(&mut asha, &format!("dip{dip}"), &curve);
            assert!(
                outcome == "ran to the end"
                    || outcome.starts_with(&format!("stopped: step {dip}:")),
                "{outcome}"
            );
            outcome != "ran to the end"
        })
        .collect();
    assert_eq!(judged_at, [3, 9, 27]);
}

#[test]
fn nan_at_a_rung_stops_the_trial_and_nan_between_rungs_does_not_matter() {
    let mut asha: AshaAssessor = assessor(r#"{"eta": 2}"#);
    assert_eq!(judge(&mut asha, "a", &[0.5]), "go on");
    assert_eq!(judge(&mut asha, "a", &[0.5, 0.6]), "go on");
    assert_eq!(judge(&mut asha, "a", &[0.5, 0.6, f64::NAN]), "go on");
    expect!["stop: step 4: result NaN at this rung (never in the top 1/2)"].assert_eq(&judge(
        &mut asha,
        "a",
        &[0.5, 0.6, f64::NAN, f64::NAN],
    ));
    // The NaN was not recorded: the next trial is alone at rung 4.
    assert_eq!(
        judge(&mut asha, "b", &[0.1, 0.1, 0.1, 0.1]),
        "stop: step 1: 0.1 below 0.5, the best of 2 results at this rung (top 1/2 go on)"
    );
}

#[test]
fn results_arriving_together_are_judged_at_every_rung_passed() {
    let mut asha: AshaAssessor = assessor(r#"{"eta": 2}"#);
    crate::run_trial(&mut asha, "ref", &[0.5, 0.5, 0.5, 0.5]);
    // First call already at step 4: rung 1 passes (0.6), rung 2 stops it (0.4).
    expect!["stop: step 2: 0.4 below 0.5, the best of 2 results at this rung (top 1/2 go on)"]
        .assert_eq(&judge(&mut asha, "late", &[0.6, 0.4, 0.9, 0.9]));
}

#[test]
fn defaults_are_eta_4_from_step_1() {
    let mut asha: AshaAssessor = assessor("{}");
    // Rung 1: 4 results, the top ⌊4/4⌋ = 1 goes on.
    let outcomes = run_in_sequence(
        &mut asha,
        &[&[0.5, 0.5], &[0.6, 0.6], &[0.4, 0.4], &[0.55, 0.55]],
    );
    expect![[r#"
        t0: ran to the end
        t1: ran to the end
        t2: stopped: step 1: 0.4 below 0.6, the best of 3 results at this rung (top 1/4 go on)
        t3: stopped: step 1: 0.55 below 0.6, the best of 4 results at this rung (top 1/4 go on)
    "#]]
    .assert_eq(&outcomes);
}
