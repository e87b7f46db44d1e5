//! The quality harness's test problems: an NNI search space, an objective to minimize over its
//! parameters objects, and the objective's minimum (regret is `best found - minimum`).
//!
//! The objectives are evaluated here for knob's tuners and for Optuna alike (the Optuna driver
//! sends each point it asks for back to this process), so both optimise the same functions.

use serde_json::{json, Value};

pub struct Problem {
    pub name: &'static str,
    pub space: Value,
    pub objective: fn(&Value) -> f64,
    /// The global minimum of `objective` over `space`.
    pub minimum: f64,
}

pub fn problems() -> Vec<Problem> {
    vec![
        Problem {
            name: "branin",
            space: json!({
                "x1": {"_type": "uniform", "_value": [-5, 10]},
                "x2": {"_type": "uniform", "_value": [0, 15]},
            }),
            objective: branin,
            minimum: 0.397_887_357_729_738_2,
        },
        Problem {
            name: "hartmann6",
            space: Value::Object(
                (1..=6)
                    .map(|i| {
                        (
                            format!("x{i}"),
                            json!({"_type": "uniform", "_value": [0, 1]}),
                        )
                    })
                    .collect(),
            ),
            objective: hartmann6,
            minimum: -3.322_368_011_391_339,
        },
        Problem {
            name: "rosenbrock5",
            space: Value::Object(
                (1..=5)
                    .map(|i| {
                        (
                            format!("x{i}"),
                            json!({"_type": "uniform", "_value": [-2, 2]}),
                        )
                    })
                    .collect(),
            ),
            objective: rosenbrock5,
            minimum: 0.0,
        },
        Problem {
            name: "mixed",
            space: json!({
                "lr": {"_type": "loguniform", "_value": [1e-5, 1]},
                "layers": {"_type": "randint", "_value": [1, 9]},
                "units": {"_type": "quniform", "_value": [16, 256, 16]},
                "activation": {"_type": "choice", "_value": ["relu", "tanh", "sigmoid"]},
                "optimizer": {"_type": "choice", "_value": ["sgd", "adam", "rmsprop"]},
            }),
            objective: mixed,
            minimum: 0.0,
        },
        Problem {
            name: "nested",
            space: json!({
                "scale": {"_type": "choice", "_value": [true, false]},
                "model": {"_type": "choice", "_value": [
                    {"_name": "svm",
                     "C": {"_type": "loguniform", "_value": [1e-3, 1e3]},
                     "gamma": {"_type": "loguniform", "_value": [1e-4, 1]}},
                    {"_name": "forest",
                     "trees": {"_type": "randint", "_value": [10, 500]},
                     "depth": {"_type": "randint", "_value": [2, 20]}},
                    {"_name": "mlp",
                     "lr": {"_type": "loguniform", "_value": [1e-5, 1e-1]},
                     "dropout": {"_type": "uniform", "_value": [0, 0.8]},
                     "width": {"_type": "choice", "_value": [32, 64, 128, 256]}},
                ]},
            }),
            objective: nested,
            minimum: 0.0,
        },
    ]
}

fn number(p: &Value, key: &str) -> f64 {
    p[key]
        .as_f64()
        .unwrap_or_else(|| panic!("parameter {key} missing or not a number in {p}"))
}

fn branin(p: &Value) -> f64 {
    let (x1, x2) = (number(p, "x1"), number(p, "x2"));
    let pi = std::f64::consts::PI;
    let b = 5.1 / (4.0 * pi * pi);
    let c = 5.0 / pi;
    let t = 1.0 / (8.0 * pi);
    (x2 - b * x1 * x1 + c * x1 - 6.0).powi(2) + 10.0 * (1.0 - t) * x1.cos() + 10.0
}

fn hartmann6(p: &Value) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [0.1312, 0.1696, 0.5569, 0.0124, 0.8283, 0.5886],
        [0.2329, 0.4135, 0.8307, 0.3736, 0.1004, 0.9991],
        [0.2348, 0.1451, 0.3522, 0.2883, 0.3047, 0.6650],
        [0.4047, 0.8828, 0.8732, 0.5743, 0.1091, 0.0381],
    ];
    let x: Vec<f64> = (1..=6).map(|i| number(p, &format!("x{i}"))).collect();
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            ALPHA[i] * (-inner).exp()
        })
        .sum::<f64>()
}

fn rosenbrock5(p: &Value) -> f64 {
    let x: Vec<f64> = (1..=5).map(|i| number(p, &format!("x{i}"))).collect();
    x.windows(2)
        .map(|w| 100.0 * (w[1] - w[0] * w[0]).powi(2) + (1.0 - w[0]).powi(2))
        .sum()
}

/// A made-up "validation loss" of a network: the best learning rate depends on the optimizer,
/// depth and width interact, and the activation adds a fixed penalty. 0 at lr = 1e-3, adam,
/// 4 layers, 128 units, relu.
fn mixed(p: &Value) -> f64 {
    let log_lr = number(p, "lr").log10();
    let layers = number(p, "layers");
    let units = number(p, "units");
    let (best_log_lr, optimizer_penalty) = match p["optimizer"].as_str() {
        Some("adam") => (-3.0, 0.0),
        Some("rmsprop") => (-2.5, 0.05),
        _ => (-1.5, 0.15),
    };
    let activation_penalty = match p["activation"].as_str() {
        Some("relu") => 0.0,
        Some("tanh") => 0.04,
        _ => 0.2,
    };
    let capacity = (layers * units / 512.0).ln();
    0.1 * (log_lr - best_log_lr).powi(2)
        + 0.05 * (layers - 4.0).powi(2) / 4.0
        + 0.3 * capacity.powi(2)
        + optimizer_penalty
        + activation_penalty
}

/// Three model families with different best losses: the MLP branch reaches 0 (lr = 1e-3,
/// dropout = 0.2, width 128, scaled inputs), the SVM 0.05, the forest 0.1.
fn nested(p: &Value) -> f64 {
    let model = &p["model"];
    let scale_penalty = if p["scale"].as_bool() == Some(true) {
        0.0
    } else {
        0.03
    };
    let loss = match model["_name"].as_str() {
        Some("svm") => {
            let c = number(model, "C").log10();
            let g = number(model, "gamma").log10();
            0.05 + 0.02 * (c - 1.0).powi(2)
                + 0.03 * (g + 2.0).powi(2)
                + 0.01 * (c + g + 1.0).powi(2)
        }
        Some("forest") => {
            let trees = number(model, "trees");
            let depth = number(model, "depth");
            0.1 + 0.2 * (trees / 300.0).ln().powi(2) / 4.0 + 0.002 * (depth - 12.0).powi(2)
        }
        _ => {
            let lr = number(model, "lr").log10();
            let dropout = number(model, "dropout");
            let width_penalty = match model["width"].as_i64() {
                Some(128) => 0.0,
                Some(64 | 256) => 0.02,
                _ => 0.06,
            };
            0.08 * (lr + 3.0).powi(2) + 0.5 * (dropout - 0.2).powi(2) + width_penalty
        }
    };
    loss + scale_penalty
}

/// Panics unless each objective takes its claimed minimum at its known minimizer: a wrong
/// minimum would skew every regret. (A bench binary runs no `#[test]`, so the harness calls
/// this first.)
pub fn check_minima() {
    let at = |name: &str, p: Value| {
        let problem = problems()
            .into_iter()
            .find(|q| q.name == name)
            .expect("problem");
        (problem.objective)(&p) - problem.minimum
    };
    let branin = json!({"x1": std::f64::consts::PI, "x2": 2.275});
    let hartmann = json!({"x1": 0.20169, "x2": 0.150011, "x3": 0.476874,
                          "x4": 0.275332, "x5": 0.311652, "x6": 0.6573});
    let ones = json!({"x1": 1, "x2": 1, "x3": 1, "x4": 1, "x5": 1});
    let mixed = json!({"lr": 1e-3, "layers": 4, "units": 128,
                       "activation": "relu", "optimizer": "adam"});
    let nested = json!({"scale": true,
                        "model": {"_name": "mlp", "lr": 1e-3, "dropout": 0.2, "width": 128}});
    for (name, point, tolerance) in [
        ("branin", branin, 1e-6),
        ("hartmann6", hartmann, 1e-5),
        ("rosenbrock5", ones, 0.0),
        ("mixed", mixed, 1e-12),
        ("nested", nested, 1e-12),
    ] {
        let gap = at(name, point);
        assert!(
            gap.abs() <= tolerance,
            "{name}: objective - minimum = {gap} at the minimizer"
        );
    }
}
