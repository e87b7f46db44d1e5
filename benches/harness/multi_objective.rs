//! Multi-objective quality: knob's NSGA2, multi-objective TPE and Random, through the plugin ABI,
//! against Optuna's NSGAIISampler and TPESampler (each with its defaults), on ZDT1, ZDT2 and ZDT3
//! in 30 dimensions (as defined by Zitzler, Deb and Thiele 2000) and on DTLZ2 with 3 objectives
//! in 12 dimensions (Deb et al. 2002, k = 10).
//!
//! Every run is sequential (one trial at a time, its result reported before the next is asked
//! for), 200 trials by default. A run's score is the hypervolume of all its trials against a fixed
//! reference point per problem: 1.1 times the worst value each objective can take ((1.1, 11) for
//! the ZDTs, (3.85, 3.85, 3.85) for DTLZ2), so every trial counts and the score does not depend on
//! which other runs were made. Per problem it prints each tuner's median hypervolume over seeds
//! with the interquartile range, and the ratio of medians to Optuna's best (the better of its two
//! samplers); then the target of issue 15: knob's best >= Optuna's best on every problem.
//!
//! Run: `benches/harness/multi_objective.sh`, which sets up Optuna's virtualenv and builds the
//! plugin. Arguments after `--` of `cargo bench -p knob-benches --bench multi_objective`:
//! `--seeds N` (10), `--trials N` (200), `--python PATH` (an interpreter with optuna; without it
//! Optuna is left out), `--problems a,b`, `--tuners A,B` (knob's: NSGA2, TPE, Random), and
//! `--variant LABEL=TUNER:JSON` (repeatable) for one more row: TUNER with JSON merged into its
//! classArgs, e.g. `--variant 'TPE-hv=TPE:{"tpe_args":{"good_weights":"hypervolume"}}'`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use knob_benches::harness::{plugin_path, quartiles, OptunaDriver};
use knob_plugin_api::host::PluginRegistry;
use knob_plugin_api::objectives::hypervolume;
use knob_plugin_api::{Generated, Outcome};
use serde_json::{json, Value};

#[path = "multi_objective_problems.rs"]
mod problems;
use problems::{dtlz2, zdt1, zdt2, zdt3};

struct Problem {
    name: &'static str,
    dims: usize,
    objectives: usize,
    reference: Vec<f64>,
    evaluate: fn(&[f64]) -> Vec<f64>,
}

fn problems() -> Vec<Problem> {
    let zdt = |name, evaluate| Problem {
        name,
        dims: 30,
        objectives: 2,
        reference: vec![1.1, 11.0],
        evaluate,
    };
    vec![
        zdt("zdt1", zdt1),
        zdt("zdt2", zdt2),
        zdt("zdt3", zdt3),
        Problem {
            name: "dtlz2",
            dims: 12,
            objectives: 3,
            // 1 + g <= 1 + 10 * 0.25.
            reference: vec![3.85; 3],
            evaluate: dtlz2,
        },
    ]
}

impl Problem {
    fn space(&self) -> Value {
        let mut space = serde_json::Map::new();
        for i in 0..self.dims {
            space.insert(
                format!("x{i}"),
                json!({"_type": "uniform", "_value": [0, 1]}),
            );
        }
        Value::Object(space)
    }

    fn point(&self, params: &Value) -> Vec<f64> {
        (0..self.dims)
            .map(|i| {
                params[format!("x{i}")]
                    .as_f64()
                    .unwrap_or_else(|| panic!("parameters without a number x{i}: {params}"))
            })
            .collect()
    }
}

struct Options {
    seeds: u64,
    trials: usize,
    python: Option<PathBuf>,
    problems: Option<Vec<String>>,
    tuners: Vec<String>,
    /// More rows: (label, tuner, JSON merged into its classArgs).
    variants: Vec<(String, String, Value)>,
}

fn options() -> Options {
    let mut options = Options {
        seeds: 10,
        trials: 200,
        python: None,
        problems: None,
        tuners: vec!["NSGA2".into(), "TPE".into(), "Random".into()],
        variants: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    let list = |v: Option<String>| -> Option<Vec<String>> {
        v.map(|v| v.split(',').map(str::to_owned).collect())
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => {
                options.seeds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--seeds takes a number")
            }
            "--trials" => {
                options.trials = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--trials takes a number")
            }
            "--python" => options.python = args.next().map(PathBuf::from),
            "--problems" => options.problems = list(args.next()),
            "--tuners" => options.tuners = list(args.next()).expect("--tuners takes A,B"),
            "--variant" => {
                let spec = args.next().expect("--variant takes LABEL=TUNER:JSON");
                let (label, rest) = spec.split_once('=').expect("--variant LABEL=TUNER:JSON");
                let (tuner, json) = rest.split_once(':').expect("--variant LABEL=TUNER:JSON");
                let class_args: Value = serde_json::from_str(json).expect("--variant JSON");
                options
                    .variants
                    .push((label.to_owned(), tuner.to_owned(), class_args));
            }
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => panic!("unknown argument {other}; see the header of multi_objective.rs"),
        }
    }
    options
}

/// One sequential run of a knob tuner through the ABI: the objective vectors of its trials.
fn run_knob(
    registry: &PluginRegistry,
    (tuner, extra_args): (&str, &Value),
    problem: &Problem,
    seed: u64,
    trials: usize,
) -> Result<Vec<Vec<f64>>, String> {
    let mut class_args = json!({"seed": seed});
    if let (Some(args), Some(extra)) = (class_args.as_object_mut(), extra_args.as_object()) {
        args.extend(extra.clone());
    }
    let mut object = registry
        .tuner_object(tuner, &class_args)
        .map_err(|e| e.to_string())?;
    if !object.takes_objectives() {
        return Err(format!("{tuner} does not take objectives"));
    }
    object
        .update_search_space(&problem.space())
        .map_err(|e| e.to_string())?;
    let mut points = Vec::with_capacity(trials);
    for id in 0..trials as u64 {
        let params = match object.generate_parameters(id).map_err(|e| e.to_string())? {
            Generated::Parameters(p)
            | Generated::Labeled { parameters: p, .. }
            | Generated::Member { parameters: p, .. } => p,
            Generated::NoMore => break,
            Generated::Deferred => return Err("deferred with no trial running".into()),
        };
        let losses = (problem.evaluate)(&problem.point(&params));
        let outcome = Outcome::minimised(&losses, &[]);
        object
            .receive_trial_outcome(id, &params, &outcome)
            .map_err(|e| e.to_string())?;
        object
            .trial_end(id, "SUCCEEDED")
            .map_err(|e| e.to_string())?;
        points.push(losses);
    }
    Ok(points)
}

/// Every (problem, seed) study of one Optuna sampler, in one Python process.
fn run_optuna(
    python: &Path,
    sampler: &str,
    problems: &[Problem],
    seeds: u64,
    trials: usize,
) -> Vec<Vec<f64>> {
    let mut driver = OptunaDriver::spawn(python, "multi_objective.py");
    problems
        .iter()
        .map(|problem| {
            (0..seeds)
                .map(|seed| {
                    let study = json!({"sampler": sampler, "seed": seed, "dims": problem.dims,
                                       "objectives": problem.objectives, "trials": trials});
                    let mut points = Vec::with_capacity(trials);
                    driver.study(&study, trials, |_, params| {
                        let losses = (problem.evaluate)(&problem.point(params));
                        let line = json!(losses).to_string();
                        points.push(losses);
                        line
                    });
                    hypervolume(&points, &problem.reference)
                })
                .collect()
        })
        .collect()
}

struct Row {
    label: String,
    /// Per problem: the hypervolume of every seed's run, or why it could not run.
    per_problem: Vec<Result<Vec<f64>, String>>,
    seconds: f64,
}

impl Row {
    fn median(&self, problem: usize) -> Option<f64> {
        self.per_problem[problem]
            .as_ref()
            .ok()
            .map(|v| quartiles(v).0)
    }
}

fn main() {
    let options = options();
    let problems: Vec<Problem> = problems()
        .into_iter()
        .filter(|p| {
            options
                .problems
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == p.name))
        })
        .collect();
    knob_plugin_api::host::set_plugin_logger(Box::new(|level, _, message| {
        if level <= knob_plugin_api::host::LogLevel::Warn {
            eprintln!("[{level:?}] {message}");
        }
    }));
    let registry = PluginRegistry::load_from(&[plugin_path()]);
    assert!(registry.problems().is_empty(), "{:?}", registry.problems());
    println!(
        "multi-objective quality: {} problems x {} seeds, {} trials a run, one at a time; hypervolume of all trials against a fixed reference point",
        problems.len(),
        options.seeds,
        options.trials
    );
    let mut rows: Vec<Row> = Vec::new();
    std::thread::scope(|scope| {
        // Optuna runs in its own processes beside knob's tuners.
        let optuna = options.python.as_ref().map(|python| {
            let problems = &problems;
            scope.spawn(move || {
                ["nsga2", "tpe"].map(|sampler| {
                    let started = Instant::now();
                    let scores =
                        run_optuna(python, sampler, problems, options.seeds, options.trials);
                    let row = Row {
                        label: format!("optuna {sampler}"),
                        per_problem: scores.into_iter().map(Ok).collect(),
                        seconds: started.elapsed().as_secs_f64(),
                    };
                    eprintln!("{} done in {:.1} s", row.label, row.seconds);
                    row
                })
            })
        });
        let plain = options
            .tuners
            .iter()
            .map(|t| (t.clone(), t.clone(), json!({})));
        for (label, tuner, extra_args) in plain.chain(options.variants.iter().cloned()) {
            let started = Instant::now();
            let per_problem = problems
                .iter()
                .map(|problem| {
                    (0..options.seeds)
                        .map(|seed| {
                            run_knob(
                                &registry,
                                (&tuner, &extra_args),
                                problem,
                                seed,
                                options.trials,
                            )
                            .map(|points| hypervolume(&points, &problem.reference))
                        })
                        .collect::<Result<Vec<f64>, String>>()
                })
                .collect();
            let row = Row {
                label: format!("knob {label}"),
                per_problem,
                seconds: started.elapsed().as_secs_f64(),
            };
            eprintln!("{} done in {:.1} s", row.label, row.seconds);
            rows.push(row);
        }
        if let Some(handle) = optuna {
            rows.extend(handle.join().expect("Optuna thread"));
        }
    });
    report(&problems, &rows, options.seeds);
}

fn report(problems: &[Problem], rows: &[Row], seeds: u64) {
    let optuna_best = |p: usize| -> Option<f64> {
        rows.iter()
            .filter(|r| r.label.starts_with("optuna "))
            .filter_map(|r| r.median(p))
            .reduce(f64::max)
    };
    for (p, problem) in problems.iter().enumerate() {
        println!(
            "\n{} ({}-D, {} objectives, reference {:?}), {seeds} seeds: hypervolume median [q25, q75], ratio to Optuna's best median",
            problem.name, problem.dims, problem.objectives, problem.reference
        );
        for row in rows {
            match &row.per_problem[p] {
                Err(why) => println!("  {:<14} n/a: {why}", row.label),
                Ok(scores) => {
                    let (m, q25, q75) = quartiles(scores);
                    let ratio = optuna_best(p).map_or("-".to_owned(), |b| format!("{:.3}", m / b));
                    println!(
                        "  {:<14} {m:>9.4} [{q25:.4}, {q75:.4}] {ratio:>7}",
                        row.label
                    );
                }
            }
        }
    }
    println!("\nseconds per tuner (all problems and seeds):");
    for row in rows {
        println!("  {:<14} {:.1}", row.label, row.seconds);
    }
    println!("\ntarget: knob's best median >= Optuna's best median on every problem");
    let mut met = 0;
    for (p, problem) in problems.iter().enumerate() {
        let knob = rows
            .iter()
            .filter(|r| r.label.starts_with("knob ") && r.label != "knob Random")
            .filter_map(|r| r.median(p).map(|m| (m, &r.label)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        match (knob, optuna_best(p)) {
            (Some((mine, label)), Some(theirs)) => {
                let ok = mine >= theirs;
                met += usize::from(ok);
                println!(
                    "  {}: {label} {mine:.4} vs Optuna {theirs:.4} ({:.3}x): {}",
                    problem.name,
                    mine / theirs,
                    if ok { "met" } else { "MISSED" }
                );
            }
            _ => println!(
                "  {}: not measured (no knob or no Optuna row)",
                problem.name
            ),
        }
    }
    println!("  met on {met} of {} problems", problems.len());
}
