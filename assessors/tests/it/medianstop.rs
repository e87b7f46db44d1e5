//! Medianstop on hand-made curves whose right verdicts can be worked out by hand.

use expect_test::expect;
use knob_assessors::MedianstopAssessor;
use knob_plugin_api::{status, Assessor};

use crate::{assessor, judge, mirrored, run_in_sequence, run_trial};

/// Running averages: step 2 → 0.55, 0.4, 0.65; step 3 → 0.6, 0.4667, 0.7 (median 0.6);
/// step 4 → 0.65, 0.525, 0.7375; step 5 → 0.7, 0.56, 0.77.
const COMPLETED: [&[f64]; 3] = [
    &[0.5, 0.6, 0.7, 0.8, 0.9],
    &[0.3, 0.5, 0.6, 0.7, 0.7],
    &[0.6, 0.7, 0.8, 0.85, 0.9],
];
/// Stays under every median from step 1 on.
const BAD: &[f64] = &[0.2, 0.3, 0.35, 0.4, 0.4];
/// Equal to the median at step 2 (a tie goes on), above it after.
const GOOD: &[f64] = &[0.4, 0.55, 0.62, 0.7, 0.75];

#[test]
fn maximize_stops_the_bad_curve_at_start_step_and_keeps_the_good_one() {
    let mut medianstop: MedianstopAssessor = assessor(r#"{"start_step": 2}"#);
    let mut curves = COMPLETED.to_vec();
    curves.extend([BAD, GOOD]);
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 2: best 0.5 below median 0.55 of 1 completed trial
        t2: ran to the end
        t3: stopped: step 2: best 0.3 below median 0.55 of 2 completed trials
        t4: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut medianstop, &curves));
}

#[test]
fn minimize_gives_the_mirror_verdicts() {
    let mut medianstop: MedianstopAssessor =
        assessor(r#"{"optimize_mode": "minimize", "start_step": 2}"#);
    let curves: Vec<Vec<f64>> = COMPLETED
        .iter()
        .chain([&BAD, &GOOD])
        .map(|c| mirrored(c))
        .collect();
    let curves: Vec<&[f64]> = curves.iter().map(Vec::as_slice).collect();
    expect![[r#"
        t0: ran to the end
        t1: stopped: step 2: best 0.5 above median 0.45 of 1 completed trial
        t2: ran to the end
        t3: stopped: step 2: best 0.7 above median 0.45 of 2 completed trials
        t4: ran to the end
    "#]]
    .assert_eq(&run_in_sequence(&mut medianstop, &curves));
}

#[test]
fn nothing_is_judged_before_start_step() {
    let mut medianstop: MedianstopAssessor = assessor(r#"{"start_step": 4}"#);
    for (i, curve) in COMPLETED.iter().enumerate() {
        run_trial(&mut medianstop, &format!("done{i}"), curve);
    }
    let verdicts: Vec<String> = (1..=4)
        .map(|step| judge(&mut medianstop, "bad", &BAD[..step]))
        .collect();
    expect![[r#"
        [
            "go on",
            "go on",
            "go on",
            "stop: step 4: best 0.4 below median 0.65 of 3 completed trials",
        ]
    "#]]
    .assert_debug_eq(&verdicts);
}

#[test]
fn without_completed_trials_every_trial_goes_on() {
    let mut medianstop: MedianstopAssessor = assessor("{}");
    // Running together, none completed yet: nothing to compare with.
    for step in 1..=5 {
        assert_eq!(judge(&mut medianstop, "a", &GOOD[..step]), "go on");
        assert_eq!(judge(&mut medianstop, "b", &BAD[..step]), "go on");
    }
    // Trials that failed or were stopped are no reference either.
    medianstop.trial_end("a", status::FAILED).unwrap();
    medianstop.trial_end("b", status::EARLY_STOPPED).unwrap();
    assert_eq!(judge(&mut medianstop, "c", &[0.0]), "go on");
    // Nor is a completed trial that never reached this step.
    run_trial(&mut medianstop, "short", &[0.9, 0.9]);
    assert_eq!(judge(&mut medianstop, "d", &[0.0, 0.0, 0.0]), "go on");
    assert!(judge(&mut medianstop, "d2", &[0.0, 0.0]).starts_with("stop"));
}

#[test]
fn an_even_count_uses_the_more_lenient_middle_value_as_nni_does() {
    let completed: [&[f64]; 4] = [&[0.2], &[0.8], &[0.4], &[0.6]];
    let mut maximize: MedianstopAssessor = assessor("{}");
    let mut minimize: MedianstopAssessor = assessor(r#"{"optimize_mode": "minimize"}"#);
    for (i, curve) in completed.iter().enumerate() {
        run_trial(&mut maximize, &format!("c{i}"), curve);
        run_trial(&mut minimize, &format!("c{i}"), curve);
    }
    let verdicts = [
        judge(&mut maximize, "a", &[0.39]),
        judge(&mut maximize, "b", &[0.4]),
        judge(&mut maximize, "c", &[0.45]),
        judge(&mut minimize, "a", &[0.61]),
        judge(&mut minimize, "b", &[0.6]),
        judge(&mut minimize, "c", &[0.55]),
    ];
    expect![[r#"
        [
            "stop: step 1: best 0.39 below median 0.4 of 4 completed trials",
            "go on",
            "go on",
            "stop: step 1: best 0.61 above median 0.2 of 1 completed trial",
            "stop: step 1: best 0.6 above median 0.2 of 1 completed trial",
            "stop: step 1: best 0.55 above median 0.2 of 1 completed trial",
        ]
    "#]]
    .assert_debug_eq(&verdicts);
}

#[test]
fn the_best_so_far_counts_not_the_latest_result() {
    let mut medianstop: MedianstopAssessor = assessor("{}");
    run_trial(&mut medianstop, "done", &[0.5, 0.5, 0.5]);
    // Dropped to 0.1 at step 3, but its best (0.9) is above the median.
    assert_eq!(judge(&mut medianstop, "t", &[0.9, 0.2, 0.1]), "go on");
}

/// Medianstop keeps what it was handed and adds only the new results at each call: a retry
/// that starts over is judged on its own results, even when its history is as long as the
/// one kept (here one result), and the best it had before does not carry over.
#[test]
fn a_retry_is_judged_on_its_own_results_not_on_the_kept_best() {
    let mut medianstop: MedianstopAssessor = assessor("{}");
    run_trial(&mut medianstop, "done", &[0.5, 0.5, 0.5]);
    assert_eq!(judge(&mut medianstop, "t", &[0.9]), "go on");
    assert_eq!(
        judge(&mut medianstop, "t", &[0.1]),
        "stop: step 1: best 0.1 below median 0.5 of 1 completed trial"
    );
    // Three steps at once (the host skips calls to a slow assessor): the best among them counts.
    assert_eq!(judge(&mut medianstop, "t", &[0.1, 0.2, 0.7, 0.3]), "go on");
    assert_eq!(
        judge(&mut medianstop, "t", &[0.1, 0.2, 0.7, 0.3, 0.2]),
        "go on"
    );
}

#[test]
fn nan_is_never_a_best_nor_part_of_an_average() {
    let mut medianstop: MedianstopAssessor = assessor("{}");
    // Running averages: NaN (no number yet), 0.5, 0.6.
    run_trial(&mut medianstop, "done", &[f64::NAN, 0.5, 0.7]);
    let verdicts = [
        // Step 1: the completed trial had no number; nothing to compare with.
        judge(&mut medianstop, "a", &[0.0]),
        // Its best is 0.55 (the NaN is skipped), above 0.5.
        judge(&mut medianstop, "b", &[f64::NAN, 0.55]),
        judge(&mut medianstop, "c", &[0.45, f64::NAN]),
        judge(&mut medianstop, "d", &[f64::NAN, f64::NAN]),
        judge(&mut medianstop, "e", &[f64::NAN, 0.1, 0.7]),
    ];
    expect![[r#"
        [
            "go on",
            "go on",
            "stop: step 2: best 0.45 below median 0.5 of 1 completed trial",
            "stop: step 2: no numeric result yet (all NaN), median 0.5 of 1 completed trial",
            "go on",
        ]
    "#]]
    .assert_debug_eq(&verdicts);
}

#[test]
fn numbers_close_together_print_with_enough_digits_to_differ() {
    let mut medianstop: MedianstopAssessor = assessor("{}");
    run_trial(&mut medianstop, "done", &[0.740012]);
    expect!["stop: step 1: best 0.740005 below median 0.740012 of 1 completed trial"]
        .assert_eq(&judge(&mut medianstop, "t", &[0.740005]));
}

#[test]
fn same_calls_same_verdicts() {
    let run = || {
        let mut medianstop: MedianstopAssessor = assessor(r#"{"start_step": 1}"#);
        let mut curves = COMPLETED.to_vec();
        curves.extend([BAD, GOOD, BAD, GOOD]);
        run_in_sequence(&mut medianstop, &curves)
    };
    assert_eq!(run(), run());
}
