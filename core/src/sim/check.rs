//! The invariants a simulated run must keep, checked against the store it left, the manager's
//! outcome and what the world saw.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::world::{seconds, Shared};
use super::{Report, Scenario};
use crate::manager::Outcome;
use crate::store::{
    stopped_with_experiment, ExperimentState, ExperimentStatus, StoreEvent, StoreReader,
    TrialQuery, TrialStatus,
};

/// How many host losses of one trial are run again (the manager's `MAX_HOST_LOSS_REQUEUES`).
const HOST_LOSS_REQUEUES: u32 = 3;

pub(super) fn check(
    scenario: &Scenario,
    dir: &Path,
    world: &Shared,
    outcome: Result<Outcome, String>,
) -> Report {
    let seen = world.lock();
    let mut violations: Vec<String> = seen.violations.clone();
    let mut report = Report {
        scenario: scenario.clone(),
        outcome: outcome.clone(),
        violations: Vec::new(),
        simulated: seen.now(),
        trials: 0,
        attempts: 0,
        service_events: seen.events_delivered,
        loop_turns: 0,
        wakes: Default::default(),
        max_event_batch: seen.max_batch,
        peak_running: seen.peak_running,
        store_bytes: store_bytes(dir),
        store_events: 0,
        replay_time: Duration::ZERO,
        run_peak_rss: None,
        run_thread_cpu: None,
        manager_cpu: None,
        meter_cost: None,
        metered_polls: 0,
        idle_polls: 0,
        service_answers: 0,
        meter_overhead: Duration::ZERO,
        service_cpu: None,
        manager_start_cpu: None,
        run_process_cpu: None,
        events_by_kind: Default::default(),
        resumed: 0,
        start_failures: seen
            .trials
            .values()
            .map(|t| u64::from(t.start_failures))
            .sum(),
        retried_starts: seen
            .trials
            .values()
            .map(|t| u64::from(t.retried_starts))
            .sum(),
        user_kills: seen.user_kills,
        crash_losses: seen
            .trials
            .values()
            .map(|t| u64::from(t.crash_losses))
            .sum(),
        ends_unreported: seen
            .trials
            .values()
            .map(|t| u64::from(t.ends_unreported))
            .sum(),
    };
    drop(seen);
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            violations.push(format!("the run did not end: {e}"));
            report.violations = violations;
            return report;
        }
    };
    let reader = match StoreReader::open(dir) {
        Ok(reader) => reader,
        Err(e) => {
            violations.push(format!("the store cannot be read: {e}"));
            report.violations = violations;
            return report;
        }
    };
    let replay_started = Instant::now();
    let state = match reader.replay() {
        Ok(state) => state,
        Err(e) => {
            violations.push(format!("the store does not replay: {e}"));
            report.violations = violations;
            return report;
        }
    };
    report.replay_time = replay_started.elapsed();
    report.trials = state.trials.len() as u64;
    report.attempts = state.trials.iter().map(|t| t.attempts.len() as u64).sum();
    report.store_events = state.last_event_seq;
    report.events_by_kind.insert(
        "metric",
        state.trials.iter().map(|t| t.metrics.len() as u64).sum(),
    );

    let all_down = world.lock().environment_up.iter().all(|up| !up);
    let ended_by_itself = match outcome.status {
        ExperimentStatus::Done => true,
        ExperimentStatus::Stopped => {
            if !world.lock().stop_sent {
                violations.push("the experiment STOPPED without a stop".into());
            }
            false
        }
        // Every environment lost while trials wait is the manager's documented end.
        ExperimentStatus::Error
            if all_down
                && outcome
                    .message
                    .as_deref()
                    .is_some_and(|m| m.contains("no environment")) =>
        {
            false
        }
        other => {
            violations.push(format!(
                "the experiment ended {} ({})",
                other.as_str(),
                outcome.message.as_deref().unwrap_or("no message")
            ));
            false
        }
    };
    let deadline_passed = scenario
        .max_experiment_duration
        .is_some_and(|d| report.simulated >= d);
    let stopped = world.lock().stop_sent;
    let retries_closed = stopped || deadline_passed;

    accounted_once_per_attempt(&reader, &state, &mut report, &mut violations);
    killed_by_the_user(&state, world, deadline_passed, &mut violations);
    replay_agrees(&reader, &state, &outcome, &mut violations);
    budgets(scenario, &state, world, retries_closed, &mut violations);
    if ended_by_itself && !deadline_passed {
        no_starvation(scenario, &state, world, &mut violations);
    }
    if state.status != outcome.status {
        violations.push(format!(
            "the store says the experiment is {}, the manager ended {}",
            state.status.as_str(),
            outcome.status.as_str()
        ));
    }
    violations.truncate(30);
    report.violations = violations;
    report
}

fn store_bytes(dir: &Path) -> u64 {
    ["experiment.db", "experiment.db-wal"]
        .iter()
        .filter_map(|name| std::fs::metadata(dir.join(name)).ok())
        .map(|metadata| metadata.len())
        .sum()
}

/// Each attempt starts once and is closed once: given up for a new one (`TrialRequeued`) or
/// ended for good (`TrialEnded`, of the last attempt); a trial never started ends once, and a
/// host loss records its attempt's end before the requeue.
fn accounted_once_per_attempt(
    reader: &StoreReader,
    state: &ExperimentState,
    report: &mut Report,
    violations: &mut Vec<String>,
) {
    let events = match reader.events_since(0, u64::MAX) {
        Ok(events) => events,
        Err(e) => {
            violations.push(format!("the event log cannot be read: {e}"));
            return;
        }
    };
    #[derive(Default)]
    struct Seen {
        current: u32,
        starts: BTreeMap<u32, u32>,
        ends: BTreeMap<u32, u32>,
        requeues: BTreeMap<u32, u32>,
        /// The manager decided to end it (not with a stop of the whole experiment).
        stopping: bool,
    }
    let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
    for record in &events {
        *report
            .events_by_kind
            .entry(record.event.kind())
            .or_default() += 1;
        match &record.event {
            StoreEvent::TrialStarted {
                trial_id, attempt, ..
            } => {
                let trial = seen.entry(trial_id.clone()).or_default();
                if trial.stopping {
                    violations.push(format!(
                        "trial {trial_id}: attempt {attempt} started after the manager decided to end it"
                    ));
                }
                if *attempt != trial.current + 1 {
                    violations.push(format!(
                        "trial {trial_id}: attempt {attempt} started after attempt {}",
                        trial.current
                    ));
                }
                trial.current = *attempt;
                *trial.starts.entry(*attempt).or_default() += 1;
            }
            StoreEvent::TrialEnded {
                trial_id, attempt, ..
            } => {
                let trial = seen.entry(trial_id.clone()).or_default();
                if *attempt != trial.current {
                    violations.push(format!(
                        "trial {trial_id}: an end of attempt {attempt} while attempt {} is current",
                        trial.current
                    ));
                }
                *trial.ends.entry(*attempt).or_default() += 1;
            }
            StoreEvent::TrialStopping {
                trial_id,
                status,
                message,
            } => {
                seen.entry(trial_id.clone()).or_default().stopping =
                    !stopped_with_experiment(*status, Some(message));
            }
            StoreEvent::TrialRequeued { trial_id, .. } => {
                let trial = seen.entry(trial_id.clone()).or_default();
                if trial.stopping {
                    violations.push(format!(
                        "trial {trial_id}: requeued after the manager decided to end it"
                    ));
                }
                *trial.requeues.entry(trial.current).or_default() += 1;
            }
            _ => {}
        }
    }
    for trial in &state.trials {
        let id = &trial.trial_id;
        if !trial.status.is_final() {
            violations.push(format!(
                "trial {id} is {} after the experiment ended",
                trial.status.as_str()
            ));
        }
        let Some(seen) = seen.get(id) else {
            violations.push(format!("trial {id} never started nor ended"));
            continue;
        };
        let last = seen.current;
        // Attempt 0 is a trial that never started; it only ends.
        for attempt in last.min(1)..=last {
            let starts = seen.starts.get(&attempt).copied().unwrap_or(0);
            let ends = seen.ends.get(&attempt).copied().unwrap_or(0);
            let requeues = seen.requeues.get(&attempt).copied().unwrap_or(0);
            if attempt > 0 && starts != 1 {
                violations.push(format!(
                    "trial {id}: attempt {attempt} started {starts} times"
                ));
            }
            if attempt < last {
                // Given up for the next one: requeued once, ended at most once (a host loss).
                if requeues != 1 || ends > 1 {
                    violations.push(format!(
                        "trial {id}: attempt {attempt} of {last} was requeued {requeues} times and ended {ends} times"
                    ));
                }
            } else if !(requeues == 0 && ends == 1 || requeues == 1 && (1..=2).contains(&ends)) {
                // The last attempt ends once; one requeued and never followed by a start (the
                // experiment ended first) also carries the trial's end.
                violations.push(format!(
                    "trial {id}: its last attempt {attempt} ended {ends} times and was requeued {requeues} times"
                ));
            }
        }
        if trial.attempts.len() as u32 != last {
            violations.push(format!(
                "trial {id}: the replay has {} attempts, the log {last}",
                trial.attempts.len()
            ));
        }
    }
}

/// A trial the user killed ends USER_CANCELED (SYS_CANCELED when the experiment's deadline
/// ended it first), however its start went.
fn killed_by_the_user(
    state: &ExperimentState,
    world: &Shared,
    deadline_passed: bool,
    violations: &mut Vec<String>,
) {
    let world = world.lock();
    for trial in &state.trials {
        let killed = world
            .trials
            .get(&trial.trial_id)
            .is_some_and(|record| record.killed_by_user);
        let as_asked = trial.status == TrialStatus::UserCanceled
            || deadline_passed && trial.status == TrialStatus::SysCanceled;
        if killed && !as_asked {
            violations.push(format!(
                "trial {}: killed by the user, it ended {}",
                trial.trial_id,
                trial.status.as_str()
            ));
        }
    }
}

/// The replayed state, the store's tables and the manager's own account agree on every trial.
fn replay_agrees(
    reader: &StoreReader,
    state: &ExperimentState,
    outcome: &Outcome,
    violations: &mut Vec<String>,
) {
    let rows = match reader.trials(&TrialQuery::default()) {
        Ok(rows) => rows,
        Err(e) => {
            violations.push(format!("the trial table cannot be read: {e}"));
            return;
        }
    };
    let replayed: BTreeMap<&str, _> = state
        .trials
        .iter()
        .map(|t| (t.trial_id.as_str(), t))
        .collect();
    if rows.len() != state.trials.len() || outcome.trials.len() != state.trials.len() {
        violations.push(format!(
            "{} trials replayed, {} in the table, {} in the manager's outcome",
            state.trials.len(),
            rows.len(),
            outcome.trials.len()
        ));
    }
    let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => a == b || (a.is_nan() && b.is_nan()),
        (None, None) => true,
        _ => false,
    };
    for row in &rows {
        let Some(trial) = replayed.get(row.trial_id.as_str()) else {
            violations.push(format!(
                "trial {} is in the table, not in the replay",
                row.trial_id
            ));
            continue;
        };
        let final_value = trial.final_metric().and_then(|m| m.value);
        if row.status != trial.status
            || row.attempts as usize != trial.attempts.len()
            || !same(row.final_value, final_value)
        {
            violations.push(format!(
                "trial {}: the table says {} after {} attempts, final {:?}; the replay {} after {}, final {:?}",
                row.trial_id,
                row.status.as_str(),
                row.attempts,
                row.final_value,
                trial.status.as_str(),
                trial.attempts.len(),
                final_value
            ));
        }
    }
    for summary in &outcome.trials {
        let Some(trial) = replayed.get(summary.id.as_str()) else {
            violations.push(format!("trial {} ran but is not in the store", summary.id));
            continue;
        };
        let final_value = trial.final_metric().map(|m| m.value.unwrap_or(f64::NAN));
        if summary.status != trial.status || !same(summary.final_value, final_value) {
            violations.push(format!(
                "trial {}: the manager ended it {} with final {:?}, the store replays {} with {:?}",
                summary.id,
                summary.status.as_str(),
                summary.final_value,
                trial.status.as_str(),
                final_value
            ));
        }
    }
}

/// `maxTrialNumber`, the tuner's budget, `maxTrialRetries` (+ `maxOomRetries`), and the world's
/// own view of how often each trial ran.
fn budgets(
    scenario: &Scenario,
    state: &ExperimentState,
    world: &Shared,
    retries_closed: bool,
    violations: &mut Vec<String>,
) {
    let trials = state.trials.len() as u64;
    if trials > scenario.max_trial_number {
        violations.push(format!(
            "{trials} trials created, over maxTrialNumber {}",
            scenario.max_trial_number
        ));
    }
    if let Some(budget) = scenario.tuner_budget {
        if trials > budget {
            violations.push(format!(
                "{trials} trials created from a tuner that handed out {budget} parameter sets"
            ));
        }
    }
    let world = world.lock();
    for trial in &state.trials {
        let id = &trial.trial_id;
        let seen = world.trials.get(id).cloned().unwrap_or_default();
        if seen.starts as usize != trial.attempts.len() {
            violations.push(format!(
                "trial {id}: the service started it {} times, the store has {} attempts",
                seen.starts,
                trial.attempts.len()
            ));
        }
        let failures = trial
            .attempts
            .iter()
            .filter(|attempt| attempt.requeued.is_some())
            .count() as u32;
        let lost = seen.lost_after_start.min(HOST_LOSS_REQUEUES);
        let allowed = scenario.max_trial_retries
            + if seen.ooms > 0 {
                scenario.max_oom_retries
            } else {
                0
            };
        // Requeues for the trial's own failures, host losses and a crashed manager's aside.
        let own = failures
            .saturating_sub(lost)
            .saturating_sub(seen.crash_lost_after_start);
        if own > allowed {
            violations.push(format!(
                "trial {id} was run again {own} times for its own failures, over maxTrialRetries {} (+ maxOomRetries {} after an OOM)",
                scenario.max_trial_retries, scenario.max_oom_retries
            ));
        }
        // A start the service refused ran nothing: it is tried again (a few times, see the
        // manager's START_RETRIES), and does not count against the trial's retries.
        let bound = 1 + allowed + seen.host_losses + seen.crash_losses + seen.start_failures;
        if seen.requests > bound {
            violations.push(format!(
                "trial {id}: started {} times with {} host losses, {} runs left by a crashed manager and {} refused starts, at most {bound} allowed",
                seen.requests, seen.host_losses, seen.crash_losses, seen.start_failures
            ));
        }
        // A plain failure (no OOM, not the host) is owed its retries.
        let plain_failure = trial.status == TrialStatus::Failed
            && trial
                .end
                .as_ref()
                .is_some_and(|end| end.exit_code == Some(1));
        if plain_failure && seen.ooms == 0 && !retries_closed && own < scenario.max_trial_retries {
            violations.push(format!(
                "trial {id} failed for good after {own} retries for its own failures ({} host losses), though maxTrialRetries is {}",
                seen.host_losses, scenario.max_trial_retries
            ));
        }
    }
}

/// No trial waits for ever behind younger ones: once a younger trial was first placed, an older
/// one is placed within a bound (retry backoff, a trial's length, a slow start, host outages);
/// and in an experiment that ended by itself every trial ran.
fn no_starvation(
    scenario: &Scenario,
    state: &ExperimentState,
    world: &Shared,
    violations: &mut Vec<String>,
) {
    let world = world.lock();
    let bound = Duration::from_secs(65 + 10)
        + scenario.duration.1
        + scenario.slow_start
        + scenario.host_down.1 * scenario.host_losses;
    // The earliest first placement among trials younger than each sequence.
    let mut youngest_first = BTreeMap::new();
    let mut earliest: Option<Duration> = None;
    for (&sequence, &at) in world.first_request_by_sequence.iter().rev() {
        youngest_first.insert(sequence, earliest);
        earliest = Some(earliest.map_or(at, |e: Duration| e.min(at)));
    }
    for trial in &state.trials {
        let seen = world.trials.get(&trial.trial_id);
        let first = seen.and_then(|seen| seen.first_request);
        let Some(first) = first else {
            if trial.status != TrialStatus::UserCanceled {
                violations.push(format!(
                    "trial {} (sequence {}) never ran ({}) in an experiment that ended by itself",
                    trial.trial_id,
                    trial.sequence,
                    trial.status.as_str()
                ));
            }
            continue;
        };
        if let Some(Some(younger)) = youngest_first.get(&trial.sequence) {
            if first > *younger + bound {
                violations.push(format!(
                    "trial {} (sequence {}) was first placed at {}, {} after a younger trial (bound {})",
                    trial.trial_id,
                    trial.sequence,
                    seconds(first),
                    seconds(first - *younger),
                    seconds(bound)
                ));
            }
        }
    }
}
