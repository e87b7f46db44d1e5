//! GridSearch: exact sequences (data-driven), exhaustion, import, classArgs.

use expect_test::{expect, Expect};
use knob_plugin_api::Tuner;
use knob_tuners::GridSearchTuner;
use serde_json::json;

use crate::{assert_no_repeats, class_args_error, generate, imported, keys, listing, parse, tuner};

/// The first `limit` points GridSearch hands out for `space`.
fn check_n(space: &str, limit: usize, expect: Expect) {
    let mut grid: GridSearchTuner = tuner("{}", space);
    let (params, no_more) = generate(&mut grid, limit);
    assert_no_repeats(&params);
    let space = parse(space);
    for p in &params {
        space
            .validate_parameters(p)
            .unwrap_or_else(|e| panic!("{p} is not in the space: {e}"));
    }
    expect.assert_eq(&listing(&params, no_more));
}

fn check(space: &str, expect: Expect) {
    check_n(space, 40, expect)
}

#[test]
fn discrete_grid_is_every_combination_in_odometer_order() {
    check(
        r#"{"act": {"_type": "choice", "_value": ["relu", "tanh"]},
            "layers": {"_type": "randint", "_value": [1, 4]}}"#,
        expect![[r#"
            {"act":"relu","layers":1}
            {"act":"relu","layers":2}
            {"act":"relu","layers":3}
            {"act":"tanh","layers":1}
            {"act":"tanh","layers":2}
            {"act":"tanh","layers":3}
            NoMore
        "#]],
    );
}

#[test]
fn continuous_range_is_refined_in_rounds() {
    // Round 1: the midpoint; round 2: the quartiles; round 3: the eighths.
    check_n(
        r#"{"x": {"_type": "uniform", "_value": [0, 8]}}"#,
        7,
        expect![[r#"
            {"x":4.0}
            {"x":2.0}
            {"x":6.0}
            {"x":1.0}
            {"x":3.0}
            {"x":5.0}
            {"x":7.0}
            ...
        "#]],
    );
}

#[test]
fn later_rounds_skip_points_of_earlier_rounds() {
    // 2 points in round 1, 4 new ones in round 2 (not 6), 8 new ones in round 3.
    check_n(
        r#"{"opt": {"_type": "choice", "_value": ["sgd", "adam"]},
            "lr": {"_type": "uniform", "_value": [0, 0.8]}}"#,
        14,
        expect![[r#"
            {"opt":"sgd","lr":0.4}
            {"opt":"adam","lr":0.4}
            {"opt":"sgd","lr":0.2}
            {"opt":"sgd","lr":0.6000000000000001}
            {"opt":"adam","lr":0.2}
            {"opt":"adam","lr":0.6000000000000001}
            {"opt":"sgd","lr":0.1}
            {"opt":"sgd","lr":0.30000000000000004}
            {"opt":"sgd","lr":0.5}
            {"opt":"sgd","lr":0.7000000000000001}
            {"opt":"adam","lr":0.1}
            {"opt":"adam","lr":0.30000000000000004}
            {"opt":"adam","lr":0.5}
            {"opt":"adam","lr":0.7000000000000001}
            ...
        "#]],
    );
}

#[test]
fn quniform_finds_every_multiple_then_ends() {
    // The ends come from rounding: 0 and 10 are values although no grid fraction is 0 or 1.
    check(
        r#"{"x": {"_type": "quniform", "_value": [0, 10, 5]}}"#,
        expect![[r#"
            {"x":5.0}
            {"x":0.0}
            {"x":10.0}
            NoMore
        "#]],
    );
    // NNI's own dedup test space: 0.6 rounds up to 1.2, clipped to 1.
    check(
        r#"{"x": {"_type": "choice", "_value": ["a", "b"]},
            "y": {"_type": "quniform", "_value": [0, 1, 0.6]}}"#,
        expect![[r#"
            {"x":"a","y":0.6}
            {"x":"b","y":0.6}
            {"x":"a","y":0.0}
            {"x":"b","y":0.0}
            {"x":"a","y":1.0}
            {"x":"b","y":1.0}
            NoMore
        "#]],
    );
}

#[test]
fn loguniform_divides_in_log_space() {
    check_n(
        r#"{"lr": {"_type": "loguniform", "_value": [0.0001, 1]}}"#,
        7,
        expect![[r#"
            {"lr":0.010000000000000004}
            {"lr":0.0010000000000000002}
            {"lr":0.10000000000000006}
            {"lr":0.0003162277660168384}
            {"lr":0.003162277660168382}
            {"lr":0.0316227766016838}
            {"lr":0.3162277660168378}
            ...
        "#]],
    );
}

#[test]
fn qloguniform_is_every_reachable_multiple() {
    check(
        r#"{"batch": {"_type": "qloguniform", "_value": [1, 16, 1]}}"#,
        expect![[r#"
            {"batch":4.0}
            {"batch":2.0}
            {"batch":8.0}
            {"batch":1.0}
            {"batch":3.0}
            {"batch":6.0}
            {"batch":11.0}
            {"batch":5.0}
            {"batch":7.0}
            {"batch":10.0}
            {"batch":13.0}
            {"batch":9.0}
            {"batch":12.0}
            {"batch":15.0}
            {"batch":14.0}
            {"batch":16.0}
            NoMore
        "#]],
    );
}

#[test]
fn normal_family_is_divided_by_quantiles() {
    // The quartiles of N(0, 1) are ±0.6745, the eighths ±1.1503 and ±0.3186.
    check_n(
        r#"{"x": {"_type": "normal", "_value": [0, 1]}}"#,
        7,
        expect![[r#"
            {"x":0.0}
            {"x":-0.6744897501960817}
            {"x":0.6744897501960817}
            {"x":-1.1503493803760079}
            {"x":-0.31863936396437514}
            {"x":0.31863936396437514}
            {"x":1.1503493803760079}
            ...
        "#]],
    );
    check_n(
        r#"{"x": {"_type": "lognormal", "_value": [0, 1]}}"#,
        3,
        expect![[r#"
            {"x":1.0}
            {"x":0.5094162838632775}
            {"x":1.963031084158257}
            ...
        "#]],
    );
    check(
        r#"{"x": {"_type": "qnormal", "_value": [0, 1, 4]}}"#,
        expect![[r#"
            {"x":0.0}
            {"x":-4.0}
            {"x":4.0}
            {"x":-8.0}
            {"x":8.0}
            NoMore
        "#]],
    );
}

#[test]
fn nnis_example_space() {
    // The worked example in NNI's gridsearch_tuner.py: 2 points in round 1, then 10.
    check_n(
        r#"{"x": {"_type": "choice", "_value": [5, 7]},
            "y": {"_type": "normal", "_value": [0, 1]},
            "z": {"_type": "quniform", "_value": [2, 3, 1]}}"#,
        12,
        expect![[r#"
            {"x":5,"y":0.0,"z":2.0}
            {"x":7,"y":0.0,"z":2.0}
            {"x":5,"y":0.0,"z":3.0}
            {"x":5,"y":-0.6744897501960817,"z":2.0}
            {"x":5,"y":-0.6744897501960817,"z":3.0}
            {"x":5,"y":0.6744897501960817,"z":2.0}
            {"x":5,"y":0.6744897501960817,"z":3.0}
            {"x":7,"y":0.0,"z":3.0}
            {"x":7,"y":-0.6744897501960817,"z":2.0}
            {"x":7,"y":-0.6744897501960817,"z":3.0}
            {"x":7,"y":0.6744897501960817,"z":2.0}
            {"x":7,"y":0.6744897501960817,"z":3.0}
            ...
        "#]],
    );
}

#[test]
fn nested_choice_walks_only_the_chosen_option() {
    check_n(
        r#"{"optimizer": {"_type": "choice", "_value": [
                {"_name": "sgd", "momentum": {"_type": "choice", "_value": [0, 0.9]}},
                {"_name": "adam", "lr": {"_type": "loguniform", "_value": [0.0001, 0.01]}},
                {"_name": "lbfgs"}]},
            "batch": {"_type": "choice", "_value": [32, 64]}}"#,
        16,
        expect![[r#"
            {"optimizer":{"_name":"sgd","momentum":0},"batch":32}
            {"optimizer":{"_name":"sgd","momentum":0},"batch":64}
            {"optimizer":{"_name":"sgd","momentum":0.9},"batch":32}
            {"optimizer":{"_name":"sgd","momentum":0.9},"batch":64}
            {"optimizer":{"_name":"adam","lr":0.0010000000000000002},"batch":32}
            {"optimizer":{"_name":"adam","lr":0.0010000000000000002},"batch":64}
            {"optimizer":{"_name":"lbfgs"},"batch":32}
            {"optimizer":{"_name":"lbfgs"},"batch":64}
            {"optimizer":{"_name":"adam","lr":0.0003162277660168384},"batch":32}
            {"optimizer":{"_name":"adam","lr":0.0003162277660168384},"batch":64}
            {"optimizer":{"_name":"adam","lr":0.003162277660168382},"batch":32}
            {"optimizer":{"_name":"adam","lr":0.003162277660168382},"batch":64}
            {"optimizer":{"_name":"adam","lr":0.00017782794100389232},"batch":32}
            {"optimizer":{"_name":"adam","lr":0.00017782794100389232},"batch":64}
            {"optimizer":{"_name":"adam","lr":0.0005623413251903495},"batch":32}
            {"optimizer":{"_name":"adam","lr":0.0005623413251903495},"batch":64}
            ...
        "#]],
    );
}

#[test]
fn import_data_skips_imported_points() {
    let space = r#"{"a": {"_type": "choice", "_value": [1, 2]}, "b": {"_type": "choice", "_value": ["x", "y"]}}"#;
    let mut grid: GridSearchTuner = tuner("{}", space);
    // Key order and number spelling of the imported points do not matter.
    let done = [json!({"b": "y", "a": 1.0}), json!({"a": 2, "b": "x"})];
    grid.import_data(&imported(&done)).unwrap();
    let (params, no_more) = generate(&mut grid, 10);
    expect![[r#"
        {"a":1,"b":"x"}
        {"a":2,"b":"y"}
        NoMore
    "#]]
    .assert_eq(&listing(&params, no_more));
}

#[test]
fn a_new_space_restarts_the_walk_but_never_repeats_a_point() {
    let mut grid: GridSearchTuner = tuner("{}", r#"{"a": {"_type": "choice", "_value": [1, 2]}}"#);
    let (first, _) = generate(&mut grid, 1);
    grid.update_search_space(&parse(r#"{"a": {"_type": "choice", "_value": [1, 2, 3]}}"#))
        .unwrap();
    let (rest, no_more) = generate(&mut grid, 10);
    assert!(no_more);
    assert_eq!(keys(&first), [r#"{"a":1}"#]);
    assert_eq!(keys(&rest), [r#"{"a":2}"#, r#"{"a":3}"#]);
}

#[test]
fn continuous_grid_never_repeats() {
    let mut grid: GridSearchTuner = tuner(
        "{}",
        r#"{"a": {"_type": "randint", "_value": [0, 3]},
            "b": {"_type": "qnormal", "_value": [10, 3, 2]},
            "c": {"_type": "uniform", "_value": [-1, 1]}}"#,
    );
    let (params, no_more) = generate(&mut grid, 2000);
    assert!(!no_more, "a uniform parameter makes the grid endless");
    assert_no_repeats(&params);
}

#[test]
fn errors_are_one_line_a_user_can_act_on() {
    expect!["classArgs of GridSearch: unknown field `seed`, expected `optimize_mode`"]
        .assert_eq(&class_args_error::<GridSearchTuner>(r#"{"seed": 1}"#));
    expect![[
        r#"classArgs of GridSearch: optimize_mode must be "maximize" or "minimize", got "max""#
    ]]
    .assert_eq(&class_args_error::<GridSearchTuner>(
        r#"{"optimize_mode": "max"}"#,
    ));
    let mut grid: GridSearchTuner = Tuner::new(&json!({"optimize_mode": "maximize"})).unwrap();
    expect!["GridSearch: asked for parameters before it was given a search space"]
        .assert_eq(grid.generate_parameters(0).unwrap_err().message());
    expect!["GridSearch: the search space is empty; give it at least one parameter to search over"]
        .assert_eq(
            grid.update_search_space(&parse("{}"))
                .unwrap_err()
                .message(),
        );
}
