//! The trials running on this machine: one tokio runtime, one NNI HTTP channel server, one
//! metric-file watcher and the map of running trials. The `local` service and the knob-agent
//! daemon on a remote host both run their trials through a `TrialPool`, so a trial runs the same
//! way wherever it runs.
//!
//! With the machine's lease ledger ([`MachineLeases`]), a trial takes its lease before it
//! starts. One that must wait (another experiment's trial holds its GPU, or an older request
//! of another experiment is first in line) is *pending*: it stays WAITING in the core with the
//! ledger's reason as a `waiting: …` warning, its request is renewed every
//! [`LEASE_RETRY_INTERVAL`], and it starts as soon as it is granted. Its lease is given back
//! when it ends. A pool whose host places such a trial again ([`TrialPool::set_places_again`])
//! keeps none pending: it gives the trial back ([`Started::Refused`]), so that the host's
//! scheduler can put it on another free GPU instead of waiting for the one it chose, and so
//! that the trial counts against the experiment's `trialConcurrency` again until it starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use knob_plugin_api::service::{ServiceEvent, TrialRequest};

use crate::lease::{waiting_reason, MachineLeases};
use crate::metrics::Emit;
use crate::nni_http::ChannelServer;
use crate::runner::{start_trial, TrialError, TrialHandle, TrialHost};
use crate::tail::FileWatcher;

/// `NNI_PLATFORM` of the trials (it makes `nni` 2.x use the file channel, which the pool reads).
pub const PLATFORM: &str = "local";

/// How often a pending trial asks the ledger again: well within the ledger's request lifetime,
/// and what another experiment's freed GPU waits at most before this one takes it.
pub const LEASE_RETRY_INTERVAL: Duration = Duration::from_millis(500);

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

type RunningTrials = Arc<(Mutex<Runs>, Condvar)>;

/// The trials started here and not yet over.
#[derive(Default)]
struct Runs {
    /// Those that have not reached their end, by id: a kill reaches them, and a second start of
    /// the same id is refused. A run leaves just before its `TrialEnded` is emitted, so that a
    /// start sent on hearing of the end (the core's next attempt of the trial) is not refused.
    live: HashMap<String, TrialHandle>,
    /// Those whose `TrialEnded` has not been emitted yet, live or not: what a shutdown waits for.
    unfinished: usize,
}

/// What [`TrialPool::start`] did with a trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// It runs (its `TrialStarted` follows).
    Now,
    /// Its lease must wait: it is pending, and starts once granted.
    Pending,
    /// Its lease must wait, and the pool places trials again
    /// ([`TrialPool::set_places_again`]): nothing of it is kept here, nor in the ledger; why it
    /// was refused.
    Refused(String),
}

/// Trials waiting for their lease, with the last reason told to the core.
type PendingTrials = Arc<Mutex<BTreeMap<String, (TrialRequest, String)>>>;

/// Runs trials on this machine on its own runtime; methods hand work to it and return at once,
/// except the ones that wait for trials to end.
pub struct TrialPool {
    runtime: Option<tokio::runtime::Runtime>,
    host: Arc<TrialHost>,
    running: RunningTrials,
    shut_down: Arc<AtomicBool>,
    leases: Option<Arc<MachineLeases>>,
    pending: PendingTrials,
    /// A trial refused its lease is given back rather than kept pending (see [`Started`]).
    places_again: bool,
}

impl TrialPool {
    /// `name` ("training service local", "knob-agent") starts the log lines it writes.
    pub fn new(name: &str, grace_period: Duration, emit: Emit) -> Result<TrialPool, PoolError> {
        crate::process::raise_open_file_limit();
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
            shut_down: Arc::default(),
            leases: None,
            pending: Arc::default(),
            places_again: false,
        })
    }

    /// Whether a trial refused its lease is given back ([`Started::Refused`]) for its host to
    /// place again, rather than kept pending until the GPUs it was given are free: only a host
    /// that takes it back (`ServiceContext::places_again`) can put it elsewhere.
    pub fn set_places_again(&mut self, on: bool) {
        self.places_again = on;
    }

    /// Makes the pool take a lease in the machine's ledger for each trial (before any starts).
    pub fn use_leases(&mut self, leases: MachineLeases) {
        let leases = Arc::new(leases);
        self.leases = Some(leases.clone());
        let pool = PoolCore {
            host: self.host.clone(),
            runtime: self.runtime().clone(),
            running: self.running.clone(),
            leases: Some(leases),
            pending: self.pending.clone(),
            shut_down: self.shut_down.clone(),
        };
        let shut_down = self.shut_down.clone();
        let pending = self.pending.clone();
        self.runtime().spawn(async move {
            let mut tick = tokio::time::interval(LEASE_RETRY_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !shut_down.load(Ordering::SeqCst) {
                tick.tick().await;
                let waiting: Vec<String> = lock(&pending).keys().cloned().collect();
                if waiting.is_empty() {
                    continue;
                }
                let pool = pool.clone();
                // Ledger calls take a file lock: off the async workers.
                let _ = tokio::task::spawn_blocking(move || {
                    for trial_id in waiting {
                        pool.retry_pending(&trial_id);
                    }
                })
                .await;
            }
        });
    }

    /// The machine's ledger, when the pool uses one.
    pub fn leases(&self) -> Option<&MachineLeases> {
        self.leases.as_deref()
    }

    fn core(&self) -> PoolCore {
        PoolCore {
            host: self.host.clone(),
            runtime: self.runtime().clone(),
            running: self.running.clone(),
            leases: self.leases.clone(),
            pending: self.pending.clone(),
            shut_down: self.shut_down.clone(),
        }
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

    /// Starts a trial, or, when its lease must wait, keeps it pending until granted or gives
    /// it back (see [`Started`]). On `Err` or `Refused` nothing was started and no event
    /// follows for it.
    pub fn start(&self, request: &TrialRequest) -> Result<Started, PoolError> {
        if self.is_shut_down() {
            return Err(PoolError::ShutDown);
        }
        if lock(&self.pending).contains_key(&request.trial_id)
            || lock(&self.running.0).live.contains_key(&request.trial_id)
        {
            return Err(PoolError::DuplicateTrial(request.trial_id.clone()));
        }
        let core = self.core();
        match core.ask_lease(request) {
            Some(reason) if self.places_again => {
                // Its request leaves the ledger with it: the experiment keeps its place in line
                // by standing for the GPUs its waiting trials may use (`MachineLeases::annotate`).
                core.give_back(request);
                Ok(Started::Refused(reason))
            }
            Some(reason) => {
                core.tell_waiting(&request.trial_id, &reason);
                lock(&self.pending).insert(request.trial_id.clone(), (request.clone(), reason));
                Ok(Started::Pending)
            }
            None => core
                .start_now(request)
                .map(|()| Started::Now)
                .inspect_err(|_| {
                    core.give_back(request);
                }),
        }
    }

    /// Asks a running trial to stop; a pending one ends at once without having started.
    /// False when it is neither (already ended).
    pub fn kill(&self, trial_id: &str, reason: &str) -> bool {
        if let Some((request, _)) = lock(&self.pending).remove(trial_id) {
            self.core().end_pending(&request, reason);
            return true;
        }
        let runs = self.running.0.lock().unwrap_or_else(|p| p.into_inner());
        match runs.live.get(trial_id) {
            Some(handle) => {
                handle.kill(reason);
                true
            }
            None => false,
        }
    }

    /// The trials waiting for their lease, sorted by id.
    pub fn pending(&self) -> Vec<String> {
        lock(&self.pending).keys().cloned().collect()
    }

    /// The running trials and the pids of their process-group leaders, sorted by id.
    pub fn running(&self) -> Vec<(String, Option<u32>)> {
        let runs = self.running.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut running: Vec<(String, Option<u32>)> = runs
            .live
            .iter()
            .map(|(id, handle)| (id.clone(), handle.pid()))
            .collect();
        running.sort();
        running
    }

    /// Kills every running trial and waits until each has ended (its `TrialEnded` emitted), at
    /// most twice the grace period and five seconds more. Returns the trials not seen to end.
    pub fn kill_all_and_wait(&self, reason: &str) -> Vec<String> {
        let pending = std::mem::take(&mut *lock(&self.pending));
        for (request, _) in pending.into_values() {
            self.core().end_pending(&request, reason);
        }
        let (runs, ended) = &*self.running;
        let mut runs = runs.lock().unwrap_or_else(|p| p.into_inner());
        for handle in runs.live.values() {
            handle.kill(reason);
        }
        let deadline = Instant::now() + self.host.grace_period * 2 + Duration::from_secs(5);
        while runs.unfinished > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let mut ids: Vec<String> = runs.live.keys().cloned().collect();
                ids.sort();
                return ids;
            }
            runs = ended
                .wait_timeout(runs, left)
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What starting a trial needs, shared with the task that retries pending trials.
#[derive(Clone)]
struct PoolCore {
    host: Arc<TrialHost>,
    runtime: tokio::runtime::Handle,
    running: RunningTrials,
    leases: Option<Arc<MachineLeases>>,
    pending: PendingTrials,
    shut_down: Arc<AtomicBool>,
}

impl PoolCore {
    /// `Some(reason)` when the trial must wait for its lease. A ledger that cannot be used
    /// holds nothing back: the trial runs as if it were alone on the machine, with a warning.
    fn ask_lease(&self, request: &TrialRequest) -> Option<String> {
        let leases = self.leases.as_ref()?;
        if !MachineLeases::wants_lease(request) {
            return None;
        }
        match leases.acquire(request) {
            Ok(acquired) => waiting_reason(acquired),
            Err(e) => {
                (self.host.emit)(ServiceEvent::Warning {
                    trial_id: Some(request.trial_id.clone()),
                    message: format!(
                        "started without a lease, other experiments on this machine do not see it: {e}"
                    ),
                });
                None
            }
        }
    }

    fn give_back(&self, request: &TrialRequest) {
        // A trial that wants no lease never asked the ledger (see `ask_lease`), so it has
        // nothing there to give back. Releasing it anyway took the ledger's lock, read and
        // parsed its file and looked up every holder's process at each trial's end: about a
        // tenth of the trials' runtime's CPU in `trial_overhead.sh`.
        if !MachineLeases::wants_lease(request) {
            return;
        }
        if let Some(leases) = &self.leases {
            if let Err(e) = leases.release(&request.experiment_id, &request.trial_id) {
                knob_plugin_api::log::warn(&format!(
                    "trial {}: cannot give its lease back ({e}); a lease left in the ledger is reclaimed when this process ends",
                    request.trial_id
                ));
            }
        }
    }

    fn tell_waiting(&self, trial_id: &str, reason: &str) {
        (self.host.emit)(ServiceEvent::Warning {
            trial_id: Some(trial_id.to_string()),
            message: format!("waiting: {reason}"),
        });
    }

    fn start_now(&self, request: &TrialRequest) -> Result<(), PoolError> {
        let mut runs = lock(&self.running.0);
        if self.shut_down.load(Ordering::SeqCst) {
            return Err(PoolError::ShutDown);
        }
        if runs.live.contains_key(&request.trial_id) {
            return Err(PoolError::DuplicateTrial(request.trial_id.clone()));
        }
        let running = self.running.clone();
        let leased = self
            .leases
            .is_some()
            .then(|| (self.clone(), request.clone()));
        let trial_id = request.trial_id.clone();
        // Given back before the end is told, so the core's next trial finds the GPU free; and
        // no longer live, so the core's next attempt of this trial is not refused. The entry
        // is this run's: no other run of the id could start while it was live.
        let before_end = Box::new(move || {
            if let Some((core, request)) = leased {
                core.give_back(&request);
            }
            lock(&running.0).live.remove(&trial_id);
        });
        let running = self.running.clone();
        let on_finished = Box::new(move || {
            let (runs, ended) = &*running;
            lock(runs).unfinished -= 1;
            ended.notify_all();
        });
        // The runs stay locked until the handle is in them, so `before_end` cannot run first.
        let handle = start_trial(&self.host, &self.runtime, request, before_end, on_finished)?;
        let group = handle.pid();
        runs.live.insert(request.trial_id.clone(), handle);
        runs.unfinished += 1;
        drop(runs);
        if let (Some(leases), Some(group)) = (&self.leases, group) {
            if MachineLeases::wants_lease(request) {
                // So that the lease outlives this process (killed with SIGKILL) as long as the
                // trial does. A trial that ended meanwhile gave its lease back: nothing to mark.
                if let Err(e) = leases.record_process_group(request, group) {
                    knob_plugin_api::log::warn(&format!(
                        "trial {}: cannot record its process group in the lease ledger ({e}); if this process is killed, its GPUs may be given to another trial while it still runs",
                        request.trial_id
                    ));
                }
            }
        }
        Ok(())
    }

    /// Asks the ledger again for a pending trial; starts it once granted.
    fn retry_pending(&self, trial_id: &str) {
        let Some((request, told)) = lock(&self.pending).get(trial_id).cloned() else {
            return;
        };
        let answer = self.ask_lease(&request);
        let mut pending = lock(&self.pending);
        if !pending.contains_key(trial_id) {
            // Killed while the ledger was asked: what it may have granted goes back.
            drop(pending);
            self.give_back(&request);
            return;
        }
        match answer {
            Some(reason) => {
                if reason != told {
                    self.tell_waiting(trial_id, &reason);
                    pending.insert(trial_id.to_string(), (request, reason));
                }
            }
            None => {
                pending.remove(trial_id);
                drop(pending);
                if let Err(e) = self.start_now(&request) {
                    self.give_back(&request);
                    (self.host.emit)(ServiceEvent::TrialEnded {
                        trial_id: request.trial_id.clone(),
                        exit_code: None,
                        signal: None,
                        killed_reason: None,
                        stderr_tail: format!("could not start once its GPUs were free: {e}"),
                        ended_ms: None,
                        environment_lost: None,
                    });
                }
            }
        }
    }

    /// Ends a pending trial that never started (killed, or its service stops).
    fn end_pending(&self, request: &TrialRequest, reason: &str) {
        self.give_back(request);
        (self.host.emit)(ServiceEvent::TrialEnded {
            trial_id: request.trial_id.clone(),
            exit_code: None,
            signal: None,
            killed_reason: Some(reason.to_string()),
            stderr_tail: String::new(),
            ended_ms: None,
            environment_lost: None,
        });
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
