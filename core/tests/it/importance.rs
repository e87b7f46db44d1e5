//! fANOVA importance (`knob_core::importance`) on three problems where one parameter clearly
//! dominates and one is unused: knob ranks the dominant one first and the unused one last, and
//! its ranking agrees with Optuna's `FanovaImportanceEvaluator` on the same trials (Spearman
//! ≥ 0.8). The Optuna part needs `KNOB_TEST_OPTUNA_PYTHON`, a python with optuna and
//! scikit-learn (`eval "$(.ci/optuna-fanova.sh)"` makes one); without it the test says it
//! skipped, and fails under `KNOB_TEST_REQUIRE_ALL=1`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use knob_core::importance::{fanova, Scale, Value};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value as Json};

const TRIALS: usize = 200;

enum Param {
    Uniform(&'static str, f64, f64),
    Log(&'static str, f64, f64),
    Choice(&'static str, &'static [&'static str]),
}

impl Param {
    fn name(&self) -> &'static str {
        match self {
            Param::Uniform(n, ..) | Param::Log(n, ..) | Param::Choice(n, _) => n,
        }
    }
}

struct Problem {
    name: &'static str,
    params: Vec<Param>,
    /// The objective of the sampled values (numbers, or the index of a choice).
    objective: fn(&[f64]) -> f64,
    dominant: &'static str,
    unused: &'static str,
}

fn problems() -> Vec<Problem> {
    vec![
        Problem {
            name: "linear",
            params: vec![
                Param::Uniform("a", 0.0, 1.0),
                Param::Uniform("b", 0.0, 1.0),
                Param::Uniform("c", 0.0, 1.0),
                Param::Uniform("unused", 0.0, 1.0),
            ],
            objective: |v| 10.0 * v[0] + 3.0 * v[1] + v[2],
            dominant: "a",
            unused: "unused",
        },
        Problem {
            name: "learning rate",
            params: vec![
                Param::Log("lr", 1e-5, 1e-1),
                Param::Uniform("momentum", 0.0, 1.0),
                Param::Choice("optimizer", &["adam", "sgd", "rmsprop"]),
                Param::Uniform("unused", -5.0, 5.0),
            ],
            objective: |v| {
                let optimizer = [0.0, 0.8, 0.4][v[2] as usize];
                -(v[0].log10() + 3.0).powi(2) + 1.5 * v[1] + optimizer
            },
            dominant: "lr",
            unused: "unused",
        },
        Problem {
            name: "categorical",
            params: vec![
                Param::Choice("model", &["small", "medium", "large", "huge"]),
                Param::Uniform("dropout", 0.0, 0.5),
                Param::Log("unused", 1.0, 1000.0),
                Param::Uniform("width", 0.0, 1.0),
            ],
            objective: |v| {
                [0.0, 4.0, 7.0, 5.0][v[0] as usize] + 4.0 * (v[1] - 0.25).powi(2) * 4.0 + 0.8 * v[3]
            },
            dominant: "model",
            unused: "unused",
        },
    ]
}

/// TRIALS random trials of the problem (values, and small noise on the objective).
fn sample(problem: &Problem, seed: u64) -> Vec<(Vec<f64>, f64)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..TRIALS)
        .map(|_| {
            let values: Vec<f64> = problem
                .params
                .iter()
                .map(|p| match p {
                    Param::Uniform(_, low, high) => rng.gen_range(*low..*high),
                    Param::Log(_, low, high) => rng.gen_range(low.ln()..high.ln()).exp(),
                    Param::Choice(_, options) => rng.gen_range(0..options.len()) as f64,
                })
                .collect();
            let noise = rng.gen_range(-0.05..0.05);
            let y = (problem.objective)(&values) + noise;
            (values, y)
        })
        .collect()
}

fn knob_importances(problem: &Problem, trials: &[(Vec<f64>, f64)]) -> Vec<f64> {
    let scales: Vec<Scale> = problem
        .params
        .iter()
        .map(|p| match p {
            Param::Uniform(..) => Scale::Number { log: false },
            Param::Log(..) => Scale::Number { log: true },
            Param::Choice(_, options) => Scale::Choice {
                options: options.len(),
            },
        })
        .collect();
    let rows: Vec<(Vec<Value>, f64)> = trials
        .iter()
        .map(|(values, y)| {
            let row = problem
                .params
                .iter()
                .zip(values)
                .map(|(p, &v)| match p {
                    Param::Choice(..) => Value::Choice(v as usize),
                    _ => Value::Number(v),
                })
                .collect();
            (row, *y)
        })
        .collect();
    fanova(&scales, &rows, 0)
        .into_iter()
        .map(|r| r.expect("every parameter varies"))
        .collect()
}

fn rank(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut ranks = vec![0.0; values.len()];
    for (r, &i) in order.iter().enumerate() {
        ranks[i] = r as f64;
    }
    ranks
}

fn spearman(x: &[f64], y: &[f64]) -> f64 {
    let (rx, ry) = (rank(x), rank(y));
    let n = x.len() as f64;
    let d2: f64 = rx.iter().zip(&ry).map(|(a, b)| (a - b) * (a - b)).sum();
    1.0 - 6.0 * d2 / (n * (n * n - 1.0))
}

#[test]
fn fanova_ranks_the_dominant_parameter_first_and_the_unused_one_last() {
    for problem in problems() {
        let trials = sample(&problem, 11);
        let shares = knob_importances(&problem, &trials);
        let names: Vec<&str> = problem.params.iter().map(Param::name).collect();
        let top = names[rank(&shares).iter().position(|&r| r == 3.0).unwrap()];
        let bottom = names[rank(&shares).iter().position(|&r| r == 0.0).unwrap()];
        assert_eq!(
            (top, bottom),
            (problem.dominant, problem.unused),
            "{}: {names:?} {shares:?}",
            problem.name
        );
    }
}

/// Finals near f64's limit are numbers like any other: their variance used to overflow, and every
/// share came out 0 (at 1e200) or NaN (at 1e308).
#[test]
fn fanova_ranks_parameters_of_finals_near_the_largest_number() {
    let mut rng = StdRng::seed_from_u64(3);
    for big in [1e200, 1e308, f64::MAX] {
        let rows: Vec<(Vec<Value>, f64)> = (0..40)
            .map(|_| {
                let (x, y): (f64, f64) = (rng.gen(), rng.gen());
                let final_ = if x > 0.5 { big } else { y };
                (vec![Value::Number(x), Value::Number(y)], final_)
            })
            .collect();
        let scales = [Scale::Number { log: false }, Scale::Number { log: false }];
        let shares: Vec<f64> = fanova(&scales, &rows, 1)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert!(shares[0] > 0.9, "{big}: {shares:?}");
        assert!(
            (shares.iter().sum::<f64>() - 1.0).abs() < 1e-9,
            "{big}: {shares:?}"
        );
    }
}

#[test]
fn fanova_agrees_with_optunas_fanova_importance_evaluator() {
    let Some(python) = crate::prerequisite::OPTUNA_PYTHON.path() else {
        return;
    };
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/importance/optuna_fanova.py");
    for problem in problems() {
        let trials = sample(&problem, 11);
        let knob = knob_importances(&problem, &trials);
        let params: Vec<Json> = problem
            .params
            .iter()
            .map(|p| match p {
                Param::Uniform(n, low, high) => {
                    json!({"name": n, "type": "float", "low": low, "high": high})
                }
                Param::Log(n, low, high) => {
                    json!({"name": n, "type": "log", "low": low, "high": high})
                }
                Param::Choice(n, options) => {
                    json!({"name": n, "type": "choice", "choices": options})
                }
            })
            .collect();
        let rows: Vec<Json> = trials
            .iter()
            .map(|(values, y)| {
                let named: serde_json::Map<String, Json> = problem
                    .params
                    .iter()
                    .zip(values)
                    .map(|(p, &v)| {
                        let value = match p {
                            Param::Choice(_, options) => json!(options[v as usize]),
                            _ => json!(v),
                        };
                        (p.name().to_string(), value)
                    })
                    .collect();
                json!({"params": named, "value": y})
            })
            .collect();
        let input = json!({"params": params, "trials": rows, "seed": 0}).to_string();
        let mut child = Command::new(&python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let optuna: serde_json::Map<String, Json> = serde_json::from_slice(&output.stdout).unwrap();
        let theirs: Vec<f64> = problem
            .params
            .iter()
            .map(|p| optuna[p.name()].as_f64().unwrap())
            .collect();
        let rho = spearman(&knob, &theirs);
        println!(
            "{}: knob {knob:.3?}, optuna {theirs:.3?}, Spearman {rho:.2}",
            problem.name
        );
        assert!(
            rho >= 0.8,
            "{}: Spearman {rho:.2} < 0.8: knob {knob:?}, optuna {theirs:?}",
            problem.name
        );
    }
}
