//! `knob-agent serve --dir D`: the long-lived daemon of one experiment's environment on a host.
//!
//! One task owns all the state (the event log, the current client, the probe) and reacts to
//! inputs: a new connection, a message or the loss of a client, an event from a trial, the end
//! of blocking work (a start, a probe, killing trials), and deadlines (heartbeat, orphan
//! timeout, the next probe). Blocking work runs on tokio's blocking pool and reports back.
//!
//! Architecture invariant: every `ServiceEvent` gets the next `seq` and enters the log before
//! it is sent; a client that has been welcomed gets the log's events after its `last_seq` and
//! then every new one, in order, each exactly once per connection.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use knob_gpu_sched::probe::{process_group_of, LocalProbe};
use knob_gpu_sched::{EnvironmentLimits, SchedulerConfig};
use knob_plugin_api::service::{ServiceEvent, TrialRequest};
use serde_json::Value;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixListener;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::event_log::EventLog;
use super::{
    socket_path, AgentError, AGENT_VERSION, INVENTORY_INTERVAL, LOCK_FILE_NAME, SOCKET_FILE_NAME,
};
use crate::accept_pause::AcceptPause;
use crate::agent_protocol::{
    read_frame_async, write_frame_async, FrameError, FromAgent, ToAgent, HEARTBEAT_TIMEOUT,
    PROTOCOL_VERSION,
};
use crate::lease::MachineLeases;
use crate::metrics::Emit;
use crate::trial_pool::{PoolError, TrialPool};

/// How the daemon behaves; the defaults are the protocol's, tests shorten them.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub dir: PathBuf,
    /// No client for this long: kill every trial and exit.
    pub orphan_timeout: Duration,
    /// A client silent for this long is dropped (its trials keep running).
    pub heartbeat_timeout: Duration,
    /// SIGTERM to SIGKILL for a killed trial.
    pub grace_period: Duration,
    /// Started by `attach` for the connection it bridges: if that connection (or any before a
    /// hello) closes before a hello, the manager gave up on it (a hello timed out, the
    /// experiment was not kept) and nothing would ever come back for this daemon, which exits
    /// instead of waiting out the orphan timeout. Not for a Slurm job's daemon, which waits
    /// for its manager.
    pub exit_without_hello: bool,
}

impl ServeOptions {
    pub fn new(dir: PathBuf) -> ServeOptions {
        ServeOptions {
            dir,
            orphan_timeout: super::DEFAULT_ORPHAN_TIMEOUT,
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            grace_period: Duration::from_secs(5),
            exit_without_hello: false,
        }
    }
}

macro_rules! say {
    ($($arg:tt)*) => {
        eprintln!("knob-agent[{}] {}", std::process::id(), format_args!($($arg)*))
    };
}

/// Runs the daemon until it is told to shut down or its manager is gone.
pub fn serve(options: ServeOptions) -> Result<(), AgentError> {
    let dir = &std::path::absolute(&options.dir)
        .map_err(AgentError::io("cannot resolve", &options.dir))?;
    std::fs::create_dir_all(dir).map_err(AgentError::io("cannot create", dir))?;
    // The socket is bound by a relative name from inside the directory: a Unix socket path
    // is limited to 107 bytes, which a deep home directory would exceed.
    std::env::set_current_dir(dir).map_err(AgentError::io("cannot enter", dir))?;
    let lock_path = dir.join(LOCK_FILE_NAME);
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(AgentError::io("cannot open", &lock_path))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(AgentError::AlreadyServing { dir: dir.clone() })
        }
        Err(std::fs::TryLockError::Error(source)) => {
            return Err(AgentError::Io {
                what: "cannot lock",
                path: lock_path,
                source,
            })
        }
    }
    let _ = std::fs::write(&lock_path, format!("{}\n", std::process::id()));

    let (event_sender, events) = unbounded_channel();
    let emit: Emit = Arc::new(move |event: ServiceEvent| {
        let _ = event_sender.send(event);
    });
    let mut pool = TrialPool::new("knob-agent", options.grace_period, emit)?;
    // In a Slurm job the GPUs are the job's own (Slurm keeps jobs apart), and their indices
    // are the job's: another job's agent on the node must not read them as the same GPUs.
    if std::env::var_os("SLURM_JOB_ID").is_none() {
        match MachineLeases::open_default() {
            Ok(Some(leases)) => pool.use_leases(leases),
            Ok(None) => {}
            Err(e) => say!(
                "trials run without leases, other experiments on this host do not see them: {e}"
            ),
        }
    }
    let pool = Arc::new(pool);
    let socket = socket_path(dir);
    // The lock is ours, so a socket file left here belongs to a daemon that is gone.
    let _ = std::fs::remove_file(&socket);
    let listener = {
        let _runtime = pool.runtime().enter();
        UnixListener::bind(SOCKET_FILE_NAME).map_err(AgentError::io("cannot listen on", &socket))?
    };
    // Whoever can connect can start trials as this user: the socket is the user's alone, whatever
    // the umask and the modes of the folders above it (a group-shared folder on the cluster's
    // filesystem). `accept` checks the peer's uid too, for the moment before this.
    std::fs::set_permissions(SOCKET_FILE_NAME, std::fs::Permissions::from_mode(0o600))
        .map_err(AgentError::io("cannot make private", &socket))?;
    say!(
        "serving {} (protocol {PROTOCOL_VERSION}, orphan timeout {} s)",
        socket.display(),
        options.orphan_timeout.as_secs()
    );
    let runtime = pool.runtime().clone();
    let (inputs_sender, inputs) = unbounded_channel();
    let daemon = Daemon {
        options: options.clone(),
        pool: pool.clone(),
        log: EventLog::default(),
        client: None,
        next_client_id: 1,
        uid: nix::unistd::geteuid().as_raw(),
        environment_id: None,
        experiment_id: None,
        stand_in_line: None,
        leave_line_after_probe: false,
        probe: Arc::new(Mutex::new(None)),
        probing: false,
        ledger_problem: None,
        inputs_sender,
        no_client_since: Some(Instant::now()),
        next_probe_at: None,
        stopping: false,
        starts: HashMap::new(),
        manager: None,
        replaced_heard: None,
        hello_seen: false,
    };
    runtime.block_on(daemon.run(listener, inputs, events));
    let _ = std::fs::remove_file(dir.join(SOCKET_FILE_NAME));
    drop(pool);
    drop(lock);
    say!("exited");
    Ok(())
}

/// What the daemon's task reacts to, besides connections and trial events.
enum Input {
    Message(u64, ToAgent),
    Gone(u64, String),
    /// A hello's blocking part is done (leftover trials killed for a fresh start, host probed).
    HelloReady {
        client: u64,
        last_seq: u64,
        fresh_start: bool,
        inventory: Result<Probed, String>,
    },
    /// A start's blocking part is done: `error` is why nothing runs.
    Started {
        id: u64,
        trial_dir: PathBuf,
        error: Option<String>,
    },
    Probed(Result<Probed, String>),
    /// Every trial was killed for a shutdown.
    ShutdownDone,
}

struct Client {
    id: u64,
    outgoing: UnboundedSender<FromAgent>,
    reader: JoinHandle<()>,
    /// Runs until the sender is dropped and the queue is written out.
    writer: Option<JoinHandle<()>>,
    /// Welcomed: events stream to it.
    welcomed: bool,
    /// A hello is being answered.
    greeting: bool,
    /// Messages that came after the hello but before the welcome, handled after it.
    held: Vec<ToAgent>,
    last_heard: Instant,
}

impl Client {
    fn send(&self, message: FromAgent) {
        let _ = self.outgoing.send(message);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // The writer ends once the sender is gone (after what was queued), which closes the
        // write half; the reader is stopped here, which closes the read half.
        self.reader.abort();
    }
}

/// Removes what `dir` (an environment's folder) holds but the daemon's own files (its lock,
/// socket and log): the code copy and trial folders of an earlier experiment of the same id,
/// which a new one must not start from. Returns how many entries were removed.
fn remove_earlier_experiment(dir: &std::path::Path) -> std::io::Result<usize> {
    let own = [LOCK_FILE_NAME, SOCKET_FILE_NAME, super::LOG_FILE_NAME];
    let mut removed = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if own.iter().any(|name| entry.file_name() == *name) {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
        removed += 1;
    }
    Ok(removed)
}

/// A manager token (`<host>:<pid>:<ms>`) for a message: "pid P on H".
fn manager_label(token: &str) -> String {
    let mut parts = token.split(':');
    match (parts.next(), parts.next()) {
        (Some(host), Some(pid)) => format!("pid {pid} on {host}"),
        _ => token.to_string(),
    }
}

/// The trial ids with a folder in `trials` (`<dir>/trials/<id>/`).
fn trials_under(trials: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(trials) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect()
}

struct Daemon {
    options: ServeOptions,
    pool: Arc<TrialPool>,
    log: EventLog,
    client: Option<Client>,
    next_client_id: u64,
    /// The user this daemon runs as: the only one whose connections it takes.
    uid: u32,
    environment_id: Option<String>,
    /// The experiment of the last hello: the holder of this daemon's leases.
    experiment_id: Option<String>,
    /// The service asked to stand in the ledger's line ([`ToAgent::StandInLine`], with what the
    /// waiting trial asks for and the host's limits): the next probe does.
    stand_in_line: Option<(SchedulerConfig, Option<EnvironmentLimits>)>,
    /// The service said that nothing waits ([`ToAgent::LeaveLine`]) while a probe ran, which
    /// may stand in line again as it ends: the line is left once it has.
    leave_line_after_probe: bool,
    probe: Arc<Mutex<Option<LocalProbe>>>,
    probing: bool,
    /// The warning last given about a lease ledger that cannot be read, so that each probe
    /// does not repeat it; `None` once it is read again.
    ledger_problem: Option<String>,
    inputs_sender: UnboundedSender<Input>,
    no_client_since: Option<Instant>,
    next_probe_at: Option<Instant>,
    /// Every trial is being killed; the daemon exits once they have ended.
    stopping: bool,
    /// The attempts started since the last fresh start, by trial folder (one per attempt):
    /// a start sent again, because its reply was lost with the connection, is answered
    /// without running the attempt twice.
    starts: HashMap<PathBuf, StartState>,
    /// The manager of the last client welcomed (`ToAgent::Hello::manager`).
    manager: Option<String>,
    /// When the welcomed client that the latest connection replaced was last heard from.
    replaced_heard: Option<Instant>,
    /// A hello has come (see [`ServeOptions::exit_without_hello`]).
    hello_seen: bool,
}

enum StartState {
    /// Being started; these request ids get its reply too.
    Starting(Vec<u64>),
    Started,
}

enum Step {
    Continue,
    Exit,
}

impl Daemon {
    async fn run(
        mut self,
        listener: UnixListener,
        mut inputs: UnboundedReceiver<Input>,
        mut events: UnboundedReceiver<ServiceEvent>,
    ) {
        use tokio::signal::unix::{signal, SignalKind};
        // Stopped by the host (an admin, a reboot): trials must not outlive the daemon.
        let mut terminate = signal(SignalKind::terminate()).ok();
        let mut interrupt = signal(SignalKind::interrupt()).ok();
        let mut accept_pause = AcceptPause::new();
        // Set while accepts fail: no accept until then.
        let mut accept_again_at: Option<Instant> = None;
        loop {
            let deadline = self.next_deadline();
            let step = tokio::select! {
                Some(()) = recv_signal(&mut terminate), if !self.stopping => {
                    self.stop_on_signal("SIGTERM")
                }
                Some(()) = recv_signal(&mut interrupt), if !self.stopping => {
                    self.stop_on_signal("SIGINT")
                }
                accepted = listener.accept(), if accept_again_at.is_none() => {
                    match accepted {
                        Ok((stream, _)) => {
                            let failed = accept_pause.succeeded();
                            if failed > 0 {
                                say!("accepting connections again after {failed} failed accepts");
                            }
                            match stream.peer_cred().map(|peer| peer.uid()) {
                                Ok(uid) if uid == self.uid => {
                                    let (read, write) = stream.into_split();
                                    self.connect(read, write);
                                }
                                // Another user's connection would replace the manager's and be
                                // welcomed with the trials' events: refused before a word is read.
                                Ok(uid) => say!(
                                    "refused a connection from uid {uid}: only uid {}, which runs this agent, may connect",
                                    self.uid
                                ),
                                Err(e) => say!("refused a connection whose user cannot be read: {e}"),
                            }
                        }
                        // Out of file descriptors, say: see `AcceptPause`.
                        Err(e) => {
                            accept_again_at = Some(Instant::now() + accept_pause.failed());
                            if accept_pause.first_failure() {
                                say!(
                                    "accept failed: {e}; trying again every {} ms at most until it works",
                                    AcceptPause::LONGEST.as_millis()
                                );
                            }
                        }
                    }
                    Step::Continue
                }
                _ = tokio::time::sleep_until(accept_again_at.unwrap_or(deadline)), if accept_again_at.is_some() => {
                    accept_again_at = None;
                    Step::Continue
                }
                Some(input) = inputs.recv() => self.on_input(input, &mut events).await,
                Some(event) = events.recv() => {
                    self.on_event(event);
                    Step::Continue
                }
                _ = tokio::time::sleep_until(deadline) => self.on_deadline(),
            };
            if let Step::Exit = step {
                return;
            }
        }
    }

    /// Kills every trial (their ends go to the client, if one is connected), then exits.
    fn stop_on_signal(&mut self, name: &str) -> Step {
        say!("{name} received: killing every trial");
        self.stop_all(format!("knob-agent on this host was stopped ({name})"));
        Step::Continue
    }

    /// Kills every trial off the task; `Input::ShutdownDone` follows, and the daemon exits.
    fn stop_all(&mut self, reason: String) {
        if std::mem::replace(&mut self.stopping, true) {
            return;
        }
        let pool = self.pool.clone();
        let inputs = self.inputs_sender.clone();
        tokio::task::spawn_blocking(move || {
            let left = pool.stop(&reason);
            if !left.is_empty() {
                say!("trials not seen to end: {left:?}");
            }
            let _ = inputs.send(Input::ShutdownDone);
        });
    }

    fn next_deadline(&self) -> Instant {
        let mut deadline = Instant::now() + Duration::from_secs(3600);
        if let Some(since) = self.no_client_since.filter(|_| !self.stopping) {
            deadline = deadline.min(since + self.options.orphan_timeout);
        }
        if let Some(client) = self.client.as_ref().filter(|c| self.expects_pings(c)) {
            deadline = deadline.min(client.last_heard + self.options.heartbeat_timeout);
        }
        if let Some(at) = self.next_probe_at {
            deadline = deadline.min(at);
        }
        deadline
    }

    /// Whether the client's silence means it is gone: not while it waits for the daemon (its
    /// hello being answered, or the trials' ends after a shutdown).
    fn expects_pings(&self, client: &Client) -> bool {
        !self.stopping && !client.greeting
    }

    fn connect(&mut self, read: OwnedReadHalf, write: OwnedWriteHalf) {
        let id = self.next_client_id;
        self.next_client_id += 1;
        if let Some(old) = self.client.take() {
            say!("client {} replaced by client {id}", old.id);
            self.replaced_heard = old.welcomed.then_some(old.last_heard);
        } else {
            say!("client {id} connected");
        }
        let (outgoing, queued) = unbounded_channel();
        let reader = tokio::spawn(read_client(id, read, self.inputs_sender.clone()));
        let writer = tokio::spawn(write_client(write, queued));
        self.client = Some(Client {
            id,
            outgoing,
            reader,
            writer: Some(writer),
            welcomed: false,
            greeting: false,
            held: Vec::new(),
            last_heard: Instant::now(),
        });
        self.no_client_since = None;
    }

    fn drop_client(&mut self, why: &str) {
        if let Some(client) = self.client.take() {
            say!("client {} dropped: {why}", client.id);
            self.no_client_since = Some(Instant::now());
            if self.options.exit_without_hello && !self.hello_seen {
                // No hello, so no trial: nothing is lost.
                say!("no hello came before the client left: no manager wants this daemon; exiting");
                self.stop_all("knob-agent: no hello came".to_string());
            }
        }
    }

    fn current(&mut self, id: u64) -> Option<&mut Client> {
        self.client.as_mut().filter(|c| c.id == id)
    }

    async fn on_input(
        &mut self,
        input: Input,
        events: &mut UnboundedReceiver<ServiceEvent>,
    ) -> Step {
        match input {
            Input::Message(id, message) => {
                let Some(client) = self.current(id) else {
                    return Step::Continue;
                };
                client.last_heard = Instant::now();
                if client.welcomed {
                    return self.on_message(message);
                }
                match message {
                    ToAgent::Hello { .. } if !client.greeting => self.on_hello(id, message),
                    ToAgent::Ping { nonce } => client.send(FromAgent::Pong { nonce }),
                    other if client.greeting => client.held.push(other),
                    _ => {
                        client.send(FromAgent::Refused {
                            message: "the first message must be a hello".to_string(),
                        });
                        self.drop_client("its first message was not a hello");
                    }
                }
            }
            Input::Gone(id, why) => {
                if self.current(id).is_some() {
                    self.drop_client(&why);
                }
            }
            Input::HelloReady {
                client,
                last_seq,
                fresh_start,
                inventory,
            } => return self.welcome(client, last_seq, fresh_start, inventory, events),
            Input::Started {
                id,
                trial_dir,
                error,
            } => {
                let waiting = match self.starts.remove(&trial_dir) {
                    Some(StartState::Starting(ids)) => ids,
                    _ => Vec::new(),
                };
                // A refused start ran nothing: the same attempt may be asked for again.
                if error.is_none() {
                    self.starts.insert(trial_dir, StartState::Started);
                }
                if let Some(client) = &self.client {
                    for id in std::iter::once(id).chain(waiting) {
                        client.send(FromAgent::Reply {
                            id,
                            error: error.clone(),
                        });
                    }
                }
            }
            Input::Probed(inventory) => {
                self.probing = false;
                if std::mem::take(&mut self.leave_line_after_probe) {
                    self.leave_line();
                }
                if self.stand_in_line.is_some() {
                    // Asked while that probe ran: the next one stands in line.
                    self.next_probe_at = Some(Instant::now());
                }
                match inventory {
                    Ok(probed) => {
                        if let Some(client) = self.client.as_ref().filter(|c| c.welcomed) {
                            client.send(FromAgent::Inventory {
                                inventory: probed.inventory,
                            });
                        }
                        self.note_ledger_problem(probed.ledger_problem);
                    }
                    Err(why) => say!("probing the host failed: {why}"),
                }
            }
            Input::ShutdownDone => {
                while let Ok(event) = events.try_recv() {
                    self.on_event(event);
                }
                if let Some(mut client) = self.client.take() {
                    // The confirmation the service waits for before it closes the connection
                    // (a client still in its hello expects a welcome first: it gets the close).
                    if client.welcomed {
                        client.send(FromAgent::ShutDown);
                    }
                    let writer = client.writer.take();
                    // Dropping the client drops its sender: the writer writes what is queued
                    // (the trials' ends), closes the connection and ends.
                    drop(client);
                    if let Some(writer) = writer {
                        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
                    }
                }
                say!("every trial stopped; exiting");
                return Step::Exit;
            }
        }
        Step::Continue
    }

    /// Starts answering a hello: the version check now, the rest (killing leftovers for a fresh
    /// start, probing the host) off the task.
    fn on_hello(&mut self, id: u64, hello: ToAgent) {
        self.hello_seen = true;
        let ToAgent::Hello {
            protocol,
            experiment_id,
            environment_id,
            last_seq,
            fresh_start,
            new_experiment,
            manager,
        } = hello
        else {
            return;
        };
        if protocol != PROTOCOL_VERSION {
            if let Some(client) = self.current(id) {
                client.send(FromAgent::Refused {
                    message: format!(
                        "knob-agent {AGENT_VERSION} on this host speaks agent protocol {PROTOCOL_VERSION}, the service speaks {protocol}; upload the knob-agent built with this knob"
                    ),
                });
            }
            self.drop_client("protocol version mismatch");
            return;
        }
        say!(
            "hello from client {id}: experiment {experiment_id}, environment {environment_id}, last seq {last_seq}{}",
            if fresh_start { ", fresh start" } else { "" }
        );
        // Another manager while the one served was heard from moments ago: two experiments of
        // one id share this folder. Refused, so that neither takes the other's connection nor
        // (a fresh start) kills its trials; the one served reconnects.
        let other = self
            .manager
            .as_deref()
            .filter(|served| !served.is_empty() && !manager.is_empty() && *served != manager);
        let recently = self
            .replaced_heard
            .is_some_and(|heard| heard.elapsed() < self.options.heartbeat_timeout);
        if let (Some(served), true) = (other, recently) {
            let message = format!(
                "the agent in {} serves experiment {experiment_id} for another knob ({}), connected moments ago; two experiments of one id cannot share an agentRoot on a host: give this one another id (or agentRoot), or wait {} s if that knob is gone",
                self.options.dir.display(),
                manager_label(served),
                self.options.heartbeat_timeout.as_secs()
            );
            if let Some(client) = self.current(id) {
                client.send(FromAgent::Refused { message });
            }
            self.drop_client("another manager's hello");
            return;
        }
        self.manager = Some(manager);
        self.replaced_heard = None;
        if let Some(client) = self.current(id) {
            client.greeting = true;
        }
        let probe_again = self.environment_id.as_deref() != Some(environment_id.as_str());
        // This daemon's first hello: a daemon before it here that died (killed, by the OOM
        // killer say) left its trials running without it, on their GPUs, writing into the
        // folders their next attempts use. They are this experiment's processes of the trials
        // under this daemon's folder, and none of them can be this daemon's yet.
        let leftovers = self.experiment_id.is_none().then(|| {
            (
                experiment_id.clone(),
                trials_under(&self.options.dir.join("trials")),
            )
        });
        self.environment_id = Some(environment_id.clone());
        self.experiment_id = Some(experiment_id);
        let pool = self.pool.clone();
        let probe = self.probe.clone();
        let inputs = self.inputs_sender.clone();
        let dir = self.options.dir.clone();
        tokio::task::spawn_blocking(move || {
            if let Some((experiment_id, trials)) = leftovers.filter(|(_, t)| !t.is_empty()) {
                let killed = crate::process::kill_leftovers(&experiment_id, &trials);
                for (trial, count) in trials.iter().zip(killed).filter(|(_, n)| *n > 0) {
                    say!("killed {count} process(es) of trial {trial} left by an agent before this one");
                }
            }
            if fresh_start {
                let left = pool.kill_all_and_wait(
                    "a new manager started the experiment's service again; trials of the previous one are stopped",
                );
                if !left.is_empty() {
                    say!("trials not seen to end after a fresh-start kill: {left:?}");
                }
                if new_experiment {
                    match remove_earlier_experiment(&dir) {
                        Ok(0) => {}
                        Ok(removed) => say!(
                            "removed {removed} entries an earlier experiment of this id left in {} (a new experiment)",
                            dir.display()
                        ),
                        Err(e) => say!("cannot remove what an earlier experiment left: {e}"),
                    }
                }
            }
            if probe_again {
                *probe.lock().unwrap_or_else(|p| p.into_inner()) = None;
            }
            let inventory = probe_host(&probe, &environment_id, &pool, None);
            let _ = inputs.send(Input::HelloReady {
                client: id,
                last_seq,
                fresh_start,
                inventory,
            });
        });
    }

    fn welcome(
        &mut self,
        id: u64,
        last_seq: u64,
        fresh_start: bool,
        inventory: Result<Probed, String>,
        events: &mut UnboundedReceiver<ServiceEvent>,
    ) -> Step {
        // Everything the trials reported so far is in the log before the replay is cut.
        while let Ok(event) = events.try_recv() {
            self.on_event(event);
        }
        if fresh_start {
            self.log.clear();
            self.starts.clear();
        }
        let Probed {
            inventory,
            ledger_problem,
        } = match inventory {
            Ok(probed) => probed,
            Err(why) => {
                if let Some(client) = self.current(id) {
                    client.send(FromAgent::Refused {
                        message: format!("knob-agent cannot describe this host: {why}"),
                    });
                }
                self.drop_client("the host could not be probed");
                return Step::Continue;
            }
        };
        let dropped = self.log.take_dropped();
        if dropped > 0 {
            self.log.push(ServiceEvent::Warning {
                trial_id: None,
                message: format!(
                    "knob-agent dropped {dropped} events it held for the service while it was away (at most {} are kept): intermediate results and warnings, the oldest first, and a trial's start, final result or end only if nothing else was left",
                    super::event_log::MAX_BUFFERED_EVENTS
                ),
            });
        }
        let replay = self
            .log
            .resume_after(if fresh_start { 0 } else { last_seq });
        let running: Vec<String> = self.pool.running().into_iter().map(|(id, _)| id).collect();
        let hostname = hostname();
        let Some(client) = self.current(id) else {
            return Step::Continue;
        };
        client.send(FromAgent::Welcome {
            protocol: PROTOCOL_VERSION,
            agent_version: AGENT_VERSION.to_string(),
            hostname,
            pid: std::process::id(),
            inventory,
            running,
            time_ms: Some(crate::agent_protocol::unix_ms()),
        });
        say!("client {id} welcomed; replaying {} events", replay.len());
        for (seq, time_ms, event) in replay {
            client.send(FromAgent::Event {
                seq,
                event,
                time_ms: Some(time_ms),
            });
        }
        client.welcomed = true;
        client.greeting = false;
        let held = std::mem::take(&mut client.held);
        // Said to each new client: the one before may have been another experiment's.
        self.ledger_problem = None;
        self.note_ledger_problem(ledger_problem);
        self.schedule_probe();
        for message in held {
            if let Step::Exit = self.on_message(message) {
                return Step::Exit;
            }
        }
        Step::Continue
    }

    /// A message from the welcomed client.
    fn on_message(&mut self, message: ToAgent) -> Step {
        let Some(client) = &self.client else {
            return Step::Continue;
        };
        match message {
            ToAgent::Hello { .. } => {
                client.send(FromAgent::Refused {
                    message: "a second hello on the same connection; reconnect instead".to_string(),
                });
                self.drop_client("a second hello");
            }
            ToAgent::Ping { nonce } => client.send(FromAgent::Pong { nonce }),
            ToAgent::Ack { seq } => self.log.ack(seq),
            ToAgent::StandInLine { demand, limits } => {
                // A service that does not say what its trial asks for: one GPU, as before.
                let demand = demand.unwrap_or(SchedulerConfig {
                    trial_gpu_number: Some(1),
                    ..SchedulerConfig::default()
                });
                self.stand_in_line = Some((demand, limits));
                self.leave_line_after_probe = false;
                self.next_probe_at = Some(Instant::now());
            }
            ToAgent::LeaveLine => {
                self.stand_in_line = None;
                if self.probing {
                    self.leave_line_after_probe = true;
                } else {
                    self.leave_line();
                }
            }
            ToAgent::Start {
                id,
                request,
                fresh_code_copy,
            } => {
                let trial_dir = request.trial_dir.clone();
                match self.starts.get_mut(&trial_dir) {
                    Some(StartState::Started) => {
                        client.send(FromAgent::Reply { id, error: None });
                        return Step::Continue;
                    }
                    Some(StartState::Starting(ids)) => {
                        ids.push(id);
                        return Step::Continue;
                    }
                    None => {
                        self.starts
                            .insert(trial_dir.clone(), StartState::Starting(Vec::new()));
                    }
                }
                let pool = self.pool.clone();
                let inputs = self.inputs_sender.clone();
                tokio::task::spawn_blocking(move || {
                    let error = start(&pool, *request, fresh_code_copy).err();
                    let _ = inputs.send(Input::Started {
                        id,
                        trial_dir,
                        error,
                    });
                });
                self.schedule_probe();
            }
            ToAgent::Kill {
                id,
                trial_id,
                reason,
            } => {
                let error = (!self.pool.kill(&trial_id, &reason)).then(|| {
                    format!("trial {trial_id} is not running on this host (it may have just ended)")
                });
                client.send(FromAgent::Reply { id, error });
            }
            ToAgent::Shutdown => {
                say!("shutdown requested: killing every trial");
                self.stop_all("experiment stopped".to_string());
            }
        }
        Step::Continue
    }

    /// Tells the service once about a lease ledger this host's probe could not read.
    fn note_ledger_problem(&mut self, problem: Option<String>) {
        if problem.is_some() && problem != self.ledger_problem {
            self.on_event(ServiceEvent::Warning {
                trial_id: None,
                message: problem.clone().unwrap_or_default(),
            });
        }
        self.ledger_problem = problem;
    }

    fn on_event(&mut self, event: ServiceEvent) {
        let ended = matches!(event, ServiceEvent::TrialEnded { .. });
        let time_ms = crate::agent_protocol::unix_ms();
        let seq = self.log.push_at(event.clone(), time_ms);
        if let Some(client) = self.client.as_ref().filter(|c| c.welcomed) {
            client.send(FromAgent::Event {
                seq,
                event,
                time_ms: Some(time_ms),
            });
        }
        if ended {
            // The host changed (a GPU was freed): the service hears of it at once.
            self.next_probe_at = Some(Instant::now());
        }
    }

    fn on_deadline(&mut self) -> Step {
        let now = Instant::now();
        if let Some(since) = self.no_client_since.filter(|_| !self.stopping) {
            if now >= since + self.options.orphan_timeout {
                let secs = self.options.orphan_timeout.as_secs();
                say!("no service connected for {secs} s: the manager is gone; killing every trial");
                self.stop_all(format!("knob-agent: no manager connected for {secs} s"));
            }
        }
        if let Some(client) = self.client.as_ref().filter(|c| self.expects_pings(c)) {
            if now >= client.last_heard + self.options.heartbeat_timeout {
                let secs = self.options.heartbeat_timeout.as_secs();
                self.drop_client(&format!("silent for {secs} s"));
            }
        }
        if self.next_probe_at.is_some_and(|at| now >= at) {
            self.next_probe_at = None;
            self.probe_now();
        }
        Step::Continue
    }

    /// Probes again within [`INVENTORY_INTERVAL`] (sooner if already due).
    fn schedule_probe(&mut self) {
        let at = Instant::now() + INVENTORY_INTERVAL;
        self.next_probe_at = Some(self.next_probe_at.map_or(at, |t| t.min(at)));
    }

    /// Drops the experiment's place in the host ledger's line ([`ToAgent::LeaveLine`]). Done
    /// here rather than on the blocking pool, so that it cannot pass a probe that stands in
    /// line again: the ledger's lock is held for a file's read and write.
    fn leave_line(&mut self) {
        let (Some(leases), Some(experiment)) = (self.pool.leases(), self.experiment_id.as_deref())
        else {
            return;
        };
        if let Err(e) = leases.leave_line(experiment) {
            say!("cannot leave this host's lease ledger line: {e}");
        }
    }

    fn probe_now(&mut self) {
        let Some(environment_id) = self.environment_id.clone() else {
            return;
        };
        if !self.pool.running().is_empty() {
            self.schedule_probe();
        }
        if self.probing || !self.client.as_ref().is_some_and(|c| c.welcomed) {
            return;
        }
        self.probing = true;
        let stand_for = self.experiment_id.clone().zip(self.stand_in_line.take());
        let pool = self.pool.clone();
        let probe = self.probe.clone();
        let inputs = self.inputs_sender.clone();
        tokio::task::spawn_blocking(move || {
            let inventory = probe_host(&probe, &environment_id, &pool, stand_for.as_ref());
            let _ = inputs.send(Input::Probed(inventory));
        });
    }
}

/// Starts a trial; the reply's error on failure.
fn start(pool: &TrialPool, mut request: TrialRequest, fresh_code_copy: bool) -> Result<(), String> {
    if fresh_code_copy {
        if !request.code_dir.is_dir() {
            return Err(format!(
                "trial {}: code directory {} does not exist on this host; upload the code first",
                request.trial_id,
                request.code_dir.display()
            ));
        }
        let copy = request.trial_dir.join("code");
        if copy.exists() {
            std::fs::remove_dir_all(&copy).map_err(|e| {
                format!(
                    "trial {}: cannot clear {}: {e}",
                    request.trial_id,
                    copy.display()
                )
            })?;
        }
        super::copy_tree(&request.code_dir, &copy).map_err(|e| {
            format!(
                "trial {}: cannot copy its code into its own directory: {e}",
                request.trial_id
            )
        })?;
        request.code_dir = copy;
    }
    // The agent's pool keeps a trial whose lease must wait pending (it never gives one back:
    // `Started::Refused` needs `set_places_again`, which the agent protocol does not carry yet).
    pool.start(&request).map(|_| ()).map_err(|e| match e {
        PoolError::ShutDown => "knob-agent is shutting down; no trial can start".to_string(),
        other => other.to_string(),
    })
}

/// What a probe of the host found.
struct Probed {
    inventory: Value,
    /// Why the host's lease ledger could not be read, when it could not: the inventory then
    /// leaves out other experiments' trials.
    ledger_problem: Option<String>,
}

/// The host as gpu-sched describes it, under the service's environment id; with `stand_for`
/// (the experiment, what its waiting trial asks for, the host's limits), that experiment also
/// stands in the ledger's line for the GPUs others hold here that its trial waits for.
fn probe_host(
    probe: &Mutex<Option<LocalProbe>>,
    environment_id: &str,
    pool: &TrialPool,
    stand_for: Option<&(String, (SchedulerConfig, Option<EnvironmentLimits>))>,
) -> Result<Probed, String> {
    let mut probe = probe.lock().unwrap_or_else(|p| p.into_inner());
    if probe.is_none() {
        *probe = Some(LocalProbe::new(environment_id).map_err(|e| e.to_string())?);
    }
    let probe = probe.as_mut().expect("set just above");
    let groups: Vec<u32> = pool
        .running()
        .into_iter()
        .filter_map(|(_, pid)| pid)
        .collect();
    let is_trial = |pid: u32| process_group_of(pid).is_some_and(|group| groups.contains(&group));
    let mut environments = probe.sample(&is_trial);
    if environments.is_empty() {
        return Err("the probe found no environment".to_string());
    }
    // A simulated spec may name several environments; a host is one.
    let mut environment = environments.swap_remove(0);
    environment.id = environment_id.into();
    environment.host = hostname();
    let mut ledger_problem = None;
    if let Some(leases) = pool.leases() {
        // The agent probes on its own schedule too; it stands in the ledger's line only when
        // the service says the manager's trials wait (`ToAgent::StandInLine`).
        // The service puts its own limits on the inventory it receives; these are for
        // choosing the GPUs to stand in line for.
        if let Some((_, (_, Some(limits)))) = stand_for {
            environment.limits = limits.clone();
        }
        let waiting = stand_for.map(|(experiment, (demand, _))| (experiment.as_str(), demand));
        // As the `local` service does: a ledger that cannot be used holds nothing back (a
        // trial whose lease cannot be taken starts anyway), where failing the probe refused
        // the host to every experiment.
        if let Err(e) = leases.annotate(&mut environment, waiting) {
            ledger_problem = Some(format!(
                "cannot read this host's lease ledger, trials are placed as if no other experiment ran here: {e}"
            ));
        }
    }
    Ok(Probed {
        inventory: serde_json::to_value(&environment).map_err(|e| e.to_string())?,
        ledger_problem,
    })
}

fn hostname() -> String {
    nix::unistd::gethostname()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// The next delivery of a signal, or never when it could not be installed.
async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

async fn read_client(id: u64, mut read: OwnedReadHalf, inputs: UnboundedSender<Input>) {
    loop {
        match read_frame_async::<ToAgent>(&mut read).await {
            Ok(message) => {
                if inputs.send(Input::Message(id, message)).is_err() {
                    return;
                }
            }
            Err(error) => {
                let why = match error {
                    FrameError::Closed => "it closed the connection".to_string(),
                    other => format!("{other}; connection closed"),
                };
                let _ = inputs.send(Input::Gone(id, why));
                return;
            }
        }
    }
}

async fn write_client(mut write: OwnedWriteHalf, mut queued: UnboundedReceiver<FromAgent>) {
    use tokio::io::AsyncWriteExt;
    while let Some(message) = queued.recv().await {
        if write_frame_async(&mut write, &message).await.is_err() {
            return;
        }
    }
    let _ = write.shutdown().await;
}
