//! The trial-management loop: one event-driven task per experiment.
//!
//! It asks the tuner for parameters, submits trials to the training service up to
//! `trialConcurrency`, and reacts at once to what happens: a trial's metric, its end, a
//! tuner's unprompted suggestion, a deadline, a command. There are no fixed sleeps: a trial's
//! end triggers the next suggestion and submission in the same turn of the loop.
//!
//! Architecture invariant: every state change is appended to the store, and acknowledged by it,
//! before the loop acts on it (starts a trial, tells the tuner, reports progress).

mod assessor_driver;
mod book;
mod components;
mod environments;
mod event_loop;
mod events;
mod placement;
mod population;
mod resume;
mod services;
mod timers;
mod trial;
mod tuner_driver;
mod tuner_output;
mod update;

pub use components::{Components, EventCallback};
use event_loop::Manager;
pub use placement::Placer;
pub use services::{check_secrets, clean_up_leftovers, restore_secrets, service_context};
pub use timers::{TUNER_PATIENCE, TUNER_QUIET_NOTICE};
pub use trial::TrialSummary;
/// The one rule for what a tuner may hand out, shared with `knob plugin try`.
pub use tuner_output::refusal as tuner_output_refusal;
pub use update::check_new_search_space;

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use knob_plugin_api::host::{HostError, PluginRegistry};
use knob_plugin_api::ComponentKind;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::ExperimentConfig;
use crate::store::{ExperimentState, ExperimentStatus, Store, StoreError, StoreEvent};

/// Why the manager could not run or had to stop an experiment.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    // Transparent, not `{0}`: with `#[from]` that would make the inner error the source too,
    // and a caller printing the chain (`{:#}`) would print the line twice.
    #[error(transparent)]
    Plugin(#[from] HostError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Unsupported(String),
    #[error("cannot place trials: {0}")]
    Placement(String),
    #[error("training service {service}: {message}")]
    Service { service: String, message: String },
    /// A secret a training service needs is not known (a resumed experiment whose config file
    /// is gone).
    #[error("{0}")]
    MissingSecret(String),
    /// Every environment is gone (hosts unreachable or lost) while trials wait.
    #[error("{0}")]
    NoEnvironment(String),
    /// The experiment never started (a component could not be built, no environment came up):
    /// no trial ran. A caller that just created it may take it back.
    #[error("{0}")]
    NotStarted(Box<ManagerError>),
    /// The tuner handed out parameters the search space does not hold (`tunerErrorPolicy`).
    #[error("{0}")]
    TunerOutput(String),
}

/// A snapshot for progress displays, published after every change.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub status: Option<ExperimentStatus>,
    pub submitted: u64,
    pub running: u64,
    pub succeeded: u64,
    pub failed: u64,
    pub other_ended: u64,
    /// (trial id, default metric) of the best final result so far.
    pub best: Option<(String, f64)>,
    pub elapsed: Duration,
    pub max_trial_number: Option<u64>,
    pub max_duration: Option<Duration>,
    /// Parameter sets the tuner handed out that the search space refused and that were dropped
    /// (`tunerErrorPolicy: skip`).
    pub dropped_suggestions: u64,
    /// Lines about environments (a host unreachable, lost, ready again) and trials (a result
    /// that cannot be read), oldest first: what a console shows as they come.
    pub notices: std::sync::Arc<Vec<Notice>>,
}

/// A line for the console (see [`Progress::notices`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// A problem (a host unreachable or lost, a result that cannot be read) rather than news
    /// that asks nothing of anyone (an environment ready).
    pub warning: bool,
    pub text: String,
}

/// Commands from outside the loop (Ctrl-C, the CLI, the HTTP API).
#[derive(Debug)]
pub enum Command {
    /// Stop: kill every running trial, record them USER_CANCELED, end STOPPED.
    Stop,
    /// A change while the experiment runs; the answer says whether it was applied, or why not.
    Update(Update, oneshot::Sender<Result<UpdateOutcome, Refusal>>),
    /// The environments the training services reported, as the manager sees them now (the
    /// store does not record them; the dashboard's experiment panel asks).
    Environments(oneshot::Sender<Vec<EnvironmentView>>),
}

/// One environment (a host, a cluster allocation, the local machine) as the manager sees it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EnvironmentView {
    pub id: String,
    /// The training service that reported it.
    pub platform: String,
    pub host: String,
    pub ready: bool,
    /// Why it is not ready, when its service said.
    pub why: Option<String>,
}

/// What can change while an experiment runs. Each change is recorded in the store
/// (`ConfigUpdated`) before it takes effect, so a resume sees it too.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    TrialConcurrency(u32),
    MaxTrialNumber(u64),
    MaxExperimentDuration(Duration),
    SearchSpace(Value),
    /// Kill one trial; it is recorded USER_CANCELED.
    KillTrial(String),
    /// Run a trial with these parameters (they must belong to the search space).
    AddTrial(Value),
}

/// What an applied update did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateOutcome {
    Applied,
    /// The id of the trial `AddTrial` created.
    TrialAdded(String),
    /// `KillTrial` of a trial whose environment cannot be reached now: the kill is recorded
    /// and asked of its service, which carries it out when the host answers again; nothing
    /// has reached the trial yet.
    KillPending {
        /// The environment's host, as its service names it.
        host: String,
        /// Why it cannot be reached.
        why: String,
    },
}

/// Why an update was not applied, one line for whoever asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The update itself is wrong (a value out of range, parameters outside the search space);
    /// the API answers 400.
    Invalid(String),
    /// The update is well formed but the experiment's state refuses it now (its trial budget is
    /// used up, the trial already ended); the API answers 409, as NNI does.
    Conflict(String),
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal::Invalid(message)
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Refusal {
        Refusal::Invalid(message.to_owned())
    }
}

/// How the loop ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub status: ExperimentStatus,
    /// For ERROR: what went wrong, one line; for DONE, why it ended before its trial budget
    /// (the tuner had no more parameters, or owed some and gave none in time), if it did.
    pub message: Option<String>,
    pub trials: Vec<TrialSummary>,
}

/// Everything needed to run one experiment.
pub struct Experiment {
    pub id: String,
    pub dir: PathBuf,
    pub config: ExperimentConfig,
    /// For `knob resume`: the experiment as its store recorded it.
    pub history: Option<ExperimentState>,
    /// The config file the experiment was read from, when there is one. It may hold secrets
    /// in clear, so it goes to the services (`ServiceContext::config_file`), and those that
    /// copy the trial code elsewhere leave it out.
    pub config_file: Option<PathBuf>,
}

/// Runs an experiment to its end. `commands` lets the caller stop it; `progress` is updated
/// after every change.
pub async fn run(
    experiment: Experiment,
    store: Store,
    components: &dyn Components,
    commands: mpsc::UnboundedReceiver<Command>,
    progress: watch::Sender<Progress>,
) -> Result<Outcome, ManagerError> {
    run_observed(experiment, store, components, commands, progress, None).await
}

/// [`run`], telling `observer` each time the loop starts or stops waiting (see [`LoopState`]).
pub async fn run_observed(
    experiment: Experiment,
    store: Store,
    components: &dyn Components,
    commands: mpsc::UnboundedReceiver<Command>,
    progress: watch::Sender<Progress>,
    observer: Option<watch::Sender<LoopState>>,
) -> Result<Outcome, ManagerError> {
    let started = Manager::start(experiment, store.handle(), components, commands, progress).await;
    let started = started.map(|mut manager| {
        manager.observer = observer;
        manager
    });
    let mut manager = match started {
        Ok(manager) => manager,
        Err(e) => {
            // Nothing ran; record why the experiment ended before it began.
            let status = ExperimentStatus::Error;
            store
                .append(StoreEvent::ExperimentStatusChanged {
                    status,
                    message: Some(e.to_string()),
                    spent_before_ms: None,
                })
                .await?;
            return Err(ManagerError::NotStarted(Box::new(e)));
        }
    };
    if let Some(observer) = &manager.observer {
        // An observer that meters the polls (the simulator's bench) counts those that ended
        // before `started` as the start's: this poll ends here, so that none is shared.
        tokio::task::yield_now().await;
        observer.send_modify(|state| state.started = true);
    }
    let result = manager.run_loop().await;
    let outcome = manager.finish(result).await;
    store.close()?;
    outcome
}

/// The plugin component that runs `algorithm` and its class args: NNI's dispatcher plugin for
/// what runs through NNI (`crate::nni_dispatch`), else the algorithm's own name.
fn algorithm_component(
    kind: ComponentKind,
    algorithm: &crate::config::AlgorithmConfig,
    config: &ExperimentConfig,
    components: &dyn Components,
    run: Option<crate::nni_dispatch::Run<'_>>,
) -> Result<(String, Value), ManagerError> {
    crate::nni_dispatch::component(kind, algorithm, config.log_level, run, |name| {
        components.provides(kind, name)
    })
    .ok_or_else(|| ManagerError::Unsupported(format!("the config names no {kind}")))
}

/// The plugin components an experiment needs, so a caller can check them before creating it.
pub fn required_components(
    config: &ExperimentConfig,
    registry: &PluginRegistry,
) -> Result<Vec<(ComponentKind, String)>, ManagerError> {
    let (tuner, _) =
        algorithm_component(ComponentKind::Tuner, &config.tuner, config, registry, None)?;
    let mut components = vec![(ComponentKind::Tuner, tuner)];
    if let Some(assessor) = &config.assessor {
        let (assessor, _) =
            algorithm_component(ComponentKind::Assessor, assessor, config, registry, None)?;
        components.push((ComponentKind::Assessor, assessor));
    }
    for name in services::service_names(config) {
        components.push((ComponentKind::TrainingService, name.to_string()));
    }
    Ok(components)
}

/// What the loop is doing, for a caller that moves time itself (the simulator, on tokio's paused
/// clock): it may let time pass only while the loop waits with nothing left to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoopState {
    /// Whether the manager has started (the history replayed, the services' environments
    /// registered, the tuner told what ran before): what it does from then on is its loop.
    pub started: bool,
    /// How many times the loop has started to wait.
    pub turn: u64,
    /// Waiting for a service event, a command or `next_deadline`; false while it works.
    pub waiting: bool,
    /// When it wakes by itself if nothing else happens first.
    pub next_deadline: Option<Instant>,
    /// What woke it, counted over the turns so far.
    pub wakes: Wakes,
}

/// What woke the manager's loop, counted by cause (the simulator's bench prints them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wakes {
    /// Service events (trial starts, metrics, ends, environments), however many at once.
    pub service_events: u64,
    /// Its own deadline: of these, `reprobes` were the machine's re-probe while trials waited,
    /// and `overdue` found trials past their `maxTrialDuration`; the rest, a retry's backoff
    /// ending or the experiment's deadline.
    pub deadlines: u64,
    pub reprobes: u64,
    pub overdue: u64,
    /// Commands (stop, update, environments), starts a service refused, and a tuner or
    /// assessor that woke it (or the loop's own return for trials one turn left to create).
    pub commands: u64,
    pub start_failures: u64,
    pub components: u64,
}

impl Wakes {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &Wakes) {
        self.service_events += other.service_events;
        self.deadlines += other.deadlines;
        self.reprobes += other.reprobes;
        self.overdue += other.overdue;
        self.commands += other.commands;
        self.start_failures += other.start_failures;
        self.components += other.components;
    }
}
