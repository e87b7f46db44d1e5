//! Notifications (`notifications:` in the config): a webhook and mail when an experiment ends
//! DONE, ERROR or STOPPED (with a summary: trial counts, the best trials and their parameters,
//! the duration, the dashboard's URL), and if asked on each new best and after N failed trials
//! in a row.
//!
//! Decision: the notifier follows the store, not the manager. It reads the committed event log
//! on a thread of its own, woken by [`Store::commits`](crate::store::Store::commits), as the
//! API's event stream does, so the manager's loop neither waits for it nor knows it exists, and
//! what it reports is what was recorded (the bests are `StoreReader::best_trials`, the same query
//! as every other view). Each sink has its own sending thread and queue: a slow mail server does
//! not hold up the webhook, and a failed send is retried with back-off ([`Retry`]), then logged;
//! it never touches the experiment. The end of the experiment goes before what is still queued
//! for a sink that does not answer ([`EARLIER_MESSAGES_AFTER_THE_END`]).

mod message;
pub mod sinks;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use message::Summary;
pub use message::{Notification, NEW_BEST};
pub use sinks::{Sink, SEND_TIMEOUT};

use crate::config::NotificationsConfig;
use crate::store::{EventSeq, ExperimentStatus, StoreEvent, StoreReader, TrialStatus};

/// Where the notifier's own problems go (a send that failed for good, a store it cannot read):
/// the CLI prints them as warnings, to the terminal or the detached run's log.
pub type Log = Arc<dyn Fn(String) + Send + Sync>;

/// How often a failed send is tried again, and how long the waits between tries are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Tries in all, the first included (at least 1).
    pub attempts: u32,
    /// The wait after the first failure; each later wait doubles it ([`crate::backoff`]).
    pub first_delay: Duration,
}

impl Default for Retry {
    /// 4 tries over about 7 s (1 s, 2 s, 4 s between them): enough for a server that restarts
    /// or a network that blinks, short enough that the DONE message of an ending `knob create`
    /// is not held for long by a server that is gone.
    fn default() -> Retry {
        Retry {
            attempts: 4,
            first_delay: Duration::from_secs(1),
        }
    }
}

/// What the notifier knows about the experiment besides its store.
#[derive(Debug, Clone)]
pub struct ExperimentContext {
    pub experiment_id: String,
    pub dir: PathBuf,
    /// Which way "best" goes, and which results may be it.
    pub ranking: crate::objectives::Ranking,
    /// Where the dashboard of the running experiment is served.
    pub dashboard_url: Option<String>,
}

/// How long after the end of the experiment reached a sink's queue the messages queued before
/// it may still start (in order, one try each, while the sink answers); then the end goes
/// first. Why 5 s: the end's own tries take at most 4 × [`SEND_TIMEOUT`] plus 7 s of back-off
/// (67 s), and must fit, after a try already under way (up to [`SEND_TIMEOUT`]) and one more
/// begun within this time, in the 90 s `knob create`/`resume` waits for the end.
pub const EARLIER_MESSAGES_AFTER_THE_END: Duration = Duration::from_secs(5);

/// The running notifier of one experiment: a thread following the store and one sending thread
/// per sink.
pub struct Notifier {
    threads: Vec<JoinHandle<()>>,
    /// Each sink's name, and whether it is done with the end of the experiment's message (sent,
    /// or failed every try, which is logged).
    sinks: Vec<(String, Arc<AtomicBool>)>,
    /// The end of the experiment's subject, once the follower queued it.
    end_subject: Arc<Mutex<Option<String>>>,
    /// Tells the follower, once the store has closed without recording an end, whether the run
    /// ended in a way the store could not record ([`Notifier::end_unrecorded`]); sent once.
    last_word: Option<mpsc::Sender<UnrecordedEnd>>,
}

/// An end of the run the store could not record (its files deleted or moved, its disk full):
/// the status and why, or `None` when there was none.
type UnrecordedEnd = Option<(ExperimentStatus, String)>;

/// The end of the experiment's message that some sinks have not taken yet: what a wait for the
/// notifications that is cut short leaves unsent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndNotDelivered {
    pub subject: String,
    /// The sinks' names ([`Sink::name`]).
    pub sinks: Vec<String>,
}

impl std::fmt::Display for EndNotDelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the end message {:?} was not delivered to {}",
            self.subject,
            self.sinks.join(", ")
        )
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl Notifier {
    /// Starts following the experiment's store from its last committed event (`commits`, from
    /// the store the manager writes), on threads of its own; `runtime` is the runtime the store's
    /// commits are signalled on. A sink that cannot be built is logged and left out.
    pub fn start(
        config: &NotificationsConfig,
        context: ExperimentContext,
        mut commits: watch::Receiver<EventSeq>,
        retry: Retry,
        log: Log,
    ) -> Notifier {
        let mut queues = Vec::new();
        let mut threads = Vec::new();
        let mut sink_ends = Vec::new();
        let end_subject = Arc::new(Mutex::new(None));
        for sink in sinks::sinks(config) {
            let sink = match sink {
                Ok(sink) => sink,
                Err((name, error)) => {
                    log(format!("notifications: {name} is off: {error}"));
                    continue;
                }
            };
            let (queue, inbox) = mpsc::channel::<Notification>();
            let sender_log = log.clone();
            let name = sink.name();
            let end_done = Arc::new(AtomicBool::new(false));
            let sender_end_done = end_done.clone();
            let spawned = std::thread::Builder::new()
                .name("knob-notify-send".into())
                .spawn(move || send_all(&sink, &inbox, retry, &sender_log, &sender_end_done));
            match spawned {
                Ok(thread) => {
                    queues.push(queue);
                    threads.push(thread);
                    sink_ends.push((name, end_done));
                }
                Err(error) => log(format!(
                    "notifications: cannot start a sending thread: {error}"
                )),
            }
        }
        // Read here, not on the thread: what the manager commits from now on is news.
        let from = *commits.borrow_and_update();
        let (last_word, last_word_inbox) = mpsc::channel::<UnrecordedEnd>();
        let follower = Follower {
            rules: Rules {
                new_best: config.new_best,
                failures_in_a_row: config.failures_in_a_row,
            },
            context,
            queues,
            end_subject: end_subject.clone(),
            log: log.clone(),
            failed_in_a_row: Vec::new(),
            best: None,
            ended: false,
        };
        let spawned = std::thread::Builder::new()
            .name("knob-notify-follow".into())
            .spawn(move || follower.follow(commits, from, &last_word_inbox));
        match spawned {
            Ok(thread) => threads.insert(0, thread),
            Err(error) => log(format!(
                "notifications: cannot start following the experiment: {error}"
            )),
        }
        Notifier {
            threads,
            sinks: sink_ends,
            end_subject,
            last_word: Some(last_word),
        }
    }

    /// The run ended (`status`, `message`) without its store recording it: the end's message
    /// goes out all the same, from what the store holds. Call once the run is over, before
    /// [`Notifier::finish`]; without it the follower, the store closed, ends as it was.
    pub fn end_unrecorded(&mut self, status: ExperimentStatus, message: String) {
        if let Some(last_word) = self.last_word.take() {
            let _ = last_word.send(Some((status, message)));
        }
    }

    /// The end of the experiment's message and the sinks still sending it (not yet sent, nor
    /// failed at for good, which is logged); `None` when there are none, or it was never queued.
    pub fn end_not_delivered(&self) -> Option<EndNotDelivered> {
        let subject = self.end_subject.lock().ok()?.clone()?;
        let sinks: Vec<String> = self
            .sinks
            .iter()
            .filter(|(_, done)| !done.load(Ordering::SeqCst))
            .map(|(name, _)| name.clone())
            .collect();
        (!sinks.is_empty()).then_some(EndNotDelivered { subject, sinks })
    }

    /// Waits until every notification of the experiment went out (or failed for good), at most
    /// `within`: after the store was closed, which ends the following. Returns whether all
    /// threads ended in time; those that did not are left to the process's exit.
    pub fn finish(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while !self.finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Whether every notification went out (or failed for good), without waiting: for a
    /// caller that waits on other things too (a stop signal). Call after the store was closed.
    pub fn finished(&mut self) -> bool {
        // No end the store could not record, unless said before.
        if let Some(last_word) = self.last_word.take() {
            let _ = last_word.send(None);
        }
        // The follower first: its end drops the queues, which ends the sending threads.
        while let Some(first) = self.threads.first() {
            if !first.is_finished() {
                return false;
            }
            let _ = self.threads.remove(0).join();
        }
        true
    }
}

/// The sending thread of one sink: everything queued, in order, until the queue closes.
///
/// Three rules keep a sink that is down from holding the end of the experiment for long: a new
/// best followed by a newer one still queued is not sent (it is stale); after a message failed
/// every try, the next ones get one try each until one goes through — except the end of the
/// experiment, the message that matters most, which always gets every try; and the end goes
/// first. Once it is queued, a message being tried gets no more tries, and those queued before
/// the end get one try each, in order, only while the sink answers and only for
/// [`EARLIER_MESSAGES_AFTER_THE_END`]; the rest are dropped with one line. A strict queue gave
/// the end its first try 83 s after the end, behind a stuck sink's earlier messages, when
/// `knob create` waits 90 s. `end_done` is set once the end is sent or failed every try.
fn send_all(
    sink: &Sink,
    inbox: &mpsc::Receiver<Notification>,
    retry: Retry,
    log: &Log,
    end_done: &AtomicBool,
) {
    let mut queued = VecDeque::new();
    let mut down = false;
    // When the end of the experiment was first seen in the queue.
    let mut end_seen: Option<Instant> = None;
    loop {
        if queued.is_empty() {
            match inbox.recv() {
                Ok(notification) => queued.push_back(notification),
                Err(mpsc::RecvError) => return,
            }
        }
        queued.extend(inbox.try_iter());
        if let Some(end_at) = queued.iter().position(Notification::ends_experiment) {
            let seen = *end_seen.get_or_insert_with(Instant::now);
            if end_at > 0 && (down || seen.elapsed() >= EARLIER_MESSAGES_AFTER_THE_END) {
                let mut dropped: Vec<Notification> = queued.drain(..end_at).collect();
                // Stale new bests (a newer one after them) were never to be sent: not named.
                let last_best = dropped.iter().rposition(|n| n.event == NEW_BEST);
                let mut index = 0;
                dropped.retain(|notification| {
                    index += 1;
                    notification.event != NEW_BEST || Some(index - 1) == last_best
                });
                log(format!(
                    "notifications: {} to {} not sent: the experiment ended, and its end message goes first",
                    subjects(&dropped),
                    sink.name()
                ));
            }
        }
        let Some(notification) = queued.pop_front() else {
            continue;
        };
        let stale = notification.event == NEW_BEST
            && queued
                .iter()
                .any(|later: &Notification| later.event == NEW_BEST);
        if stale {
            continue;
        }
        let ends_experiment = notification.ends_experiment();
        let this_time = if (down || end_seen.is_some()) && !ends_experiment {
            Retry {
                attempts: 1,
                ..retry
            }
        } else {
            retry
        };
        // Between the tries of an earlier message, the end's arrival ends its tries.
        let mut end_arrived = false;
        let mut pause = |pause: Duration| {
            if ends_experiment {
                std::thread::sleep(pause);
                return true;
            }
            end_arrived = wait_for_the_end(inbox, pause, &mut queued);
            !end_arrived
        };
        let result = send_with_tries(sink, &notification, this_time, &mut pause);
        if ends_experiment {
            end_done.store(true, Ordering::SeqCst);
        }
        match result {
            Ok(()) => down = false,
            Err((error, tries)) => {
                down = true;
                let cut = if end_arrived {
                    "; the experiment ended, and its end message goes first"
                } else {
                    ""
                };
                log(format!(
                    "notifications: {:?} to {} not sent ({tries} {}): {error}{cut}",
                    notification.subject,
                    sink.name(),
                    if tries == 1 { "try" } else { "tries" },
                ));
            }
        }
    }
}

/// Waits `pause` for messages, queueing them; true (at once) when the end of the experiment
/// arrives.
fn wait_for_the_end(
    inbox: &mpsc::Receiver<Notification>,
    pause: Duration,
    queued: &mut VecDeque<Notification>,
) -> bool {
    let until = Instant::now() + pause;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        match inbox.recv_timeout(left) {
            Ok(notification) => {
                let ends = notification.ends_experiment();
                queued.push_back(notification);
                if ends {
                    return true;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return false,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                std::thread::sleep(left);
                return false;
            }
        }
    }
}

/// Up to three subjects, quoted, and how many more.
fn subjects(notifications: &[Notification]) -> String {
    const SHOWN: usize = 3;
    let mut text = notifications
        .iter()
        .take(SHOWN)
        .map(|notification| format!("{:?}", notification.subject))
        .collect::<Vec<_>>()
        .join(", ");
    if notifications.len() > SHOWN {
        text.push_str(&format!(" and {} more", notifications.len() - SHOWN));
    }
    text
}

/// Sends one notification to one sink, trying again on failure; the last error if every try
/// failed.
pub fn send_with_retry(
    sink: &Sink,
    notification: &Notification,
    retry: Retry,
) -> Result<(), String> {
    let mut sleep = |pause| {
        std::thread::sleep(pause);
        true
    };
    send_with_tries(sink, notification, retry, &mut sleep).map_err(|(error, _)| error)
}

/// [`send_with_retry`], with `pause` for the back-off: it returns false to give up. The last
/// error and the number of tries made if none went through.
fn send_with_tries(
    sink: &Sink,
    notification: &Notification,
    retry: Retry,
    pause: &mut dyn FnMut(Duration) -> bool,
) -> Result<(), (String, u32)> {
    let mut tries = 0;
    loop {
        tries += 1;
        match sink.send(notification) {
            Ok(()) => return Ok(()),
            Err(error) if tries >= retry.attempts.max(1) => return Err((error, tries)),
            Err(error) => {
                let wait = crate::backoff::doubling(retry.first_delay, tries, Duration::MAX);
                if !pause(wait) {
                    return Err((error, tries));
                }
            }
        }
    }
}

/// `knob notify test`: one test message to each sink of `config`, one try each; each sink's name
/// with `Ok` or its error.
pub fn send_test(config: &NotificationsConfig, source: &str) -> Vec<(String, Result<(), String>)> {
    let notification = Notification::test(source);
    // Side by side: a sink that does not answer takes SEND_TIMEOUT, and the others need not
    // wait for it.
    std::thread::scope(|scope| {
        let sends: Vec<_> = sinks::sinks(config)
            .into_iter()
            .map(|sink| {
                let notification = &notification;
                scope.spawn(move || match sink {
                    Ok(sink) => (sink.name(), sink.send(notification)),
                    Err((name, error)) => (name, Err(error)),
                })
            })
            .collect();
        sends
            .into_iter()
            .map(|send| {
                send.join()
                    .unwrap_or_else(|_| ("a sink".to_owned(), Err("its send panicked".into())))
            })
            .collect()
    })
}

#[derive(Debug, Clone, Copy)]
struct Rules {
    new_best: bool,
    failures_in_a_row: u32,
}

struct Follower {
    rules: Rules,
    context: ExperimentContext,
    queues: Vec<mpsc::Sender<Notification>>,
    /// [`Notifier::end_subject`].
    end_subject: Arc<Mutex<Option<String>>>,
    log: Log,
    /// The trials (id, end message) that failed since the last trial that did not fail.
    failed_in_a_row: Vec<(String, Option<String>)>,
    /// The best trial and its value, as last seen.
    best: Option<(String, f64)>,
    ended: bool,
}

/// Events read from the log per query: bounded reads on a long log.
const EVENTS_PER_READ: u64 = 1000;

impl Follower {
    fn follow(
        mut self,
        mut commits: watch::Receiver<EventSeq>,
        from: EventSeq,
        last_word: &mpsc::Receiver<UnrecordedEnd>,
    ) {
        // Only to wait on the watch channel, which needs no driver.
        let runtime = match tokio::runtime::Builder::new_current_thread().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                (self.log)(format!(
                    "notifications are off: cannot wait for the store: {error}"
                ));
                return;
            }
        };
        let reader = match StoreReader::open(&self.context.dir) {
            Ok(reader) => reader,
            Err(error) => {
                (self.log)(format!("notifications are off: {error}"));
                return;
            }
        };
        let mut last = from;
        // A resumed experiment's best so far is not news.
        self.best = reader
            .best_trials(&self.context.ranking, 1)
            .ok()
            .and_then(|best| best.into_iter().next())
            .and_then(|trial| Some((trial.trial_id, trial.final_value?)));
        loop {
            // The store's writer drops its end after the last commit: then read what is left.
            let closed = runtime.block_on(commits.changed()).is_err();
            loop {
                let records = match reader.events_since(last, EVENTS_PER_READ) {
                    Ok(records) => records,
                    Err(error) => {
                        (self.log)(format!("notifications stopped: {error}"));
                        return;
                    }
                };
                let Some(newest) = records.last().map(|record| record.seq) else {
                    break;
                };
                for record in records {
                    self.on_event(&reader, record.time_ms, &record.event);
                }
                last = newest;
            }
            if self.ended {
                return;
            }
            if closed {
                // The store closed without an end: one it could not record (its files
                // deleted, say) is sent from what it holds, with the reason the run gave.
                if let Ok(Some((status, message))) = last_word.recv() {
                    self.end(&reader, status, Some(message), crate::store::now_ms());
                }
                return;
            }
        }
    }

    /// The end of the experiment's message, queued for every sink.
    fn end(
        &mut self,
        reader: &StoreReader,
        status: ExperimentStatus,
        message: Option<String>,
        time_ms: i64,
    ) {
        self.ended = true;
        match Summary::read(reader, &self.context, status, message, time_ms) {
            Ok(summary) => {
                let notification = Notification::ended(&self.context, &summary);
                if let Ok(mut subject) = self.end_subject.lock() {
                    *subject = Some(notification.subject.clone());
                }
                self.send(notification);
            }
            Err(error) => (self.log)(format!(
                "notifications: cannot read the experiment's summary: {error}"
            )),
        }
    }

    fn send(&self, notification: Notification) {
        for queue in &self.queues {
            let _ = queue.send(notification.clone());
        }
    }

    /// A trial succeeded: a new best is announced when the best trial now beats the one last
    /// announced. A tie changes which trial is the best (the earlier one,
    /// `objectives::best_first`) but is no news.
    fn on_success(&mut self, reader: &StoreReader) {
        let best = reader
            .best_trials(&self.context.ranking, 1)
            .ok()
            .and_then(|best| best.into_iter().next());
        let Some(trial) = best else { return };
        let Some(value) = trial.final_value else {
            return;
        };
        let news = match &self.best {
            None => true,
            Some((id, known)) => *id != trial.trial_id && value != *known,
        };
        self.best = Some((trial.trial_id.clone(), value));
        if news {
            self.send(Notification::new_best(&self.context, &trial));
        }
    }

    fn on_event(&mut self, reader: &StoreReader, time_ms: i64, event: &StoreEvent) {
        match event {
            StoreEvent::TrialEnded {
                trial_id,
                status,
                message,
                ..
            } => match status {
                TrialStatus::Failed => {
                    self.failed_in_a_row
                        .push((trial_id.clone(), message.clone()));
                    let wanted = self.rules.failures_in_a_row as usize;
                    // Once per run of failures, when it reaches the number.
                    if wanted > 0 && self.failed_in_a_row.len() == wanted {
                        let notification =
                            Notification::failures_in_a_row(&self.context, &self.failed_in_a_row);
                        self.send(notification);
                    }
                }
                TrialStatus::Succeeded => {
                    self.failed_in_a_row.clear();
                    // A trial becomes the best as it succeeds (`objectives::Ranking`), not as
                    // its final arrives: one that then fails or is killed is never announced.
                    if self.rules.new_best {
                        self.on_success(reader);
                    }
                }
                TrialStatus::EarlyStopped => {
                    self.failed_in_a_row.clear();
                }
                // A trial killed by the user or the system says nothing about the trial code.
                _ => {}
            },
            StoreEvent::ExperimentStatusChanged {
                status, message, ..
            } if matches!(
                status,
                ExperimentStatus::Done | ExperimentStatus::Error | ExperimentStatus::Stopped
            ) =>
            {
                self.end(reader, *status, message.clone(), time_ms)
            }
            _ => {}
        }
    }
}
