//! Evolution: classArgs, every search-space type, seeds, resume, deferral and unprompted
//! suggestions, parallel suggestions, direction.

use std::collections::HashMap;

use expect_test::expect;
use knob_plugin_api::{Generated, Suggestion, Tuner};
use knob_tuners::{EvolutionTuner, RandomTuner};
use serde_json::{json, Value};

use crate::drive::{
    as_imported, ask, assert_valid_and_distinct, best, bowl, every_type_objective, median,
    run_sequential, EVERY_TYPE, PLANE,
};
use crate::{class_args_error, tuner};

fn evolution(args: &str, space: &str) -> EvolutionTuner {
    tuner(args, space)
}

#[test]
fn every_class_arg_is_accepted_and_bad_ones_are_clear_errors() {
    for mutation in ["perturb", "resample"] {
        let args = json!({"optimize_mode": "minimize", "seed": 5, "population_size": 4, "mutation": mutation});
        let mut t: EvolutionTuner = tuner(&args.to_string(), EVERY_TYPE);
        assert_eq!(t.seed(), 5);
        let trials = run_sequential(&mut t, 0, 30, every_type_objective);
        assert_valid_and_distinct(EVERY_TYPE, trials.into_iter().map(|t| t.0));
    }
    expect![[r#"classArgs of Evolution: unknown field `population`, expected one of `optimize_mode`, `seed`, `population_size`, `mutation`"#]]
        .assert_eq(&class_args_error::<EvolutionTuner>(r#"{"population": 4}"#));
    expect!["classArgs of Evolution: mutation: unknown variant `swap`, expected `resample` or `perturb`"]
    .assert_eq(&class_args_error::<EvolutionTuner>(
        r#"{"mutation": "swap"}"#,
    ));
    expect!["classArgs of Evolution: population_size: expected a whole number ≥ 0, got -3"]
        .assert_eq(&class_args_error::<EvolutionTuner>(
            r#"{"population_size": -3}"#,
        ));
    expect![[r#"classArgs of Evolution: population_size: expected a whole number ≥ 0, got "32""#]]
        .assert_eq(&class_args_error::<EvolutionTuner>(
            r#"{"population_size": "32"}"#,
        ));
    expect!["classArgs of Evolution: population_size must be at least 1, got 0"].assert_eq(
        &class_args_error::<EvolutionTuner>(r#"{"population_size": 0}"#),
    );
}

#[test]
fn every_search_space_type_including_nested_choice() {
    let mut t = evolution(
        r#"{"seed": 3, "population_size": 10, "optimize_mode": "minimize"}"#,
        EVERY_TYPE,
    );
    let trials = run_sequential(&mut t, 0, 80, every_type_objective);
    assert_eq!(trials.len(), 80);
    assert_valid_and_distinct(EVERY_TYPE, trials.into_iter().map(|t| t.0));
}

#[test]
fn a_seed_replays_the_same_run_and_another_seed_does_not() {
    let run = |seed: u64| {
        let args = format!(r#"{{"seed": {seed}, "population_size": 8}}"#);
        run_sequential(
            &mut evolution(&args, EVERY_TYPE),
            0,
            40,
            every_type_objective,
        )
    };
    assert_eq!(run(11), run(11));
    assert_ne!(run(11), run(12));
}

#[test]
fn a_resumed_run_continues_as_the_uninterrupted_one() {
    for mutation in ["perturb", "resample"] {
        let args = format!(
            r#"{{"seed": 21, "population_size": 6, "optimize_mode": "minimize", "mutation": "{mutation}"}}"#
        );
        let all = run_sequential(
            &mut evolution(&args, EVERY_TYPE),
            0,
            45,
            every_type_objective,
        );
        let mut resumed = evolution(&args, EVERY_TYPE);
        resumed.import_data(&as_imported(&all[..30])).unwrap();
        let rest = run_sequential(&mut resumed, 1000, 15, every_type_objective);
        assert_eq!(rest, all[30..], "{mutation}");
    }
}

#[test]
fn defers_until_a_parent_exists_then_suggests_unprompted() {
    let mut t = evolution(
        r#"{"seed": 1, "population_size": 3, "optimize_mode": "minimize"}"#,
        PLANE,
    );
    // Five trials at once: three random ones, then nothing to breed from yet.
    let mut running: HashMap<u64, Value> = HashMap::new();
    for id in 0..3 {
        running.insert(id, ask(&mut t, id).unwrap());
    }
    assert_eq!(t.generate_parameters(3).unwrap(), Generated::Deferred);
    assert_eq!(t.generate_parameters(4).unwrap(), Generated::Deferred);
    assert_eq!(t.take_suggestions().unwrap(), vec![]);
    // One result: one parent, and two of population_size 3 running, so one child for id 3.
    let p0 = running.remove(&0).unwrap();
    t.receive_trial_result(0, &p0, bowl(&p0)).unwrap();
    let first: Vec<Suggestion> = t.take_suggestions().unwrap();
    assert_eq!(
        first.iter().map(|s| s.parameter_id).collect::<Vec<_>>(),
        [3]
    );
    // A new request waits behind the deferred one, in order.
    assert_eq!(t.generate_parameters(5).unwrap(), Generated::Deferred);
    let p1 = running.remove(&1).unwrap();
    t.trial_end(1, "FAILED").unwrap();
    // The failed trial is replaced by a random suggestion, for id 4.
    let second = t.take_suggestions().unwrap();
    assert_eq!(
        second.iter().map(|s| s.parameter_id).collect::<Vec<_>>(),
        [4]
    );
    let p2 = running.remove(&2).unwrap();
    t.receive_trial_result(2, &p2, bowl(&p2)).unwrap();
    let third = t.take_suggestions().unwrap();
    assert_eq!(
        third.iter().map(|s| s.parameter_id).collect::<Vec<_>>(),
        [5]
    );
    let all = [p0, p1, p2].into_iter().chain(
        first
            .into_iter()
            .chain(second)
            .chain(third)
            .map(|s| s.parameters),
    );
    assert_valid_and_distinct(PLANE, all);
}

#[test]
fn parallel_suggestions_are_distinct_and_a_finite_space_runs_out() {
    let finite = r#"{"a": {"_type": "choice", "_value": ["x", "y", "z"]}, "b": {"_type": "randint", "_value": [0, 2]}}"#;
    let mut t = evolution(r#"{"seed": 2, "population_size": 2}"#, finite);
    let trials = run_sequential(&mut t, 0, 6, |p| p["b"].as_f64().unwrap());
    assert_valid_and_distinct(finite, trials.into_iter().map(|t| t.0));
    assert_eq!(t.generate_parameters(6).unwrap(), Generated::NoMore);

    let mut t = evolution(r#"{"seed": 4, "population_size": 20}"#, PLANE);
    run_sequential(&mut t, 0, 25, bowl);
    let batch: Vec<Value> = (100..110).map(|id| ask(&mut t, id).unwrap()).collect();
    assert_valid_and_distinct(PLANE, batch);
}

#[test]
fn maximizing_a_metric_is_minimizing_its_negation() {
    let mut min = evolution(
        r#"{"seed": 8, "optimize_mode": "minimize", "population_size": 5}"#,
        EVERY_TYPE,
    );
    let mut max = evolution(
        r#"{"seed": 8, "optimize_mode": "maximize", "population_size": 5}"#,
        EVERY_TYPE,
    );
    let a = run_sequential(&mut min, 0, 40, every_type_objective);
    let b = run_sequential(&mut max, 0, 40, |p| -every_type_objective(p));
    let points = |t: &[(Value, f64)]| t.iter().map(|t| t.0.clone()).collect::<Vec<_>>();
    assert_eq!(points(&a), points(&b));
}

#[test]
fn evolution_finds_better_points_than_random_search() {
    let (mut mine, mut random) = (Vec::new(), Vec::new());
    for seed in 0..7 {
        let args =
            format!(r#"{{"seed": {seed}, "population_size": 10, "optimize_mode": "minimize"}}"#);
        mine.push(best(&run_sequential(
            &mut evolution(&args, PLANE),
            0,
            80,
            bowl,
        )));
        let mut r: RandomTuner = tuner(&format!(r#"{{"seed": {seed}}}"#), PLANE);
        random.push(best(&run_sequential(&mut r, 0, 80, bowl)));
    }
    let (e, r) = (median(mine), median(random));
    assert!(e < r, "Evolution median best {e}, random {r}");
}

#[test]
fn deferred_ids_are_answered_through_the_abi() {
    use knob_plugin_api::host::PluginRegistry;

    let registry = PluginRegistry::load_from(&[crate::abi::plugin_file()]);
    let args = json!({"seed": 3, "population_size": 2, "optimize_mode": "minimize"});
    let mut t = registry.tuner_object("Evolution", &args).unwrap();
    t.update_search_space(&serde_json::from_str(PLANE).unwrap())
        .unwrap();
    let first = match t.generate_parameters(0).unwrap() {
        Generated::Parameters(p) => p,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        t.generate_parameters(1).unwrap(),
        Generated::Parameters(_)
    ));
    assert_eq!(t.generate_parameters(2).unwrap(), Generated::Deferred);
    let emitted = t.receive_trial_result(0, &first, bowl(&first)).unwrap();
    assert_eq!(emitted.len(), 1);
    assert_eq!(emitted[0].parameter_id, 2);
    assert_valid_and_distinct(PLANE, [first, emitted[0].parameters.clone()]);
}
