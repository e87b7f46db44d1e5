//! The messages between the `remote` training service (on the manager's machine) and a
//! `knob-agent` (on a remote host), and how they are framed on the SSH channel.
//!
//! The channel is the stdin/stdout of `knob-agent attach` run over SSH: nothing on the host
//! listens on a port, and the host never connects back to the manager. `attach` bridges the
//! channel to the host's long-lived agent daemon (`knob-agent serve`, one per experiment and
//! environment), which keeps running trials while the SSH connection is down.
//!
//! Framing: a 4-byte big-endian length, then that many bytes of JSON (one message). A frame
//! longer than [`MAX_FRAME_BYTES`] is a protocol error that ends the connection.
//!
//! Conversation:
//! 1. The service sends [`ToAgent::Hello`]; the agent answers [`FromAgent::Welcome`] (or
//!    [`FromAgent::Refused`] and closes).
//! 2. The agent then sends every buffered [`FromAgent::Event`] whose `seq` is greater than the
//!    hello's `last_seq`, in order, and goes on sending new ones as they happen. `seq` numbers
//!    the agent's events 1, 2, 3, ... for the daemon's whole life, across connections.
//! 3. The service acknowledges with [`ToAgent::Ack`] (events up to `seq` may be dropped from the
//!    agent's buffer). Unacknowledged events are kept, so a dropped connection loses nothing: the
//!    next hello's `last_seq` says where to resume.
//! 4. [`ToAgent::Ping`] every [`HEARTBEAT_INTERVAL`]; the agent answers [`FromAgent::Pong`]. A
//!    side that hears nothing (no message of any kind) for [`HEARTBEAT_TIMEOUT`] treats the
//!    connection as dropped.
//! 5. Requests carrying an `id` ([`ToAgent::Start`], [`ToAgent::Kill`]) get exactly one
//!    [`FromAgent::Reply`] with the same id. A start is idempotent per attempt (its
//!    `request.trial_dir`): one the daemon started already since the last fresh start is
//!    answered like the first, without running anything again. A start whose reply was lost
//!    with the connection is sent again after the next hello, which settles whether it runs.
//! 6. [`ToAgent::StandInLine`] (no reply): the manager's trials wait for resources; the agent
//!    takes (or renews) the experiment's place in the host's lease ledger for the GPUs other
//!    experiments hold there (see `crate::lease`), and sends a fresh [`FromAgent::Inventory`].
//!    [`ToAgent::LeaveLine`] (no reply): none of them waits any more; the agent drops that
//!    place at once, so that what it stood for goes to the other experiments now rather than
//!    when the place lapses.
//! 7. [`ToAgent::Shutdown`] is confirmed by [`FromAgent::ShutDown`], after the trials' ends; the
//!    daemon then closes the connection and exits. The service keeps the connection open until
//!    it has the confirmation (or gives up after a bound): closing right after sending the
//!    request could lose it, and leave the daemon running until its orphan timeout.
//!
//! Versioning: [`PROTOCOL_VERSION`] is compared in the hello; a mismatch is refused with a
//! message naming both versions. Fields may be added with serde defaults; none is removed
//! (the `time_ms` of [`FromAgent::Welcome`] and [`FromAgent::Event`] came so, without a bump:
//! where they are absent, events count as happening when they arrive).

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use knob_gpu_sched::{EnvironmentLimits, SchedulerConfig};
use knob_plugin_api::service::{ServiceEvent, TrialRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bumped when a message changes incompatibly.
/// 2: [`ToAgent::StandInLine`].
/// 3: a [`ToAgent::Start`] of an attempt (a trial folder) the daemon already started is
///    answered without starting it again, so the service may send a start whose reply was lost
///    once more; before, that ran the attempt twice.
/// 4: [`ToAgent::LeaveLine`].
pub const PROTOCOL_VERSION: u32 = 4;
/// The largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// How often the service pings.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// Silence after which a connection counts as dropped.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);

/// From the service to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToAgent {
    Hello {
        protocol: u32,
        experiment_id: String,
        /// The environment id the service gave this host ("remote:user@host:22").
        environment_id: String,
        /// The highest event `seq` the service has received from this daemon, 0 if none.
        last_seq: u64,
        /// True on the service's first connection in this manager process: trials a previous
        /// manager left running are killed (the core re-queues them, as it does locally) and
        /// the event buffer is cleared.
        fresh_start: bool,
        /// With `fresh_start`, on the first connection of a run of `knob create`: what the
        /// environment's folder holds (the code copy, trial folders) was left by an earlier
        /// experiment of the same id (deleted, or of another knob home), and is removed, so that
        /// the new experiment's trials do not start from what those trials changed.
        #[serde(default)]
        new_experiment: bool,
        /// Which manager process says hello (`<host>:<pid>:<start>`), or empty (unchecked). A
        /// daemon refuses another manager's hello while the one it serves was connected
        /// moments before: two experiments of the same id on one host's `agentRoot` took each
        /// other's connection turn about, and each fresh start killed the other's trials.
        #[serde(default)]
        manager: String,
    },
    /// Start one trial. `request.code_dir` and `request.trial_dir` are paths on the host.
    Start {
        id: u64,
        request: Box<TrialRequest>,
        /// `reuseMode: false`: copy `request.code_dir` into the trial's own directory and run
        /// there, so that no trial sees another's files.
        #[serde(default)]
        fresh_code_copy: bool,
    },
    Kill {
        id: u64,
        trial_id: String,
        reason: String,
    },
    Ack {
        seq: u64,
    },
    Ping {
        nonce: u64,
    },
    /// Kill every trial (reason "experiment stopped"), send their ends, then exit the daemon.
    Shutdown,
    /// Trials of the experiment wait for resources in the manager (its scheduler found no
    /// room): stand in the host ledger's line for the GPUs other experiments hold, so that one
    /// that refills them the moment it frees them cannot starve this one. Sent again while
    /// they wait (the standing request lapses after `ledger::STANDING_TTL` without it).
    StandInLine {
        /// What each of the experiment's trials asks for, and the host's limits as the service
        /// applies them (`gpuIndices` …): the agent stands in line only for GPUs the waiting
        /// trial may use and would fit on, never for one it could not use. `None` from a
        /// service that does not say: then for every GPU others hold, one trial's worth.
        #[serde(default)]
        demand: Option<SchedulerConfig>,
        #[serde(default)]
        limits: Option<EnvironmentLimits>,
    },
    /// None of the experiment's trials waits in the manager any more (the host's
    /// `ServiceRequest::NothingWaits`): leave the host ledger's line now. Without it the place
    /// kept what it stood for from other experiments until it lapsed (`ledger::STANDING_TTL`).
    LeaveLine,
}

/// From the agent to the service.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromAgent {
    Welcome {
        protocol: u32,
        /// `knob-agent --version`'s version.
        agent_version: String,
        /// `uname -n` of the host.
        hostname: String,
        /// The daemon's pid, for the log.
        pid: u32,
        /// The host's environment as `knob_gpu_sched::Environment` JSON (GPUs, CPUs, memory),
        /// from gpu-sched's probe on the host, with the environment id of the hello.
        inventory: Value,
        /// Trials the daemon is running now.
        running: Vec<String>,
        /// The host's clock (Unix ms) as the daemon answered: the service tells from it how far
        /// the host's clock is from its own, to read the events' `time_ms`. Absent from an
        /// agent before it (then events count as happening when they arrive).
        #[serde(default)]
        time_ms: Option<i64>,
    },
    Refused {
        message: String,
    },
    Event {
        seq: u64,
        event: ServiceEvent,
        /// When the daemon recorded the event, on the host's clock (Unix ms). An event replayed
        /// after a connection drop happened earlier than it arrives: a trial that ended while
        /// the host was unreachable is recorded with its own end, not the reconnection's time.
        #[serde(default)]
        time_ms: Option<i64>,
    },
    /// The host probed again (every few seconds while trials run, and after each trial ends).
    Inventory {
        inventory: Value,
    },
    Reply {
        id: u64,
        /// `None`: done. `Some`: why not, one line.
        error: Option<String>,
    },
    Pong {
        nonce: u64,
    },
    /// Every trial was stopped and its end sent, after a [`ToAgent::Shutdown`] (or a signal or
    /// the orphan timeout): the daemon closes the connection and exits. Added in protocol 1
    /// without a bump: an agent that does not send it leaves the service waiting for the
    /// connection to close, which ends the wait too.
    ShutDown,
}

/// Where things live on a host, under the agent's root directory (default `~/.knob`).
pub struct HostLayout {
    pub root: PathBuf,
}

impl HostLayout {
    /// Agent binaries, named by content hash: `bin/knob-agent-<hash>`.
    pub fn agent_binary(&self, hash: &str) -> PathBuf {
        self.root.join("bin").join(format!("knob-agent-{hash}"))
    }
    /// An unpacked trial code archive, named by content hash; complete once
    /// [`CODE_COMPLETE_MARKER`] exists in it. Shared by every experiment that uploads the same
    /// code, so no trial runs in it: they run in a copy ([`HostLayout::environment_code_dir`],
    /// or their own folder's with `reuseMode: false`).
    pub fn code_dir(&self, hash: &str) -> PathBuf {
        self.root.join("code").join(hash)
    }
    /// The copy of [`HostLayout::code_dir`] that the trials of one experiment's environment
    /// (under [`HostLayout::environment_dir`]) share and run in, `reuseMode: true`.
    pub fn environment_code_dir(environment_dir: &Path, hash: &str) -> PathBuf {
        environment_dir.join("code").join(hash)
    }
    /// The daemon of one experiment's environment: its socket, log and trials.
    pub fn environment_dir(&self, experiment_id: &str, environment_id: &str) -> PathBuf {
        let safe: String = environment_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.root.join("experiments").join(experiment_id).join(safe)
    }
}

/// This machine's clock, Unix milliseconds: the events' and the welcome's `time_ms`.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// Written last when a code archive is unpacked.
pub const CODE_COMPLETE_MARKER: &str = ".knob-code-complete";

/// What can go wrong reading a frame.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes is over the limit of {MAX_FRAME_BYTES}")]
    TooLarge(usize),
    #[error("malformed message: {0}")]
    Malformed(serde_json::Error),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Encodes one message as a frame.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let body = serde_json::to_vec(message).expect("protocol messages always serialize");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Writes one frame and flushes.
pub fn write_frame<T: Serialize>(out: &mut impl Write, message: &T) -> io::Result<()> {
    out.write_all(&encode(message))?;
    out.flush()
}

/// Reads one frame; `Closed` on a clean end of stream before a frame starts.
pub fn read_frame<T: for<'de> Deserialize<'de>>(input: &mut impl Read) -> Result<T, FrameError> {
    let mut header = [0u8; 4];
    match input.read_exact(&mut header) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    input.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(FrameError::Malformed)
}

/// The async twin of [`read_frame`].
pub async fn read_frame_async<T: for<'de> Deserialize<'de>>(
    input: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Result<T, FrameError> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; 4];
    match input.read_exact(&mut header).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    input.read_exact(&mut body).await?;
    serde_json::from_slice(&body).map_err(FrameError::Malformed)
}

/// The async twin of [`write_frame`].
pub async fn write_frame_async<T: Serialize>(
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    message: &T,
) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    out.write_all(&encode(message)).await?;
    out.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_limits_hold() {
        let messages = vec![
            ToAgent::Ping { nonce: 7 },
            ToAgent::Ack { seq: 3 },
            ToAgent::Shutdown,
        ];
        let mut bytes = Vec::new();
        for m in &messages {
            write_frame(&mut bytes, m).unwrap();
        }
        let mut input = bytes.as_slice();
        for m in &messages {
            assert_eq!(&read_frame::<ToAgent>(&mut input).unwrap(), m);
        }
        assert!(matches!(
            read_frame::<ToAgent>(&mut input),
            Err(FrameError::Closed)
        ));

        let huge = ((MAX_FRAME_BYTES + 1) as u32).to_be_bytes();
        assert!(matches!(
            read_frame::<ToAgent>(&mut huge.as_slice()),
            Err(FrameError::TooLarge(_))
        ));
        let mut garbage = 3u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"{x}");
        assert!(matches!(
            read_frame::<ToAgent>(&mut garbage.as_slice()),
            Err(FrameError::Malformed(_))
        ));
    }
}
