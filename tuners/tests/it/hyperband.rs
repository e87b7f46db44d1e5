//! Hyperband and BOHB: NNI's bracket schedule, promotion by optimize mode, `TRIAL_BUDGET`,
//! string ids, deferral, failed trials, resume, classArgs errors, and labels through the ABI.

use std::collections::{BTreeMap, VecDeque};

use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::{status, Generated, ImportedTrial, Tuner};
use knob_tuners::{BohbTuner, HyperbandTuner};
use serde_json::{json, Value};

use crate::{class_args_error, tuner};

const SPACE: &str = r#"{"x": {"_type": "uniform", "_value": [0, 1]},
                        "act": {"_type": "choice", "_value": ["relu", "tanh"]}}"#;

/// One trial as the host knows it: id, label, parameters.
#[derive(Debug, Clone)]
struct Handed {
    id: u64,
    label: String,
    parameters: Value,
}

/// Asks for parameter id `id`; `None` when deferred.
fn ask(tuner: &mut impl Tuner, id: u64) -> Option<Handed> {
    match tuner.generate_parameters(id).unwrap() {
        Generated::Labeled { parameters, label } => Some(Handed {
            id,
            label,
            parameters,
        }),
        Generated::Deferred => None,
        other => panic!("id {id}: expected labeled parameters or a deferral, got {other:?}"),
    }
}

fn budget(h: &Handed) -> u64 {
    h.parameters["TRIAL_BUDGET"]
        .as_u64()
        .expect("TRIAL_BUDGET is a whole number")
}

/// Runs trials as the host does: `concurrency` at a time, each ended (in the order started)
/// with `objective(parameters)` as its result, or failed when `objective` gives `None`; deferred
/// ids are answered by `take_suggestions`. Returns every trial in the order it was handed out.
fn run(
    tuner: &mut impl Tuner,
    concurrency: usize,
    trials: usize,
    first_id: u64,
    objective: impl Fn(&Value) -> Option<f64>,
) -> Vec<Handed> {
    let mut next_id = first_id;
    let mut running: VecDeque<Handed> = VecDeque::new();
    let mut deferred = 0usize;
    let mut handed = Vec::new();
    while handed.len() < trials {
        while running.len() + deferred < concurrency && handed.len() + deferred < trials {
            match ask(tuner, next_id) {
                Some(h) => {
                    handed.push(h.clone());
                    running.push_back(h);
                }
                None => deferred += 1,
            }
            next_id += 1;
        }
        let Some(done) = running.pop_front() else {
            panic!("deadlock: {deferred} ids deferred, nothing running");
        };
        let mut emitted = Vec::new();
        match objective(&done.parameters) {
            Some(value) => {
                tuner
                    .receive_trial_result(done.id, &done.parameters, value)
                    .unwrap();
                emitted.extend(tuner.take_suggestions().unwrap());
                tuner.trial_end(done.id, status::SUCCEEDED).unwrap();
            }
            None => tuner.trial_end(done.id, status::FAILED).unwrap(),
        }
        emitted.extend(tuner.take_suggestions().unwrap());
        for s in emitted {
            deferred -= 1;
            let h = Handed {
                id: s.parameter_id,
                label: s.label.expect("Hyperband labels every suggestion"),
                parameters: s.parameters,
            };
            handed.push(h.clone());
            running.push_back(h);
        }
    }
    handed
}

fn x_of(p: &Value) -> f64 {
    p["x"].as_f64().unwrap()
}

#[test]
fn the_bracket_schedule_is_nni_s() {
    // NNI 3.0's `Bracket.get_n_r()` for every round of every bracket, computed with nni 3.0.
    let cases: &[(u64, u64, &str)] = &[
        (81, 3, "[[(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)], [(34, 3), (11, 9), (3, 27), (1, 81)], [(15, 9), (5, 27), (1, 81)], [(8, 27), (2, 81)], [(5, 81)]]"),
        (60, 3, "[[(27, 2), (9, 6), (3, 20), (1, 60)], [(12, 6), (4, 20), (1, 60)], [(6, 20), (2, 60)], [(4, 60)]]"),
        (100, 4, "[[(64, 1), (16, 6), (4, 25), (1, 100)], [(22, 6), (5, 25), (1, 100)], [(8, 25), (2, 100)], [(4, 100)]]"),
        (10, 2, "[[(8, 1), (4, 2), (2, 5), (1, 10)], [(6, 2), (3, 5), (1, 10)], [(4, 5), (2, 10)], [(4, 10)]]"),
        (5, 3, "[[(3, 1), (1, 5)], [(2, 5)]]"),
        (1, 3, "[[(1, 1)]]"),
    ];
    for (r, eta, nni) in cases {
        let t =
            tuner::<HyperbandTuner>(&format!(r#"{{"R": {r}, "eta": {eta}, "seed": 1}}"#), SPACE);
        assert_eq!(&format!("{:?}", t.schedule_table()), nni, "R={r} eta={eta}");
    }
    // BOHB's, from nni 3.0's bohb_advisor `Bracket` (min_budget, max_budget, eta).
    let cases: &[(u64, u64, u64, &str)] = &[
        (1, 3, 3, "[[(3, 1), (1, 3)], [(2, 3)]]"),
        (1, 27, 3, "[[(27, 1), (9, 3), (3, 9), (1, 27)], [(12, 3), (4, 9), (1, 27)], [(6, 9), (2, 27)], [(4, 27)]]"),
        (2, 27, 3, "[[(9, 3), (3, 9), (1, 27)], [(5, 9), (1, 27)], [(3, 27)]]"),
        (1, 100, 2, "[[(64, 1), (32, 3), (16, 6), (8, 12), (4, 25), (2, 50), (1, 100)], [(38, 3), (19, 6), (9, 12), (4, 25), (2, 50), (1, 100)], [(23, 6), (11, 12), (5, 25), (2, 50), (1, 100)], [(14, 12), (7, 25), (3, 50), (1, 100)], [(10, 25), (5, 50), (2, 100)], [(7, 50), (3, 100)], [(7, 100)]]"),
        (5, 5, 3, "[[(1, 5)]]"),
    ];
    for (min, max, eta, nni) in cases {
        let t = tuner::<BohbTuner>(
            &format!(r#"{{"min_budget": {min}, "max_budget": {max}, "eta": {eta}, "seed": 1}}"#),
            SPACE,
        );
        assert_eq!(
            &format!("{:?}", t.schedule_table()),
            nni,
            "{min}..{max} eta={eta}"
        );
    }
}

#[test]
fn trials_follow_the_schedule_with_budgets_and_nni_ids() {
    // R=9, eta=3: s_max=2. Bracket 0-2 runs 9 at budget 1, 3 at 3, 1 at 9; bracket 0-1 runs 5
    // at 3, then 1 at 9; bracket 0-0 runs 3 at 9; then the cycle starts again with 1-2.
    let mut t = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 7, "exec_mode": "serial"}"#,
        SPACE,
    );
    let handed = run(&mut t, 1, 23, 0, |p| Some(x_of(p)));
    let shape: Vec<String> = handed
        .iter()
        .map(|h| {
            let (prefix, k) = h.label.rsplit_once('_').unwrap();
            let k: u64 = k.parse().unwrap();
            // Configurations are numbered as brackets start them; promoted ones keep theirs.
            let k = if prefix.ends_with("_0") {
                k.to_string()
            } else {
                "k".into()
            };
            format!("{prefix}_{k}@{}", budget(h))
        })
        .collect();
    expect_test::expect![[r#"
        0-2_0_0@1 0-2_0_1@1 0-2_0_2@1 0-2_0_3@1 0-2_0_4@1 0-2_0_5@1 0-2_0_6@1 0-2_0_7@1 0-2_0_8@1
        0-2_1_k@3 0-2_1_k@3 0-2_1_k@3 0-2_2_k@9
        0-1_0_9@3 0-1_0_10@3 0-1_0_11@3 0-1_0_12@3 0-1_0_13@3 0-1_1_k@9
        0-0_0_14@9 0-0_0_15@9 0-0_0_16@9
        1-2_0_17@1"#]]
    .assert_eq(&format!(
        "{}\n{}\n{}\n{}\n{}",
        shape[..9].join(" "),
        shape[9..13].join(" "),
        shape[13..19].join(" "),
        shape[19..22].join(" "),
        shape[22..].join(" ")
    ));
    // Round 1 is the best three of round 0 (maximize, the default), best first; round 2 the
    // best of round 1.
    let k = |h: &Handed| h.label.rsplit('_').next().unwrap().to_string();
    let round1: Vec<String> = handed[9..12].iter().map(k).collect();
    assert_eq!(
        round1,
        [
            rank(&handed[..9], 0),
            rank(&handed[..9], 1),
            rank(&handed[..9], 2)
        ]
    );
    assert_eq!(k(&handed[12]), rank(&handed[9..12], 0));
    // A promoted configuration keeps its parameters; only the budget changes.
    for h in &handed[9..13] {
        let first = handed[..9].iter().find(|f| k(f) == k(h)).unwrap();
        assert_eq!(h.parameters["x"], first.parameters["x"]);
        assert_eq!(h.parameters["act"], first.parameters["act"]);
    }
}

/// The `k` of the `place`-th best (largest x, the default maximize) trial of `round`.
fn rank(round: &[Handed], place: usize) -> String {
    let mut sorted: Vec<&Handed> = round.iter().collect();
    sorted.sort_by(|a, b| x_of(&b.parameters).total_cmp(&x_of(&a.parameters)));
    sorted[place].label.rsplit('_').next().unwrap().to_string()
}

#[test]
fn promotion_keeps_the_best_by_optimize_mode() {
    for (mode, best_is_small) in [("minimize", true), ("maximize", false)] {
        let mut t = tuner::<HyperbandTuner>(
            &format!(r#"{{"R": 9, "eta": 3, "seed": 3, "optimize_mode": "{mode}"}}"#),
            SPACE,
        );
        // Parallelism (the default): other brackets run while round 0 completes.
        let handed = run(&mut t, 3, 30, 0, |p| Some(x_of(p)));
        let of_round = |prefix: &str| -> Vec<&Handed> {
            handed
                .iter()
                .filter(|h| h.label.starts_with(prefix))
                .collect()
        };
        let mut xs: Vec<f64> = of_round("0-2_0_")
            .iter()
            .map(|h| x_of(&h.parameters))
            .collect();
        assert_eq!(xs.len(), 9);
        xs.sort_by(f64::total_cmp);
        if !best_is_small {
            xs.reverse();
        }
        let round1 = of_round("0-2_1_");
        assert!(round1.iter().all(|h| budget(h) == 3));
        let mut promoted: Vec<f64> = round1.iter().map(|h| x_of(&h.parameters)).collect();
        promoted.sort_by(f64::total_cmp);
        let mut expected = xs[..3].to_vec();
        expected.sort_by(f64::total_cmp);
        assert_eq!(promoted, expected, "{mode}");
    }
}

#[test]
fn serial_mode_defers_while_a_round_runs_and_answers_when_it_completes() {
    let mut t = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 5, "exec_mode": "serial"}"#,
        SPACE,
    );
    let first: Vec<Handed> = (0..9).map(|id| ask(&mut t, id).unwrap()).collect();
    // Round 0 is all handed out and nothing has ended: round 1 must wait.
    assert!(ask(&mut t, 9).is_none());
    assert!(ask(&mut t, 10).is_none());
    for h in &first[..8] {
        t.receive_trial_result(h.id, &h.parameters, x_of(&h.parameters))
            .unwrap();
        t.trial_end(h.id, status::SUCCEEDED).unwrap();
        assert!(
            t.take_suggestions().unwrap().is_empty(),
            "round 0 is not complete yet"
        );
    }
    let last = &first[8];
    t.receive_trial_result(last.id, &last.parameters, 0.5)
        .unwrap();
    t.trial_end(last.id, status::SUCCEEDED).unwrap();
    let emitted = t.take_suggestions().unwrap();
    // Both deferred ids, oldest first, then the third promoted one on request.
    assert_eq!(
        emitted.iter().map(|s| s.parameter_id).collect::<Vec<_>>(),
        [9, 10]
    );
    assert!(emitted.iter().all(|s| s.parameters["TRIAL_BUDGET"] == 3));
    assert!(ask(&mut t, 11).unwrap().label.starts_with("0-2_1_"));
    // Parallelism mode opens the next bracket instead of waiting.
    let mut p = tuner::<HyperbandTuner>(r#"{"R": 9, "eta": 3, "seed": 5}"#, SPACE);
    for id in 0..9 {
        ask(&mut p, id).unwrap();
    }
    assert_eq!(ask(&mut p, 9).unwrap().label, "0-1_0_9");
}

#[test]
fn a_failed_trial_is_not_promoted_and_does_not_block_its_round() {
    let mut t = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 11, "exec_mode": "serial"}"#,
        SPACE,
    );
    // The best configuration of round 0 fails: the next three go on.
    let handed = run(&mut t, 2, 12, 0, |p| Some(x_of(p)));
    let best = handed[..9]
        .iter()
        .max_by(|a, b| x_of(&a.parameters).total_cmp(&x_of(&b.parameters)))
        .unwrap();
    let mut t = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 11, "exec_mode": "serial"}"#,
        SPACE,
    );
    let failed_label = best.label.clone();
    let handed = run(&mut t, 2, 12, 0, |p| {
        (p["x"] != best.parameters["x"]).then_some(x_of(p))
    });
    let k = |label: &str| label.rsplit('_').next().unwrap().to_string();
    assert!(handed[9..12].iter().all(|h| h.label.starts_with("0-2_1_")));
    assert!(!handed[9..12]
        .iter()
        .any(|h| k(&h.label) == k(&failed_label)));
    // When every trial of a round fails, the bracket ends and the next one opens.
    let mut t = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 11, "exec_mode": "serial"}"#,
        SPACE,
    );
    let handed = run(&mut t, 3, 10, 0, |_| None);
    assert_eq!(handed[9].label, "0-1_0_9");
}

/// The trials of an earlier run, as `knob resume` imports them: finished ones with results,
/// those still running with status RUNNING and no value.
fn imported(handed: &[Handed], results: &BTreeMap<u64, f64>) -> Vec<ImportedTrial> {
    handed
        .iter()
        .map(|h| {
            let mut trial = ImportedTrial::new(
                h.parameters.clone(),
                results.get(&h.id).copied().unwrap_or(f64::NAN),
            );
            trial.parameter_id = Some(h.id);
            trial.label = Some(h.label.clone());
            trial.status = Some(
                if results.contains_key(&h.id) {
                    status::SUCCEEDED
                } else {
                    status::RUNNING
                }
                .into(),
            );
            trial
        })
        .collect()
}

#[test]
fn resume_continues_the_right_bracket() {
    let args = r#"{"R": 9, "eta": 3, "seed": 21, "exec_mode": "serial"}"#;
    // The uninterrupted run.
    let mut whole = tuner::<HyperbandTuner>(args, SPACE);
    let all = run(&mut whole, 1, 16, 0, |p| Some(x_of(p)));
    // The same run stopped after 10 trials (round 0 done, one round-1 trial running, whose
    // result is still to come), resumed by a new tuner (its seed differs: nothing depends on it).
    let mut resumed = tuner::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 99, "exec_mode": "serial"}"#,
        SPACE,
    );
    let results: BTreeMap<u64, f64> = all[..9]
        .iter()
        .map(|h| (h.id, x_of(&h.parameters)))
        .collect();
    resumed
        .import_data(&imported(&all[..10], &results))
        .unwrap();
    // The round-1 trial that was running reports now, under its old id.
    let running = &all[9];
    resumed
        .receive_trial_result(running.id, &running.parameters, x_of(&running.parameters))
        .unwrap();
    resumed.trial_end(running.id, status::SUCCEEDED).unwrap();
    assert!(resumed.take_suggestions().unwrap().is_empty());
    let rest = run(&mut resumed, 1, 6, 100, |p| Some(x_of(p)));
    let labels = |hs: &[Handed]| {
        hs.iter()
            .map(|h| format!("{}@{}", h.label, budget(h)))
            .collect::<Vec<_>>()
    };
    // The rest of round 1, round 2 (the best of round 1) and the next bracket: as uninterrupted.
    assert_eq!(labels(&rest)[..3], labels(&all[10..13])[..]);
    assert_eq!(
        rest[..3].iter().map(|h| &h.parameters).collect::<Vec<_>>(),
        all[10..13]
            .iter()
            .map(|h| &h.parameters)
            .collect::<Vec<_>>()
    );
    assert!(
        labels(&rest)[3..]
            .iter()
            .all(|l| l.starts_with("0-1_0_") && l.ends_with("@3")),
        "{:?}",
        labels(&rest)
    );
    // BOHB rebuilds the same way.
    let mut bohb = tuner::<BohbTuner>(r#"{"min_budget": 1, "max_budget": 9, "seed": 4}"#, SPACE);
    let all = run(&mut bohb, 1, 10, 0, |p| Some(x_of(p)));
    let results: BTreeMap<u64, f64> = all[..9]
        .iter()
        .map(|h| (h.id, x_of(&h.parameters)))
        .collect();
    let mut resumed = tuner::<BohbTuner>(r#"{"min_budget": 1, "max_budget": 9, "seed": 4}"#, SPACE);
    resumed.import_data(&imported(&all[..9], &results)).unwrap();
    let next = ask(&mut resumed, 50).unwrap();
    assert_eq!(
        (next.label.as_str(), budget(&next)),
        (all[9].label.as_str(), 3)
    );
}

#[test]
fn resume_counts_failed_trials_as_ended_and_keeps_what_was_promoted() {
    let args = r#"{"R": 9, "eta": 3, "seed": 8, "exec_mode": "serial"}"#;
    let mut t = tuner::<HyperbandTuner>(args, SPACE);
    let round0: Vec<Handed> = (0..9).map(|id| ask(&mut t, id).unwrap()).collect();
    // An earlier run: eight results, one trial failed without one.
    let mut trials: Vec<ImportedTrial> = round0
        .iter()
        .map(|h| {
            let failed = h.id == 4;
            let mut trial = ImportedTrial::new(
                h.parameters.clone(),
                if failed {
                    f64::NAN
                } else {
                    x_of(&h.parameters)
                },
            );
            trial.parameter_id = Some(h.id);
            trial.label = Some(h.label.clone());
            trial.status = Some(
                if failed {
                    status::FAILED
                } else {
                    status::SUCCEEDED
                }
                .into(),
            );
            trial
        })
        .collect();
    // A trial not labeled by this tuner (added by hand) and one from another schedule are
    // left out of the brackets.
    trials.push(ImportedTrial::new(json!({"x": 0.5, "act": "relu"}), 0.1));
    let mut alien = ImportedTrial::new(json!({"x": 0.5, "act": "relu", "TRIAL_BUDGET": 1}), 0.2);
    alien.label = Some("7-3_0_999".into());
    trials.push(alien);
    let mut resumed = tuner::<HyperbandTuner>(args, SPACE);
    resumed.import_data(&trials).unwrap();
    let next: Vec<Handed> = (20..23).map(|id| ask(&mut resumed, id).unwrap()).collect();
    let mut expected: Vec<&Handed> = round0.iter().filter(|h| h.id != 4).collect();
    expected.sort_by(|a, b| x_of(&b.parameters).total_cmp(&x_of(&a.parameters)));
    let k = |label: &str| label.rsplit('_').next().unwrap().to_string();
    assert_eq!(
        next.iter().map(|h| h.label.clone()).collect::<Vec<_>>(),
        expected[..3]
            .iter()
            .map(|h| format!("0-2_1_{}", k(&h.label)))
            .collect::<Vec<_>>()
    );
    assert!(next.iter().all(|h| budget(h) == 3));
}

#[test]
fn bohb_runs_brackets_one_at_a_time_and_its_model_finds_the_good_region() {
    // Budgets 1, 3, 9: the first bracket runs 9, 3, 1 trials; BOHB waits for each round.
    let mut t = tuner::<BohbTuner>(
        r#"{"min_budget": 1, "max_budget": 9, "eta": 3, "seed": 2, "optimize_mode": "minimize"}"#,
        SPACE,
    );
    for id in 0..9 {
        let h = ask(&mut t, id).unwrap();
        assert_eq!((h.label.clone(), budget(&h)), (format!("2_0_{id}"), 1));
    }
    assert!(ask(&mut t, 9).is_none(), "round 1 waits for round 0");
    // Over many brackets, minimizing |x - 0.2| (and preferring tanh), the model's draws
    // concentrate near 0.2: the last brackets' first-round configurations beat random ones.
    let mut t = tuner::<BohbTuner>(
        r#"{"min_budget": 1, "max_budget": 9, "eta": 3, "seed": 2, "optimize_mode": "minimize", "random_fraction": 0}"#,
        SPACE,
    );
    let objective =
        |p: &Value| Some((x_of(p) - 0.2).abs() + if p["act"] == "tanh" { 0.0 } else { 0.3 });
    let handed = run(&mut t, 2, 200, 0, objective);
    let late: Vec<f64> = handed[120..]
        .iter()
        .filter(|h| h.label.contains("_0_"))
        .map(|h| objective(&h.parameters).unwrap())
        .collect();
    let mean = late.iter().sum::<f64>() / late.len() as f64;
    // A random configuration scores 0.15 + 0.25 = 0.4 on average (|x - 0.2| averages 0.34).
    assert!(mean < 0.2, "mean first-round score late in the run: {mean}");
}

#[test]
fn bad_class_args_are_one_line_errors_naming_the_argument() {
    let errors = [
        class_args_error::<HyperbandTuner>(r#"{"R": 0}"#),
        class_args_error::<HyperbandTuner>(r#"{"R": 2.5}"#),
        class_args_error::<HyperbandTuner>(r#"{"eta": 1}"#),
        class_args_error::<HyperbandTuner>(r#"{"exec_mode": "fast"}"#),
        class_args_error::<HyperbandTuner>(r#"{"optimize_mode": "max"}"#),
        class_args_error::<HyperbandTuner>(r#"{"r": 9}"#),
        class_args_error::<BohbTuner>(r#"{"min_budget": 9, "max_budget": 3}"#),
        class_args_error::<BohbTuner>(r#"{"top_n_percent": 100}"#),
        class_args_error::<BohbTuner>(r#"{"random_fraction": 1.5}"#),
        class_args_error::<BohbTuner>(r#"{"min_bandwidth": 0}"#),
        class_args_error::<BohbTuner>(r#"{"config_space": "/tmp/space.pcs"}"#),
    ];
    expect_test::expect![[r#"
        classArgs of Hyperband: R must be a whole number from 1 to 1000000000, got 0
        classArgs of Hyperband: R must be a whole number from 1 to 1000000000, got 2.5
        classArgs of Hyperband: eta must be a whole number from 2 to 1000000, got 1
        classArgs of Hyperband: exec_mode must be "parallelism" or "serial", got "fast"
        classArgs of Hyperband: optimize_mode must be "maximize" or "minimize", got "max"
        classArgs of Hyperband: unknown argument "r"; Hyperband takes optimize_mode, R, eta, exec_mode, seed
        classArgs of BOHB: max_budget (3) must be at least min_budget (9)
        classArgs of BOHB: top_n_percent must be a whole number from 1 to 99, got 100
        classArgs of BOHB: random_fraction must be a number from 0 to 1, got 1.5
        classArgs of BOHB: min_bandwidth must be a number above 0, got 0
        classArgs of BOHB: config_space (a ConfigSpace .pcs file) is not supported; give the search space in the experiment config (searchSpace or searchSpaceFile)
    "#]]
    .assert_eq(&(errors.join("\n") + "\n"));
    let mut t = HyperbandTuner::new(&json!({"seed": 1})).unwrap();
    let space = crate::parse(r#"{"TRIAL_BUDGET": {"_type": "choice", "_value": [1]}}"#);
    let error = t.update_search_space(&space).unwrap_err();
    assert!(error.message().contains("named TRIAL_BUDGET"), "{error}");
}

#[test]
fn labels_cross_the_abi_of_the_built_library() {
    let registry = PluginRegistry::load_from(&[crate::abi::plugin_file()]);
    let mut t = registry
        .tuner_object(
            "Hyperband",
            &json!({"R": 3, "eta": 3, "seed": 1, "exec_mode": "serial"}),
        )
        .unwrap();
    t.update_search_space(&serde_json::from_str(SPACE).unwrap())
        .unwrap();
    let mut first = Vec::new();
    for id in 0..3 {
        match t.generate_parameters(id).unwrap() {
            Generated::Labeled { parameters, label } => {
                assert_eq!(label, format!("0-1_0_{id}"));
                assert_eq!(parameters["TRIAL_BUDGET"], 1);
                first.push(parameters);
            }
            other => panic!("expected labeled parameters, got {other:?}"),
        }
    }
    assert_eq!(t.generate_parameters(3).unwrap(), Generated::Deferred);
    for (id, p) in first.iter().enumerate() {
        t.receive_trial_result(id as u64, p, id as f64).unwrap();
        let emitted = t.trial_end(id as u64, status::SUCCEEDED).unwrap();
        if id == 2 {
            // The best of round 0 (the largest value: maximize) goes on at budget 3.
            assert_eq!(emitted.len(), 1);
            assert_eq!(emitted[0].parameter_id, 3);
            assert_eq!(emitted[0].label.as_deref(), Some("0-1_1_2"));
            assert_eq!(emitted[0].parameters["TRIAL_BUDGET"], 3);
            assert_eq!(emitted[0].parameters["x"], p["x"]);
        } else {
            assert!(emitted.is_empty());
        }
    }
}

#[test]
fn bohb_proposes_valid_points_in_a_space_of_every_type_with_nested_choices() {
    let space = crate::parse(crate::drive::EVERY_TYPE);
    let mut t = tuner::<BohbTuner>(
        r#"{"min_budget": 1, "max_budget": 3, "eta": 3, "seed": 6, "optimize_mode": "minimize", "min_points_in_model": 1}"#,
        crate::drive::EVERY_TYPE,
    );
    // Budgets 1 and 3 only: results pile up quickly, so the model proposes most points.
    let handed = run(&mut t, 2, 400, 0, |p| {
        Some(crate::drive::every_type_objective(p))
    });
    for h in &handed {
        let mut parameters = h.parameters.clone();
        parameters.as_object_mut().unwrap().remove("TRIAL_BUDGET");
        space
            .validate_parameters(&parameters)
            .unwrap_or_else(|e| panic!("{}: {e}", h.parameters));
    }
    // The model's points score better than the first, random bracket's.
    let score = |hs: &[Handed]| {
        hs.iter()
            .map(|h| crate::drive::every_type_objective(&h.parameters))
            .sum::<f64>()
            / hs.len() as f64
    };
    let (early, late) = (score(&handed[..4]), score(&handed[300..]));
    assert!(late < early, "late mean {late} vs first bracket {early}");
}

#[test]
fn a_huge_first_bracket_is_never_listed() {
    // R 1e9, eta 2: the first bracket has 2^29 configurations. Only the few handed out exist;
    // listing them all took 12 GiB, so `knob create` of a 3-trial experiment aborted.
    let mut t = tuner::<HyperbandTuner>(r#"{"R": 1000000000, "eta": 2, "seed": 3}"#, SPACE);
    let first = run(&mut t, 2, 4, 0, |p| Some(x_of(p)));
    let labels: Vec<String> = first
        .iter()
        .map(|h| format!("{}@{}", h.label, budget(h)))
        .collect();
    assert_eq!(
        labels,
        ["0-29_0_0@1", "0-29_0_1@1", "0-29_0_2@1", "0-29_0_3@1"]
    );
    // Resumed with configuration 1 not started: it comes first, then the bracket goes on.
    let mut part = first.clone();
    part.remove(1);
    let results: BTreeMap<u64, f64> = part.iter().map(|h| (h.id, x_of(&h.parameters))).collect();
    let mut resumed = tuner::<HyperbandTuner>(r#"{"R": 1000000000, "eta": 2, "seed": 3}"#, SPACE);
    resumed.import_data(&imported(&part, &results)).unwrap();
    let next: Vec<Handed> = (10..13).map(|id| ask(&mut resumed, id).unwrap()).collect();
    let labels: Vec<&str> = next.iter().map(|h| h.label.as_str()).collect();
    assert_eq!(labels, ["0-29_0_1", "0-29_0_4", "0-29_0_5"]);
    assert_eq!(next[0].parameters, first[1].parameters);
    // BOHB's largest budget range the same way.
    let mut bohb = tuner::<BohbTuner>(
        r#"{"min_budget": 1, "max_budget": 1000000000, "eta": 2, "seed": 3}"#,
        SPACE,
    );
    let labels: Vec<String> = run(&mut bohb, 1, 3, 0, |p| Some(x_of(p)))
        .iter()
        .map(|h| h.label.clone())
        .collect();
    assert_eq!(labels, ["29_0_0", "29_0_1", "29_0_2"]);
    // Nothing near the gigabytes of a listed bracket was ever taken (peak of the whole test
    // process, so a generous bound).
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        let peak_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc/self/status");
        assert!(peak_kib < 2 << 20, "peak resident memory {peak_kib} KiB");
    }
}

/// After `knob update searchspace` narrows the space, a configuration the new space does not
/// hold is neither promoted (the best it holds take the places) nor handed out when it was
/// promoted before the change (its place is left empty): it used to be handed out, and under
/// the default `tunerErrorPolicy: error` the experiment ended in ERROR. Both tuners.
#[test]
fn configurations_outside_a_narrowed_space_go_no_further() {
    fn check<T: Tuner>(args: &str) {
        let x_space =
            |high: f64| format!(r#"{{"x": {{"_type": "uniform", "_value": [0, {high}]}}}}"#);
        let mut t = tuner::<T>(args, &x_space(1.0));
        // Round 0 of the first bracket: 9 configurations at once.
        let first: Vec<Handed> = (0..9).map(|id| ask(&mut t, id).unwrap()).collect();
        // The space narrows to [0, 0.75] while they run; maximize: the best are the largest.
        let narrowed = crate::parse(&x_space(0.75));
        t.update_search_space(&narrowed).unwrap();
        for h in &first {
            t.receive_trial_result(h.id, &h.parameters, x_of(&h.parameters))
                .unwrap();
            t.trial_end(h.id, status::SUCCEEDED).unwrap();
        }
        let mut held: Vec<f64> = first
            .iter()
            .map(|h| x_of(&h.parameters))
            .filter(|x| *x <= 0.75)
            .collect();
        held.sort_by(|a, b| b.total_cmp(a));
        assert!(
            held.len() >= 3 && held.len() < 9,
            "seed: {held:?} of {first:?}"
        );
        let mut next_id = 9;
        let mut ready: Vec<Handed> = t
            .take_suggestions()
            .unwrap()
            .into_iter()
            .map(|s| Handed {
                id: s.parameter_id,
                label: s.label.unwrap(),
                parameters: s.parameters,
            })
            .collect();
        while ready.len() < 3 {
            let h = ask(&mut t, next_id).expect("serial: round 1 is queued");
            next_id += 1;
            ready.push(h);
        }
        let mut promoted: Vec<f64> = ready.iter().map(|h| x_of(&h.parameters)).collect();
        promoted.sort_by(|a, b| b.total_cmp(a));
        assert_eq!(promoted, held[..3].to_vec(), "{args}");
        assert!(ready.iter().all(|h| budget(h) == 3), "{ready:?}");

        // Round 1 ends; round 2 promotes one; the space then narrows to below every config.
        for h in &ready {
            t.receive_trial_result(h.id, &h.parameters, x_of(&h.parameters))
                .unwrap();
            t.trial_end(h.id, status::SUCCEEDED).unwrap();
        }
        let tiny = crate::parse(&x_space(1e-12));
        t.update_search_space(&tiny).unwrap();
        // Whatever comes now (a pending promotion is dropped) lies in the new space.
        for id in next_id..next_id + 5 {
            if let Some(h) = ask(&mut t, id) {
                let mut config = h.parameters.clone();
                config.as_object_mut().unwrap().remove("TRIAL_BUDGET");
                assert!(
                    tiny.validate_parameters(&config).is_ok(),
                    "{args}: handed out {} outside the space",
                    h.parameters
                );
            }
        }
        for s in t.take_suggestions().unwrap() {
            let mut config = s.parameters.clone();
            config.as_object_mut().unwrap().remove("TRIAL_BUDGET");
            assert!(
                tiny.validate_parameters(&config).is_ok(),
                "{args}: {}",
                s.parameters
            );
        }
    }
    check::<HyperbandTuner>(
        r#"{"R": 9, "eta": 3, "seed": 3, "optimize_mode": "maximize", "exec_mode": "serial"}"#,
    );
    check::<BohbTuner>(
        r#"{"min_budget": 1, "max_budget": 9, "eta": 3, "seed": 3, "optimize_mode": "maximize"}"#,
    );
}
