//! Screening driver for multi-objective TPE: the problems, reference points and sequential
//! trial loop of `benches/harness/multi_objective.rs`, knob's TPE only, called directly (no
//! plugin library, no Optuna), on any range of seeds, so a change can be chosen on seeds the
//! harness does not use (0-9) in seconds per problem. Its hypervolumes equal the harness's for
//! the same seeds (parameters cross the ABI as JSON with round-trip floats).
//!
//! ```text
//! cargo run --release -p knob-tuners --example mo_driver -- --seeds 100-119 --trials 200 \
//!   --variant 'base={}' --variant 'c64={"tpe_args":{"n_ei_candidates":64}}' \
//!   [--problems zdt3,dtlz2] [--threads 2]
//! ```
//!
//! Prints per problem and variant (JSON merged into TPE's classArgs) the median and mean
//! hypervolume and every seed's, for paired comparisons.
use knob_plugin_api::objectives::hypervolume;
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, Outcome, Tuner};
use knob_tuners::TpeTuner;
use serde_json::{json, Value};

// The harness's own problem definitions, so both score the same functions.
#[path = "../../benches/harness/multi_objective_problems.rs"]
mod problems;
use problems::{dtlz2, zdt1, zdt2, zdt3};

type Problem = (&'static str, usize, Vec<f64>, fn(&[f64]) -> Vec<f64>);

fn run(p: &Problem, extra: &Value, seed: u64, trials: usize) -> f64 {
    let mut args = json!({"seed": seed});
    if let (Some(args), Some(extra)) = (args.as_object_mut(), extra.as_object()) {
        args.extend(extra.clone());
    }
    let mut t = TpeTuner::new(&args).unwrap_or_else(|e| exit(&format!("classArgs {args}: {e}")));
    let mut space = serde_json::Map::new();
    for i in 0..p.1 {
        space.insert(
            format!("x{i}"),
            json!({"_type": "uniform", "_value": [0, 1]}),
        );
    }
    let space = SearchSpace::parse(&Value::Object(space).to_string()).expect("a valid space");
    t.update_search_space(&space).expect("TPE takes the space");
    let mut points = Vec::new();
    for id in 0..trials as u64 {
        let params = match t.generate_parameters(id) {
            Ok(Generated::Parameters(p)) => p,
            other => exit(&format!("trial {id}: TPE answered {other:?}")),
        };
        let x: Vec<f64> = (0..p.1)
            .map(|i| {
                params[format!("x{i}")]
                    .as_f64()
                    .expect("numeric parameters")
            })
            .collect();
        let losses = (p.3)(&x);
        t.receive_trial_outcome(id, &params, &Outcome::minimised(&losses, &[]))
            .expect("TPE takes the outcome");
        t.trial_end(id, "SUCCEEDED").expect("TPE takes the end");
        points.push(losses);
    }
    hypervolume(&points, &p.2)
}

fn exit(message: &str) -> ! {
    eprintln!("mo_driver: {message}");
    std::process::exit(2)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = 0.5 * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

fn main() {
    let mut seeds = (100u64, 119u64);
    let mut trials = 200;
    let mut names: Option<Vec<String>> = None;
    let mut variants: Vec<(String, Value)> = Vec::new();
    let mut threads = 1usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let usage = "see the header of tuners/examples/mo_driver.rs for the arguments";
        if ![
            "--seeds",
            "--trials",
            "--threads",
            "--problems",
            "--variant",
        ]
        .contains(&a.as_str())
        {
            exit(&format!("unknown argument {a}; {usage}"));
        }
        let v = args
            .next()
            .unwrap_or_else(|| exit(&format!("{a} takes a value; {usage}")));
        let bad = || -> ! { exit(&format!("{a} {v}: not understood; {usage}")) };
        match a.as_str() {
            "--seeds" => {
                let (a, b) = v.split_once('-').unwrap_or_else(|| bad());
                seeds = match (a.parse(), b.parse()) {
                    (Ok(a), Ok(b)) if a <= b => (a, b),
                    _ => bad(),
                };
            }
            "--trials" => trials = v.parse().unwrap_or_else(|_| bad()),
            "--threads" => threads = v.parse::<usize>().unwrap_or_else(|_| bad()).max(1),
            "--problems" => names = Some(v.split(',').map(str::to_owned).collect()),
            "--variant" => {
                let (l, j) = v.split_once('=').unwrap_or_else(|| bad());
                let json = serde_json::from_str(j).unwrap_or_else(|_| bad());
                variants.push((l.to_owned(), json));
            }
            _ => bad(),
        }
    }
    if variants.is_empty() {
        variants.push(("default".to_owned(), json!({})));
    }
    let problems: Vec<Problem> = vec![
        ("zdt1", 30, vec![1.1, 11.0], zdt1 as fn(&[f64]) -> Vec<f64>),
        ("zdt2", 30, vec![1.1, 11.0], zdt2),
        ("zdt3", 30, vec![1.1, 11.0], zdt3),
        ("dtlz2", 12, vec![3.85; 3], dtlz2),
    ]
    .into_iter()
    .filter(|p| names.as_ref().is_none_or(|n| n.iter().any(|n| n == p.0)))
    .collect();
    let seed_list: Vec<u64> = (seeds.0..=seeds.1).collect();
    for p in &problems {
        for (label, extra) in &variants {
            let started = std::time::Instant::now();
            let chunks: Vec<Vec<u64>> = seed_list
                .chunks(seed_list.len().div_ceil(threads))
                .map(|c| c.to_vec())
                .collect();
            let hv: Vec<f64> = std::thread::scope(|s| {
                let hs: Vec<_> = chunks
                    .iter()
                    .map(|c| {
                        s.spawn(|| {
                            c.iter()
                                .map(|&sd| run(p, extra, sd, trials))
                                .collect::<Vec<f64>>()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .flat_map(|h| h.join().expect("a run finishes"))
                    .collect()
            });
            let mean = hv.iter().sum::<f64>() / hv.len() as f64;
            println!(
                "{} {:<12} median {:.4} mean {:.4} ({:.0}s) [{}]",
                p.0,
                label,
                median(&hv),
                mean,
                started.elapsed().as_secs_f64(),
                hv.iter()
                    .map(|v| format!("{v:.3}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
}
