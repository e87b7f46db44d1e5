//! The connection to the knob-agent inside one Slurm job.
//!
//! The agent runs on a compute node; a Unix socket is only reachable on its own node, so the
//! service reaches it the way the `remote` service does over SSH: `srun --jobid=J --overlap
//! knob-agent attach --dir D` runs the attach bridge as a step of the job itself (no SSH, no
//! open port, works wherever `srun` does) and its stdin/stdout carry `agent_protocol` frames.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use crate::agent_protocol::{
    read_frame_async, write_frame_async, FromAgent, ToAgent, HEARTBEAT_INTERVAL, HEARTBEAT_TIMEOUT,
    PROTOCOL_VERSION,
};

/// How long the agent may take to welcome us.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the agent may take to answer a start or kill.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a request to the agent got no confirmation.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The agent answered with this refusal.
    #[error("{0}")]
    Refused(String),
    #[error("the connection to the agent closed")]
    Closed,
    /// The connection is open but no reply came within [`REPLY_TIMEOUT`].
    #[error("the agent did not answer within {} s", REPLY_TIMEOUT.as_secs())]
    NoAnswer,
}

/// A live connection; dropping the last handle ends the `srun` step.
pub struct Link {
    outgoing: mpsc::UnboundedSender<ToAgent>,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<(), RequestError>>>>,
    next_id: Mutex<u64>,
    child: Mutex<Option<Child>>,
    /// When the last frame of any kind came from the agent.
    last_heard: Mutex<tokio::time::Instant>,
}

/// What the agent said when it welcomed us.
pub struct Welcome {
    pub inventory: Value,
    pub running: Vec<String>,
    /// The daemon's host and pid: a different one after a reconnect is a new agent (the job
    /// was requeued and ran again), which knows nothing of the trials the old one ran.
    pub agent: (String, u32),
}

/// What the reader hands the service, in order; `Closed` is last.
pub enum Incoming {
    Message(FromAgent),
    Closed(String),
}

impl Link {
    /// Starts the bridge in job `job_id`, says hello and waits for the welcome.
    pub async fn connect(
        job_id: u64,
        agent: &Path,
        dir: &Path,
        experiment_id: &str,
        environment_id: &str,
        fresh_start: bool,
    ) -> Result<(Arc<Link>, Welcome, mpsc::UnboundedReceiver<Incoming>), String> {
        let mut srun = Command::new("srun");
        crate::process::remove_secret_variables(&mut srun);
        let mut child = srun
            .arg(format!("--jobid={job_id}"))
            // --unbuffered: slurmstepd otherwise holds a task's output until a newline, and
            // the protocol's frames are binary (a reply waited for the next heartbeat).
            .args([
                "--overlap",
                "--unbuffered",
                "--ntasks=1",
                "--nodes=1",
                "--quiet",
            ])
            .arg(agent)
            .arg("attach")
            .arg("--no-start")
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot run srun: {e} (is Slurm installed and on PATH?)"))?;
        let mut writer = child.stdin.take().expect("piped");
        let mut reader = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let stderr_text = Arc::new(Mutex::new(String::new()));
        {
            let stderr_text = stderr_text.clone();
            tokio::spawn(async move {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let mut text = lock(&stderr_text);
                    if text.len() < 4096 {
                        text.push_str(line.trim());
                        text.push(' ');
                    }
                }
            });
        }
        let said = |what: String| {
            let stderr = lock(&stderr_text).trim().to_string();
            if stderr.is_empty() {
                what
            } else {
                format!("{what}; srun said: {stderr}")
            }
        };
        let hello = ToAgent::Hello {
            protocol: PROTOCOL_VERSION,
            experiment_id: experiment_id.to_string(),
            environment_id: environment_id.to_string(),
            last_seq: 0,
            fresh_start,
            // A job's folder is made for it under the experiment's own, which a new experiment
            // makes anew; the job's script wrote files there already that the agent needs.
            new_experiment: false,
            // Each job has a folder of its own: no other manager shares its daemon.
            manager: String::new(),
        };
        write_frame_async(&mut writer, &hello)
            .await
            .map_err(|e| said(format!("cannot talk to the agent of job {job_id}: {e}")))?;
        let welcome = tokio::time::timeout(WELCOME_TIMEOUT, read_frame_async(&mut reader))
            .await
            .map_err(|_| said(format!("the agent of job {job_id} did not answer in time")))?
            .map_err(|e| said(format!("the agent of job {job_id} did not answer: {e}")))?;
        let welcome = match welcome {
            FromAgent::Welcome {
                protocol,
                inventory,
                running,
                hostname,
                pid,
                ..
            } if protocol == PROTOCOL_VERSION => Welcome {
                inventory,
                running,
                agent: (hostname, pid),
            },
            FromAgent::Welcome { protocol, .. } => {
                return Err(format!(
                    "the agent of job {job_id} speaks protocol {protocol}, this knob speaks {PROTOCOL_VERSION}"
                ))
            }
            FromAgent::Refused { message } => {
                return Err(format!("the agent of job {job_id} refused: {message}"))
            }
            other => {
                return Err(format!(
                    "the agent of job {job_id} did not welcome us: {other:?}"
                ))
            }
        };

        let (outgoing, mut to_write) = mpsc::unbounded_channel::<ToAgent>();
        tokio::spawn(async move {
            while let Some(message) = to_write.recv().await {
                if write_frame_async(&mut writer, &message).await.is_err() {
                    break;
                }
            }
        });
        let link = Arc::new(Link {
            outgoing,
            pending: Mutex::default(),
            next_id: Mutex::new(1),
            child: Mutex::new(Some(child)),
            last_heard: Mutex::new(tokio::time::Instant::now()),
        });
        let (incoming_tx, incoming) = mpsc::unbounded_channel();
        // Pings, since the daemon drops a client that is silent for its heartbeat timeout; and
        // the protocol's rule on this side: an agent not heard from for as long (a stalled
        // `srun`, a node that stopped answering) is a connection lost, which the monitor then
        // connects again. The reader alone would not tell: a stalled stream never closes.
        {
            let link = Arc::downgrade(&link);
            let incoming_tx = incoming_tx.clone();
            tokio::spawn(async move {
                let mut nonce = 0;
                loop {
                    tokio::time::sleep(HEARTBEAT_INTERVAL).await;
                    let Some(link) = link.upgrade() else { return };
                    if lock(&link.last_heard).elapsed() > HEARTBEAT_TIMEOUT {
                        let why = format!(
                            "no answer from the agent for {} s",
                            HEARTBEAT_TIMEOUT.as_secs()
                        );
                        let _ = incoming_tx.send(Incoming::Closed(why));
                        link.fail_pending();
                        link.close();
                        return;
                    }
                    nonce += 1;
                    if link.outgoing.send(ToAgent::Ping { nonce }).is_err() {
                        return;
                    }
                }
            });
        }
        {
            let link = Arc::downgrade(&link);
            tokio::spawn(async move {
                loop {
                    let frame = read_frame_async::<FromAgent>(&mut reader).await;
                    if frame.is_ok() {
                        if let Some(link) = link.upgrade() {
                            *lock(&link.last_heard) = tokio::time::Instant::now();
                        }
                    }
                    match frame {
                        Ok(FromAgent::Reply { id, error }) => {
                            if let Some(link) = link.upgrade() {
                                if let Some(reply) = lock(&link.pending).remove(&id) {
                                    let _ = reply.send(match error {
                                        None => Ok(()),
                                        Some(why) => Err(RequestError::Refused(why)),
                                    });
                                }
                            }
                        }
                        Ok(FromAgent::Event {
                            seq,
                            event,
                            time_ms,
                        }) => {
                            if let Some(link) = link.upgrade() {
                                let _ = link.outgoing.send(ToAgent::Ack { seq });
                            }
                            let message = FromAgent::Event {
                                seq,
                                event,
                                time_ms,
                            };
                            if incoming_tx.send(Incoming::Message(message)).is_err() {
                                return;
                            }
                        }
                        Ok(FromAgent::Pong { .. }) => {}
                        Ok(message) => {
                            if incoming_tx.send(Incoming::Message(message)).is_err() {
                                return;
                            }
                        }
                        Err(e) => {
                            if let Some(link) = link.upgrade() {
                                link.fail_pending();
                            }
                            let _ = incoming_tx.send(Incoming::Closed(e.to_string()));
                            return;
                        }
                    }
                }
            });
        }
        Ok((link, welcome, incoming))
    }

    fn fail_pending(&self) {
        let pending: Vec<_> = lock(&self.pending).drain().collect();
        for (_, reply) in pending {
            let _ = reply.send(Err(RequestError::Closed));
        }
    }

    /// Sends a request and waits for its reply.
    pub async fn request(&self, make: impl FnOnce(u64) -> ToAgent) -> Result<(), RequestError> {
        let id = {
            let mut next = lock(&self.next_id);
            *next += 1;
            *next
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        lock(&self.pending).insert(id, reply_tx);
        if self.outgoing.send(make(id)).is_err() {
            lock(&self.pending).remove(&id);
            return Err(RequestError::Closed);
        }
        match tokio::time::timeout(REPLY_TIMEOUT, reply_rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(RequestError::Closed),
            Err(_) => {
                lock(&self.pending).remove(&id);
                Err(RequestError::NoAnswer)
            }
        }
    }

    /// Sends a message that has no reply (shutdown).
    pub fn send(&self, message: ToAgent) {
        let _ = self.outgoing.send(message);
    }

    /// Ends the `srun` step (the agent keeps running in its job).
    pub fn close(&self) {
        if let Some(mut child) = lock(&self.child).take() {
            let _ = child.start_kill();
            tokio::spawn(async move {
                let _ = child.wait().await;
            });
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if let Some(mut child) = lock(&self.child).take() {
            let _ = child.start_kill();
        }
    }
}
