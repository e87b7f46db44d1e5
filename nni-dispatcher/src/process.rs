//! NNI's dispatcher as a child process: the Python that runs it, its launch (as NNI 3.0's
//! manager starts it), the WebSocket it connects back to, and the commands in both directions.

use std::collections::VecDeque;
use std::io::{BufReader, Read};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use knob_plugin_api::metric;
use knob_plugin_api::{log, PluginError, Waker};
use serde_json::{json, Value};

use crate::websocket::{self, Message, Writer};

/// How the installed nni frames a command on the tuner command channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// nni 3.0: `{"type": "XX", "content": "<payload>"}` text messages, the payload itself a
    /// JSON string (so encoded twice), plus the `_nop_` and `_bye_` control messages.
    Json,
    /// nni 2.8 to 2.10: `XX<payload>` text messages.
    Prefixed,
}

/// `python -m nni` (NNI's dispatcher), with its workers finishing the commands they were sent
/// before the TERMINATE that [`Dispatcher::stop`] sends, and leaving as soon as they have.
///
/// - NNI's `MsgDispatcherBase` hands a trial's end to one worker thread and other commands to
///   another, and by default a worker exits on TERMINATE as soon as it is done with the command
///   in hand, dropping what is still queued: under load the algorithm missed the last trial's
///   end when the experiment ended
///   (`nni_dispatcher::a_users_nni_tuner_by_class_name_runs_under_nni_2_10`, in CI). NNI's
///   manager sends TERMINATE only when a user stops the experiment, long after; knob sends it
///   at the end. The flag is a module global of nni 2.x and 3.0; setting it on a version
///   without it is harmless.
/// - An idle worker sees that the dispatcher stops only when its `get(timeout=3)` times out, and
///   the dispatcher joins both: every end of an experiment (a Ctrl-C included) waited up to 3 s
///   for them (2.5 s in `nni_3_s_idle_workers_leave_as_soon_as_the_dispatcher_stops` before). Setting `stopping` now also queues a marker behind what each worker
///   still has, which its queue's `get` turns into the `Empty` of a time-out: the worker checks
///   `stopping` at once. Both patches act on names nni 2.8 to 3.0 define alike (`Queue`,
///   imported into the module, and the `stopping` attribute).
const DISPATCHER_MAIN: &str = "import queue, runpy, nni.runtime.msg_dispatcher_base as base\n\
                               base._worker_fast_exit_on_terminate = False\n\
                               _wake = object()\n\
                               class _WakeableQueue(queue.Queue):\n\
                               \x20   def get(self, block=True, timeout=None):\n\
                               \x20       item = super().get(block, timeout)\n\
                               \x20       if item is _wake:\n\
                               \x20           raise queue.Empty\n\
                               \x20       return item\n\
                               base.Queue = _WakeableQueue\n\
                               def _set_stopping(self, value):\n\
                               \x20   self.__dict__['_knob_stopping'] = value\n\
                               \x20   for name in ('default_command_queue', 'assessor_command_queue'):\n\
                               \x20       if value and isinstance(getattr(self, name, None), _WakeableQueue):\n\
                               \x20           getattr(self, name).put(_wake)\n\
                               base.MsgDispatcherBase.stopping = property(\n\
                               \x20   lambda self: self.__dict__.get('_knob_stopping', False), _set_stopping)\n\
                               runpy.run_module('nni', run_name='__main__', alter_sys=True)";

/// The Python that runs the dispatcher and what it has.
#[derive(Debug, Clone)]
pub struct Python {
    pub program: PathBuf,
    pub nni_version: String,
    pub framing: Framing,
}

/// How long asking the Python for its nni version may take (a cold start of a big venv).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Finds out whether `program` can run NNI's dispatcher, in one line a user can act on if not.
pub fn probe_python(program: &Path, what: &str) -> Result<Python, PluginError> {
    let script = "import importlib.metadata as m, importlib.util as u, sys\n\
                  sys.stdout.write(m.version('nni') if u.find_spec('nni') else '')";
    let mut probe = Command::new(program);
    // The interpreter runs the user's own start-up code (`sitecustomize`, `.pth` files) too.
    knob_plugin_api::secrets::remove_from(&mut probe);
    let mut child = probe
        .args(["-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            PluginError::new(format!(
                "{what} runs through NNI's Python dispatcher, but {} cannot be started ({e}); \
                 set pythonInterpreter to a Python with nni, or install one (`pip install nni`)",
                program.display()
            ))
        })?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PluginError::new(format!(
                    "{what}: {} did not say which nni it has within {} s",
                    program.display(),
                    PROBE_TIMEOUT.as_secs()
                )));
            }
        }
    };
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    if let Some(mut stderr) = child.stderr.take() {
        let _ = stderr.read_to_string(&mut err);
    }
    let version = out.trim().to_owned();
    if !status.success() || version.is_empty() {
        let detail = last_line(&err)
            .map(|l| format!(" ({l})"))
            .unwrap_or_default();
        return Err(PluginError::new(format!(
            "{what} runs through NNI's Python dispatcher, but {} cannot import nni{detail}; \
             run `{} -m pip install nni`, or set pythonInterpreter to a Python that has it",
            program.display(),
            program.display()
        )));
    }
    let framing = framing_of(&version).ok_or_else(|| {
        PluginError::new(format!(
            "{what}: {} has nni {version}, whose dispatcher talks over pipes (before 2.8), which \
             knob does not speak; `pip install 'nni>=2.8'` (3.0 is tested)",
            program.display()
        ))
    })?;
    Ok(Python {
        program: program.to_path_buf(),
        nni_version: version,
        framing,
    })
}

/// The framing of an nni version: 3.x JSON, 2.8 to 2.x prefixed, `None` before 2.8 (pipes).
pub fn framing_of(version: &str) -> Option<Framing> {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    match (major, minor) {
        (0..=1, _) => None,
        (2, 0..=7) => None,
        (2, _) => Some(Framing::Prefixed),
        _ => Some(Framing::Json),
    }
}

/// The first `python3` on PATH, as NNI 3.0 picks its dispatcher's Python.
pub fn default_python() -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("python3"))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| PathBuf::from("python3"))
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

/// What a launch needs.
#[derive(Debug, Clone)]
pub struct Launch {
    /// "tuner SMAC", "assessor my_assessor.MyAssessor": how messages name the algorithm.
    pub what: String,
    pub python: Python,
    /// NNI's experiment config (v2, camelCase); `tuner` and `assessor` are what it reads.
    pub exp_params: Value,
    /// The dispatcher's working directory and `NNI_LOG_DIRECTORY` (it writes dispatcher.log).
    pub log_dir: PathBuf,
    pub checkpoint_dir: PathBuf,
    pub resume: bool,
    pub log_level: String,
    pub include_intermediate_results: bool,
    pub cuda_visible_devices: String,
    /// How long the dispatcher may take to connect.
    pub connect_timeout: Duration,
}

/// Whom to wake, and on which commands, when the dispatcher sends one outside a call (a late
/// `TR` of an advisor or PBT, an assessor's `KI`): the host then asks at once.
#[derive(Debug, Clone)]
pub struct WakeOn {
    pub waker: Waker,
    pub codes: &'static [&'static str],
    /// Whether the connection's end wakes the host too: a tuner whose host waits on it with
    /// nothing running must be asked again to report that its dispatcher is gone.
    pub on_close: bool,
}

/// A command from the dispatcher, or the end of the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Command { code: String, content: String },
    Closed(String),
}

/// A running dispatcher and its connection.
pub struct Dispatcher {
    pub launch: Launch,
    /// Shared with the thread that waits for the connection, which ends a dispatcher that does
    /// not connect in time.
    child: Arc<std::sync::Mutex<Child>>,
    writer: Arc<Writer>,
    /// Frames to send at their instant, by the sender thread (`send_later`).
    later: Later,
    incoming: mpsc::Receiver<Incoming>,
    /// Commands read but not yet consumed by the caller.
    pending: VecDeque<(String, String)>,
    closed: Option<String>,
    /// The connector killed the dispatcher (it did not connect in time, or its handshake
    /// failed): its exit status then says only that, and the error leaves it out.
    killed_unconnected: Arc<AtomicBool>,
}

/// How many lines of dispatcher.log an error quotes.
const LOG_LINES: usize = 5;

impl Dispatcher {
    /// Starts `python -m nni --exp_params ...` and returns at once: the dispatcher connects
    /// when Python, nni and the algorithm's constructor are ready, seconds later (minutes for a
    /// user's tuner that loads a model), and the host's loop does not wait for that. What is
    /// sent meanwhile goes out as it connects; a dispatcher that exits first, or does not
    /// connect within `dispatcherConnectTimeout`, ends the connection with the reason (and wakes
    /// the host when `wake_on` asks for the connection's end).
    pub fn start(launch: Launch, wake_on: Option<WakeOn>) -> Result<Dispatcher, PluginError> {
        let what = launch.what.clone();
        std::fs::create_dir_all(&launch.log_dir)
            .and_then(|()| std::fs::create_dir_all(&launch.checkpoint_dir))
            .map_err(|e| {
                PluginError::new(format!(
                    "{what}: cannot make {} for NNI's dispatcher: {e}",
                    launch.log_dir.display()
                ))
            })?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(|e| {
                PluginError::new(format!(
                    "{what}: cannot listen on 127.0.0.1 for NNI's dispatcher: {e}"
                ))
            })?;
        let port = listener
            .local_addr()
            .map_err(|e| PluginError::new(format!("{what}: {e}")))?
            .port();
        let params = base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_string(&launch.exp_params).unwrap_or_default());
        let output = std::fs::File::create(launch.log_dir.join(OUTPUT_FILE)).map_err(|e| {
            PluginError::new(format!(
                "{what}: cannot write {}: {e}",
                launch.log_dir.join(OUTPUT_FILE).display()
            ))
        })?;
        let output_err = output
            .try_clone()
            .map_err(|e| PluginError::new(format!("{what}: {e}")))?;
        let mut command = Command::new(&launch.python.program);
        command
            .args(["-c", DISPATCHER_MAIN, "--exp_params", &params])
            .current_dir(&launch.log_dir)
            .env("SDK_PROCESS", "dispatcher")
            .env("NNI_MODE", if launch.resume { "resume" } else { "start" })
            .env("NNI_CHECKPOINT_DIRECTORY", &launch.checkpoint_dir)
            .env("NNI_LOG_DIRECTORY", &launch.log_dir)
            .env("NNI_LOG_LEVEL", &launch.log_level)
            .env(
                "NNI_INCLUDE_INTERMEDIATE_RESULTS",
                if launch.include_intermediate_results {
                    "true"
                } else {
                    "false"
                },
            )
            .env(
                "NNI_TUNER_COMMAND_CHANNEL",
                format!("ws://127.0.0.1:{port}/tuner"),
            )
            .env("CUDA_VISIBLE_DEVICES", &launch.cuda_visible_devices)
            // A trial's variables must not leak in: `import nni` would act as a trial.
            .env_remove("NNI_PLATFORM")
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(output_err);
        // A `className` tuner or assessor is user code, as a trial is: it gets none of knob's
        // secrets.
        knob_plugin_api::secrets::remove_from(&mut command);
        let child = spawn_tied_to_host(command).map_err(|e| {
            PluginError::new(format!(
                "{what}: cannot start {} -m nni: {e}",
                launch.python.program.display()
            ))
        })?;
        let child = Arc::new(std::sync::Mutex::new(child));
        let writer = Arc::new(Writer::connecting());
        let (tx, incoming) = mpsc::channel();
        let framing = launch.python.framing;
        let later = Later::default();
        spawn_sender(Arc::downgrade(&writer), framing, later.clone());
        let killed_unconnected = Arc::new(AtomicBool::new(false));
        let connection = Connection {
            listener,
            child: child.clone(),
            writer: writer.clone(),
            timeout: launch.connect_timeout,
            killed: killed_unconnected.clone(),
        };
        std::thread::Builder::new()
            .name("nni-dispatcher-reader".into())
            .spawn(move || match connection.accept() {
                Ok(stream) => read_loop(stream, &connection.writer, framing, &tx, wake_on),
                Err(reason) => closed(&tx, wake_on.as_ref(), reason),
            })
            .map_err(|e| PluginError::new(format!("{what}: {e}")))?;
        Ok(Dispatcher {
            launch,
            child,
            writer,
            incoming,
            pending: VecDeque::new(),
            closed: None,
            killed_unconnected,
            later,
        })
    }

    /// Sends one command.
    pub fn send(&mut self, code: &str, content: &str) -> Result<(), PluginError> {
        self.check_alive()?;
        let text = frame(self.launch.python.framing, code, content);
        self.writer.text(&text).map_err(|e| {
            let tail = log_tail(&self.launch.log_dir);
            PluginError::new(format!(
                "{}: NNI's dispatcher is gone ({e}){tail}",
                self.launch.what
            ))
        })
    }

    /// Sends one command `delay` from now, from the sender thread (dropped if the connection
    /// has ended by then).
    pub fn send_later(
        &mut self,
        code: &str,
        content: &str,
        delay: Duration,
    ) -> Result<(), PluginError> {
        self.check_alive()?;
        let text = frame(self.launch.python.framing, code, content);
        self.later
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now() + delay, text));
        Ok(())
    }

    /// Takes what has arrived, without waiting.
    pub fn drain(&mut self) -> Result<(), PluginError> {
        while let Ok(message) = self.incoming.try_recv() {
            self.accept(message);
        }
        self.failure()
    }

    /// Waits until `done` holds for the commands read so far, the dispatcher fails, or `timeout`
    /// passes (then `Ok(false)`).
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&VecDeque<(String, String)>) -> bool,
    ) -> Result<bool, PluginError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain()?;
            if done(&self.pending) {
                return Ok(true);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            // Short slices, so that a dispatcher that dies without closing its socket is seen.
            match self
                .incoming
                .recv_timeout(left.min(Duration::from_millis(200)))
            {
                Ok(message) => self.accept(message),
                Err(mpsc::RecvTimeoutError::Timeout) => self.check_alive()?,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    if self.closed.is_none() {
                        self.closed = Some("the connection ended".into());
                    }
                }
            }
        }
    }

    /// The commands read and not consumed yet.
    pub fn pending(&mut self) -> &mut VecDeque<(String, String)> {
        &mut self.pending
    }

    fn accept(&mut self, message: Incoming) {
        match message {
            Incoming::Command { code, content } => self.pending.push_back((code, content)),
            Incoming::Closed(reason) => {
                if self.closed.is_none() {
                    self.closed = Some(reason);
                }
            }
        }
    }

    /// An error once the dispatcher has reported one, closed the channel or exited.
    fn failure(&mut self) -> Result<(), PluginError> {
        if let Some(index) = self.pending.iter().position(|(code, _)| code == "ER") {
            let (_, content) = self.pending.remove(index).unwrap_or_default();
            let reason = last_line(&content).unwrap_or("(no message)").to_owned();
            return Err(PluginError::new(format!(
                "{}: NNI's dispatcher failed: {reason}{}",
                self.launch.what,
                log_tail(&self.launch.log_dir)
            )));
        }
        if let Some(reason) = self.closed.clone() {
            // Commands sent before the close still count.
            if self.pending.is_empty() {
                let status = if self.killed_unconnected.load(Ordering::Relaxed) {
                    String::new()
                } else {
                    self.wait_exit(Duration::from_secs(2))
                };
                return Err(PluginError::new(format!(
                    "{}: NNI's dispatcher stopped ({reason}{status}){}",
                    self.launch.what,
                    log_tail(&self.launch.log_dir)
                )));
            }
        }
        Ok(())
    }

    fn check_alive(&mut self) -> Result<(), PluginError> {
        self.drain()?;
        let Ok(Some(status)) = self.child_status() else {
            return Ok(());
        };
        // Gone. What it sent last (an error, its goodbye) says more than its exit status, and
        // the reader hands that over once it reads the socket's end: a send right after the
        // exit said "exited (exit status: 0)" or "stopped (it said goodbye …)" by the race.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.closed.is_none() {
            match self
                .incoming
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(message) => self.accept(message),
                Err(_) => break,
            }
        }
        self.failure()?;
        Err(PluginError::new(format!(
            "{}: NNI's dispatcher exited ({status}){}",
            self.launch.what,
            log_tail(&self.launch.log_dir)
        )))
    }

    fn wait_exit(&mut self, grace: Duration) -> String {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child_status() {
                return format!(", {status}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        String::new()
    }

    fn child_status(&self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .try_wait()
    }

    /// Tells the dispatcher to terminate, then makes sure it is gone (bounded). One that has
    /// not connected yet cannot be told: it is killed at once.
    pub fn stop(&mut self) {
        if self.child_status().ok().flatten().is_none() && self.writer.is_open() {
            // What waits to be sent (a trial's delayed `EN`) goes first: the algorithm hears of
            // every trial's end before the experiment's.
            let waiting: Vec<(Instant, String)> =
                std::mem::take(&mut *self.later.lock().unwrap_or_else(|e| e.into_inner()));
            for (_, text) in waiting {
                let _ = self.writer.text(&text);
            }
            let _ = self.send("TE", "");
            if self.launch.python.framing == Framing::Json {
                let _ = self.writer.text(&json!({"type": "_bye_"}).to_string());
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child_status() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Closed first, so that a dispatcher still to connect is refused rather than served.
        self.writer.close();
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.try_wait().ok().flatten().is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `command` so that it does not outlive this process. [`Dispatcher`]'s drop ends the
/// dispatcher when its tuner or assessor is dropped, but a host killed by a signal (SIGTERM,
/// SIGKILL, a second Ctrl-C's exit) drops nothing, and `python -m nni` keeps running on its
/// own, reconnecting to a channel nobody serves. On Linux the child asks the kernel for a
/// SIGKILL when its parent dies (`PR_SET_PDEATHSIG`). The kernel ties that to the parent
/// *thread*, not the process, so the child is started from a thread of this library that lives
/// as long as the process: a dispatcher started from a short-lived thread (a pool thread of an
/// in-process host) would otherwise die with that thread. Elsewhere the drop is all there is.
pub fn spawn_tied_to_host(command: Command) -> std::io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        tied::spawn(command)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let mut command = command;
        command.spawn()
    }
}

#[cfg(target_os = "linux")]
mod tied {
    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};
    use std::sync::{mpsc, OnceLock};

    type Request = (Command, mpsc::Sender<io::Result<Child>>);

    /// The thread every tied child is started from; it never ends, so its children's parent
    /// thread dies only with the process.
    static SPAWNER: OnceLock<Option<mpsc::Sender<Request>>> = OnceLock::new();

    pub(super) fn spawn(mut command: Command) -> io::Result<Child> {
        let host = std::process::id();
        // SAFETY: prctl, getppid and kill are async-signal-safe and touch no memory of the
        // parent; the closure captures a plain integer.
        unsafe {
            command.pre_exec(move || {
                let signal = libc::SIGKILL as libc::c_ulong;
                if libc::prctl(libc::PR_SET_PDEATHSIG, signal, 0, 0, 0) == -1 {
                    return Err(io::Error::last_os_error());
                }
                // The host died between the fork and the prctl: nobody will signal us.
                if u32::try_from(libc::getppid()).ok() != Some(host) {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                Ok(())
            });
        }
        let spawner = SPAWNER.get_or_init(|| {
            let (requests, inbox) = mpsc::channel::<Request>();
            std::thread::Builder::new()
                .name("nni-dispatcher-spawner".into())
                .spawn(move || {
                    while let Ok((mut command, reply)) = inbox.recv() {
                        let _ = reply.send(command.spawn());
                    }
                })
                .ok()
                .map(|_| requests)
        });
        let Some(spawner) = spawner else {
            // No thread to spawn from: this one, whose end would end the child.
            return command.spawn();
        };
        let (reply, answer) = mpsc::channel();
        spawner
            .send((command, reply))
            .map_err(|_| io::Error::other("the dispatcher's spawner thread is gone"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the dispatcher's spawner thread is gone"))?
    }
}

/// Where the dispatcher's stdout and stderr go (a traceback before its logging is set up).
pub const OUTPUT_FILE: &str = "dispatcher-output.log";

/// A command as the installed nni frames it.
fn frame(framing: Framing, code: &str, content: &str) -> String {
    match framing {
        Framing::Json => json!({"type": code, "content": content}).to_string(),
        Framing::Prefixed => format!("{code}{content}"),
    }
}

/// Frames waiting for their instant (`Dispatcher::send_later`).
type Later = Arc<std::sync::Mutex<Vec<(Instant, String)>>>;

/// How often the dispatcher is pinged, as NNI's manager does (`pingDispatcher`, every 5 s).
const PING_INTERVAL: Duration = Duration::from_secs(5);

/// How often the sender thread looks for frames due.
const SENDER_TICK: Duration = Duration::from_millis(100);

/// The sender thread: sends what `send_later` queued once it is due, and pings the dispatcher
/// every `PING_INTERVAL` while the connection lives. Besides keeping NNI's manager's habit, the
/// ping is what makes a failed dispatcher exit: when a handler raises, the dispatcher's worker
/// thread records the exception and ends, but its main loop only looks at it after the next
/// command arrives; without one it would sit there, connected and silent, while knob waits for
/// parameters. The thread ends with the connection (the writer dropped or closed).
fn spawn_sender(writer: std::sync::Weak<Writer>, framing: Framing, later: Later) {
    let ping = frame(framing, "PI", "");
    let spawned = std::thread::Builder::new()
        .name("nni-dispatcher-sender".into())
        .spawn(move || {
            let mut last_ping = Instant::now();
            loop {
                std::thread::sleep(SENDER_TICK);
                let Some(writer) = writer.upgrade() else {
                    return;
                };
                let now = Instant::now();
                let due: Vec<String> = {
                    let mut later = later.lock().unwrap_or_else(|e| e.into_inner());
                    let (due, waiting) = later.drain(..).partition(|(at, _)| *at <= now);
                    *later = waiting;
                    due.into_iter().map(|(_, text)| text).collect()
                };
                for text in due {
                    if writer.text(&text).is_err() {
                        return;
                    }
                }
                // Pings are for a connected dispatcher: one still starting has nothing to fail.
                if writer.is_open() && now.duration_since(last_ping) >= PING_INTERVAL {
                    last_ping = now;
                    if writer.text(&ping).is_err() {
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        log::warn(&format!(
            "NNI's dispatcher will not be pinged (a failure inside it may then go unseen): {e}"
        ));
    }
}

/// " (last lines of dispatcher.log: ...)" or of its output, "" when there is nothing.
pub fn log_tail(log_dir: &Path) -> String {
    for name in ["dispatcher.log", OUTPUT_FILE] {
        let Ok(text) = std::fs::read_to_string(log_dir.join(name)) else {
            continue;
        };
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            // Python 3.11's markers under the failing expression (`^^^^`, `~~~^^^`) say
            // nothing on one line, and took the place of the lines that do.
            .filter(|l| !l.is_empty() && !l.chars().all(|c| matches!(c, '^' | '~')))
            .collect();
        if lines.is_empty() {
            continue;
        }
        let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join(" | ");
        return format!("; last lines of {}: {tail}", log_dir.join(name).display());
    }
    String::new()
}

/// After the dispatcher's `_bye_`: reads on, ignoring what comes, to its close frame, which
/// `read_message` answers. nni's client waits for that answer before its process can exit (up
/// to the 10 s close timeout of `websockets`): each end of an experiment with an NNI algorithm
/// took the 5 s [`Dispatcher::stop`] allows, and then a kill. Ends when the socket does, at
/// the latest when the dispatcher's writer closes it.
fn read_to_close(reader: &mut impl std::io::Read, writer: &Writer) {
    while let Ok(Message::Text(_)) = websocket::read_message(reader, writer) {}
}

/// The dispatcher's connection, still to come: the thread that waits for it.
struct Connection {
    listener: TcpListener,
    child: Arc<std::sync::Mutex<Child>>,
    writer: Arc<Writer>,
    /// `dispatcherConnectTimeout`, counted from the start.
    timeout: Duration,
    /// Set when it kills the dispatcher ([`Dispatcher::killed_unconnected`]).
    killed: Arc<AtomicBool>,
}

impl Connection {
    /// Waits (bounded) for the dispatcher to connect and shake hands, then opens the writer on
    /// the stream and returns its reading half; or says why not, after ending the dispatcher.
    fn accept(&self) -> Result<TcpStream, String> {
        let started = Instant::now();
        let stream = loop {
            if !self.writer.is_connecting() {
                return Err("stopped before it connected".into());
            }
            match self.listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.end(format!("accepting its connection failed: {e}"))),
            }
            if let Ok(Some(_)) = self
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_wait()
            {
                return Err("it exited before connecting".into());
            }
            if started.elapsed() > self.timeout {
                return Err(self.end(format!(
                    "it did not connect within {} s (dispatcherConnectTimeout)",
                    self.timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let handshake = (|| -> Result<TcpStream, websocket::WsError> {
            let mut stream = stream;
            stream.set_nonblocking(false)?;
            stream.set_nodelay(true)?;
            // The handshake is bounded by what is left of the connect timeout: a peer that
            // connects and sends nothing must not hold the tuner forever.
            let left = self.timeout.saturating_sub(started.elapsed());
            stream.set_read_timeout(Some(left.max(Duration::from_secs(1))))?;
            websocket::accept(&mut stream)?;
            stream.set_read_timeout(None)?;
            self.writer.open(stream.try_clone()?)?;
            Ok(stream)
        })();
        handshake.map_err(|e| self.end(format!("its WebSocket handshake failed: {e}")))
    }

    /// Kills the dispatcher; returns `reason`.
    fn end(&self, reason: String) -> String {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        self.killed.store(true, Ordering::Relaxed);
        let _ = child.kill();
        let _ = child.wait();
        reason
    }
}

/// Hands the connection's end to the host's side, and wakes the host if it asked for that.
fn closed(tx: &mpsc::Sender<Incoming>, wake_on: Option<&WakeOn>, reason: String) {
    let _ = tx.send(Incoming::Closed(reason));
    if let Some(wake_on) = wake_on.filter(|w| w.on_close) {
        wake_on.waker.wake();
    }
}

fn read_loop(
    stream: TcpStream,
    writer: &Writer,
    framing: Framing,
    tx: &mpsc::Sender<Incoming>,
    wake_on: Option<WakeOn>,
) {
    let mut reader = BufReader::new(stream);
    let closed = |reason: String| closed(tx, wake_on.as_ref(), reason);
    loop {
        let text = match websocket::read_message(&mut reader, writer) {
            Ok(Message::Text(text)) => text,
            Ok(Message::Closed(reason)) => return closed(reason),
            Err(e) => return closed(format!("the channel broke: {e}")),
        };
        let command = match framing {
            Framing::Json => match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(map)) => {
                    let code = map
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned();
                    let content = match map.get("content") {
                        Some(Value::String(s)) => s.clone(),
                        Some(other) => other.to_string(),
                        None => String::new(),
                    };
                    match code.as_str() {
                        "_nop_" => continue,
                        "_bye_" => {
                            let reason = map.get("reason").and_then(Value::as_str).unwrap_or("bye");
                            closed(format!("it said goodbye: {reason}"));
                            read_to_close(&mut reader, writer);
                            return;
                        }
                        _ => Incoming::Command { code, content },
                    }
                }
                _ => Incoming::Command {
                    code: String::new(),
                    content: text,
                },
            },
            Framing::Prefixed => {
                let split = text.char_indices().nth(2).map_or(text.len(), |(i, _)| i);
                Incoming::Command {
                    code: text[..split].to_owned(),
                    content: text[split..].to_owned(),
                }
            }
        };
        let wake = match (&command, &wake_on) {
            (Incoming::Command { code, .. }, Some(wake_on)) => wake_on
                .codes
                .contains(&code.as_str())
                .then_some(&wake_on.waker),
            _ => None,
        };
        if tx.send(command).is_err() {
            return;
        }
        // After the send: the host's call that the wake causes finds the command there.
        if let Some(waker) = wake {
            waker.wake();
        }
    }
}

/// Parses a payload as Python's `json` writes it: NaN, Infinity and -Infinity allowed (read
/// as null: knob's JSON has no such numbers). The scanning is plugin-api's, which metric values
/// go through too.
pub fn parse_payload(text: &str) -> Result<Value, serde_json::Error> {
    let mut value = metric::parse_json_lenient(text)?;
    null_non_finite(&mut value);
    Ok(value)
}

/// The strings `parse_json_lenient` reads NaN and the infinities as, made null.
fn null_non_finite(value: &mut Value) {
    match value {
        Value::String(text) if [metric::NAN, metric::INF, metric::NEG_INF].contains(&&**text) => {
            *value = Value::Null
        }
        Value::Array(items) => items.iter_mut().for_each(null_non_finite),
        Value::Object(map) => map.values_mut().for_each(null_non_finite),
        _ => {}
    }
}

/// A metric as the trial reported it ([`knob_plugin_api::Tuner::receive_trial_metric`]'s,
/// NaN and the infinities as the SDK's strings) as Python's `json.dumps` writes it, the form
/// NNI's trials give metric values in: those strings become the bare words again.
pub fn python_json(metric: &Value) -> String {
    match metric {
        Value::String(text) if text == metric::NAN => "NaN".into(),
        Value::String(text) if text == metric::INF => "Infinity".into(),
        Value::String(text) if text == metric::NEG_INF => "-Infinity".into(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(python_json).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let entries: Vec<String> = map
                .iter()
                .map(|(key, value)| {
                    format!("{}: {}", Value::from(key.as_str()), python_json(value))
                })
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => other.to_string(),
    }
}

/// A number as Python's `json.dumps` writes it (NaN and the infinities included), the form
/// NNI's trials give metric values in.
pub fn python_number(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value == f64::INFINITY {
        "Infinity".into()
    } else if value == f64::NEG_INFINITY {
        "-Infinity".into()
    } else {
        serde_json::to_string(&value).unwrap_or_else(|_| "NaN".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::prerequisite;

    #[test]
    fn the_log_tail_leaves_out_python_markers_under_the_failing_expression() {
        let dir = std::env::temp_dir().join(format!("knob-log-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("dispatcher.log"),
            "Traceback (most recent call last):\n  File \"x.py\", line 3, in <module>\n    \
             f(**a)\n    ^^^^^^\n  File \"y.py\", line 9, in make\n    return C(**args)\n    \
             ~~~~~^^^^^^^^\nTypeError: C() got an unexpected keyword argument 'seed'\n",
        )
        .unwrap();
        let tail = log_tail(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            tail,
            format!(
                "; last lines of {}: File \"x.py\", line 3, in <module> | f(**a) | File \"y.py\", line 9, in make | return C(**args) | TypeError: C() got an unexpected keyword argument 'seed'",
                dir.join("dispatcher.log").display()
            )
        );
    }

    /// What [`DISPATCHER_MAIN`] runs before NNI's own main, and then: a dispatcher (NNI's base
    /// class, on a channel it does not connect) whose two workers each had a command and went
    /// idle, one more command queued, and a stop. The workers, idle in their 3 s `get`, used
    /// to see the stop only when it timed out; they finish the queued command and leave at once.
    const IDLE_WORKERS_STOP: &str = "
import time
d = base.MsgDispatcherBase('ws://_unittest_knob')
done = []
d.process_command = lambda command, data: done.append(command)
d.default_worker.start()
d.assessor_worker.start()
d.default_command_queue.put(('A', None))
d.assessor_command_queue.put(('B', None))
time.sleep(0.5)
d.default_command_queue.put(('C', None))
started = time.monotonic()
d.stopping = True
d.default_worker.join()
d.assessor_worker.join()
print(sorted(done), time.monotonic() - started < 1.5)
";

    fn check_idle_workers_stop(python: &std::path::Path) {
        let (patches, _) = DISPATCHER_MAIN.rsplit_once("runpy.run_module").unwrap();
        let output = Command::new(python)
            .args(["-c", &format!("{patches}{IDLE_WORKERS_STOP}")])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{stdout}\n{stderr}");
        assert_eq!(stdout.trim(), "['A', 'B', 'C'] True", "{stderr}");
    }

    #[test]
    fn nni_3_s_idle_workers_leave_as_soon_as_the_dispatcher_stops() {
        if let Some(python) = prerequisite::NNI3_PYTHON.path() {
            check_idle_workers_stop(&python);
        }
    }

    #[test]
    fn nni_2_s_idle_workers_leave_as_soon_as_the_dispatcher_stops() {
        if let Some(python) = prerequisite::NNI2_PYTHON.path() {
            check_idle_workers_stop(&python);
        }
    }

    /// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
    #[cfg(target_os = "linux")]
    fn ended(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => stat
                .rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
            Err(_) => true,
        }
    }

    /// Polls `done` every 50 ms, 400 times at most (20 s).
    #[cfg(target_os = "linux")]
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..400 {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        done()
    }

    /// The kernel ties PR_SET_PDEATHSIG to the parent thread: a child asked for from a thread
    /// that ends must live on (it was started from the spawner thread).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_tied_child_outlives_the_thread_that_asked_for_it() {
        let mut child = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("60");
            spawn_tied_to_host(command).unwrap()
        })
        .join()
        .unwrap();
        // The signal would come as the thread exits; give it ten chances to show.
        let mut alive = true;
        for _ in 0..10 {
            alive &= child.try_wait().unwrap().is_none();
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(alive, "the child died with the thread that asked for it");
    }

    /// What [`a_tied_child_dies_with_its_host_process`] runs as its host: starts a tied
    /// `sleep`, prints its pid and waits to be killed. Does nothing unless asked to.
    #[cfg(target_os = "linux")]
    #[test]
    fn tied_child_host() {
        if std::env::var_os("KNOB_TEST_TIED_CHILD_HOST").is_none() {
            return;
        }
        let mut command = Command::new("sleep");
        command.arg("60");
        let mut child = spawn_tied_to_host(command).unwrap();
        println!("tied-child-pid {}", child.id());
        use std::io::Write;
        std::io::stdout().flush().unwrap();
        // Killed while it sleeps; if not, it ends its child itself.
        std::thread::sleep(Duration::from_secs(60));
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A host killed by a signal drops nothing: its tied child (the dispatcher) must die with
    /// it all the same, not linger as an orphan.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_tied_child_dies_with_its_host_process() {
        use std::io::BufRead;
        let mut host = Command::new(std::env::current_exe().unwrap())
            .args([
                "process::tests::tied_child_host",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("KNOB_TEST_TIED_CHILD_HOST", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(host.stdout.take().unwrap());
        let pid: Option<u32> = stdout
            .lines()
            .take(50)
            .map_while(Result::ok)
            // libtest's "test NAME ... " may start the line.
            .find_map(|line| line.split_once("tied-child-pid ")?.1.trim().parse().ok());
        host.kill().unwrap();
        host.wait().unwrap();
        let pid = pid.expect("the host printed its child's pid");
        let gone = eventually(|| ended(pid));
        if !gone {
            // SAFETY: kill with a pid and a signal number touches no memory.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        assert!(gone, "the tied child {pid} outlived its SIGKILLed host");
    }

    #[test]
    fn framing_follows_the_nni_version() {
        assert_eq!(framing_of("3.0"), Some(Framing::Json));
        assert_eq!(framing_of("3.1rc1"), Some(Framing::Json));
        assert_eq!(framing_of("2.10.1"), Some(Framing::Prefixed));
        assert_eq!(framing_of("2.8"), Some(Framing::Prefixed));
        assert_eq!(framing_of("2.7"), None);
        assert_eq!(framing_of("1.9"), None);
        assert_eq!(framing_of("garbage"), None);
    }

    #[test]
    fn python_s_non_finite_numbers_are_read_as_null() {
        let value =
            parse_payload(r#"{"a": NaN, "b": [Infinity, -Infinity], "s": "NaN \" Infinity"}"#)
                .unwrap();
        assert_eq!(
            value,
            json!({"a": null, "b": [null, null], "s": "NaN \" Infinity"})
        );
        assert!(parse_payload("{nope").is_err());
        assert_eq!(python_number(f64::NAN), "NaN");
        assert_eq!(python_number(f64::NEG_INFINITY), "-Infinity");
        assert_eq!(python_number(0.5), "0.5");
    }

    #[test]
    fn a_whole_metric_goes_back_to_the_json_python_reads_with_its_non_finite_words() {
        let reported = r#"{"default": 0.5, "loss": NaN, "curve": [Infinity, -Infinity, 2], "s": "NaN", "n": {"k": "v"}}"#;
        let parsed = metric::parse_lenient(reported).unwrap();
        let text = python_json(&parsed);
        // In the trial's order, as Python's dict keeps it; Python reads the words as floats,
        // and a string that only spells one stays a string.
        assert_eq!(
            text,
            r#"{"default": 0.5, "loss": NaN, "curve": [Infinity, -Infinity, 2], "s": "NaN", "n": {"k": "v"}}"#
        );
        assert_eq!(python_json(&json!(0.25)), "0.25");
    }
}
