//! The trials running on this machine: one tokio runtime, one NNI HTTP channel server, one
//! metric-file watcher and the map of running trials. The `local` service and the knob-agent
//! daemon on a remote host both run their trials through a `TrialPool`, so a trial runs the same
//! way wherever it runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use knob_plugin_api::service::TrialRequest;

use crate::metrics::Emit;
use crate::nni_http::ChannelServer;
use crate::runner::{start_trial, TrialError, TrialHandle, TrialHost};
use crate::tail::FileWatcher;

/// `NNI_PLATFORM` of the trials (it makes `nni` 2.x use the file channel, which the pool reads).
pub const PLATFORM: &str = "local";

/// Why the pool could not start or could not start a trial.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{what}: {source}")]
    Startup {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("trial {0} is already running; trial ids must be unique")]
    DuplicateTrial(String),
    #[error("shut down; no trial can start")]
    ShutDown,
    #[error(transparent)]
    Trial(#[from] TrialError),
}

type RunningTrials = Arc<(Mutex<HashMap<String, TrialHandle>>, Condvar)>;

/// Runs trials on this machine on its own runtime; methods hand work to it and return at once,
/// except the ones that wait for trials to end.
pub struct TrialPool {
    runtime: Option<tokio::runtime::Runtime>,
    host: Arc<TrialHost>,
    running: RunningTrials,
    shut_down: AtomicBool,
}

impl TrialPool {
    /// `name` ("training service local", "knob-agent") starts the log lines it writes.
    pub fn new(name: &str, grace_period: Duration, emit: Emit) -> Result<TrialPool, PoolError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("knob-trials")
            .enable_all()
            .build()
            .map_err(|source| PoolError::Startup {
                what: "no async runtime",
                source,
            })?;
        let channels =
            ChannelServer::start(runtime.handle()).map_err(|source| PoolError::Startup {
                what: "cannot listen on 127.0.0.1 for the NNI trial channel",
                source,
            })?;
        let watcher = FileWatcher::new();
        if let Some(why) = watcher.unavailable() {
            knob_plugin_api::log::warn(&format!(
                "{name}: metric files are polled every {} ms, not watched ({why})",
                crate::tail::POLL_INTERVAL.as_millis()
            ));
        }
        Ok(TrialPool {
            runtime: Some(runtime),
            host: Arc::new(TrialHost {
                platform: PLATFORM.to_string(),
                grace_period,
                channels: Arc::new(channels),
                watcher: Arc::new(watcher),
                emit,
            }),
            running: Arc::default(),
            shut_down: AtomicBool::new(false),
        })
    }

    /// The runtime the trials run on, for callers that want to run their own tasks beside them.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        self.runtime
            .as_ref()
            .expect("the runtime lives as long as the pool")
            .handle()
    }

    /// Where the NNI v3 channel listens (127.0.0.1 and an ephemeral port).
    pub fn channel_address(&self) -> std::net::SocketAddr {
        self.host.channels.address()
    }

    pub fn grace_period(&self) -> Duration {
        self.host.grace_period
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Starts a trial. On `Err` nothing was started and no event follows for it.
    pub fn start(&self, request: &TrialRequest) -> Result<(), PoolError> {
        if self.is_shut_down() {
            return Err(PoolError::ShutDown);
        }
        let mut trials = self.running.0.lock().unwrap_or_else(|p| p.into_inner());
        if trials.contains_key(&request.trial_id) {
            return Err(PoolError::DuplicateTrial(request.trial_id.clone()));
        }
        let running = self.running.clone();
        let trial_id = request.trial_id.clone();
        let on_finished = Box::new(move || {
            let (trials, ended) = &*running;
            trials
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&trial_id);
            ended.notify_all();
        });
        // The map stays locked until the handle is in it, so `on_finished` cannot run first.
        let handle = start_trial(&self.host, self.runtime(), request, on_finished)?;
        trials.insert(request.trial_id.clone(), handle);
        Ok(())
    }

    /// Asks a running trial to stop; false when it is not running (already ended).
    pub fn kill(&self, trial_id: &str, reason: &str) -> bool {
        let trials = self.running.0.lock().unwrap_or_else(|p| p.into_inner());
        match trials.get(trial_id) {
            Some(handle) => {
                handle.kill(reason);
                true
            }
            None => false,
        }
    }

    /// The running trials and the pids of their process-group leaders, sorted by id.
    pub fn running(&self) -> Vec<(String, Option<u32>)> {
        let trials = self.running.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut running: Vec<(String, Option<u32>)> = trials
            .iter()
            .map(|(id, handle)| (id.clone(), handle.pid()))
            .collect();
        running.sort();
        running
    }

    /// Kills every running trial and waits until each has ended (its `TrialEnded` emitted), at
    /// most twice the grace period and five seconds more. Returns the trials not seen to end.
    pub fn kill_all_and_wait(&self, reason: &str) -> Vec<String> {
        let (trials, ended) = &*self.running;
        let mut trials = trials.lock().unwrap_or_else(|p| p.into_inner());
        for handle in trials.values() {
            handle.kill(reason);
        }
        let deadline = Instant::now() + self.host.grace_period * 2 + Duration::from_secs(5);
        while !trials.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let mut ids: Vec<String> = trials.keys().cloned().collect();
                ids.sort();
                return ids;
            }
            trials = ended
                .wait_timeout(trials, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Vec::new()
    }

    /// Refuses new trials, kills the running ones and waits for their ends (as
    /// [`kill_all_and_wait`](Self::kill_all_and_wait)), then closes the HTTP channel. Returns
    /// the trials not seen to end; a second call does nothing.
    pub fn stop(&self, reason: &str) -> Vec<String> {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return Vec::new();
        }
        let left = self.kill_all_and_wait(reason);
        self.host.channels.close();
        left
    }
}

impl Drop for TrialPool {
    fn drop(&mut self) {
        // Trials never outlive the pool that started them.
        self.stop("the trials' service is shutting down");
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_timeout(Duration::from_secs(1));
        }
    }
}
