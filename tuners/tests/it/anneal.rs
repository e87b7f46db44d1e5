//! Anneal: classArgs, every search-space type, seeds, resume, parallel suggestions, direction.

use expect_test::expect;
use knob_plugin_api::{Generated, Tuner};
use knob_tuners::{AnnealTuner, RandomTuner};
use serde_json::{json, Value};

use crate::drive::{
    as_imported, ask, assert_valid_and_distinct, best, bowl, every_type_objective, median,
    run_sequential, EVERY_TYPE, PLANE,
};
use crate::{class_args_error, tuner};

fn anneal(args: &str, space: &str) -> AnnealTuner {
    tuner(args, space)
}

#[test]
fn every_class_arg_is_accepted() {
    for liar in ["min", "max", "mean"] {
        let args = json!({
            "optimize_mode": "maximize",
            "seed": 5,
            "parallel_optimize": true,
            "constant_liar_type": liar,
            "avg_best_idx": 3.0,
            "shrink_coef": 0.2,
        });
        let mut t: AnnealTuner = tuner(&args.to_string(), PLANE);
        assert_eq!(t.seed(), 5);
        run_sequential(&mut t, 0, 22, |p| -bowl(p));
        // Past 20 trials the liar stands in for running trials; they stay distinct.
        let batch: Vec<Value> = (100..106).map(|id| ask(&mut t, id).unwrap()).collect();
        assert_valid_and_distinct(PLANE, batch);
    }
}

#[test]
fn unknown_and_invalid_class_args_are_clear_errors() {
    expect![[r#"classArgs of Anneal: unknown field `tpe_args`, expected one of `optimize_mode`, `seed`, `parallel_optimize`, `constant_liar_type`, `avg_best_idx`, `shrink_coef`"#]]
        .assert_eq(&class_args_error::<AnnealTuner>(r#"{"tpe_args": {}}"#));
    expect![[
        r#"classArgs of Anneal: constant_liar_type must be "min", "max" or "mean", got "best""#
    ]]
    .assert_eq(&class_args_error::<AnnealTuner>(
        r#"{"constant_liar_type": "best"}"#,
    ));
    expect!["classArgs of Anneal: avg_best_idx must be a number >= 1, got 0.5"]
        .assert_eq(&class_args_error::<AnnealTuner>(r#"{"avg_best_idx": 0.5}"#));
    expect!["classArgs of Anneal: shrink_coef must be a number >= 0, got -1"]
        .assert_eq(&class_args_error::<AnnealTuner>(r#"{"shrink_coef": -1}"#));
}

#[test]
fn every_search_space_type_including_nested_choice() {
    let mut t = anneal(r#"{"seed": 3}"#, EVERY_TYPE);
    let trials = run_sequential(&mut t, 0, 80, every_type_objective);
    assert_eq!(trials.len(), 80);
    assert_valid_and_distinct(EVERY_TYPE, trials.into_iter().map(|t| t.0));
}

#[test]
fn a_seed_replays_the_same_run_and_another_seed_does_not() {
    let run = |seed: u64| {
        let mut t = anneal(&format!(r#"{{"seed": {seed}}}"#), EVERY_TYPE);
        run_sequential(&mut t, 0, 40, every_type_objective)
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn a_resumed_run_continues_as_the_uninterrupted_one() {
    let mut uninterrupted = anneal(r#"{"seed": 21}"#, EVERY_TYPE);
    let all = run_sequential(&mut uninterrupted, 0, 45, every_type_objective);
    let mut resumed = anneal(r#"{"seed": 21}"#, EVERY_TYPE);
    resumed.import_data(&as_imported(&all[..30])).unwrap();
    assert_eq!(
        run_sequential(&mut resumed, 1000, 15, every_type_objective),
        all[30..]
    );
}

#[test]
fn parallel_suggestions_are_distinct_and_a_finite_space_runs_out() {
    let mut t = anneal(r#"{"seed": 9}"#, PLANE);
    run_sequential(&mut t, 0, 10, bowl);
    let batch: Vec<Value> = (100..108).map(|id| ask(&mut t, id).unwrap()).collect();
    assert_valid_and_distinct(PLANE, batch);

    let finite = r#"{"a": {"_type": "choice", "_value": ["x", "y", "z"]}, "b": {"_type": "randint", "_value": [0, 2]}}"#;
    let mut t = anneal(r#"{"seed": 2}"#, finite);
    let trials = run_sequential(&mut t, 0, 6, |p| p["b"].as_f64().unwrap());
    assert_valid_and_distinct(finite, trials.into_iter().map(|t| t.0));
    assert_eq!(t.generate_parameters(6).unwrap(), Generated::NoMore);
}

#[test]
fn maximizing_a_metric_is_minimizing_its_negation() {
    let mut min = anneal(r#"{"seed": 8, "optimize_mode": "minimize"}"#, EVERY_TYPE);
    let mut max = anneal(r#"{"seed": 8, "optimize_mode": "maximize"}"#, EVERY_TYPE);
    let a = run_sequential(&mut min, 0, 40, every_type_objective);
    let b = run_sequential(&mut max, 0, 40, |p| -every_type_objective(p));
    let points = |t: &[(Value, f64)]| t.iter().map(|t| t.0.clone()).collect::<Vec<_>>();
    assert_eq!(points(&a), points(&b));
}

#[test]
fn anneal_finds_better_points_than_random_search() {
    let (mut mine, mut random) = (Vec::new(), Vec::new());
    for seed in 0..7 {
        let args = format!(r#"{{"seed": {seed}}}"#);
        mine.push(best(&run_sequential(
            &mut anneal(&args, PLANE),
            0,
            60,
            bowl,
        )));
        let mut r: RandomTuner = tuner(&args, PLANE);
        random.push(best(&run_sequential(&mut r, 0, 60, bowl)));
    }
    let (a, r) = (median(mine), median(random));
    assert!(a < r / 2.0, "Anneal median best {a}, random {r}");
}

#[test]
fn nan_results_do_not_stop_it() {
    let mut t = anneal(r#"{"seed": 6}"#, PLANE);
    let trials = run_sequential(&mut t, 0, 30, |p| {
        if p["x"].as_f64().unwrap() < 0.0 {
            f64::NAN
        } else {
            bowl(p)
        }
    });
    assert_eq!(trials.len(), 30);
}
