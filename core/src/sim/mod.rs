//! A deterministic simulator of whole experiments (feature `sim`): the real manager, store and
//! gpu-sched, driven by an in-process tuner, assessor and training service (the SDK's traits,
//! behind the same handles as plugins: `knob_plugin_api::host::in_process`) on tokio's paused
//! clock, so that a simulated week takes seconds and every run of a seed is the same run.
//!
//! A [`Scenario`] is data: environments with GPUs, trial durations from a distribution, failures,
//! out-of-memory kills, hosts lost and back, slow starts, budgets, retries, an assessor that stops
//! some trials, a user's stop. [`run`] plays it and checks the invariants ([`Report::violations`]):
//! every trial accounted for exactly once per attempt; no GPU held twice; no trial starves;
//! `trialConcurrency`, `maxTrialNumber`, `maxTrialRetries`, `maxTrialDuration` and
//! `maxExperimentDuration` hold; the store replays to the state the manager ended with, and its
//! tables agree with the replay.
//!
//! Time moves only while the manager's loop waits with nothing to do
//! ([`crate::manager::LoopState`]): then the world delivers what is due now, or the clock jumps
//! to whichever comes first, the world's next happening or the manager's next deadline.

mod check;
mod world;

use std::path::Path;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::sync::{mpsc, watch};

use crate::config::{
    AlgorithmConfig, ExperimentConfig, LogLevel, PlacementPolicy, TrainingServiceConfig,
    TunerErrorPolicy,
};
use crate::manager::{self, Command, LoopState, Outcome};
use crate::store::{Store, StoreEvent};
use world::{mix, seconds, Shared, SimComponents, World};

/// One simulated experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub seed: u64,
    pub environments: u32,
    pub gpus_per_environment: u32,
    /// GPUs each trial needs (at least 1).
    pub trial_gpu_number: u32,
    pub trial_concurrency: u32,
    pub max_trial_number: u64,
    /// The tuner says NoMore after this many parameter sets.
    pub tuner_budget: Option<u64>,
    pub max_trial_retries: u32,
    pub max_oom_retries: u32,
    pub max_trial_duration: Option<Duration>,
    pub max_experiment_duration: Option<Duration>,
    /// A trial's length is log-uniform between these.
    pub duration: (Duration, Duration),
    /// How often a trial reports an intermediate result (zero: never).
    pub intermediate_every: Duration,
    pub p_fail: f64,
    pub p_oom: f64,
    pub p_slow_start: f64,
    /// A slow start takes up to this long.
    pub slow_start: Duration,
    /// How many times a host is lost, at random times, each for a time between these bounds.
    pub host_losses: u32,
    pub host_down: (Duration, Duration),
    /// The assessor stops a trial whose third or later intermediate result is below this.
    pub assessor_threshold: Option<f64>,
    /// The user stops the experiment then.
    pub stop_at: Option<Duration>,
}

impl Scenario {
    /// A small random scenario: a few environments of a few GPUs, tens of trials, and a little
    /// of everything that can go wrong.
    pub fn small(seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(mix(seed, 0x5ce2, 0));
        let environments = rng.gen_range(1..=4);
        let gpus_per_environment = rng.gen_range(1..=4);
        let trial_gpu_number = if gpus_per_environment >= 2 && rng.gen_bool(0.25) {
            2
        } else {
            1
        };
        let slots = environments * gpus_per_environment / trial_gpu_number;
        let short = Duration::from_secs(rng.gen_range(5..60));
        let long = short * rng.gen_range(1..20);
        Scenario {
            seed,
            environments,
            gpus_per_environment,
            trial_gpu_number,
            // Sometimes more than fits, so trials wait for GPUs.
            trial_concurrency: rng.gen_range(1..=slots + 2),
            max_trial_number: rng.gen_range(5..40),
            tuner_budget: rng.gen_bool(0.2).then(|| rng.gen_range(3..30)),
            max_trial_retries: rng.gen_range(0..3),
            max_oom_retries: rng.gen_range(0..2),
            max_trial_duration: rng
                .gen_bool(0.3)
                .then(|| Duration::from_secs(rng.gen_range(10..600))),
            max_experiment_duration: rng
                .gen_bool(0.2)
                .then(|| Duration::from_secs(rng.gen_range(60..3600))),
            duration: (short, long),
            intermediate_every: Duration::from_secs(rng.gen_range(0..20)),
            p_fail: rng.gen_range(0.0..0.3),
            p_oom: rng.gen_range(0.0..0.15),
            p_slow_start: rng.gen_range(0.0..0.3),
            slow_start: Duration::from_secs(rng.gen_range(1..120)),
            host_losses: if rng.gen_bool(0.4) {
                rng.gen_range(1..4)
            } else {
                0
            },
            host_down: (Duration::from_secs(5), Duration::from_secs(300)),
            assessor_threshold: rng.gen_bool(0.4).then(|| rng.gen_range(0.5..0.8)),
            stop_at: rng
                .gen_bool(0.1)
                .then(|| Duration::from_secs(rng.gen_range(1..1200))),
        }
    }

    /// A large calm scenario for the bench: `environments` of `gpus` GPUs each, every GPU busy,
    /// `trials` trials of 10 minutes to 2 hours, a few failures and one host lost per 100
    /// environments.
    pub fn large(seed: u64, trials: u64, environments: u32, gpus: u32) -> Scenario {
        Scenario {
            seed,
            environments,
            gpus_per_environment: gpus,
            trial_gpu_number: 1,
            trial_concurrency: environments * gpus,
            max_trial_number: trials,
            tuner_budget: None,
            max_trial_retries: 1,
            max_oom_retries: 1,
            max_trial_duration: None,
            max_experiment_duration: None,
            duration: (Duration::from_secs(600), Duration::from_secs(7200)),
            intermediate_every: Duration::from_secs(600),
            p_fail: 0.02,
            p_oom: 0.01,
            p_slow_start: 0.05,
            slow_start: Duration::from_secs(60),
            host_losses: environments / 100,
            host_down: (Duration::from_secs(60), Duration::from_secs(1800)),
            assessor_threshold: None,
            stop_at: None,
        }
    }

    /// Roughly how long the experiment runs: host losses fall within it.
    fn horizon(&self) -> Duration {
        let slots = u64::from(
            (self.environments * self.gpus_per_environment / self.trial_gpu_number.max(1))
                .clamp(1, self.trial_concurrency.max(1)),
        );
        let rounds = self.max_trial_number.div_ceil(slots).max(1);
        let mean = (self.duration.0 + self.duration.1) / 2;
        (mean * rounds.min(u64::from(u32::MAX)) as u32).max(Duration::from_secs(1))
    }

    /// Simulated time after which the run counts as hung.
    fn time_limit(&self) -> Duration {
        self.horizon() * 20 + self.host_down.1 * self.host_losses + Duration::from_secs(3600)
    }

    fn config(&self, dir: &Path) -> ExperimentConfig {
        let algorithm = |name: &str, args: serde_json::Value| AlgorithmConfig {
            name: Some(name.to_string()),
            class_name: None,
            code_directory: None,
            class_args: args.as_object().cloned().unwrap_or_default(),
            python_interpreter: None,
            use_nni_implementation: false,
            dispatcher_connect_timeout: None,
        };
        ExperimentConfig {
            experiment_name: Some(format!("sim-{}", self.seed)),
            trial_command: "simulated".into(),
            trial_code_directory: dir.to_path_buf(),
            trial_concurrency: self.trial_concurrency,
            trial_gpu_number: Some(self.trial_gpu_number),
            trial_gpu_memory_mib: None,
            trial_memory_size_mib: None,
            trial_cpu_number: None,
            max_experiment_duration: self.max_experiment_duration,
            max_trial_number: Some(self.max_trial_number),
            max_trial_duration: self.max_trial_duration,
            max_trial_retries: self.max_trial_retries,
            max_oom_retries: self.max_oom_retries,
            nni_shim: None,
            debug: false,
            log_level: LogLevel::Info,
            experiment_working_directory: dir.to_path_buf(),
            tuner_gpu_indices: None,
            tuner: algorithm(
                world::TUNER,
                json!({"seed": self.seed, "budget": self.tuner_budget, "optimize_mode": "maximize"}),
            ),
            assessor: self
                .assessor_threshold
                .map(|threshold| algorithm(world::ASSESSOR, json!({ "threshold": threshold }))),
            training_service: vec![TrainingServiceConfig::new(
                world::PLATFORM,
                Default::default(),
            )],
            placement_policy: PlacementPolicy::default(),
            tuner_error_policy: TunerErrorPolicy::default(),
            plugin_paths: Vec::new(),
            objectives: Vec::new(),
            search_space: json!({"x": {"_type": "uniform", "_value": [0.0, 1.0]}}),
            notifications: None,
        }
    }
}

/// What a run of a scenario did and found.
#[derive(Debug)]
pub struct Report {
    pub scenario: Scenario,
    /// How the manager ended (`Err`: it could not start, or the run hung and was cut short).
    pub outcome: Result<Outcome, String>,
    /// Broken invariants, one line each; empty when the run is sound.
    pub violations: Vec<String>,
    /// Simulated time the experiment took.
    pub simulated: Duration,
    pub trials: u64,
    pub attempts: u64,
    /// Service events the world delivered.
    pub service_events: u64,
    /// Turns of the manager's loop (each a wait for something to happen).
    pub loop_turns: u64,
    /// The most service events that reached the manager at once (its event queue's length).
    pub max_event_batch: u64,
    /// The most trials running at once.
    pub peak_running: usize,
    /// The store's files (database, WAL) at the end, in bytes.
    pub store_bytes: u64,
    pub store_events: u64,
    /// Wall time to replay the store.
    pub replay_time: Duration,
    /// The process's peak resident memory (bytes, Linux `VmHWM`) when the run ended, before
    /// the checks, which read the whole log and replay it; `None` where it cannot be read.
    pub run_peak_rss: Option<u64>,
}

impl Report {
    /// The line that reruns this seed.
    pub fn rerun_hint(&self) -> String {
        format!(
            "KNOB_SIM_SEED={} cargo test -p knob-core --test it sim::",
            self.scenario.seed
        )
    }
}

/// Plays `scenario` with its store in `dir` (which must be empty or missing) on a
/// current-thread runtime whose clock is paused, then checks the invariants.
pub fn run(scenario: &Scenario, dir: &Path) -> Report {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    runtime.block_on(play(scenario.clone(), dir))
}

async fn play(scenario: Scenario, dir: &Path) -> Report {
    let report = |outcome: Result<Outcome, String>, violations| Report {
        scenario: scenario.clone(),
        outcome,
        violations,
        simulated: Duration::ZERO,
        trials: 0,
        attempts: 0,
        service_events: 0,
        loop_turns: 0,
        max_event_batch: 0,
        peak_running: 0,
        store_bytes: 0,
        store_events: 0,
        replay_time: Duration::ZERO,
        run_peak_rss: None,
    };
    let experiment_dir = dir.join("sim");
    if let Err(e) = std::fs::create_dir_all(&experiment_dir) {
        return report(Err(format!("{}: {e}", experiment_dir.display())), vec![]);
    }
    let config = scenario.config(&experiment_dir);
    let store = match Store::open(&experiment_dir) {
        Ok(store) => store,
        Err(e) => return report(Err(e.to_string()), vec![]),
    };
    let created = store
        .append(StoreEvent::ExperimentCreated {
            experiment_id: format!("sim{}", scenario.seed),
            config: serde_json::to_value(&config).unwrap_or_default(),
            start_time_ms: 0,
        })
        .await;
    if let Err(e) = created {
        return report(Err(e.to_string()), vec![]);
    }
    let world = Shared::new(World::new(scenario.clone()));
    let components = SimComponents {
        world: world.clone(),
    };
    let experiment = manager::Experiment {
        id: format!("sim{}", scenario.seed),
        dir: experiment_dir.clone(),
        config,
        history: None,
        config_file: None,
    };
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (progress, _progress_rx) = watch::channel(manager::Progress::default());
    let (observer, loop_state) = watch::channel(LoopState::default());
    let turns = loop_state.clone();
    // Time moves only when the driver says so: a blocking task parked for the whole run keeps
    // tokio from moving the paused clock by itself while the manager waits for the store's
    // writer thread.
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let hold = tokio::task::spawn_blocking(move || {
        let _ = hold_rx.recv();
    });
    let run = manager::run_observed(
        experiment,
        store,
        &components,
        commands,
        progress,
        Some(observer),
    );
    let outcome = tokio::select! {
        outcome = run => outcome.map_err(|e| e.to_string()),
        hung = drive(world.clone(), loop_state, commands_tx) => Err(hung),
    };
    drop(hold_tx);
    let _ = hold.await;
    let run_peak_rss = peak_rss();
    let mut report = check::check(&scenario, &experiment_dir, &world, outcome);
    report.loop_turns = turns.borrow().turn;
    report.run_peak_rss = run_peak_rss;
    report
}

/// This process's peak resident memory so far (`VmHWM` of `/proc/self/status`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Moves the simulation on while the manager waits. Returns only when the run hangs: the
/// manager waits for nothing and the world has nothing more to say, or the time limit passed.
async fn drive(
    world: Shared,
    mut loop_state: watch::Receiver<LoopState>,
    commands: mpsc::UnboundedSender<Command>,
) -> String {
    let limit = world.lock().scenario.time_limit();
    let trace = std::env::var_os("KNOB_SIM_TRACE").is_some();
    loop {
        let state = settle(&mut loop_state).await;
        let (delivered, stop) = world.lock().deliver_due();
        if trace {
            let world = world.lock();
            eprintln!(
                "sim {}: loop turn {} waits (deadline {:?}); delivered {delivered}, next {:?}, {} live",
                seconds(world.now()),
                state.turn,
                state.next_deadline.map(|d| d.saturating_duration_since(world.started)),
                world.next_time(),
                world.live_runs()
            );
        }
        if stop {
            world.lock().stop_sent = true;
            let _ = commands.send(Command::Stop);
        }
        if delivered > 0 {
            continue;
        }
        let (now, next_world) = {
            let world = world.lock();
            (world.now(), world.next_time())
        };
        let start = world.lock().started;
        let next_manager = state
            .next_deadline
            .map(|deadline| deadline.saturating_duration_since(start));
        let next = match (next_world, next_manager) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => {
                let running = world.lock().live_runs();
                return format!(
                    "hung at {}: the manager waits with no deadline, the world has nothing more to deliver ({running} runs live)",
                    seconds(now)
                );
            }
        };
        if next > limit {
            return format!(
                "did not finish within the simulated time limit {}",
                seconds(limit)
            );
        }
        // Timers have millisecond resolution: a deadline within the current millisecond fires
        // only once the clock has passed it.
        let step = next.saturating_sub(now).max(Duration::from_millis(1));
        tokio::time::advance(step).await;
        tokio::task::yield_now().await;
    }
}

/// Waits until the manager's loop waits with nothing left to do: it says it waits, and it still
/// does after everything else that was ready has run.
async fn settle(loop_state: &mut watch::Receiver<LoopState>) -> LoopState {
    loop {
        let before = *loop_state.borrow_and_update();
        if std::env::var_os("KNOB_SIM_TRACE").is_some() {
            eprintln!("settle: {before:?}");
        }
        if !before.waiting {
            if loop_state.changed().await.is_err() {
                // The manager is gone; the run's end wins the race in `play`.
                std::future::pending::<()>().await;
            }
            continue;
        }
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let after = *loop_state.borrow();
        if after == before {
            return after;
        }
    }
}
