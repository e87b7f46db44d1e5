//! Which way each rule judges: its own `optimize_mode` classArg when given, else the
//! experiment's direction that the host tells it (`set_context`), through the built plugin as
//! knob loads it. Before this, every rule ignored the context and maximized, so a TPE experiment
//! (minimizing) had its improving trials stopped as "worse".

use expect_test::expect;
use knob_plugin_api::host::{AssessorObject, PluginRegistry};
use knob_plugin_api::{status, AssessorContext, OptimizeMode};
use serde_json::{json, Value};

use crate::abi::plugin_file;
use crate::mirrored;

/// 20 epochs of a loss falling from about 0.9 towards 1 − `last` at rate `rate`.
fn falling_loss(rate: f64, last: f64) -> Vec<f64> {
    let accuracy: Vec<f64> = (1..=20)
        .map(|x| last - (last - 0.1) * (-rate * x as f64).exp())
        .collect();
    mirrored(&accuracy)
}

/// Each rule with a direction, its classArgs (no `optimize_mode`) and loss curves (lower is
/// better) run one after another.
fn table() -> Vec<(&'static str, Value, Vec<Vec<f64>>)> {
    vec![
        (
            "Patience",
            json!({"patience": 2}),
            vec![
                // The finding's trial: a loss falling every step.
                vec![9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0],
                vec![0.5, 0.4, 0.3, 0.35, 0.32, 0.31],
            ],
        ),
        (
            "Medianstop",
            json!({"start_step": 2}),
            vec![
                vec![0.5, 0.4, 0.3, 0.2],
                vec![0.8, 0.7, 0.6, 0.5],
                vec![0.3, 0.2, 0.1, 0.05],
            ],
        ),
        (
            "ASHA",
            json!({"reduction_factor": 2, "max_resource": 8}),
            vec![vec![0.5, 0.4, 0.3, 0.2], vec![0.6, 0.5, 0.4, 0.3]],
        ),
        (
            "Curvefitting",
            json!({"epoch_num": 20, "start_step": 6, "threshold": 0.95}),
            vec![
                falling_loss(0.3, 0.9),
                falling_loss(0.5, 0.5),
                falling_loss(0.3, 0.92),
            ],
        ),
    ]
}

/// One line per trial: "ran to the end" or "stopped: <reason>".
fn outcomes(
    name: &str,
    class_args: &Value,
    own_mode: Option<&str>,
    experiment: OptimizeMode,
    curves: &[Vec<f64>],
) -> String {
    let mut args = class_args.clone();
    if let Some(mode) = own_mode {
        args["optimize_mode"] = json!(mode);
    }
    let registry = PluginRegistry::load_from(&[plugin_file()]);
    let mut assessor = registry
        .assessor_object(name, &args, &AssessorContext::new(experiment))
        .unwrap_or_else(|e| panic!("{name} {args}: {e}"));
    let mut lines = String::new();
    for (i, curve) in curves.iter().enumerate() {
        let trial = format!("t{i}");
        lines += &format!("t{i}: {}\n", run(&mut assessor, &trial, curve));
    }
    lines
}

fn run(assessor: &mut AssessorObject, trial: &str, curve: &[f64]) -> String {
    for step in 1..=curve.len() {
        let verdict = assessor.assess_trial(trial, &curve[..step]).unwrap();
        if !verdict.keep_going {
            assessor.trial_end(trial, status::EARLY_STOPPED).unwrap();
            return format!("stopped: {}", verdict.reason);
        }
    }
    assessor.trial_end(trial, status::SUCCEEDED).unwrap();
    "ran to the end".into()
}

#[test]
fn without_optimize_mode_each_rule_follows_the_experiments_direction() {
    let mut told_minimize = String::new();
    for (name, args, curves) in table() {
        let followed = outcomes(name, &args, None, OptimizeMode::Minimize, &curves);
        let own_minimize = outcomes(
            name,
            &args,
            Some("minimize"),
            OptimizeMode::Maximize,
            &curves,
        );
        assert_eq!(
            followed, own_minimize,
            "{name}: told the experiment minimizes, it should judge as with optimize_mode: minimize"
        );
        let maximized = outcomes(name, &args, None, OptimizeMode::Maximize, &curves);
        assert_ne!(
            followed, maximized,
            "{name}: the table's curves should tell the two directions apart"
        );
        told_minimize += &format!("{name}\n{followed}");
    }
    expect![[r#"
        Patience
        t0: ran to the end
        t1: stopped: step 6: the best of the last 3 results, 0.31, is worse than 0.3 before them (patience 2)
        Medianstop
        t0: ran to the end
        t1: stopped: step 2: best 0.7 above median 0.45 of 1 completed trial
        t2: ran to the end
        ASHA
        t0: ran to the end
        t1: stopped: step 1: 0.6 above 0.5, the best of 2 results at this rung (top 1/2 go on)
        Curvefitting
        t0: ran to the end
        t1: stopped: step 8: predicted 0.4973 at epoch 20 (mean of 4 curve models), not below 0.1071 (threshold 0.95 × best 0.102)
        t2: ran to the end
    "#]]
    .assert_eq(&told_minimize);
}

#[test]
fn an_optimize_mode_in_the_assessors_own_class_args_wins_over_the_experiments() {
    for (name, args, curves) in table() {
        for mode in ["maximize", "minimize"] {
            let against = match mode {
                "maximize" => OptimizeMode::Minimize,
                _ => OptimizeMode::Maximize,
            };
            let same = match mode {
                "maximize" => OptimizeMode::Maximize,
                _ => OptimizeMode::Minimize,
            };
            assert_eq!(
                outcomes(name, &args, Some(mode), against, &curves),
                outcomes(name, &args, Some(mode), same, &curves),
                "{name}: optimize_mode: {mode} in its classArgs should decide"
            );
        }
    }
}
