//! One remote host: its SSH connection, its agent, and the trials it runs.
//!
//! A driver task per host owns the connection's life: connect, set up (architecture check,
//! agent upload), attach to the agent daemon, then read the agent's messages until the
//! connection drops; reconnect within `hostLossTimeoutSecs`, or declare the host lost. The
//! service's calls (start, kill, shutdown) reach the agent through [`Link::outgoing`], and wait
//! for replies through [`Link::pending`].

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use knob_gpu_sched::{EnvironmentLimits, SchedulerConfig};
use knob_plugin_api::service::{Environment, ServiceEvent, TrialRequest, NOT_STARTED};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::args::{Machine, RemoteArgs};
use super::setup::{prepare_host, AgentBinary, HostPaths};
use super::ssh::{self, Connection, SshError};
use crate::agent_protocol::{
    read_frame_async, unix_ms, write_frame_async, FromAgent, HostLayout, ToAgent,
    CODE_COMPLETE_MARKER, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT, PROTOCOL_VERSION,
};
use crate::code_archive::CodeArchive;
use crate::metrics::Emit;

/// How long the agent may take to answer a start or kill.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long uploading one code archive may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// After a host is declared lost, reconnection is still tried this many times (with a growing
/// pause of at most [`MAX_BACKOFF`]), so that a host that comes back can take trials again.
const RECOVERY_ATTEMPTS: u32 = 120;
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// What every host shares.
pub struct Context {
    pub args: RemoteArgs,
    pub emit: Emit,
    pub agent_binary: Option<Arc<AgentBinary>>,
    next_request: AtomicU64,
    /// This manager process in every hello (`ToAgent::Hello::manager`): `<host>:<pid>:<ms>`.
    manager: String,
    /// Why the trial code cannot be sent to any host (it cannot be archived), while it cannot:
    /// every host is then reported not ready with it (see `RemoteService::archive`).
    code_problem: std::sync::Mutex<Option<String>>,
}

impl Context {
    pub fn new(args: RemoteArgs, emit: Emit, agent_binary: Option<Arc<AgentBinary>>) -> Context {
        Context {
            args,
            emit,
            agent_binary,
            next_request: AtomicU64::new(1),
            manager: manager_token(),
            code_problem: std::sync::Mutex::default(),
        }
    }

    /// Sets (or clears) why the trial code cannot be sent to the hosts.
    pub fn set_code_problem(&self, problem: Option<String>) {
        *lock(&self.code_problem) = problem;
    }
    fn request_id(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// A token naming this process for the agents' hellos (`ToAgent::Hello::manager`):
/// `<host>:<pid>:<ms>`.
pub(super) fn manager_token() -> String {
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|name| name.into_string().ok())
        .unwrap_or_default();
    format!("{host}:{}:{started_ms}", std::process::id())
}

/// `knob-agent attach` of the experiment's environment on a host: a connection to its daemon,
/// started if none listens.
pub(super) fn attach_command(paths: &HostPaths) -> String {
    // Without SSH_CLIENT, each trial's `bash -c` does not source ~/.bashrc again (bash does
    // when it thinks sshd ran it): the daemon already inherits what the login shell set up,
    // and a pyenv or conda init costs 200-300 ms a trial.
    format!(
        "env -u SSH_CLIENT -u SSH2_CLIENT {} attach --dir {}",
        ssh::shell_quote(&paths.agent),
        ssh::shell_quote(&paths.environment_dir)
    )
}

/// The live connection to a host's agent.
struct Link {
    ssh: Arc<Connection>,
    outgoing: mpsc::UnboundedSender<ToAgent>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Option<String>>>>,
    paths: HostPaths,
    /// How far this machine's clock is ahead of the host's (ms), as the welcome showed (its
    /// error is the welcome's time on the way, so an event is never placed early); `None`
    /// from an agent that does not say its time.
    clock_offset_ms: Option<i64>,
}

impl Link {
    /// The connection is gone: every request waiting for a reply learns that it got none (its
    /// receiver sees the sender dropped), which is not the agent's refusal: a start sent may
    /// have run.
    fn drop_pending(&self) {
        lock(&self.pending).clear();
    }
}

/// A start whose request went out but whose reply was lost with the connection: the agent may
/// or may not have run it. The trial counts as running here; when the agent is reached again
/// the same start is sent once more, which the agent answers without running an attempt twice
/// (it remembers the attempts it started, by trial folder), and a kill asked for meanwhile
/// follows the confirmation.
struct UnconfirmedStart {
    request: TrialRequest,
    fresh_code_copy: bool,
    kill_after: Option<String>,
}

#[derive(Default)]
struct HostState {
    ready: bool,
    /// Declared lost: its trials were reported ended.
    lost: bool,
    link: Option<Arc<Link>>,
    /// Why it is not ready, for errors and the inventory's status.
    failure: Option<String>,
    /// Trials started here and not yet seen to end.
    running: BTreeSet<String>,
    /// Trials whose end was already reported (host lost, start abandoned): their further
    /// events are dropped, and the agent is told to kill them.
    disowned: HashSet<String>,
    /// The highest event `seq` delivered from the current daemon.
    last_seq: u64,
    /// The daemon's pid: a different one after a reconnect is a new daemon.
    daemon_pid: Option<u32>,
    connected_once: bool,
    /// Never reached so far, and still tried ([`Host::drive`]'s first failure was not a
    /// permanent one, and [`Host::give_up`] has not come): reported with `"retrying": true`
    /// beside its status alone, so that the core keeps trials waiting for it instead of
    /// ending the experiment for want of an environment while the host comes up.
    retrying: bool,
    inventory: Value,
    uploaded_code: HashSet<String>,
    kills_to_send: Vec<(String, String)>,
    /// Started trials whose start the agent has not confirmed, by trial id.
    unconfirmed_starts: HashMap<String, UnconfirmedStart>,
    /// The request ids of unconfirmed starts sent again on the current connection, by id.
    resent_starts: HashMap<u64, String>,
    /// `Shutdown` was sent: the agent's exit is expected, not reconnected to.
    shutting_down: bool,
    /// The agent confirmed the shutdown (`FromAgent::ShutDown`): its trials are stopped and
    /// it exits.
    shutdown_confirmed: bool,
}

/// How a host's agent took the end of the experiment.
#[derive(Debug, Default)]
pub struct ShutdownOutcome {
    /// Trials not seen to end.
    pub unfinished: Vec<String>,
    /// Why the agent's shutdown was not confirmed, when it was connected and was not.
    pub unconfirmed: Option<String>,
}

/// One machine of `machineList`.
pub struct Host {
    pub machine: Machine,
    pub environment_id: String,
    state: Mutex<HostState>,
    /// Notified whenever a trial ends here or the agent confirms its shutdown, for
    /// `shut_down`'s wait.
    trial_ended: Notify,
    upload_lock: tokio::sync::Mutex<()>,
    /// Code archives actually sent (not found on the host already).
    code_uploads: AtomicU64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Host {
    pub fn new(machine: Machine) -> Arc<Host> {
        Arc::new(Host {
            environment_id: machine.environment_id(),
            machine,
            state: Mutex::default(),
            trial_ended: Notify::new(),
            upload_lock: tokio::sync::Mutex::new(()),
            code_uploads: AtomicU64::new(0),
        })
    }

    /// The environment as the core sees it now.
    pub fn environment(&self, ctx: &Context) -> Environment {
        let state = lock(&self.state);
        // A host never reached has no inventory: its status alone says why it is not ready
        // (the core shows it, and does not wait for the host).
        let inventory = if state.inventory.is_null() && !state.ready {
            let why = (state.failure.clone())
                .unwrap_or_else(|| format!("{}: still connecting", self.machine.target()));
            let status = knob_gpu_sched::EnvironmentStatus::Unavailable(why);
            match state.retrying {
                true => serde_json::json!({ "status": status, "retrying": true }),
                false => serde_json::json!({ "status": status }),
            }
        } else {
            state.inventory.clone()
        };
        let mut environment = Environment {
            id: self.environment_id.clone(),
            host: self.machine.host_port(),
            ready: state.ready,
            inventory,
        };
        drop(state);
        if let Some(why) = lock(&ctx.code_problem).clone() {
            environment.ready = false;
            if let Some(inventory) = environment.inventory.as_object_mut() {
                inventory.insert(
                    "status".into(),
                    serde_json::json!(knob_gpu_sched::EnvironmentStatus::Unavailable(why)),
                );
            }
        }
        environment
    }

    /// Code archives sent to this host so far (skipped ones not counted).
    pub fn code_uploads(&self) -> u64 {
        self.code_uploads.load(Ordering::Relaxed)
    }

    pub fn is_ready(&self) -> bool {
        lock(&self.state).ready
    }

    pub fn running_trials(&self) -> Vec<String> {
        lock(&self.state).running.iter().cloned().collect()
    }

    pub fn runs(&self, trial_id: &str) -> bool {
        lock(&self.state).running.contains(trial_id)
    }

    /// Tells the agent that the manager's trials wait for resources, so that it stands in the
    /// host ledger's line for the GPUs other experiments hold (see `ToAgent::StandInLine`);
    /// nothing when the host is not connected now (the next wait asks again).
    pub fn stand_in_line(&self, demand: Option<&SchedulerConfig>) {
        let state = lock(&self.state);
        if let (true, Some(link)) = (state.ready, &state.link) {
            let _ = link.outgoing.send(ToAgent::StandInLine {
                demand: demand.cloned(),
                limits: Some(self.limits()),
            });
        }
    }

    /// Tells the agent that none of the manager's trials waits any more, so that it leaves the
    /// host ledger's line (see `ToAgent::LeaveLine`); nothing when the host is not connected
    /// now (its place lapses there).
    pub fn leave_line(&self) {
        let state = lock(&self.state);
        if let (true, Some(link)) = (state.ready, &state.link) {
            let _ = link.outgoing.send(ToAgent::LeaveLine);
        }
    }

    /// This machine's limits (`gpuIndices`, `maxTrialNumberPerGpu` …) as gpu-sched applies them.
    fn limits(&self) -> EnvironmentLimits {
        let mut limits = EnvironmentLimits {
            gpu_indices: self.machine.gpu_indices.clone(),
            max_trial_number_per_gpu: self.machine.max_trial_number_per_gpu,
            use_active_gpu: self.machine.use_active_gpu,
            ..EnvironmentLimits::default()
        };
        crate::limits::copy(&self.machine.limits, &mut limits);
        limits
    }

    pub(super) fn emit_environment(&self, ctx: &Context) {
        (ctx.emit)(ServiceEvent::Environment {
            environment: self.environment(ctx),
        });
    }

    /// The inventory the agent probed, with this machine's limits and readiness applied.
    fn apply_limits(&self, inventory: &Value, ready: bool, why: Option<&str>) -> Value {
        let mut environment: knob_gpu_sched::Environment = match serde_json::from_value(
            inventory.clone(),
        ) {
            Ok(environment) => environment,
            Err(e) => {
                knob_plugin_api::log::warn(&format!(
                        "training service remote: {}: the agent's inventory is not a gpu-sched environment ({e}); GPUs there are not scheduled",
                        self.machine.target()
                    ));
                return Value::Null;
            }
        };
        environment.id = knob_gpu_sched::EnvironmentId(self.environment_id.clone());
        environment.host = self.machine.host.clone();
        environment.limits = self.limits();
        environment.status = if ready {
            knob_gpu_sched::EnvironmentStatus::Ready
        } else {
            knob_gpu_sched::EnvironmentStatus::Unavailable(
                why.unwrap_or("not connected").to_string(),
            )
        };
        serde_json::to_value(environment).unwrap_or(Value::Null)
    }

    fn set_not_ready(&self, ctx: &Context, why: &str) {
        {
            let mut state = lock(&self.state);
            state.ready = false;
            state.link = None;
            state.failure = Some(why.to_string());
            let raw = state.inventory.clone();
            if !raw.is_null() {
                state.inventory = self.apply_limits(&raw, false, Some(why));
            }
        }
        self.emit_environment(ctx);
    }

    /// Reports every trial running here as ended because the host is gone, `why` (which
    /// names the login) being the reason.
    fn declare_lost(&self, ctx: &Context, why: &str) {
        let lost_trials: Vec<String> = {
            let mut state = lock(&self.state);
            state.lost = true;
            state.unconfirmed_starts.clear();
            let trials: Vec<String> = std::mem::take(&mut state.running).into_iter().collect();
            state.disowned.extend(trials.iter().cloned());
            trials
        };
        // The core says it once: "environment … lost: <reason>" at the first of these ends,
        // or, with none, the environment's new reason ("lost: …").
        knob_plugin_api::log::debug(&format!(
            "training service remote: host {} lost: {why}; {} running trial(s) ended",
            self.machine.host_port(),
            lost_trials.len()
        ));
        let reason = why.to_string();
        for trial_id in lost_trials {
            (ctx.emit)(ServiceEvent::TrialEnded {
                trial_id,
                exit_code: None,
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                ended_ms: None,
                environment_lost: Some(reason.clone()),
            });
        }
        self.trial_ended.notify_waiters();
    }

    /// Connects, sets up and attaches; on success the host is ready.
    async fn establish(
        self: &Arc<Self>,
        ctx: &Arc<Context>,
        stop: &watch::Receiver<bool>,
    ) -> Result<mpsc::UnboundedReceiver<Result<FromAgent, String>>, SshError> {
        let target = self.machine.target();
        let keepalive = HEARTBEAT_INTERVAL;
        let connection =
            Arc::new(ssh::connect(&self.machine, &ctx.args.known_hosts_file, keepalive).await?);
        let paths = prepare_host(
            &connection,
            &self.machine,
            &ctx.args,
            ctx.agent_binary.as_deref(),
        )
        .await?;
        let (stream, stderr) = connection
            .open_stream_keeping_stderr(&attach_command(&paths))
            .await?;
        let (mut reader, mut writer) = tokio::io::split(stream);

        let (last_seq, fresh_start) = {
            let state = lock(&self.state);
            (state.last_seq, !state.connected_once)
        };
        let hello = ToAgent::Hello {
            protocol: PROTOCOL_VERSION,
            experiment_id: ctx.args.experiment_id.clone(),
            environment_id: self.environment_id.clone(),
            last_seq,
            fresh_start,
            new_experiment: fresh_start && ctx.args.new_experiment,
            manager: ctx.manager.clone(),
        };
        let agent_error = |what: String| SshError::Session {
            target: target.clone(),
            what,
        };
        write_frame_async(&mut writer, &hello)
            .await
            .map_err(|e| agent_error(format!("cannot talk to the agent: {e}")))?;
        let welcome = tokio::time::timeout(ssh::CONNECT_TIMEOUT, read_frame_async(&mut reader))
            .await
            .map_err(|_| agent_error("the agent did not answer the hello in time".to_string()))?
            .map_err(|e| {
                // `attach` says on stderr why it gave up (no daemon, a full disk).
                let why = stderr
                    .last_line()
                    .map(|line| format!(" ({line})"))
                    .unwrap_or_default();
                agent_error(format!("the agent did not answer the hello: {e}{why}"))
            })?;
        let (pid, inventory, agent_running, clock_offset_ms) = match welcome {
            FromAgent::Welcome {
                protocol,
                pid,
                inventory,
                running,
                time_ms,
                ..
            } if protocol == PROTOCOL_VERSION => (
                pid,
                inventory,
                running,
                time_ms.map(|host_ms| unix_ms() - host_ms),
            ),
            FromAgent::Welcome { protocol, .. } => {
                return Err(SshError::Setup {
                    target,
                    what: format!(
                        "the agent speaks protocol {protocol}, this knob speaks {PROTOCOL_VERSION}; put the matching knob-agent on the host"
                    ),
                })
            }
            FromAgent::Refused { message } => {
                return Err(SshError::Setup {
                    target,
                    what: format!("the agent refused: {message}"),
                })
            }
            other => {
                return Err(agent_error(format!(
                    "the agent's first message was not a welcome: {other:?}"
                )))
            }
        };

        // The writer task: frames from the service's calls and the session loop, in order.
        let (outgoing, mut to_write) = mpsc::unbounded_channel::<ToAgent>();
        tokio::spawn(async move {
            while let Some(message) = to_write.recv().await {
                if write_frame_async(&mut writer, &message).await.is_err() {
                    break;
                }
            }
        });
        // The reader task: read_frame_async is not cancel-safe, so it runs alone and forwards.
        let (incoming_tx, incoming) = mpsc::unbounded_channel();
        let mut stop_reader = stop.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    frame = read_frame_async::<FromAgent>(&mut reader) => {
                        let end = frame.is_err();
                        if incoming_tx.send(frame.map_err(|e| e.to_string())).is_err() || end {
                            break;
                        }
                    }
                    _ = stop_reader.changed() => break,
                }
            }
        });

        let link = Arc::new(Link {
            ssh: connection,
            outgoing,
            pending: Mutex::default(),
            paths,
            clock_offset_ms,
        });
        let mut orphans_ended = Vec::new();
        {
            let mut state = lock(&self.state);
            if state.daemon_pid.is_some_and(|known| known != pid) {
                // A new daemon: its events are numbered from 1 again, and the trials the old
                // one ran are gone with it. Nothing it ran can report any more, so no trial is
                // disowned: a trial disowned here had the events of its next attempt, started
                // on this host by the new daemon, dropped, and waited for ever.
                state.last_seq = 0;
                state.disowned.clear();
                let gone: Vec<String> = state
                    .running
                    .iter()
                    .filter(|t| !agent_running.contains(t))
                    .cloned()
                    .collect();
                for trial in gone {
                    state.running.remove(&trial);
                    state.unconfirmed_starts.remove(&trial);
                    orphans_ended.push(trial);
                }
            }
            state.daemon_pid = Some(pid);
            state.connected_once = true;
            state.retrying = false;
            for trial in &agent_running {
                // A start the agent runs was confirmed, reply or not; a kill asked for
                // meanwhile goes now. The other unconfirmed starts go again below.
                if let Some(start) = state.unconfirmed_starts.remove(trial) {
                    if let Some(reason) = start.kill_after {
                        state.kills_to_send.push((trial.clone(), reason));
                    }
                }
                if state.disowned.contains(trial) {
                    state.kills_to_send.push((
                        trial.clone(),
                        "its host was declared lost and the trial was run elsewhere".to_string(),
                    ));
                }
            }
            for (trial_id, reason) in state.kills_to_send.drain(..) {
                let _ = link.outgoing.send(ToAgent::Kill {
                    id: ctx.request_id(),
                    trial_id,
                    reason,
                });
            }
            state.inventory = self.apply_limits(&inventory, true, None);
            state.ready = true;
            state.lost = false;
            state.failure = None;
            Host::resend_unconfirmed_starts(&mut state, ctx, &link);
            state.link = Some(link);
        }
        // Ready first: the host is here, only the trials the old daemon ran are gone, and the
        // core keeps an environment reported ready when a trial's end says it was lost.
        self.emit_environment(ctx);
        for trial_id in orphans_ended {
            (ctx.emit)(ServiceEvent::TrialEnded {
                trial_id,
                exit_code: None,
                signal: None,
                killed_reason: None,
                stderr_tail: String::new(),
                ended_ms: None,
                environment_lost: Some(format!(
                    "the agent on host {} started again (was it killed?) and the trial is gone",
                    self.machine.host_port()
                )),
            });
        }
        Ok(incoming)
    }

    /// Reads the agent's messages until the connection drops (returns why) or `stop` is set.
    async fn session(
        self: &Arc<Self>,
        ctx: &Arc<Context>,
        mut incoming: mpsc::UnboundedReceiver<Result<FromAgent, String>>,
        stop: &mut watch::Receiver<bool>,
    ) -> String {
        let Some(link) = lock(&self.state).link.clone() else {
            return "not connected".to_string();
        };
        let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
        let mut last_heard = Instant::now();
        let mut nonce = 0u64;
        loop {
            tokio::select! {
                message = incoming.recv() => match message {
                    Some(Ok(message)) => {
                        last_heard = Instant::now();
                        self.handle(ctx, &link, message);
                    }
                    Some(Err(e)) => return format!("the SSH connection closed ({e})"),
                    None => return "the SSH connection closed".to_string(),
                },
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > HEARTBEAT_TIMEOUT {
                        return format!("no answer from the agent for {} s", HEARTBEAT_TIMEOUT.as_secs());
                    }
                    if link.ssh.is_closed() {
                        return "the SSH connection closed".to_string();
                    }
                    nonce += 1;
                    let _ = link.outgoing.send(ToAgent::Ping { nonce });
                }
                _ = stop.changed() => return "the service stopped".to_string(),
            }
        }
    }

    fn handle(&self, ctx: &Context, link: &Link, message: FromAgent) {
        match message {
            FromAgent::Event {
                seq,
                mut event,
                time_ms,
            } => {
                if let ServiceEvent::TrialEnded { ended_ms, .. } = &mut event {
                    // On this machine's clock, and never later than now.
                    *ended_ms = time_ms
                        .zip(link.clock_offset_ms)
                        .map(|(host_ms, offset)| (host_ms + offset).min(unix_ms()));
                }
                let deliver = {
                    let mut state = lock(&self.state);
                    if seq <= state.last_seq {
                        false
                    } else {
                        state.last_seq = seq;
                        match trial_of(&event) {
                            Some(trial) if state.disowned.contains(trial) => {
                                if matches!(event, ServiceEvent::TrialEnded { .. }) {
                                    state.disowned.remove(trial);
                                }
                                false
                            }
                            Some(trial) => {
                                if matches!(event, ServiceEvent::TrialEnded { .. }) {
                                    state.running.remove(trial);
                                }
                                true
                            }
                            None => !matches!(event, ServiceEvent::Environment { .. }),
                        }
                    }
                };
                let ended = matches!(event, ServiceEvent::TrialEnded { .. });
                if deliver {
                    (ctx.emit)(match event {
                        ServiceEvent::Warning {
                            trial_id: None,
                            message,
                        } => ServiceEvent::Warning {
                            trial_id: None,
                            message: format!("{}: {message}", self.machine.target()),
                        },
                        other => other,
                    });
                }
                // A successor's copy of its parent's checkpoint folder stays when an attempt
                // ends: a retry starts from it too (`Host::delete_snapshot` deletes it).
                if ended {
                    self.trial_ended.notify_waiters();
                }
                let _ = link.outgoing.send(ToAgent::Ack { seq });
            }
            FromAgent::Inventory { inventory } => {
                {
                    let mut state = lock(&self.state);
                    let ready = state.ready;
                    state.inventory = self.apply_limits(&inventory, ready, None);
                }
                self.emit_environment(ctx);
            }
            FromAgent::Reply { id, error } => {
                let resent = lock(&self.state).resent_starts.remove(&id);
                if let Some(trial_id) = resent {
                    self.settle_resent_start(ctx, link, trial_id, error);
                } else if let Some(reply) = lock(&link.pending).remove(&id) {
                    let _ = reply.send(error);
                }
            }
            FromAgent::Pong { .. } => {}
            FromAgent::ShutDown => {
                lock(&self.state).shutdown_confirmed = true;
                self.trial_ended.notify_waiters();
            }
            FromAgent::Welcome { .. } | FromAgent::Refused { .. } => {
                knob_plugin_api::log::debug(&format!(
                    "training service remote: {}: unexpected handshake message ignored",
                    self.machine.target()
                ))
            }
        }
    }

    /// The host's life: connect, serve, reconnect or declare it lost. Sends on `first_attempt`
    /// once the first connection succeeded (`true`) or failed (`false`).
    pub async fn drive(
        self: Arc<Self>,
        ctx: Arc<Context>,
        mut stop: watch::Receiver<bool>,
        first_attempt: mpsc::Sender<bool>,
    ) {
        let target = self.machine.target();
        let mut incoming = match self.establish(&ctx, &stop).await {
            Ok(incoming) => {
                let _ = first_attempt.send(true).await;
                incoming
            }
            Err(e) => {
                // Said once, by the core, as why the host's environment is not ready (and in
                // its error if no environment is left): a warning of its own repeated it.
                let permanent = e.is_permanent();
                let mut why = e.to_string();
                if permanent {
                    why.push_str("; knob does not try this host again in this run");
                } else {
                    why.push_str("; knob keeps trying it, for about an hour");
                }
                lock(&self.state).retrying = !permanent;
                self.set_not_ready(&ctx, &why);
                let _ = first_attempt.send(false).await;
                // A host that is down now may come up later; a refused key or password will
                // not change by itself.
                if permanent {
                    return;
                }
                match self.recover(&ctx, &mut stop).await {
                    Reconnect::Back(incoming) => incoming,
                    Reconnect::Stopped => return,
                    Reconnect::GaveUp(last_error) => return self.give_up(&ctx, last_error),
                }
            }
        };
        loop {
            let why = self.session(&ctx, incoming, &mut stop).await;
            let link = lock(&self.state).link.clone();
            // Not ready first, then the waiting requests dropped: a start either sent its
            // request before (it learns the reply is lost) or sees the host not ready.
            if *stop.borrow() || lock(&self.state).shutting_down {
                self.set_not_ready(&ctx, "the service stopped");
                if let Some(link) = link {
                    link.drop_pending();
                    link.ssh.close().await;
                }
                return;
            }
            // Said by the core, as why the environment is not ready.
            self.set_not_ready(
                &ctx,
                &format!(
                    "{target}: {why}; reconnecting for up to {} s",
                    ctx.args.host_loss_timeout.as_secs_f64()
                ),
            );
            if let Some(link) = &link {
                link.drop_pending();
            }
            let deadline = Instant::now() + ctx.args.host_loss_timeout;
            match self
                .reconnect(&ctx, &mut stop, Some(deadline), u32::MAX)
                .await
            {
                Reconnect::Back(next) => incoming = next,
                Reconnect::Stopped => return,
                Reconnect::GaveUp(last_error) => {
                    // Names the login, as a connection's error does.
                    let why = last_error.unwrap_or_else(|| format!("{target}: {why}"));
                    self.declare_lost(&ctx, &why);
                    self.set_not_ready(&ctx, &format!("lost: {why}"));
                    match self.recover(&ctx, &mut stop).await {
                        Reconnect::Back(next) => incoming = next,
                        Reconnect::Stopped => return,
                        Reconnect::GaveUp(last_error) => return self.give_up(&ctx, last_error),
                    }
                }
            }
        }
    }

    /// No more tries (about an hour of them, or a refused key): the environment is reported by
    /// its status alone, with the last try's error, which the core reads as a host it no
    /// longer waits for (a lost host reported with its inventory is waited for, its trials
    /// wait for it; the experiment ends only once no environment is left).
    fn give_up(&self, ctx: &Context, last_error: Option<String>) {
        let why = {
            let mut state = lock(&self.state);
            state.inventory = Value::Null;
            state.retrying = false;
            let why = last_error
                .or_else(|| state.failure.clone())
                .unwrap_or_else(|| format!("{}: not reachable", self.machine.target()));
            state.failure = Some(format!("{why}; knob no longer tries this host in this run"));
            why
        };
        knob_plugin_api::log::debug(&format!(
            "training service remote: host {} given up: {why}",
            self.machine.host_port()
        ));
        self.emit_environment(ctx);
    }

    /// Keeps trying, at a slow pace ([`RECOVERY_ATTEMPTS`], about an hour), to bring back a
    /// host that is down or lost. Once it is back, its environment reported ready is what the
    /// core announces ("environment … is ready again").
    async fn recover(
        self: &Arc<Self>,
        ctx: &Arc<Context>,
        stop: &mut watch::Receiver<bool>,
    ) -> Reconnect {
        self.reconnect(ctx, stop, None, RECOVERY_ATTEMPTS).await
    }

    /// Tries to reconnect with a growing pause, until `deadline` or `attempts` run out.
    async fn reconnect(
        self: &Arc<Self>,
        ctx: &Arc<Context>,
        stop: &mut watch::Receiver<bool>,
        deadline: Option<Instant>,
        attempts: u32,
    ) -> Reconnect {
        let mut pause = Duration::from_millis(200);
        let mut last_error = None;
        for _ in 0..attempts {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|left| left.is_zero()) {
                break;
            }
            let wait = left.map_or(pause, |left| left.min(pause));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.changed() => return Reconnect::Stopped,
            }
            // An attempt may end a little after the deadline: the connect bound holds it.
            match self.establish(ctx, stop).await {
                Ok(incoming) => return Reconnect::Back(incoming),
                Err(e) => {
                    let permanent = e.is_permanent();
                    last_error = Some(e.to_string());
                    if permanent {
                        break;
                    }
                }
            }
            pause = (pause * 2).min(MAX_BACKOFF);
        }
        Reconnect::GaveUp(last_error)
    }

    /// Uploads the code archive unless the host has it, then starts the trial.
    pub async fn start(
        &self,
        ctx: &Context,
        request: &TrialRequest,
        archive: &CodeArchive,
        fresh_code_copy: bool,
    ) -> Result<(), String> {
        let target = self.machine.target();
        let link = {
            let state = lock(&self.state);
            match (&state.link, state.ready) {
                (Some(link), true) => link.clone(),
                _ => {
                    return Err(format!(
                        "{target} is not connected ({}); {NOT_STARTED}",
                        state.failure.as_deref().unwrap_or("connecting")
                    ))
                }
            }
        };
        let layout = HostLayout {
            root: link.paths.root.clone().into(),
        };
        let mut remote = request.clone();
        // Trials never run in the host's cache of the upload (`code/<hash>`), which every
        // experiment of the same code shares: what one trial wrote there (a config it edited, a
        // model it saved, data it deleted) reached the next experiment's trials, days later,
        // under a name that still promised the uploaded content. Without `fresh_code_copy` the
        // environment's trials share its own copy, as NNI's trials of one environment share
        // the uploaded code; with it the agent copies the cache into each trial's folder.
        let shared_copy = (!fresh_code_copy).then(|| {
            HostLayout::environment_code_dir(Path::new(&link.paths.environment_dir), &archive.hash)
        });
        // Nothing of the trial has reached the agent yet: the core may try it again.
        self.ensure_code(&link, archive, shared_copy.as_deref())
            .await
            .map_err(|e| format!("{e}; {NOT_STARTED}"))?;
        remote.code_dir = shared_copy.unwrap_or_else(|| layout.code_dir(&archive.hash));
        let mut trial_dir = Path::new(&link.paths.environment_dir)
            .join("trials")
            .join(&request.trial_id);
        if let Some(attempt) = request
            .trial_dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.starts_with("attempt-"))
        {
            trial_dir.push(attempt);
        }
        remote.trial_dir = trial_dir;
        if let Some(python) = &self.machine.python_path {
            let python = &super::setup::expand_python_path(python, &link.paths.home);
            let base = remote
                .env
                .get("PATH")
                .cloned()
                .unwrap_or_else(|| link.paths.path_variable.clone());
            remote
                .env
                .insert("PATH".to_string(), format!("{python}:{base}"));
            // Also in the command, as NNI does: bash started under sshd sources ~/.bashrc,
            // which often puts other interpreters first.
            remote.command = format!(
                "export PATH={}:\"$PATH\"; {}",
                ssh::shell_quote(python),
                request.command
            );
        }

        let id = ctx.request_id();
        let (reply_tx, reply_rx) = oneshot::channel();
        {
            // Under the state's lock, so that the link cannot be dropped in between: a request
            // sent here is either answered or learns (its sender dropped) that the reply is lost.
            let mut state = lock(&self.state);
            let current = state.ready && state.link.as_ref().is_some_and(|l| Arc::ptr_eq(l, &link));
            if !current {
                return Err(format!(
                    "{target} is not connected ({}); {NOT_STARTED}",
                    state.failure.as_deref().unwrap_or("the connection closed")
                ));
            }
            lock(&link.pending).insert(id, reply_tx);
            let sent = link.outgoing.send(ToAgent::Start {
                id,
                request: Box::new(remote.clone()),
                fresh_code_copy,
            });
            if sent.is_err() {
                lock(&link.pending).remove(&id);
                return Err(format!("{target}: the connection closed; {NOT_STARTED}"));
            }
            state.running.insert(request.trial_id.clone());
        }
        let outcome = match tokio::time::timeout(REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(None)) => Ok(()),
            // The agent refused: nothing was started, which the core is told (it tries again):
            // a trial placed here again as the host came back, while the agent still ended its
            // earlier attempt, was refused as "already running" and failed for good.
            Ok(Ok(Some(why))) => Err((
                if why.ends_with(NOT_STARTED) {
                    why
                } else {
                    format!("the agent refused it: {why}; {NOT_STARTED}")
                },
                true,
            )),
            Ok(Err(_)) => {
                // The connection closed before the reply: settled when the host is back.
                knob_plugin_api::log::debug(&format!(
                    "training service remote: {target}: the start of {} is unconfirmed (the connection closed); it is settled when the host is reached again",
                    request.trial_id
                ));
                let mut state = lock(&self.state);
                // Unless the host was declared lost meanwhile, which reported the trial ended.
                if state.running.contains(&request.trial_id) {
                    state.unconfirmed_starts.insert(
                        request.trial_id.clone(),
                        UnconfirmedStart {
                            request: remote,
                            fresh_code_copy,
                            kill_after: None,
                        },
                    );
                    // Back already: the new connection's resend missed it.
                    if let Some(new_link) = state.link.clone().filter(|l| !Arc::ptr_eq(l, &link)) {
                        Host::resend_unconfirmed_starts(&mut state, ctx, &new_link);
                    }
                }
                return Ok(());
            }
            Err(_) => Err((
                format!(
                    "{target}: the agent did not answer the start within {} s",
                    REPLY_TIMEOUT.as_secs()
                ),
                false,
            )),
        };
        match outcome {
            Ok(()) => Ok(()),
            Err((why, refused)) => {
                lock(&link.pending).remove(&id);
                let mut state = lock(&self.state);
                state.running.remove(&request.trial_id);
                if !refused {
                    // It may have started: its events are dropped and it is killed when the
                    // agent is reached again, because the caller is told it did not start.
                    state.disowned.insert(request.trial_id.clone());
                    state.kills_to_send.push((
                        request.trial_id.clone(),
                        "its start was not confirmed".to_string(),
                    ));
                }
                Err(why)
            }
        }
    }

    /// Uploads the code archive into the host's cache unless it is there, then copies the cache
    /// to `shared_copy` unless that is complete already (an earlier start of the experiment,
    /// before a resume, made it: its trials keep what they changed there).
    async fn ensure_code(
        &self,
        link: &Link,
        archive: &CodeArchive,
        shared_copy: Option<&Path>,
    ) -> Result<(), String> {
        let _one_upload_at_a_time = self.upload_lock.lock().await;
        if lock(&self.state).uploaded_code.contains(&archive.hash) {
            return Ok(());
        }
        let layout = HostLayout {
            root: link.paths.root.clone().into(),
        };
        let code_dir = layout
            .code_dir(&archive.hash)
            .to_string_lossy()
            .into_owned();
        let marker = format!("{code_dir}/{CODE_COMPLETE_MARKER}");
        let agent = ssh::shell_quote(&link.paths.agent);
        let mut command = format!(
            "if test -e {marker}; then echo present; else {agent} receive-code --dest {dest} && echo uploaded; fi",
            marker = ssh::shell_quote(&marker),
            dest = ssh::shell_quote(&code_dir),
        );
        if let Some(copy) = shared_copy {
            command = format!(
                "{{ {command}; }} && {agent} copy-code --from {from} --to {to}",
                from = ssh::shell_quote(&code_dir),
                to = ssh::shell_quote(&copy.to_string_lossy()),
            );
        }
        // The archive goes on stdin either way; `test` ignores it when the code is present.
        let output = link
            .ssh
            .run(&command, Some(&archive.bytes), UPLOAD_TIMEOUT)
            .await
            .map_err(|e| format!("uploading the trial code: {e}"))?;
        let said = output.stdout_text();
        // Whole lines: the agent's own lines name paths, which may hold either word.
        let said_line = |word: &str| said.lines().any(|line| line.trim() == word);
        let uploaded = said_line("uploaded");
        if output.status != Some(0) || !(uploaded || said_line("present")) {
            let copied = shared_copy
                .map(|copy| format!(" and copying it to {}", copy.display()))
                .unwrap_or_default();
            return Err(format!(
                "{}: uploading the trial code to {code_dir}{copied} failed: {}",
                self.machine.target(),
                output.failure_summary()
            ));
        }
        if uploaded {
            self.code_uploads.fetch_add(1, Ordering::Relaxed);
        }
        knob_plugin_api::log::debug(&format!(
            "training service remote: {}: code {} {}",
            self.machine.target(),
            archive.hash,
            if uploaded {
                "uploaded"
            } else {
                "already there"
            }
        ));
        lock(&self.state).uploaded_code.insert(archive.hash.clone());
        Ok(())
    }

    /// Asks the agent to kill a trial; queued until the host is reached again if it is down.
    pub async fn kill(&self, ctx: &Context, trial_id: &str, reason: &str) -> Result<(), String> {
        let link = {
            let mut state = lock(&self.state);
            if !state.running.contains(trial_id) {
                return Ok(());
            }
            if let Some(start) = state.unconfirmed_starts.get_mut(trial_id) {
                // Killing it before the agent has it could let a start sent again run it.
                start.kill_after = Some(reason.to_string());
                return Ok(());
            }
            match (&state.link, state.ready) {
                (Some(link), true) => link.clone(),
                _ => {
                    state
                        .kills_to_send
                        .push((trial_id.to_string(), reason.to_string()));
                    return Ok(());
                }
            }
        };
        let id = ctx.request_id();
        let (reply_tx, reply_rx) = oneshot::channel();
        lock(&link.pending).insert(id, reply_tx);
        let _ = link.outgoing.send(ToAgent::Kill {
            id,
            trial_id: trial_id.to_string(),
            reason: reason.to_string(),
        });
        match tokio::time::timeout(REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(None)) => Ok(()),
            Ok(Ok(Some(why))) => Err(why),
            Ok(Err(_)) | Err(_) => {
                lock(&link.pending).remove(&id);
                lock(&self.state)
                    .kills_to_send
                    .push((trial_id.to_string(), reason.to_string()));
                Ok(())
            }
        }
    }

    /// Tells the agent to kill every trial and exit, and waits (at most `limit`) for it to
    /// confirm, which it does after the trials' ends. The connection stays open until then:
    /// closed right after the request, it could lose it, and the daemon would run on until
    /// its orphan timeout. A host not connected now has nothing to confirm.
    pub async fn shut_down(&self, limit: Duration) -> ShutdownOutcome {
        let link = {
            let mut state = lock(&self.state);
            state.shutting_down = true;
            state.link.clone()
        };
        let Some(link) = link else {
            return ShutdownOutcome {
                unfinished: self.running_trials(),
                unconfirmed: None,
            };
        };
        let _ = link.outgoing.send(ToAgent::Shutdown);
        let deadline = Instant::now() + limit;
        loop {
            let changed = self.trial_ended.notified();
            let (confirmed, connected) = {
                let state = lock(&self.state);
                (
                    state.shutdown_confirmed,
                    state.ready && state.link.is_some(),
                )
            };
            let unconfirmed = if confirmed {
                None
            } else if !connected {
                // The confirmation comes before the agent closes the connection, so a closed
                // one without it was lost.
                Some("the connection closed before it confirmed".to_string())
            } else if Instant::now() >= deadline {
                Some(format!("no confirmation within {} s", limit.as_secs()))
            } else {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = tokio::time::timeout(left.min(Duration::from_millis(500)), changed).await;
                continue;
            };
            return ShutdownOutcome {
                unfinished: self.running_trials(),
                unconfirmed,
            };
        }
    }
}

enum Reconnect {
    Back(mpsc::UnboundedReceiver<Result<FromAgent, String>>),
    Stopped,
    GaveUp(Option<String>),
}

fn trial_of(event: &ServiceEvent) -> Option<&str> {
    match event {
        ServiceEvent::TrialStarted { trial_id, .. }
        | ServiceEvent::Metric { trial_id, .. }
        | ServiceEvent::TrialEnded { trial_id, .. }
        | ServiceEvent::TrialUsage { trial_id, .. }
        | ServiceEvent::CheckpointSaved { trial_id }
        | ServiceEvent::StartFailed { trial_id, .. }
        | ServiceEvent::PlaceAgain { trial_id, .. } => Some(trial_id),
        ServiceEvent::Warning { trial_id, .. } => trial_id.as_deref(),
        ServiceEvent::Environment { .. } => None,
    }
}

/// How long copying a parent's checkpoint folder for a successor may take.
const RESTORE_COPY_TIMEOUT: Duration = Duration::from_secs(600);

impl Host {
    /// Sends every unconfirmed start again on `link` (see [`UnconfirmedStart`]); the replies
    /// come to [`Host::settle_resent_start`].
    fn resend_unconfirmed_starts(state: &mut HostState, ctx: &Context, link: &Link) {
        state.resent_starts.clear();
        let starts: Vec<(String, TrialRequest, bool)> = state
            .unconfirmed_starts
            .iter()
            .map(|(trial, start)| (trial.clone(), start.request.clone(), start.fresh_code_copy))
            .collect();
        for (trial_id, request, fresh_code_copy) in starts {
            let id = ctx.request_id();
            state.resent_starts.insert(id, trial_id);
            let _ = link.outgoing.send(ToAgent::Start {
                id,
                request: Box::new(request),
                fresh_code_copy,
            });
        }
    }

    /// The agent answered a start sent again: it runs (or ran) the trial, and a kill asked
    /// for meanwhile goes now; or it refused, and nothing ran: the trial ended without
    /// starting.
    fn settle_resent_start(
        &self,
        ctx: &Context,
        link: &Link,
        trial_id: String,
        error: Option<String>,
    ) {
        let mut state = lock(&self.state);
        let Some(start) = state.unconfirmed_starts.remove(&trial_id) else {
            return;
        };
        match error {
            None => {
                if let Some(reason) = start.kill_after {
                    let _ = link.outgoing.send(ToAgent::Kill {
                        id: ctx.request_id(),
                        trial_id,
                        reason,
                    });
                }
            }
            Some(why) => {
                state.running.remove(&trial_id);
                drop(state);
                (ctx.emit)(ServiceEvent::TrialEnded {
                    trial_id,
                    exit_code: None,
                    signal: None,
                    killed_reason: start.kill_after,
                    stderr_tail: format!("{}: could not start: {why}", self.machine.target()),
                    ended_ms: None,
                    environment_lost: None,
                });
                self.trial_ended.notify_waiters();
            }
        }
    }

    fn ready_link(&self) -> Option<Arc<Link>> {
        let state = lock(&self.state);
        state.link.clone().filter(|_| state.ready)
    }

    /// The host's trial folder of `trial_id`, once connected.
    fn trial_dir(link: &Link, trial_id: &str) -> String {
        format!("{}/trials/{trial_id}", link.paths.environment_dir)
    }
}

/// How long the deletion of a checkpoint folder waits for its host to be connected.
const CHECKPOINT_DELETE_WAIT: Duration = Duration::from_secs(300);

/// Whether `id` is a plain trial id (letters, digits, `-`, `_`): one that is safe in a path.
fn plain_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The host's folder, for successor `trial_id`, holding the frozen copy of its donor's
/// checkpoint folder (`trial_python::restore_dir` names it in `KNOB_RESTORE_FROM`).
fn snapshot_dir(link: &Link, trial_id: &str) -> String {
    format!(
        "{}/{}",
        Host::trial_dir(link, trial_id),
        crate::trial_python::RESTORE_SNAPSHOT_FOLDER
    )
}

/// Trial `trial_id`'s own checkpoint folder on the host.
fn checkpoint_folder(link: &Link, trial_id: &str) -> String {
    format!(
        "{}/{}",
        Host::trial_dir(link, trial_id),
        crate::trial_python::CHECKPOINT_FOLDER
    )
}

impl Host {
    /// No living population member needs trial `trial_id`'s checkpoint folder any more
    /// (`TrainingService::delete_checkpoint`): it is deleted on this host, where it exists,
    /// once the host is connected (waiting up to [`CHECKPOINT_DELETE_WAIT`]), with the frozen
    /// copy of its donor's folder that a successor that never started left here
    /// ([`take_snapshot`]). A failure is logged: it costs disk, never the experiment.
    pub async fn delete_checkpoint(self: Arc<Self>, trial_id: String) {
        self.delete_folders(&trial_id, "checkpoint folder", |link| {
            vec![
                checkpoint_folder(link, &trial_id),
                snapshot_dir(link, &trial_id),
            ]
        })
        .await
    }

    /// Successor `trial_id` ended for good (`TrainingService::delete_snapshot`): the frozen copy
    /// of its donor's folder that its attempts started from ([`take_snapshot`],
    /// [`stage_restore`]) is deleted on this host, where it exists, as in
    /// [`Host::delete_checkpoint`]. Until then it stays across attempts: a retry starts from
    /// the same state as the first attempt, not from the donor's folder as it is by then.
    pub async fn delete_snapshot(self: Arc<Self>, trial_id: String) {
        self.delete_folders(&trial_id, "copy of its parent's checkpoint", |link| {
            vec![snapshot_dir(link, &trial_id)]
        })
        .await
    }

    /// `rm -rf` of `folders` (and of each one's `.partial`, a copy cut short) of trial
    /// `trial_id` on this host, once connected (waiting up to [`CHECKPOINT_DELETE_WAIT`]); a
    /// failure is logged.
    async fn delete_folders(
        &self,
        trial_id: &str,
        what: &str,
        folders: impl Fn(&Link) -> Vec<String>,
    ) {
        if !plain_id(trial_id) {
            return;
        }
        let deadline = Instant::now() + CHECKPOINT_DELETE_WAIT;
        let link = loop {
            if let Some(link) = self.ready_link() {
                break link;
            }
            if Instant::now() >= deadline {
                knob_plugin_api::log::debug(&format!(
                    "training service remote: the {what} of {trial_id} on {} is kept: the host was not connected",
                    self.machine.target()
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let folders = folders(&link);
        let quoted: Vec<String> = folders
            .iter()
            .flat_map(|f| {
                [
                    ssh::shell_quote(f),
                    ssh::shell_quote(&format!("{f}.partial")),
                ]
            })
            .collect();
        let command = format!("rm -rf {}", quoted.join(" "));
        let failure = match link.ssh.run(&command, None, REPLY_TIMEOUT).await {
            Ok(output) if output.status == Some(0) => return,
            Ok(output) => output.failure_summary(),
            Err(e) => e.to_string(),
        };
        knob_plugin_api::log::warn(&format!(
            "training service remote: cannot delete {} on {}: {failure}",
            folders.join(" "),
            self.machine.target()
        ));
    }
}

/// Successor `trial_id` was just created to start from trial `donor`'s checkpoint
/// (`TrainingService::snapshot_checkpoint`). The donor keeps training and overwriting its
/// folder, and the successor may wait (no free GPU, a busy host) before it starts, on a host
/// not known yet: so the donor's folder is copied now, on the first of `hosts` (the host that
/// runs or last ran the donor first) that has it, to the successor's `restore/` folder on that
/// host (written as `restore.partial`, then renamed). [`stage_restore`] starts the successor
/// from that copy wherever it runs. Returns the host holding the copy (`None`: no connected
/// host has the donor's folder).
pub async fn take_snapshot(
    hosts: Vec<Arc<Host>>,
    trial_id: String,
    donor: String,
) -> Result<Option<Arc<Host>>, String> {
    if !plain_id(&trial_id) || !plain_id(&donor) {
        return Ok(None);
    }
    let mut failures = Vec::new();
    for host in hosts {
        let Some(link) = host.ready_link() else {
            continue;
        };
        let dest = snapshot_dir(&link, &trial_id);
        let command = format!(
            "if [ -d {s} ]; then rm -rf {p} && mkdir -p {t} && cp -a {s} {p} && rm -rf {d} && mv {p} {d} && echo copied; fi",
            s = ssh::shell_quote(&checkpoint_folder(&link, &donor)),
            p = ssh::shell_quote(&format!("{dest}.partial")),
            t = ssh::shell_quote(&Host::trial_dir(&link, &trial_id)),
            d = ssh::shell_quote(&dest),
        );
        match link.ssh.run(&command, None, RESTORE_COPY_TIMEOUT).await {
            Ok(output) if output.stdout_text().contains("copied") => return Ok(Some(host)),
            Ok(output) if output.status == Some(0) => {}
            Ok(output) => failures.push(format!(
                "{}: {}",
                host.machine.target(),
                output.failure_summary()
            )),
            Err(e) => failures.push(format!("{}: {e}", host.machine.target())),
        }
    }
    if failures.is_empty() {
        Ok(None)
    } else {
        Err(format!(
            "copying the checkpoint of {donor} for {trial_id}: {}",
            failures.join("; ")
        ))
    }
}

/// Streams folder `source` on `from` into folder `dest` on `to` (emptied first) as a tar
/// stream through this machine, within [`RESTORE_COPY_TIMEOUT`].
async fn copy_between(from: &Link, source: &str, to: &Link, dest: &str) -> Result<(), String> {
    let copy = async {
        let reader = from
            .ssh
            .open_stream(&format!("tar -C {} -cf - .", ssh::shell_quote(source)))
            .await
            .map_err(|e| e.to_string())?;
        unpack_into(reader, to, dest).await
    };
    within_copy_limit(copy).await
}

/// Streams folder `source` on this machine into folder `dest` on `to` (emptied first) as a
/// tar stream (the local `tar`), within [`RESTORE_COPY_TIMEOUT`].
async fn upload_dir(source: &Path, to: &Link, dest: &str) -> Result<(), String> {
    let copy = async {
        let mut tar = tokio::process::Command::new("tar")
            .arg("-C")
            .arg(source)
            .args(["-cf", "-", "."])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run tar here: {e}"))?;
        let reader = tar.stdout.take().expect("piped stdout");
        unpack_into(reader, to, dest).await?;
        let output = tar.wait_with_output().await.map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "tar of {} here: {}",
                source.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    };
    within_copy_limit(copy).await
}

/// Streams folder `source` on `from` into folder `dest` on this machine (written as
/// `dest.partial`, then renamed), as a tar stream (the local `tar`), within
/// [`RESTORE_COPY_TIMEOUT`].
async fn download_dir(from: &Link, source: &str, dest: &Path) -> Result<(), String> {
    let partial = dest.with_extension("partial");
    let copy = async {
        use tokio::io::AsyncWriteExt;
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        let mut reader = from
            .ssh
            .open_stream(&format!("tar -C {} -cf - .", ssh::shell_quote(source)))
            .await
            .map_err(|e| e.to_string())?;
        let mut tar = tokio::process::Command::new("tar")
            .arg("-C")
            .arg(&partial)
            .args(["-xf", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run tar here: {e}"))?;
        let mut writer = tar.stdin.take().expect("piped stdin");
        tokio::io::copy(&mut reader, &mut writer)
            .await
            .map_err(|e| e.to_string())?;
        writer.shutdown().await.map_err(|e| e.to_string())?;
        drop(writer);
        let output = tar.wait_with_output().await.map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(format!(
                "tar into {} here: {}",
                partial.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        std::fs::rename(&partial, dest)
            .map_err(|e| format!("cannot rename {}: {e}", partial.display()))
    };
    let result = within_copy_limit(copy).await;
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    result
}

/// Successor `trial_id` is about to start under another training service (a hybrid
/// experiment) from the checkpoint of trial `donor`, which ran here
/// (`TrainingService::fetch_snapshot`): the frozen copy taken for it ([`take_snapshot`]; on
/// `hosts`, `snapshot`, the host that took it, first) is moved to `dest` on this machine, or,
/// without one, the donor's folder as it is now is copied there from the first of `hosts` that
/// has it. `Ok(false)`: no host has either. An error too when a host that may have it could not
/// be asked (not connected yet, as at a resume, or its probe failed): the core then waits and
/// asks again, rather than start the successor without its parent's checkpoint.
pub async fn fetch_restore(
    hosts: &[Arc<Host>],
    trial_id: &str,
    donor: &str,
    snapshot: Option<Arc<Host>>,
    dest: &Path,
) -> Result<bool, String> {
    if !plain_id(donor) || !plain_id(trial_id) {
        return Ok(false);
    }
    let mut order: Vec<&Arc<Host>> = hosts.iter().collect();
    if let Some(holder) = &snapshot {
        order.sort_by_key(|h| !Arc::ptr_eq(h, holder));
    }
    let frozen = |link: &Link| snapshot_dir(link, trial_id);
    let live = |link: &Link| checkpoint_folder(link, donor);
    // The hosts that could not be asked, and why (each named once).
    let mut not_asked: Vec<String> = Vec::new();
    let mut could_not_ask = |host: &Host, why: String| {
        let target = host.machine.target();
        if !not_asked.iter().any(|said| said.starts_with(&target)) {
            not_asked.push(format!("{target} {why}"));
        }
    };
    for (source_on, moved) in [(&frozen as &dyn Fn(&Link) -> String, true), (&live, false)] {
        for host in &order {
            let Some(link) = host.ready_link() else {
                could_not_ask(host, "is not connected".to_string());
                continue;
            };
            let source = source_on(&link);
            let probe = format!("test -d {}", ssh::shell_quote(&source));
            match link.ssh.run(&probe, None, REPLY_TIMEOUT).await {
                Ok(output) if output.status == Some(0) => {}
                // `test` answered: not there.
                Ok(output) if output.status == Some(1) => continue,
                Ok(output) => {
                    let why = output.failure_summary();
                    could_not_ask(host, format!("could not be asked ({why})"));
                    continue;
                }
                Err(e) => {
                    could_not_ask(host, format!("could not be asked ({e})"));
                    continue;
                }
            }
            download_dir(&link, &source, dest).await.map_err(|e| {
                format!(
                    "copying the checkpoint of {donor} from {} to this machine: {e}",
                    host.machine.target()
                )
            })?;
            if moved {
                // The copy lives on this machine now (the core deletes it when it is done).
                let remove = format!("rm -rf {}", ssh::shell_quote(&source));
                let _ = link.ssh.run(&remove, None, REPLY_TIMEOUT).await;
            }
            return Ok(true);
        }
    }
    if !not_asked.is_empty() {
        return Err(format!(
            "cannot tell whether the checkpoint of {donor} is on a host: {}",
            not_asked.join("; ")
        ));
    }
    Ok(false)
}

/// Writes the tar stream `reader` into folder `dest` on `to` (emptied first, then unpacked).
async fn unpack_into(
    mut reader: impl tokio::io::AsyncRead + Unpin,
    to: &Link,
    dest: &str,
) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut writer = to
        .ssh
        .open_stream(&format!(
            "rm -rf {d} && mkdir -p {d} && tar -C {d} -xf - && echo copied",
            d = ssh::shell_quote(dest)
        ))
        .await
        .map_err(|e| e.to_string())?;
    tokio::io::copy(&mut reader, &mut writer)
        .await
        .map_err(|e| e.to_string())?;
    writer.shutdown().await.map_err(|e| e.to_string())?;
    let mut answer = String::new();
    writer
        .read_to_string(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    if answer.contains("copied") {
        Ok(())
    } else {
        Err("tar on the target did not finish".to_string())
    }
}

/// `copy`, or an error once [`RESTORE_COPY_TIMEOUT`] has passed.
async fn within_copy_limit(
    copy: impl std::future::Future<Output = Result<(), String>>,
) -> Result<(), String> {
    match tokio::time::timeout(RESTORE_COPY_TIMEOUT, copy).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "not done within {} s",
            RESTORE_COPY_TIMEOUT.as_secs()
        )),
    }
}

/// A population member `trial_id` is about to start on `target` from the checkpoint of trial
/// `donor` (`KNOB_RESTORE_TRIAL`); its `restore/` folder on `target`, which the runner there
/// names in `KNOB_RESTORE_FROM` (`trial_python::restore_dir`), is made ready, from the first of:
/// - the frozen copy taken when the member was created ([`take_snapshot`]), on `target` (used as
///   it is: taken there, or left there by an earlier attempt) or on another of `hosts`
///   (`snapshot`, the host that took it, first; moved to `target`): the donor's state at the
///   exploitation;
/// - `here`, a folder on this machine: the copy the core made of the donor's folder when the
///   donor ran on this machine (another training service of the experiment: the local one, or
///   one whose trials write to this machine's file system), or, without one, the donor's folder
///   here; uploaded to `target`;
/// - the donor's folder as it is now, on `target` first, then on the other `hosts` (a service
///   that took no copy, or a copy that failed).
///
/// Between hosts a folder goes as a tar stream through this machine. The copy stays on `target`
/// when the member's attempt ends, so that a retry starts from the same state wherever it runs;
/// [`Host::delete_snapshot`] deletes it once the member ended for good. Nothing is copied when
/// no place has either; the runner then names the donor's folder on `target`, as without a copy.
pub async fn stage_restore(
    target: &Host,
    hosts: &[Arc<Host>],
    trial_id: &str,
    donor: &str,
    snapshot: Option<Arc<Host>>,
    here: Option<&Path>,
) -> Result<(), String> {
    if !plain_id(donor) || !plain_id(trial_id) {
        return Ok(());
    }
    let Some(link) = target.ready_link() else {
        return Err(format!("{} is not connected", target.machine.target()));
    };
    let dest = snapshot_dir(&link, trial_id);
    let failed = |what: &str, e: String| format!("copying the checkpoint of {donor}: {what}: {e}");
    let others: Vec<&Arc<Host>> = {
        let mut others: Vec<&Arc<Host>> = hosts
            .iter()
            .filter(|h| !std::ptr::eq(h.as_ref(), target))
            .collect();
        // The host that took the copy first.
        if let Some(holder) = &snapshot {
            others.sort_by_key(|h| !Arc::ptr_eq(h, holder));
        }
        others
    };
    // The frozen copy, here or elsewhere.
    let probe = format!("test -d {}", ssh::shell_quote(&dest));
    match link.ssh.run(&probe, None, REPLY_TIMEOUT).await {
        Ok(output) if output.status == Some(0) => return Ok(()),
        Ok(_) => {}
        Err(e) => return Err(failed(&target.machine.target(), e.to_string())),
    }
    let copied = copy_from_another(&others, |other| snapshot_dir(other, trial_id), &link, &dest)
        .await
        .map_err(|(from, e)| failed(&format!("{from} to {}", target.machine.target()), e))?;
    if let Some((other_link, source)) = copied {
        // Moved: the copy lives with the member now (and stays for its next attempt there).
        let remove = format!("rm -rf {}", ssh::shell_quote(&source));
        let _ = other_link.ssh.run(&remove, None, REPLY_TIMEOUT).await;
        return Ok(());
    }
    // The core's copy, or the donor's folder, on this machine.
    if let Some(here) = here.filter(|h| h.is_dir()) {
        let partial = format!("{dest}.partial");
        upload_dir(here, &link, &partial)
            .await
            .map_err(|e| failed(&format!("this machine to {}", target.machine.target()), e))?;
        // Renamed once complete: a cut upload is never taken for the copy by a retry.
        let rename = format!(
            "mv {} {}",
            ssh::shell_quote(&partial),
            ssh::shell_quote(&dest)
        );
        let output = link
            .ssh
            .run(&rename, None, REPLY_TIMEOUT)
            .await
            .map_err(|e| failed(&target.machine.target(), e.to_string()))?;
        if output.status != Some(0) {
            return Err(failed(&target.machine.target(), output.failure_summary()));
        }
        return Ok(());
    }
    // No frozen copy: the donor's folder as it is now; on the target itself, a plain copy.
    let source = checkpoint_folder(&link, donor);
    let command = format!(
        "if [ -d {s} ]; then rm -rf {d} && mkdir -p {d} && cp -a {s}/. {d}/ && echo copied; fi",
        s = ssh::shell_quote(&source),
        d = ssh::shell_quote(&dest)
    );
    let output = link
        .ssh
        .run(&command, None, RESTORE_COPY_TIMEOUT)
        .await
        .map_err(|e| failed(&target.machine.target(), e.to_string()))?;
    if output.status != Some(0) {
        return Err(failed(&target.machine.target(), output.failure_summary()));
    }
    if output.stdout_text().contains("copied") {
        return Ok(());
    }
    copy_from_another(
        &others,
        |other| checkpoint_folder(other, donor),
        &link,
        &dest,
    )
    .await
    .map_err(|(from, e)| failed(&format!("{from} to {}", target.machine.target()), e))?;
    Ok(())
}

/// Copies the folder `source_on` names on the first of `others` (connected) that has it to
/// `dest` on `to`; `None` when none has it. Gives the link it came from and its path there, or,
/// when the copy failed, that host's name and why.
async fn copy_from_another(
    others: &[&Arc<Host>],
    source_on: impl Fn(&Link) -> String,
    to: &Link,
    dest: &str,
) -> Result<Option<(Arc<Link>, String)>, (String, String)> {
    for other in others {
        let Some(other_link) = other.ready_link() else {
            continue;
        };
        let source = source_on(&other_link);
        let probe = format!("test -d {}", ssh::shell_quote(&source));
        match other_link.ssh.run(&probe, None, REPLY_TIMEOUT).await {
            Ok(output) if output.status == Some(0) => {}
            _ => continue,
        }
        copy_between(&other_link, &source, to, dest)
            .await
            .map_err(|e| (other.machine.target(), e))?;
        return Ok(Some((other_link, source)));
    }
    Ok(None)
}
