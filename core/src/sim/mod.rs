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
use crate::manager::{self, Command, LoopState, Outcome, Update};
use crate::store::{Store, StoreEvent};
use world::{mix, seconds, Ask, Shared, SimComponents, World};

/// One simulated experiment.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub seed: u64,
    pub environments: u32,
    /// Training services (1 to 3, platforms `sim`, `sim2`, `sim3`), each owning every n-th
    /// environment.
    pub services: u32,
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
    /// The service refuses to start a trial (its `start_trial` fails).
    pub p_start_fail: f64,
    /// The service reports an intermediate result twice (a retried delivery): the store keeps
    /// one, the manager warns and goes on.
    pub p_duplicate_metric: f64,
    /// A slow start takes up to this long.
    pub slow_start: Duration,
    /// How many times a host is lost, at random times, each for a time between these bounds.
    pub host_losses: u32,
    pub host_down: (Duration, Duration),
    /// The assessor stops a trial whose third or later intermediate result is below this.
    pub assessor_threshold: Option<f64>,
    /// The user stops the experiment then.
    pub stop_at: Option<Duration>,
    /// The manager is killed at the first quiet moment from then (it waits, everything it was
    /// told is recorded), and a new one resumes the experiment from its store, as `knob resume`
    /// does: the services end what is left of the runs, and the run goes on.
    pub crash_at: Option<Duration>,
    /// The crash waits, from `crash_at`, for a quiet moment at which a run the manager asked
    /// to kill is still alive: the manager decided the trial's end, and is killed before the
    /// end arrives.
    pub crash_while_killing: bool,
    /// The user kills each trial whose start the service will refuse late, before the refusal
    /// arrives (`knob trial kill` while a start over SSH is under way): the trial must end
    /// USER_CANCELED and never be started again, whatever the refusal says.
    pub user_kills_failing_starts: bool,
    /// The service never reports a run's end, its own or its kill's, with this chance (its
    /// report lost, a third-party service that sends none): the run is over, its GPUs free, and
    /// the manager hears nothing. Only a kill (`maxTrialDuration`, the assessor, a stop, the
    /// experiment's deadline) and the manager's patience after it end the trial then; without
    /// `maxTrialDuration` a trial whose own end was lost would run for ever.
    pub p_end_unreported: f64,
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
        let mut scenario = Scenario {
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
            services: 1,
            p_start_fail: 0.0,
            p_duplicate_metric: 0.0,
            crash_at: None,
            crash_while_killing: false,
            user_kills_failing_starts: false,
            p_end_unreported: 0.0,
        };
        // Drawn last, so that the fields above are what they were before these existed.
        if scenario.environments >= 2 && rng.gen_bool(0.3) {
            scenario.services = rng.gen_range(2..=scenario.environments.min(3));
        }
        if rng.gen_bool(0.25) {
            scenario.p_start_fail = rng.gen_range(0.0..0.2);
        }
        // Within the first half of the rough length, so that most crash while trials run.
        let crash_at =
            Duration::from_secs(rng.gen_range(1..(scenario.horizon().as_secs() / 2).max(2)));
        // A crash after a stop, or with a duration budget the resumed run counts on its own
        // clock, is not what this checks.
        if rng.gen_bool(0.25)
            && scenario.stop_at.is_none()
            && scenario.max_experiment_duration.is_none()
        {
            scenario.crash_at = Some(crash_at);
        }
        scenario
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
            services: 1,
            p_start_fail: 0.0,
            p_duplicate_metric: 0.0,
            crash_at: None,
            crash_while_killing: false,
            user_kills_failing_starts: false,
            p_end_unreported: 0.0,
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
            training_service: world::PLATFORMS[..self.services.clamp(1, 3) as usize]
                .iter()
                .map(|platform| TrainingServiceConfig::new(*platform, Default::default()))
                .collect(),
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
    /// What woke the loop, by cause (summed over the managers of a crashed and resumed run).
    pub wakes: manager::Wakes,
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
    /// CPU time of the thread that ran the manager (and the simulated world) until the run
    /// ended, before the checks; `None` where it cannot be read.
    pub run_thread_cpu: Option<Duration>,
    /// CPU time spent polling the manager's future (summed over the managers of a crashed and
    /// resumed run): the manager's own work, with the in-process tuner's, assessor's and
    /// services' side of each call it makes (which a plugin runs on a thread of its own), but
    /// not the simulated world's deliveries nor the driver's turns (`run_thread_cpu` has them),
    /// less the meter's own clock reads (`meter_cost`); `None` where the clock cannot be read.
    pub manager_cpu: Option<Duration>,
    /// What one pair of reads of the thread's CPU clock costs: the median of back-to-back
    /// pairs taken as the run starts and every few hundred polls during it, outside the polls.
    /// It is the meter's own cost, which each metered poll of the manager's future and each
    /// answer of the simulated service measured inside it would otherwise count as the
    /// manager's; `manager_cpu` (and `manager_start_cpu`) have it taken off, one pair per poll
    /// and per answer, and `meter_overhead` says how much that was in all. The clock is a system
    /// call that takes the run queue's lock (0.2–0.5 µs a pair on the 2-vCPU VM), and the polls
    /// grow with the loop's turns (4.8 a trial at 10 000 trials, 8.7 at 100 000; 23 and 49
    /// before the driver's own polls were kept off the manager, `idle_polls`), so left in, it
    /// weighed more the more turns a trial took.
    pub meter_cost: Option<Duration>,
    /// The polls of the manager's future that were metered, and the service's answers.
    pub metered_polls: u64,
    /// Polls of the run's task that the manager's future was not woken for (the driver's
    /// turns): not passed on to it (see `Metered::woken`), so neither metered nor counted.
    pub idle_polls: u64,
    pub service_answers: u64,
    /// The meter's cost taken off `manager_cpu`, in all.
    pub meter_overhead: Duration,
    /// Of `manager_cpu`, the CPU time the simulated training service spent answering the
    /// manager's calls (placing a run's happenings in the world, building its environments'
    /// reports): the service's side of the call, which a real plugin runs on a thread of its
    /// own, so the manager's own work is `manager_cpu` less this.
    pub service_cpu: Option<Duration>,
    /// Of `manager_cpu` less `service_cpu`, what the manager spent before its loop began (see
    /// [`LoopState::started`]): registering every environment, replaying a resumed history. A
    /// cost of the experiment and its environments, paid once (and again by each resume), not
    /// a trial's.
    pub manager_start_cpu: Option<Duration>,
    /// CPU time of the whole process (adding the store's writer and SQLite) until the run
    /// ended, before the checks.
    pub run_process_cpu: Option<Duration>,
    /// How many store events of each kind the run recorded.
    pub events_by_kind: std::collections::BTreeMap<&'static str, u64>,
    /// How many times a new manager resumed the experiment after the one before crashed.
    pub resumed: u32,
    /// Starts the simulated services refused.
    pub start_failures: u64,
    /// Starts asked for again after a late refusal that said nothing ran.
    pub retried_starts: u64,
    /// Trials the user killed (`Scenario::user_kills_failing_starts`).
    pub user_kills: u64,
    /// Runs left by a crashed manager that the resumed one's clean-up ended.
    pub crash_losses: u64,
    /// Runs whose end the service never reported (`Scenario::p_end_unreported`).
    pub ends_unreported: u64,
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
        wakes: Default::default(),
        max_event_batch: 0,
        peak_running: 0,
        store_bytes: 0,
        store_events: 0,
        replay_time: Duration::ZERO,
        run_peak_rss: None,
        run_thread_cpu: None,
        manager_cpu: None,
        meter_cost: None,
        metered_polls: 0,
        idle_polls: 0,
        service_answers: 0,
        meter_overhead: Duration::ZERO,
        service_cpu: None,
        manager_start_cpu: None,
        run_process_cpu: None,
        events_by_kind: Default::default(),
        resumed: 0,
        start_failures: 0,
        retried_starts: 0,
        user_kills: 0,
        crash_losses: 0,
        ends_unreported: 0,
    };
    let experiment_dir = dir.join("sim");
    if let Err(e) = std::fs::create_dir_all(&experiment_dir) {
        return report(Err(format!("{}: {e}", experiment_dir.display())), vec![]);
    }
    let config = scenario.config(&experiment_dir);
    let world = Shared::new(World::new(scenario.clone()));
    let components = SimComponents {
        world: world.clone(),
    };
    // Time moves only when the driver says so: a blocking task parked for the whole run keeps
    // tokio from moving the paused clock by itself while the manager waits for the store's
    // writer thread.
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let hold = tokio::task::spawn_blocking(move || {
        let _ = hold_rx.recv();
    });
    let mut crash_at = scenario.crash_at;
    let mut resumed = 0;
    let mut turns = 0;
    let mut wakes = manager::Wakes::default();
    let manager_cpu = std::cell::Cell::new(Some(Duration::ZERO));
    let manager_start_cpu = std::cell::Cell::new(Some(Duration::ZERO));
    let meter = Meter::default();
    meter.sample(2001);
    let outcome = loop {
        let store = match Store::open(&experiment_dir) {
            Ok(store) => store,
            Err(e) => break Err(format!("the store does not open: {e}")),
        };
        let history = if resumed == 0 {
            let created = store
                .append(StoreEvent::ExperimentCreated {
                    experiment_id: format!("sim{}", scenario.seed),
                    config: serde_json::to_value(&config).unwrap_or_default(),
                    start_time_ms: 0,
                })
                .await;
            if let Err(e) = created {
                break Err(e.to_string());
            }
            None
        } else {
            // As `knob resume` does: the experiment as its store recorded it.
            match store.replay() {
                Ok(state) => Some(state),
                Err(e) => break Err(format!("the store does not replay for the resume: {e}")),
            }
        };
        let experiment = manager::Experiment {
            id: format!("sim{}", scenario.seed),
            dir: experiment_dir.clone(),
            config: config.clone(),
            history,
            config_file: None,
        };
        let (commands_tx, commands) = mpsc::unbounded_channel();
        let (progress, _progress_rx) = watch::channel(manager::Progress::default());
        let (observer, loop_state) = watch::channel(LoopState::default());
        let observed = loop_state.clone();
        let run = Metered {
            inner: Box::pin(manager::run_observed(
                experiment,
                store,
                &components,
                commands,
                progress,
                Some(observer),
            )),
            spent: &manager_cpu,
            start: &manager_start_cpu,
            meter: &meter,
            loop_state: loop_state.clone(),
            world: world.clone(),
            woken: WokenFlag::new(),
        };
        let driven = tokio::select! {
            outcome = run => Ok(outcome.map_err(|e| e.to_string())),
            driven = drive(world.clone(), loop_state, commands_tx, crash_at) => Err(driven),
        };
        turns += observed.borrow().turn;
        wakes.add(&observed.borrow().wakes);
        match driven {
            Ok(outcome) => break outcome,
            // The manager's future is dropped where it waited, its store with it (the writer
            // commits what was queued and lets go of the database), as a killed process would.
            Err(Driven::Crash) => {
                crash_at = None;
                resumed += 1;
            }
            Err(Driven::Hung(why)) => break Err(why),
        }
    };
    drop(hold_tx);
    let _ = hold.await;
    let run_peak_rss = peak_rss();
    let (run_thread_cpu, run_process_cpu) = (
        cpu_time(libc::CLOCK_THREAD_CPUTIME_ID),
        cpu_time(libc::CLOCK_PROCESS_CPUTIME_ID),
    );
    let mut report = check::check(&scenario, &experiment_dir, &world, outcome);
    report.loop_turns = turns;
    report.wakes = wakes;
    report.run_peak_rss = run_peak_rss;
    report.run_thread_cpu = run_thread_cpu;
    report.run_process_cpu = run_process_cpu;
    let meter_cost = meter.cost();
    let taken_off = |cpu: Option<Duration>, pairs: u64| {
        Some(cpu?.saturating_sub(meter_cost?.saturating_mul(u32::try_from(pairs).ok()?)))
    };
    report.manager_cpu = taken_off(manager_cpu.get(), meter.pairs.get());
    report.manager_start_cpu = taken_off(manager_start_cpu.get(), meter.start_pairs.get());
    report.meter_cost = meter_cost;
    report.metered_polls = meter.polls.get();
    report.idle_polls = meter.idle_polls.get();
    report.service_answers = world.lock().service_answers;
    report.meter_overhead = match (manager_cpu.get(), report.manager_cpu) {
        (Some(metered), Some(less)) => metered.saturating_sub(less),
        _ => Duration::ZERO,
    };
    report.service_cpu = report
        .manager_cpu
        .and(Some(world.lock().service_cpu))
        .filter(|spent| !spent.is_zero());
    report.resumed = resumed;
    report
}

/// A future whose polls' CPU time (this thread's clock) is added to `spent`; `spent` becomes
/// `None` once the clock cannot be read.
struct Metered<'a, F> {
    inner: std::pin::Pin<Box<F>>,
    spent: &'a std::cell::Cell<Option<Duration>>,
    /// The manager's own CPU time (less the simulated service's side of its calls) in the
    /// polls that ended before it had started (see [`LoopState::started`]); the poll in which
    /// it started counts as the loop's.
    start: &'a std::cell::Cell<Option<Duration>>,
    loop_state: watch::Receiver<LoopState>,
    world: Shared,
    meter: &'a Meter,
    /// What the manager's future is polled with: it notes that the future was woken, then
    /// wakes the task. The driver shares the task (`play`'s `select!`), and a task woken for
    /// the driver polls every branch: without this, each of the driver's own turns (two
    /// yields for each of the loop's waits) polled the manager too, for nothing, and counted
    /// the cost as the manager's. A manager run by `knob` has a task of its own.
    woken: std::sync::Arc<WokenFlag>,
}

/// Whether the manager's future was woken since its last poll (see [`Metered::woken`]).
struct WokenFlag {
    woken: std::sync::atomic::AtomicBool,
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl WokenFlag {
    fn new() -> std::sync::Arc<WokenFlag> {
        std::sync::Arc::new(WokenFlag {
            // The first poll starts it.
            woken: std::sync::atomic::AtomicBool::new(true),
            task: std::sync::Mutex::new(None),
        })
    }
}

impl std::task::Wake for WokenFlag {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.woken.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(task) = self.task.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            task.wake_by_ref();
        }
    }
}

/// The meter's own cost (see `Report::meter_cost`): samples of it, and how many pairs of
/// clock reads it put inside the polls.
#[derive(Default)]
struct Meter {
    samples: std::cell::RefCell<Vec<Duration>>,
    polls: std::cell::Cell<u64>,
    /// A pair for each poll and each service answer; `start_pairs` before the loop began.
    pairs: std::cell::Cell<u64>,
    start_pairs: std::cell::Cell<u64>,
    /// Polls of the task that found the manager's future not woken, so not polled.
    idle_polls: std::cell::Cell<u64>,
}

/// Every this many polls the meter samples its cost again, so that the cost it takes off is
/// that of the whole run's conditions, not only its start's.
const METER_SAMPLE_EVERY: u64 = 256;

impl Meter {
    /// `count` back-to-back pairs of reads of this thread's CPU clock.
    fn sample(&self, count: usize) {
        let mut samples = self.samples.borrow_mut();
        for _ in 0..count {
            if let (Some(before), Some(after)) = (
                cpu_time(libc::CLOCK_THREAD_CPUTIME_ID),
                cpu_time(libc::CLOCK_THREAD_CPUTIME_ID),
            ) {
                samples.push(after.saturating_sub(before));
            }
        }
    }

    /// The median pair; `None` where the clock cannot be read.
    fn cost(&self) -> Option<Duration> {
        let mut samples = self.samples.borrow().clone();
        samples.sort_unstable();
        samples.get(samples.len() / 2).copied()
    }
}

impl<F: std::future::Future> std::future::Future for Metered<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        {
            let mut task = self.woken.task.lock().unwrap_or_else(|e| e.into_inner());
            if !task.as_ref().is_some_and(|t| t.will_wake(context.waker())) {
                *task = Some(context.waker().clone());
            }
        }
        if !self
            .woken
            .woken
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            let meter = self.meter;
            meter.idle_polls.set(meter.idle_polls.get() + 1);
            return std::task::Poll::Pending;
        }
        let waker = std::task::Waker::from(self.woken.clone());
        let mut context = std::task::Context::from_waker(&waker);
        let (service_before, answers_before) = {
            let world = self.world.lock();
            (world.service_cpu, world.service_answers)
        };
        let before = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
        let polled = self.inner.as_mut().poll(&mut context);
        let after = cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
        let (service, answers) = {
            let world = self.world.lock();
            (
                world.service_cpu.saturating_sub(service_before),
                world.service_answers - answers_before,
            )
        };
        // This poll's pair of reads and each answer's: taken off at the end (`Meter`).
        let starting = !self.loop_state.borrow().started;
        let meter = self.meter;
        meter.polls.set(meter.polls.get() + 1);
        meter.pairs.set(meter.pairs.get() + 1 + answers);
        if starting {
            meter.start_pairs.set(meter.start_pairs.get() + 1 + answers);
        }
        if meter.polls.get().is_multiple_of(METER_SAMPLE_EVERY) {
            meter.sample(8);
        }
        let add = |sum: Option<Duration>, less: Duration| match (sum, before, after) {
            (Some(sum), Some(before), Some(after)) => {
                Some(sum + after.saturating_sub(before).saturating_sub(less))
            }
            _ => None,
        };
        self.spent.set(add(self.spent.get(), Duration::ZERO));
        if starting {
            self.start.set(add(self.start.get(), service));
        }
        polled
    }
}

/// A CPU clock's time since it started (the calling thread's or the process's).
pub fn cpu_time(clock: libc::clockid_t) -> Option<Duration> {
    let mut time = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let rc = unsafe { libc::clock_gettime(clock, &mut time) };
    (rc == 0).then(|| Duration::new(time.tv_sec as u64, time.tv_nsec as u32))
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

/// Why the driver ended a manager's run.
enum Driven {
    /// The manager waits for nothing and the world has nothing more to say, or the time limit
    /// passed.
    Hung(String),
    /// `crash_at` came: the manager is to be killed now, while it waits.
    Crash,
}

/// Moves the simulation on while the manager waits. Returns only when the run hangs or the
/// manager is to crash (at the first quiet moment from `crash_at`).
async fn drive(
    world: Shared,
    mut loop_state: watch::Receiver<LoopState>,
    commands: mpsc::UnboundedSender<Command>,
    crash_at: Option<Duration>,
) -> Driven {
    let limit = world.lock().scenario.time_limit();
    let trace = std::env::var_os("KNOB_SIM_TRACE").is_some();
    loop {
        let state = settle(&mut loop_state, trace).await;
        if crash_at.is_some_and(|at| {
            let world = world.lock();
            world.now() >= at && (!world.scenario.crash_while_killing || world.killing_runs() > 0)
        }) {
            return Driven::Crash;
        }
        let (delivered, asks) = world.lock().deliver_due();
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
        for ask in asks {
            match ask {
                Ask::Stop => {
                    world.lock().stop_sent = true;
                    let _ = commands.send(Command::Stop);
                }
                Ask::KillTrial(trial_id) => {
                    world.lock().user_kills += 1;
                    // The answer (killed, or why not) is not waited for, as a user's
                    // `knob trial kill` does not hold the experiment.
                    let (answer, _) = tokio::sync::oneshot::channel();
                    let _ = commands.send(Command::Update(Update::KillTrial(trial_id), answer));
                }
            }
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
                return Driven::Hung(format!(
                    "hung at {}: the manager waits with no deadline, the world has nothing more to deliver ({running} runs live)",
                    seconds(now)
                ));
            }
        };
        // The crash comes at its time, whatever else is due later (one that waits for a kill
        // on its way, past its time, comes with the events that kill).
        let next = crash_at
            .filter(|&at| at > now)
            .map_or(next, |at| next.min(at));
        if next > limit {
            return Driven::Hung(format!(
                "did not finish within the simulated time limit {}",
                seconds(limit)
            ));
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
async fn settle(loop_state: &mut watch::Receiver<LoopState>, trace: bool) -> LoopState {
    loop {
        let before = *loop_state.borrow_and_update();
        if trace {
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
