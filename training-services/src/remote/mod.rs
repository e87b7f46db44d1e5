//! The `remote` training service: each machine of `machineList` is one environment, reached
//! over SSH only; a `knob-agent` on the host runs the trials (see `agent_protocol`).
//!
//! - [`config`]: the service's config as the user writes it, checked and made canonical here
//!   (the core keeps only positions and secrets), and the class args made from it.
//! - [`args`]: the class args (NNI's `machineList`, `reuseMode`, knob's extension fields).
//! - [`ssh`]: one SSH connection: host key against known_hosts, authentication, commands.
//! - [`setup`]: platform check and agent upload.
//! - [`host`]: one host's life (connect, attach, heartbeats, reconnect, loss) and its trials.
//! - [`leftovers`]: ending what a crashed run left on the hosts.
//!
//! All network work runs on the service's own tokio runtime; the trait methods block on it,
//! each bounded in time.
//!
//! A host lost for good (unreachable for `hostLossTimeoutSecs`) has each of its running trials
//! ended with `environment_lost` set, and the core runs them elsewhere. Reconnection is still
//! tried afterwards (about an hour), the host reported not ready with its inventory meanwhile,
//! so that the core waits for it; then by its status alone (`Host::give_up`), so that it does
//! not. A host that comes back is ready again, but empty: trials the daemon there
//! still runs were already reported ended, so they are killed and their events dropped. (Its
//! daemon is not restarted with `fresh_start`: that is only for a new manager process.)

pub mod args;
pub mod config;
pub mod host;
pub mod known_hosts;
mod leftovers;
pub mod setup;
pub mod ssh;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knob_plugin_api::service::{
    CheckedConfig, ConfigProblem, Environment, ServiceContext, ServiceEvent, TrialRequest,
};
use knob_plugin_api::{EventSink, PluginError, TrainingService};
use serde_json::Value;
use tokio::sync::watch;

pub use args::{ArgsError, Machine, RemoteArgs};
use host::{Context, Host};
use setup::AgentBinary;

use crate::code_archive::{self, ArchiveLimits, CodeArchive};
use crate::metrics::Emit;
use crate::starts::StartsUnderWay;

/// How long `new` waits for the first connection to every host (they connect concurrently).
const FIRST_CONNECT_LIMIT: Duration = Duration::from_secs(60);
/// Once a host is up, how much longer `new` waits for the others' first attempts. A host that
/// is down or stalled may take the whole `ssh::CONNECT_TIMEOUT` (or, stalled after logging in,
/// `FIRST_CONNECT_LIMIT`) to fail, and the trials must not wait for it on the hosts that are up:
/// it joins when it connects. The grace lets hosts that come up together be placed on together.
const OTHERS_GRACE: Duration = Duration::from_secs(2);
/// How long `shutdown` waits for the trials' ends.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(20);
/// How long a start may take in all, code upload included.
const START_LIMIT: Duration = Duration::from_secs(900);

/// What can go wrong in the remote service, one line each.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("training service remote cannot start: {0}")]
    Startup(String),
    #[error("training service remote has no environment {0:?}; its environments are remote:<user>@<host>:<port> of machineList")]
    UnknownEnvironment(String),
    #[error("trial {0} is already running on training service remote; trial ids must be unique")]
    DuplicateTrial(String),
    #[error("training service remote: trial {trial}: {why}")]
    Start { trial: String, why: String },
    #[error("training service remote is shut down; no trial can start")]
    ShutDown,
}

impl RemoteError {
    /// A failed start of `trial`; `why` may come from the host's agent, whose runner already
    /// names the trial, which is then not named twice.
    fn start(trial: &str, why: String) -> RemoteError {
        let why = match why.strip_prefix(&format!("trial {trial}: ")) {
            Some(rest) => rest.to_string(),
            None => why,
        };
        RemoteError::Start {
            trial: trial.to_string(),
            why,
        }
    }
}

impl From<RemoteError> for PluginError {
    fn from(e: RemoteError) -> PluginError {
        PluginError::new(e.to_string())
    }
}

/// How long a successor's start waits for the copy of its donor's checkpoint folder taken when
/// it was created ([`RemoteService::snapshot_checkpoint`]).
const RESTORE_COPY_LIMIT: Duration = Duration::from_secs(600);

/// How long stopping the service waits for checkpoint deletions under way.
const DELETIONS_LIMIT: Duration = Duration::from_secs(10);

/// A copy of a donor's checkpoint folder being taken ([`host::take_snapshot`]): the host that
/// holds it once taken.
type Snapshot = tokio::task::JoinHandle<Result<Option<Arc<Host>>, String>>;

/// Runs trials on SSH hosts through their knob-agents.
pub struct RemoteService {
    runtime: Option<tokio::runtime::Runtime>,
    context: Arc<Context>,
    hosts: Vec<Arc<Host>>,
    stop: watch::Sender<bool>,
    /// One archive per local code directory for the experiment's life, or why it cannot be
    /// made: kept, so that the trials after the first do not walk (and compress, up to
    /// 300 MiB) the directory again each to fail the same way.
    archives: Mutex<HashMap<PathBuf, Result<Arc<CodeArchive>, String>>>,
    shut_down: bool,
    /// Whether `environments` was called before (see [`RemoteService::stand_in_line`]).
    asked_before: bool,
    /// What each of the experiment's trials asks for (from the context it was created with):
    /// which GPUs held elsewhere its waiting trials stand in line for on each host.
    demand: Option<knob_gpu_sched::SchedulerConfig>,
    /// Checkpoint deletions under way ([`RemoteService::delete_checkpoint`]), awaited (bounded)
    /// before the service stops.
    deletions: Vec<tokio::task::JoinHandle<()>>,
    /// Copies of a donor's checkpoint folder taken for a successor
    /// ([`RemoteService::snapshot_checkpoint`]), by successor: awaited before it starts.
    snapshots: HashMap<String, Snapshot>,
    /// The host each trial last started on (an index into `hosts`): where a donor's newest
    /// checkpoint folder is. Written by the starts, which run on the runtime.
    ran_on: Arc<Mutex<HashMap<String, usize>>>,
    /// Whether a start may fail after `start` returned (`ServiceContext::late_start_failures`).
    late_start_failures: bool,
    /// Starts under way on the runtime.
    starting: StartsUnderWay,
    /// Whether the console was told that a trial's parameters are too large for
    /// `KNOB_PARAMETERS` (`knob_protocol::parameters_only_in_file`), said once.
    parameters_size_told: bool,
}

impl RemoteService {
    /// Builds the service and connects to every host (concurrently, bounded); unreachable
    /// hosts are reported as warnings and stay not ready.
    pub fn with_emitter(class_args: &Value, emit: Emit) -> Result<RemoteService, RemoteError> {
        let args = RemoteArgs::parse(class_args)?;
        let agent_binary = AgentBinary::locate(args.agent_binary.as_deref())
            .map_err(RemoteError::Startup)?
            .map(Arc::new);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("knob-remote")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Startup(format!("no async runtime: {e}")))?;
        let hosts: Vec<Arc<Host>> = args.machines.iter().cloned().map(Host::new).collect();
        let context = Arc::new(Context::new(args, emit, agent_binary));
        let (stop, stop_rx) = watch::channel(false);
        let (first_attempt, first_attempts) = tokio::sync::mpsc::channel(hosts.len().max(1));
        for host in &hosts {
            let drive = host
                .clone()
                .drive(context.clone(), stop_rx.clone(), first_attempt.clone());
            runtime.spawn(drive);
        }
        runtime.block_on(await_first_attempts(first_attempts, hosts.len()));
        Ok(RemoteService {
            runtime: Some(runtime),
            context,
            hosts,
            stop,
            archives: Mutex::default(),
            shut_down: false,
            asked_before: false,
            demand: None,
            deletions: Vec::new(),
            snapshots: HashMap::new(),
            ran_on: Arc::default(),
            late_start_failures: false,
            starting: StartsUnderWay::default(),
            parameters_size_told: false,
        })
    }

    /// Whether a start may fail after [`RemoteService::start`] returned, reported as a
    /// `ServiceEvent::StartFailed` (`ServiceContext::late_start_failures`); off by default.
    pub fn set_late_start_failures(&mut self, on: bool) {
        self.late_start_failures = on;
    }

    /// Every host's environment; one not ready says why in its inventory's status (its
    /// connection's error, or that it is still connecting).
    pub fn environments_now(&self) -> Vec<Environment> {
        self.hosts
            .iter()
            .map(|h| h.environment(&self.context))
            .collect()
    }

    /// Tells every connected host's agent that the experiment's trials wait for resources: each
    /// stands in its host ledger's line for the GPUs other experiments hold there, as the
    /// `local` service does on this machine (see `crate::lease`), so that an experiment that
    /// refills a shared host's GPUs the moment it frees them cannot starve this one's trials.
    /// A trial that waits may take any host, so every host's line is joined; a place not
    /// renewed lapses within `ledger::STANDING_TTL`.
    pub fn stand_in_line(&self) {
        for host in &self.hosts {
            host.stand_in_line(self.demand.as_ref());
        }
    }

    /// None of the experiment's trials waits any more (`TrainingService::nothing_waits`): each
    /// connected host's agent leaves its ledger's line at once.
    pub fn leave_line(&self) {
        for host in &self.hosts {
            host.leave_line();
        }
    }

    /// Code archives sent to hosts so far (not counting those a host already had).
    pub fn code_uploads(&self) -> u64 {
        self.hosts.iter().map(|h| h.code_uploads()).sum()
    }

    /// The archive of `code_dir`, made at its first start. A directory that cannot be archived
    /// (`knob config check` refuses one, so it became so while the experiment ran: files
    /// added, a link made) makes every host not ready with the reason until it can be again
    /// ([`RemoteService::recheck_code`]): its trials wait, with the reason, instead of each
    /// failing on it in turn and using up the experiment's trials.
    fn archive(&self, code_dir: &std::path::Path) -> Result<Arc<CodeArchive>, String> {
        let mut archives = self.archives.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(archive) = archives.get(code_dir) {
            return archive.clone();
        }
        let archive = match code_archive::create(
            code_dir,
            &ArchiveLimits::default(),
            &self.context.args.exclude_files,
        ) {
            Ok(archive) => Arc::new(archive),
            Err(e) => {
                let why = e.to_string();
                archives.insert(code_dir.to_path_buf(), Err(why.clone()));
                drop(archives);
                self.context.set_code_problem(Some(why.clone()));
                for host in &self.hosts {
                    host.emit_environment(&self.context);
                }
                return Err(why);
            }
        };
        let left_out: Vec<String> = archive
            .left_out
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        let left_out = if left_out.is_empty() {
            String::new()
        } else {
            format!(" (left out: {})", left_out.join(", "))
        };
        knob_plugin_api::log::info(&format!(
            "training service remote: trial code {} archived: {} files, {} bytes, {} bytes compressed{left_out}",
            code_dir.display(),
            archive.file_count,
            archive.total_bytes,
            archive.bytes.len()
        ));
        archives.insert(code_dir.to_path_buf(), Ok(archive.clone()));
        Ok(archive)
    }

    /// Walks again (without compressing) each code directory that could not be archived; one
    /// that can be now is forgotten, so that the next start archives it, and the hosts are
    /// ready again once none is left. Called as the core asks for the environments, which it
    /// does every few seconds while trials wait.
    fn recheck_code(&self) {
        let mut archives = lock(&self.archives);
        let failed: Vec<PathBuf> = archives
            .iter()
            .filter(|(_, archive)| archive.is_err())
            .map(|(dir, _)| dir.clone())
            .collect();
        if failed.is_empty() {
            return;
        }
        let mut problem = None;
        for dir in failed {
            match code_archive::check(
                &dir,
                &ArchiveLimits::default(),
                &self.context.args.exclude_files,
            ) {
                Ok(()) => {
                    archives.remove(&dir);
                }
                Err(e) => problem = Some(e.to_string()),
            }
        }
        self.context.set_code_problem(problem);
    }

    /// Starts a trial on the host its request names. With `late_start_failures` (a host that
    /// takes `ServiceEvent::StartFailed`) this returns once the start is under way on the
    /// service's runtime, and a failure arrives as that event: a start waits for an SSH round
    /// trip, a code upload and a checkpoint copy, seconds on a busy host, and this service's
    /// other calls (a start on another host, a kill, a PBT copy) should not wait behind it.
    /// Otherwise it returns once the trial runs.
    pub fn start(&mut self, request: &TrialRequest) -> Result<(), RemoteError> {
        let runtime = match &self.runtime {
            Some(runtime) if !self.shut_down => runtime,
            _ => return Err(RemoteError::ShutDown),
        };
        let index = self
            .hosts
            .iter()
            .position(|h| h.environment_id == request.environment_id)
            .ok_or_else(|| RemoteError::UnknownEnvironment(request.environment_id.clone()))?;
        if self.hosts.iter().any(|h| h.runs(&request.trial_id)) {
            return Err(RemoteError::DuplicateTrial(request.trial_id.clone()));
        }
        if let Some(warning) =
            crate::knob_protocol::parameters_only_in_file(&mut self.parameters_size_told, request)
        {
            (self.context.emit)(warning);
        }
        let start_error = |why: String| RemoteError::start(&request.trial_id, why);
        // The agent leases the trial's GPUs on the host under this machine's limit.
        let mut request = request.clone();
        request.resources.max_trials_per_gpu =
            Some(self.hosts[index].machine.max_trial_number_per_gpu.max(1));
        // Nothing reached the host: the trial waits for its hosts to be ready again.
        let archive = self.archive(&request.code_dir).map_err(|why| {
            start_error(format!("{why}; {}", knob_plugin_api::service::NOT_STARTED))
        })?;
        // A population member: the copy of its parent's checkpoint folder taken when it was
        // created goes with the start, which waits for it.
        let snapshot = request
            .env
            .contains_key(crate::trial_python::RESTORE_TRIAL_ENV)
            .then(|| self.snapshots.remove(&request.trial_id))
            .flatten();
        let trial_id = request.trial_id.clone();
        let start = Start {
            context: self.context.clone(),
            hosts: self.hosts.clone(),
            index,
            request,
            archive,
            fresh_code_copy: !self.context.args.reuse_mode,
            snapshot,
            ran_on: self.ran_on.clone(),
        };
        if !self.late_start_failures {
            return runtime.block_on(start.run()).map_err(start_error);
        }
        let (running, earlier) = self.starting.begin(&trial_id);
        let emit = self.context.emit.clone();
        runtime.spawn(async move {
            if let Some(earlier) = earlier {
                earlier.wait().await;
            }
            if let Err(why) = start.run().await {
                let message = RemoteError::start(&trial_id, why).to_string();
                emit(ServiceEvent::StartFailed { trial_id, message });
            }
            drop(running);
        });
        Ok(())
    }

    /// Successor `trial_id` was just created to start from trial `donor`'s checkpoint: its
    /// folder is copied now, in the background, on the host that runs (or last ran) the donor
    /// (see [`host::take_snapshot`]); the successor's start waits for the copy. `false`: this
    /// service never ran the donor, and took no copy.
    pub fn snapshot_checkpoint(&mut self, trial_id: &str, donor: &str) -> bool {
        let Some(runtime) = self.runtime.as_ref().filter(|_| !self.shut_down) else {
            return false;
        };
        let Some(order) = self.donor_first(donor) else {
            return false;
        };
        self.snapshots.retain(|_, taking| !taking.is_finished());
        let taking = runtime.spawn(host::take_snapshot(
            order,
            trial_id.to_string(),
            donor.to_string(),
        ));
        self.snapshots.insert(trial_id.to_string(), taking);
        true
    }

    /// The hosts, the one that runs (or last ran) trial `donor` first; `None` when this
    /// service never ran it.
    fn donor_first(&self, donor: &str) -> Option<Vec<Arc<Host>>> {
        let running = self.hosts.iter().position(|h| h.runs(donor));
        let first = running.or_else(|| lock(&self.ran_on).get(donor).copied())?;
        let mut order = vec![self.hosts[first].clone()];
        order.extend(
            (0..self.hosts.len())
                .filter(|i| *i != first)
                .map(|i| self.hosts[i].clone()),
        );
        Some(order)
    }

    /// Successor `trial_id` is about to start under another training service of the
    /// experiment from trial `donor`'s checkpoint, which ran here: the copy taken for it when
    /// it was created (waited for), or without one the donor's folder, is brought to `dest` on
    /// this machine (see [`host::fetch_restore`]). `Ok(false)`: no host has either folder; an
    /// error when a host could not be asked (not connected yet).
    pub fn fetch_snapshot(
        &mut self,
        trial_id: &str,
        donor: &str,
        dest: &std::path::Path,
    ) -> Result<bool, RemoteError> {
        let Some(runtime) = self.runtime.as_ref().filter(|_| !self.shut_down) else {
            return Ok(false);
        };
        // Every host when this run of the service has not run the donor (a resumed
        // experiment): the core asks the service that ran it, so its folder may be on any.
        let order = self
            .donor_first(donor)
            .unwrap_or_else(|| self.hosts.clone());
        let taking = self.snapshots.remove(trial_id);
        runtime
            .block_on(async {
                let holder = match taking {
                    Some(taking) => match tokio::time::timeout(RESTORE_COPY_LIMIT, taking).await {
                        Ok(Ok(Ok(holder))) => holder,
                        _ => None,
                    },
                    None => None,
                };
                host::fetch_restore(&order, trial_id, donor, holder, dest).await
            })
            .map_err(|why| RemoteError::start(trial_id, why))
    }

    /// Asks the agent running trial `trial_id` to kill it, in the background: the agent's
    /// answer takes an SSH round trip (seconds on a loaded host), which neither this service's
    /// other calls nor the manager's loop, waiting for this call, should wait for. The kill is
    /// sent from this service's runtime a moment after this returns (or queued for the host's
    /// next connection, see [`Host::kill`]); the trial's end arrives as its `TrialEnded`.
    ///
    /// A trial whose start is still under way is killed once the start is over (if it started).
    pub fn kill(&mut self, trial_id: &str, reason: &str) {
        let Some(runtime) = &self.runtime else { return };
        if let Some(start) = self.starting.of(trial_id) {
            let hosts = self.hosts.clone();
            let context = self.context.clone();
            let (trial_id, reason) = (trial_id.to_string(), reason.to_string());
            runtime.spawn(async move {
                start.wait().await;
                let Some(host) = hosts.iter().find(|h| h.runs(&trial_id)) else {
                    return;
                };
                if let Err(why) = host.kill(&context, &trial_id, &reason).await {
                    knob_plugin_api::log::debug(&format!(
                        "training service remote: kill of trial {trial_id}: {why}"
                    ));
                }
            });
            return;
        }
        let Some(host) = self.hosts.iter().find(|h| h.runs(trial_id)).cloned() else {
            knob_plugin_api::log::debug(&format!(
                "training service remote: kill of trial {trial_id} ignored, it is not running"
            ));
            return;
        };
        let context = self.context.clone();
        let (trial_id, reason) = (trial_id.to_string(), reason.to_string());
        runtime.spawn(async move {
            if let Err(why) = host.kill(&context, &trial_id, &reason).await {
                knob_plugin_api::log::debug(&format!(
                    "training service remote: kill of trial {trial_id}: {why}"
                ));
            }
        });
    }

    /// Deletes trial `trial_id`'s checkpoint folder on every host that has one, in the
    /// background (see [`Host::delete_checkpoint`]): a member may have run on several hosts. A
    /// successor that ended without starting: its copy of its donor's folder goes with its
    /// folder, after the copy, if it is still being taken.
    pub fn delete_checkpoint(&mut self, trial_id: &str) {
        self.delete_after_copy(trial_id, Host::delete_checkpoint);
    }

    /// Successor `trial_id` ended for good: the copy of its donor's checkpoint folder its
    /// attempts started from is deleted on every host that has one, in the background (see
    /// [`Host::delete_snapshot`]), after a copy still being taken for it.
    pub fn delete_snapshot(&mut self, trial_id: &str) {
        self.delete_after_copy(trial_id, Host::delete_snapshot);
    }

    /// Runs `delete` for `trial_id` on every host, in the background, once the copy of a
    /// donor's folder being taken for it ([`RemoteService::snapshot_checkpoint`]) is done: a
    /// copy that landed after the deletion stayed on the host for good.
    fn delete_after_copy<Deletion>(
        &mut self,
        trial_id: &str,
        delete: fn(Arc<Host>, String) -> Deletion,
    ) where
        Deletion: std::future::Future<Output = ()> + Send + 'static,
    {
        let Some(runtime) = self.runtime.as_ref().filter(|_| !self.shut_down) else {
            return;
        };
        self.deletions.retain(|d| !d.is_finished());
        let taking = self.snapshots.remove(trial_id);
        let hosts = self.hosts.clone();
        let trial_id = trial_id.to_string();
        let deletion = runtime.spawn(async move {
            if let Some(taking) = taking {
                let _ = tokio::time::timeout(RESTORE_COPY_LIMIT, taking).await;
            }
            let deletions: Vec<_> = hosts
                .into_iter()
                .map(|host| tokio::spawn(delete(host, trial_id.clone())))
                .collect();
            for deletion in deletions {
                let _ = deletion.await;
            }
        });
        self.deletions.push(deletion);
    }

    /// Stops every agent (its trials killed and their ends reported) and waits for each to
    /// confirm, then disconnects. An agent that does not confirm is named in a warning.
    pub fn stop(&mut self) {
        if self.shut_down {
            return;
        }
        self.shut_down = true;
        let Some(runtime) = &self.runtime else { return };
        // Starts under way finish first, so that the agents' shutdown ends what they started;
        // then the checkpoint deletions asked for last (the experiment's final ends).
        let starting = self.starting.take_all();
        let deletions = std::mem::take(&mut self.deletions);
        runtime.block_on(async {
            let all = async {
                for start in starting {
                    start.wait().await;
                }
            };
            let _ = tokio::time::timeout(SHUTDOWN_LIMIT, all).await;
            let all = async {
                for deletion in deletions {
                    let _ = deletion.await;
                }
            };
            let _ = tokio::time::timeout(DELETIONS_LIMIT, all).await;
        });
        let hosts = self.hosts.clone();
        let (unfinished, unconfirmed) = runtime.block_on(async move {
            let waits: Vec<_> = hosts
                .into_iter()
                .map(|host| {
                    tokio::spawn(async move {
                        let outcome = host.shut_down(SHUTDOWN_LIMIT).await;
                        (host.machine.target(), outcome)
                    })
                })
                .collect();
            let mut left = Vec::new();
            let mut unconfirmed = Vec::new();
            for wait in waits {
                let Ok((target, outcome)) = wait.await else {
                    continue;
                };
                left.extend(outcome.unfinished);
                if let Some(why) = outcome.unconfirmed {
                    unconfirmed.push(format!("{target} ({why})"));
                }
            }
            (left, unconfirmed)
        });
        if !unconfirmed.is_empty() {
            (self.context.emit)(ServiceEvent::Warning {
                trial_id: None,
                message: format!(
                    "training service remote: the agent on {} did not confirm its shutdown; it stops its trials and exits by itself {} s after it last heard from knob",
                    unconfirmed.join(", "),
                    crate::agent::DEFAULT_ORPHAN_TIMEOUT.as_secs()
                ),
            });
        }
        if !unfinished.is_empty() {
            (self.context.emit)(ServiceEvent::Warning {
                trial_id: None,
                message: format!(
                    "training service remote stopped before these trials were seen to end: {unfinished:?}"
                ),
            });
        }
        let _ = self.stop.send(true);
    }
}

/// One trial's start, owning what it needs, so that it can run on the service's runtime while
/// the service answers other calls ([`RemoteService::start`]).
struct Start {
    context: Arc<Context>,
    hosts: Vec<Arc<Host>>,
    /// The host it starts on, in `hosts`.
    index: usize,
    request: TrialRequest,
    archive: Arc<CodeArchive>,
    fresh_code_copy: bool,
    /// The copy of the donor's checkpoint folder taken for a population member, if one was.
    snapshot: Option<Snapshot>,
    ran_on: Arc<Mutex<HashMap<String, usize>>>,
}

impl Start {
    async fn run(self) -> Result<(), String> {
        let Start {
            context,
            hosts,
            index,
            request,
            archive,
            fresh_code_copy,
            snapshot,
            ran_on,
        } = self;
        let host = &hosts[index];
        if let Some(donor) = request.env.get(crate::trial_python::RESTORE_TRIAL_ENV) {
            // The copy of its parent's checkpoint folder taken when it was created (or, without
            // one, the parent's folder as it is now) is copied next to it first, from whichever
            // host has it. A failed copy fails the start.
            let holder = match snapshot {
                Some(taking) => match tokio::time::timeout(RESTORE_COPY_LIMIT, taking).await {
                    Ok(Ok(Ok(holder))) => holder,
                    Ok(Ok(Err(why))) => {
                        (context.emit)(ServiceEvent::Warning {
                            trial_id: Some(request.trial_id.clone()),
                            message: format!(
                                "training service remote: {why}; it starts from the checkpoint as it is now"
                            ),
                        });
                        None
                    }
                    _ => None,
                },
                None => None,
            };
            // A donor that ran on this machine under another training service of the
            // experiment: the core's copy of its folder (or the folder) here, to upload.
            let here = crate::trial_python::restore_dir(&request.trial_dir, donor);
            // Nothing of the trial runs yet: the core may try it again.
            host::stage_restore(
                host,
                &hosts,
                &request.trial_id,
                donor,
                holder,
                here.as_deref(),
            )
            .await
            .map_err(|e| format!("{e}; {}", knob_plugin_api::service::NOT_STARTED))?;
        }
        tokio::time::timeout(
            START_LIMIT,
            host.start(&context, &request, &archive, fresh_code_copy),
        )
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "{}: the start did not finish within {} s",
                host.machine.target(),
                START_LIMIT.as_secs()
            ))
        })?;
        lock(&ran_on).insert(request.trial_id, index);
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits for every receiver (a sender dropped counts as done).
/// Waits for every host's first attempt to connect, up to [`FIRST_CONNECT_LIMIT`], and once
/// one host is up, up to [`OTHERS_GRACE`] more.
async fn await_first_attempts(mut first_attempts: tokio::sync::mpsc::Receiver<bool>, hosts: usize) {
    let mut deadline = tokio::time::Instant::now() + FIRST_CONNECT_LIMIT;
    // Every host sends once.
    for _ in 0..hosts {
        match tokio::time::timeout_at(deadline, first_attempts.recv()).await {
            Ok(Some(true)) => {
                deadline = deadline.min(tokio::time::Instant::now() + OTHERS_GRACE);
            }
            Ok(Some(false)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

impl TrainingService for RemoteService {
    fn new(class_args: &Value, events: EventSink) -> Result<Self, PluginError> {
        let emit: Emit = Arc::new(move |event: ServiceEvent| events.emit(&event));
        Ok(RemoteService::with_emitter(class_args, emit)?)
    }

    fn check_config(
        config: &Value,
        context: &ServiceContext,
    ) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        config::check_config(config, context)
    }

    fn create(
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<Self, PluginError> {
        let mut service = Self::new(&config::class_args(config, context), events)?;
        service.set_late_start_failures(context.late_start_failures);
        service.demand = Some(crate::lease::demand_of_settings(&context.trial));
        Ok(service)
    }

    /// Each host's agent of the experiment is shut down, its trials killed (see [`leftovers`]).
    /// On `knob resume` the new manager's first hello (`fresh_start`) would end them too, but
    /// `knob stop` and `knob experiment delete` of a crashed experiment start no manager: the
    /// agents and their trials ran on until the agents' orphan timeout, after the experiment
    /// was deleted.
    fn clean_up_leftovers(
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, PluginError> {
        let args =
            RemoteArgs::parse(&config::class_args(config, context)).map_err(RemoteError::from)?;
        let binary =
            AgentBinary::locate(args.agent_binary.as_deref()).map_err(RemoteError::Startup)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("knob-remote")
            .enable_all()
            .build()
            .map_err(|e| RemoteError::Startup(format!("no async runtime: {e}")))?;
        let lines = runtime.block_on(leftovers::end_leftovers(args, binary, trial_ids));
        runtime.shutdown_timeout(Duration::from_secs(2));
        Ok(lines)
    }

    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        // The core asks once at its start, then only while one of its trials waits for
        // resources: from the second call on, this experiment has trials waiting.
        if std::mem::replace(&mut self.asked_before, true) {
            self.stand_in_line();
        }
        self.recheck_code();
        Ok(self.environments_now())
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        Ok(self.start(&request)?)
    }

    fn nothing_waits(&mut self) -> Result<(), PluginError> {
        self.leave_line();
        Ok(())
    }

    fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), PluginError> {
        self.kill(trial_id, reason);
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.stop();
        Ok(())
    }

    fn delete_checkpoint(&mut self, trial_id: &str) -> Result<(), PluginError> {
        RemoteService::delete_checkpoint(self, trial_id);
        Ok(())
    }

    fn snapshot_checkpoint(&mut self, trial_id: &str, donor: &str) -> Result<bool, PluginError> {
        Ok(RemoteService::snapshot_checkpoint(self, trial_id, donor))
    }

    fn delete_snapshot(&mut self, trial_id: &str) -> Result<(), PluginError> {
        RemoteService::delete_snapshot(self, trial_id);
        Ok(())
    }

    fn fetch_snapshot(
        &mut self,
        trial_id: &str,
        donor: &str,
        dest: &std::path::Path,
    ) -> Result<bool, PluginError> {
        Ok(RemoteService::fetch_snapshot(self, trial_id, donor, dest)?)
    }
}

impl Drop for RemoteService {
    fn drop(&mut self) {
        self.stop();
        if let Some(runtime) = self.runtime.take() {
            // The drivers close their connections once they see the stop.
            runtime.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}
