//! The trial book: every trial of the experiment, its attempts and status, and the budgets that
//! follow from them (`maxTrialNumber`, `maxTrialRetries`, the best result so far).
//!
//! It does no I/O and knows no tuner or service: the loop records each change in the store
//! first, then writes it here. The loop's cost follows `trialConcurrency`, not the experiment's
//! length, because everything it asks often goes through `active`, and what it asks every turn
//! (which trials wait for a placement, the next trial deadline or backoff end, the overdue
//! trials) goes through two lazily pruned indexes, `unplaced` and `timers`: without them a turn
//! looked at every active trial three times, so that at `trialConcurrency` 8 000 a trial of a
//! 100 000-trial experiment cost several times one of a 1 000-trial one (`sim_scale`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::ops::Index;

use rand::Rng;
use tokio::time::Instant;

use super::trial::{Trial, TrialSummary};
use crate::store::TrialStatus;

#[derive(Debug)]
pub(super) struct TrialBook {
    /// Every trial by id. A hash map, not a B-tree: the loop looks trials up by id many times
    /// an event, and in a B-tree of 100 000 trials each lookup compares string keys on six
    /// levels of nodes that no longer fit in the caches, which made a trial cost 1.8 times as
    /// much at 100 000 trials as at 10 000 (`sim_scale`).
    trials: HashMap<String, Trial>,
    /// Trials not yet ended (waiting or running), by sequence: what the loop iterates often,
    /// so that its cost follows `trialConcurrency`, not the experiment's length.
    active: BTreeMap<u64, String>,
    /// Sequences of the trials that may wait for a placement (WAITING, not launched): added
    /// wherever a trial starts to wait, dropped when looked at and no longer waiting.
    unplaced: BTreeSet<u64>,
    /// (when, sequence) of attempt deadlines and retry backoff ends: added wherever one is set,
    /// dropped when looked at and no longer the trial's (killed, ended, a new attempt).
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// How many trials have each status.
    counts: BTreeMap<TrialStatus, u64>,
    /// Trial id by parameter id, for results and suggestions.
    by_parameter: BTreeMap<u64, String>,
    next_sequence: u64,
    maximize: bool,
    /// (trial id, value, sequence) of the best trial so far (`objectives::Ranking`).
    best: Option<(String, f64, u64)>,
}

/// What [`TrialBook::due`] found due, oldest timer first.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Due {
    /// Running past `maxTrialDuration`: to be killed.
    pub overdue: Vec<String>,
    /// Asked to be killed, and not reported ended by the time set with
    /// [`TrialBook::expect_end`].
    pub end_unreported: Vec<String>,
}

/// What one entry of [`TrialBook::timers`] stands for.
enum Timer {
    Deadline,
    EndDue,
    Backoff,
}

impl<K: AsRef<str>> Index<K> for TrialBook {
    type Output = Trial;

    fn index(&self, trial_id: K) -> &Trial {
        &self.trials[trial_id.as_ref()]
    }
}

impl TrialBook {
    /// An empty book; `maximize` says which way the best result goes.
    pub fn new(maximize: bool) -> TrialBook {
        TrialBook {
            trials: HashMap::new(),
            active: BTreeMap::new(),
            unplaced: BTreeSet::new(),
            timers: BinaryHeap::new(),
            counts: BTreeMap::new(),
            by_parameter: BTreeMap::new(),
            next_sequence: 0,
            maximize,
            best: None,
        }
    }

    pub fn get(&self, trial_id: &str) -> Option<&Trial> {
        self.trials.get(trial_id)
    }

    pub fn get_mut(&mut self, trial_id: &str) -> Option<&mut Trial> {
        self.trials.get_mut(trial_id)
    }

    /// A trial the caller knows is in the book.
    pub fn known(&mut self, trial_id: &str) -> &mut Trial {
        self.trials.get_mut(trial_id).expect("a known trial")
    }

    /// How many trials were created (every status).
    pub fn len(&self) -> u64 {
        self.trials.len() as u64
    }

    /// How many trials are not yet ended (waiting or running).
    pub fn active_count(&self) -> u64 {
        self.active.len() as u64
    }

    /// How many trials not yet ended are placed: handed to their service (starting or running)
    /// or waiting for their parent's checkpoint before that.
    pub fn placed_count(&self) -> u64 {
        self.active
            .values()
            .filter(|id| {
                let trial = &self.trials[id.as_str()];
                trial.launched || trial.fetching || trial.status == TrialStatus::Running
            })
            .count() as u64
    }

    /// The ids of the trials not yet ended, oldest first.
    pub fn active_ids(&self) -> Vec<String> {
        self.active.values().cloned().collect()
    }

    /// How many trials have `status` now.
    pub fn count(&self, status: TrialStatus) -> u64 {
        self.counts.get(&status).copied().unwrap_or(0)
    }

    /// The trial of a parameter id.
    pub fn trial_of_parameter(&self, parameter_id: u64) -> Option<&str> {
        self.by_parameter.get(&parameter_id).map(String::as_str)
    }

    /// Every trial, in no particular order.
    pub fn all(&self) -> impl Iterator<Item = &Trial> + Clone {
        self.trials.values()
    }

    /// Whether a trial runs (or ran) these parameters already.
    pub fn has_parameter(&self, parameter_id: u64) -> bool {
        self.by_parameter.contains_key(&parameter_id)
    }

    /// A resumed experiment: sequences go on from the store's counter.
    pub fn continue_from(&mut self, next_sequence: u64) {
        self.next_sequence = next_sequence;
    }

    /// Whether `maxTrialNumber` trials were created.
    pub fn budget_spent(&self, max_trial_number: Option<u64>) -> bool {
        max_trial_number.is_some_and(|max| self.next_sequence >= max)
    }

    /// How many more trials `maxTrialNumber` allows (`u64::MAX` without one).
    pub fn budget_left(&self, max_trial_number: Option<u64>) -> u64 {
        max_trial_number.map_or(u64::MAX, |max| max.saturating_sub(self.next_sequence))
    }

    /// The sequence and a fresh id (NNI-style: five letters and digits) of the next trial. It
    /// is counted against `maxTrialNumber` from now, whether or not it is inserted.
    pub fn next_trial(&mut self) -> (u64, String) {
        const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let mut rng = rand::thread_rng();
        loop {
            let id: String = (0..5)
                .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
                .collect();
            if !self.trials.contains_key(&id) {
                return (sequence, id);
            }
        }
    }

    /// Adds a trial, WAITING (a resumed one that ended is then moved to its status).
    pub fn insert(&mut self, trial: Trial) {
        debug_assert_eq!(trial.status, TrialStatus::Waiting);
        *self.counts.entry(TrialStatus::Waiting).or_default() += 1;
        self.active.insert(trial.sequence, trial.id.clone());
        self.unplaced.insert(trial.sequence);
        self.by_parameter
            .insert(trial.parameter_id, trial.id.clone());
        self.trials.insert(trial.id.clone(), trial);
    }

    /// Moves a trial to `status`, keeping `active` and the counts in step.
    pub fn set_status(&mut self, trial_id: &str, status: TrialStatus) {
        let trial = self
            .trials
            .get_mut(trial_id)
            .expect("status of a known trial");
        if let Some(count) = self.counts.get_mut(&trial.status) {
            *count = count.saturating_sub(1);
        }
        *self.counts.entry(status).or_default() += 1;
        trial.status = status;
        let sequence = trial.sequence;
        if status == TrialStatus::Waiting {
            self.unplaced.insert(sequence);
        }
        if status.is_final() {
            self.active.remove(&sequence);
        }
        // The best is judged as the store and the API judge it (`objectives::Ranking`): once
        // the trial has succeeded, not when its final arrives (it may still fail or be killed).
        if let (TrialStatus::Succeeded, true, Some(value)) =
            (status, trial.result_ranks, trial.final_value)
        {
            self.offer_best(trial_id, value, sequence);
        }
    }

    /// The service reported the start of a launched trial's attempt: it is RUNNING, its next
    /// attempt counted, and its `maxTrialDuration` runs from now. `None` when it is not waiting
    /// for such a start (a late or repeated report).
    pub fn start_attempt(
        &mut self,
        trial_id: &str,
        pid: Option<u32>,
        deadline: Option<Instant>,
    ) -> Option<&Trial> {
        let trial = self.trials.get_mut(trial_id)?;
        if trial.status != TrialStatus::Waiting || !trial.launched {
            return None;
        }
        trial.attempt += 1;
        trial.pid = pid;
        trial.deadline = deadline;
        if let Some(at) = deadline {
            self.timers.push(Reverse((at, trial.sequence)));
        }
        self.set_status(trial_id, TrialStatus::Running);
        self.trials.get(trial_id)
    }

    /// Takes a trial back to WAITING for a new attempt, not placed before `not_before`: what
    /// belonged to the last attempt (its kill, its results, its deadline) is forgotten; its
    /// attempt count, host losses and memory request stay.
    pub fn new_attempt(&mut self, trial_id: &str, not_before: Option<Instant>) {
        self.set_status(trial_id, TrialStatus::Waiting);
        let trial = self.known(trial_id);
        trial.launched = false;
        trial.fetching = false;
        trial.early_metrics = Vec::new();
        trial.kill = None;
        trial.kill_decided_ms = None;
        trial.kill_answered = None;
        trial.end_due = None;
        trial.pid = None;
        trial.intermediate = Default::default();
        trial.final_value = None;
        trial.infeasible = false;
        trial.result_ranks = false;
        trial.final_problem = None;
        trial.outcome = None;
        trial.objective_problem = None;
        trial.waiting_reason = None;
        trial.waiting_warned_at = None;
        trial.waiting_reasons_recorded = 0;
        // What the last attempt used is in its record; the next one reports its own.
        trial.peak_memory_mib = None;
        trial.peak_gpu_memory_mib = None;
        trial.not_before = not_before;
        trial.deadline = None;
        let sequence = trial.sequence;
        if let Some(at) = not_before {
            self.timers.push(Reverse((at, sequence)));
        }
    }

    /// A trial handed to a service that never started it (its host was lost first), or whose
    /// placement went while its parent's checkpoint was brought here, waits for a placement
    /// again.
    pub fn unlaunch(&mut self, trial_id: &str) {
        let trial = self.known(trial_id);
        trial.launched = false;
        trial.fetching = false;
        trial.early_metrics = Vec::new();
        let sequence = trial.sequence;
        self.unplaced.insert(sequence);
    }

    /// Whether a trial that failed on its own may run again under `retries`
    /// (`maxTrialRetries`, plus `maxOomRetries` for an out-of-memory end). Attempts lost with
    /// their host do not count; a trial being killed, or whose final lacked an objective (the
    /// script would report the same again), does not run again.
    pub fn may_retry(&self, trial_id: &str, retries: u32) -> bool {
        let trial = &self.trials[trial_id];
        trial.kill.is_none()
            && trial.objective_problem.is_none()
            && trial.attempt.saturating_sub(trial.lost_attempts) <= retries
    }

    /// Whether a trial waits to be placed: not handed to a service yet, its backoff over or
    /// not (see [`TrialBook::placeable`]).
    pub fn any_unplaced(&self) -> bool {
        self.unplaced.iter().any(|sequence| {
            self.active
                .get(sequence)
                .map(|id| &self.trials[id])
                .is_some_and(|trial| {
                    trial.status == TrialStatus::Waiting && !trial.launched && !trial.fetching
                })
        })
    }

    /// The waiting trials that may be placed at `now` (not handed to a service yet, backoff
    /// over), oldest first.
    pub fn placeable(&mut self, now: Instant) -> Vec<String> {
        let mut placeable = Vec::new();
        let trials = &self.trials;
        let active = &self.active;
        self.unplaced.retain(|sequence| {
            let Some(trial) = active.get(sequence).map(|id| &trials[id]) else {
                return false;
            };
            if trial.status != TrialStatus::Waiting || trial.launched || trial.fetching {
                return false;
            }
            if trial.not_before.is_none_or(|at| at <= now) {
                placeable.push(trial.id.clone());
            }
            true
        });
        placeable
    }

    /// The manager asked its service to kill a launched trial: unless the service reports its
    /// end first, it is due at `at` (see [`Due::end_unreported`]).
    pub fn expect_end(&mut self, trial_id: &str, at: Instant) {
        let trial = self.known(trial_id);
        trial.end_due = Some(at);
        let sequence = trial.sequence;
        self.timers.push(Reverse((at, sequence)));
    }

    /// What a timer entry is now: the deadline of a running attempt not being killed, when the
    /// end of a trial being killed is due, the end of a backoff still ahead of `now`, or nothing
    /// (stale).
    fn timer(&self, at: Instant, sequence: u64, now: Instant) -> Option<(Timer, &Trial)> {
        let trial = &self.trials[self.active.get(&sequence)?];
        if trial.kill.is_none() && trial.deadline == Some(at) {
            Some((Timer::Deadline, trial))
        } else if trial.kill.is_some() && trial.end_due == Some(at) {
            Some((Timer::EndDue, trial))
        } else if trial.not_before == Some(at) && at > now {
            Some((Timer::Backoff, trial))
        } else {
            None
        }
    }

    /// What is due at `now` (each is reported once: its timer is then taken off): the trials
    /// past their `maxTrialDuration` that are not being killed already, and those being killed
    /// whose end is due.
    pub fn due(&mut self, now: Instant) -> Due {
        let mut due = Due::default();
        while let Some(&Reverse((at, sequence))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            match self.timer(at, sequence, now) {
                Some((Timer::Deadline, trial)) => due.overdue.push(trial.id.clone()),
                Some((Timer::EndDue, trial)) => due.end_unreported.push(trial.id.clone()),
                Some((Timer::Backoff, _)) | None => {}
            }
        }
        due
    }

    /// The earliest `maxTrialDuration` deadline of a running attempt not being killed, end due
    /// of one being killed, or end of a retry backoff still ahead of `now`.
    pub fn next_trial_timer(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&Reverse((at, sequence))) = self.timers.peek() {
            if self.timer(at, sequence, now).is_some() {
                return Some(at);
            }
            self.timers.pop();
        }
        None
    }

    /// The final result of a trial that ranks: the best so far if it beats it, or ties it and
    /// the trial is older (`objectives::best_first`: a tie goes to the earlier trial).
    fn offer_best(&mut self, trial_id: &str, value: f64, sequence: u64) {
        let direction = if self.maximize {
            crate::store::Direction::Maximize
        } else {
            crate::store::Direction::Minimize
        };
        let beats = self.best.as_ref().is_none_or(|(_, best, best_sequence)| {
            crate::objectives::best_first(direction, (value, sequence), (*best, *best_sequence))
                .is_lt()
        });
        if !value.is_nan() && beats {
            self.best = Some((trial_id.to_string(), value, sequence));
        }
    }

    /// (trial id, value) of the best final result so far.
    pub fn best(&self) -> Option<(String, f64)> {
        self.best
            .as_ref()
            .map(|(id, value, _)| (id.clone(), *value))
    }

    /// What the caller of `run` learns of each trial, by id.
    pub fn summaries(&self) -> Vec<TrialSummary> {
        let mut summaries: Vec<TrialSummary> = self.trials.values().map(Trial::summary).collect();
        summaries.sort_by(|a, b| a.id.cmp(&b.id));
        summaries
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn book_with(n: u64, maximize: bool) -> (TrialBook, Vec<String>) {
        let mut book = TrialBook::new(maximize);
        let ids = (0..n)
            .map(|p| {
                let (sequence, id) = book.next_trial();
                book.insert(Trial::new(id.clone(), sequence, p, json!({ "x": p })));
                id
            })
            .collect();
        (book, ids)
    }

    #[test]
    fn ids_are_fresh_and_sequences_count_against_the_budget() {
        let (mut book, ids) = book_with(50, true);
        let unique: std::collections::BTreeSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), 50);
        assert!(ids.iter().all(|id| id.len() == 5));
        assert!(book.budget_spent(Some(50)));
        assert!(!book.budget_spent(Some(51)));
        assert!(!book.budget_spent(None));
        // A reserved sequence counts even if its trial never made it into the book.
        let _ = book.next_trial();
        assert!(book.budget_spent(Some(51)));
        assert_eq!(book.len(), 50);
        book.continue_from(7);
        assert_eq!(book.next_trial().0, 7);
        assert!(book.has_parameter(3) && !book.has_parameter(50));
    }

    #[test]
    fn counts_and_active_follow_every_transition() {
        let (mut book, ids) = book_with(3, true);
        assert_eq!(
            (book.count(TrialStatus::Waiting), book.active_count()),
            (3, 3)
        );
        // Not launched: no start is taken.
        assert!(book.start_attempt(&ids[0], Some(1), None).is_none());
        book.known(&ids[0]).launched = true;
        let started = book.start_attempt(&ids[0], Some(42), None).unwrap();
        assert_eq!((started.attempt, started.pid), (1, Some(42)));
        // A repeated start report is not a second attempt.
        assert!(book.start_attempt(&ids[0], Some(43), None).is_none());
        assert_eq!(book.count(TrialStatus::Running), 1);
        book.set_status(&ids[0], TrialStatus::Succeeded);
        book.set_status(&ids[1], TrialStatus::UserCanceled);
        assert_eq!(book.count(TrialStatus::Running), 0);
        assert_eq!(book.count(TrialStatus::Waiting), 1);
        assert_eq!(book.count(TrialStatus::Succeeded), 1);
        assert_eq!(book.active_ids(), vec![ids[2].clone()]);
        assert_eq!(book.len(), 3);
        let summaries = book.summaries();
        assert_eq!(summaries.len(), 3);
        assert!(summaries
            .iter()
            .any(|s| s.id == ids[1] && s.status == TrialStatus::UserCanceled));
    }

    #[test]
    fn a_trial_waiting_for_its_parents_checkpoint_is_not_placed_again_until_told() {
        let (mut book, ids) = book_with(2, true);
        let now = Instant::now();
        assert_eq!(book.placeable(now), ids);
        // Placed; its parent's checkpoint is on its way (`bring_parent_snapshot`).
        book.known(&ids[0]).fetching = true;
        assert_eq!(book.placeable(now), vec![ids[1].clone()]);
        assert_eq!(book.placeable(now), vec![ids[1].clone()]);
        // Its placement went meanwhile: it waits for one again.
        book.unlaunch(&ids[0]);
        assert!(!book[ids[0].as_str()].fetching);
        assert_eq!(book.placeable(now), ids);
    }

    #[test]
    fn a_new_attempt_forgets_the_last_one_but_not_its_count() {
        let (mut book, ids) = book_with(1, true);
        let id = &ids[0];
        book.known(id).launched = true;
        book.start_attempt(id, Some(1), Some(Instant::now()))
            .unwrap();
        let trial = book.known(id);
        std::sync::Arc::make_mut(&mut trial.intermediate).push(0.5);
        trial.final_value = Some(1.0);
        trial.kill = Some((TrialStatus::SysCanceled, "why".into()));
        trial.host_losses = 1;
        trial.memory_request_mib = Some(512);
        let at = Instant::now() + Duration::from_secs(2);
        book.new_attempt(id, Some(at));
        let trial = &book[id.as_str()];
        assert_eq!(trial.status, TrialStatus::Waiting);
        assert!(!trial.launched && trial.kill.is_none() && trial.pid.is_none());
        assert!(trial.intermediate.is_empty() && trial.final_value.is_none());
        assert_eq!(trial.deadline, None);
        assert_eq!(trial.not_before, Some(at));
        assert_eq!(
            (trial.attempt, trial.host_losses, trial.memory_request_mib),
            (1, 1, Some(512))
        );
        assert_eq!(book.count(TrialStatus::Running), 0);
        assert_eq!(book.count(TrialStatus::Waiting), 1);
    }

    #[test]
    fn retries_do_not_count_attempts_lost_with_their_host() {
        let (mut book, ids) = book_with(1, true);
        let id = ids[0].as_str();
        book.known(id).attempt = 3;
        assert!(!book.may_retry(id, 2));
        book.known(id).lost_attempts = 1;
        assert!(book.may_retry(id, 2));
        book.known(id).objective_problem = Some("no metric loss".into());
        assert!(!book.may_retry(id, 2));
        book.known(id).objective_problem = None;
        book.known(id).kill = Some((TrialStatus::UserCanceled, "killed".into()));
        assert!(!book.may_retry(id, 2));
    }

    #[test]
    fn placeable_overdue_and_wake_times_look_at_active_trials_only() {
        let (mut book, ids) = book_with(5, true);
        let now = Instant::now();
        let s = Duration::from_secs(1);
        book.known(&ids[0]).launched = true;
        book.new_attempt(&ids[1], Some(now + s));
        book.new_attempt(&ids[2], Some(now - s));
        assert_eq!(
            book.placeable(now),
            vec![ids[2].clone(), ids[3].clone(), ids[4].clone()]
        );
        assert_eq!(book.placeable(now + s).len(), 4);
        // A backoff ahead is a wake time; one passed is not.
        assert_eq!(book.next_trial_timer(now), Some(now + s));
        // Deadlines: one overdue, one being killed already, one ended, one ahead.
        book.known(&ids[0]).launched = true;
        for (i, deadline) in [(0, now - s), (2, now - s), (3, now - s), (4, now + 2 * s)] {
            book.known(&ids[i]).launched = true;
            book.start_attempt(&ids[i], None, Some(deadline));
        }
        book.known(&ids[2]).kill = Some((TrialStatus::SysCanceled, "x".into()));
        book.set_status(&ids[3], TrialStatus::Failed);
        assert_eq!(book.next_trial_timer(now), Some(now - s));
        assert_eq!(book.due(now).overdue, vec![ids[0].clone()]);
        // Reported once; what is left is the backoff, then the deadline ahead.
        assert_eq!(book.due(now), Due::default());
        assert_eq!(book.next_trial_timer(now), Some(now + s));
        assert_eq!(book.placeable(now + s), vec![ids[1].clone()]);
        // The end of the trial being killed is due later; once ended, it is not.
        book.expect_end(&ids[2], now + 3 * s);
        book.expect_end(&ids[0], now + 3 * s);
        book.set_status(&ids[0], TrialStatus::SysCanceled);
        assert_eq!(book.due(now + s).end_unreported, Vec::<String>::new());
        assert_eq!(book.next_trial_timer(now + s), Some(now + 2 * s));
        assert_eq!(book.due(now + 3 * s).end_unreported, vec![ids[2].clone()]);
        assert_eq!(book.due(now + 3 * s), Due::default());
        // A trial whose launch was undone waits again.
        book.unlaunch(&ids[1]);
        book.known(&ids[1]).launched = true;
        assert!(book.placeable(now + s).is_empty());
        book.unlaunch(&ids[1]);
        assert_eq!(book.placeable(now + s), vec![ids[1].clone()]);
    }

    /// A trial's final as the loop records it, then its end.
    fn finish(book: &mut TrialBook, id: &str, value: f64, status: TrialStatus) {
        let trial = book.known(id);
        trial.final_value = Some(value);
        trial.result_ranks = crate::objectives::outcome_ranks(value, None);
        book.set_status(id, TrialStatus::Running);
        book.set_status(id, status);
    }

    #[test]
    fn the_best_follows_the_direction_and_ignores_nan() {
        for (maximize, expected) in [(true, 3.0), (false, 1.0)] {
            let (mut book, ids) = book_with(4, maximize);
            finish(&mut book, &ids[0], 2.0, TrialStatus::Succeeded);
            finish(&mut book, &ids[1], f64::NAN, TrialStatus::Succeeded);
            finish(&mut book, &ids[2], 3.0, TrialStatus::Succeeded);
            finish(&mut book, &ids[3], 1.0, TrialStatus::Succeeded);
            assert_eq!(book.best().map(|(_, v)| v), Some(expected));
        }
        let (mut book, ids) = book_with(1, true);
        finish(&mut book, &ids[0], f64::NAN, TrialStatus::Succeeded);
        assert_eq!(book.best(), None);
    }

    #[test]
    fn only_a_trial_that_succeeds_is_the_best_and_a_tie_goes_to_the_earlier() {
        let (mut book, ids) = book_with(5, true);
        // A final better than any, then a non-zero exit, a kill, an early stop: none is best.
        for (id, status) in ids.iter().zip([
            TrialStatus::Failed,
            TrialStatus::UserCanceled,
            TrialStatus::EarlyStopped,
        ]) {
            finish(&mut book, id, 9.0, status);
        }
        assert_eq!(book.best(), None);
        // Two equal finals: the later trial ends first, the earlier one takes the best.
        finish(&mut book, &ids[4], 1.0, TrialStatus::Succeeded);
        assert_eq!(book.best(), Some((ids[4].clone(), 1.0)));
        finish(&mut book, &ids[3], 1.0, TrialStatus::Succeeded);
        assert_eq!(book.best(), Some((ids[3].clone(), 1.0)));
        // A final that breaks a constraint (or has a NaN objective) does not rank.
        let (mut book, ids) = book_with(1, true);
        let trial = book.known(&ids[0]);
        trial.final_value = Some(5.0);
        trial.result_ranks = false;
        book.set_status(&ids[0], TrialStatus::Succeeded);
        assert_eq!(book.best(), None);
    }
}
