//! Random: seeded determinism, no repeats, exhaustion, import, classArgs.

use std::collections::BTreeSet;

use expect_test::expect;
use knob_plugin_api::space::seeded_rng;
use knob_plugin_api::Tuner;
use knob_tuners::{GridSearchTuner, RandomTuner};
use serde_json::json;

use crate::{assert_no_repeats, class_args_error, generate, imported, keys, listing, parse, tuner};

const MIXED: &str = r#"{
    "lr": {"_type": "loguniform", "_value": [0.0001, 0.1]},
    "dropout": {"_type": "quniform", "_value": [0, 0.5, 0.1]},
    "layers": {"_type": "randint", "_value": [1, 5]},
    "init": {"_type": "normal", "_value": [0, 0.02]},
    "optimizer": {"_type": "choice", "_value": [
        {"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0.5, 1]}},
        {"_name": "adam"}]}
}"#;

/// 2 × 3 × 3 = 18 points (the quniform gives 0, 0.6 and 1).
const FINITE: &str = r#"{
    "x": {"_type": "choice", "_value": ["a", "b"]},
    "y": {"_type": "randint", "_value": [0, 3]},
    "z": {"_type": "quniform", "_value": [0, 1, 0.6]}
}"#;

#[test]
fn a_seed_replays_the_same_points() {
    let (a, _) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 7}"#, MIXED), 50);
    let (b, _) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 7}"#, MIXED), 50);
    let (c, _) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 8}"#, MIXED), 50);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let space = parse(MIXED);
    for p in &a {
        space
            .validate_parameters(p)
            .unwrap_or_else(|e| panic!("{p} is not in the space: {e}"));
    }
}

#[test]
fn points_are_the_space_sampler_s_draws() {
    // Random with seed S starts with what `knob space sample --seed S` prints.
    let space = parse(MIXED);
    let mut rng = seeded_rng(42);
    let sampled: Vec<_> = (0..20).map(|_| space.sample(&mut rng)).collect();
    let (generated, _) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 42}"#, MIXED), 20);
    assert_eq!(generated, sampled);
}

#[test]
fn a_finite_space_is_used_up_without_repeats_then_no_more() {
    for seed in 0..20 {
        let mut random: RandomTuner = tuner(&format!(r#"{{"seed": {seed}}}"#), FINITE);
        let (params, no_more) = generate(&mut random, 100);
        assert!(
            no_more,
            "seed {seed}: no NoMore after {} points",
            params.len()
        );
        assert_no_repeats(&params);
        assert_eq!(params.len(), 18, "seed {seed}");
        // Still NoMore when asked again.
        assert_eq!(generate(&mut random, 1), (vec![], true));
    }
}

#[test]
fn the_points_of_a_finite_space_are_the_grid() {
    let (random, _) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 3}"#, FINITE), 100);
    let (grid, _) = generate(&mut tuner::<GridSearchTuner>("{}", FINITE), 100);
    let random: BTreeSet<String> = keys(&random).into_iter().collect();
    let grid: BTreeSet<String> = keys(&grid).into_iter().collect();
    assert_eq!(random, grid);
}

#[test]
fn nested_choices_never_repeat() {
    let space = r#"{"outer": {"_type": "choice", "_value": [
        {"_name": "A", "x": {"_type": "choice", "_value": ["a", "b"]}},
        {"_name": "B", "y": {"_type": "randint", "_value": [0, 3]}},
        {"_name": "C"}]}}"#;
    let (params, no_more) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 1}"#, space), 20);
    assert!(no_more);
    assert_no_repeats(&params);
    assert_eq!(params.len(), 6);
}

#[test]
fn import_data_marks_points_as_seen() {
    let mut first: RandomTuner = tuner(r#"{"seed": 5}"#, FINITE);
    let (done, _) = generate(&mut first, 7);
    // A resumed run with another seed: the 7 imported points never come again.
    let mut resumed: RandomTuner = tuner(r#"{"seed": 6}"#, FINITE);
    resumed.import_data(&imported(&done)).unwrap();
    let (rest, no_more) = generate(&mut resumed, 100);
    assert!(no_more);
    assert_eq!(rest.len(), 11);
    let mut all = done.clone();
    all.extend(rest);
    assert_no_repeats(&all);
}

#[test]
fn importing_every_point_leaves_nothing() {
    let (all, _) = generate(&mut tuner::<GridSearchTuner>("{}", FINITE), 100);
    let mut random: RandomTuner = tuner(r#"{"seed": 9}"#, FINITE);
    random.import_data(&imported(&all)).unwrap();
    assert_eq!(generate(&mut random, 5), (vec![], true));
}

#[test]
fn an_empty_space_gives_one_empty_object() {
    // NNI's Random does the same: `{}` once, then it is a repeat.
    let (params, no_more) = generate(&mut tuner::<RandomTuner>(r#"{"seed": 1}"#, "{}"), 5);
    expect![[r#"
        {}
        NoMore
    "#]]
    .assert_eq(&listing(&params, no_more));
}

#[test]
fn without_a_seed_one_is_drawn_and_replays_the_run() {
    let mut unseeded: RandomTuner = tuner("{}", MIXED);
    let seed = unseeded.seed();
    assert!(seed < 1 << 31);
    let (a, _) = generate(&mut unseeded, 10);
    let (b, _) = generate(
        &mut tuner::<RandomTuner>(&json!({"seed": seed}).to_string(), MIXED),
        10,
    );
    assert_eq!(a, b);
    // optimize_mode is accepted and does not change the stream.
    let (c, _) = generate(
        &mut tuner::<RandomTuner>(
            &json!({"seed": seed, "optimize_mode": "minimize"}).to_string(),
            MIXED,
        ),
        10,
    );
    assert_eq!(a, c);
}

#[test]
fn errors_are_one_line_a_user_can_act_on() {
    expect!["classArgs of Random: unknown field `sed`, expected `seed` or `optimize_mode`"]
        .assert_eq(&class_args_error::<RandomTuner>(r#"{"sed": 1}"#));
    expect![[r#"classArgs of Random: seed must be a whole number from 0 to 18446744073709551615, got "one""#]]
        .assert_eq(&class_args_error::<RandomTuner>(r#"{"seed": "one"}"#));
    expect![
        "classArgs of Random: seed must be a whole number from 0 to 18446744073709551615, got -1"
    ]
    .assert_eq(&class_args_error::<RandomTuner>(r#"{"seed": -1}"#));
    expect![[r#"classArgs of Random: optimize_mode must be "maximize" or "minimize", got "best""#]]
        .assert_eq(&class_args_error::<RandomTuner>(
            r#"{"optimize_mode": "best"}"#,
        ));
    let mut random: RandomTuner = Tuner::new(&json!(null)).unwrap();
    expect!["Random: asked for parameters before it was given a search space"]
        .assert_eq(random.generate_parameters(0).unwrap_err().message());
}
