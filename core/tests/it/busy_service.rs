//! A training service busy with one long call (a remote start waiting on a host that stopped
//! answering, a large code upload: a service answers its calls in order) holds only itself: the
//! manager's loop does not wait on it, so the experiment's other service goes on placing,
//! running and ending trials meanwhile. The real manager, store and gpu-sched on the real
//! clock, with two in-process services, each on a thread of its own as a plugin's runs.

use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knob_core::config::{
    AlgorithmConfig, ExperimentConfig, LogLevel, PlacementPolicy, TrainingServiceConfig,
    TunerErrorPolicy,
};
use knob_core::manager::{self, Components, EventCallback};
use knob_core::store::{Store, StoreEvent, TrialStatus};
use knob_gpu_sched::{ByteSize, Gpu, HostResources};
use knob_plugin_api::host::{
    in_process, AssessorHandle, HostError, TrainingServiceHandle, TunerHandle,
};
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

/// When each trial was started, and by which service.
type Starts = Arc<Mutex<Vec<(Instant, &'static str, String)>>>;

struct Service {
    name: &'static str,
    events: EventSink,
    /// The first start waits for a message here (or `HOLD_LIMIT`): a start stuck on its host.
    hold: Option<std_mpsc::Receiver<()>>,
    starts: Starts,
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
        let gpus = vec![Gpu::idle(0, "Test GPU", ByteSize::gib(16))];
        let inventory = knob_gpu_sched::Environment::new(id.clone(), "node0", gpus, host);
        Ok(vec![Environment {
            id,
            host: "node0".into(),
            ready: true,
            inventory: serde_json::to_value(inventory).unwrap(),
        }])
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        if let Some(hold) = self.hold.take() {
            let _ = hold.recv_timeout(HOLD_LIMIT);
        }
        let trial_id = request.trial_id;
        self.starts
            .lock()
            .unwrap()
            .push((Instant::now(), self.name, trial_id.clone()));
        let events = self.events.clone();
        std::thread::spawn(move || {
            events.emit(&ServiceEvent::TrialStarted {
                trial_id: trial_id.clone(),
                pid: None,
            });
            std::thread::sleep(TRIAL_TIME);
            events.emit(&ServiceEvent::Metric {
                trial_id: trial_id.clone(),
                kind: MetricKind::Final,
                sequence: 0,
                value: "1".into(),
            });
            events.emit(&ServiceEvent::TrialEnded {
                trial_id,
                exit_code: Some(0),
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                environment_lost: None,
            });
        });
        Ok(())
    }

    fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
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

struct TwoServices {
    hold: Mutex<Option<std_mpsc::Receiver<()>>>,
    starts: Starts,
}

const PLATFORMS: [&str; 2] = ["quick", "busy"];

impl Components for TwoServices {
    fn provides(&self, kind: ComponentKind, name: &str) -> bool {
        match kind {
            ComponentKind::Tuner => name == "Counter",
            ComponentKind::Assessor => false,
            ComponentKind::TrainingService => PLATFORMS.contains(&name),
        }
    }

    fn tuner(&self, name: &str, _class_args: &Value) -> Result<TunerHandle, HostError> {
        Ok(in_process::tuner(name, Counter))
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
        let name = if platform == "busy" { "busy" } else { "quick" };
        let hold = if name == "busy" {
            self.hold.lock().unwrap().take()
        } else {
            None
        };
        let starts = self.starts.clone();
        in_process::training_service_on_thread(platform, on_event, move |events| {
            Ok(Service {
                name,
                events,
                hold,
                starts,
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

fn config(dir: &std::path::Path, trials: u64) -> ExperimentConfig {
    ExperimentConfig {
        experiment_name: Some("busy-service".into()),
        trial_command: "in process".into(),
        trial_code_directory: dir.to_path_buf(),
        // One trial always waits for a GPU, so the manager re-probes the machines every 5 s.
        trial_concurrency: 3,
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
            name: Some("Counter".into()),
            class_name: None,
            code_directory: None,
            class_args: Default::default(),
            python_interpreter: None,
            use_nni_implementation: false,
            dispatcher_connect_timeout: None,
        },
        assessor: None,
        training_service: PLATFORMS
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

#[test]
fn a_service_stuck_in_a_start_does_not_hold_the_other_services_trials() {
    let dir = tempfile::tempdir().unwrap();
    let (release, hold) = std_mpsc::channel();
    let starts: Starts = Default::default();
    let components = TwoServices {
        hold: Mutex::new(Some(hold)),
        starts: starts.clone(),
    };
    let trials = QUICK_STARTS as u64 + 4;
    let config = config(dir.path(), trials);

    // Lets the busy service's start go once the quick one has started `QUICK_STARTS` trials
    // (or at `HOLD_LIMIT`, when the start lets itself go); says which it was.
    let watcher = std::thread::spawn({
        let starts = starts.clone();
        move || {
            let began = Instant::now();
            while began.elapsed() < HOLD_LIMIT {
                let quick = starts
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(_, service, _)| *service == "quick")
                    .count();
                if quick >= QUICK_STARTS {
                    let _ = release.send(());
                    return Some(began.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        }
    });

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let outcome = runtime.block_on(async {
        let store = Store::open(dir.path()).unwrap();
        store
            .append(StoreEvent::ExperimentCreated {
                experiment_id: "busy".into(),
                config: serde_json::to_value(&config).unwrap(),
                start_time_ms: 0,
            })
            .await
            .unwrap();
        let experiment = manager::Experiment {
            id: "busy".into(),
            dir: dir.path().to_path_buf(),
            config: config.clone(),
            history: None,
            config_file: None,
        };
        let (_commands_tx, commands) = mpsc::unbounded_channel();
        let (progress, _progress_rx) = watch::channel(manager::Progress::default());
        manager::run(experiment, store, &components, commands, progress).await
    });
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
