//! Replays synthetic learning curves through each assessor and compares with running every
//! trial to the end: the share of epochs saved, and the change in the best final value found.
//!
//! `cargo bench -p knob-benches --bench assessor_replay` (release build; a few minutes, most of
//! it Curvefitting). `KNOB_REPLAY_SEEDS=N` sets the number of seeds (default 10),
//! `KNOB_REPLAY_VERBOSE=1` prints every seed, and `KNOB_REPLAY_RULE` / `KNOB_REPLAY_ARGS` replay
//! one rule with other classArgs.
//!
//! Each seed draws 200 trials of 50 epochs. A trial has a known final value (its noise-free
//! value at epoch 50, drawn as 0.3 + 0.6·u², so good trials are rare) and one of four curve
//! shapes, all starting near chance (0.05–0.15): exponential saturation, power law, slow
//! starters (a late sigmoid rise that crosses the others), and overfitting curves (an early
//! peak, then a decline to the final value). Every reported value gets Gaussian noise
//! (σ = 0.01). Trials run 8 at a time in arrival order: each tick every running trial reports
//! its next epoch and is judged on it; a stopped or finished trial frees its slot for the next.
//! The baseline runs all 200 to the end; its best final value is the best of all 200.
//!
//! The same replay runs a second time as a loss (1 − accuracy, minimized), with the classArgs
//! mirrored, to show both optimize modes decide alike. The header prints how well the value at
//! epoch 1, 5, 10 and 25 ranks the final values (Spearman): the curves are meant to be hard, with
//! learning speed independent of final quality.
//!
//! Target (issue 6): Medianstop and ASHA save ≥ 40 % of epochs with the best final value within
//! 2 % of the no-stopping run.

use std::time::{Duration, Instant};

use knob_assessors::{
    AshaAssessor, CurvefittingAssessor, MedianstopAssessor, PatienceAssessor, ThresholdAssessor,
};
use knob_plugin_api::{status, Assessor};
use serde_json::{json, Value};

const TRIALS: usize = 200;
const EPOCHS: usize = 50;
const CONCURRENCY: usize = 8;
const NOISE: f64 = 0.01;

/// One rule under test: its name, classArgs for accuracy (maximize) and for loss (minimize).
struct Rule {
    name: &'static str,
    maximize: Value,
    minimize: Value,
    targeted: bool,
}

/// `KNOB_REPLAY_RULE=ASHA KNOB_REPLAY_ARGS='{"min_resource": 3}'` replays one rule with other
/// classArgs (maximize only); otherwise the configurations below.
fn rules() -> Vec<Rule> {
    if let Ok(name) = std::env::var("KNOB_REPLAY_RULE") {
        let args = std::env::var("KNOB_REPLAY_ARGS").unwrap_or_else(|_| "{}".into());
        let maximize: Value = serde_json::from_str(&args).expect("KNOB_REPLAY_ARGS is JSON");
        return vec![Rule {
            name: Box::leak(name.into_boxed_str()),
            maximize,
            minimize: Value::Null,
            targeted: true,
        }];
    }
    let mirror = |args: Value| {
        let mut args = args;
        args["optimize_mode"] = json!("minimize");
        args
    };
    let both = |name, args: Value, targeted| Rule {
        name,
        minimize: mirror(args.clone()),
        maximize: args,
        targeted,
    };
    vec![
        // NNI's default (start_step 0), then judging from 20 % and 30 % of the budget on.
        both("Medianstop", json!({}), true),
        both("Medianstop", json!({"start_step": 10}), true),
        both("Medianstop", json!({"start_step": 15}), true),
        // Optuna's and Ray Tune's defaults (eta 4 from step 1), then rungs at 5, 15, 45.
        both("ASHA", json!({}), true),
        both(
            "ASHA",
            json!({"reduction_factor": 3, "min_resource": 5, "max_resource": 50}),
            true,
        ),
        // NNI's defaults with epoch_num = the budget.
        both("Curvefitting", json!({"epoch_num": 50}), false),
        Rule {
            name: "Threshold",
            maximize: json!({"lower": 0.25, "n_warmup_steps": 15}),
            minimize: json!({"upper": 0.75, "n_warmup_steps": 15}),
            targeted: false,
        },
        both("Patience", json!({"patience": 8}), false),
    ]
}

fn build(name: &str, class_args: &Value) -> Box<dyn FnMut(Call) -> bool> {
    fn boxed<A: Assessor>(class_args: &Value) -> Box<dyn FnMut(Call) -> bool> {
        let mut assessor =
            A::new(class_args).unwrap_or_else(|e| panic!("bench classArgs rejected: {e}"));
        Box::new(move |call| match call {
            Call::Assess(trial, history) => {
                assessor
                    .assess_trial(trial, history)
                    .expect("assess_trial")
                    .keep_going
            }
            Call::End(trial, trial_status) => {
                assessor.trial_end(trial, trial_status).expect("trial_end");
                true
            }
        })
    }
    match name {
        "Medianstop" => boxed::<MedianstopAssessor>(class_args),
        "ASHA" => boxed::<AshaAssessor>(class_args),
        "Curvefitting" => boxed::<CurvefittingAssessor>(class_args),
        "Threshold" => boxed::<ThresholdAssessor>(class_args),
        "Patience" => boxed::<PatienceAssessor>(class_args),
        other => panic!("no assessor {other}"),
    }
}

enum Call<'a> {
    Assess(&'a str, &'a [f64]),
    End(&'a str, &'a str),
}

/// A synthetic trial: what it reports each epoch (noisy) and its true final value.
struct Trial {
    reported: Vec<f64>,
    final_value: f64,
    shape: &'static str,
}

fn main() {
    let seeds: u64 = std::env::var("KNOB_REPLAY_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let verbose = std::env::var_os("KNOB_REPLAY_VERBOSE").is_some();
    println!(
        "assessor_replay: {TRIALS} trials x {EPOCHS} epochs, {CONCURRENCY} at a time, \
         noise sigma {NOISE}, seeds 1..={seeds}"
    );
    let correlations: Vec<String> = [1, 5, 10, 25]
        .iter()
        .map(|&epoch| {
            let mean = (1..=seeds)
                .map(|seed| rank_correlation_with_final(&synthetic_trials(seed, false), epoch))
                .sum::<f64>()
                / seeds as f64;
            format!("epoch {epoch}: {mean:.2}")
        })
        .collect();
    println!(
        "how well a trial's reported value ranks its final value (Spearman, mean over seeds): {}",
        correlations.join(", ")
    );
    println!(
        "target (Medianstop, ASHA): >= 40 % of epochs saved, best final within 2 % of running \
         every trial to the end; a seed is on target when both hold\n"
    );
    for rule in rules() {
        let target = if rule.targeted {
            "   (target applies)"
        } else {
            ""
        };
        println!("{} {}{target}", rule.name, rule.maximize);
        for (mode, class_args) in [("maximize", &rule.maximize), ("minimize", &rule.minimize)] {
            if class_args.is_null() {
                continue;
            }
            let mut runs = Vec::new();
            let (mut calls, mut elapsed) = (0u64, Duration::ZERO);
            for seed in 1..=seeds {
                let trials = synthetic_trials(seed, mode == "minimize");
                let outcome = replay(&trials, build(rule.name, class_args));
                calls += outcome.calls;
                elapsed += outcome.elapsed;
                runs.push(SeedResult::new(&trials, &outcome, mode == "minimize"));
            }
            let n = runs.len() as f64;
            let mean = |f: fn(&SeedResult) -> f64| runs.iter().map(f).sum::<f64>() / n;
            let least =
                |f: fn(&SeedResult) -> f64| runs.iter().map(f).fold(f64::INFINITY, f64::min);
            let on_target = runs
                .iter()
                .filter(|r| r.saved >= 0.40 && r.change >= -0.02)
                .count();
            println!(
                "  {mode:<9} saved {:>5.1} % (min {:>5.1})   best {:>+6.2} % (worst {:>+6.2})   \
                 on target {on_target:>2}/{seeds} seeds   {:>5.1} stopped/run   {:>7.1} us/call",
                mean(|r| r.saved) * 100.0,
                least(|r| r.saved) * 100.0,
                mean(|r| r.change) * 100.0,
                least(|r| r.change) * 100.0,
                mean(|r| r.stopped as f64),
                elapsed.as_secs_f64() * 1e6 / calls.max(1) as f64,
            );
            if verbose {
                for (seed, run) in runs.iter().enumerate() {
                    println!("      seed {}: {}", seed + 1, run.describe());
                }
            }
        }
    }
    println!(
        "\nsaved: share of the {} epochs of the no-stopping run not run (mean over seeds, and the \
         least); best: relative change of the best final value among trials that ran to the end \
         (for losses, of 1 - loss); stopped: trials stopped per run of {TRIALS}.",
        TRIALS * EPOCHS
    );
}

/// What one seed's replay came to, against running every trial to the end.
struct SeedResult {
    saved: f64,
    change: f64,
    stopped: usize,
    best_found: f64,
    best_all: f64,
    /// Where the best trial of all was stopped, if it was.
    lost_best: Option<String>,
}

impl SeedResult {
    fn new(trials: &[Trial], outcome: &Outcome, as_loss: bool) -> SeedResult {
        let better = |a: f64, b: f64| if as_loss { a < b } else { a > b };
        let best_of = |keep: &dyn Fn(usize) -> bool| {
            (0..trials.len())
                .filter(|&i| keep(i))
                .reduce(|best, i| {
                    if better(trials[i].final_value, trials[best].final_value) {
                        i
                    } else {
                        best
                    }
                })
                .expect("at least one trial")
        };
        let best_all = best_of(&|_| true);
        let best_found = best_of(&|i| outcome.finished[i]);
        // Relative to the accuracy scale, so a loss and its accuracy give the same change.
        let accuracy = |v: f64| if as_loss { 1.0 - v } else { v };
        let (found, all) = (trials[best_found].final_value, trials[best_all].final_value);
        SeedResult {
            saved: 1.0 - outcome.epochs_run as f64 / (TRIALS * EPOCHS) as f64,
            change: (accuracy(found) - accuracy(all)) / accuracy(all),
            stopped: outcome.finished.iter().filter(|f| !**f).count(),
            best_found: found,
            best_all: all,
            lost_best: (!outcome.finished[best_all]).then(|| {
                format!(
                    "the best trial (#{best_all}, {}) was stopped at epoch {}",
                    trials[best_all].shape, outcome.epochs[best_all]
                )
            }),
        }
    }

    fn describe(&self) -> String {
        format!(
            "saved {:.1} %, best {:.3} of {:.3} ({:+.2} %){}",
            self.saved * 100.0,
            self.best_found,
            self.best_all,
            self.change * 100.0,
            self.lost_best
                .as_ref()
                .map(|l| format!("; {l}"))
                .unwrap_or_default()
        )
    }
}

/// Spearman's rank correlation between the values reported at `epoch` and the final values.
fn rank_correlation_with_final(trials: &[Trial], epoch: usize) -> f64 {
    fn ranks(values: &[f64]) -> Vec<f64> {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let mut ranks = vec![0.0; values.len()];
        for (rank, &i) in order.iter().enumerate() {
            ranks[i] = rank as f64;
        }
        ranks
    }
    let early = ranks(
        &trials
            .iter()
            .map(|t| t.reported[epoch - 1])
            .collect::<Vec<_>>(),
    );
    let last = ranks(&trials.iter().map(|t| t.final_value).collect::<Vec<_>>());
    let n = trials.len() as f64;
    let squared: f64 = early.iter().zip(&last).map(|(a, b)| (a - b).powi(2)).sum();
    1.0 - 6.0 * squared / (n * (n * n - 1.0))
}

struct Outcome {
    epochs_run: usize,
    /// Per trial: ran to the end (true) or was stopped.
    finished: Vec<bool>,
    /// Per trial: the epochs it ran.
    epochs: Vec<usize>,
    calls: u64,
    elapsed: Duration,
}

/// Runs the trials through the assessor, `CONCURRENCY` at a time, in arrival order.
fn replay(trials: &[Trial], mut assessor: Box<dyn FnMut(Call) -> bool>) -> Outcome {
    let ids: Vec<String> = (0..trials.len()).map(|i| format!("trial-{i}")).collect();
    let mut finished = vec![false; trials.len()];
    let mut epochs = vec![0; trials.len()];
    let mut running: Vec<(usize, usize)> = Vec::new(); // (trial, epochs reported)
    let mut next = 0;
    let (mut epochs_run, mut calls, mut elapsed) = (0, 0u64, Duration::ZERO);
    while next < trials.len() || !running.is_empty() {
        while running.len() < CONCURRENCY && next < trials.len() {
            running.push((next, 0));
            next += 1;
        }
        let mut still_running = Vec::with_capacity(running.len());
        for (trial, reported) in running.drain(..) {
            let reported = reported + 1;
            epochs_run += 1;
            epochs[trial] = reported;
            let history = &trials[trial].reported[..reported];
            let started = Instant::now();
            let keep_going = assessor(Call::Assess(&ids[trial], history));
            elapsed += started.elapsed();
            calls += 1;
            if !keep_going {
                assessor(Call::End(&ids[trial], status::EARLY_STOPPED));
            } else if reported == EPOCHS {
                finished[trial] = true;
                assessor(Call::End(&ids[trial], status::SUCCEEDED));
            } else {
                still_running.push((trial, reported));
            }
        }
        running = still_running;
    }
    Outcome {
        epochs_run,
        finished,
        epochs,
        calls,
        elapsed,
    }
}

/// 200 seeded trials; as losses (1 − accuracy) when `as_loss`, from the same draws.
fn synthetic_trials(seed: u64, as_loss: bool) -> Vec<Trial> {
    let mut rng = SplitMix64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA55A);
    (0..TRIALS)
        .map(|_| {
            let final_value = 0.3 + 0.6 * rng.uniform().powi(2);
            let start = 0.05 + 0.1 * rng.uniform();
            let shape = rng.uniform();
            let family = match shape {
                s if s < 0.35 => "exponential",
                s if s < 0.65 => "power law",
                s if s < 0.85 => "slow starter",
                _ => "overfitting",
            };
            let curve: Box<dyn Fn(f64) -> f64> = if shape < 0.35 {
                // Exponential saturation, normalised to reach `final_value` at the last epoch.
                let rate = 0.05 + 0.25 * rng.uniform();
                let reach = 1.0 - (-rate * EPOCHS as f64).exp();
                Box::new(move |t| start + (final_value - start) * (1.0 - (-rate * t).exp()) / reach)
            } else if shape < 0.65 {
                // Power law from `start` at epoch 1.
                let alpha = 0.3 + 0.7 * rng.uniform();
                let span = 1.0 - (EPOCHS as f64).powf(-alpha);
                Box::new(move |t| {
                    final_value
                        - (final_value - start) * (t.powf(-alpha) - (EPOCHS as f64).powf(-alpha))
                            / span
                })
            } else if shape < 0.85 {
                // Slow starter: flat near chance, then a sigmoid rise centred at epoch 10–25.
                let centre = 10.0 + 15.0 * rng.uniform();
                let width = 2.0 + 4.0 * rng.uniform();
                let sigmoid = move |t: f64| 1.0 / (1.0 + (-(t - centre) / width).exp());
                let (low, high) = (sigmoid(1.0), sigmoid(EPOCHS as f64));
                Box::new(move |t| start + (final_value - start) * (sigmoid(t) - low) / (high - low))
            } else {
                // Overfitting: a fast rise to a peak above the final value, then a decline.
                let peak_epoch = 8.0 + 12.0 * rng.uniform();
                let peak = final_value + 0.03 + 0.07 * rng.uniform();
                Box::new(move |t| {
                    if t <= peak_epoch {
                        start
                            + (peak - start) * (1.0 - (-(4.0 * t / peak_epoch)).exp())
                                / (1.0 - (-4.0f64).exp())
                    } else {
                        peak - (peak - final_value) * (t - peak_epoch)
                            / (EPOCHS as f64 - peak_epoch)
                    }
                })
            };
            let reported: Vec<f64> = (1..=EPOCHS)
                .map(|t| curve(t as f64) + NOISE * rng.normal())
                .collect();
            if as_loss {
                Trial {
                    reported: reported.iter().map(|v| 1.0 - v).collect(),
                    final_value: 1.0 - final_value,
                    shape: family,
                }
            } else {
                Trial {
                    reported,
                    final_value,
                    shape: family,
                }
            }
        })
        .collect()
}

/// SplitMix64: a small, fast, seedable generator; the bench needs reproducible draws, not
/// cryptographic ones.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f64 {
        let u = 1.0 - self.uniform();
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}
