//! CMAES: classArgs, every search-space type, seeds, resume (replayed and foreign), parallel
//! suggestions, optimize_mode symmetry, restarts in a small space, and that it optimizes.

use expect_test::expect;
use knob_plugin_api::Tuner;
use knob_tuners::{CmaEsTuner, RandomTuner};
use serde_json::{json, Value};

use crate::drive::{
    as_imported, ask, assert_valid_and_distinct, best, bowl, every_type_objective, median,
    run_sequential, EVERY_TYPE, PLANE,
};
use crate::{class_args_error, tuner};

/// Minimizing unless `extra` says otherwise: the objectives here are losses.
fn cmaes(extra: Value, space: &str) -> CmaEsTuner {
    let mut args = json!({"seed": 1, "optimize_mode": "minimize"});
    args.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    tuner(&args.to_string(), space)
}

fn points(trials: &[(Value, f64)]) -> Vec<Value> {
    trials.iter().map(|t| t.0.clone()).collect()
}

#[test]
fn a_seed_replays_the_run_and_another_seed_does_not() {
    let a = run_sequential(&mut cmaes(json!({}), PLANE), 0, 20, bowl);
    let b = run_sequential(&mut cmaes(json!({}), PLANE), 0, 20, bowl);
    let c = run_sequential(&mut cmaes(json!({"seed": 2}), PLANE), 0, 20, bowl);
    assert_eq!(a, b);
    assert_ne!(points(&a), points(&c));
}

#[test]
fn every_search_space_type_gives_valid_distinct_points() {
    let trials = run_sequential(
        &mut cmaes(json!({}), EVERY_TYPE),
        0,
        40,
        every_type_objective,
    );
    assert_eq!(trials.len(), 40);
    assert_valid_and_distinct(EVERY_TYPE, points(&trials));
    // Only choices: drawn from the best results, still never repeated, then used up.
    let choices = r#"{"a": {"_type": "choice", "_value": ["x", "y", "z"]},
                      "b": {"_type": "choice", "_value": [1, 2]}}"#;
    let mut tuner = cmaes(json!({}), choices);
    let trials = run_sequential(&mut tuner, 0, 10, |p| {
        f64::from(u8::from(p["a"] != "y")) + p["b"].as_f64().unwrap()
    });
    assert_eq!(trials.len(), 6);
    assert_valid_and_distinct(choices, points(&trials));
}

#[test]
fn restarts_keep_finding_unseen_points_until_a_finite_space_is_used_up() {
    // 11 × 5 points: the distribution converges and repeats itself long before they are all
    // tried; restarts and then the grid walk find the rest.
    let space = r#"{"x": {"_type": "quniform", "_value": [0, 1, 0.1]},
                    "k": {"_type": "randint", "_value": [0, 5]}}"#;
    let mut tuner = cmaes(json!({}), space);
    let trials = run_sequential(&mut tuner, 0, 80, |p| {
        (p["x"].as_f64().unwrap() - 0.3).powi(2) + p["k"].as_f64().unwrap()
    });
    assert_eq!(trials.len(), 55);
    assert_valid_and_distinct(space, points(&trials));
    assert_eq!(ask(&mut tuner, 99), None);
}

#[test]
fn resuming_from_imported_results_continues_the_uninterrupted_run() {
    let uninterrupted = run_sequential(
        &mut cmaes(json!({}), EVERY_TYPE),
        0,
        24,
        every_type_objective,
    );
    // 13 is in the middle of a generation (λ = 4 + ⌊3 ln 13⌋ = 11 numeric dimensions → 11).
    for cut in [0, 13, 20] {
        let mut resumed = cmaes(json!({}), EVERY_TYPE);
        resumed
            .import_data(&as_imported(&uninterrupted[..cut]))
            .unwrap();
        let rest = run_sequential(&mut resumed, cut as u64, 24 - cut, every_type_objective);
        assert_eq!(rest, uninterrupted[cut..], "resumed after {cut}");
    }
}

#[test]
fn foreign_history_is_injected_and_never_repeated() {
    let mut random: RandomTuner = tuner(r#"{"seed": 5}"#, PLANE);
    let history = run_sequential(&mut random, 0, 15, bowl);
    let mut resumed = cmaes(json!({}), PLANE);
    resumed.import_data(&as_imported(&history)).unwrap();
    let rest = run_sequential(&mut resumed, 15, 15, bowl);
    let mut all = points(&history);
    all.extend(points(&rest));
    assert_valid_and_distinct(PLANE, all);
}

#[test]
fn parallel_suggestions_are_distinct_and_late_results_are_harmless() {
    let mut tuner = cmaes(json!({"population_size": 4}), PLANE);
    // Ten trials at once: more than a generation.
    let batch: Vec<Value> = (0..10).map(|id| ask(&mut tuner, id).unwrap()).collect();
    assert_valid_and_distinct(PLANE, batch.clone());
    for (id, p) in batch.iter().enumerate().rev() {
        tuner.receive_trial_result(id as u64, p, bowl(p)).unwrap();
    }
    // One that fails without a result, one result for a trial it never generated.
    let failing = ask(&mut tuner, 10).unwrap();
    tuner.trial_end(10, "FAILED").unwrap();
    tuner
        .receive_trial_result(77, &json!({"x": 0.1, "y": 0.1}), 0.2)
        .unwrap();
    let more = run_sequential(&mut tuner, 11, 10, bowl);
    let mut all = batch;
    all.push(failing);
    all.extend(points(&more));
    assert_valid_and_distinct(PLANE, all);
}

#[test]
fn maximizing_a_function_is_minimizing_its_negation() {
    let minimized = run_sequential(
        &mut cmaes(json!({"optimize_mode": "minimize"}), PLANE),
        0,
        24,
        bowl,
    );
    let maximized = run_sequential(
        &mut cmaes(json!({"optimize_mode": "maximize"}), PLANE),
        0,
        24,
        |p| -bowl(p),
    );
    assert_eq!(points(&minimized), points(&maximized));
    // The default is maximize, as knob's core reads an absent optimize_mode for a tuner NNI
    // does not have.
    let mut default: CmaEsTuner = tuner(r#"{"seed": 1}"#, PLANE);
    let default = run_sequential(&mut default, 0, 24, |p| -bowl(p));
    assert_eq!(points(&default), points(&maximized));
}

#[test]
fn every_class_arg_is_accepted_and_matters() {
    let baseline = points(&run_sequential(&mut cmaes(json!({}), PLANE), 0, 12, bowl));
    for extra in [
        json!({"sigma0": 0.05}),
        json!({"population_size": 3}),
        json!({"seed": 9}),
    ] {
        let got = points(&run_sequential(
            &mut cmaes(extra.clone(), PLANE),
            0,
            12,
            bowl,
        ));
        assert_valid_and_distinct(PLANE, got.clone());
        assert_ne!(got, baseline, "{extra} made no difference");
    }
    // A small sigma0 keeps the first generation near the centre of the ranges.
    let narrow = points(&run_sequential(
        &mut cmaes(json!({"sigma0": 0.01}), PLANE),
        0,
        6,
        bowl,
    ));
    for p in narrow {
        assert!(p["x"].as_f64().unwrap().abs() < 0.1, "{p}");
    }
}

#[test]
fn beats_random_search_on_a_quadratic() {
    let budget = 40;
    let mut cma_best = Vec::new();
    let mut random_best = Vec::new();
    for seed in 0..7 {
        let mut cma = cmaes(json!({"seed": seed}), PLANE);
        cma_best.push(best(&run_sequential(&mut cma, 0, budget, bowl)));
        let mut random: RandomTuner = tuner(&json!({"seed": seed}).to_string(), PLANE);
        random_best.push(best(&run_sequential(&mut random, 0, budget, bowl)));
    }
    let (cma_median, random_median) = (median(cma_best), median(random_best));
    assert!(
        cma_median < random_median / 4.0,
        "CMA-ES median best {cma_median}, Random {random_median}"
    );
}

#[test]
fn errors_are_one_line_a_user_can_act_on() {
    expect!["classArgs of CMAES: unknown field `sigma`, expected one of `optimize_mode`, `seed`, `sigma0`, `population_size`"]
        .assert_eq(&class_args_error::<CmaEsTuner>(r#"{"sigma": 1}"#));
    expect!["classArgs of CMAES: sigma0 is a fraction of each parameter's range, in (0, 1]; got 0"]
        .assert_eq(&class_args_error::<CmaEsTuner>(r#"{"sigma0": 0}"#));
    expect![
        "classArgs of CMAES: sigma0 is a fraction of each parameter's range, in (0, 1]; got 1.5"
    ]
    .assert_eq(&class_args_error::<CmaEsTuner>(r#"{"sigma0": 1.5}"#));
    expect!["classArgs of CMAES: population_size must be a whole number from 2 to 65536, got 1"]
        .assert_eq(&class_args_error::<CmaEsTuner>(r#"{"population_size": 1}"#));
    // Refused at construction (so `knob config check` names it), not an allocation failure
    // when the first generation is drawn.
    expect!["classArgs of CMAES: population_size must be a whole number from 2 to 65536, got 1000000000"]
        .assert_eq(&class_args_error::<CmaEsTuner>(r#"{"population_size": 1000000000}"#));
    expect![[r#"classArgs of CMAES: optimize_mode must be "maximize" or "minimize", got "min""#]]
        .assert_eq(&class_args_error::<CmaEsTuner>(
            r#"{"optimize_mode": "min"}"#,
        ));
    let mut cma: CmaEsTuner = Tuner::new(&json!({"seed": 3})).unwrap();
    expect!["CMAES: asked for parameters before it was given a search space"]
        .assert_eq(cma.generate_parameters(0).unwrap_err().message());
}
