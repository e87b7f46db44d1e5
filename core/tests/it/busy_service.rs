//! A training service busy with one long call (a remote start waiting on a host that stopped
//! answering, a large code upload: a service answers its calls in order) holds only itself: the
//! manager's loop does not wait on it, so the experiment's other service goes on placing,
//! running and ending trials meanwhile. The same holds for a population successor waiting for its
//! parent's checkpoint to be brought from another service. The real manager, store and gpu-sched
//! on the real clock, with in-process services, each on a thread of its own as a plugin's runs.

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knob_core::config::{
    AlgorithmConfig, ExperimentConfig, LogLevel, PlacementPolicy, TrainingServiceConfig,
    TunerErrorPolicy,
};
use knob_core::manager::{self, Components, EventCallback};
use knob_core::store::{ExperimentStatus, Store, StoreEvent, TrialStatus};
use knob_gpu_sched::{ByteSize, Gpu, HostResources};
use knob_plugin_api::host::{
    in_process, AssessorHandle, HostError, TrainingServiceHandle, TunerHandle,
};
use knob_plugin_api::population::Lineage;
use knob_plugin_api::service::{
    Environment, MetricKind, ServiceContext, ServiceEvent, TrialRequest,
};
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{
    AssessorContext, ComponentKind, EventSink, Generated, PluginError, TrainingService, Tuner,
};
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};

/// How long each trial of the quick service runs.
const TRIAL_TIME: Duration = Duration::from_millis(500);
/// Trials the quick service must start while the busy one's first start is held. At
/// `TRIAL_TIME` each they take about 8 s, past the manager's first re-probe of the machines
/// (5 s after a trial began to wait), which asks the busy service too.
const QUICK_STARTS: usize = 16;
/// The busy service's first start is let go after this at the latest.
const HOLD_LIMIT: Duration = Duration::from_secs(40);

/// What service "told" records in [`Starts`] when told that no trial waits any more.
const NOTHING_WAITS: &str = "(nothing waits)";

/// When each trial was started, and by which service.
type Starts = Arc<Mutex<Vec<(Instant, &'static str, String)>>>;

struct Service {
    name: &'static str,
    events: EventSink,
    /// The first start waits for a message here (or `HOLD_LIMIT`): a start stuck on its host.
    hold: Option<std_mpsc::Receiver<()>>,
    starts: Starts,
    /// How many GPUs its one machine has.
    gpus: u32,
    /// How it answers `fetch_snapshot` (see [`Fetches`]); none: the default, not supported.
    fetches: Option<Arc<Fetches>>,
    /// The thread sending the last trial's racing reports ("early", "endfirst"): joined before
    /// the next start, so that a trial's late reports all arrive before the next trial's.
    reports: Option<std::thread::JoinHandle<()>>,
}

/// The services' answers to `fetch_snapshot`, shared by all of them: the first asked does not
/// bring the copy; the second holds the call until a message comes on `hold` (or
/// `HOLD_LIMIT`), a copy of gigabytes on its way, then writes the copy to `dest` and says so.
struct Fetches {
    hold: Mutex<Option<std_mpsc::Receiver<()>>>,
    /// (service, when asked, when answered, the answer) of each call.
    calls: Mutex<Vec<(&'static str, Instant, Instant, bool)>>,
    /// When the second call began to be held.
    held_since: Mutex<Option<Instant>>,
    /// (trial, whether the copy was there) of each start told to restore from a copy.
    restores: Mutex<Vec<(String, bool)>>,
    /// Whether the first call fails instead (a host not connected yet: the service cannot tell
    /// whether it holds the copy).
    first_fails: bool,
}

impl Fetches {
    fn answer(&self, service: &'static str, dest: &std::path::Path) -> Result<bool, PluginError> {
        let asked = Instant::now();
        if self.first_fails && self.calls.lock().unwrap().is_empty() {
            self.calls
                .lock()
                .unwrap()
                .push((service, asked, Instant::now(), false));
            return Err(PluginError::new("host node0 is not connected yet"));
        }
        let second = self.calls.lock().unwrap().len() == 1;
        if second {
            *self.held_since.lock().unwrap() = Some(asked);
            if let Some(hold) = self.hold.lock().unwrap().take() {
                let _ = hold.recv_timeout(HOLD_LIMIT);
            }
            std::fs::create_dir_all(dest).unwrap();
            std::fs::write(dest.join("state.json"), "{}").unwrap();
        }
        self.calls
            .lock()
            .unwrap()
            .push((service, asked, Instant::now(), second));
        Ok(second)
    }
}

impl TrainingService for Service {
    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        let id = format!("{}:node0", self.name);
        let host = HostResources {
            cpu_count: 8,
            cpu_utilization_percent: Some(0.0),
            memory_total: ByteSize::gib(32),
            memory_available: ByteSize::gib(32),
        };
        let gpus = (0..self.gpus)
            .map(|index| Gpu::idle(index, "Test GPU", ByteSize::gib(16)))
            .collect();
        let inventory = knob_gpu_sched::Environment::new(id.clone(), "node0", gpus, host);
        Ok(vec![Environment {
            id,
            host: "node0".into(),
            ready: true,
            inventory: serde_json::to_value(inventory).unwrap(),
        }])
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        if self.name == "stuckstart" {
            // A start that does not return (a host that stopped answering mid-upload): every
            // later call, the trial's kill and the shutdown included, queues behind it.
            let trial_id = request.trial_id.clone();
            self.starts
                .lock()
                .unwrap()
                .push((Instant::now(), self.name, trial_id));
        }
        if let Some(hold) = self.hold.take() {
            let _ = hold.recv_timeout(HOLD_LIMIT);
        }
        // A successor is told its parent's id; the copy, where the host made or brought it, is
        // its folder's `restore/` (what a runner names in `KNOB_RESTORE_FROM`).
        if let (Some(fetches), Some(_)) = (&self.fetches, request.env.get("KNOB_RESTORE_TRIAL")) {
            let there = request.trial_dir.join("restore/state.json").is_file();
            let trial_id = request.trial_id.clone();
            fetches.restores.lock().unwrap().push((trial_id, there));
        }
        let trial_id = request.trial_id;
        if self.name == "early" || self.name == "endfirst" {
            // A service whose reports race its start report: its output reader sends the
            // trial's final ("early"), or a stale end ("endfirst"), before the start.
            let events = self.events.clone();
            let ends_first = self.name == "endfirst";
            if let Some(previous) = self.reports.take() {
                previous.join().unwrap();
            }
            self.reports = Some(std::thread::spawn(move || {
                if ends_first {
                    events.emit(&ServiceEvent::TrialEnded {
                        trial_id: trial_id.clone(),
                        exit_code: Some(0),
                        signal: None,
                        killed_reason: None,
                        stderr_tail: String::new(),
                        ended_ms: None,
                        environment_lost: None,
                    });
                }
                events.emit(&ServiceEvent::Metric {
                    trial_id: trial_id.clone(),
                    kind: MetricKind::Final,
                    sequence: 0,
                    value: "0.75".into(),
                });
                events.emit(&ServiceEvent::TrialStarted {
                    trial_id: trial_id.clone(),
                    pid: None,
                });
                events.emit(&ServiceEvent::TrialEnded {
                    trial_id,
                    exit_code: Some(0),
                    signal: None,
                    killed_reason: None,
                    stderr_tail: String::new(),
                    ended_ms: None,
                    environment_lost: None,
                });
            }));
            return Ok(());
        }
        if self.name == "unstarted" {
            // A service that ends trials it never reported started (its start report lost, a
            // third-party service that sends none).
            let events = self.events.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                events.emit(&ServiceEvent::TrialEnded {
                    trial_id,
                    exit_code: Some(1),
                    signal: None,
                    killed_reason: None,
                    stderr_tail: "bad trial command".into(),
                    ended_ms: None,
                    environment_lost: None,
                });
            });
            return Ok(());
        }
        self.starts
            .lock()
            .unwrap()
            .push((Instant::now(), self.name, trial_id.clone()));
        let events = self.events.clone();
        let name = self.name;
        std::thread::spawn(move || {
            events.emit(&ServiceEvent::TrialStarted {
                trial_id: trial_id.clone(),
                pid: None,
            });
            // One for the assessor to judge ("reporting"); the others report only a final.
            let mut sequence = 0;
            if name == "reporting" {
                events.emit(&ServiceEvent::Metric {
                    trial_id: trial_id.clone(),
                    kind: MetricKind::Intermediate,
                    sequence,
                    value: "0.5".into(),
                });
                sequence += 1;
            }
            std::thread::sleep(TRIAL_TIME);
            events.emit(&ServiceEvent::Metric {
                trial_id: trial_id.clone(),
                kind: MetricKind::Final,
                sequence,
                value: "1".into(),
            });
            events.emit(&ServiceEvent::TrialEnded {
                trial_id,
                exit_code: Some(0),
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                ended_ms: None,
                environment_lost: None,
            });
        });
        Ok(())
    }

    fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
        Ok(())
    }

    fn nothing_waits(&mut self) -> Result<(), PluginError> {
        if self.name == "told" {
            self.starts
                .lock()
                .unwrap()
                .push((Instant::now(), NOTHING_WAITS, String::new()));
        }
        Ok(())
    }

    fn fetch_snapshot(
        &mut self,
        _trial_id: &str,
        _donor: &str,
        dest: &std::path::Path,
    ) -> Result<bool, PluginError> {
        match &self.fetches {
            Some(fetches) => fetches.answer(self.name, dest),
            None => Ok(false),
        }
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        if self.name == "unending" {
            // A service waiting on a host that stopped answering.
            std::thread::sleep(HOLD_LIMIT);
        }
        Ok(())
    }
}

/// Hands out `{"x": id / 1000}` for every id.
struct Counter;

impl Tuner for Counter {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        Ok(Counter)
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        Ok(Generated::Parameters(
            json!({ "x": parameter_id as f64 / 1000.0 }),
        ))
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

/// The experiment's components: a service for each of `platforms`, the tuner `tuner` makes.
struct Services {
    platforms: &'static [&'static str],
    /// Each service's GPUs.
    gpus: u32,
    /// Holds the first start of the service named "busy" (see [`Service::hold`]).
    hold: Mutex<Option<std_mpsc::Receiver<()>>>,
    starts: Starts,
    fetches: Option<Arc<Fetches>>,
    tuner: Box<dyn Fn(&str) -> TunerHandle + Send + Sync>,
}

impl Components for Services {
    fn provides(&self, kind: ComponentKind, name: &str) -> bool {
        match kind {
            ComponentKind::Tuner => true,
            ComponentKind::Assessor => false,
            ComponentKind::TrainingService => self.platforms.contains(&name),
        }
    }

    fn tuner(&self, name: &str, _class_args: &Value) -> Result<TunerHandle, HostError> {
        Ok((self.tuner)(name))
    }

    fn assessor(
        &self,
        name: &str,
        _class_args: &Value,
        _context: &AssessorContext,
    ) -> Result<AssessorHandle, HostError> {
        Err(HostError::Call {
            message: format!("no assessor {name}"),
        })
    }

    fn training_service(
        &self,
        platform: &str,
        _config: &Value,
        _context: &ServiceContext,
        on_event: EventCallback,
    ) -> Result<TrainingServiceHandle, HostError> {
        let name = *self
            .platforms
            .iter()
            .find(|name| **name == platform)
            .expect("a platform it provides");
        if name == "broken" {
            return Err(HostError::Constructor {
                kind: ComponentKind::TrainingService,
                name: name.to_string(),
                message: "classArgs of training service broken: machineList is empty".into(),
            });
        }
        let hold = if name == "busy" || name == "stuckstart" {
            self.hold.lock().unwrap().take()
        } else {
            None
        };
        let (starts, gpus, fetches) = (self.starts.clone(), self.gpus, self.fetches.clone());
        in_process::training_service_on_thread(platform, on_event, move |events| {
            Ok(Service {
                name,
                events,
                hold,
                starts,
                gpus,
                fetches,
                reports: None,
            })
        })
    }

    fn clean_up_leftovers(
        &self,
        _platform: &str,
        _config: &Value,
        _context: &ServiceContext,
        _trial_ids: &[String],
    ) -> Result<Vec<String>, HostError> {
        Ok(Vec::new())
    }
}

/// An experiment of `trials` trials, `concurrency` at a time, one GPU each, under a service for
/// each of `platforms`, with tuner `tuner`.
fn config(
    dir: &std::path::Path,
    trials: u64,
    concurrency: u32,
    platforms: &[&str],
    tuner: &str,
) -> ExperimentConfig {
    ExperimentConfig {
        experiment_name: Some("busy-service".into()),
        trial_command: "in process".into(),
        trial_code_directory: dir.to_path_buf(),
        trial_concurrency: concurrency,
        trial_gpu_number: Some(1),
        trial_gpu_memory_mib: None,
        trial_memory_size_mib: None,
        trial_cpu_number: None,
        max_experiment_duration: Some(Duration::from_secs(120)),
        max_trial_number: Some(trials),
        max_trial_duration: None,
        max_trial_retries: 0,
        max_oom_retries: 0,
        nni_shim: None,
        debug: false,
        log_level: LogLevel::Info,
        experiment_working_directory: dir.to_path_buf(),
        tuner_gpu_indices: None,
        tuner: AlgorithmConfig {
            name: Some(tuner.into()),
            class_name: None,
            code_directory: None,
            class_args: Default::default(),
            python_interpreter: None,
            use_nni_implementation: false,
            dispatcher_connect_timeout: None,
        },
        assessor: None,
        training_service: platforms
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

/// Waits, on a thread of its own, for `ready` to hold (it may act then, and says whether it
/// did), or gives up at `HOLD_LIMIT`; the thread's answer says when, `None` if never.
fn when_ready(
    ready: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let began = Instant::now();
        while began.elapsed() < HOLD_LIMIT {
            if ready() {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    })
}

/// Sends on `release` (a held call goes on) once `ready` holds, or gives up at `HOLD_LIMIT`
/// (the call then lets itself go); see [`when_ready`].
fn release_when(
    release: std_mpsc::Sender<()>,
    ready: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<Option<Instant>> {
    when_ready(move || ready() && release.send(()).is_ok())
}

/// Runs the experiment to its end (experiment id "busy", in `dir`), as `knob create` does.
fn run_experiment(
    dir: &std::path::Path,
    config: &ExperimentConfig,
    components: &impl Components,
) -> Result<manager::Outcome, manager::ManagerError> {
    let (progress, _progress_rx) = watch::channel(manager::Progress::default());
    let (_commands_tx, commands) = mpsc::unbounded_channel();
    run_experiment_commanded(dir, config, components, progress, commands)
}

/// [`run_experiment`], publishing its progress on `progress` and taking the user's commands
/// from `commands`.
fn run_experiment_commanded(
    dir: &std::path::Path,
    config: &ExperimentConfig,
    components: &impl Components,
    progress: watch::Sender<manager::Progress>,
    commands: mpsc::UnboundedReceiver<manager::Command>,
) -> Result<manager::Outcome, manager::ManagerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    run_experiment_on(runtime, dir, config, components, progress, commands)
}

/// [`run_experiment_commanded`] on tokio's paused clock: the manager's own patience (minutes)
/// passes at once while it waits on nothing else.
fn run_experiment_paused(
    dir: &std::path::Path,
    config: &ExperimentConfig,
    components: &impl Components,
    progress: watch::Sender<manager::Progress>,
    commands: mpsc::UnboundedReceiver<manager::Command>,
) -> Result<manager::Outcome, manager::ManagerError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    run_experiment_on(runtime, dir, config, components, progress, commands)
}

fn run_experiment_on(
    runtime: tokio::runtime::Runtime,
    dir: &std::path::Path,
    config: &ExperimentConfig,
    components: &impl Components,
    progress: watch::Sender<manager::Progress>,
    commands: mpsc::UnboundedReceiver<manager::Command>,
) -> Result<manager::Outcome, manager::ManagerError> {
    runtime.block_on(async {
        let store = Store::open(dir).unwrap();
        store
            .append(StoreEvent::ExperimentCreated {
                experiment_id: "busy".into(),
                config: serde_json::to_value(config).unwrap(),
                start_time_ms: 0,
            })
            .await
            .unwrap();
        let experiment = manager::Experiment {
            id: "busy".into(),
            dir: dir.to_path_buf(),
            config: config.clone(),
            history: None,
            config_file: None,
        };
        manager::run(experiment, store, components, commands, progress).await
    })
}

#[test]
fn a_service_stuck_in_a_start_does_not_hold_the_other_services_trials() {
    let dir = tempfile::tempdir().unwrap();
    let (release, hold) = std_mpsc::channel();
    let starts: Starts = Default::default();
    let components = Services {
        platforms: &["quick", "busy"],
        gpus: 1,
        hold: Mutex::new(Some(hold)),
        starts: starts.clone(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let trials = QUICK_STARTS as u64 + 4;
    // One trial always waits for a GPU, so the manager re-probes the machines every 5 s.
    let config = config(dir.path(), trials, 3, components.platforms, "Counter");

    // Lets the busy service's start go once the quick one has started `QUICK_STARTS` trials
    // (or at `HOLD_LIMIT`, when the start lets itself go); says which it was.
    let watcher = release_when(release, {
        let starts = starts.clone();
        move || {
            let quick = starts.lock().unwrap();
            quick.iter().filter(|(_, s, _)| *s == "quick").count() >= QUICK_STARTS
        }
    });

    let outcome = run_experiment(dir.path(), &config, &components);
    let released_after = watcher.join().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");

    let starts = starts.lock().unwrap().clone();
    let busy_start = starts.iter().position(|(_, service, _)| *service == "busy");
    assert!(
        released_after.is_some(),
        "the quick service started {} trials while the busy one's start was held ({HOLD_LIMIT:?}): the manager waited on the busy service; starts: {starts:?}",
        starts.iter().filter(|(_, s, _)| *s == "quick").count()
    );
    // The held start was the busy service's first call to start a trial, and the quick
    // service's trials went on meanwhile, none waiting long for the next.
    let busy_start = busy_start.expect("the busy service started its trial once let go");
    assert!(busy_start >= QUICK_STARTS, "{starts:?}");
    let gaps: Vec<Duration> = starts[..QUICK_STARTS]
        .windows(2)
        .map(|pair| pair[1].0 - pair[0].0)
        .collect();
    assert!(
        gaps.iter().all(|gap| *gap < Duration::from_secs(3)),
        "a quick trial waited for the next: {gaps:?}"
    );

    // Every trial ran to the end, the held one too.
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    let succeeded = state
        .trials
        .iter()
        .filter(|t| t.status == TrialStatus::Succeeded)
        .count();
    assert_eq!(succeeded as u64, trials, "{:?}", state.warnings);
}

/// Members 0 and 1 of a population, 1 starting from 0's checkpoint, then plain parameters:
/// the successor is created in the same round as its parent, before the parent runs anywhere,
/// so no service took a copy for it and where its parent's checkpoint is is not known (as for a
/// successor created before a resume).
struct Population;

impl Tuner for Population {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        Ok(Population)
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        let parameters = json!({ "x": parameter_id as f64 / 1000.0 });
        Ok(match parameter_id {
            0 | 1 => Generated::Member {
                parameters,
                label: format!("member-{parameter_id}"),
                lineage: Lineage {
                    parent: (parameter_id == 1).then_some(0),
                    replaces: None,
                    parent_step: None,
                },
            },
            _ => Generated::Parameters(parameters),
        })
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

/// A successor placed under one service, whose parent's checkpoint another service must bring
/// here first, is handed to its service once the copy is here; the loop does not wait for that
/// meanwhile. With three services and the holder not known, the two others are asked one after
/// the other: the first does not have it, the second takes long (its call is held) and brings
/// it. While the second's call is held, the other trials go on starting and ending.
#[test]
fn a_successor_waiting_for_its_parents_checkpoint_holds_no_other_trial() {
    let dir = tempfile::tempdir().unwrap();
    let (release, hold) = std_mpsc::channel();
    let starts: Starts = Default::default();
    let fetches = Arc::new(Fetches {
        hold: Mutex::new(Some(hold)),
        calls: Default::default(),
        held_since: Default::default(),
        restores: Default::default(),
        first_fails: false,
    });
    let components = Services {
        platforms: &["north", "east", "west"],
        gpus: 2,
        hold: Mutex::new(None),
        starts: starts.clone(),
        fetches: Some(fetches.clone()),
        tuner: Box::new(|name| in_process::tuner(name, Population)),
    };
    // Enough that trials are left to start after `QUICK_STARTS` while the call is held: those
    // placed under the held service wait for it, and hold their GPUs and places meanwhile.
    let trials = 2 * QUICK_STARTS as u64 + 8;
    let config = config(dir.path(), trials, 6, components.platforms, "Population");

    // Lets the held call go once `QUICK_STARTS` trials started after it was made (or at
    // `HOLD_LIMIT`, when it lets itself go); says which it was.
    let watcher = release_when(release, {
        let (starts, fetches) = (starts.clone(), fetches.clone());
        move || {
            let Some(held_since) = *fetches.held_since.lock().unwrap() else {
                return false;
            };
            let started = starts.lock().unwrap();
            started.iter().filter(|(at, _, _)| *at > held_since).count() >= QUICK_STARTS
        }
    });
    let outcome = run_experiment(dir.path(), &config, &components);
    let released_after = watcher.join().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");

    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    let parent = &state
        .trials
        .iter()
        .find(|t| t.sequence == 0)
        .unwrap()
        .trial_id;
    let successor = state
        .trials
        .iter()
        .find(|t| t.lineage.as_ref().and_then(|l| l.parent.as_ref()) == Some(parent))
        .expect("the successor was created");
    let starts = starts.lock().unwrap().clone();
    let calls = fetches.calls.lock().unwrap().clone();
    let held_since = fetches.held_since.lock().unwrap().expect("a call was held");
    assert!(
        released_after.is_some(),
        "{} trials started while the fetch of {}'s checkpoint was held ({HOLD_LIMIT:?}), not {QUICK_STARTS}: the manager waited on it; starts: {starts:?}",
        starts.iter().filter(|(at, _, _)| *at > held_since).count(),
        successor.trial_id
    );
    let (_, successor_started, successor_service) = starts
        .iter()
        .map(|(at, service, trial)| (trial, *at, *service))
        .find(|(trial, _, _)| **trial == successor.trial_id)
        .expect("the successor started");
    // Asked of the two other services, one after the other; the second brought the copy, and
    // the successor started after it was here.
    assert_eq!(calls.len(), 2, "{calls:?}");
    let (
        (first, _, first_answered, first_brought),
        (second, second_asked, second_answered, brought),
    ) = (calls[0], calls[1]);
    assert!(
        first != successor_service && second != successor_service && first != second,
        "the successor runs under {successor_service}; asked: {calls:?}"
    );
    assert!(!first_brought && brought, "{calls:?}");
    assert!(first_answered <= second_asked, "asked at once: {calls:?}");
    assert!(second_answered <= successor_started, "{calls:?} {starts:?}");
    assert_eq!(
        *fetches.restores.lock().unwrap(),
        [(successor.trial_id.clone(), true)],
        "the successor starts from the copy brought here"
    );

    // Every trial ran to the end, the successor too, and no service was said to have failed
    // to bring the copy (the holder was not known: the services that did not have it are
    // asked silently).
    let succeeded = state
        .trials
        .iter()
        .filter(|t| t.status == TrialStatus::Succeeded)
        .count();
    assert_eq!(succeeded as u64, trials, "{:?}", state.warnings);
    assert!(
        state
            .warnings
            .iter()
            .all(|w| !w.message.contains("checkpoint")),
        "{:?}",
        state.warnings
    );
}

/// A service whose constructor fails: the experiment's error names it once, as the load error
/// already does ("training service broken: training service broken: constructor failed: …").
#[test]
fn a_service_that_cannot_be_built_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["broken"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let config = config(dir.path(), 1, 1, components.platforms, "Counter");
    let Err(error) = run_experiment(dir.path(), &config, &components) else {
        panic!("an experiment without its service ran");
    };
    assert_eq!(
        error.to_string(),
        "training service broken: constructor failed: classArgs of training service broken: machineList is empty"
    );
}

/// A trial its service says ended, failed, without ever saying it started has no attempt in the
/// store to end and run again: it ends FAILED with the service's reason, retries or not. The
/// manager stopped on it ("trial … is WAITING, so trial_requeued cannot follow").
#[test]
fn a_trial_ended_before_it_was_reported_started_fails_without_stopping_the_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["unstarted"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let mut config = config(dir.path(), 2, 1, components.platforms, "Counter");
    config.max_trial_retries = 2;
    let outcome = run_experiment(dir.path(), &config, &components);
    assert!(outcome.is_ok(), "{outcome:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials.len(), 2, "{:?}", state.trials);
    for trial in &state.trials {
        assert_eq!(trial.status, TrialStatus::Failed, "{trial:?}");
        let end = trial.end.as_ref().expect("an ended trial's end");
        let message = end.message.as_deref().unwrap_or_default();
        assert!(message.contains("bad trial command"), "{trial:?}");
    }
}

/// Answers ids below `THINKS_FROM` at once, like [`Counter`]; from there on it fits a model
/// first: the first such call waits for a message on `hold` (or `HOLD_LIMIT`). Keeps every
/// trial end it is told of in `ends`.
struct Thinking {
    hold: Option<std_mpsc::Receiver<()>>,
    ends: Ends,
}

/// The (parameter id, status) of each trial end a tuner was told of.
type Ends = Arc<Mutex<Vec<(u64, String)>>>;

/// The first id [`Thinking`] thinks about: the experiment's concurrency, so that every trial
/// it started at once ends while the tuner thinks.
const THINKS_FROM: u64 = 4;

impl Tuner for Thinking {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        unreachable!("built directly")
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        if parameter_id >= THINKS_FROM {
            if let Some(hold) = self.hold.take() {
                let _ = hold.recv_timeout(HOLD_LIMIT);
            }
        }
        Counter.generate_parameters(parameter_id)
    }

    fn receive_trial_result(
        &mut self,
        _parameter_id: u64,
        _parameters: &Value,
        _value: f64,
    ) -> Result<(), PluginError> {
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, status: &str) -> Result<(), PluginError> {
        self.ends
            .lock()
            .unwrap()
            .push((parameter_id, status.to_string()));
        Ok(())
    }
}

/// `2 × THINKS_FROM` trials, `THINKS_FROM` at a time on as many GPUs, with a [`Thinking`] tuner
/// on a thread of its own (as a plugin's tuner runs), whose first fit goes on once told so on the
/// sender returned; with the starts the service records and the trial ends the tuner is told.
fn thinking_experiment(
    dir: &std::path::Path,
) -> (
    std_mpsc::Sender<()>,
    Starts,
    Ends,
    Services,
    ExperimentConfig,
) {
    let (release, hold) = std_mpsc::channel();
    let hold = Mutex::new(Some(hold));
    let starts: Starts = Default::default();
    let ends: Ends = Default::default();
    let told = ends.clone();
    let components = Services {
        platforms: &["quick"],
        gpus: THINKS_FROM as u32,
        hold: Mutex::new(None),
        starts: starts.clone(),
        fetches: None,
        tuner: Box::new(move |name| {
            let hold = hold.lock().unwrap().take();
            let ends = told.clone();
            in_process::tuner_on_thread(name, Thinking { hold, ends })
        }),
    };
    let config = config(
        dir,
        2 * THINKS_FROM,
        THINKS_FROM as u32,
        components.platforms,
        "Thinking",
    );
    (release, starts, ends, components, config)
}

/// Whether the loop has recorded the first `THINKS_FROM` trials of a [`thinking_experiment`]
/// as ended, with nothing running: its tuner then thinks about the next ones.
fn first_trials_ended(progress: &watch::Receiver<manager::Progress>) -> bool {
    let progress = progress.borrow();
    progress.succeeded >= THINKS_FROM && progress.running == 0
}

/// Once the first trials of a [`thinking_experiment`] ended, applies `update` as the user
/// would (it must be applied), then lets the tuner answer (see [`release_when`]).
fn update_then_release(
    release: std_mpsc::Sender<()>,
    progress: watch::Receiver<manager::Progress>,
    commands: mpsc::UnboundedSender<manager::Command>,
    update: manager::Update,
) -> std::thread::JoinHandle<Option<Instant>> {
    release_when(release, move || {
        if !first_trials_ended(&progress) {
            return false;
        }
        let (reply_tx, reply) = tokio::sync::oneshot::channel();
        commands
            .send(manager::Command::Update(update.clone(), reply_tx))
            .unwrap();
        assert_eq!(
            reply.blocking_recv().unwrap(),
            Ok(manager::UpdateOutcome::Applied)
        );
        true
    })
}

/// A tuner that thinks long about a trial's parameters (a GP fitting its model on hundreds of
/// results) holds only the trials waiting for them: the loop records the other trials' results
/// and ends meanwhile, and keeps waiting for the tuner when nothing is left running, rather than
/// ending the experiment. On a thread of its own, as a plugin's tuner runs.
#[test]
fn a_tuner_thinking_long_holds_only_the_trials_it_owes() {
    let dir = tempfile::tempdir().unwrap();
    let (release, starts, _ends, components, config) = thinking_experiment(dir.path());
    let trials = config.max_trial_number.unwrap();
    let (progress, progress_rx) = watch::channel(manager::Progress::default());

    // Lets the tuner's first fit go once the loop has recorded every first trial as ended,
    // nothing running (or at `HOLD_LIMIT`, when the fit lets itself go); says which it was.
    let watcher = release_when(release, move || first_trials_ended(&progress_rx));

    let (_commands_tx, commands) = mpsc::unbounded_channel();
    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let released_after = watcher.join().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        released_after.is_some(),
        "the first {THINKS_FROM} trials were not recorded as ended while the tuner thought ({HOLD_LIMIT:?}): the loop waited on the tuner"
    );

    // The ids it thought about were paid in order once it answered, and every trial ran.
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len() as u64, trials, "{starts:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    let mut ran: Vec<(u64, f64)> = state
        .trials
        .iter()
        .map(|t| {
            assert_eq!(t.status, TrialStatus::Succeeded, "{:?}", state.warnings);
            (t.parameter_id, t.parameters["x"].as_f64().unwrap())
        })
        .collect();
    ran.sort_by_key(|(id, _)| *id);
    let expected: Vec<(u64, f64)> = (0..trials).map(|id| (id, id as f64 / 1000.0)).collect();
    assert_eq!(ran, expected);
}

/// Parameters the tuner owed when the user lowered `trialConcurrency` start one at a time under
/// the new concurrency, not all at once when the tuner pays them.
#[test]
fn parameters_owed_when_the_concurrency_is_lowered_wait_for_room() {
    let dir = tempfile::tempdir().unwrap();
    let (release, starts, _ends, components, config) = thinking_experiment(dir.path());
    let trials = config.max_trial_number.unwrap();
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // Once the first trials ended and the tuner owes the next four, the user lowers the
    // concurrency to 1; then the tuner answers.
    let update = manager::Update::TrialConcurrency(1);
    let watcher = update_then_release(release, progress_rx, commands_tx, update);

    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let released_after = watcher.join().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(released_after.is_some(), "the update was never sent");

    // The owed ids' trials ran one after the other: each started once the one before had
    // ended (each runs TRIAL_TIME).
    let starts = starts.lock().unwrap().clone();
    assert_eq!(starts.len() as u64, trials, "{starts:?}");
    let gaps: Vec<Duration> = starts[THINKS_FROM as usize..]
        .windows(2)
        .map(|pair| pair[1].0 - pair[0].0)
        .collect();
    assert!(
        gaps.iter().all(|gap| *gap >= TRIAL_TIME),
        "trials of the owed ids ran side by side under trialConcurrency 1: starts {gaps:?} apart"
    );
}

/// Parameters the tuner owed when the user lowered `maxTrialNumber` to what has run are not
/// run, and the tuner is told they ended (SYS_CANCELED): it would otherwise count them as
/// pending for the rest of the experiment (a constant liar's fantasies), a budget raised again
/// later included.
#[test]
fn parameters_owed_beyond_a_lowered_budget_are_told_ended() {
    let dir = tempfile::tempdir().unwrap();
    let (release, starts, ends, components, config) = thinking_experiment(dir.path());
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // Once the first trials ended and the tuner owes the next four, the user lowers
    // maxTrialNumber to the four that ran; then the tuner answers.
    let update = manager::Update::MaxTrialNumber(THINKS_FROM);
    let watcher = update_then_release(release, progress_rx, commands_tx, update);

    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let released_after = watcher.join().unwrap();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(released_after.is_some(), "the update was never sent");
    assert_eq!(starts.lock().unwrap().len() as u64, THINKS_FROM);
    let mut ends = ends.lock().unwrap().clone();
    ends.sort();
    let expected: Vec<(u64, String)> = (0..2 * THINKS_FROM)
        .map(|id| {
            let status = if id < THINKS_FROM {
                "SUCCEEDED"
            } else {
                "SYS_CANCELED"
            };
            (id, status.to_string())
        })
        .collect();
    assert_eq!(ends, expected);
}

/// A `knob stop` while the tuner is stuck thinking, with nothing running, ends the experiment
/// STOPPED: the loop does not wait for the answer, and the end waits for the stuck tuner only
/// its bounded patience (10 s), not until the tuner lets go.
#[test]
fn a_stop_while_the_tuner_is_stuck_ends_the_experiment() {
    let dir = tempfile::tempdir().unwrap();
    // Never sent on: the tuner's first fit lets go only at `HOLD_LIMIT` (or when this is
    // dropped, at the test's end).
    let (_release, _starts, _ends, components, config) = thinking_experiment(dir.path());
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // Once the first trials ended and the tuner thinks about the next ones, the user stops.
    let watcher = when_ready(move || {
        first_trials_ended(&progress_rx) && commands_tx.send(manager::Command::Stop).is_ok()
    });

    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let ended = Instant::now();
    let stop_sent = watcher
        .join()
        .unwrap()
        .expect("the first trials never ended");
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Stopped, "{outcome:?}");
    let took = ended - stop_sent;
    assert!(
        took < Duration::from_secs(20),
        "the stop took {took:?}: the end waited for the stuck tuner"
    );
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.status, ExperimentStatus::Stopped);
    assert_eq!(state.trials.len() as u64, THINKS_FROM, "{:?}", state.trials);
    assert!(state
        .trials
        .iter()
        .all(|t| t.status == TrialStatus::Succeeded));
}

/// A tuner that owes parameters while nothing runs and never pays them: after the loop's
/// patience (10 minutes, passed at once on tokio's paused clock) the experiment ends DONE, with
/// a warning for the console (it used to be only stored, so the run looked simply finished)
/// and that reason as its end message, which the summary prints.
#[test]
fn a_tuner_that_never_answers_ends_the_experiment_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    // Never sent on: the tuner's first fit lets go only at `HOLD_LIMIT` of real time, long
    // after the paused clock passed the patience.
    let (_release, _starts, _ends, components, mut config) = thinking_experiment(dir.path());
    // Its bound would pass first on the paused clock.
    config.max_experiment_duration = None;
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (_commands_tx, commands) = mpsc::unbounded_channel();
    let outcome =
        run_experiment_paused(dir.path(), &config, &components, progress, commands).unwrap();
    let gave_up = "owes parameters for";
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    let message = outcome.message.clone().unwrap_or_default();
    assert!(
        message.contains(gave_up) && message.contains("gave none in 600 s"),
        "{outcome:?}"
    );
    let notices = progress_rx.borrow().notices.clone();
    assert!(
        notices.iter().any(|n| n.warning
            && n.text.contains(gave_up)
            && n.text.contains("so the experiment ends")),
        "{notices:?}"
    );
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.status, ExperimentStatus::Done);
}

/// Defers every id, keeps no waker and never pays: a tuner that gives no parameters.
struct DefersAll;

impl Tuner for DefersAll {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        unreachable!("built directly")
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
        Ok(Generated::Deferred)
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

/// A tuner that defers every id with nothing running ends the experiment at once (nothing can
/// make it pay them), DONE, and says so: a `warning:` and the end message, as for a tuner given
/// up on. It ended "DONE: 0 trials" with exit 0 and no word why.
#[test]
fn a_tuner_that_defers_every_id_ends_the_experiment_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["quick"],
        gpus: 2,
        hold: Mutex::new(None),
        starts: Default::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, DefersAll)),
    };
    let config = config(dir.path(), 4, 2, components.platforms, "DefersAll");
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (_commands_tx, commands) = mpsc::unbounded_channel();
    let outcome =
        run_experiment_commanded(dir.path(), &config, &components, progress, commands).unwrap();
    let said = "tuner DefersAll deferred parameters for 2 trial(s) and gave none, with nothing running, so the experiment ends after 0 trial(s)";
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    let message = outcome.message.clone().unwrap_or_default();
    assert!(message.starts_with(said), "{outcome:?}");
    let notices = progress_rx.borrow().notices.clone();
    assert!(
        notices
            .iter()
            .any(|n| n.warning && n.text.starts_with(said)),
        "{notices:?}"
    );
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.status, ExperimentStatus::Done);
    assert!(state.trials.is_empty(), "{:?}", state.trials);
}

/// Answers like [`Counter`]; cannot take the result of the last of `trials` trials.
struct FailsOnTheLast {
    trials: u64,
}

impl Tuner for FailsOnTheLast {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        unreachable!("built directly")
    }

    fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        Counter.generate_parameters(parameter_id)
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        _parameters: &Value,
        _value: f64,
    ) -> Result<(), PluginError> {
        if parameter_id + 1 == self.trials {
            return Err(PluginError::new("the model cannot take this result"));
        }
        Ok(())
    }
}

/// A result is told to the tuner without waiting for its answer; at the experiment's natural end
/// the answers still to come are waited for, so a tuner that fails on the last result still ends
/// the experiment in ERROR with its message (on a thread of its own, as a plugin's tuner runs).
#[test]
fn a_tuner_failing_on_the_last_result_ends_the_experiment_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    const TRIALS: u64 = 3;
    let components = Services {
        platforms: &["quick"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: Default::default(),
        fetches: None,
        tuner: Box::new(|name| {
            in_process::tuner_on_thread(name, FailsOnTheLast { trials: TRIALS })
        }),
    };
    let config = config(
        dir.path(),
        TRIALS,
        1,
        components.platforms,
        "FailsOnTheLast",
    );
    let outcome = run_experiment(dir.path(), &config, &components).unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Error, "{outcome:?}");
    let message = outcome.message.unwrap_or_default();
    assert!(
        message.contains("the model cannot take this result"),
        "{message}"
    );
}

/// A service that reports a trial's final before the trial's start (its output reader ran
/// ahead of its start report) loses nothing: the final is held until the start is recorded,
/// then recorded as the attempt's, with a warning naming the service. The store refused the
/// metric (no attempt yet) and the experiment ended in ERROR.
#[test]
fn a_metric_reported_before_its_trials_start_is_recorded_with_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["early"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let config = config(dir.path(), 2, 1, components.platforms, "Counter");
    let outcome = run_experiment(dir.path(), &config, &components).unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials.len(), 2, "{:?}", state.trials);
    for trial in &state.trials {
        assert_eq!(trial.status, TrialStatus::Succeeded, "{trial:?}");
        let last = trial.final_metric().expect("its final recorded");
        assert_eq!(last.value, Some(0.75), "{trial:?}");
    }
    assert!(
        state.warnings.iter().any(|w| w.message.contains(
            "training service early reported a metric before it reported the trial started"
        )),
        "{:?}",
        state.warnings
    );
}

/// An end its service reports before the trial's start is no success: nothing of the trial is
/// recorded, so it ends FAILED saying why (it was SUCCEEDED with 0 attempts), the console
/// names the service, and the start and final its run reports after are ignored with a
/// warning, not silently. (The last trial's own late reports may come after the experiment
/// ended with its end: only the trials before it are checked for them.)
#[test]
fn an_end_reported_before_its_trials_start_fails_the_trial_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["endfirst"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let config = config(dir.path(), 3, 1, components.platforms, "Counter");
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (_commands_tx, commands) = mpsc::unbounded_channel();
    let outcome =
        run_experiment_commanded(dir.path(), &config, &components, progress, commands).unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials.len(), 3, "{:?}", state.trials);
    let last = state.trials.len() - 1;
    for (index, trial) in state.trials.iter().enumerate() {
        assert_eq!(trial.status, TrialStatus::Failed, "{trial:?}");
        let end = trial.end.as_ref().expect("an ended trial's end");
        let message = end.message.as_deref().unwrap_or_default();
        assert!(
            message
                .contains("endfirst reported it ended (exit code 0) before reporting it started"),
            "{trial:?}"
        );
        if index == last {
            continue;
        }
        let ignored = |what: &str| {
            state.warnings.iter().any(|w| {
                w.trial_id.as_deref() == Some(trial.trial_id.as_str()) && w.message.contains(what)
            })
        };
        assert!(
            ignored("start reported by training service endfirst after the trial ended"),
            "{:?}",
            state.warnings
        );
        assert!(
            ignored("metric after the trial ended ignored"),
            "{:?}",
            state.warnings
        );
    }
    let notices = progress_rx.borrow().notices.clone();
    assert!(
        notices.iter().any(|n| n.warning
            && n.text
                .contains("training service endfirst reported its end before its start")),
        "{notices:?}"
    );
}

/// An assessor whose first verdict never comes (it waits on a lock, a dead subprocess, a slow
/// fit) until `hold` says so, or `HOLD_LIMIT`. Says whether any call returned.
struct StuckAssessor {
    hold: Option<std_mpsc::Receiver<()>>,
    answered: Arc<std::sync::atomic::AtomicBool>,
}

impl knob_plugin_api::Assessor for StuckAssessor {
    fn new(_class_args: &Value) -> Result<Self, PluginError> {
        unreachable!("built by the test")
    }

    fn assess_trial(
        &mut self,
        _trial_id: &str,
        _history: &[f64],
    ) -> Result<knob_plugin_api::Verdict, PluginError> {
        if let Some(hold) = self.hold.take() {
            let _ = hold.recv_timeout(HOLD_LIMIT);
        }
        self.answered
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(knob_plugin_api::Verdict::stop("too late to matter"))
    }
}

/// [`Services`] with an assessor, on a thread of its own as a plugin's runs.
struct WithAssessor {
    services: Services,
    assessor: Mutex<Option<StuckAssessor>>,
}

impl Components for WithAssessor {
    fn provides(&self, kind: ComponentKind, name: &str) -> bool {
        kind == ComponentKind::Assessor || self.services.provides(kind, name)
    }

    fn tuner(&self, name: &str, class_args: &Value) -> Result<TunerHandle, HostError> {
        self.services.tuner(name, class_args)
    }

    fn assessor(
        &self,
        name: &str,
        _class_args: &Value,
        context: &AssessorContext,
    ) -> Result<AssessorHandle, HostError> {
        let assessor = self.assessor.lock().unwrap().take().expect("one assessor");
        in_process::assessor_on_thread(name, assessor, context)
    }

    fn training_service(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        on_event: EventCallback,
    ) -> Result<TrainingServiceHandle, HostError> {
        self.services
            .training_service(platform, config, context, on_event)
    }

    fn clean_up_leftovers(
        &self,
        platform: &str,
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, HostError> {
        self.services
            .clean_up_leftovers(platform, config, context, trial_ids)
    }
}

/// An experiment of `trials` trials, one at a time, on a service that reports an intermediate
/// result and a final, with the stuck assessor; `answered` says whether the assessor ever
/// answered, `_release` lets it go (dropped: at the test's end).
fn stuck_assessor_experiment(
    dir: &std::path::Path,
    trials: u64,
) -> (
    std_mpsc::Sender<()>,
    Arc<std::sync::atomic::AtomicBool>,
    WithAssessor,
    ExperimentConfig,
) {
    let (release, hold) = std_mpsc::channel();
    let answered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let components = WithAssessor {
        services: Services {
            platforms: &["reporting"],
            gpus: 1,
            hold: Mutex::new(None),
            starts: Starts::default(),
            fetches: None,
            tuner: Box::new(|name| in_process::tuner(name, Counter)),
        },
        assessor: Mutex::new(Some(StuckAssessor {
            hold: Some(hold),
            answered: answered.clone(),
        })),
    };
    let mut config = config(dir, trials, 1, &["reporting"], "Counter");
    config.assessor = Some(AlgorithmConfig {
        name: Some("Stuck".into()),
        class_name: None,
        code_directory: None,
        class_args: Default::default(),
        python_interpreter: None,
        use_nni_implementation: false,
        dispatcher_connect_timeout: None,
    });
    (release, answered, components, config)
}

/// An assessor stuck in its first verdict holds no trial: every trial's results and end are
/// recorded and the experiment ends, while the assessor still has not answered (the loop
/// awaited the verdict: finished trials stayed RUNNING with their results unrecorded, until
/// the assessor let go).
#[test]
fn an_assessor_stuck_in_a_verdict_holds_no_trial() {
    let dir = tempfile::tempdir().unwrap();
    let (_release, answered, components, config) = stuck_assessor_experiment(dir.path(), 3);
    let outcome = run_experiment(dir.path(), &config, &components);
    let still_stuck = !answered.load(std::sync::atomic::Ordering::SeqCst);
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    assert!(still_stuck, "the experiment waited for the stuck assessor");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials.len(), 3, "{:?}", state.trials);
    for trial in &state.trials {
        // Its verdict (a stop) came too late to mean anything: the trial ran to its end.
        assert_eq!(trial.status, TrialStatus::Succeeded, "{trial:?}");
        assert_eq!(trial.final_metric().and_then(|m| m.value), Some(1.0));
    }
}

/// A stop while the assessor is stuck in a verdict ends the experiment STOPPED: the loop hears
/// the stop (it did not, awaiting the verdict), and the end waits for the assessor only its
/// bounded patience.
#[test]
fn a_stop_while_the_assessor_is_stuck_ends_the_experiment() {
    let dir = tempfile::tempdir().unwrap();
    let (_release, answered, components, config) = stuck_assessor_experiment(dir.path(), 1000);
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();
    // Once two trials ended (the assessor stuck since the first one's result), the user stops.
    let watcher = when_ready(move || {
        let ended = progress_rx.borrow().succeeded >= 2;
        ended && commands_tx.send(manager::Command::Stop).is_ok()
    });
    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let still_stuck = !answered.load(std::sync::atomic::Ordering::SeqCst);
    watcher
        .join()
        .unwrap()
        .expect("two trials never ended while the assessor was stuck");
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Stopped, "{outcome:?}");
    assert!(still_stuck, "the stop waited for the stuck assessor");
}

/// A training service whose `shutdown` never returns (waiting on a host that stopped
/// answering) held the finished experiment's end forever: no DONE recorded, nothing said, and
/// the first Ctrl-C or SIGTERM unheard. Now the late shutdown is named on the console, a stop
/// ends the wait at once, and the experiment is recorded DONE, with a warning that the service
/// did not shut down.
#[test]
fn a_service_that_never_shuts_down_does_not_hold_the_experiments_end() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["unending"],
        gpus: 2,
        hold: Mutex::new(None),
        starts: Default::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let config = config(dir.path(), 2, 2, components.platforms, "Counter");
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // Once the console names the late shutdown, the user stops (the first Ctrl-C).
    let watcher = when_ready(move || {
        let named = progress_rx.borrow().notices.iter().any(|notice| {
            notice
                .text
                .contains("training service(s) unending have not shut down")
        });
        named && commands_tx.send(manager::Command::Stop).is_ok()
    });

    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let ended = Instant::now();
    let stop_sent = watcher
        .join()
        .unwrap()
        .expect("the console never named the service that does not shut down");
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Done, "{outcome:?}");
    let took = ended - stop_sent;
    // Well under the 40 s the service's shutdown takes, with room for a loaded machine.
    assert!(
        took < Duration::from_secs(20),
        "the stop took {took:?}: the end waited for the service's shutdown"
    );
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.status, ExperimentStatus::Done);
    assert!(state
        .trials
        .iter()
        .all(|t| t.status == TrialStatus::Succeeded));
    assert!(
        state.warnings.iter().any(|w| w
            .message
            .contains("training service unending did not shut down")),
        "{:?}",
        state.warnings
    );
}

/// A `start_trial` that never returns (a third-party service stuck on its host) held a stop for
/// ever: the trial's kill queued behind the start on the service's thread, so the trial never
/// ended and the loop waited for it. Now the console names the trial the stop waits for after
/// 10 s, the stop gives it up after 30 s (passed at once on the paused clock), saying it may
/// still run, and the experiment is recorded STOPPED with the trial ended as the stop decided;
/// the shutdown, queued behind the start too, is then waited for as any late one is.
#[test]
fn a_start_that_never_returns_does_not_hold_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (release, held) = std_mpsc::channel();
    let components = Services {
        platforms: &["stuckstart"],
        gpus: 1,
        hold: Mutex::new(Some(held)),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let mut config = config(dir.path(), 1, 1, components.platforms, "Counter");
    // Its bound would pass first on the paused clock.
    config.max_experiment_duration = None;
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // The user stops once the start is asked, and again once the late shutdown is named (the
    // first Ctrl-C, then the one that ends the wait for the shutdown).
    let starts = components.starts.clone();
    let stops = commands_tx.clone();
    let first_stop = when_ready(move || {
        !starts.lock().unwrap().is_empty() && stops.send(manager::Command::Stop).is_ok()
    });
    let notices = progress_rx.clone();
    let second_stop = when_ready(move || {
        let named = notices.borrow().notices.iter().any(|notice| {
            notice
                .text
                .contains("training service(s) stuckstart have not shut down")
        });
        named && commands_tx.send(manager::Command::Stop).is_ok()
    });

    let outcome = run_experiment_paused(dir.path(), &config, &components, progress, commands);
    let ended = Instant::now();
    drop(release);
    let stopped = first_stop
        .join()
        .unwrap()
        .expect("the service was never asked to start the trial");
    second_stop
        .join()
        .unwrap()
        .expect("the console never named the service that does not shut down");
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Stopped, "{outcome:?}");
    // The shutdown's 10 s of real time, with room for a loaded machine; the held start lets
    // go only at `HOLD_LIMIT` (40 s).
    let took = ended - stopped;
    assert!(
        took < Duration::from_secs(30),
        "the stop took {took:?}: it waited for the stuck start"
    );
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.status, ExperimentStatus::Stopped);
    assert_eq!(state.trials.len(), 1, "{:?}", state.trials);
    let trial = &state.trials[0];
    assert_eq!(trial.status, TrialStatus::UserCanceled, "{trial:?}");
    let notices = progress_rx.borrow().notices.clone();
    let said = |what: &str| notices.iter().any(|n| n.warning && n.text.contains(what));
    let id = &trial.trial_id;
    assert!(
        said(&format!(
            "the stop waits for trial(s) {id}: training service stuckstart has not answered their start or kill in 10 s"
        )),
        "{notices:?}"
    );
    assert!(
        said(&format!(
            "trial(s) {id} could not be killed: training service stuckstart has not answered their start or kill"
        )),
        "{notices:?}"
    );
}

/// A stop that comes while starts wait on the service's thread (a burst after the concurrency
/// was raised, behind one slow start) starts none of them: each start whose kill came first is
/// not sent (the host answers it not started), the trial ends as the stop decided, without a
/// warning, and its kill is not sent either. It used to start every queued trial's process,
/// then kill it: 182 of 200 spawned after a `knob stop`.
#[test]
fn starts_still_queued_when_the_stop_comes_are_not_sent() {
    let dir = tempfile::tempdir().unwrap();
    const TRIALS: u64 = 4;
    let (release, held) = std_mpsc::channel();
    let components = Services {
        platforms: &["stuckstart"],
        gpus: TRIALS as u32,
        hold: Mutex::new(Some(held)),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let mut config = config(
        dir.path(),
        TRIALS,
        TRIALS as u32,
        components.platforms,
        "Counter",
    );
    config.max_experiment_duration = None;
    let (progress, progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();

    // The first start is held on the service's thread, the other three wait behind it; the
    // user stops. Once the stop's kills are queued too (the stop names the trials it waits
    // for), the start lets go.
    let starts = components.starts.clone();
    let stopper = when_ready(move || {
        !starts.lock().unwrap().is_empty() && commands_tx.send(manager::Command::Stop).is_ok()
    });
    let notices = progress_rx.clone();
    let releaser = release_when(release, move || {
        notices
            .borrow()
            .notices
            .iter()
            .any(|notice| notice.text.contains("the stop waits for trial(s)"))
    });

    let outcome = run_experiment_paused(dir.path(), &config, &components, progress, commands);
    stopper.join().unwrap().expect("no start was asked");
    releaser
        .join()
        .unwrap()
        .expect("the stop never named the trials it waits for");
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Stopped, "{outcome:?}");
    let started: std::collections::BTreeSet<String> = components
        .starts
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, trial)| trial.clone())
        .collect();
    assert_eq!(started.len(), 1, "the service started {started:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    assert_eq!(state.trials.len() as u64, TRIALS, "{:?}", state.trials);
    for trial in &state.trials {
        assert_eq!(trial.status, TrialStatus::UserCanceled, "{trial:?}");
    }
    assert!(
        !state
            .warnings
            .iter()
            .any(|w| w.message.contains("could not start")),
        "{:?}",
        state.warnings
    );
}

/// A stop that comes before the loop's first turn (a `knob stop` while a resume reads its store
/// and reaches its hosts: the console already says the experiment stops) starts no trial. The
/// loop heard it only after its first round had started trials, whose attempts then ran
/// nothing, and a cluster job was submitted after the stop.
#[test]
fn a_stop_queued_before_the_loop_runs_starts_no_trial() {
    let dir = tempfile::tempdir().unwrap();
    let components = Services {
        platforms: &["quick"],
        gpus: 2,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    let config = config(dir.path(), 4, 2, components.platforms, "Counter");
    let (progress, _progress_rx) = watch::channel(manager::Progress::default());
    let (commands_tx, commands) = mpsc::unbounded_channel();
    commands_tx.send(manager::Command::Stop).unwrap();

    let outcome = run_experiment_commanded(dir.path(), &config, &components, progress, commands);
    let outcome = outcome.unwrap();
    assert_eq!(outcome.status, ExperimentStatus::Stopped, "{outcome:?}");
    let starts = components.starts.lock().unwrap().clone();
    assert!(starts.is_empty(), "started after the stop: {starts:?}");
    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    for trial in &state.trials {
        assert!(trial.attempts.is_empty(), "{trial:?}");
    }
}

/// A successor created before a resume (where its parent's checkpoint is not known) placed
/// under another service than the one holding that checkpoint, whose host is not connected yet
/// (it reconnects a moment after the resume): that service's fetch fails. The successor started
/// at once without the copy, from scratch, its restore folder missing and nothing said. Now it
/// waits, is placed again after a backoff, and starts from the copy the second fetch brings.
#[test]
fn a_successor_whose_parents_checkpoint_cannot_be_brought_yet_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let fetches = Arc::new(Fetches {
        hold: Mutex::new(None),
        calls: Default::default(),
        held_since: Default::default(),
        restores: Default::default(),
        first_fails: true,
    });
    let components = Services {
        platforms: &["north", "east"],
        gpus: 2,
        hold: Mutex::new(None),
        starts: Starts::default(),
        fetches: Some(fetches.clone()),
        tuner: Box::new(|name| in_process::tuner(name, Population)),
    };
    let config = config(dir.path(), 4, 2, components.platforms, "Population");
    let outcome = run_experiment(dir.path(), &config, &components);
    assert!(outcome.is_ok(), "{outcome:?}");

    let state = Store::open(dir.path()).unwrap().replay().unwrap();
    let successor = state
        .trials
        .iter()
        .find(|t| t.lineage.as_ref().is_some_and(|l| l.parent.is_some()))
        .expect("the successor was created");
    let calls = fetches.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        *fetches.restores.lock().unwrap(),
        [(successor.trial_id.clone(), true)],
        "the successor starts from the copy brought here; fetches: {calls:?}"
    );
    assert_eq!(successor.status, TrialStatus::Succeeded, "{successor:?}");
    assert_eq!(successor.attempts.len(), 1, "{successor:?}");
    // The wait is said, with the service's reason.
    assert!(
        state
            .warnings
            .iter()
            .any(|w| w.trial_id.as_ref() == Some(&successor.trial_id)
                && w.message.contains("could not be brought here yet")
                && w.message.contains("host node0 is not connected yet")),
        "{:?}",
        state.warnings
    );
}

/// Once no trial waits to be placed any more (here: the last one that waited for the GPU
/// started), the services are told at once, so that one standing in a shared machine's line for
/// its waiting trials leaves it then; not at the next trial's wait, nor never.
#[test]
fn the_services_are_told_when_no_trial_waits_any_more() {
    let dir = tempfile::tempdir().unwrap();
    let starts: Starts = Default::default();
    let components = Services {
        platforms: &["told"],
        gpus: 1,
        hold: Mutex::new(None),
        starts: starts.clone(),
        fetches: None,
        tuner: Box::new(|name| in_process::tuner(name, Counter)),
    };
    // Two at a time on one GPU: the second trial waits for the first.
    let config = config(dir.path(), 2, 2, components.platforms, "Counter");
    let outcome = run_experiment(dir.path(), &config, &components);
    assert!(outcome.is_ok(), "{outcome:?}");
    let starts = starts.lock().unwrap().clone();
    let trial_starts: Vec<Instant> = starts
        .iter()
        .filter(|(_, service, _)| *service == "told")
        .map(|(at, _, _)| *at)
        .collect();
    let told: Vec<Instant> = starts
        .iter()
        .filter(|(_, service, _)| *service == NOTHING_WAITS)
        .map(|(at, _, _)| *at)
        .collect();
    assert_eq!(trial_starts.len(), 2, "{starts:?}");
    // Told once: after the waiting trial started, in the same moment.
    assert_eq!(told.len(), 1, "{starts:?}");
    assert!(told[0] >= trial_starts[1], "{starts:?}");
    assert!(
        told[0] - trial_starts[1] < Duration::from_secs(1),
        "{starts:?}"
    );
}
