//! `knob-agent attach --dir D`: the SSH side of the agent. Connects to the daemon of `D` (and
//! starts it, detached, if none listens), then copies bytes between stdin/stdout and the
//! daemon's socket until either side closes. The daemon outlives this process: a dropped SSH
//! connection ends `attach`, never the trials.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{log_tail, AgentError, LOG_FILE_NAME, SOCKET_FILE_NAME};

/// How long `attach` waits for a daemon it started to listen.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);
/// After the daemon it started has exited, how long `attach` still waits for a socket (another
/// `attach` may have started the daemon that won the lock).
const AFTER_EXIT_GRACE: Duration = Duration::from_secs(2);

/// How `attach` starts a daemon.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    pub dir: PathBuf,
    /// Arguments passed on to `serve` (the orphan timeout and the like).
    pub serve_args: Vec<String>,
    /// Start a daemon when none listens. Off for a Slurm job, whose daemon is the job script's:
    /// a socket file left by an earlier run of a requeued job must not make `attach` start a
    /// second one inside its own job step.
    pub start: bool,
}

/// Connects (starting the daemon if needed) and bridges stdin/stdout to it; returns when either
/// side closes.
pub fn attach(options: &AttachOptions) -> Result<(), AgentError> {
    let stream = connect_or_start(options)?;
    bridge(stream);
    Ok(())
}

/// A connection to the daemon of `options.dir`, started first if nothing listens. Changes the
/// working directory to `options.dir` (created if missing), whose socket is reached by its
/// relative name (a Unix socket path is limited to 107 bytes).
pub fn connect_or_start(options: &AttachOptions) -> Result<UnixStream, AgentError> {
    let dir = std::path::absolute(&options.dir)
        .map_err(AgentError::io("cannot resolve", &options.dir))?;
    std::fs::create_dir_all(&dir).map_err(AgentError::io("cannot create", &dir))?;
    std::env::set_current_dir(&dir).map_err(AgentError::io("cannot enter", &dir))?;
    let options = &AttachOptions {
        dir,
        serve_args: options.serve_args.clone(),
        start: options.start,
    };
    let socket = Path::new(SOCKET_FILE_NAME);
    if let Ok(stream) = UnixStream::connect(socket) {
        return Ok(stream);
    }
    if !options.start {
        return Err(AgentError::NoDaemon {
            dir: options.dir.clone(),
        });
    }
    let mut daemon = start_daemon(options)?;
    let started = Instant::now();
    let mut exited_at: Option<Instant> = None;
    loop {
        if let Ok(stream) = UnixStream::connect(socket) {
            reap_in_background(daemon);
            return Ok(stream);
        }
        if exited_at.is_none() && matches!(daemon.try_wait(), Ok(Some(_))) {
            exited_at = Some(Instant::now());
        }
        let gave_up = started.elapsed() >= DAEMON_START_TIMEOUT
            || exited_at.is_some_and(|at| at.elapsed() >= AFTER_EXIT_GRACE);
        if gave_up {
            // A daemon on a full disk cannot write even its log to say why it stopped.
            let cause = crate::process::nearly_full(&options.dir)
                .map(|free| {
                    format!(
                        ": no space left on the disk of {} ({free} bytes free); free space there",
                        options.dir.display()
                    )
                })
                .unwrap_or_default();
            return Err(AgentError::DaemonDidNotStart {
                dir: options.dir.clone(),
                waited: started.elapsed(),
                cause,
                log_tail: log_tail(&options.dir.join(LOG_FILE_NAME), 3),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Starts `knob-agent serve` in a session of its own (no SSH hang-up reaches it), stdin null,
/// stdout and stderr appended to the directory's log.
fn start_daemon(options: &AttachOptions) -> Result<std::process::Child, AgentError> {
    let dir = &options.dir;
    std::fs::create_dir_all(dir).map_err(AgentError::io("cannot create", dir))?;
    let log_path = dir.join(LOG_FILE_NAME);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(AgentError::io("cannot open", &log_path))?;
    let log_again = log
        .try_clone()
        .map_err(AgentError::io("cannot open", &log_path))?;
    let exe = std::env::current_exe().map_err(AgentError::io(
        "cannot find its own executable",
        Path::new(""),
    ))?;
    // The file this agent was started from may be gone since (replaced or removed while it
    // started: its path then ends in " (deleted)"); the kernel's link to the running image
    // still starts this same agent.
    let program = if exe.exists() {
        exe.clone()
    } else {
        PathBuf::from("/proc/self/exe")
    };
    let mut command = Command::new(&program);
    command
        .arg("serve")
        .arg("--dir")
        .arg(dir)
        // The connection it is started for may be given up before its hello.
        .arg("--exit-without-hello")
        .args(&options.serve_args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_again));
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
    command
        .spawn()
        .map_err(AgentError::io("cannot start the daemon", &exe))
}

/// The daemon is this process's child until this process exits; reap it if it ends first so
/// that it does not linger as a zombie for the whole SSH session.
fn reap_in_background(mut daemon: std::process::Child) {
    std::thread::spawn(move || {
        let _ = daemon.wait();
    });
}

/// Copies stdin to the socket and the socket to stdout, flushing each chunk (stdout is
/// line-buffered and frames are binary). Returns when the daemon closes the connection or
/// stdout is gone; stdin closing half-closes the socket, and the daemon then closes its side.
pub fn bridge(stream: UnixStream) {
    let Ok(mut to_daemon) = stream.try_clone() else {
        return;
    };
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_daemon.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_daemon.shutdown(std::net::Shutdown::Write);
    });
    let mut from_daemon = stream;
    let mut stdout = std::io::stdout().lock();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from_daemon.read(&mut buffer) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if stdout.write_all(&buffer[..n]).is_err() || stdout.flush().is_err() {
                    return;
                }
            }
        }
    }
}
