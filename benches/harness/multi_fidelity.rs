//! Multi-fidelity quality: Hyperband and BOHB against random search at equal total budget, on a
//! multi-fidelity Hartmann-6.
//!
//! The problem: six parameters uniform in [0, 1]; a trial with budget `b` (of at most `B` = 27,
//! "epochs") observes
//!
//! ```text
//! f_b(x) = H6(x; α_b) + σ_b ε,   α_b = α + 0.5 (1 - b/B) δ,   σ_b = 0.2 (1 - b/B),   ε ~ N(0, 1)
//! ```
//!
//! where `H6(x; α)` is Hartmann-6 with the weights `α = (1, 1.2, 3, 3.2)` of its four basins and
//! `δ = (1, 1, -1, -1)`: at small budgets the two shallow basins look deeper and the two deep
//! ones shallower, so a low-budget ranking can mislead, and the noise shrinks to nothing at `B`.
//! At `b = B` the observation is the true value, whose minimum is -3.32237.
//!
//! Every tuner runs sequentially (one trial at a time, through its `Tuner` trait, no processes)
//! until the next trial would take the sum of the budgets spent past the total. Random search
//! runs every trial at `B`; Hyperband (`R` = 27, `eta` = 3) and BOHB (budgets 1 to 27, `eta` =
//! 3) at the budgets their brackets give. What a run found is the configuration with the best
//! observed value among its trials at the largest budget it reached; its regret is its true
//! value `H6(x; α)` minus the minimum. Printed per total budget: the median regret over the
//! seeds with its interquartile range, and the ratio of medians to random search's.
//!
//! Hyperband runs in its default `exec_mode: parallelism`; one trial at a time, `serial` hands
//! out exactly the same trials.
//!
//! Run: `cargo bench -p knob-benches --bench multi_fidelity` (`-- --seeds N`, default 20).

use knob_benches::harness::quartiles;
use knob_plugin_api::space::{seeded_rng, standard_normal, SearchSpace};
use knob_plugin_api::{Generated, Tuner};
use knob_tuners::{BohbTuner, HyperbandTuner, RandomTuner};
use serde_json::{json, Value};

const MAX_BUDGET: u64 = 27;
/// Total budgets, in full-budget trials (`B` each): random search runs exactly this many.
const TOTALS: [u64; 3] = [20, 50, 100];
const MINIMUM: f64 = -3.322_368_011_391_339;
const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
const DELTA: [f64; 4] = [1.0, 1.0, -1.0, -1.0];

fn hartmann6(x: &[f64; 6], alpha: &[f64; 4]) -> f64 {
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
    -(0..4)
        .map(|i| {
            let inner: f64 = (0..6).map(|j| A[i][j] * (x[j] - P[i][j]).powi(2)).sum();
            alpha[i] * (-inner).exp()
        })
        .sum::<f64>()
}

fn point(parameters: &Value) -> [f64; 6] {
    std::array::from_fn(|j| {
        parameters[format!("x{}", j + 1)]
            .as_f64()
            .expect("x1..x6 are numbers")
    })
}

/// The value a trial at budget `b` observes; `noise` is its standard normal draw.
fn observe(x: &[f64; 6], budget: u64, noise: f64) -> f64 {
    let gap = 1.0 - budget as f64 / MAX_BUDGET as f64;
    let alpha: [f64; 4] = std::array::from_fn(|i| ALPHA[i] + 0.5 * gap * DELTA[i]);
    hartmann6(x, &alpha) + 0.2 * gap * noise
}

fn space() -> SearchSpace {
    let space: Value = (1..=6)
        .map(|i| {
            (
                format!("x{i}"),
                json!({"_type": "uniform", "_value": [0, 1]}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    SearchSpace::from_value(&space).expect("the space is valid")
}

/// One sequential run within `total` budget units; the regret of what it found.
fn run(mut tuner: Box<dyn Tuner>, total: u64, seed: u64) -> f64 {
    tuner.update_search_space(&space()).expect("space");
    let mut noise = seeded_rng(seed ^ 0x5eed);
    let mut ready = std::collections::VecDeque::new();
    let mut spent = 0;
    let mut next_id = 0;
    // (budget, observed, true value) of each trial.
    let mut trials: Vec<(u64, f64, f64)> = Vec::new();
    loop {
        let (id, parameters) = match ready.pop_front() {
            Some(ready) => ready,
            None => {
                next_id += 1;
                match tuner.generate_parameters(next_id).expect("generate") {
                    Generated::Parameters(p)
                    | Generated::Labeled { parameters: p, .. }
                    | Generated::Member { parameters: p, .. } => (next_id, p),
                    Generated::NoMore => break,
                    Generated::Deferred => panic!("deferred with no trial running"),
                }
            }
        };
        let budget = parameters["TRIAL_BUDGET"].as_u64().unwrap_or(MAX_BUDGET);
        if spent + budget > total {
            break;
        }
        spent += budget;
        let x = point(&parameters);
        let observed = observe(&x, budget, standard_normal(&mut noise));
        trials.push((budget, observed, hartmann6(&x, &ALPHA)));
        tuner
            .receive_trial_result(id, &parameters, observed)
            .expect("result");
        ready.extend(
            tuner
                .take_suggestions()
                .expect("take_suggestions")
                .into_iter()
                .map(|s| (s.parameter_id, s.parameters)),
        );
        tuner.trial_end(id, "SUCCEEDED").expect("trial_end");
        ready.extend(
            tuner
                .take_suggestions()
                .expect("take_suggestions")
                .into_iter()
                .map(|s| (s.parameter_id, s.parameters)),
        );
    }
    let top = trials
        .iter()
        .map(|t| t.0)
        .max()
        .expect("at least one trial");
    let (_, _, truth) = trials
        .iter()
        .filter(|t| t.0 == top)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .expect("a trial at the top budget");
    truth - MINIMUM
}

fn main() {
    let mut seeds = 20u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--seeds" {
            seeds = args
                .next()
                .and_then(|v| v.parse().ok())
                .expect("--seeds takes a number");
        }
    }
    type Make = fn(u64) -> Box<dyn Tuner>;
    let tuners: [(&str, Make); 3] = [
        ("random", |seed| {
            Box::new(RandomTuner::new(&json!({"seed": seed})).expect("Random"))
        }),
        ("hyperband", |seed| {
            Box::new(
                HyperbandTuner::new(
                    &json!({"seed": seed, "R": MAX_BUDGET, "eta": 3, "optimize_mode": "minimize"}),
                )
                .expect("Hyperband"),
            )
        }),
        ("bohb", |seed| {
            Box::new(
                BohbTuner::new(&json!({"seed": seed, "min_budget": 1, "max_budget": MAX_BUDGET, "eta": 3, "optimize_mode": "minimize"}))
                    .expect("BOHB"),
            )
        }),
    ];
    println!(
        "multi-fidelity Hartmann-6 (B = {MAX_BUDGET}), {seeds} seeds: regret of the best configuration at the top budget reached, median [q25, q75]"
    );
    for total in TOTALS {
        println!("\ntotal budget {total} x B = {}", total * MAX_BUDGET);
        let mut random_median = f64::NAN;
        for (name, make) in &tuners {
            let started = std::time::Instant::now();
            let regrets: Vec<f64> = (0..seeds)
                .map(|seed| run(make(seed), total * MAX_BUDGET, seed))
                .collect();
            let (median, q25, q75) = quartiles(&regrets);
            if *name == "random" {
                random_median = median;
            }
            println!(
                "  {name:<17} {median:.4} [{q25:.4}, {q75:.4}]   / random {:.2}   ({:.1} s)",
                median / random_median,
                started.elapsed().as_secs_f64()
            );
        }
    }
}
