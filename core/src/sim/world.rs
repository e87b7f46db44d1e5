//! The simulated world: environments with GPUs, trials that run for a while and then succeed,
//! fail, run out of memory or lose their host, and the components the manager sees (a training
//! service, a tuner, an assessor) built on the SDK's traits.
//!
//! Nothing here happens by itself: the training service only records what the manager asks, and
//! the driver (`super::drive`) delivers the world's timed events (a trial's start, metrics and
//! end, a host lost or back) while the manager waits, so that every run of a seed is the same.

use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use knob_gpu_sched::{ByteSize, EnvironmentStatus, Gpu, HostResources};
use knob_plugin_api::host::{
    in_process, AssessorHandle, HostError, TrainingServiceHandle, TunerHandle,
};
use knob_plugin_api::service::{
    Environment, EnvironmentChanges, MetricKind, ServiceContext, ServiceEvent, TrialRequest,
};
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{
    Assessor, AssessorContext, ComponentKind, EventSink, Generated, PluginError, TrainingService,
    Tuner, Verdict,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::Scenario;
use crate::manager::{Components, EventCallback};

/// The world shared by the simulated components and the driver.
#[derive(Clone)]
pub(super) struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub fn new(world: World) -> Shared {
        Shared(Arc::new(Mutex::new(world)))
    }

    pub fn lock(&self) -> MutexGuard<'_, World> {
        // A panic while it was held already failed the run; what is left is still readable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One run of a trial on an environment: what the service was asked to start. Runs are
/// numbered in the world, so that the events of one killed or lost are dropped.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub trial_id: String,
    pub environment: usize,
    pub gpus: Vec<u32>,
    /// When its start was delivered.
    pub started_at: Option<Duration>,
    /// Asked to die; only its kill's end is delivered.
    pub killing: bool,
}

/// What happens at a time.
#[derive(Debug, Clone)]
enum Happening {
    Started {
        run: u64,
    },
    Metric {
        run: u64,
        kind: MetricKind,
        sequence: u64,
        value: f64,
    },
    Ended {
        run: u64,
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
        killed: bool,
    },
    /// A start the service accepted failed.
    StartFailed {
        environment: usize,
        trial_id: String,
        message: String,
    },
    HostDown {
        environment: usize,
    },
    HostBack {
        environment: usize,
    },
    /// The user stops the experiment.
    Stop,
    /// The user kills one trial (`knob trial kill`).
    UserKill {
        trial_id: String,
    },
}

/// What the user asks of the manager at a happening's time (the driver sends it).
pub(super) enum Ask {
    Stop,
    KillTrial(String),
}

/// A happening at a time, in the order it was scheduled among those at the same time.
#[derive(Debug, Clone)]
struct Timed {
    at: Duration,
    order: u64,
    what: Happening,
}

impl PartialEq for Timed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Timed {}
impl PartialOrd for Timed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timed {
    /// Reversed: `BinaryHeap` pops the earliest first.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.order).cmp(&(self.at, self.order))
    }
}

/// What the world saw of one trial, for the invariants.
#[derive(Debug, Clone, Default)]
pub(super) struct TrialRecord {
    pub sequence: u64,
    /// Start requests (placements handed to the service).
    pub requests: u32,
    /// Starts delivered (attempts the manager should have recorded).
    pub starts: u32,
    pub ooms: u32,
    pub host_losses: u32,
    /// Host losses of runs that had started (each an attempt the store records as requeued).
    pub lost_after_start: u32,
    /// Starts the service refused (the manager tries the trial again, a few times).
    pub start_failures: u32,
    /// The last start failed, late, saying nothing ran (the manager should ask again).
    pub awaits_retry: bool,
    /// Starts asked for again after such a failure.
    pub retried_starts: u32,
    /// The user killed it (see `Scenario::user_kills_failing_starts`): it must end
    /// USER_CANCELED and never start after.
    pub killed_by_user: bool,
    /// Runs left over from a manager that crashed, ended by the resumed one's clean-up.
    pub crash_losses: u32,
    /// Of those, runs that had started (each an attempt the resumed manager requeues).
    pub crash_lost_after_start: u32,
    /// When it was first asked for, and the longest it waited for a start after a younger
    /// trial's start had been asked for (see `Invariants`).
    pub first_request: Option<Duration>,
    /// Runs whose end the service never reported (`Scenario::p_end_unreported`).
    pub ends_unreported: u32,
}

pub(super) struct World {
    pub scenario: Scenario,
    pub started: Instant,
    queue: BinaryHeap<Timed>,
    order: u64,
    pub environment_up: Vec<bool>,
    /// Each environment as its service reports it while up (the same every time: made once,
    /// not for each re-probe). A lost one's report is made when asked for: few are down at once,
    /// and a second copy of every report took 15 MiB more at 1 000 environments (`sim_scale`).
    reports: Vec<Environment>,
    /// How many times an environment went down or came back, and the count at which each one
    /// last did: the generations of the services' answers to the host's
    /// `EnvironmentChanges` request (see [`World::environment_changes`]).
    generation: u64,
    changed_at: Vec<u64>,
    pub down_since: Vec<Option<Duration>>,
    /// (environment, GPU) -> the run holding it.
    holders: BTreeMap<(usize, u32), u64>,
    /// Runs not yet over (an ended run is dropped: its late events are ignored either way).
    pub runs: BTreeMap<u64, Run>,
    /// Trial id -> its live run.
    live: HashMap<String, u64>,
    next_run: u64,
    /// Hash maps: the world runs on the manager's thread, and what it costs counts in the
    /// bench's manager CPU, so it must not grow with the experiment's length either.
    pub trials: HashMap<String, TrialRecord>,
    /// Trial sequence -> first time a start was asked for it; for the starvation check.
    pub first_request_by_sequence: BTreeMap<u64, Duration>,
    /// Each training service's event sink, by service index (see [`World::service_of`]).
    sinks: Vec<Option<EventSink>>,
    pub violations: Vec<String>,
    pub peak_running: usize,
    pub events_delivered: u64,
    /// The most service events delivered at once (the manager's event queue at its longest).
    pub max_batch: u64,
    pub stop_sent: bool,
    /// Trials the driver asked the manager to kill for the user.
    pub user_kills: u64,
    pub shut_down: bool,
    /// CPU time (the calling thread's) spent in the simulated service's answers to the
    /// manager: the service's side of each call, which runs inside the manager's polls here but
    /// on a thread of the plugin's own for a real service (see `Report::service_cpu`).
    pub service_cpu: Duration,
    /// How many calls the simulated training service answered (each measured by two reads of
    /// the thread's CPU clock; see `Report::meter_cost`).
    pub service_answers: u64,
}

impl World {
    pub fn new(scenario: Scenario) -> World {
        let environments = scenario.environments as usize;
        let mut world = World {
            started: Instant::now(),
            queue: BinaryHeap::new(),
            order: 0,
            environment_up: vec![true; environments],
            reports: (0..environments)
                .map(|index| report(&scenario, index, true))
                .collect(),
            generation: 0,
            changed_at: vec![0; environments],
            down_since: vec![None; environments],
            holders: BTreeMap::new(),
            runs: BTreeMap::new(),
            live: HashMap::new(),
            next_run: 0,
            trials: HashMap::new(),
            first_request_by_sequence: BTreeMap::new(),
            sinks: (0..scenario.services.max(1)).map(|_| None).collect(),
            violations: Vec::new(),
            peak_running: 0,
            events_delivered: 0,
            max_batch: 0,
            stop_sent: false,
            user_kills: 0,
            shut_down: false,
            service_cpu: Duration::ZERO,
            service_answers: 0,
            scenario,
        };
        world.schedule_host_losses();
        if let Some(at) = world.scenario.stop_at {
            world.schedule(at, Happening::Stop);
        }
        world
    }

    pub fn now(&self) -> Duration {
        Instant::now().saturating_duration_since(self.started)
    }

    fn schedule(&mut self, at: Duration, what: Happening) {
        self.order += 1;
        self.queue.push(Timed {
            at,
            order: self.order,
            what,
        });
    }

    fn violation(&mut self, message: String) {
        // The first few say what went wrong; hundreds of the same say nothing more.
        if self.violations.len() < 20 {
            let now = self.now();
            self.violations
                .push(format!("at {}: {message}", seconds(now)));
        }
    }

    fn schedule_host_losses(&mut self) {
        let mut rng = StdRng::seed_from_u64(mix(self.scenario.seed, 0x4057, 0));
        for _ in 0..self.scenario.host_losses {
            let environment = rng.gen_range(0..self.scenario.environments as usize);
            let at = rng.gen_range(Duration::ZERO..self.scenario.horizon());
            let down = rng.gen_range(self.scenario.host_down.0..=self.scenario.host_down.1);
            self.schedule(at, Happening::HostDown { environment });
            self.schedule(at + down, Happening::HostBack { environment });
        }
    }

    /// When the next happening is due.
    pub fn next_time(&self) -> Option<Duration> {
        self.queue.peek().map(|timed| timed.at)
    }

    /// Delivers everything due by now; returns how many happenings it handled, and what the
    /// user asks of the manager now.
    pub fn deliver_due(&mut self) -> (usize, Vec<Ask>) {
        let now = self.now();
        let mut handled = 0;
        let mut asks = Vec::new();
        let delivered_before = self.events_delivered;
        while self.queue.peek().is_some_and(|timed| timed.at <= now) {
            let timed = self.queue.pop().expect("peeked");
            handled += 1;
            match timed.what {
                Happening::Stop => asks.push(Ask::Stop),
                Happening::UserKill { trial_id } => {
                    self.trials
                        .entry(trial_id.clone())
                        .or_default()
                        .killed_by_user = true;
                    asks.push(Ask::KillTrial(trial_id));
                }
                what => self.happen(what),
            }
        }
        self.max_batch = self.max_batch.max(self.events_delivered - delivered_before);
        (handled, asks)
    }

    /// The service that owns an environment: environments are dealt out to the services in
    /// turn.
    pub fn service_of(&self, environment: usize) -> usize {
        environment % self.scenario.services.max(1) as usize
    }

    /// Where `service`'s events go from now on (a resumed manager gives new sinks).
    pub fn connect(&mut self, service: usize, sink: EventSink) {
        if let Some(slot) = self.sinks.get_mut(service) {
            *slot = Some(sink);
        }
    }

    /// Emits an event about `environment` through the service that owns it.
    fn emit(&mut self, environment: usize, event: ServiceEvent) {
        self.events_delivered += 1;
        let service = self.service_of(environment);
        if let Some(Some(sink)) = self.sinks.get(service) {
            sink.emit(&event);
        }
    }

    fn happen(&mut self, what: Happening) {
        match what {
            Happening::Started { run } => {
                let now = self.now();
                let Some(record) = self.runs.get_mut(&run) else {
                    return;
                };
                if record.killing || self.live.get(&record.trial_id) != Some(&run) {
                    return;
                }
                record.started_at = Some(now);
                let (trial_id, environment) = (record.trial_id.clone(), record.environment);
                self.trials.entry(trial_id.clone()).or_default().starts += 1;
                self.emit(
                    environment,
                    ServiceEvent::TrialStarted {
                        trial_id,
                        pid: Some(10_000 + run as u32),
                    },
                );
            }
            Happening::Metric {
                run,
                kind,
                sequence,
                value,
            } => {
                let Some(record) = self.runs.get(&run) else {
                    return;
                };
                if record.killing || self.live.get(&record.trial_id) != Some(&run) {
                    return;
                }
                let (trial_id, environment) = (record.trial_id.clone(), record.environment);
                self.emit(
                    environment,
                    ServiceEvent::Metric {
                        trial_id,
                        kind,
                        sequence,
                        value: format!("{value}"),
                    },
                );
            }
            Happening::Ended {
                run,
                exit_code,
                signal,
                stderr_tail,
                killed,
            } => {
                let Some(record) = self.runs.get(&run) else {
                    return;
                };
                if record.killing != killed || self.live.get(&record.trial_id) != Some(&run) {
                    return;
                }
                let (trial_id, environment) = (record.trial_id.clone(), record.environment);
                self.end_run(run);
                let p_lost = self.scenario.p_end_unreported;
                if p_lost > 0.0
                    && StdRng::seed_from_u64(mix(self.scenario.seed, run, 0xe2d)).gen_bool(p_lost)
                {
                    self.trials.entry(trial_id).or_default().ends_unreported += 1;
                    return;
                }
                self.emit(
                    environment,
                    ServiceEvent::TrialEnded {
                        trial_id,
                        exit_code,
                        signal,
                        killed_reason: killed.then(|| "killed".to_string()),
                        stderr_tail,
                        ended_ms: None,
                        environment_lost: None,
                    },
                );
            }
            Happening::StartFailed {
                environment,
                trial_id,
                message,
            } => self.emit(environment, ServiceEvent::StartFailed { trial_id, message }),
            Happening::HostDown { environment } => {
                if !self.environment_up[environment] {
                    return;
                }
                self.environment_up[environment] = false;
                self.generation += 1;
                self.changed_at[environment] = self.generation;
                self.down_since[environment] = Some(self.now());
                let mut lost: Vec<u64> = self
                    .live
                    .values()
                    .copied()
                    .filter(|run| self.runs[run].environment == environment)
                    .collect();
                // In the order they were started, whatever the hash map's order.
                lost.sort_unstable();
                // Not ready first, as a service reports a host that is gone (the core keeps an
                // environment its service last reported ready when a trial's end says lost).
                let inventory = self.environment(environment);
                self.emit(
                    environment,
                    ServiceEvent::Environment {
                        environment: inventory,
                    },
                );
                for run in lost {
                    let trial_id = self.runs[&run].trial_id.clone();
                    let had_started = self.runs[&run].started_at.is_some();
                    let record = self.trials.entry(trial_id.clone()).or_default();
                    record.host_losses += 1;
                    record.lost_after_start += u32::from(had_started);
                    self.end_run(run);
                    self.emit(
                        environment,
                        ServiceEvent::TrialEnded {
                            trial_id,
                            exit_code: None,
                            signal: None,
                            killed_reason: None,
                            stderr_tail: String::new(),
                            ended_ms: None,
                            environment_lost: Some(format!(
                                "host {} unreachable (simulated)",
                                host_name(environment)
                            )),
                        },
                    );
                }
            }
            Happening::HostBack { environment } => {
                if self.environment_up[environment] {
                    return;
                }
                self.environment_up[environment] = true;
                self.generation += 1;
                self.changed_at[environment] = self.generation;
                self.down_since[environment] = None;
                let inventory = self.environment(environment);
                self.emit(
                    environment,
                    ServiceEvent::Environment {
                        environment: inventory,
                    },
                );
            }
            Happening::Stop | Happening::UserKill { .. } => {}
        }
    }

    /// The run is over: its GPUs are free.
    fn end_run(&mut self, run: u64) {
        let record = &self.runs[&run];
        if let Some(limit) = self.scenario.max_trial_duration {
            // The manager's deadline counts from the start it was told of; its kill takes at
            // most 3 s here.
            let ran = record
                .started_at
                .map_or(Duration::ZERO, |started| self.now().saturating_sub(started));
            if !self.shut_down && ran > limit + Duration::from_millis(3100) {
                let trial_id = record.trial_id.clone();
                self.violation(format!(
                    "trial {trial_id} ran {} of maxTrialDuration {}",
                    seconds(ran),
                    seconds(limit)
                ));
            }
        }
        let record = &self.runs[&run];
        let (trial_id, environment, gpus) = (
            record.trial_id.clone(),
            record.environment,
            record.gpus.clone(),
        );
        for gpu in gpus {
            if self.holders.get(&(environment, gpu)) == Some(&run) {
                self.holders.remove(&(environment, gpu));
            }
        }
        if self.live.get(&trial_id) == Some(&run) {
            self.live.remove(&trial_id);
        }
        self.runs.remove(&run);
    }

    pub fn environment(&self, index: usize) -> Environment {
        if self.environment_up[index] {
            self.reports[index].clone()
        } else {
            report(&self.scenario, index, false)
        }
    }

    /// `service`'s answer to the host's `EnvironmentChanges` request: the ids of its
    /// environments, and in full those that went down or came back after generation `since`
    /// (every one when `since` is `None`, or not a generation given yet). A simulated
    /// inventory changes only then, and each such change is also sent as an event, as the
    /// SDK asks; a real service that cannot tell what changed gets the SDK's comparison of
    /// every report instead, on its own thread.
    pub fn environment_changes(&self, service: usize, since: Option<u64>) -> EnvironmentChanges {
        let since = since.filter(|&since| since <= self.generation);
        let mut changes = EnvironmentChanges {
            generation: self.generation,
            ..Default::default()
        };
        for index in 0..self.scenario.environments as usize {
            if self.service_of(index) != service {
                continue;
            }
            changes.ids.push(env_id(index));
            if since.is_none_or(|since| self.changed_at[index] > since) {
                changes.changed.push(self.environment(index));
            }
        }
        changes
    }

    /// `service` is asked to start a trial: the run is planned, or (`p_start_fail`) the
    /// service says it could not start it.
    fn start(&mut self, service: usize, request: TrialRequest) -> Result<(), String> {
        let now = self.now();
        let Some(environment) = env_index(&request.environment_id)
            .filter(|&index| index < self.scenario.environments as usize)
        else {
            self.violation(format!(
                "trial {} started on unknown environment {}",
                request.trial_id, request.environment_id
            ));
            return Ok(());
        };
        if self.service_of(environment) != service {
            self.violation(format!(
                "trial {} handed to training service {} for {}, which service {} owns",
                request.trial_id,
                PLATFORMS[service],
                env_id(environment),
                PLATFORMS[self.service_of(environment)]
            ));
        }
        if self
            .trials
            .get(&request.trial_id)
            .is_some_and(|record| record.killed_by_user)
        {
            let trial_id = request.trial_id.clone();
            self.violation(format!(
                "trial {trial_id} asked to start after the user killed it"
            ));
            return Err("killed by the user (simulated)".into());
        }
        let record = self.trials.entry(request.trial_id.clone()).or_default();
        if std::mem::take(&mut record.awaits_retry) {
            record.retried_starts += 1;
        }
        let attempt = record.requests + 1;
        let mut rng = StdRng::seed_from_u64(mix(
            self.scenario.seed,
            request.sequence,
            u64::from(attempt) ^ 0x57a7,
        ));
        if rng.gen_bool(self.scenario.p_start_fail) {
            record.sequence = request.sequence;
            record.requests += 1;
            record.start_failures += 1;
            record.first_request.get_or_insert(now);
            self.first_request_by_sequence
                .entry(request.sequence)
                .or_insert(now);
            let mut message = format!(
                "{}: could not create the trial's folder (simulated)",
                host_name(environment)
            );
            if service % 2 == 1 {
                // Every second service reports a failed start later, as one whose starts run
                // in the background does (`ServiceEvent::StartFailed`); half of those say that
                // nothing ran, which the manager tries again.
                if rng.gen_bool(0.5) {
                    message.push_str(&format!("; {}", knob_plugin_api::service::NOT_STARTED));
                    record.awaits_retry = true;
                }
                let after = rng.gen_range(5..200);
                let at = now + Duration::from_millis(after);
                let trial_id = request.trial_id.clone();
                if self.scenario.user_kills_failing_starts && !record.killed_by_user {
                    // The user kills the trial while its start is under way: the kill must
                    // hold when the start then fails, whatever it says.
                    let kill_at = now + Duration::from_millis(rng.gen_range(1..after));
                    self.schedule(
                        kill_at,
                        Happening::UserKill {
                            trial_id: trial_id.clone(),
                        },
                    );
                }
                self.schedule(
                    at,
                    Happening::StartFailed {
                        environment,
                        trial_id,
                        message,
                    },
                );
                return Ok(());
            }
            return Err(message);
        }
        if let Some(deadline) = self.scenario.max_experiment_duration {
            if now > deadline {
                self.violation(format!(
                    "trial {} started after maxExperimentDuration ({})",
                    request.trial_id,
                    seconds(deadline)
                ));
            }
        }
        if let Some(&run) = self.live.get(&request.trial_id) {
            self.violation(format!(
                "trial {} started again while its run {run} still runs",
                request.trial_id
            ));
        }
        let gpus = request.gpu_indices.clone().unwrap_or_default();
        if gpus.len() != self.scenario.trial_gpu_number as usize {
            self.violation(format!(
                "trial {} got GPUs {gpus:?}, not {} of them",
                request.trial_id, self.scenario.trial_gpu_number
            ));
        }
        let run = self.next_run;
        self.next_run += 1;
        for &gpu in &gpus {
            if gpu >= self.scenario.gpus_per_environment {
                self.violation(format!(
                    "trial {} placed on GPU {gpu} of {}, which has {} GPUs",
                    request.trial_id,
                    env_id(environment),
                    self.scenario.gpus_per_environment
                ));
            }
            if let Some(holder) = self.holders.insert((environment, gpu), run) {
                let holder = self
                    .runs
                    .get(&holder)
                    .map_or_else(|| format!("of run {holder}"), |r| r.trial_id.clone());
                self.violation(format!(
                    "GPU {gpu} of {} held twice: by trial {holder} and trial {}",
                    env_id(environment),
                    request.trial_id
                ));
            }
        }
        self.live.insert(request.trial_id.clone(), run);
        let running = self.live.len();
        self.peak_running = self.peak_running.max(running);
        if running > self.scenario.trial_concurrency as usize {
            self.violation(format!(
                "{running} trials run at once, over trialConcurrency {}",
                self.scenario.trial_concurrency
            ));
        }
        let record = self.trials.entry(request.trial_id.clone()).or_default();
        record.sequence = request.sequence;
        record.requests += 1;
        record.first_request.get_or_insert(now);
        let requests = record.requests;
        self.first_request_by_sequence
            .entry(request.sequence)
            .or_insert(now);
        self.runs.insert(
            run,
            Run {
                trial_id: request.trial_id.clone(),
                environment,
                gpus,
                started_at: None,
                killing: false,
            },
        );
        if !self.environment_up[environment] {
            self.violation(format!(
                "trial {} started on {}, which is down",
                request.trial_id,
                env_id(environment)
            ));
        }
        self.plan(run, &request, requests);
        Ok(())
    }

    /// Schedules what this run will do: its start (perhaps slow), its metrics, and its end.
    fn plan(&mut self, run: u64, request: &TrialRequest, attempt: u32) {
        let scenario = &self.scenario;
        let mut rng = StdRng::seed_from_u64(mix(scenario.seed, request.sequence, attempt as u64));
        let now = self.now();
        let slow = rng.gen_bool(scenario.p_slow_start);
        let start = now
            + if slow {
                rng.gen_range(Duration::ZERO..=scenario.slow_start)
            } else {
                Duration::from_millis(rng.gen_range(5..200))
            };
        // Log-uniform between the bounds: many short trials, a few long ones.
        let (low, high) = (
            scenario.duration.0.as_secs_f64().max(1.0),
            scenario.duration.1.as_secs_f64().max(1.0),
        );
        let length =
            Duration::from_secs_f64((low.ln() + rng.gen::<f64>() * (high.ln() - low.ln())).exp());
        let outcome = rng.gen::<f64>();
        let quality = quality(&request.parameters);
        let every = scenario.intermediate_every;
        let (p_fail, p_oom) = (scenario.p_fail, scenario.p_oom);
        // Its own draws, so that the runs of scenarios without duplicates stay as they were.
        let mut duplicates = StdRng::seed_from_u64(mix(
            scenario.seed ^ 0xd0b1e,
            request.sequence,
            attempt as u64,
        ));
        let p_duplicate = scenario.p_duplicate_metric;
        self.schedule(start, Happening::Started { run });
        let (end_after, exit_code, signal, stderr_tail, finishes) = if outcome < p_fail {
            let at = length.mul_f64(rng.gen::<f64>());
            (
                at,
                Some(1),
                None,
                "Traceback (most recent call last):\nValueError: simulated failure".to_string(),
                false,
            )
        } else if outcome < p_fail + p_oom {
            let at = length.mul_f64(rng.gen::<f64>());
            (
                at,
                None,
                Some(9),
                "RuntimeError: CUDA out of memory (simulated)".to_string(),
                false,
            )
        } else {
            (length, Some(0), None, String::new(), true)
        };
        if signal == Some(9) {
            self.trials
                .entry(request.trial_id.clone())
                .or_default()
                .ooms += 1;
        }
        let mut step = 0u64;
        while !every.is_zero() && every * (step as u32 + 1) < end_after && step < 1000 {
            step += 1;
            let value = quality * (1.0 - 0.5f64.powi(step as i32));
            let times = if p_duplicate > 0.0 && duplicates.gen_bool(p_duplicate) {
                2
            } else {
                1
            };
            for _ in 0..times {
                self.schedule(
                    start + every * step as u32,
                    Happening::Metric {
                        run,
                        kind: MetricKind::Intermediate,
                        sequence: step - 1,
                        value,
                    },
                );
            }
        }
        if finishes {
            self.schedule(
                start + end_after,
                Happening::Metric {
                    run,
                    kind: MetricKind::Final,
                    sequence: 0,
                    value: quality,
                },
            );
        }
        self.schedule(
            start + end_after,
            Happening::Ended {
                run,
                exit_code,
                signal,
                stderr_tail,
                killed: false,
            },
        );
    }

    fn kill(&mut self, service: usize, trial_id: &str) {
        let Some(&run) = self.live.get(trial_id) else {
            // Already over: a real service answers the same.
            return;
        };
        let owner = self.service_of(self.runs[&run].environment);
        if owner != service {
            self.violation(format!(
                "training service {} asked to kill trial {trial_id}, which runs on service {}",
                PLATFORMS[service], PLATFORMS[owner]
            ));
        }
        let record = self.runs.get_mut(&run).expect("live run is known");
        if record.killing {
            return;
        }
        record.killing = true;
        let mut rng = StdRng::seed_from_u64(mix(self.scenario.seed, run, 0x6b11));
        let after = Duration::from_millis(rng.gen_range(10..3000));
        let at = self.now() + after;
        self.schedule(
            at,
            Happening::Ended {
                run,
                exit_code: None,
                signal: Some(15),
                stderr_tail: String::new(),
                killed: true,
            },
        );
    }

    /// Trials still running when the service shuts down are killed; their ends are not reported
    /// (the manager records them itself).
    fn shut_down(&mut self) {
        self.shut_down = true;
        let live: Vec<u64> = self.live.values().copied().collect();
        for run in live {
            self.end_run(run);
        }
        self.queue.clear();
    }

    /// A resumed manager's clean-up (`clean_up_leftovers`): what is left of these trials on
    /// `service`'s environments ends, without events (as a real service kills its leftovers).
    fn clean_up(&mut self, service: usize, trial_ids: &[String]) {
        let mut leftovers: Vec<u64> = trial_ids
            .iter()
            .filter_map(|id| self.live.get(id).copied())
            .filter(|run| self.service_of(self.runs[run].environment) == service)
            .collect();
        leftovers.sort_unstable();
        for run in leftovers {
            let (trial_id, started) = {
                let record = &self.runs[&run];
                (record.trial_id.clone(), record.started_at.is_some())
            };
            let record = self.trials.entry(trial_id).or_default();
            record.crash_losses += 1;
            record.crash_lost_after_start += u32::from(started);
            self.end_run(run);
        }
    }

    /// Runs that are asked for, not yet over.
    pub fn live_runs(&self) -> usize {
        self.live.len()
    }

    /// Live runs the manager asked to kill that have not ended yet.
    pub fn killing_runs(&self) -> usize {
        self.live
            .values()
            .filter(|run| self.runs[run].killing)
            .count()
    }
}

/// The simulated training service: what the manager asks goes into the world.
struct SimService {
    world: Shared,
    /// Its index: it owns the environments [`World::service_of`] gives it.
    service: usize,
}

impl SimService {
    /// Runs the service's side of one call with the world locked, counting its CPU time in
    /// [`World::service_cpu`].
    fn answer<R>(&self, work: impl FnOnce(&mut World) -> R) -> R {
        let mut world = self.world.lock();
        let before = super::cpu_time(libc::CLOCK_THREAD_CPUTIME_ID);
        let answer = work(&mut world);
        if let (Some(before), Some(after)) =
            (before, super::cpu_time(libc::CLOCK_THREAD_CPUTIME_ID))
        {
            world.service_cpu += after.saturating_sub(before);
        }
        world.service_answers += 1;
        answer
    }
}

impl TrainingService for SimService {
    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        let service = self.service;
        Ok(self.answer(|world| {
            (0..world.scenario.environments as usize)
                .filter(|&index| world.service_of(index) == service)
                .map(|index| world.environment(index))
                .collect()
        }))
    }

    fn environment_changes(
        &mut self,
        since: Option<u64>,
    ) -> Result<Option<EnvironmentChanges>, PluginError> {
        let service = self.service;
        Ok(Some(
            self.answer(|world| world.environment_changes(service, since)),
        ))
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        let service = self.service;
        self.answer(|world| world.start(service, request))
            .map_err(PluginError::new)
    }

    fn kill_trial(&mut self, trial_id: &str, _reason: &str) -> Result<(), PluginError> {
        let service = self.service;
        self.answer(|world| world.kill(service, trial_id));
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.answer(|world| world.shut_down());
        Ok(())
    }
}

/// Hands out `{"x": u}` with `u` drawn from the parameter id's own stream, until its budget.
struct SimTuner {
    seed: u64,
    budget: Option<u64>,
    handed_out: u64,
}

impl Tuner for SimTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        Ok(SimTuner {
            seed: class_args.get("seed").and_then(Value::as_u64).unwrap_or(0),
            budget: class_args.get("budget").and_then(Value::as_u64),
            handed_out: 0,
        })
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        // Parameter ids go on from the store's counter when the experiment is resumed, so the
        // budget holds across a crash (a new tuner's own count would start again).
        let handed_out = self.handed_out.max(parameter_id);
        if self.budget.is_some_and(|budget| handed_out >= budget) {
            return Ok(Generated::NoMore);
        }
        self.handed_out += 1;
        let mut rng = StdRng::seed_from_u64(mix(self.seed, parameter_id, 0x7a3e));
        Ok(Generated::Parameters(json!({ "x": rng.gen::<f64>() })))
    }

    fn receive_trial_result(
        &mut self,
        _parameter_id: u64,
        _parameters: &Value,
        _value: f64,
    ) -> Result<(), PluginError> {
        Ok(())
    }
}

/// Stops a trial whose third or later intermediate result is below `threshold`.
struct SimAssessor {
    threshold: f64,
}

impl Assessor for SimAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        Ok(SimAssessor {
            threshold: class_args
                .get("threshold")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
        })
    }

    fn assess_trial(&mut self, _trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        match history.last() {
            Some(&last) if history.len() >= 3 && last < self.threshold => Ok(Verdict::stop(
                format!("step {}: {last} below {}", history.len(), self.threshold),
            )),
            _ => Ok(Verdict::good()),
        }
    }
}

/// The simulator's components, by the names its config gives.
pub(super) struct SimComponents {
    pub world: Shared,
}

pub(super) const TUNER: &str = "SimTuner";
pub(super) const ASSESSOR: &str = "SimAssessor";
/// The simulated training services' platforms, by service index (a scenario has up to three).
pub(super) const PLATFORMS: [&str; 3] = ["sim", "sim2", "sim3"];

impl Components for SimComponents {
    fn provides(&self, kind: ComponentKind, name: &str) -> bool {
        match kind {
            ComponentKind::Tuner => name == TUNER,
            ComponentKind::Assessor => name == ASSESSOR,
            ComponentKind::TrainingService => PLATFORMS.contains(&name),
        }
    }

    fn tuner(&self, name: &str, class_args: &Value) -> Result<TunerHandle, HostError> {
        let tuner = SimTuner::new(class_args).map_err(|e| HostError::Call {
            message: e.message().to_string(),
        })?;
        Ok(in_process::tuner(name, tuner))
    }

    fn assessor(
        &self,
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
    ) -> Result<AssessorHandle, HostError> {
        let assessor = SimAssessor::new(class_args).map_err(|e| HostError::Call {
            message: e.message().to_string(),
        })?;
        in_process::assessor(name, assessor, context)
    }

    fn training_service(
        &self,
        platform: &str,
        _config: &Value,
        _context: &ServiceContext,
        on_event: EventCallback,
    ) -> Result<TrainingServiceHandle, HostError> {
        let world = self.world.clone();
        let service = service_index(platform);
        in_process::training_service(platform, on_event, move |sink| {
            world.lock().connect(service, sink);
            Ok(SimService { world, service })
        })
    }

    fn clean_up_leftovers(
        &self,
        platform: &str,
        _config: &Value,
        _context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, HostError> {
        self.world
            .lock()
            .clean_up(service_index(platform), trial_ids);
        Ok(Vec::new())
    }
}

/// How good a parameter set is, in (0.5, 1]: best at x = 0.3.
/// Environment `index` of `scenario` as its service reports it, up or down.
fn report(scenario: &Scenario, index: usize, up: bool) -> Environment {
    let gpus = (0..scenario.gpus_per_environment)
        .map(|gpu| Gpu::idle(gpu, "Simulated GPU", ByteSize::gib(80)))
        .collect();
    let host = HostResources {
        cpu_count: 64,
        cpu_utilization_percent: Some(10.0),
        memory_total: ByteSize::gib(512),
        memory_available: ByteSize::gib(512),
    };
    let mut inventory =
        knob_gpu_sched::Environment::new(env_id(index), host_name(index), gpus, host);
    if !up {
        inventory.status = EnvironmentStatus::Unavailable("host lost (simulated)".into());
    }
    Environment {
        id: env_id(index),
        host: host_name(index),
        ready: up,
        inventory: serde_json::to_value(inventory).unwrap_or_default(),
    }
}

pub(super) fn quality(parameters: &Value) -> f64 {
    let x = parameters.get("x").and_then(Value::as_f64).unwrap_or(0.0);
    1.0 - (x - 0.3) * (x - 0.3) * 0.5
}

fn service_index(platform: &str) -> usize {
    PLATFORMS.iter().position(|p| *p == platform).unwrap_or(0)
}

pub(super) fn env_id(index: usize) -> String {
    format!("sim:node{index}")
}

fn host_name(index: usize) -> String {
    format!("node{index}")
}

fn env_index(id: &str) -> Option<usize> {
    id.strip_prefix("sim:node")?.parse().ok()
}

pub(super) fn seconds(duration: Duration) -> String {
    format!("{:.3}s", duration.as_secs_f64())
}

/// One seed per (seed, a, b), well mixed (SplitMix64's finaliser).
pub(super) fn mix(seed: u64, a: u64, b: u64) -> u64 {
    let mut z = seed
        .wrapping_add(a.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(b.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
