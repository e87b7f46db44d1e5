//! The experiment store: one SQLite file per experiment, `<experiment dir>/experiment.db`,
//! holding an append-only event log from which the whole experiment is rebuilt.
//!
//! # Shape
//!
//! - **The log** is every [`StoreEvent`], each with a gapless sequence number ([`EventSeq`]) and a
//!   timestamp. Metrics, most of the volume, live in their own `metrics` table with typed
//!   columns; every other event is a row of `events` with its JSON payload. Both share one
//!   sequence. [`StoreReader::replay`] rebuilds an [`ExperimentState`] from the log alone.
//! - **Materialized tables** `experiment` and `trials` are updated in the same transaction as
//!   the event that changes them. They exist so that listing, paging and ranking trials (the
//!   CLI, the HTTP API, the progress bar) are indexed queries rather than a replay of a log of
//!   millions of metrics; being written in the event's own transaction, they can never
//!   disagree with the log at any committed moment. Replay never reads them.
//! - **Counters** (next event sequence, trial sequence, parameter id) are in a `counters` table
//!   updated in the transaction of the event that consumes an id, and are also derivable from
//!   the log; [`ExperimentState::counters`] takes the larger of the two, so ids never go back.
//! - **Versioning**: `PRAGMA application_id` marks the file as knob's, `meta.schema_version`
//!   says which schema it has; a newer schema is refused with [`StoreError::NewerSchema`].
//!
//! # Writing
//!
//! One writer thread owns the read-write connection. [`Store::append`] queues an event and
//! returns an [`Ack`] that resolves only after the transaction holding the event committed
//! (write before acting on it). The writer takes everything queued into one transaction (group
//! commit), so thousands of events a second share a handful of fsyncs while each caller still
//! learns when its own event is durable. [`Store::append_unacked`] queues without an ack;
//! [`Store::flush`] waits for everything queued before it, and reports a failed unacked event.
//!
//! Durability: WAL, `synchronous=NORMAL` (see `schema::open_for_writing`): an acknowledged
//! event survives a kill -9 or crash of knob; a power loss keeps the database consistent but
//! may lose its last events.
//!
//! Subscribers learn of commits without polling: [`Store::commits`] is a watch of the last
//! committed sequence number, updated after each commit and before that commit's acks.
//!
//! One writer per experiment: a second [`Store::open`] of the same directory, from this process
//! or another, fails with [`StoreError::Locked`] until the first store is dropped or its process
//! dies.

pub(crate) mod error;
mod event;
mod file;
mod reader;
mod schema;
mod state;
mod writer;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{oneshot, watch};

pub use error::{Rejection, StoreError};
pub use event::{
    Counters, Direction, EventRecord, EventSeq, ExperimentStatus, Lineage, MetricKind,
    MetricRecord, StoreEvent, TrialStatus,
};
pub use reader::{Attempts, ExperimentSummary, StoreReader, TrialQuery, TrialRow};
pub use state::{
    ConfigUpdate, ExperimentState, Requeue, StatusChange, Stopping, TrialAttempt, TrialEnd,
    TrialState, WarningRecord, CANCELED_WITH_FAILED_EXPERIMENT, STOPPED_WITH_EXPERIMENT,
};

pub(crate) use file::{StoreFile, StoreGone};
use schema::path_text;
pub(crate) use schema::LOCK_FILE_NAME;
pub(crate) use writer::now_ms;
// The simulator's check, and the manager recording an end its service never reported, ask
// the same question of a stop as the replay does.
pub(crate) use state::stopped_with_experiment;
use writer::{Command, SharedStats, Writer};

/// The store's file in an experiment directory.
pub const DB_FILE_NAME: &str = "experiment.db";

/// The file whose modification time the writer sets while it waits for events
/// ([`StoreOptions::alive_interval`]): after a crash (no last event says when the run died),
/// the last moment the run is known to have lived, so that `maxExperimentDuration` counts a
/// quiet stretch before a `kill -9` too ([`ExperimentState::last_alive_ms`]).
pub const ALIVE_FILE_NAME: &str = ".knob-alive";

/// Knobs of [`Store::open_with`]; [`Store::open`] uses the defaults.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long the writer waits for a lock held by another connection (someone's `sqlite3`
    /// shell, a backup) before failing a batch.
    pub busy_timeout: Duration,
    /// How long the writer waits with nothing to commit before it marks the run alive
    /// ([`ALIVE_FILE_NAME`]): a crash loses at most this much of the experiment's time budget.
    pub alive_interval: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            busy_timeout: Duration::from_secs(10),
            alive_interval: Duration::from_secs(5),
        }
    }
}

/// What the writer has done since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterStats {
    /// Committed transactions that wrote at least one event.
    pub transactions: u64,
    /// Events written (rejected ones excluded).
    pub events: u64,
}

/// The writing side of an experiment's store. Dropping it lets the writer commit what is
/// queued, then stops it; [`StoreHandle`]s left over then get [`StoreError::Closed`].
pub struct Store {
    handle: StoreHandle,
    dir: PathBuf,
    opened_counters: Counters,
    stats: Arc<SharedStats>,
    commits: watch::Receiver<EventSeq>,
    writer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.handle.path)
            .finish()
    }
}

/// The writer lock of an experiment's store (`experiment.db.writer-lock`, see
/// `schema::LOCK_FILE_NAME`): one writer per experiment. A [`Store`] holds it for as long as it
/// is open; `knob experiment delete` holds it while it removes the experiment's files
/// ([`crate::experiment::FolderHold`]), so that it never removes those of a run, nor a run
/// starts on half-removed ones. The OS lets go of it when its process dies.
pub struct WriterLock {
    /// Held, never used: the lock lives as long as this connection.
    _connection: rusqlite::Connection,
}

impl WriterLock {
    /// Takes the lock of the store in `experiment_dir` (making its lock file if need be), or
    /// fails with [`StoreError::Locked`] while another holder has it. Waits at most half a
    /// second, for another opener racing this one, never for a holder.
    pub fn take(experiment_dir: &Path) -> Result<WriterLock, StoreError> {
        let connection = schema::take_writer_lock(
            &experiment_dir.join(schema::LOCK_FILE_NAME),
            &experiment_dir.join(DB_FILE_NAME),
        )?;
        Ok(WriterLock {
            _connection: connection,
        })
    }
}

/// A cheap, cloneable way to append to a [`Store`] from any task or thread.
#[derive(Clone)]
pub struct StoreHandle {
    commands: mpsc::Sender<Command>,
    path: Arc<str>,
}

impl std::fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreHandle")
            .field("path", &self.path)
            .finish()
    }
}

impl Store {
    /// Opens `<experiment_dir>/experiment.db` for writing, creating the directory and the
    /// store as needed, and starts its writer thread.
    pub fn open(experiment_dir: &Path) -> Result<Store, StoreError> {
        Store::open_with(experiment_dir, StoreOptions::default())
    }

    pub fn open_with(experiment_dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        let path = experiment_dir.join(DB_FILE_NAME);
        std::fs::create_dir_all(experiment_dir).map_err(|e| StoreError::Open {
            path: path_text(&path),
            message: format!("cannot create the experiment directory: {e}"),
        })?;
        let lock = WriterLock::take(experiment_dir)?;
        Store::start(experiment_dir, lock, options)
    }

    /// Opens the store of an experiment that exists (`knob resume`) for writing: unlike
    /// [`Store::open`], it makes neither the folder nor a new store. `knob experiment delete`
    /// removes the store first, holding the writer lock; a store gone when the lock is ours was
    /// deleted meanwhile, and is an error here, not a new empty store in a folder made again.
    pub fn open_existing(experiment_dir: &Path) -> Result<Store, StoreError> {
        let path = experiment_dir.join(DB_FILE_NAME);
        let gone = || StoreError::Open {
            path: path_text(&path),
            message: "no such file: the experiment was deleted, or its folder moved, meanwhile"
                .to_string(),
        };
        if !path.is_file() {
            return Err(gone());
        }
        let lock = WriterLock::take(experiment_dir)?;
        if !path.is_file() {
            return Err(gone());
        }
        // Opened for writing, an empty file would get a new empty schema: refused as found.
        if path.metadata().is_ok_and(|metadata| metadata.len() == 0) {
            return Err(StoreError::Emptied {
                path: path_text(&path),
            });
        }
        Store::start(experiment_dir, lock, StoreOptions::default())
    }

    /// Opens the store, its writer lock held already, and starts its writer thread.
    fn start(
        experiment_dir: &Path,
        lock: WriterLock,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        let path = experiment_dir.join(DB_FILE_NAME);
        let connection = schema::open_for_writing(&path, options.busy_timeout)?;
        let read_counters = || -> rusqlite::Result<Counters> {
            Ok(schema::read_counters(&connection)?
                .at_least(schema::counters_from_log(&connection)?))
        };
        let counters = read_counters().map_err(|e| StoreError::Open {
            path: path_text(&path),
            message: error::one_line(&e),
        })?;
        let stats = Arc::new(SharedStats::default());
        let (committed, commits) = watch::channel(counters.next_event_seq.saturating_sub(1));
        let writer = Writer::new(
            connection,
            lock,
            path_text(&path),
            counters,
            stats.clone(),
            committed,
            options.alive_interval,
        )?;
        let (commands, receiver) = mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("knob-store-writer".to_string())
            .spawn(move || writer.run(receiver))
            .map_err(|e| StoreError::Open {
                path: path_text(&path),
                message: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Store {
            handle: StoreHandle {
                commands,
                path: path_text(&path).into(),
            },
            dir: experiment_dir.to_path_buf(),
            opened_counters: counters,
            stats,
            commits,
            writer: Some(writer),
        })
    }

    /// The database file.
    pub fn path(&self) -> &str {
        &self.handle.path
    }

    /// The counters as they were when the store was opened: where a resumed manager starts
    /// handing out trial sequences and parameter ids.
    pub fn opened_counters(&self) -> Counters {
        self.opened_counters
    }

    pub fn handle(&self) -> StoreHandle {
        self.handle.clone()
    }

    /// See [`StoreHandle::append`].
    pub fn append(&self, event: StoreEvent) -> Ack<EventSeq> {
        self.handle.append(event)
    }

    /// See [`StoreHandle::append_together`].
    pub fn append_together(&self, events: Vec<StoreEvent>) -> Ack<EventSeq> {
        self.handle.append_together(events)
    }

    /// See [`StoreHandle::append_unacked`].
    pub fn append_unacked(&self, event: StoreEvent) {
        self.handle.append_unacked(event);
    }

    /// See [`StoreHandle::flush`].
    pub fn flush(&self) -> Ack<()> {
        self.handle.flush()
    }

    /// The last committed event's sequence number (0 before the first), changing after each
    /// commit: what a live reader waits on instead of polling. By the time an event's [`Ack`]
    /// resolves, this holds its sequence number or a later one.
    pub fn commits(&self) -> watch::Receiver<EventSeq> {
        self.commits.clone()
    }

    /// A new read-only connection to this store.
    pub fn reader(&self) -> Result<StoreReader, StoreError> {
        StoreReader::open(&self.dir)
    }

    /// Flushes, then rebuilds the experiment from the log.
    pub fn replay(&self) -> Result<ExperimentState, StoreError> {
        self.flush().wait()?;
        self.reader()?.replay()
    }

    pub fn stats(&self) -> WriterStats {
        WriterStats {
            transactions: self.stats.transactions.load(Ordering::Relaxed),
            events: self.stats.events.load(Ordering::Relaxed),
        }
    }

    /// Commits everything queued, stops the writer and releases the writer lock. Dropping the
    /// store does the same but cannot report a failed unacked event.
    pub fn close(mut self) -> Result<(), StoreError> {
        let flushed = self.flush().wait();
        self.stop_writer();
        flushed
    }

    fn stop_writer(&mut self) {
        let _ = self.handle.commands.send(Command::Shutdown);
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.stop_writer();
    }
}

impl StoreHandle {
    /// The database file.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Queues `event`; the returned [`Ack`] resolves to its sequence number once the
    /// transaction holding it has committed, or to why it was not written.
    pub fn append(&self, event: StoreEvent) -> Ack<EventSeq> {
        let (ack, receiver) = oneshot::channel();
        self.send(Command::Append {
            event,
            ack: Some(ack),
        });
        Ack::new(receiver, &self.path)
    }

    /// Queues `events` to be committed in one transaction, so that a crash keeps all of them
    /// or none (a trial's attempt ended by its lost host and its requeue); the returned
    /// [`Ack`] answers for the last one, a refusal of another is reported by the next
    /// [`flush`](Self::flush).
    pub fn append_together(&self, events: Vec<StoreEvent>) -> Ack<EventSeq> {
        let (ack, receiver) = oneshot::channel();
        self.send(Command::AppendTogether { events, ack });
        Ack::new(receiver, &self.path)
    }

    /// Queues `event` without waiting to hear about it. A failure is reported by the next
    /// [`flush`](Self::flush).
    pub fn append_unacked(&self, event: StoreEvent) {
        self.send(Command::Append { event, ack: None });
    }

    /// Resolves once everything queued before it has committed; fails with the first failure
    /// of an unacked event since the last flush.
    pub fn flush(&self) -> Ack<()> {
        let (ack, receiver) = oneshot::channel();
        self.send(Command::Flush(ack));
        Ack::new(receiver, &self.path)
    }

    /// A send to a stopped writer drops the command and with it the ack's sender, so the
    /// [`Ack`] reports [`StoreError::Closed`].
    fn send(&self, command: Command) {
        let _ = self.commands.send(command);
    }
}

/// Resolves once the writer has committed (or failed) the request. `.await` it in async code,
/// or [`wait`](Ack::wait) on it from a plain thread.
#[must_use = "an ack tells whether the event is on disk; use append_unacked to not wait"]
pub struct Ack<T> {
    receiver: oneshot::Receiver<Result<T, StoreError>>,
    path: Arc<str>,
}

impl<T> std::fmt::Debug for Ack<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ack").field("path", &self.path).finish()
    }
}

impl<T> Ack<T> {
    fn new(receiver: oneshot::Receiver<Result<T, StoreError>>, path: &Arc<str>) -> Ack<T> {
        Ack {
            receiver,
            path: path.clone(),
        }
    }

    fn closed(&self) -> StoreError {
        StoreError::Closed {
            path: self.path.to_string(),
        }
    }

    /// Blocks this thread until the outcome is known. In async code, `.await` instead: this
    /// would hold a runtime worker.
    pub fn wait(self) -> Result<T, StoreError> {
        block_on(self)
    }

    /// The outcome if it is known already, without waiting.
    pub fn try_outcome(&mut self) -> Option<Result<T, StoreError>> {
        match self.receiver.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(oneshot::error::TryRecvError::Empty) => None,
            Err(oneshot::error::TryRecvError::Closed) => Some(Err(self.closed())),
        }
    }
}

impl<T> Future for Ack<T> {
    type Output = Result<T, StoreError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.receiver).poll(cx) {
            Poll::Ready(Ok(outcome)) => Poll::Ready(outcome),
            Poll::Ready(Err(_)) => Poll::Ready(Err(self.closed())),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Wakes a parked thread; enough of an executor to wait on one oneshot without a runtime
/// (tokio's `blocking_recv` panics inside one).
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}
