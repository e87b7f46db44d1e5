//! The `slurm` training service: trials run in Slurm jobs, each job running a `knob-agent`
//! (the same daemon as on remote hosts, `crate::agent`), reached through `srun --overlap`.
//!
//! - `reuseMode: true` (default): each environment (`slurm:env<N>`) is one allocation, a job
//!   that runs many trials, up to `maxEnvironments` at once. An allocation whose time left is
//!   below `maxTrialDuration` stops taking trials (gpu-sched `Draining`) and a new one is
//!   requested; its running trials go on until they end or the allocation does.
//! - `reuseMode: false`: one job per trial (at most `trialConcurrency` in the queue), all in the
//!   one environment `slurm:queue`, whose inventory is what `trialConcurrency` jobs request; the
//!   job's agent runs that one trial and exits.
//!
//! - [`args`]: the class args. [`script`]: the job script. [`commands`]: `sbatch`, `squeue`,
//!   `scancel`, `scontrol`. [`link`]: the connection to a job's agent.
//!
//! One monitor task asks `squeue` once per `pollIntervalSecs` about every job (back-off on
//! failure) and moves each job along; see [`commands`] for where job state comes from when
//! `squeue` no longer lists a job. A job is the experiment's when its id *and* its name match
//! (ids are reused after a slurmctld restart); a later knob finds the experiment's jobs by
//! their comment `knob:<experiment>:...`, and cancels them (their trials are run again by the
//! core, as it does for local leftovers).
//!
//! How a job's end reaches its trials (each trial's own end comes from the agent):
//! TIMEOUT, PREEMPTED, NODE_FAIL, any other end not asked for, and a `scancel` from outside are
//! `environment_lost` (the core runs the trial again, outside `maxTrialRetries`);
//! OUT_OF_MEMORY is a SIGKILL with "OUT_OF_MEMORY" in the trial's stderr tail, which the core
//! counts as an out-of-memory failure (`maxOomRetries`).

pub mod args;
pub mod commands;
mod environment;
pub mod link;
mod monitor;
pub mod script;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knob_plugin_api::service::{
    CheckedConfig, ConfigProblem, Environment, ServiceContext, ServiceEvent, TrialRequest,
    SHUTDOWN_PATIENCE,
};
use knob_plugin_api::{EventSink, PluginError, TrainingService};
use serde_json::Value;
use tokio::sync::{watch, Notify};

use args::JobOptions;
pub use args::{check_config, ArgsError, SlurmArgs};
use commands::{JobState, Submitter};
use environment::{job_environment, queue_environment};
use link::{Link, RequestError};
use monitor::monitor;

use crate::agent_protocol::ToAgent;
use crate::metrics::Emit;
use crate::starts::StartsUnderWay;

/// All that `shutdown` may take: the starts under way, cancelling every job (tried again while
/// slurmctld does not answer), then the jobs leaving the queue and their trials' ends. Within
/// the host's [`SHUTDOWN_PATIENCE`], with room for its own end: a shutdown that ran past it
/// was cut off by the host, and what it did last (the jobs cancelled, the trials' ends) was
/// lost with it. What is not done by then is said, and left.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(45);
const _: () = assert!(SHUTDOWN_BUDGET.as_secs() + 10 <= SHUTDOWN_PATIENCE.as_secs());
/// Of [`SHUTDOWN_BUDGET`], what the starts under way are given to finish (so that the
/// shutdown ends what they started); a trial's job submitted later is cancelled as it is
/// recorded (`submit`).
const STARTS_PATIENCE: Duration = Duration::from_secs(10);
/// Polls after which a job neither `squeue`, `scontrol` nor its exit-code file knows is gone.
const MISSING_POLLS: u32 = 3;
/// Connection attempts to a running job's agent before the job is given up (and cancelled).
const CONNECT_ATTEMPTS: u32 = 5;
/// Allocations in a row that end without ever running a trial before no more are requested:
/// a job that cannot start (bad option, agent missing on the nodes) must not loop forever.
const MAX_FAILED_ALLOCATIONS: u32 = 3;
/// The longest pause between two `squeue` calls while they fail.
const MAX_POLL_BACKOFF: Duration = Duration::from_secs(30);
/// The least time left an allocation takes a new trial with, whatever `maxTrialDuration`: a
/// trial placed on one about to end was killed by Slurm's time limit within seconds, and ran
/// again elsewhere for nothing.
const ENDING_MARGIN: Duration = Duration::from_secs(30);
/// The environment of `reuseMode: false`.
pub const QUEUE_ENVIRONMENT: &str = "slurm:queue";

/// What can go wrong in the slurm service, one line each.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    #[error(transparent)]
    Args(#[from] ArgsError),
    #[error("training service slurm cannot start: {0}")]
    Startup(String),
    #[error("training service slurm: sbatch refused the job{options}: \"{said}\"")]
    Submit { options: String, said: String },
    #[error("training service slurm has no environment {0:?} that takes trials now")]
    UnknownEnvironment(String),
    #[error("training service slurm: trial {trial}: {why}")]
    Start { trial: String, why: String },
    #[error("training service slurm is shut down; no trial can start")]
    ShutDown,
    /// Slurm took the job but holds it for a reason no wait clears ([`never_runs`]).
    #[error("training service slurm: {0}")]
    NeverRuns(String),
}

impl From<SlurmError> for PluginError {
    fn from(e: SlurmError) -> PluginError {
        PluginError::new(e.to_string())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a job is in its life, as knob sees it.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Submitted; waiting for Slurm (the reason) or for its agent's socket.
    Queued(String),
    Connecting,
    /// Connected; takes trials.
    Ready,
    /// Connected; near its time limit, takes no new trial.
    Draining,
    Ended,
}

/// One Slurm job running an agent.
struct Job {
    /// `env3` (an allocation) or the trial id (`reuseMode: false`).
    key: String,
    environment_id: String,
    name: String,
    dir: PathBuf,
    id: u64,
    phase: Phase,
    state: Option<JobState>,
    /// When Slurm ends it, while it runs (`commands::JobRow::ends_at`); its time left is taken
    /// from it when a trial is placed, not from the last poll's.
    ends_at: Option<std::time::SystemTime>,
    /// Why it takes no new trial (its time left is too short, `trialConcurrency` was lowered):
    /// for good, whatever becomes of its agent's link (a reconnection, a requeue). Its report
    /// (`Draining`) went once, after the poll's top-up (`retired_environment`).
    retired: Option<String>,
    link: Option<Arc<Link>>,
    /// The host and pid of the agent last connected to.
    agent: Option<(String, u32)>,
    connect_failures: u32,
    missing_polls: u32,
    /// Trials started here and not yet seen to end.
    running: BTreeSet<String>,
    /// Trials knob asked the agent to kill, with the kill's reason (their signalled ends are
    /// knob's own). A kill the agent did not confirm goes again when it is reconnected.
    kills: BTreeMap<String, String>,
    /// Ends the agent reported of trials signalled without knob asking, held until the job's
    /// state says whether Slurm is ending the job (see `monitor::on_incoming`).
    held: Vec<(ServiceEvent, std::time::Instant)>,
    /// `reuseMode: false`: the trial to start once the agent is up.
    waiting_trial: Option<TrialRequest>,
    /// Why knob cancelled it (`kill_trial`, shutdown), for its trials' ends.
    cancelled: Option<String>,
    /// Why knob gave up on its agent ([`CONNECT_ATTEMPTS`] failed connections) and cancelled
    /// it: it is not connected to again, and its trials end as an environment lost saying so.
    given_up: Option<String>,
    /// Ran at least one trial (else its end counts toward `MAX_FAILED_ALLOCATIONS`).
    ran_trials: bool,
    /// Ended because neither `squeue` nor `scontrol` knew it by its id and name any more: it may
    /// still be in the queue under another name, so the shutdown cancels it by id too.
    vanished: bool,
    inventory: Value,
}

impl Job {
    /// How long until Slurm ends it, from its end time as of `now`; `None` if not known (not
    /// running, or no time limit).
    fn time_left(&self, now: std::time::SystemTime) -> Option<Duration> {
        self.ends_at
            .map(|end| end.duration_since(now).unwrap_or(Duration::ZERO))
    }

    /// The phase of a job whose agent is connected: `Ready`, or `Draining` if it is retired.
    fn connected_phase(&self) -> Phase {
        match self.retired {
            Some(_) => Phase::Draining,
            None => Phase::Ready,
        }
    }

    /// Whether a trial of the core's still waits for, runs in or has its end held by this job.
    fn holds_trial(&self) -> bool {
        self.phase != Phase::Ended
            && (self.waiting_trial.is_some() || !self.running.is_empty() || !self.held.is_empty())
    }
}

#[derive(Default)]
struct Shared {
    jobs: Vec<Job>,
    next_allocation: u32,
    /// Allocations in a row that ended without running a trial, or could not be submitted;
    /// an allocation that runs a trial sets it back to 0.
    failed_allocations: u32,
    /// The warning that no more allocations are requested was given.
    gave_up: bool,
    stopping: bool,
    /// The reports of allocations retired (draining, ended) and the ends of their trials, for
    /// the monitor to emit after the poll's top-up (see `monitor::monitor`).
    after_top_up: Vec<ServiceEvent>,
    /// Trials whose own job (`reuseMode: false`) is being submitted: each holds a place in the
    /// queue against `trialConcurrency` until its job is in `jobs` (or its `sbatch` failed).
    submitting: BTreeSet<String>,
    /// Why no job of this config can ever run (Slurm holds one pending for a reason no wait
    /// clears, [`never_runs`]): every job asks alike, so none is submitted any more, the
    /// environments are retired, and the experiment ends with this line.
    never: Option<String>,
    /// The jobs the shutdown could not cancel, and how to: the service's shutdown fails with
    /// it, so that the experiment's log says so.
    not_cancelled: Option<String>,
    /// The experiment's `trialConcurrency` now: the context's at the start, then each
    /// `knob update concurrency` ([`SlurmService::set_trial_concurrency`]).
    trial_concurrency: u32,
}

struct Context {
    args: SlurmArgs,
    emit: Emit,
    agent: PathBuf,
    /// This service's own directory for jobs: `<experimentDir>/slurm/<start time>`, so that
    /// no file of an earlier run (a socket, an exit code) is mistaken for one of this run.
    run_dir: PathBuf,
    submitter: Submitter,
    /// `ServiceContext::late_start_failures`: a trial's start may fail after `start` returned.
    late_start_failures: bool,
    shared: Mutex<Shared>,
    /// Notified whenever a trial ends or a job ends.
    changed: Notify,
    /// Wakes the monitor at once (a new job, a shutdown).
    poke: Notify,
}

/// Runs trials in Slurm jobs.
pub struct SlurmService {
    runtime: Option<tokio::runtime::Runtime>,
    context: Arc<Context>,
    stop: watch::Sender<bool>,
    shut_down: bool,
    /// Whether a start in an allocation may fail after `start` returned
    /// (`ServiceContext::late_start_failures`).
    late_start_failures: bool,
    /// Starts in allocations under way on the runtime.
    starting: StartsUnderWay,
    /// Whether the console was told that a trial's parameters are too large for
    /// `KNOB_PARAMETERS` (`knob_protocol::parameters_only_in_file`), said once.
    parameters_size_told: bool,
}

/// The `knob-agent` jobs run: `agentBinary`, else the one beside this library's executable,
/// else the first on `PATH`.
fn locate_agent(configured: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(path) = configured {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!("agentBinary {} is not a file", path.display()))
        };
    }
    let beside_exe = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("knob-agent")));
    // Tests run from target/debug/deps; the agent is one folder up.
    let beside_parent = std::env::current_exe().ok().and_then(|exe| {
        exe.parent()
            .and_then(|dir| dir.parent())
            .map(|dir| dir.join("knob-agent"))
    });
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("knob-agent"))
            .find(|p| p.is_file())
    });
    [beside_exe, beside_parent, on_path]
        .into_iter()
        .flatten()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no knob-agent found beside the knob executable or on PATH; set agentBinary to one on the cluster's shared filesystem".to_string()
        })
}

impl SlurmService {
    /// The service for a config (as [`args::check_config`] made it canonical) and its
    /// experiment's context, reporting through `emit`.
    pub fn with_emitter(
        config: &Value,
        context: &ServiceContext,
        emit: Emit,
    ) -> Result<SlurmService, SlurmError> {
        let args = SlurmArgs::new(config, context)?;
        let late_start_failures = context.late_start_failures;
        let agent = locate_agent(args.agent_binary.as_deref()).map_err(SlurmError::Startup)?;
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        // Under the folder knob counts as its own (core's `OWNED_ENTRIES`): a failed start and
        // `knob experiment delete` take it back with the rest of the experiment.
        let run_dir = args
            .experiment_dir
            .join("services")
            .join("slurm")
            .join(format!("run-{started}"));
        std::fs::create_dir_all(&run_dir).map_err(|e| {
            SlurmError::Startup(format!("cannot create {}: {e}", run_dir.display()))
        })?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("knob-slurm")
            .enable_all()
            .build()
            .map_err(|e| SlurmError::Startup(format!("no async runtime: {e}")))?;
        let context = Arc::new(Context {
            submitter: Submitter::new(args.submit_interval),
            late_start_failures,
            shared: Mutex::new(Shared {
                trial_concurrency: args.trial_concurrency,
                ..Shared::default()
            }),
            args,
            emit,
            agent,
            run_dir,
            changed: Notify::new(),
            poke: Notify::new(),
        });
        runtime
            .block_on(cancel_leftovers(&context))
            .map_err(SlurmError::Startup)?;
        // A job sbatch refuses (a bad partition, constraint, GPUs the cluster has not, ...) or
        // that Slurm takes only to hold for ever (more CPUs than any node has) would be so for
        // every job of the experiment: the start fails with Slurm's words, in both modes, and
        // not each trial in turn. With `reuseMode: true` the first allocation is that test; a
        // trial's own job (`reuseMode: false`) is tried with a probe job of its options.
        if context.args.reuse_mode {
            runtime.block_on(submit_allocation(&context))?;
            let first = lock(&context.shared).jobs.last().map(|j| j.id);
            if let Some(id) = first {
                runtime.block_on(refuse_if_never_runs(&context, id, true))?;
            }
        } else {
            runtime.block_on(probe(&context))?;
        }
        let (stop, stop_rx) = watch::channel(false);
        runtime.spawn(monitor(context.clone(), stop_rx));
        Ok(SlurmService {
            runtime: Some(runtime),
            context,
            stop,
            shut_down: false,
            late_start_failures,
            starting: StartsUnderWay::default(),
            parameters_size_told: false,
        })
    }

    /// The Slurm job ids of the jobs now in the queue for this service.
    pub fn job_ids(&self) -> Vec<u64> {
        let shared = lock(&self.context.shared);
        shared
            .jobs
            .iter()
            .filter(|j| j.phase != Phase::Ended)
            .map(|j| j.id)
            .collect()
    }

    pub fn environments_now(&self) -> Vec<Environment> {
        let ctx = &self.context;
        if !ctx.args.reuse_mode {
            let shared = lock(&ctx.shared);
            return vec![queue_environment(
                &ctx.args,
                shared.trial_concurrency,
                shared.never.is_some(),
            )];
        }
        let shared = lock(&ctx.shared);
        shared
            .jobs
            .iter()
            // A retired allocation's report reaches the core only after what replaces it was
            // requested (`retired_environment`), not from a re-probe in between.
            .filter(|j| j.phase != Phase::Ended && j.retired.is_none())
            .map(|job| job_environment(&ctx.args, job))
            .collect()
    }

    pub fn start(&mut self, request: TrialRequest) -> Result<(), SlurmError> {
        let runtime = match &self.runtime {
            Some(runtime) if !self.shut_down => runtime,
            _ => return Err(SlurmError::ShutDown),
        };
        let ctx = self.context.clone();
        if let Some(warning) =
            crate::knob_protocol::parameters_only_in_file(&mut self.parameters_size_told, &request)
        {
            (ctx.emit)(warning);
        }
        if !self.late_start_failures {
            return if ctx.args.reuse_mode {
                runtime.block_on(start_in_allocation(&ctx, request))
            } else {
                runtime.block_on(submit_trial_job(&ctx, request))
            };
        }
        // A trial's own job waits for `sbatch` (seconds on a busy cluster, more with its
        // retries while slurmctld is busy), a start in an allocation for the agent's answer
        // over `srun` (up to the heartbeat timeout on a stalled link): the start runs on the
        // runtime, a failure comes as `StartFailed`, and this service's other calls do not
        // wait for it.
        let trial_id = request.trial_id.clone();
        let (running, earlier) = self.starting.begin(&trial_id);
        runtime.spawn(async move {
            if let Some(earlier) = earlier {
                earlier.wait().await;
            }
            let started = if ctx.args.reuse_mode {
                start_in_allocation(&ctx, request).await
            } else {
                submit_trial_job(&ctx, request).await
            };
            if let Err(e) = started {
                let message = e.to_string();
                (ctx.emit)(ServiceEvent::StartFailed { trial_id, message });
            }
            drop(running);
        });
        Ok(())
    }

    /// Kills trial `trial_id`. Which job it concerns, and that job's new state, are decided
    /// here; what that takes outside (the agent's answer over its link, or `scancel`, each
    /// seconds on a busy cluster) is done in the background on this service's runtime, so that
    /// neither its other calls nor the manager's loop, waiting for this call, wait for it. The
    /// trial's end arrives as its `TrialEnded`.
    ///
    /// A trial whose start is still under way is killed once that start is over (sent before
    /// it, the kill could reach the agent ahead of the start).
    pub fn kill(&mut self, trial_id: &str, reason: &str) {
        let Some(runtime) = &self.runtime else { return };
        let ctx = self.context.clone();
        let (trial_id, reason) = (trial_id.to_string(), reason.to_string());
        if let Some(start) = self.starting.of(&trial_id) {
            runtime.spawn(async move {
                start.wait().await;
                let action = kill_action(&ctx, &trial_id, &reason);
                carry_out_kill(&ctx, action, &trial_id, &reason).await
            });
            return;
        }
        let action = kill_action(&ctx, &trial_id, &reason);
        runtime.spawn(async move { carry_out_kill(&ctx, action, &trial_id, &reason).await });
    }

    /// Drops the service as a crash of the manager would: no shutdown, no `scancel`; the
    /// jobs stay in the queue (their agents exit after `orphanTimeoutSecs`). For tests of the
    /// next run's clean-up.
    pub fn abandon(mut self) {
        self.shut_down = true;
        let _ = self.stop.send(true);
        for job in &mut lock(&self.context.shared).jobs {
            job.phase = Phase::Ended;
            job.link = None;
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }

    /// What the shutdown could not cancel (slurmctld unreachable for its [`SHUTDOWN_BUDGET`]),
    /// as one line naming the jobs and the `scancel` to run.
    pub fn not_cancelled(&self) -> Option<String> {
        lock(&self.context.shared).not_cancelled.clone()
    }

    /// The experiment's `trialConcurrency` is now `n` (`knob update concurrency`): with
    /// `reuseMode: false` as many trials' jobs may be in the queue, and the queue's report says
    /// so (the core places trials by it); with `reuseMode: true` and no `maxEnvironments`, as
    /// many allocations are held (the monitor requests more, or cancels idle ones).
    pub fn set_trial_concurrency(&mut self, n: u32) {
        let ctx = &self.context;
        let n = n.max(1);
        let never = {
            let mut shared = lock(&ctx.shared);
            if shared.trial_concurrency == n {
                return;
            }
            shared.trial_concurrency = n;
            shared.never.is_some()
        };
        if !ctx.args.reuse_mode {
            (ctx.emit)(ServiceEvent::Environment {
                environment: queue_environment(&ctx.args, n, never),
            });
        }
        ctx.poke.notify_one();
    }

    /// Tells every agent to stop its trials and exit, waits (bounded) for the trials' ends,
    /// cancels every job of the service and waits (bounded) until the queue holds none.
    pub fn stop(&mut self) {
        if self.shut_down {
            return;
        }
        self.shut_down = true;
        let Some(runtime) = &self.runtime else { return };
        let ctx = self.context.clone();
        let deadline = std::time::Instant::now() + SHUTDOWN_BUDGET;
        // Starts under way finish first, so that the shutdown ends what they started.
        let starting = self.starting.take_all();
        runtime.block_on(async {
            let all = async {
                for start in starting {
                    start.wait().await;
                }
            };
            let _ = tokio::time::timeout(STARTS_PATIENCE, all).await;
            shut_down(&ctx, tokio::time::Instant::from_std(deadline)).await;
        });
        let _ = self.stop.send(true);
    }
}

/// Reports an allocation's state; a retired one was reported once (`retired_environment`), and
/// takes no trial again, whatever its link does.
fn emit_environment(ctx: &Context, job: &Job) {
    if ctx.args.reuse_mode && job.retired.is_none() {
        (ctx.emit)(ServiceEvent::Environment {
            environment: job_environment(&ctx.args, job),
        });
    }
}

/// The report of an allocation that takes no more trials (draining, ended), to be held for the
/// monitor to emit after the poll's top-up: the core, told of a retired allocation, then
/// already knows the one that replaces it, and trials wait for that one instead of the
/// experiment ending for want of an environment.
fn retired_environment(args: &SlurmArgs, job: &Job) -> Option<ServiceEvent> {
    args.reuse_mode.then(|| ServiceEvent::Environment {
        environment: job_environment(args, job),
    })
}

/// Why an allocation with `left` time left takes no new trial: less than `maxTrialDuration`, or
/// than [`ENDING_MARGIN`]. `None`: it takes trials (or its end is not known).
fn too_little_time(args: &SlurmArgs, left: Option<Duration>) -> Option<String> {
    let left = left?;
    match args.max_trial_duration {
        Some(limit) if left < limit.max(ENDING_MARGIN) => Some(format!(
            "{} s left, less than maxTrialDuration ({} s)",
            left.as_secs(),
            limit.as_secs()
        )),
        _ if left < ENDING_MARGIN => Some(format!(
            "{} s left, less than the {} s a trial is given at least",
            left.as_secs(),
            ENDING_MARGIN.as_secs()
        )),
        _ => None,
    }
}

/// Retires allocation `job` for `why`: it takes no new trial, for good; its running trials go
/// on. Its report is queued for after the monitor's top-up (which requests what replaces it).
fn retire(args: &SlurmArgs, shared: &mut Shared, index: usize, why: String) {
    let job = &mut shared.jobs[index];
    if job.retired.is_some() || job.phase == Phase::Ended {
        return;
    }
    knob_plugin_api::log::info(&format!(
        "training service slurm: {} (Slurm job {}) is retired ({why}): it takes no more trials",
        job.environment_id, job.id
    ));
    job.retired = Some(why);
    if job.phase == Phase::Ready {
        job.phase = Phase::Draining;
    }
    let retired = retired_environment(args, job);
    shared.after_top_up.extend(retired);
}

fn warn(ctx: &Context, trial_id: Option<String>, message: String) {
    (ctx.emit)(ServiceEvent::Warning { trial_id, message });
}

fn job_name(args: &SlurmArgs, key: &str) -> String {
    format!("{}-{}-{key}", args.job.job_name, args.experiment_id)
}

fn comment_prefix(experiment_id: &str) -> String {
    format!("knob:{experiment_id}:")
}

/// Cancels the jobs of `experiment_id` still in the queue (found by their comment); their ids.
async fn cancel_experiment_jobs(experiment_id: &str) -> Result<Vec<u64>, String> {
    let rows = commands::squeue()
        .await
        .map_err(|e| format!("squeue does not answer: {e}"))?;
    let prefix = comment_prefix(experiment_id);
    // Not one COMPLETING: it is ending already, most often cancelled a moment ago by the
    // resume's clean-up (`clean_up_leftovers`), which said so; the service's start then listed
    // again only those still completing, and left out the pending ones cancelled with them.
    let leftovers: Vec<u64> = rows
        .iter()
        .filter(|row| row.comment.starts_with(&prefix) && !row.state.has_ended())
        .filter(|row| row.state != JobState::Running("COMPLETING".to_string()))
        .map(|row| row.id)
        .collect();
    if !leftovers.is_empty() {
        commands::scancel(&leftovers).await.map_err(|e| {
            format!("cannot cancel the jobs {leftovers:?} an earlier run left: {e}")
        })?;
    }
    Ok(leftovers)
}

/// A later knob's start: the experiment's jobs still in the queue (from a run that crashed or
/// was killed) are cancelled; the core runs their trials again.
async fn cancel_leftovers(ctx: &Context) -> Result<(), String> {
    let leftovers = cancel_experiment_jobs(&ctx.args.experiment_id).await?;
    if !leftovers.is_empty() {
        warn(
            ctx,
            None,
            format!(
                "training service slurm: cancelled {} job(s) an earlier run of experiment {} left in the queue: {leftovers:?}",
                leftovers.len(),
                ctx.args.experiment_id
            ),
        );
    }
    Ok(())
}

/// Writes a job script and submits it; the job is recorded before `sbatch` returns its id.
async fn submit(
    ctx: &Context,
    key: &str,
    environment_id: &str,
    waiting_trial: Option<TrialRequest>,
) -> Result<u64, SlurmError> {
    let dir = ctx.run_dir.join(key);
    std::fs::create_dir_all(&dir)
        .map_err(|e| SlurmError::Startup(format!("cannot create {}: {e}", dir.display())))?;
    let name = job_name(&ctx.args, key);
    let comment = format!("{}{key}", comment_prefix(&ctx.args.experiment_id));
    // A trial's own job asks Slurm for the trial's memory request (raised after it ran out of
    // memory); an allocation asks for the job options' (`trialMemorySize`).
    let options = match &waiting_trial {
        Some(request) => script::trial_job_options(&ctx.args.job, &request.resources),
        None => ctx.args.job.clone(),
    };
    let text = script::batch_script(&script::JobSpec {
        options: &options,
        name: &name,
        comment: &comment,
        dir: &dir,
        agent: &ctx.agent,
        orphan_timeout: ctx.args.orphan_timeout,
    });
    let script_path = dir.join("job.sh");
    std::fs::write(&script_path, text)
        .map_err(|e| SlurmError::Startup(format!("cannot write {}: {e}", script_path.display())))?;
    let id = ctx
        .submitter
        .submit(&script_path)
        .await
        .map_err(|said| SlurmError::Submit {
            options: submit_options(&ctx.args, &options, &said),
            said,
        })?;
    knob_plugin_api::log::info(&format!(
        "training service slurm: submitted job {id} ({name}) for {environment_id}"
    ));
    // A trial's own job is known by its trial (its directory by the attempt, `key`).
    let job_key = waiting_trial
        .as_ref()
        .map_or(key, |request| request.trial_id.as_str())
        .to_string();
    let job = Job {
        key: job_key,
        environment_id: environment_id.to_string(),
        name,
        dir,
        id,
        phase: Phase::Queued(monitor::submitted(id)),
        state: None,
        ends_at: None,
        retired: None,
        link: None,
        agent: None,
        connect_failures: 0,
        missing_polls: 0,
        running: BTreeSet::new(),
        kills: BTreeMap::new(),
        held: Vec::new(),
        waiting_trial,
        cancelled: None,
        given_up: None,
        ran_trials: false,
        vanished: false,
        inventory: Value::Null,
    };
    let stopping = {
        // In the queue from now on, in place of its place held while it was submitted.
        let mut shared = lock(&ctx.shared);
        if let Some(request) = &job.waiting_trial {
            shared.submitting.remove(&request.trial_id);
        }
        shared.jobs.push(job);
        shared.stopping
    };
    if stopping {
        // Submitted as the shutdown went on without waiting for it (`STARTS_PATIENCE`), after
        // its cancel: cancelled now, not left to start and hold an allocation for nothing.
        if let Some(job) = lock(&ctx.shared).jobs.iter_mut().find(|j| j.id == id) {
            job.cancelled = Some("the experiment stopped".to_string());
        }
        if let Err(e) = commands::scancel(&[id]).await {
            warn(
                ctx,
                None,
                format!("training service slurm: job {id}, submitted as the experiment stopped, could not be cancelled ({e}): cancel it with `scancel {id}`"),
            );
        }
    }
    ctx.poke.notify_one();
    Ok(id)
}

/// The job options a refusal is most likely about, for its message.
fn submit_options(args: &SlurmArgs, options: &JobOptions, said: &str) -> String {
    // What sbatch's refusal is about, when its words say so: the config field that set the
    // option, so that the user knows what to change (sbatch names only its own option).
    let said_lower = said.to_ascii_lowercase();
    let about = |words: &[&str]| words.iter().any(|w| said_lower.contains(w));
    let field = if about(&["gres", "gpu"]) && options.gpu_number > 0 {
        Some(format!(
            "trialGpuNumber {0} (--gpus={0})",
            options.gpu_number
        ))
    } else if about(&["memory"]) && options.memory.is_some() {
        options
            .memory
            .map(|m| format!("memory {m} (--mem, from trialMemorySize)"))
    } else if about(&["processors", "cpu"]) && options.cpu_number.is_some() {
        options
            .cpu_number
            .map(|n| format!("trialCpuNumber {n} (--cpus-per-task={n})"))
    } else if about(&["time limit", "--time"]) {
        options.time.as_ref().map(|t| format!("time {t:?}"))
    } else {
        None
    };
    if let Some(field) = field {
        return format!(" for {field}");
    }
    let o = &args.job;
    let named: Vec<String> = [
        ("partition", &o.partition),
        ("account", &o.account),
        ("qos", &o.qos),
        ("constraint", &o.constraint),
    ]
    .into_iter()
    .filter_map(|(key, value)| value.as_ref().map(|v| format!("{key} {v:?}")))
    .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!(" ({})", named.join(", "))
    }
}

async fn submit_allocation(ctx: &Context) -> Result<(), SlurmError> {
    let key = {
        let mut shared = lock(&ctx.shared);
        shared.next_allocation += 1;
        format!("env{}", shared.next_allocation)
    };
    let environment_id = format!("slurm:{key}");
    submit(ctx, &key, &environment_id, None).await?;
    if let Some(job) = lock(&ctx.shared).jobs.last() {
        emit_environment(ctx, job);
    }
    Ok(())
}

/// `reuseMode: false`: submits a job with the options a trial's own job has, whose script runs
/// nothing, to see whether sbatch takes such a job and Slurm can ever run it; then cancels it.
async fn probe(ctx: &Context) -> Result<(), SlurmError> {
    let key = "probe";
    let dir = ctx.run_dir.join(key);
    std::fs::create_dir_all(&dir)
        .map_err(|e| SlurmError::Startup(format!("cannot create {}: {e}", dir.display())))?;
    let name = job_name(&ctx.args, key);
    let comment = format!("{}{key}", comment_prefix(&ctx.args.experiment_id));
    let text = script::batch_script(&script::JobSpec {
        options: &ctx.args.job,
        name: &name,
        comment: &comment,
        dir: &dir,
        agent: &ctx.agent,
        orphan_timeout: ctx.args.orphan_timeout,
    });
    // Its `#SBATCH` lines (all at the top), and no setup command nor agent: should Slurm start
    // it before it is cancelled, it ends at once.
    let header: Vec<&str> = text.lines().take_while(|l| l.starts_with('#')).collect();
    let script_path = dir.join("job.sh");
    std::fs::write(&script_path, format!("{}\nexit 0\n", header.join("\n")))
        .map_err(|e| SlurmError::Startup(format!("cannot write {}: {e}", script_path.display())))?;
    let id = ctx
        .submitter
        .submit(&script_path)
        .await
        .map_err(|said| SlurmError::Submit {
            options: submit_options(&ctx.args, &ctx.args.job, &said),
            said,
        })?;
    let never = refuse_if_never_runs(ctx, id, false).await;
    if let Err(why) = commands::scancel(&[id]).await {
        knob_plugin_api::log::warn(&format!(
            "training service slurm: scancel {id} (the probe job): {why}"
        ));
    }
    never
}

/// Whether Slurm, right after taking job `id`, holds it for a reason no wait clears
/// ([`never_runs`]; Slurm judges the partition's limits as it takes a job): then the error,
/// after cancelling the job when `cancel`.
async fn refuse_if_never_runs(ctx: &Context, id: u64, cancel: bool) -> Result<(), SlurmError> {
    let Ok(rows) = commands::squeue().await else {
        // The monitor asks again, and judges the reason then.
        return Ok(());
    };
    let Some(row) = rows.iter().find(|r| r.id == id) else {
        return Ok(());
    };
    let Some(why) = row
        .reason
        .as_deref()
        .filter(|_| row.state == JobState::Pending)
        .and_then(|reason| never_runs(id, reason, &ctx.args.job))
    else {
        return Ok(());
    };
    if cancel {
        if let Some(job) = lock(&ctx.shared).jobs.iter_mut().find(|j| j.id == id) {
            job.cancelled = Some(why.clone());
        }
        let _ = commands::scancel(&[id]).await;
    }
    Err(SlurmError::NeverRuns(why))
}

/// Slurm's pending `reason` for job `id` when it is one no wait clears, as one line naming the
/// config fields to change; `None` for a reason that may clear by itself.
///
/// Never: `PartitionConfig` (the job asks for more than the partition's nodes have, which Slurm
/// takes without `EnforcePartLimits`), `PartitionTimeLimit`, `BadConstraints`,
/// `InvalidAccount`, `InvalidQOS`, `DependencyNeverSatisfied`: only an administrator's change
/// to the cluster clears them. Not judged final: `ReqNodeNotAvail` and `PartitionNodeLimit`,
/// which Slurm also gives while the nodes a job needs are down or drained, and every reason of
/// a busy cluster or of limits on running jobs (`Resources`, `Priority`, `QOSMax...PerUser`).
pub(crate) fn never_runs(id: u64, reason: &str, o: &JobOptions) -> Option<String> {
    let word = reason.split([',', ' ', '(']).next().unwrap_or(reason);
    let set = |field: &str, value: Option<String>| value.map(|v| format!("{field} ({v})"));
    let (what, fields): (&str, Vec<Option<String>>) = match word {
        "PartitionConfig" => (
            "it asks for more than any node of its partition has",
            vec![
                set("trialCpuNumber", o.cpu_number.map(|n| n.to_string())),
                set("trialMemorySize", o.memory.map(|m| m.to_string())),
                set(
                    "trialGpuNumber",
                    (o.gpu_number > 0).then(|| o.gpu_number.to_string()),
                ),
                set("nodes", o.nodes.clone()),
                (!o.sbatch_args.is_empty()).then(|| "sbatchArgs".to_string()),
                Some(format!(
                    "partition ({})",
                    o.partition.as_deref().unwrap_or("the default")
                )),
            ],
        ),
        "PartitionTimeLimit" => (
            "its time limit is above its partition's",
            vec![
                set("time", o.time.clone()),
                set("partition", o.partition.clone()),
            ],
        ),
        "BadConstraints" => (
            "no node can meet its constraints",
            vec![
                set("constraint", o.constraint.clone()),
                (!o.sbatch_args.is_empty()).then(|| "sbatchArgs".to_string()),
            ],
        ),
        "InvalidAccount" => (
            "its account is not valid",
            vec![Some(format!(
                "account ({})",
                o.account.as_deref().unwrap_or("none")
            ))],
        ),
        "InvalidQOS" => (
            "its QOS is not valid",
            vec![Some(format!(
                "qos ({})",
                o.qos.as_deref().unwrap_or("none")
            ))],
        ),
        "DependencyNeverSatisfied" => (
            "its dependency can never be met",
            vec![Some("sbatchArgs".to_string())],
        ),
        _ => return None,
    };
    let fields: Vec<String> = fields.into_iter().flatten().collect();
    Some(format!(
        "Slurm job {id} can never start: Slurm holds it pending ({reason}): {what}; change {}",
        fields.join(" or ")
    ))
}

async fn start_in_allocation(ctx: &Arc<Context>, request: TrialRequest) -> Result<(), SlurmError> {
    let start_error = |why: String| SlurmError::Start {
        trial: request.trial_id.clone(),
        why,
    };
    let link = {
        let mut shared = lock(&ctx.shared);
        if shared.stopping {
            return Err(SlurmError::ShutDown);
        }
        if shared
            .jobs
            .iter()
            .any(|j| j.running.contains(&request.trial_id))
        {
            return Err(start_error("it is already running".to_string()));
        }
        let index = shared
            .jobs
            .iter()
            .position(|j| j.environment_id == request.environment_id && j.phase != Phase::Ended)
            .ok_or_else(|| SlurmError::UnknownEnvironment(request.environment_id.clone()))?;
        // Its time left as of now, from its end time: the last poll's is up to an interval old.
        let left = shared.jobs[index].time_left(std::time::SystemTime::now());
        if let Some(why) = too_little_time(&ctx.args, left) {
            retire(&ctx.args, &mut shared, index, why);
            // The monitor reports it retired and requests what replaces it now, not at its
            // next poll.
            ctx.poke.notify_one();
        }
        let job = &mut shared.jobs[index];
        match (&job.phase, &job.link) {
            (Phase::Ready, Some(link)) if job.retired.is_none() => {
                job.running.insert(request.trial_id.clone());
                job.ran_trials = true;
                link.clone()
            }
            // Retired since the core placed the trial (its time runs out, or it is not needed
            // after `knob update concurrency`): nothing ran, and the core places it again.
            (phase, _) => {
                let why = match &job.retired {
                    Some(why) => format!("it is retired: {why}"),
                    None => format!("{phase:?}"),
                };
                return Err(start_error(format!(
                    "allocation {} (Slurm job {}) takes no trials now ({why}); {}",
                    job.environment_id,
                    job.id,
                    knob_plugin_api::service::NOT_STARTED
                )));
            }
        }
    };
    let trial_id = request.trial_id.clone();
    let request_environment = request.environment_id.clone();
    let outcome = link
        .request(|id| ToAgent::Start {
            id,
            request: Box::new(request),
            fresh_code_copy: false,
        })
        .await;
    if let Err(why) = outcome {
        let mut shared = lock(&ctx.shared);
        for job in &mut shared.jobs {
            job.running.remove(&trial_id);
        }
        let ending = shared.jobs.iter().position(|j| {
            j.environment_id == request_environment
                && (j.phase == Phase::Ended
                    || too_little_time(&ctx.args, j.time_left(std::time::SystemTime::now()))
                        .is_some())
        });
        let not_started = match (&why, ending) {
            // The agent started nothing (as the `remote` service takes it): one that is
            // shutting down, Slurm's time limit having signalled it, refuses every start.
            (RequestError::Refused(_), _) => true,
            // The link closed or went silent as the allocation ends: what may have started
            // ends with it, and the core places the trial again rather than failing it.
            (_, Some(_)) => true,
            (_, None) => false,
        };
        if let Some(index) = ending {
            let left = shared.jobs[index].time_left(std::time::SystemTime::now());
            if let Some(why) = too_little_time(&ctx.args, left) {
                retire(&ctx.args, &mut shared, index, why);
                ctx.poke.notify_one();
            }
        }
        return Err(SlurmError::Start {
            trial: trial_id,
            why: match not_started {
                true => format!(
                    "{request_environment}: {why}; {}",
                    knob_plugin_api::service::NOT_STARTED
                ),
                false => why.to_string(),
            },
        });
    }
    // Failed allocations are counted in a row: over days, a few that a node failure or a
    // preemption ended before they ran anything must not stop the requests for good.
    let mut shared = lock(&ctx.shared);
    shared.failed_allocations = 0;
    shared.gave_up = false;
    Ok(())
}

async fn submit_trial_job(ctx: &Arc<Context>, request: TrialRequest) -> Result<(), SlurmError> {
    let trial_id = request.trial_id.clone();
    {
        let mut shared = lock(&ctx.shared);
        if shared.stopping {
            return Err(SlurmError::ShutDown);
        }
        if let Some(never) = &shared.never {
            return Err(SlurmError::NeverRuns(never.clone()));
        }
        // A job whose trial has ended is on its way out of the queue: it holds no slot, and the
        // core may start the next trial (or the next attempt of the same one) at once. A job
        // being submitted holds one already.
        let queued =
            shared.jobs.iter().filter(|j| j.holds_trial()).count() + shared.submitting.len();
        if shared.submitting.contains(&trial_id)
            || shared
                .jobs
                .iter()
                .any(|j| j.holds_trial() && j.key == trial_id)
        {
            return Err(SlurmError::Start {
                trial: trial_id,
                why: "it already has a job in the queue".to_string(),
            });
        }
        if queued >= shared.trial_concurrency as usize {
            return Err(SlurmError::Start {
                trial: trial_id,
                why: format!(
                    "{queued} jobs are in the queue already (trialConcurrency {})",
                    shared.trial_concurrency
                ),
            });
        }
        shared.submitting.insert(trial_id.clone());
    }
    // The trial's attempt gets its own job directory (and job), named after the trial.
    let key = match request
        .trial_dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| n.starts_with("attempt-"))
    {
        Some(attempt) => format!("{trial_id}-{attempt}"),
        None => trial_id.clone(),
    };
    let submitted = submit(ctx, &key, QUEUE_ENVIRONMENT, Some(request)).await;
    if submitted.is_err() {
        lock(&ctx.shared).submitting.remove(&trial_id);
    }
    submitted.map(|_| ())
}

/// What killing a trial takes, decided (and its job marked) under the service's lock.
enum KillAction {
    /// The trial runs in a job whose agent is connected: the agent kills it.
    Agent { job_id: u64, link: Arc<Link> },
    /// The trial's job has no agent connected (not started, or, with `reuseMode: false`, its
    /// link is gone): the whole job is cancelled, and its trial ends with the kill's reason.
    Cancel(u64),
    /// The trial runs in an allocation whose agent is being reconnected: the kill goes when it
    /// is (`monitor::connect_job`); cancelling the allocation would end its other trials.
    WhenReconnected,
    /// No job runs or waits for the trial.
    Nothing,
}

fn kill_action(ctx: &Arc<Context>, trial_id: &str, reason: &str) -> KillAction {
    use KillAction as Action;
    let mut shared = lock(&ctx.shared);
    let job = shared.jobs.iter_mut().find(|j| {
        j.phase != Phase::Ended
            && (j.running.contains(trial_id)
                || j.waiting_trial
                    .as_ref()
                    .is_some_and(|t| t.trial_id == trial_id))
    });
    match job {
        None => Action::Nothing,
        Some(job) if job.running.contains(trial_id) => match (&job.link, ctx.args.reuse_mode) {
            (Some(link), _) => {
                job.kills.insert(trial_id.to_string(), reason.to_string());
                Action::Agent {
                    job_id: job.id,
                    link: link.clone(),
                }
            }
            (None, true) => {
                job.kills.insert(trial_id.to_string(), reason.to_string());
                Action::WhenReconnected
            }
            (None, false) => {
                job.cancelled = Some(reason.to_string());
                Action::Cancel(job.id)
            }
        },
        // Not started yet: the whole job goes, and its trial ends with the kill's reason.
        Some(job) => {
            job.cancelled = Some(reason.to_string());
            Action::Cancel(job.id)
        }
    }
}

async fn carry_out_kill(ctx: &Arc<Context>, action: KillAction, trial_id: &str, reason: &str) {
    use KillAction as Action;
    match action {
        Action::Nothing => knob_plugin_api::log::debug(&format!(
            "training service slurm: kill of trial {trial_id} ignored, it is not running"
        )),
        Action::WhenReconnected => knob_plugin_api::log::debug(&format!(
            "training service slurm: kill of trial {trial_id} waits for its agent's reconnection"
        )),
        Action::Agent { job_id, link } => {
            let outcome = link
                .request(|id| ToAgent::Kill {
                    id,
                    trial_id: trial_id.to_string(),
                    reason: reason.to_string(),
                })
                .await;
            match outcome {
                Ok(()) => {}
                // The agent no longer runs it: its end is on the way.
                Err(why @ RequestError::Refused(_)) => knob_plugin_api::log::debug(&format!(
                    "training service slurm: kill of trial {trial_id}: {why}"
                )),
                Err(why) => kill_unconfirmed(ctx, job_id, &link, why, trial_id, reason).await,
            }
        }
        Action::Cancel(job_id) => cancel_for_kill(ctx, job_id, trial_id).await,
    }
}

/// The agent of job `job_id` did not confirm the kill of `trial_id` (its link closed, or it
/// did not answer). A job of its own (`reuseMode: false`) is cancelled, which ends the trial
/// with the kill's reason. An allocation runs other trials: the kill goes again when its agent
/// is reconnected (`monitor::connect_job`), and a link that does not answer is closed so that
/// it is; an agent that cannot be reconnected gets its job cancelled, as any other.
async fn kill_unconfirmed(
    ctx: &Arc<Context>,
    job_id: u64,
    link: &Arc<Link>,
    why: RequestError,
    trial_id: &str,
    reason: &str,
) {
    let cancel =
        {
            let mut shared = lock(&ctx.shared);
            let Some(job) = shared.jobs.iter_mut().find(|j| {
                j.id == job_id && j.phase != Phase::Ended && j.running.contains(trial_id)
            }) else {
                // It ended meanwhile.
                return;
            };
            if ctx.args.reuse_mode {
                if matches!(why, RequestError::NoAnswer)
                    && job.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, link))
                {
                    link.close();
                }
                false
            } else {
                if job.cancelled.is_none() {
                    job.cancelled = Some(reason.to_string());
                }
                true
            }
        };
    warn(
        ctx,
        Some(trial_id.to_string()),
        if cancel {
            format!("training service slurm: the kill of trial {trial_id} was not confirmed ({why}); its Slurm job {job_id} is cancelled")
        } else {
            format!("training service slurm: the kill of trial {trial_id} was not confirmed ({why}); it is sent again once the agent of Slurm job {job_id} is reconnected")
        },
    );
    if cancel {
        cancel_for_kill(ctx, job_id, trial_id).await;
    }
}

async fn cancel_for_kill(ctx: &Arc<Context>, job_id: u64, trial_id: &str) {
    if let Err(why) = commands::scancel(&[job_id]).await {
        warn(
            ctx,
            Some(trial_id.to_string()),
            format!("training service slurm: scancel {job_id}: {why}"),
        );
    }
    ctx.poke.notify_one();
}

/// The shutdown, done by `deadline` ([`SHUTDOWN_BUDGET`]): the agents are told to stop their
/// trials and every job is cancelled at once (cancel first: a job left queued would start
/// later and hold its allocation for nothing, and a cancel tried last was what a slow end cut
/// off), then what remains of the budget waits for the jobs to leave the queue and for their
/// trials' ends. A trial whose end has not come by then is reported ended now, with the stop's
/// reason, and a warning names the jobs not seen to leave the queue.
async fn shut_down(ctx: &Arc<Context>, deadline: tokio::time::Instant) {
    let (links, ids) = {
        let mut shared = lock(&ctx.shared);
        shared.stopping = true;
        for job in &mut shared.jobs {
            if job.phase != Phase::Ended && job.cancelled.is_none() {
                job.cancelled = Some("the experiment stopped".to_string());
            }
        }
        let links: Vec<Arc<Link>> = shared.jobs.iter().filter_map(|j| j.link.clone()).collect();
        // Every job knob submitted and did not see end, by id whatever its name: nothing the
        // experiment submitted stays queued after it.
        let ids: Vec<u64> = shared
            .jobs
            .iter()
            .filter(|j| j.phase != Phase::Ended || j.vanished)
            .map(|j| j.id)
            .collect();
        (links, ids)
    };
    // The agents stop their trials (each with its grace period) and report their ends while
    // their link lasts; Slurm's own signals of the cancel reach the trials alike, and an end
    // the agent could not report is the job's end, with the stop's reason.
    for link in &links {
        link.send(ToAgent::Shutdown);
    }
    cancel_for_shutdown(ctx, &ids, deadline).await;
    ctx.poke.notify_one();
    // The monitor sees the jobs end and reports what still ran in them.
    loop {
        let changed = ctx.changed.notified();
        let (left, unreported) = {
            let shared = lock(&ctx.shared);
            let left = shared.jobs.iter().any(|j| j.phase != Phase::Ended);
            (left, !shared.after_top_up.is_empty())
        };
        if !left && !unreported {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let _ = tokio::time::timeout_at(
            deadline.min(tokio::time::Instant::now() + Duration::from_millis(500)),
            changed,
        )
        .await;
    }
    // The budget is spent: the jobs still listed end here as cancelled (knob did), so that
    // each trial's end is reported now rather than lost with the host's patience.
    let left: Vec<(u64, usize)> = lock(&ctx.shared)
        .jobs
        .iter()
        .filter(|j| j.phase != Phase::Ended)
        .map(|j| (j.id, j.running.len() + j.held.len()))
        .collect();
    for (id, _) in &left {
        monitor::end_job(ctx, *id, "CANCELLED");
    }
    let ended = std::mem::take(&mut lock(&ctx.shared).after_top_up);
    for event in ended {
        (ctx.emit)(event);
    }
    if let Some(message) = left_behind(&left) {
        warn(ctx, None, message);
    }
}

/// What a shutdown whose budget ran out left behind, one line: the jobs (`id`, trials still in
/// it) it cancelled but did not see leave the queue. `None` if none.
fn left_behind(left: &[(u64, usize)]) -> Option<String> {
    if left.is_empty() {
        return None;
    }
    let ids: Vec<String> = left.iter().map(|(id, _)| id.to_string()).collect();
    let trials: usize = left.iter().map(|(_, trials)| trials).sum();
    let trials = match trials {
        0 => String::new(),
        n => format!(
            " ({} in {} recorded ended by the stop, without the agent's word)",
            counted(n, "trial", "trials"),
            match left.len() {
                1 => "it",
                _ => "them",
            }
        ),
    };
    Some(format!(
        "training service slurm stopped after {} s before {} {} {} seen to leave the queue{trials}: check with `squeue --jobs={}`",
        SHUTDOWN_BUDGET.as_secs(),
        match left.len() {
            1 => "cancelled Slurm job",
            _ => "cancelled Slurm jobs",
        },
        ids.join(", "),
        match left.len() {
            1 => "was",
            _ => "were",
        },
        ids.join(","),
    ))
}

/// `n` and the noun that goes with it: "1 trial", "2 trials".
fn counted(n: usize, one: &str, many: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {many}"),
    }
}

/// `scancel`s `ids`, tried again while it fails (slurmctld restarting, or unreachable) until
/// `deadline`; each try is cut off there too (one `scancel` may wait [`commands`]' own 30 s).
/// What could not be cancelled is `Shared::not_cancelled`, which the shutdown's error says.
async fn cancel_for_shutdown(ctx: &Arc<Context>, ids: &[u64], deadline: tokio::time::Instant) {
    let mut pause = Duration::from_secs(1);
    let why = loop {
        let why = match tokio::time::timeout_at(deadline, commands::scancel(ids)).await {
            Ok(Ok(())) => return,
            Ok(Err(why)) => why,
            Err(_) => "scancel did not answer".to_string(),
        };
        if tokio::time::Instant::now() + pause >= deadline {
            break why;
        }
        knob_plugin_api::log::warn(&format!(
            "training service slurm: scancel {ids:?} failed ({why}); trying again in {} s",
            pause.as_secs()
        ));
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    };
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let message = format!(
        "training service slurm could not cancel the experiment's Slurm {} {} ({why}, tried for {} s as it stopped); they may start and hold their allocation for nothing: cancel them with `scancel {}`",
        match ids.len() {
            1 => "job",
            _ => "jobs",
        },
        list.join(", "),
        SHUTDOWN_BUDGET.as_secs(),
        list.join(" ")
    );
    // Said once, by the shutdown's error, which the core records: a warning sent now would say
    // it again, or be lost with the run's last events.
    let mut shared = lock(&ctx.shared);
    shared.not_cancelled = Some(message);
    // The monitor would wait for them to leave the queue: they will not. Their trials end
    // with the stop's reason.
    let unreported: Vec<u64> = shared
        .jobs
        .iter()
        .filter(|j| ids.contains(&j.id) && j.phase != Phase::Ended)
        .map(|j| j.id)
        .collect();
    drop(shared);
    for id in unreported {
        monitor::end_job(ctx, id, "CANCELLED");
    }
}

impl TrainingService for SlurmService {
    fn create(
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<Self, PluginError> {
        let emit: Emit = Arc::new(move |event: ServiceEvent| events.emit(&event));
        Ok(SlurmService::with_emitter(config, context, emit)?)
    }

    fn check_config(
        config: &Value,
        context: &ServiceContext,
    ) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        args::check_config(config, context)
    }

    /// The experiment's jobs still in the queue (found by their comment) are cancelled: their
    /// trials are run again, and a job's agent cannot be told apart from a stale one.
    fn clean_up_leftovers(
        config: &Value,
        context: &ServiceContext,
        _trial_ids: &[String],
    ) -> Result<Vec<String>, PluginError> {
        let _ = config;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| {
                PluginError::new(format!("training service slurm: no async runtime: {e}"))
            })?;
        let cancelled = runtime
            .block_on(cancel_experiment_jobs(&context.experiment_id))
            .map_err(|e| PluginError::new(format!("training service slurm: {e}")))?;
        Ok(cancelled
            .iter()
            .map(|id| format!("cancelled Slurm job {id}, left in the queue by an earlier run"))
            .collect())
    }

    fn environments(&mut self) -> Result<Vec<Environment>, PluginError> {
        Ok(self.environments_now())
    }

    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError> {
        Ok(self.start(request)?)
    }

    fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), PluginError> {
        self.kill(trial_id, reason);
        Ok(())
    }

    fn set_trial_concurrency(&mut self, trial_concurrency: u32) -> Result<(), PluginError> {
        SlurmService::set_trial_concurrency(self, trial_concurrency);
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), PluginError> {
        self.stop();
        match self.not_cancelled() {
            Some(message) => Err(PluginError::new(message)),
            None => Ok(()),
        }
    }
}

impl Drop for SlurmService {
    fn drop(&mut self) {
        self.stop();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A service's context without a runtime, a monitor or Slurm, its events in `events`.
    fn context(max_trial_duration: Option<u64>, events: &Arc<Mutex<Vec<ServiceEvent>>>) -> Context {
        let dir = std::env::temp_dir().join("knob-slurm-unit");
        let context = ServiceContext {
            experiment_id: "unit".to_string(),
            experiment_dir: Some(dir.clone()),
            trial: knob_plugin_api::service::TrialSettings {
                trial_concurrency: 1,
                max_trial_duration_secs: max_trial_duration,
                ..Default::default()
            },
            ..ServiceContext::default()
        };
        let config = serde_json::json!({"agentBinary": "/bin/true"});
        let checked = check_config(&config, &context).unwrap();
        let args = SlurmArgs::new(&Value::Object(checked.config), &context).unwrap();
        let sink = events.clone();
        Context {
            submitter: Submitter::new(args.submit_interval),
            late_start_failures: true,
            shared: Mutex::new(Shared {
                trial_concurrency: 1,
                ..Shared::default()
            }),
            args,
            emit: Arc::new(move |event| lock(&sink).push(event)),
            agent: PathBuf::from("/bin/true"),
            run_dir: dir,
            changed: Notify::new(),
            poke: Notify::new(),
        }
    }

    /// Allocation `slurm:env1` (Slurm job 7), connected and taking trials, ending `left` from now.
    fn allocation(left: Option<Duration>) -> Job {
        Job {
            key: "env1".to_string(),
            environment_id: "slurm:env1".to_string(),
            name: "knob-unit-env1".to_string(),
            dir: std::env::temp_dir().join("knob-slurm-unit").join("env1"),
            id: 7,
            phase: Phase::Ready,
            state: Some(JobState::parse("RUNNING")),
            ends_at: left.map(|left| SystemTime::now() + left),
            retired: None,
            link: None,
            agent: None,
            connect_failures: 0,
            missing_polls: 0,
            running: BTreeSet::new(),
            kills: BTreeMap::new(),
            held: Vec::new(),
            waiting_trial: None,
            cancelled: None,
            given_up: None,
            ran_trials: false,
            vanished: false,
            inventory: Value::Null,
        }
    }

    fn request(trial_id: &str) -> TrialRequest {
        TrialRequest {
            experiment_id: "unit".to_string(),
            trial_id: trial_id.to_string(),
            sequence: 0,
            parameter_id: 0,
            parameter_label: None,
            parameters: Value::Null,
            environment_id: "slurm:env1".to_string(),
            command: "true".to_string(),
            code_dir: PathBuf::from("/nonexistent"),
            trial_dir: PathBuf::from("/nonexistent"),
            gpu_indices: None,
            env: BTreeMap::new(),
            resources: Default::default(),
        }
    }

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// The state the reports of `slurm:env1` gave, in order.
    fn reported(events: &Arc<Mutex<Vec<ServiceEvent>>>) -> Vec<String> {
        lock(events)
            .iter()
            .filter_map(|event| match event {
                ServiceEvent::Environment { environment } if environment.id == "slurm:env1" => {
                    Some(
                        environment.inventory["status"]["state"]
                            .as_str()?
                            .to_string(),
                    )
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn what_a_shutdown_out_of_time_left_is_said_in_one_line_in_the_right_number() {
        assert_eq!(left_behind(&[]), None);
        assert_eq!(
            left_behind(&[(7, 1)]).unwrap(),
            "training service slurm stopped after 45 s before cancelled Slurm job 7 was seen to leave the queue (1 trial in it recorded ended by the stop, without the agent's word): check with `squeue --jobs=7`"
        );
        assert_eq!(
            left_behind(&[(7, 0), (9, 2)]).unwrap(),
            "training service slurm stopped after 45 s before cancelled Slurm jobs 7, 9 were seen to leave the queue (2 trials in them recorded ended by the stop, without the agent's word): check with `squeue --jobs=7,9`"
        );
    }

    #[test]
    fn an_allocations_time_left_is_measured_against_what_a_trial_needs() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let minutes = |m: u64| Some(Duration::from_secs(m * 60));
        let with_limit = context(Some(300), &events);
        assert_eq!(too_little_time(&with_limit.args, minutes(10)), None);
        assert_eq!(
            too_little_time(&with_limit.args, minutes(4)).as_deref(),
            Some("240 s left, less than maxTrialDuration (300 s)")
        );
        // Unlimited, or not running yet: no end to measure against.
        assert_eq!(too_little_time(&with_limit.args, None), None);
        // Without maxTrialDuration, an allocation about to end takes no trial either.
        let without = context(None, &events);
        assert_eq!(too_little_time(&without.args, minutes(1)), None);
        assert_eq!(
            too_little_time(&without.args, Some(Duration::from_secs(20))).as_deref(),
            Some("20 s left, less than the 30 s a trial is given at least")
        );
        // The time left is the end time's, now: not a time left read at the last poll.
        let ended = Job {
            ends_at: Some(SystemTime::now() - Duration::from_secs(5)),
            ..allocation(None)
        };
        assert_eq!(ended.time_left(SystemTime::now()), Some(Duration::ZERO));
    }

    #[test]
    fn a_start_on_an_allocation_about_to_end_is_not_started_and_retires_it() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let ctx = Arc::new(context(Some(300), &events));
        // Ready as of the last poll, which read 10 minutes left; 2 minutes are left now.
        lock(&ctx.shared)
            .jobs
            .push(allocation(Some(Duration::from_secs(120))));
        let refused = block_on(start_in_allocation(&ctx, request("late")))
            .unwrap_err()
            .to_string();
        // The core places it again (elsewhere): it is no FAILED trial.
        assert!(
            refused.ends_with(knob_plugin_api::service::NOT_STARTED),
            "{refused}"
        );
        assert!(
            refused.contains("s left, less than maxTrialDuration (300 s)"),
            "{refused}"
        );
        let shared = lock(&ctx.shared);
        let job = &shared.jobs[0];
        assert!(job.running.is_empty());
        assert_eq!(job.phase, Phase::Draining);
        // Retired: its report waits for the monitor's top-up, which requests a fresh one.
        assert_eq!(shared.after_top_up.len(), 1);
        drop(shared);
        let service_view: Vec<_> = lock(&ctx.shared)
            .jobs
            .iter()
            .filter(|j| j.phase != Phase::Ended && j.retired.is_none())
            .map(|j| j.id)
            .collect();
        assert_eq!(service_view, Vec::<u64>::new());
    }

    #[test]
    fn a_retired_allocation_stays_retired_when_its_agents_link_closes_and_comes_back() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let ctx = Arc::new(context(Some(300), &events));
        let mut job = allocation(Some(Duration::from_secs(120)));
        job.running.insert("t1".to_string());
        lock(&ctx.shared).jobs.push(job);
        {
            let mut shared = lock(&ctx.shared);
            retire(&ctx.args, &mut shared, 0, "120 s left".to_string());
        }
        // The link closes: the job waits to be reconnected (its trial's end comes through
        // it), and says nothing that would make the core place trials on it.
        monitor::on_incoming(&ctx, 7, link::Incoming::Closed("srun ended".to_string()));
        assert_eq!(reported(&events), Vec::<String>::new());
        let shared = lock(&ctx.shared);
        let job = &shared.jobs[0];
        assert!(matches!(job.phase, Phase::Queued(_)), "{:?}", job.phase);
        let now = environment::job_environment(&ctx.args, job);
        assert!(!now.ready);
        assert_eq!(now.inventory["status"]["state"], "draining");
        // Connected again (`monitor::connect_job`): draining, not ready.
        assert_eq!(job.connected_phase(), Phase::Draining);
    }
}
