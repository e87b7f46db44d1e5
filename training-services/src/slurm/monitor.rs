//! The monitor: one task per service that asks `squeue` about every job at once, moves each
//! job along (pending with its reason, running, connected, draining, ended), connects to the
//! agents, and turns a job's end into its trials' ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use knob_plugin_api::service::ServiceEvent;
use tokio::sync::{mpsc, watch};

use super::commands::{self, JobRow, JobState};
use super::link::{Incoming, Link};
use super::{
    emit_environment, lock, retired_environment, script, submit_allocation, warn, Context, Phase,
    CONNECT_ATTEMPTS, MAX_FAILED_ALLOCATIONS, MAX_POLL_BACKOFF, MISSING_POLLS,
};
use crate::agent_protocol::{FromAgent, ToAgent};

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;
/// How long an end held by `on_incoming` waits, at least, while the job is still plainly
/// RUNNING, before it is taken as the trial's own (slurmctld marks a job it ends before it
/// signals it, so its state has changed by then).
const HOLD_AT_LEAST: Duration = Duration::from_secs(3);

/// The monitor: one `squeue` per poll for every job, then each job moved along.
pub(super) async fn monitor(ctx: Arc<Context>, mut stop: watch::Receiver<bool>) {
    let mut pause = ctx.args.poll_interval;
    let (incoming_tx, mut incoming) = mpsc::unbounded_channel::<(u64, Incoming)>();
    loop {
        match commands::squeue().await {
            Ok(rows) => {
                pause = ctx.args.poll_interval;
                update_jobs(&ctx, &rows, &incoming_tx).await;
            }
            Err(why) => {
                pause = (pause * 2).min(MAX_POLL_BACKOFF);
                knob_plugin_api::log::warn(&format!(
                    "training service slurm: squeue failed ({why}); asking again in {} s",
                    pause.as_secs_f64()
                ));
            }
        }
        if ctx.args.reuse_mode {
            top_up_allocations(&ctx).await;
        }
        // The reports of allocations retired in this poll and the ends of their trials, after
        // the allocations that replace them were requested (and reported): the core, told an
        // environment is retired or a trial's environment is lost, then already knows one on
        // its way, and trials wait for it instead of the experiment ending for want of an
        // environment.
        let ended = std::mem::take(&mut lock(&ctx.shared).after_top_up);
        if !ended.is_empty() {
            for event in ended {
                (ctx.emit)(event);
            }
            ctx.changed.notify_waiters();
        }
        let wake = tokio::time::sleep(pause);
        tokio::pin!(wake);
        loop {
            tokio::select! {
                _ = &mut wake => break,
                _ = ctx.poke.notified() => break,
                message = incoming.recv() => {
                    if let Some((job_id, message)) = message {
                        on_incoming(&ctx, job_id, message);
                    }
                }
                _ = stop.changed() => {
                    if *stop.borrow() && lock(&ctx.shared).jobs.iter().all(|j| j.phase == Phase::Ended) {
                        return;
                    }
                }
            }
        }
    }
}

/// Requests allocations up to `maxEnvironments` (draining ones not counted), unless
/// [`MAX_FAILED_ALLOCATIONS`] in a row failed: then it says so, once.
async fn top_up_allocations(ctx: &Context) {
    loop {
        let wanted = {
            let mut shared = lock(&ctx.shared);
            let live = shared
                .jobs
                .iter()
                .filter(|j| j.phase != Phase::Ended && j.retired.is_none())
                .count();
            // No allocation of this config can ever run: that was said, once.
            if shared.never.is_some() {
                return;
            }
            let failing = shared.failed_allocations >= MAX_FAILED_ALLOCATIONS;
            if failing && !shared.stopping && !shared.gave_up {
                shared.gave_up = true;
                // Before the retired allocations' reports (emitted after the top-up): the
                // core, left with no environment, ends the experiment with this line in its
                // error.
                let failed = shared.failed_allocations;
                drop(shared);
                warn(
                    ctx,
                    None,
                    format!(
                        "training service slurm: {failed} allocations in a row ended before running a trial or could not be submitted; no more are requested: see the jobs' logs above, fix the cause (setupCommands, agentBinary, the sbatch options) and `knob resume`"
                    ),
                );
                return;
            }
            let most = most_allocations(ctx, shared.trial_concurrency);
            if live > most && !shared.stopping {
                release_idle_allocations(ctx, &mut shared, live - most);
                return;
            }
            !shared.stopping && !failing && live < most
        };
        if !wanted {
            return;
        }
        if let Err(e) = submit_allocation(ctx).await {
            lock(&ctx.shared).failed_allocations += 1;
            warn(ctx, None, e.to_string());
            return;
        }
    }
}

/// Allocations held at once: `maxEnvironments`, else the experiment's `trialConcurrency` now
/// (each allocation is sized for one trial), which `knob update concurrency` changes.
fn most_allocations(ctx: &Context, trial_concurrency: u32) -> usize {
    match ctx.args.max_environments_set {
        true => ctx.args.max_environments as usize,
        false => trial_concurrency.max(1) as usize,
    }
}

/// `trialConcurrency` was lowered: up to `excess` allocations that run no trial (pending ones
/// first, then idle ones, the newest first) are retired and cancelled, so that none is held
/// for nothing. Busy ones beyond the number go on; one is retired at a later poll once idle.
fn release_idle_allocations(ctx: &Context, shared: &mut super::Shared, excess: usize) {
    let reason = format!(
        "not needed after trialConcurrency was lowered to {}",
        shared.trial_concurrency
    );
    let idle = |j: &super::Job| {
        matches!(j.phase, Phase::Queued(_) | Phase::Ready)
            && j.cancelled.is_none()
            && j.retired.is_none()
            && !j.holds_trial()
    };
    let mut chosen: Vec<usize> = (0..shared.jobs.len())
        .rev()
        .filter(|&i| idle(&shared.jobs[i]))
        .collect();
    // Pending first: they hold nothing of the cluster yet, and a trial would wait for them.
    chosen.sort_by_key(|&i| shared.jobs[i].phase == Phase::Ready);
    let mut ids = Vec::new();
    for i in chosen.into_iter().take(excess) {
        let job = &mut shared.jobs[i];
        job.phase = Phase::Draining;
        job.cancelled = Some(reason.clone());
        job.retired = Some(reason.clone());
        ids.push(job.id);
        let retired = retired_environment(&ctx.args, job);
        shared.after_top_up.extend(retired);
    }
    if ids.is_empty() {
        return;
    }
    knob_plugin_api::log::info(&format!(
        "training service slurm: cancelling allocation(s) {ids:?}, {reason}"
    ));
    tokio::spawn(async move {
        if let Err(e) = commands::scancel(&ids).await {
            knob_plugin_api::log::warn(&format!("training service slurm: scancel {ids:?}: {e}"));
        }
    });
}

/// Moves every job along by what `squeue` (or, for a job it no longer lists, the exit-code
/// file or `scontrol`) says.
async fn update_jobs(
    ctx: &Arc<Context>,
    rows: &[JobRow],
    incoming: &mpsc::UnboundedSender<(u64, Incoming)>,
) {
    let jobs: Vec<(u64, String, PathBuf)> = lock(&ctx.shared)
        .jobs
        .iter()
        .filter(|j| j.phase != Phase::Ended)
        .map(|j| (j.id, j.name.clone(), j.dir.clone()))
        .collect();
    for (id, name, dir) in jobs {
        // Id and name: a reused id of another job is not ours.
        let row = rows.iter().find(|r| r.id == id && r.name == name);
        let (state, reason, ends_at) = match row {
            Some(row) => (Some(row.state.clone()), row.reason.clone(), row.ends_at),
            None => (ended_state(id, &name, &dir).await, None, None),
        };
        let Some(state) = state else {
            let gone = {
                let mut shared = lock(&ctx.shared);
                let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
                    continue;
                };
                job.missing_polls += 1;
                job.vanished = job.missing_polls >= MISSING_POLLS;
                job.vanished
            };
            if gone {
                let how = match rows.iter().find(|r| r.id == id) {
                    Some(row) => format!(
                        "squeue lists it under the name {:?}, not knob's {name:?} (renamed outside knob, or its id reused); cancelled",
                        row.name
                    ),
                    None => "vanished from squeue and scontrol without an exit code".to_string(),
                };
                end_job(ctx, id, &how);
                // It may be queued still under a name changed outside knob (`scontrol update
                // JobName=`): cancelled by id, it does not hold an allocation nobody uses.
                if let Err(e) = commands::scancel(&[id]).await {
                    knob_plugin_api::log::warn(&format!(
                        "training service slurm: scancel {id} (vanished): {e}"
                    ));
                }
            }
            continue;
        };
        if state.has_ended() {
            end_job(ctx, id, state.name());
            continue;
        }
        let mut requeued = None;
        let mut release = None;
        let never;
        let mut released = Vec::new();
        let mut shutdown = None;
        let mut retire = None;
        let connect = {
            let mut shared = lock(&ctx.shared);
            let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
                continue;
            };
            job.missing_polls = 0;
            job.state = Some(state.clone());
            // A pending job's end time is Slurm's guess at its start plus its limit.
            job.ends_at = ends_at.filter(|_| matches!(state, JobState::Running(_)));
            if state == JobState::Running("RUNNING".to_string()) && !job.held.is_empty() {
                let hold = HOLD_AT_LEAST.max(ctx.args.poll_interval * 3);
                let (old, young): (Vec<_>, Vec<_>) = std::mem::take(&mut job.held)
                    .into_iter()
                    .partition(|(_, at)| at.elapsed() >= hold);
                job.held = young;
                if !old.is_empty() && !ctx.args.reuse_mode {
                    shutdown = job.link.clone();
                }
                released.extend(old.into_iter().map(|(event, _)| event));
            }
            // Held ends count: Slurm's SIGTERM of a requeue ends the trials first (their ends
            // held, see `on_incoming`), and their agent's link may close before this poll; the
            // job, pending again and held back by Slurm, would otherwise keep them for as long
            // as it waits (the requeue test timed out so, once in 33 runs under load).
            let had_run = job.link.is_some()
                || !job.running.is_empty()
                || !job.held.is_empty()
                || matches!(
                    job.phase,
                    Phase::Ready | Phase::Draining | Phase::Connecting
                );
            never = match (&state, &job.phase, reason.as_deref()) {
                (JobState::Pending, Phase::Queued(_), Some(reason))
                    if !had_run && job.cancelled.is_none() =>
                {
                    super::never_runs(id, reason, &ctx.args.job)
                }
                _ => None,
            };
            let connect = match (&state, &job.phase) {
                // Pending again after it ran: Slurm requeued it (preemption, a node failure
                // with --requeue, `scontrol requeue`); its agent and trials are gone.
                // Not one knob cancelled (an allocation released, pending, as not needed): its
                // end is on the way.
                (JobState::Pending, _) if had_run && job.cancelled.is_none() => {
                    requeued = Some(format!(
                        "was requeued by Slurm ({})",
                        reason.as_deref().unwrap_or("no reason given")
                    ));
                    false
                }
                // Held for a reason no wait clears: cancelled below.
                _ if never.is_some() => false,
                (JobState::Pending, Phase::Queued(old)) => {
                    let why = match reason.as_deref() {
                        Some(reason) => format!("Slurm job {id} pending ({reason})"),
                        // Said already by "submitted", which stays until Slurm gives one: a
                        // line of its own for each allocation said nothing new.
                        None if *old == submitted(id) => old.clone(),
                        None => format!("Slurm job {id} pending (no reason given)"),
                    };
                    if *old != why {
                        job.phase = Phase::Queued(why.clone());
                        emit_environment(ctx, job);
                        if let Some(trial) = &job.waiting_trial {
                            warn(ctx, Some(trial.trial_id.clone()), format!("waiting: {why}"));
                        }
                    }
                    false
                }
                // Retired and its trials all ended: it is cancelled, so that its CPUs and GPUs
                // go back to the cluster (and to what replaces it) instead of sitting idle until
                // Slurm's TIMEOUT; one whose link closed is not connected to again for nothing.
                (JobState::Running(_), Phase::Queued(_) | Phase::Draining)
                    if job.retired.is_some() && job.cancelled.is_none() && !job.holds_trial() =>
                {
                    let why = job.retired.as_deref().unwrap_or_default();
                    job.cancelled = Some(format!("retired ({why}) and its trials ended"));
                    release = Some(id);
                    false
                }
                (JobState::Running(_), Phase::Queued(_)) => {
                    // The agent is up once its socket exists (the shared filesystem shows it).
                    let cancelled = job.cancelled.is_some() || job.given_up.is_some();
                    connects_to(&state, cancelled) && crate::agent::socket_path(&dir).exists()
                }
                (JobState::Running(_), Phase::Ready) => {
                    let left = job.time_left(std::time::SystemTime::now());
                    retire = super::too_little_time(&ctx.args, left);
                    false
                }
                _ => false,
            };
            if let Some(why) = retire {
                // A new allocation is requested by this poll's top-up.
                if let Some(index) = shared.jobs.iter().position(|j| j.id == id) {
                    super::retire(&ctx.args, &mut shared, index, why);
                }
            }
            connect
        };
        // The job runs on: those trials ended by themselves (or their agent was stopped by
        // someone other than Slurm).
        for event in released {
            (ctx.emit)(event);
            ctx.changed.notify_waiters();
        }
        if let Some(link) = shutdown {
            link.send(ToAgent::Shutdown);
        }
        if let Some(why) = requeued {
            lose_trials(ctx, id, &why).await;
        }
        if let Some(why) = never {
            never_runs(ctx, id, why).await;
        }
        if let Some(id) = release {
            knob_plugin_api::log::info(&format!(
                "training service slurm: job {id} is retired and runs no trial any more; cancelled"
            ));
            if let Err(e) = commands::scancel(&[id]).await {
                warn(
                    ctx,
                    None,
                    format!("training service slurm: scancel {id}: {e}"),
                );
            }
        }
        if connect {
            connect_job(ctx, id, incoming.clone()).await;
        }
    }
}

/// Slurm holds job `id` pending for a reason no wait clears (`why`, from `super::never_runs`):
/// every job of the config asks alike, so none is submitted any more and the environments are
/// retired (the experiment ends with `why` once nothing runs). The job is cancelled; a trial
/// waiting for its own job (`reuseMode: false`) ends FAILED with `why`, not run again.
async fn never_runs(ctx: &Arc<Context>, id: u64, why: String) {
    let waiting = {
        let mut shared = lock(&ctx.shared);
        shared.never.get_or_insert_with(|| why.clone());
        let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        job.cancelled = Some(why.clone());
        job.waiting_trial.take()
    };
    warn(ctx, None, format!("training service slurm: {why}"));
    if let Some(trial) = waiting {
        let message = format!("training service slurm: {why}");
        // The trial never started: its start failed. A host that predates late start failures
        // is told its environment was lost instead; the start of it again is refused, saying
        // why.
        (ctx.emit)(if ctx.late_start_failures {
            ServiceEvent::StartFailed {
                trial_id: trial.trial_id,
                message,
            }
        } else {
            ServiceEvent::TrialEnded {
                trial_id: trial.trial_id,
                exit_code: None,
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                environment_lost: Some(message),
                ended_ms: None,
            }
        });
    }
    // After the trial's end: the core takes a trial not yet started in an environment that is
    // retired as one to place again.
    if !ctx.args.reuse_mode {
        (ctx.emit)(ServiceEvent::Environment {
            environment: super::environment::queue_environment(
                &ctx.args,
                lock(&ctx.shared).trial_concurrency,
                true,
            ),
        });
    }
    if let Err(e) = commands::scancel(&[id]).await {
        warn(
            ctx,
            None,
            format!("training service slurm: scancel {id}: {e}"),
        );
    }
    ctx.poke.notify_one();
}

/// Whether the agent of a job waiting for its connection (`Phase::Queued`) in `state` is to be
/// connected to: only while Slurm runs the job (not while it is configured, suspended or being
/// completed after its end or a cancel), and never once knob `cancelled` it (or gave up on its
/// agent): a job in COMPLETING after that would otherwise be connected to, failing, and
/// cancelled again at every poll ("attempt 23 of 5").
fn connects_to(state: &JobState, cancelled: bool) -> bool {
    *state == JobState::Running("RUNNING".to_string()) && !cancelled
}

/// Why a job just submitted is not ready; it stays the reason until Slurm gives one for the
/// job's wait.
pub(super) fn submitted(id: u64) -> String {
    format!("Slurm job {id} submitted")
}

/// For a job `squeue` no longer lists: its end, from the exit-code file or `scontrol`.
async fn ended_state(id: u64, name: &str, dir: &Path) -> Option<JobState> {
    // The exit-code file first: the job script wrote it after its agent exited, so the job
    // ended by itself, whatever slurmctld remembers.
    if let Ok(code) = std::fs::read_to_string(script::exit_code_file(dir, id)) {
        return Some(match code.trim() {
            "0" => JobState::Completed,
            _ => JobState::Failed,
        });
    }
    let fields = commands::show_job(id).await?;
    if fields.get("JobName").map(String::as_str) != Some(name) {
        return None;
    }
    fields.get("JobState").map(|state| JobState::parse(state))
}

async fn connect_job(
    ctx: &Arc<Context>,
    id: u64,
    incoming: mpsc::UnboundedSender<(u64, Incoming)>,
) {
    let (dir, environment_id, fresh) = {
        let mut shared = lock(&ctx.shared);
        let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        job.phase = Phase::Connecting;
        (
            job.dir.clone(),
            job.environment_id.clone(),
            job.connect_failures == 0,
        )
    };
    let outcome = Link::connect(
        id,
        &ctx.agent,
        &dir,
        &ctx.args.experiment_id,
        &environment_id,
        fresh,
    )
    .await;
    let mut start = None;
    let mut replaced = false;
    let mut resend_kills: Vec<(String, String)> = Vec::new();
    let cancel = {
        let mut shared = lock(&ctx.shared);
        let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        match outcome {
            Ok((link, welcome, mut messages)) => {
                replaced = job.agent.as_ref().is_some_and(|old| *old != welcome.agent)
                    && job.running.iter().any(|t| !welcome.running.contains(t));
                if !replaced {
                    // Kills not confirmed over the old link go again.
                    resend_kills = job
                        .kills
                        .iter()
                        .filter(|(trial, _)| welcome.running.contains(trial))
                        .map(|(trial, reason)| (trial.clone(), reason.clone()))
                        .collect();
                }
                job.agent = Some(welcome.agent);
                job.inventory = welcome.inventory;
                job.link = Some(link.clone());
                // A retired allocation stays so when its link is back: it was reported
                // retired, and a new one replaces it.
                job.phase = job.connected_phase();
                job.connect_failures = 0;
                emit_environment(ctx, job);
                if let Some(request) = job.waiting_trial.take() {
                    job.running.insert(request.trial_id.clone());
                    job.ran_trials = true;
                    start = Some((link, request));
                }
                tokio::spawn(async move {
                    while let Some(message) = messages.recv().await {
                        let closed = matches!(message, Incoming::Closed(_));
                        if incoming.send((id, message)).is_err() || closed {
                            return;
                        }
                    }
                });
                false
            }
            Err(why) => {
                job.connect_failures += 1;
                job.phase = Phase::Queued(format!("connecting to its agent: {why}"));
                knob_plugin_api::log::warn(&format!(
                    "training service slurm: job {id}: {why} (attempt {} of {CONNECT_ATTEMPTS})",
                    job.connect_failures
                ));
                let give_up = job.connect_failures >= CONNECT_ATTEMPTS && job.given_up.is_none();
                if give_up {
                    let given_up = format!(
                        "its agent could not be reached in {CONNECT_ATTEMPTS} attempts ({why})"
                    );
                    job.phase = Phase::Queued(format!("Slurm job {id} cancelled: {given_up}"));
                    job.given_up = Some(given_up);
                }
                give_up
            }
        }
    };
    if let Some(link) = lock(&ctx.shared)
        .jobs
        .iter()
        .find(|j| j.id == id)
        .and_then(|j| j.link.clone())
    {
        for (trial_id, reason) in resend_kills {
            let (ctx, link) = (ctx.clone(), link.clone());
            tokio::spawn(async move {
                let action = super::KillAction::Agent { job_id: id, link };
                super::carry_out_kill(&ctx, action, &trial_id, &reason).await;
            });
        }
    }
    if replaced {
        lose_trials(ctx, id, "ran again with a new agent (requeued by Slurm)").await;
        // The new agent takes trials; lose_trials marked the job as waiting.
        let mut shared = lock(&ctx.shared);
        if let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) {
            if job.link.is_some() && job.cancelled.is_none() {
                job.phase = job.connected_phase();
                emit_environment(ctx, job);
            }
        }
    }
    if cancel {
        warn(
            ctx,
            None,
            format!("training service slurm: the agent of Slurm job {id} cannot be reached; the job is cancelled"),
        );
        let _ = commands::scancel(&[id]).await;
    }
    if let Some((link, request)) = start {
        let trial_id = request.trial_id.clone();
        let outcome = link
            .request(|rid| ToAgent::Start {
                id: rid,
                request: Box::new(request),
                fresh_code_copy: false,
            })
            .await;
        if let Err(why) = outcome {
            // The trial was accepted by start_trial, so its end is reported.
            {
                let mut shared = lock(&ctx.shared);
                if let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) {
                    job.running.remove(&trial_id);
                }
            }
            (ctx.emit)(ServiceEvent::TrialEnded {
                trial_id,
                exit_code: None,
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                ended_ms: None,
                environment_lost: Some(format!(
                    "Slurm job {id}: the agent refused the start: {why}"
                )),
            });
            link.send(ToAgent::Shutdown);
        }
    }
}

/// The job's trials are gone though the job is not (Slurm requeued it): each ends as an
/// environment lost, once. In `reuseMode: true` the allocation is used again once it runs; a
/// job of one trial is cancelled, since its trial will run elsewhere.
async fn lose_trials(ctx: &Arc<Context>, id: u64, why: &str) {
    let (trials, environment_id, cancel) = {
        let mut shared = lock(&ctx.shared);
        let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        let mut trials: Vec<String> = std::mem::take(&mut job.running).into_iter().collect();
        trials.extend(held_trials(job));
        // Their ends are told now; a later attempt of one of them here is not being killed.
        job.kills.clear();
        if let Some(link) = job.link.take() {
            link.close();
        }
        job.phase = Phase::Queued(format!("Slurm job {id} {why}"));
        emit_environment(ctx, job);
        // Slurm killed the old agent; its socket file would look like the new one's.
        let _ = std::fs::remove_file(crate::agent::socket_path(&job.dir));
        let cancel = !ctx.args.reuse_mode && job.cancelled.is_none();
        if cancel {
            job.cancelled = Some(format!("Slurm job {id} {why}; its trial runs again"));
        }
        (trials, job.environment_id.clone(), cancel)
    };
    for trial_id in &trials {
        (ctx.emit)(ServiceEvent::TrialEnded {
            trial_id: trial_id.clone(),
            exit_code: None,
            signal: None,
            killed_reason: None,
            stderr_tail: String::new(),
            ended_ms: None,
            environment_lost: Some(format!("Slurm job {id} ({environment_id}) {why}")),
        });
    }
    warn(
        ctx,
        None,
        format!(
            "training service slurm: Slurm job {id} ({environment_id}) {why}; {} trial(s) in it will run again",
            trials.len()
        ),
    );
    if cancel {
        if let Err(e) = commands::scancel(&[id]).await {
            warn(
                ctx,
                None,
                format!("training service slurm: scancel {id}: {e}"),
            );
        }
    }
    ctx.changed.notify_waiters();
}

/// A message from a job's agent.
pub(super) fn on_incoming(ctx: &Arc<Context>, job_id: u64, message: Incoming) {
    match message {
        Incoming::Message(FromAgent::Event { event, .. }) => {
            let mut shutdown = None;
            if let ServiceEvent::TrialEnded {
                trial_id,
                exit_code,
                signal,
                killed_reason,
                ..
            } = &event
            {
                let mut shared = lock(&ctx.shared);
                let stopping = shared.stopping;
                if let Some(job) = shared.jobs.iter_mut().find(|j| j.id == job_id) {
                    if !job.running.remove(trial_id) {
                        // Already reported ended (its job was declared gone): not again.
                        return;
                    }
                    let asked =
                        job.kills.remove(trial_id).is_some() || stopping || job.cancelled.is_some();
                    let signalled = killed_reason.is_some()
                        || matches!(signal, Some(SIGKILL | SIGTERM))
                        || matches!(exit_code, Some(137 | 143));
                    if signalled && !asked {
                        // Slurm signals every process of a job it ends (time limit, scancel,
                        // preemption, requeue): the agent stops its trials, or they die of
                        // the signal, before squeue shows why. The job's state decides.
                        job.held.push((event, Instant::now()));
                        return;
                    }
                    if !ctx.args.reuse_mode {
                        shutdown = job.link.clone();
                    }
                }
            }
            (ctx.emit)(event);
            if let Some(link) = shutdown {
                // One trial per job: the agent exits and the job completes.
                link.send(ToAgent::Shutdown);
            }
            ctx.changed.notify_waiters();
        }
        Incoming::Message(FromAgent::Inventory { inventory }) => {
            let mut shared = lock(&ctx.shared);
            if let Some(job) = shared.jobs.iter_mut().find(|j| j.id == job_id) {
                job.inventory = inventory;
                if job.phase == Phase::Ready {
                    emit_environment(ctx, job);
                }
            }
        }
        Incoming::Message(_) => {}
        Incoming::Closed(why) => {
            let mut shared = lock(&ctx.shared);
            if let Some(job) = shared.jobs.iter_mut().find(|j| j.id == job_id) {
                if job.phase == Phase::Ended {
                    return;
                }
                knob_plugin_api::log::debug(&format!(
                    "training service slurm: connection to the agent of job {job_id} closed ({why})"
                ));
                if let Some(link) = job.link.take() {
                    link.close();
                }
                // Connected again at the next poll if the job still runs.
                job.phase = Phase::Queued(format!("Slurm job {job_id}: reconnecting to its agent"));
                job.connect_failures += 1;
                emit_environment(ctx, job);
            }
        }
    }
}

/// A job has ended (`how`: its Slurm state, or why it is considered gone): every trial still
/// running in it, or waiting for it, ends with what that means (queued, after the job's own
/// report, in `Shared::after_top_up` for the monitor to emit).
pub(super) fn end_job(ctx: &Arc<Context>, id: u64, how: &str) {
    let (ended, job_snapshot) = {
        let mut shared = lock(&ctx.shared);
        let reuse = ctx.args.reuse_mode;
        let Some(job) = shared.jobs.iter_mut().find(|j| j.id == id) else {
            return;
        };
        if job.phase == Phase::Ended {
            return;
        }
        job.phase = Phase::Ended;
        if let Some(link) = job.link.take() {
            link.close();
        }
        let mut trials: Vec<String> = std::mem::take(&mut job.running).into_iter().collect();
        trials.extend(held_trials(job));
        if let Some(waiting) = job.waiting_trial.take() {
            trials.push(waiting.trial_id);
        }
        let cancelled = job.cancelled.clone();
        let given_up = job.given_up.clone();
        let ran = job.ran_trials;
        let retired = retired_environment(&ctx.args, job);
        let snapshot = (job.environment_id.clone(), job.key.clone());
        shared.after_top_up.extend(retired);
        if reuse && !ran && cancelled.is_none() && !shared.stopping {
            shared.failed_allocations += 1;
        }
        ((trials, cancelled, given_up), snapshot)
    };
    let (trials, cancelled, given_up) = ended;
    let reuse = ctx.args.reuse_mode;
    let (environment_id, _key) = job_snapshot;
    let (state, how) = ended_how(how, given_up.as_deref());
    // A job that ended by itself (not by knob, nor done): its log's last lines say why, most
    // often (a setup command that failed, Slurm's own "CANCELLED ... DUE TO TIME LIMIT").
    let log = (cancelled.is_none() && state != JobState::Completed).then(|| {
        let dir = lock(&ctx.shared)
            .jobs
            .iter()
            .find(|j| j.id == id)
            .map(|j| j.dir.clone())
            .unwrap_or_default();
        let path = script::job_log(&dir, id);
        let ends = crate::agent::last_lines(&path, 2);
        (path, ends)
    });
    let told = match &log {
        Some((_, Some(ends))) => format!("{how}; its log ends: {ends}"),
        _ => how.clone(),
    };
    let ends: Vec<ServiceEvent> = trials
        .into_iter()
        .map(|trial_id| {
            trial_end(
                trial_id,
                id,
                &environment_id,
                &state,
                &told,
                cancelled.as_deref(),
                (!reuse).then_some(&ctx.args.job),
            )
        })
        .collect();
    // Emitted by the monitor once it has requested what replaces the job.
    lock(&ctx.shared).after_top_up.extend(ends);
    if let Some((path, ends)) = log {
        let ends = ends
            .map(|e| format!(", which ends: {e}"))
            .unwrap_or_default();
        warn(
            ctx,
            None,
            format!(
                "training service slurm: Slurm job {id} ({environment_id}) ended: {how}; its log: {}{ends}",
                path.display()
            ),
        );
    }
    ctx.changed.notify_waiters();
    ctx.poke.notify_one();
}

/// The state a job ended in, read from `how`, and how that is told; a job whose agent knob
/// gave up on (`given_up`) ended because knob cancelled it, not "outside knob", though Slurm
/// says CANCELLED: its trials' environment was lost, and the message says why.
fn ended_how(how: &str, given_up: Option<&str>) -> (JobState, String) {
    match given_up {
        Some(why) => (
            JobState::OtherEnd("CANCELLED".to_string()),
            format!("cancelled by knob: {why}"),
        ),
        None => (JobState::parse(how), how.to_string()),
    }
}

/// The trials whose ends `on_incoming` held: the job's fate decides how they end.
fn held_trials(job: &mut super::Job) -> Vec<String> {
    std::mem::take(&mut job.held)
        .into_iter()
        .filter_map(|(event, _)| match event {
            ServiceEvent::TrialEnded { trial_id, .. } => Some(trial_id),
            _ => None,
        })
        .collect()
}

/// How a trial still in a job ends when the job ends (`state`, read from `how`); `cancelled`
/// is knob's own reason when knob cancelled the job; `own_job` the job options when the job was
/// the trial's own (`reuseMode: false`).
pub(super) fn trial_end(
    trial_id: String,
    job_id: u64,
    environment_id: &str,
    state: &JobState,
    how: &str,
    cancelled: Option<&str>,
    own_job: Option<&super::args::JobOptions>,
) -> ServiceEvent {
    let mut signal = None;
    let mut stderr_tail = String::new();
    let mut killed_reason = None;
    let mut environment_lost = None;
    match (cancelled, state) {
        (Some(reason), _) => killed_reason = Some(reason.to_string()),
        (None, JobState::OutOfMemory) => {
            // What the kernel's OOM killer would have done: the core counts it toward
            // maxOomRetries, not as an environment lost.
            signal = Some(9);
            stderr_tail = format!(
                "OUT_OF_MEMORY: Slurm job {job_id} ({environment_id}) exceeded its memory (--mem); Killed"
            );
        }
        (None, JobState::Cancelled) => {
            environment_lost = Some(format!(
                "Slurm job {job_id} ({environment_id}) was cancelled outside knob (scancel)"
            ))
        }
        // The trial's own job reached its time limit: the trial took longer than `time` (or
        // the partition's limit) gives it, and would again in a new job, so it fails (its
        // retries are maxTrialRetries') instead of being run again up to the host-loss limit,
        // each run cut at the same limit.
        (None, JobState::Timeout) if own_job.is_some() => {
            signal = Some(SIGTERM);
            let (limit, advice) = match own_job.and_then(|o| o.time.as_deref()) {
                Some(time) => (format!("trainingService.time {time:?}"), "raise time"),
                None => (
                    "its partition's".to_string(),
                    "set trainingService.time longer",
                ),
            };
            stderr_tail = format!(
                "TIMEOUT: Slurm job {job_id} ({environment_id}) reached its time limit ({limit}) before the trial ended; {advice} for trials this long"
            );
        }
        // TIMEOUT of an allocation, PREEMPTED, NODE_FAIL, a requeue, an agent gone: the trial
        // did not fail, its environment did.
        (None, _) => {
            environment_lost = Some(format!(
                "Slurm job {job_id} ({environment_id}) ended: {how}"
            ))
        }
    }
    ServiceEvent::TrialEnded {
        trial_id,
        exit_code: None,
        signal,
        killed_reason,
        stderr_tail,
        environment_lost,
        ended_ms: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(state: &str, cancelled: Option<&str>) -> ServiceEvent {
        trial_end(
            "t".into(),
            7,
            "slurm:env1",
            &JobState::parse(state),
            state,
            cancelled,
            None,
        )
    }

    fn lost(event: &ServiceEvent) -> Option<&str> {
        match event {
            ServiceEvent::TrialEnded {
                environment_lost, ..
            } => environment_lost.as_deref(),
            _ => None,
        }
    }

    #[test]
    fn a_job_lost_to_slurm_is_an_environment_lost() {
        for state in ["TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL"] {
            let event = end(state, None);
            assert_eq!(
                lost(&event),
                Some(format!("Slurm job 7 (slurm:env1) ended: {state}").as_str())
            );
        }
        assert_eq!(
            lost(&end("CANCELLED by 0", None)),
            Some("Slurm job 7 (slurm:env1) was cancelled outside knob (scancel)")
        );
    }

    #[test]
    fn a_trials_own_job_reaching_its_time_limit_fails_the_trial_naming_the_limit() {
        let mut options = super::super::args::JobOptions::default();
        for (time, says) in [
            (
                Some("1"),
                "TIMEOUT: Slurm job 7 (slurm:queue) reached its time limit (trainingService.time \"1\") before the trial ended; raise time for trials this long",
            ),
            (
                None,
                "TIMEOUT: Slurm job 7 (slurm:queue) reached its time limit (its partition's) before the trial ended; set trainingService.time longer for trials this long",
            ),
        ] {
            options.time = time.map(str::to_string);
            let event = trial_end(
                "t".into(),
                7,
                "slurm:queue",
                &JobState::Timeout,
                "TIMEOUT",
                None,
                Some(&options),
            );
            let ServiceEvent::TrialEnded {
                signal,
                stderr_tail,
                environment_lost,
                ..
            } = event
            else {
                panic!()
            };
            // A failure of the trial, not a lost host to run it on again.
            assert_eq!((signal, environment_lost), (Some(SIGTERM), None));
            assert_eq!(stderr_tail, says);
        }
        // Preempted, its node failed: the job's environment was lost, not the trial's time.
        for state in ["PREEMPTED", "NODE_FAIL"] {
            let event = trial_end(
                "t".into(),
                7,
                "slurm:queue",
                &JobState::parse(state),
                state,
                None,
                Some(&options),
            );
            assert!(lost(&event).is_some(), "{state}");
        }
    }

    #[test]
    fn out_of_memory_reads_as_the_oom_killer_and_knobs_cancel_as_a_kill() {
        let ServiceEvent::TrialEnded {
            signal,
            stderr_tail,
            environment_lost,
            ..
        } = end("OUT_OF_MEMORY", None)
        else {
            panic!()
        };
        assert_eq!((signal, environment_lost), (Some(9), None));
        assert!(stderr_tail.contains("OUT_OF_MEMORY"), "{stderr_tail}");
        let ServiceEvent::TrialEnded {
            killed_reason,
            environment_lost,
            ..
        } = end("CANCELLED", Some("the experiment stopped"))
        else {
            panic!()
        };
        assert_eq!(killed_reason.as_deref(), Some("the experiment stopped"));
        assert_eq!(environment_lost, None);
    }

    #[test]
    fn only_a_running_job_that_knob_kept_is_connected_to() {
        let running = JobState::parse("RUNNING");
        assert!(connects_to(&running, false));
        assert!(!connects_to(&running, true));
        for state in ["COMPLETING", "CONFIGURING", "SUSPENDED", "PENDING"] {
            assert!(!connects_to(&JobState::parse(state), false), "{state}");
        }
    }

    #[test]
    fn a_job_whose_agent_knob_gave_up_on_loses_its_trials_saying_so() {
        let why = "its agent could not be reached in 5 attempts (connection refused)";
        let (state, how) = ended_how("CANCELLED by 0", Some(why));
        let event = trial_end("t".into(), 7, "slurm:env1", &state, &how, None, None);
        assert_eq!(
            lost(&event),
            Some(format!("Slurm job 7 (slurm:env1) ended: cancelled by knob: {why}").as_str())
        );
        // Without it, Slurm's word stands.
        let (state, how) = ended_how("CANCELLED by 0", None);
        assert_eq!(
            (state, how.as_str()),
            (JobState::Cancelled, "CANCELLED by 0")
        );
    }
}
