//! The test side of the agent protocol: `knob-agent attach` driven over its pipes, and a
//! temporary host directory.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use knob_plugin_api::service::{ServiceEvent, TrialRequest};
use knob_training_services::agent_protocol::{
    read_frame, write_frame, FromAgent, ToAgent, PROTOCOL_VERSION,
};

use crate::support::{process_runs, request, wait_for_line, WAIT};

pub const AGENT: &str = env!("CARGO_BIN_EXE_knob-agent");
pub const ENVIRONMENT: &str = "remote:root@127.0.0.1:2222";

/// One `knob-agent attach` with its stdin for messages and a thread reading its stdout.
pub struct Attached {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub incoming: mpsc::Receiver<FromAgent>,
    /// Every event received on this connection, in order.
    pub events: Vec<(u64, ServiceEvent)>,
    pub replies: Vec<(u64, Option<String>)>,
    /// `Inventory` messages (the host probed again); `next` skips them.
    pub inventories: Vec<knob_gpu_sched::Environment>,
}

impl Attached {
    pub fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Attached {
        Attached::start_from(Command::new(AGENT), dir, args, env)
    }

    /// `start` with `command` for the agent: another way of running its binary.
    pub fn start_from(
        mut command: Command,
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Attached {
        command
            .arg("attach")
            .arg("--dir")
            .arg(dir)
            .args(["--grace-period-secs", "0.5"])
            .args(if args.is_empty() {
                &["--orphan-timeout-secs", "30"][..]
            } else {
                args
            })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // The host's own knob folder (its lease ledger), not the user's running the tests;
        // `env` may name another.
        command.env("KNOB_HOME", dir.join("knob-home"));
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let (sender, incoming) = mpsc::channel();
        std::thread::spawn(move || {
            while let Ok(message) = read_frame::<FromAgent>(&mut stdout) {
                if sender.send(message).is_err() {
                    return;
                }
            }
        });
        Attached {
            stdin: child.stdin.take(),
            child,
            incoming,
            events: Vec::new(),
            replies: Vec::new(),
            inventories: Vec::new(),
        }
    }

    pub fn send(&mut self, message: &ToAgent) {
        write_frame(self.stdin.as_mut().unwrap(), message).unwrap();
    }

    pub fn hello(&mut self, last_seq: u64, fresh_start: bool) -> FromAgent {
        self.hello_as("manager:1:1", last_seq, fresh_start)
    }

    /// A hello from manager process `manager` (`<host>:<pid>:<ms>`).
    pub fn hello_as(&mut self, manager: &str, last_seq: u64, fresh_start: bool) -> FromAgent {
        self.send(&ToAgent::Hello {
            protocol: PROTOCOL_VERSION,
            experiment_id: "exp1".into(),
            environment_id: ENVIRONMENT.into(),
            last_seq,
            fresh_start,
            new_experiment: false,
            manager: manager.into(),
        });
        self.next()
    }

    /// The first hello of a run of `knob create` (`new_experiment`).
    pub fn hello_new_experiment(&mut self) -> FromAgent {
        self.send(&ToAgent::Hello {
            protocol: PROTOCOL_VERSION,
            experiment_id: "exp1".into(),
            environment_id: ENVIRONMENT.into(),
            last_seq: 0,
            fresh_start: true,
            new_experiment: true,
            manager: "manager:1:1".into(),
        });
        self.next()
    }

    /// The next message other than `Inventory`; panics after [`WAIT`].
    pub fn next(&mut self) -> FromAgent {
        loop {
            if let Some(message) = self.next_any() {
                return message;
            }
        }
    }

    /// The next message; `None` for an `Inventory` (recorded).
    pub fn next_any(&mut self) -> Option<FromAgent> {
        let message = self
            .incoming
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no message from the agent within {WAIT:?}"));
        match &message {
            FromAgent::Event { seq, event, .. } => self.events.push((*seq, event.clone())),
            FromAgent::Reply { id, error } => self.replies.push((*id, error.clone())),
            FromAgent::Inventory { inventory } => {
                self.inventories
                    .push(serde_json::from_value(inventory.clone()).unwrap());
                return None;
            }
            _ => {}
        }
        Some(message)
    }

    /// Reads messages until `done` holds for the events so far.
    pub fn until(&mut self, what: &str, done: impl Fn(&[(u64, ServiceEvent)]) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(&self.events) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; events: {:#?}",
                self.events
            );
            self.next();
        }
    }

    pub fn until_ended(&mut self, trial_id: &str) {
        self.until(&format!("trial {trial_id} to end"), |events| {
            events.iter().any(|(_, e)| is_end_of(e, trial_id))
        });
    }

    pub fn reply_to(&mut self, id: u64) -> Option<String> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some((_, error)) = self.replies.iter().find(|(i, _)| *i == id) {
                return error.clone();
            }
            assert!(Instant::now() < deadline, "no reply to request {id}");
            self.next();
        }
    }

    pub fn start_trial(&mut self, id: u64, request: TrialRequest, fresh_code_copy: bool) {
        self.send(&ToAgent::Start {
            id,
            request: Box::new(request),
            fresh_code_copy,
        });
        assert_eq!(self.reply_to(id), None);
    }

    /// Waits (bounded) for the attach process to exit; its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "attach did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the attach process, as a dropped SSH connection does.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn is_end_of(event: &ServiceEvent, trial_id: &str) -> bool {
    matches!(event, ServiceEvent::TrialEnded { trial_id: t, .. } if t == trial_id)
}

pub fn of_trial(events: &[(u64, ServiceEvent)], trial_id: &str) -> Vec<ServiceEvent> {
    events
        .iter()
        .map(|(_, e)| e.clone())
        .filter(|e| crate::support::trial_of(e) == Some(trial_id))
        .collect()
}

/// A daemon directory and a code directory in a temporary directory.
pub struct Host {
    pub root: tempfile::TempDir,
}

impl Host {
    pub fn new() -> Host {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("code")).unwrap();
        Host { root }
    }
    pub fn dir(&self) -> PathBuf {
        self.root.path().join("env")
    }
    pub fn code(&self) -> PathBuf {
        self.root.path().join("code")
    }
    pub fn trial_dir(&self, trial_id: &str) -> PathBuf {
        self.dir().join("trials").join(trial_id)
    }
    pub fn request(&self, trial_id: &str, command: &str) -> TrialRequest {
        TrialRequest {
            environment_id: ENVIRONMENT.into(),
            ..request(&self.code(), &self.trial_dir(trial_id), trial_id, command)
        }
    }
    pub fn attach(&self) -> Attached {
        Attached::start(&self.dir(), &[], &[])
    }
}

pub fn welcome_pid(welcome: &FromAgent) -> u32 {
    match welcome {
        FromAgent::Welcome { pid, .. } => *pid,
        other => panic!("expected a welcome, got {other:?}"),
    }
}

pub fn wait_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + WAIT;
    while process_runs(pid) {
        assert!(Instant::now() < deadline, "{what} (pid {pid}) still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn read_pid(path: &Path) -> i32 {
    wait_for_line(path).parse().unwrap()
}
