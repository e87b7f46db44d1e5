//! TPE: classArgs, every search-space type, seeds, resume, parallel suggestions, direction.

use expect_test::expect;
use knob_plugin_api::{Generated, Tuner};
use knob_tuners::{RandomTuner, TpeTuner};
use serde_json::{json, Value};

use crate::drive::{
    as_imported, ask, assert_valid_and_distinct, best, bowl, every_type_objective, median,
    run_sequential, EVERY_TYPE, PLANE,
};
use crate::{class_args_error, tuner};

const VARIANTS: [&str; 2] = [r#""variant": "knob""#, r#""variant": "nni""#];

fn tpe(args: &str, space: &str) -> TpeTuner {
    tuner(args, space)
}

#[test]
fn every_class_arg_is_accepted() {
    let args = json!({
        "optimize_mode": "maximize",
        "seed": 5,
        "variant": "nni",
        "tpe_args": {
            "constant_liar_type": "mean",
            "n_startup_jobs": 3,
            "n_ei_candidates": 10,
            "linear_forgetting": 7,
            "prior_weight": 0.5,
            "gamma": 0.4,
            "multivariate": true,
            "good_weights": "age",
            "consider_endpoints": true,
        }
    });
    let mut t: TpeTuner = tuner(&args.to_string(), PLANE);
    assert_eq!(t.seed(), 5);
    let trials = run_sequential(&mut t, 0, 15, |p| -bowl(p));
    assert_valid_and_distinct(PLANE, trials.into_iter().map(|t| t.0));
    for liar in ["best", "worst", "mean", "none", "null"] {
        let liar = if liar == "null" {
            "null".to_owned()
        } else {
            format!("\"{liar}\"")
        };
        let args =
            format!(r#"{{"tpe_args": {{"constant_liar_type": {liar}, "good_fraction": 0.2}}}}"#);
        let mut t = tpe(&args, PLANE);
        run_sequential(&mut t, 0, 12, bowl);
    }
}

#[test]
fn unknown_and_invalid_class_args_are_clear_errors() {
    expect![[r#"classArgs of TPE: unknown field `sed`, expected one of `optimize_mode`, `seed`, `variant`, `tpe_args`"#]]
        .assert_eq(&class_args_error::<TpeTuner>(r#"{"sed": 1}"#));
    expect!["classArgs of TPE: tpe_args: unknown field `gama`, expected one of `constant_liar_type`, `n_startup_jobs`, `n_ei_candidates`, `linear_forgetting`, `prior_weight`, `gamma`, `multivariate`, `good_fraction`, `good_weights`, `consider_endpoints`"]
        .assert_eq(&class_args_error::<TpeTuner>(r#"{"tpe_args": {"gama": 0.3}}"#));
    expect![[r#"classArgs of TPE: tpe_args.constant_liar_type must be "best", "worst", "mean" or null, got "min""#]]
    .assert_eq(&class_args_error::<TpeTuner>(
        r#"{"tpe_args": {"constant_liar_type": "min"}}"#,
    ));
    expect!["classArgs of TPE: variant: unknown variant `hyperopt`, expected `knob` or `nni`"]
        .assert_eq(&class_args_error::<TpeTuner>(r#"{"variant": "hyperopt"}"#));
    expect![[r#"classArgs of TPE: tpe_args.gamma (NNI's split: ceil(gamma * sqrt(n)) good trials) and good_fraction (ceil(good_fraction * n)) exclude each other; give one"#]]
        .assert_eq(&class_args_error::<TpeTuner>(
            r#"{"tpe_args": {"gamma": 0.2, "good_fraction": 0.1}}"#,
        ));
    expect!["classArgs of TPE: tpe_args.good_weights age and rank apply to the multivariate model only; set multivariate: true or leave it out"]
        .assert_eq(&class_args_error::<TpeTuner>(
            r#"{"variant": "nni", "tpe_args": {"good_weights": "rank"}}"#,
        ));
    expect!["classArgs of TPE: tpe_args.good_weights: unknown variant `best`, expected one of `age`, `rank`, `equal`, `hypervolume`"].assert_eq(
        &class_args_error::<TpeTuner>(r#"{"tpe_args": {"good_weights": "best"}}"#),
    );
    expect!["classArgs of TPE: tpe_args.n_startup_jobs: expected a whole number ≥ 0, got -5"]
        .assert_eq(&class_args_error::<TpeTuner>(
            r#"{"tpe_args": {"n_startup_jobs": -5}}"#,
        ));
    expect![[r#"classArgs of TPE: tpe_args: expected a mapping, got "bad""#]]
        .assert_eq(&class_args_error::<TpeTuner>(r#"{"tpe_args": "bad"}"#));
    expect![
        "classArgs of TPE: tpe_args.n_ei_candidates must be a whole number from 1 to 100000, got 0"
    ]
    .assert_eq(&class_args_error::<TpeTuner>(
        r#"{"tpe_args": {"n_ei_candidates": 0}}"#,
    ));
    expect!["classArgs of TPE: tpe_args.n_ei_candidates must be a whole number from 1 to 100000, got 1000000000"].assert_eq(
        &class_args_error::<TpeTuner>(r#"{"tpe_args": {"n_ei_candidates": 1000000000}}"#),
    );
    expect!["classArgs of TPE: tpe_args.prior_weight must be a number >= 0, got -1"].assert_eq(
        &class_args_error::<TpeTuner>(r#"{"tpe_args": {"prior_weight": -1}}"#),
    );
    expect!["classArgs of TPE: tpe_args.good_fraction must be in (0, 1], got 1.5"].assert_eq(
        &class_args_error::<TpeTuner>(r#"{"tpe_args": {"good_fraction": 1.5}}"#),
    );
    expect![[r#"classArgs of TPE: optimize_mode must be "maximize" or "minimize", got "max""#]]
        .assert_eq(&class_args_error::<TpeTuner>(r#"{"optimize_mode": "max"}"#));
}

#[test]
fn every_search_space_type_including_nested_choice() {
    for variant in VARIANTS {
        for liar in ["best", "worst"] {
            let args = format!(
                r#"{{"seed": 3, {variant}, "tpe_args": {{"n_startup_jobs": 5, "constant_liar_type": "{liar}"}}}}"#
            );
            let mut t = tpe(&args, EVERY_TYPE);
            let trials = run_sequential(&mut t, 0, 60, every_type_objective);
            assert_eq!(trials.len(), 60);
            let names: std::collections::BTreeSet<_> = trials
                .iter()
                .map(|(p, _)| p["net"]["_name"].as_str().unwrap().to_owned())
                .collect();
            assert_eq!(names.len(), 3, "{variant}: every nested option is tried");
            assert_valid_and_distinct(EVERY_TYPE, trials.into_iter().map(|t| t.0));
        }
    }
}

#[test]
fn a_seed_replays_the_same_run_and_another_seed_does_not() {
    for variant in VARIANTS {
        let run = |seed: u64| {
            let mut t = tpe(&format!(r#"{{"seed": {seed}, {variant}}}"#), EVERY_TYPE);
            run_sequential(&mut t, 0, 40, every_type_objective)
        };
        assert_eq!(run(11), run(11), "{variant}");
        assert_ne!(run(11), run(12), "{variant}");
    }
}

#[test]
fn a_resumed_run_continues_as_the_uninterrupted_one() {
    for variant in VARIANTS {
        let args = format!(r#"{{"seed": 21, {variant}}}"#);
        let mut uninterrupted = tpe(&args, EVERY_TYPE);
        let all = run_sequential(&mut uninterrupted, 0, 45, every_type_objective);

        let mut resumed = tpe(&args, EVERY_TYPE);
        resumed.import_data(&as_imported(&all[..30])).unwrap();
        // A resumed experiment never reuses parameter ids.
        let rest = run_sequential(&mut resumed, 1000, 15, every_type_objective);
        assert_eq!(rest, all[30..], "{variant}");
    }
}

#[test]
fn import_before_the_search_space_is_kept_until_it_arrives() {
    let mut uninterrupted = tpe(r#"{"seed": 4}"#, PLANE);
    let all = run_sequential(&mut uninterrupted, 0, 25, bowl);
    let mut resumed = TpeTuner::new(&json!({"seed": 4})).unwrap();
    resumed.import_data(&as_imported(&all[..20])).unwrap();
    resumed.update_search_space(&crate::parse(PLANE)).unwrap();
    assert_eq!(run_sequential(&mut resumed, 50, 5, bowl), all[20..]);
}

#[test]
fn imported_points_are_never_suggested_again() {
    let space = r#"{"a": {"_type": "choice", "_value": [1, 2, 3]}, "b": {"_type": "randint", "_value": [0, 2]}}"#;
    let done: Vec<(Value, f64)> = vec![
        (json!({"a": 1, "b": 0}), 1.0),
        (json!({"a": 2, "b": 1}), 0.5),
    ];
    for variant in VARIANTS {
        let mut t = tpe(&format!(r#"{{"seed": 1, {variant}}}"#), space);
        t.import_data(&as_imported(&done)).unwrap();
        let trials = run_sequential(&mut t, 10, 10, |p| p["a"].as_f64().unwrap());
        assert_eq!(trials.len(), 4, "{variant}: 6 points, 2 imported");
        assert_valid_and_distinct(space, trials.iter().chain(&done).map(|t| t.0.clone()));
        assert_eq!(ask(&mut t, 99), None);
    }
}

#[test]
fn parallel_suggestions_are_distinct_and_a_finite_space_runs_out() {
    for variant in VARIANTS {
        for liar in ["best", "worst", "mean", "none"] {
            let args = format!(
                r#"{{"seed": 9, {variant}, "tpe_args": {{"constant_liar_type": "{liar}", "n_startup_jobs": 4}}}}"#
            );
            let mut t = tpe(&args, PLANE);
            run_sequential(&mut t, 0, 10, bowl);
            // Eight trials at once, none finished: the model is the same for all of them.
            let batch: Vec<Value> = (100..108).map(|id| ask(&mut t, id).unwrap()).collect();
            assert_valid_and_distinct(PLANE, batch.clone());
            for (i, p) in batch.iter().enumerate() {
                t.receive_trial_result(100 + i as u64, p, bowl(p)).unwrap();
            }
        }
        let finite = r#"{"a": {"_type": "choice", "_value": ["x", "y", "z"]}, "b": {"_type": "quniform", "_value": [0, 1, 1]}}"#;
        let mut t = tpe(&format!(r#"{{"seed": 2, {variant}}}"#), finite);
        let batch: Vec<Value> = (0..6).map(|id| ask(&mut t, id).unwrap()).collect();
        assert_valid_and_distinct(finite, batch);
        assert_eq!(t.generate_parameters(6).unwrap(), Generated::NoMore);
    }
}

#[test]
fn maximizing_a_metric_is_minimizing_its_negation() {
    for variant in VARIANTS {
        let mut min = tpe(
            &format!(r#"{{"seed": 8, {variant}, "optimize_mode": "minimize"}}"#),
            EVERY_TYPE,
        );
        let mut max = tpe(
            &format!(r#"{{"seed": 8, {variant}, "optimize_mode": "maximize"}}"#),
            EVERY_TYPE,
        );
        let a = run_sequential(&mut min, 0, 40, every_type_objective);
        let b = run_sequential(&mut max, 0, 40, |p| -every_type_objective(p));
        let points =
            |trials: &[(Value, f64)]| trials.iter().map(|t| t.0.clone()).collect::<Vec<_>>();
        assert_eq!(points(&a), points(&b), "{variant}");
    }
}

#[test]
fn nan_results_count_as_the_worst() {
    // Half the plane reports NaN; TPE must keep working and end up in the other half.
    let objective = |p: &Value| {
        if p["x"].as_f64().unwrap() < 0.0 {
            f64::NAN
        } else {
            bowl(p)
        }
    };
    for variant in VARIANTS {
        let mut t = tpe(&format!(r#"{{"seed": 6, {variant}}}"#), PLANE);
        let trials = run_sequential(&mut t, 0, 60, objective);
        let late_nan = trials[40..].iter().filter(|t| t.1.is_nan()).count();
        assert!(
            late_nan < 10,
            "{variant}: {late_nan} of the last 20 in the NaN half"
        );
    }
}

#[test]
fn a_trial_that_ends_without_a_result_leaves_the_liar() {
    let mut t = tpe(r#"{"seed": 1, "tpe_args": {"n_startup_jobs": 2}}"#, PLANE);
    run_sequential(&mut t, 0, 5, bowl);
    let p = ask(&mut t, 10).unwrap();
    t.trial_end(10, "FAILED").unwrap();
    // The failed trial's result never comes; the next one is still valid and new.
    let q = ask(&mut t, 11).unwrap();
    assert_valid_and_distinct(PLANE, [p, q]);
}

#[test]
fn tpe_finds_better_points_than_random_search() {
    for variant in VARIANTS {
        let mut tpe_best = Vec::new();
        let mut random_best = Vec::new();
        for seed in 0..7 {
            let args = format!(r#"{{"seed": {seed}, {variant}}}"#);
            tpe_best.push(best(&run_sequential(&mut tpe(&args, PLANE), 0, 60, bowl)));
            let mut random: RandomTuner = tuner(&format!(r#"{{"seed": {seed}}}"#), PLANE);
            random_best.push(best(&run_sequential(&mut random, 0, 60, bowl)));
        }
        let (t, r) = (median(tpe_best), median(random_best));
        assert!(t < r / 3.0, "{variant}: TPE median best {t}, random {r}");
    }
}

#[test]
fn asking_before_a_search_space_is_an_error() {
    let mut t = TpeTuner::new(&Value::Null).unwrap();
    expect!["TPE: asked for parameters before it was given a search space"]
        .assert_eq(t.generate_parameters(0).unwrap_err().message());
}

#[test]
fn a_second_result_for_the_same_trial_is_ignored() {
    let mut once = tpe(r#"{"seed": 2}"#, PLANE);
    let mut twice = tpe(r#"{"seed": 2}"#, PLANE);
    for id in 0..15 {
        let p = ask(&mut once, id).unwrap();
        assert_eq!(ask(&mut twice, id).as_ref(), Some(&p));
        once.receive_trial_result(id, &p, bowl(&p)).unwrap();
        twice.receive_trial_result(id, &p, bowl(&p)).unwrap();
        twice.receive_trial_result(id, &p, -100.0).unwrap();
    }
    assert_eq!(ask(&mut once, 15), ask(&mut twice, 15));
}
