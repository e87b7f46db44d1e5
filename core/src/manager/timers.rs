//! Deadlines and timers: when the loop wakes by itself when nothing else happens.
//!
//! The experiment's own deadline (`maxExperimentDuration`, counting the time of earlier runs of
//! a resumed experiment), the machine's re-probe while trials wait for resources, the wait for a
//! tuner that owes parameters while nothing runs (noticed at a minute, given up at ten), and the
//! earliest of those with the trials' own times (their `maxTrialDuration` deadlines and retry
//! backoffs, which the trial book keeps). Pure: the caller passes `now`, so each rule is tested
//! without a clock.

use std::time::Duration;

use tokio::time::Instant;

/// How often the machine is probed again while trials wait for GPUs or memory (foreign
/// processes come and go without telling us).
pub(super) const REPROBE_INTERVAL: Duration = Duration::from_secs(5);

/// How long the loop waits, with nothing running, for a tuner that wakes on its own to pay the
/// ids it deferred (NNI's advisors and PBT answer `GE` once a result frees a credit; one whose
/// last result is in and that still owes parameters would otherwise be waited for forever).
/// `knob plugin try` waits as long for any call of the tuner it runs.
pub const TUNER_PATIENCE: Duration = Duration::from_secs(600);

/// When, in that wait, the user is told what the experiment waits for (a GP or Metis tuner far
/// into an experiment may think for minutes; the console would otherwise show nothing).
pub const TUNER_QUIET_NOTICE: Duration = Duration::from_secs(60);

/// How long a failed trial waits before its next attempt: 1 s, 2 s, 4 s, … at most a minute.
pub(super) fn retry_backoff(failed_attempt: u32) -> Duration {
    crate::backoff::doubling(
        Duration::from_secs(1),
        failed_attempt,
        Duration::from_secs(60),
    )
}

/// The experiment's timers.
#[derive(Debug)]
pub(super) struct Timers {
    started: Instant,
    /// When `maxExperimentDuration` runs out; none also where that lies past what an `Instant`
    /// holds (a maximum stored before the API capped it at 100 years), which is never reached.
    deadline: Option<Instant>,
    deadline_passed: bool,
    /// Experiment time spent before this run (a resumed experiment's earlier runs).
    time_before: Duration,
    /// The same, whether or not a maximum counts it, for a resumed run: what its `RUNNING`
    /// records (`StoreEvent::ExperimentStatusChanged::spent_before_ms`).
    spent_before: Option<Duration>,
    /// While trials wait for resources, when to probe the machine again.
    reprobe_at: Option<Instant>,
    /// Since when nothing runs and the tuner owes parameters; whether the user was told.
    tuner_wait: Option<(Instant, bool)>,
}

impl Timers {
    /// Timers of a run that starts at `started`, with `maxExperimentDuration` if set.
    pub fn new(started: Instant, max_duration: Option<Duration>) -> Timers {
        Timers {
            started,
            deadline: max_duration.and_then(|d| started.checked_add(d)),
            deadline_passed: false,
            time_before: Duration::ZERO,
            spent_before: None,
            reprobe_at: None,
            tuner_wait: None,
        }
    }

    /// A resumed run's experiment time before it (see [`Timers::resume`]); `None` for a first run.
    pub fn spent_before(&self) -> Option<Duration> {
        self.spent_before
    }

    /// How long this run has lasted (what progress displays show).
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// A resumed experiment: `spent` in earlier runs counts against `max_duration`. Without a
    /// maximum nothing is counted (as before the split: a maximum set later by an update counts
    /// from this run's start).
    pub fn resume(&mut self, spent: Duration, max_duration: Option<Duration>) {
        self.spent_before = Some(spent);
        if let Some(max) = max_duration {
            self.deadline = self.started.checked_add(max.saturating_sub(spent));
            self.time_before = spent;
        }
    }

    /// The run starts now, when the store records it `RUNNING`: the store counts an
    /// experiment's time from that event (`ExperimentState::active_time_ms`, what a resume
    /// carries over), so the deadline does too, and the time the manager took to start (hosts
    /// connected, environments registered) is left out of both alike.
    pub fn begin(&mut self, now: Instant) {
        if let Some(deadline) = self.deadline {
            self.deadline = now.checked_add(deadline.saturating_duration_since(self.started));
        }
        self.started = now;
    }

    /// A new `maxExperimentDuration` (an update): the deadline moves, and an experiment that had
    /// reached the old one may start trials again.
    pub fn set_max_duration(&mut self, max: Duration) {
        self.deadline = self
            .started
            .checked_add(max.saturating_sub(self.time_before));
        self.deadline_passed = false;
    }

    /// Whether `maxExperimentDuration` was reached (no new trial starts, none is retried).
    pub fn deadline_passed(&self) -> bool {
        self.deadline_passed
    }

    /// True once, when `now` first reaches the experiment's deadline.
    pub fn take_experiment_deadline(&mut self, now: Instant) -> bool {
        if self.deadline.is_some_and(|d| d <= now) && !self.deadline_passed {
            self.deadline_passed = true;
            return true;
        }
        false
    }

    /// Trials wait for resources: probe again in [`REPROBE_INTERVAL`] unless a probe is due
    /// sooner already.
    pub fn reprobe_later(&mut self, now: Instant) {
        self.reprobe_at.get_or_insert(now + REPROBE_INTERVAL);
    }

    /// No trial waits any more: no probe is owed until one waits again.
    pub fn cancel_reprobe(&mut self) {
        self.reprobe_at = None;
    }

    /// True once, when a re-probe is due at `now`.
    pub fn take_reprobe(&mut self, now: Instant) -> bool {
        if self.reprobe_at.is_some_and(|at| at <= now) {
            self.reprobe_at = None;
            return true;
        }
        false
    }

    /// `Some(now)` at a turn where nothing runs and the tuner owes parameters, `None` at any
    /// other. The wait counts from the first such turn, whatever else wakes the loop meanwhile
    /// (a dashboard asking for the environments every 5 s, an update), until one where it no
    /// longer holds.
    pub fn tuner_owes_alone(&mut self, now: Option<Instant>) {
        match now {
            Some(now) => {
                self.tuner_wait.get_or_insert((now, false));
            }
            None => self.tuner_wait = None,
        }
    }

    /// When to give up on the tuner ([`TUNER_PATIENCE`] into the wait), while it lasts.
    pub fn tuner_give_up_at(&self) -> Option<Instant> {
        self.tuner_wait.map(|(since, _)| since + TUNER_PATIENCE)
    }

    /// Once a wait, when [`TUNER_QUIET_NOTICE`] of it has passed at `now`: how long it lasted.
    pub fn take_tuner_notice(&mut self, now: Instant) -> Option<Duration> {
        let (since, told) = self.tuner_wait.as_mut()?;
        if *told || now < *since + TUNER_QUIET_NOTICE {
            return None;
        }
        *told = true;
        Some(now - *since)
    }

    /// When the loop must wake by itself: the earliest of the experiment's deadline (until it
    /// passed), the running attempts' deadlines, the retry backoffs still ahead of `now`, a
    /// re-probe, and the notice of a tuner waited for alone.
    pub fn next(
        &self,
        now: Instant,
        attempt_deadlines: impl IntoIterator<Item = Instant>,
        retries: impl IntoIterator<Item = Instant>,
    ) -> Option<Instant> {
        let experiment = if self.deadline_passed {
            None
        } else {
            self.deadline
        };
        // A backoff that has passed is no deadline: the trial may be placed now, and if it
        // waits for resources, the loop must not wake at once again and again for it.
        let retries = retries.into_iter().filter(|at| *at > now);
        experiment
            .into_iter()
            .chain(attempt_deadlines)
            .chain(retries)
            .chain(self.reprobe_at)
            .chain(
                self.tuner_wait
                    .filter(|(_, told)| !told)
                    .map(|(since, _)| since + TUNER_QUIET_NOTICE),
            )
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn backoff_doubles_to_a_minute() {
        let waits: Vec<u64> = (1..=9).map(|a| retry_backoff(a).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(retry_backoff(0), S);
    }

    #[test]
    fn a_tuner_waited_for_alone_is_noticed_once_and_given_up_on_from_the_wait_s_start() {
        let t0 = Instant::now();
        let mut timers = Timers::new(t0, None);
        timers.tuner_owes_alone(None);
        assert_eq!(timers.tuner_give_up_at(), None);
        assert_eq!(timers.next(t0, [], []), None);
        timers.tuner_owes_alone(Some(t0 + S));
        // Later turns of the same wait (a dashboard's question every 5 s) do not restart it.
        for turn in 2..=59 {
            timers.tuner_owes_alone(Some(t0 + turn * S));
            assert_eq!(timers.take_tuner_notice(t0 + turn * S), None);
        }
        assert_eq!(timers.next(t0 + 59 * S, [], []), Some(t0 + 61 * S));
        assert_eq!(timers.take_tuner_notice(t0 + 61 * S), Some(60 * S));
        assert_eq!(timers.take_tuner_notice(t0 + 62 * S), None);
        assert_eq!(timers.next(t0 + 62 * S, [], []), None);
        timers.tuner_owes_alone(Some(t0 + 300 * S));
        assert_eq!(timers.tuner_give_up_at(), Some(t0 + S + TUNER_PATIENCE));
        // A trial ran in between: the next wait starts afresh, and is noticed again.
        timers.tuner_owes_alone(None);
        assert_eq!(timers.tuner_give_up_at(), None);
        timers.tuner_owes_alone(Some(t0 + 302 * S));
        assert_eq!(
            timers.tuner_give_up_at(),
            Some(t0 + 302 * S + TUNER_PATIENCE)
        );
        assert_eq!(timers.take_tuner_notice(t0 + 362 * S), Some(60 * S));
    }

    #[test]
    fn the_experiment_deadline_fires_once_and_an_update_moves_it() {
        let t0 = Instant::now();
        let mut timers = Timers::new(t0, Some(10 * S));
        assert_eq!(timers.next(t0, [], []), Some(t0 + 10 * S));
        assert!(!timers.take_experiment_deadline(t0 + 9 * S));
        assert!(timers.take_experiment_deadline(t0 + 10 * S));
        assert!(timers.deadline_passed());
        assert!(!timers.take_experiment_deadline(t0 + 11 * S));
        // Passed, it is no reason to wake any more.
        assert_eq!(timers.next(t0 + 11 * S, [], []), None);
        timers.set_max_duration(20 * S);
        assert!(!timers.deadline_passed());
        assert_eq!(timers.next(t0 + 11 * S, [], []), Some(t0 + 20 * S));
    }

    #[test]
    fn a_deadline_past_what_an_instant_holds_is_no_deadline() {
        let start = Instant::now();
        let mut timers = Timers::new(start, Some(Duration::MAX));
        timers.begin(start + Duration::from_secs(1));
        timers.resume(Duration::from_secs(5), Some(Duration::MAX));
        timers.set_max_duration(Duration::MAX);
        assert_eq!(timers.deadline, None);
        assert!(!timers.deadline_passed());
    }

    #[test]
    fn a_resumed_run_counts_the_time_spent_before() {
        let t0 = Instant::now();
        let mut timers = Timers::new(t0, Some(10 * S));
        timers.resume(4 * S, Some(10 * S));
        assert_eq!(timers.next(t0, [], []), Some(t0 + 6 * S));
        // An update's new maximum counts it too, and never goes before the start.
        timers.set_max_duration(5 * S);
        assert_eq!(timers.next(t0, [], []), Some(t0 + S));
        timers.set_max_duration(2 * S);
        assert_eq!(timers.next(t0, [], []), Some(t0));
        // Without a maximum at the resume, nothing is counted.
        let mut unbounded = Timers::new(t0, None);
        unbounded.resume(4 * S, None);
        assert_eq!(unbounded.next(t0, [], []), None);
        unbounded.set_max_duration(10 * S);
        assert_eq!(unbounded.next(t0, [], []), Some(t0 + 10 * S));
    }

    #[test]
    fn the_run_and_its_deadline_begin_when_it_is_recorded_running() {
        let t0 = Instant::now();
        let mut timers = Timers::new(t0, Some(10 * S));
        timers.resume(4 * S, Some(10 * S));
        // Starting took 3 s: the budget left is still 6 s from the start the store records.
        timers.begin(t0 + 3 * S);
        assert_eq!(timers.next(t0 + 3 * S, [], []), Some(t0 + 9 * S));
        timers.set_max_duration(20 * S);
        assert_eq!(timers.next(t0 + 3 * S, [], []), Some(t0 + 19 * S));
        // A budget spent before the resume is due at the start.
        let mut spent = Timers::new(t0, Some(10 * S));
        spent.resume(12 * S, Some(10 * S));
        spent.begin(t0 + 3 * S);
        assert!(spent.take_experiment_deadline(t0 + 3 * S));
    }

    #[test]
    fn the_next_wake_is_the_earliest_and_skips_passed_backoffs() {
        let t0 = Instant::now();
        let timers = Timers::new(t0, Some(100 * S));
        let now = t0 + 5 * S;
        // A backoff already over is no deadline (the loop would spin on it).
        assert_eq!(
            timers.next(now, [t0 + 50 * S], [t0 + 2 * S]),
            Some(t0 + 50 * S)
        );
        assert_eq!(
            timers.next(now, [t0 + 50 * S], [t0 + 2 * S, t0 + 7 * S]),
            Some(t0 + 7 * S)
        );
        assert_eq!(timers.next(now, [t0 + 3 * S], []), Some(t0 + 3 * S));
    }

    #[test]
    fn a_reprobe_is_kept_until_due_or_cancelled() {
        let t0 = Instant::now();
        let mut timers = Timers::new(t0, None);
        assert_eq!(timers.next(t0, [], []), None);
        timers.reprobe_later(t0);
        // Asking again does not push it back.
        timers.reprobe_later(t0 + 3 * S);
        assert_eq!(timers.next(t0, [], []), Some(t0 + REPROBE_INTERVAL));
        assert!(!timers.take_reprobe(t0 + 4 * S));
        assert!(timers.take_reprobe(t0 + REPROBE_INTERVAL));
        assert!(!timers.take_reprobe(t0 + REPROBE_INTERVAL));
        timers.reprobe_later(t0);
        timers.cancel_reprobe();
        assert_eq!(timers.next(t0, [], []), None);
    }
}
