//! knob-agent: what runs on a remote host (the binary is `src/bin/knob-agent.rs`).
//!
//! - [`daemon`]: `knob-agent serve --dir D`, one long-lived daemon per experiment and
//!   environment. It runs trials through a [`TrialPool`](crate::trial_pool::TrialPool), exactly
//!   as the local service does, serves the trial protocols on the host, numbers its events and
//!   keeps them until the service acknowledges them, and keeps trials running while no service
//!   is connected (up to the orphan timeout).
//! - [`attach`]: `knob-agent attach --dir D`, what the service runs over SSH: starts the daemon
//!   if none listens on `D/agent.sock`, then copies bytes between its stdin/stdout (the SSH
//!   channel) and the daemon's socket.
//! - [`receive_code`]: `knob-agent receive-code --dest C`, unpacks a code archive from stdin.
//! - [`copy_code`]: `knob-agent copy-code --from C --to D`, copies an unpacked archive (the
//!   host's pristine cache) into an experiment's environment, where its trials run.
//!
//! The messages are `crate::agent_protocol`'s. Nothing here opens a TCP port except the NNI
//! trial channel on 127.0.0.1, and nothing connects back to the manager.

pub mod attach;
pub mod daemon;
pub mod event_log;
mod files;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use files::{copy_code, copy_tree};

use crate::agent_protocol::PROTOCOL_VERSION;
use crate::code_archive::{self, ArchiveLimits, CodeArchiveError, Unpacked};

/// The daemon's socket in its directory.
pub const SOCKET_FILE_NAME: &str = "agent.sock";
/// Held (flock) by the one daemon of a directory.
pub const LOCK_FILE_NAME: &str = "agent.lock";
/// The daemon's stderr when `attach` started it.
pub const LOG_FILE_NAME: &str = "agent.log";
/// How long the daemon runs trials with no service connected before it decides the manager is
/// gone, kills them and exits.
pub const DEFAULT_ORPHAN_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the daemon probes the host again while trials run.
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(5);

/// The crate's version, as `--version` and `Welcome.agent_version` give it.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");

/// `knob-agent --version`: the version, the protocol and the architecture, which the service
/// compares with its own before it uses an agent found on a host.
pub fn version_line() -> String {
    format!(
        "knob-agent {AGENT_VERSION} protocol {PROTOCOL_VERSION} {}",
        std::env::consts::ARCH
    )
}

pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_FILE_NAME)
}

/// What can go wrong in the agent, one line each.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("knob-agent: another daemon already serves {} (it holds {}); attach to it instead", dir.display(), dir.join(LOCK_FILE_NAME).display())]
    AlreadyServing { dir: PathBuf },
    #[error("knob-agent: {what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("knob-agent: cannot start running trials: {0}")]
    Pool(#[from] crate::trial_pool::PoolError),
    #[error("knob-agent: the daemon for {} did not start within {} s{cause}; the end of {}: {log_tail}", dir.display(), waited.as_secs(), dir.join(LOG_FILE_NAME).display())]
    DaemonDidNotStart {
        dir: PathBuf,
        waited: Duration,
        /// Empty, or what is known to stop it (`: ...`).
        cause: String,
        log_tail: String,
    },
    #[error("knob-agent: no daemon listens on {} (attach --no-start starts none)", dir.join(SOCKET_FILE_NAME).display())]
    NoDaemon { dir: PathBuf },
    #[error("knob-agent receive-code: {0}")]
    Code(#[from] CodeArchiveError),
    #[error("knob-agent copy-code: {0}")]
    CopyCode(CodeArchiveError),
}

impl AgentError {
    fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> AgentError {
        let path = path.to_path_buf();
        move |source| AgentError::Io { what, path, source }
    }
}

/// `receive-code`: unpacks the archive on `input` into `dest` (atomically; a complete `dest`
/// is left as it is).
pub fn receive_code(input: impl std::io::Read, dest: &Path) -> Result<Unpacked, AgentError> {
    Ok(code_archive::unpack(
        input,
        dest,
        &ArchiveLimits::default(),
    )?)
}

/// The last lines of a log file, joined with " | ", for a one-line error.
pub fn log_tail(path: &Path, lines: usize) -> String {
    last_lines(path, lines).unwrap_or_else(|| format!("{} is empty or missing", path.display()))
}

/// [`log_tail`], or `None` when the file is empty or missing.
pub fn last_lines(path: &Path, lines: usize) -> Option<String> {
    let text = crate::process::stderr_tail(path);
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    (!all.is_empty()).then(|| all[all.len().saturating_sub(lines)..].join(" | "))
}
