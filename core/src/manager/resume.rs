//! Continuing an experiment from its store (`knob resume`), and new attempts of a trial
//! (retries, and trials that were running when the manager stopped).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use knob_plugin_api::population::Lineage as TunerLineage;
use knob_plugin_api::ImportedTrial;

use super::trial::Trial;
use super::{Manager, ManagerError};
use crate::objectives::intermediate_value;
use crate::store::{EventSeq, ExperimentState, MetricKind, MetricRecord, StoreEvent, TrialStatus};

impl Manager {
    /// Rebuilds the loop's state from the store: finished trials stay as they are (and are
    /// handed to the tuner), trials that were waiting wait again, trials that were running get
    /// a new attempt (whatever is left of their processes is killed first), id counters and the
    /// duration budget continue where they stopped.
    pub(super) async fn restore(&mut self, state: &ExperimentState) -> Result<(), ManagerError> {
        self.book.continue_from(state.counters.next_trial_sequence);
        self.tuner.continue_from(state.counters.next_parameter_id);
        let spent = Duration::from_millis(
            u64::try_from(state.active_time_ms(state.last_alive_ms)).unwrap_or(0),
        );
        self.timers
            .resume(spent, self.config.max_experiment_duration);
        let mut imported = Vec::new();
        let parameter_ids: HashMap<&str, u64> = state
            .trials
            .iter()
            .map(|t| (t.trial_id.as_str(), t.parameter_id))
            .collect();
        for stored in &state.trials {
            let attempt = stored.current_attempt();
            let mut trial = Trial::new(
                stored.trial_id.clone(),
                stored.sequence,
                stored.parameter_id,
                stored.parameters.clone(),
            );
            trial.attempt = attempt;
            trial.parameter_label = stored.parameter_label.clone();
            trial.lineage = stored.lineage.clone();
            trial.memory_request_mib = stored.memory_request_mib;
            trial.gpu_memory_request_mib = stored.gpu_memory_request_mib;
            // Attempts lost with their host still do not count against `maxTrialRetries`
            // (attempts handed to a lost host but never started left no record: the bound of
            // host-loss requeues counts only the recorded ones), nor do attempts cut short by
            // the manager stopping or the experiment being stopped (found by the simulator:
            // after a crash and `knob resume`, a trial had one retry less).
            trial.host_losses = host_lost_attempts(stored);
            trial.lost_attempts = trial.host_losses + interrupted_attempts(stored);
            let this_attempt = |kind| {
                stored
                    .metrics
                    .iter()
                    .filter(move |m| m.attempt == attempt && m.kind == kind)
            };
            // A final stored without a value (NaN, ±Infinity, unreadable) is imported as NaN,
            // the worst, as the live run handed it to the tuner.
            let stored_final = this_attempt(MetricKind::Final).next();
            trial.final_value = stored_final.map(|m| m.value.unwrap_or(f64::NAN));
            trial.infeasible = stored_final.is_some_and(|m| {
                !crate::objectives::meets_constraints(&self.config.objectives, &m.raw)
            });
            trial.result_ranks = stored_final.is_some_and(|m| {
                crate::objectives::Ranking::new(self.config.direction(), &self.config.objectives)
                    .result_ranks(m.value, Some(&m.raw))
            });
            trial.intermediate = std::sync::Arc::new(
                this_attempt(MetricKind::Intermediate)
                    .filter_map(|m| m.value)
                    .collect(),
            );
            trial.reason = stored.end.as_ref().and_then(|end| end.message.clone());
            let id = trial.id.clone();
            self.book.insert(trial);
            // A trial cancelled by a stop of the experiment did not end on its own: like one
            // that was running at a crash, it runs again (the user's own kills stay ended).
            let stopped_with_experiment = stored
                .end
                .as_ref()
                .is_some_and(|end| end.stopped_with_experiment());
            // One the manager had decided to end (stopped by the tuner or the assessor, killed
            // by the user, past maxTrialDuration) ends now as decided, though its end was not
            // recorded before the manager stopped. Run again, a population member the tuner had
            // replaced would train on beside its successor: two members in one slot.
            let mut status = stored.status;
            if let Some(stop) = stored
                .stopping
                .as_ref()
                .filter(|stop| !status.is_final() && !stop.with_experiment())
            {
                self.store
                    .append(StoreEvent::TrialEnded {
                        trial_id: id.clone(),
                        attempt,
                        status: stop.status,
                        exit_code: None,
                        signal: None,
                        message: Some(stop.message.clone()),
                        stderr_tail: None,
                        peak_memory_mib: None,
                        peak_gpu_memory_mib: None,
                        ended_ms: None,
                    })
                    .await?;
                self.book.known(&id).reason = Some(stop.message.clone());
                status = stop.status;
            }
            // Every trial is imported, those without a result too: the tuner handed them out,
            // and a seeded one that did not hear of them drew their parameters again.
            let objectives = &self.config.objectives;
            if status.is_final() && !stopped_with_experiment {
                self.book.set_status(&id, status);
                let final_value = self.book[&id].final_value;
                imported.push(import_record(
                    objectives,
                    self.tuner.takes_whole_metrics(),
                    &parameter_ids,
                    stored,
                    status,
                    final_value,
                ));
                continue;
            }
            // It runs again, so it is imported as waiting for its new attempt, as after a
            // crash (RUNNING then): imported USER_CANCELED, it read as ended, and PBT counted
            // the members a graceful stop cancelled as dead and never judged them again.
            let status = if stopped_with_experiment {
                TrialStatus::Waiting
            } else {
                status
            };
            imported.push(import_record(
                objectives,
                false,
                &parameter_ids,
                stored,
                status,
                None,
            ));
            // Not finished: run it again (its services ended what was left of it, see
            // `unfinished_trials`).
            // The attempt given up here ran and was not given up before.
            let cut_short = stored
                .attempts
                .last()
                .is_some_and(|attempt| attempt.requeued.is_none());
            if cut_short && (stored.status == TrialStatus::Running || stopped_with_experiment) {
                self.book.known(&id).lost_attempts += 1;
            }
            if stored.status == TrialStatus::Running {
                self.requeue(&id, MANAGER_STOPPED.into(), Duration::ZERO)
                    .await?;
            } else if stopped_with_experiment {
                let reason = match stored.status {
                    TrialStatus::SysCanceled => EXPERIMENT_FAILED,
                    _ => EXPERIMENT_STOPPED,
                };
                self.requeue(&id, reason.into(), Duration::ZERO).await?;
            }
            // Until it starts again, its end is the one its last attempt had in the run before.
            if let Some(ended_ms) = last_attempt_end_ms(stored) {
                self.book.known(&id).last_attempt_end_ms = Some(ended_ms);
            }
        }
        if !imported.is_empty() {
            self.tuner.import(imported).await?;
        }
        // What the run before the crash ended but did not get to delete: checkpoints no member
        // needs, and the copies successors ended for good started from (a crash between a
        // successor's recorded end and `drop_snapshot` leaves its copy behind).
        self.collect_checkpoints().await;
        let ended: Vec<(String, TrialStatus)> = self
            .book
            .all()
            .filter(|t| t.status.is_final())
            .map(|t| (t.id.clone(), t.status))
            .collect();
        for (trial_id, status) in ended {
            self.drop_snapshot(&trial_id, status);
        }
        self.replay_to_assessor(state);
        Ok(())
    }

    /// A resume that failed before the earlier run's trials were taken back
    /// ([`Manager::restore`]; no environment can run trials, say): those not ended (RUNNING at
    /// the crash, WAITING) are recorded SYS_CANCELED as a failed experiment's are, so that the
    /// next `knob resume` runs them again, and `error` names them. Left as they were, they read
    /// RUNNING for ever in `knob trial ls` and the dashboard, with no run left to end them.
    /// Recording is best effort: the error is what the user needs first.
    pub(super) async fn cancel_not_restored(
        &mut self,
        history: &ExperimentState,
        error: ManagerError,
    ) -> ManagerError {
        let mut cancelled = Vec::new();
        for stored in history.trials.iter().filter(|t| !t.status.is_final()) {
            let ended = self
                .store
                .append(StoreEvent::TrialEnded {
                    trial_id: stored.trial_id.clone(),
                    attempt: stored.current_attempt(),
                    status: TrialStatus::SysCanceled,
                    exit_code: None,
                    signal: None,
                    message: Some(crate::store::CANCELED_WITH_FAILED_EXPERIMENT.into()),
                    stderr_tail: None,
                    peak_memory_mib: None,
                    peak_gpu_memory_mib: None,
                    ended_ms: last_attempt_end_ms(stored),
                })
                .await;
            if ended.is_ok() {
                cancelled.push(stored.trial_id.clone());
            }
        }
        if cancelled.is_empty() {
            return error;
        }
        let id = &self.id;
        let named = format!(
            "trial(s) {} of the earlier run did not run again and are recorded SYS_CANCELED; `knob resume {id}` runs them again once this is fixed",
            cancelled.join(", ")
        );
        match error {
            ManagerError::NoEnvironment(message) => {
                ManagerError::NoEnvironment(format!("{message}; {named}"))
            }
            ManagerError::Placement(message) => {
                ManagerError::Placement(format!("{message}; {named}"))
            }
            ManagerError::Service { service, message } => ManagerError::Service {
                service,
                message: format!("{message}; {named}"),
            },
            other => other,
        }
    }

    /// Rebuilds the assessor's knowledge (Medianstop's completed trials, ASHA's rungs) by telling
    /// it again what the live run told it, in the order it did: each intermediate result in log
    /// order, interleaved across trials, with its attempt's history up to it (none recorded once
    /// the manager had decided to end the attempt: no assessor judged those); each attempt's
    /// first final result; the end of each trial that stays ended, where it was recorded. The
    /// verdicts are ignored: live, these trials went on past each result told here. Told whole
    /// histories at once in the order trials ended, ASHA stopped a trial at a rung where the
    /// replay put it below trials that got there after it live, never recorded its later rungs,
    /// and so let trials it should have stopped run to their end.
    ///
    /// Told, not waited for: the assessor takes them before any later call, and a failure
    /// comes back as a warning about its trial (a stuck assessor held the resume,
    /// `AssessorDriver`).
    fn replay_to_assessor(&mut self, state: &ExperimentState) {
        let Some(assessor) = &mut self.assessor else {
            return;
        };
        enum Told<'a> {
            Metric(&'a MetricRecord),
            End(&'a str, TrialStatus),
        }
        let mut told: Vec<(EventSeq, Told)> = Vec::new();
        for stored in &state.trials {
            told.extend(
                stored
                    .metrics
                    .iter()
                    .filter(|m| stored.metrics_after_stopping.binary_search(&m.seq).is_err())
                    .map(|m| (m.seq, Told::Metric(m))),
            );
            // One that runs again goes on without an end, as a retry does live.
            let status = self.book[&stored.trial_id].status;
            if status.is_final() {
                // Ended by `restore` (its end decided, not recorded): after all that was.
                let seq = stored.end.as_ref().map_or(EventSeq::MAX, |end| end.seq);
                told.push((seq, Told::End(&stored.trial_id, status)));
            }
        }
        told.sort_by_key(|(seq, _)| *seq);

        let objectives = &self.config.objectives;
        // Per trial, the attempt its history belongs to and that history so far.
        let mut histories: HashMap<&str, (u32, Arc<Vec<f64>>)> = HashMap::new();
        let mut finals_told: HashSet<(&str, u32)> = HashSet::new();
        for (_, told) in told {
            match told {
                Told::Metric(metric) if metric.kind == MetricKind::Intermediate => {
                    // A value stored as none is NaN or ±Infinity, which the assessor saw, or
                    // unreadable, which it did not (`on_metrics`).
                    let value = match metric.value {
                        Some(value) => value,
                        None => match intermediate_value(objectives, &metric.raw) {
                            Ok(value) => super::events::as_result(value),
                            Err(_) => continue,
                        },
                    };
                    let (attempt, history) = histories
                        .entry(&metric.trial_id)
                        .or_insert_with(|| (metric.attempt, Arc::default()));
                    // A new attempt starts a new history, as a retry's does live.
                    if *attempt != metric.attempt {
                        *attempt = metric.attempt;
                        *history = Arc::default();
                    }
                    Arc::make_mut(history).push(value);
                    assessor.replay_assess(metric.trial_id.clone(), history.clone());
                }
                Told::Metric(metric) => {
                    // A second final was ignored live.
                    if !finals_told.insert((&metric.trial_id, metric.attempt)) {
                        continue;
                    }
                    let value = metric.value.unwrap_or(f64::NAN);
                    assessor.trial_final(metric.trial_id.clone(), value);
                }
                Told::End(trial_id, status) => {
                    histories.remove(trial_id);
                    assessor.trial_end(trial_id.to_string(), status.as_str());
                }
            }
        }
    }

    /// Takes a started trial back to WAITING for a new attempt, after `backoff`.
    pub(super) async fn requeue(
        &mut self,
        trial_id: &str,
        reason: String,
        backoff: Duration,
    ) -> Result<(), ManagerError> {
        self.requeue_after(trial_id, None, reason, backoff).await
    }

    /// [`requeue`](Self::requeue), recording first how the attempt ended (`TrialEnded`), in the
    /// same transaction: a crash in between would leave the trial ended for good.
    pub(super) async fn requeue_after(
        &mut self,
        trial_id: &str,
        attempt_end: Option<StoreEvent>,
        reason: String,
        backoff: Duration,
    ) -> Result<(), ManagerError> {
        let requeued = StoreEvent::TrialRequeued {
            trial_id: trial_id.to_string(),
            reason,
            memory_request_mib: self.book[trial_id].memory_request_mib,
            gpu_memory_request_mib: self.book[trial_id].gpu_memory_request_mib,
            peak_memory_mib: self.book[trial_id].peak_memory_mib,
            peak_gpu_memory_mib: self.book[trial_id].peak_gpu_memory_mib,
        };
        let ended_ms = match &attempt_end {
            Some(StoreEvent::TrialEnded {
                ended_ms: Some(ended_ms),
                ..
            }) => *ended_ms,
            _ => crate::store::now_ms(),
        };
        match attempt_end {
            Some(end) => self.store.append_together(vec![end, requeued]).await?,
            None => self.store.append(requeued).await?,
        };
        self.environments.release(trial_id);
        let not_before = (!backoff.is_zero()).then(|| Instant::now() + backoff);
        self.book.new_attempt(trial_id, not_before);
        self.book.known(trial_id).last_attempt_end_ms = Some(ended_ms);
        self.publish(None);
        Ok(())
    }

    /// Once the experiment is stopping, failed trials end instead of trying again.
    pub(super) fn closed_for_retries(&self) -> bool {
        self.stop_requested || self.timers.deadline_passed()
    }
}

/// What the tuner is told about a trial of the earlier run (see `ImportedTrial`): its result,
/// `None` for a trial that reported none (it ended without one, or it runs again), with the
/// final as reported for a tuner that takes `whole_metrics`.
fn import_record(
    objectives: &[crate::config::ObjectiveConfig],
    whole_metrics: bool,
    parameter_ids: &HashMap<&str, u64>,
    stored: &crate::store::TrialState,
    status: TrialStatus,
    result: Option<f64>,
) -> ImportedTrial {
    let mut record = match result {
        Some(value) => ImportedTrial::new(stored.parameters.clone(), value),
        None => ImportedTrial::without_result(stored.parameters.clone(), status.as_str()),
    };
    // With `objectives`, the outcome is read again from the final as sent (a tuner that takes
    // objectives gets it; the host strips it for any other).
    if !objectives.is_empty() && result.is_some_and(|value| !value.is_nan()) {
        record.objectives = stored
            .final_metric()
            .and_then(|m| crate::objectives::outcome(objectives, &m.raw).ok());
    }
    // The final as sent, for a tuner that takes whole metrics.
    if whole_metrics && result.is_some_and(|value| !value.is_nan()) {
        record.metric = stored
            .final_metric()
            .and_then(|m| knob_plugin_api::metric::parse_lenient(&m.raw).ok());
    }
    record.parameter_id = Some(stored.parameter_id);
    record.label = stored.parameter_label.clone();
    record.status = Some(status.as_str().to_string());
    // A population member that runs again counts its steps on from its parent's and its own
    // earlier attempts' (PBT had forgotten them: burn-in began again, lineages named wrong steps).
    let parameter_id_of = |trial: &Option<String>| {
        trial
            .as_deref()
            .and_then(|trial| parameter_ids.get(trial).copied())
    };
    record.lineage = stored.lineage.as_ref().map(|lineage| TunerLineage {
        parent: parameter_id_of(&lineage.parent),
        replaces: parameter_id_of(&lineage.replaces),
        parent_step: lineage.parent_step,
    });
    record.intermediate_results = stored
        .metrics
        .iter()
        .filter(|m| m.kind == MetricKind::Intermediate)
        .count() as u64;
    record
}

/// When a stored trial's last attempt ended, or was given up (one running at a crash, on the
/// resume after it); `None` for a trial that never started.
fn last_attempt_end_ms(stored: &crate::store::TrialState) -> Option<i64> {
    let last = stored.attempts.last()?;
    last.end
        .as_ref()
        .map(|end| end.time_ms)
        .or_else(|| last.requeued.as_ref().map(|requeued| requeued.time_ms))
}

/// How many attempts of a stored trial were lost with their host and run again: ended FAILED
/// with the message `on_environment_lost` records, then requeued.
/// Why an attempt running when the manager stopped is given up on resume.
const MANAGER_STOPPED: &str = "the manager stopped while it ran";
/// Why an attempt cancelled by a stop of the experiment is given up on resume.
const EXPERIMENT_STOPPED: &str = "the experiment was stopped before it ended";
/// Why an attempt cancelled by a failure of the experiment is given up on resume.
const EXPERIMENT_FAILED: &str = "the experiment failed before it ended";

/// Attempts an earlier resume gave up because the manager or the experiment stopped while they
/// ran: not the trial's failures.
fn interrupted_attempts(stored: &crate::store::TrialState) -> u32 {
    let interrupted = stored
        .attempts
        .iter()
        .filter(|attempt| {
            attempt.requeued.as_ref().is_some_and(|r| {
                [MANAGER_STOPPED, EXPERIMENT_STOPPED, EXPERIMENT_FAILED]
                    .contains(&r.reason.as_str())
            })
        })
        .count();
    u32::try_from(interrupted).unwrap_or(u32::MAX)
}

fn host_lost_attempts(stored: &crate::store::TrialState) -> u32 {
    let lost = stored
        .attempts
        .iter()
        .filter(|attempt| {
            attempt.requeued.is_some()
                && attempt.end.as_ref().is_some_and(|end| {
                    end.status == TrialStatus::Failed
                        && end
                            .message
                            .as_deref()
                            .is_some_and(|m| m.starts_with(super::events::ENVIRONMENT_LOST))
                })
        })
        .count();
    u32::try_from(lost).unwrap_or(u32::MAX)
}

/// The trials of an earlier run that run again on resume: those not ended, and those a stop of
/// the experiment cancelled. Their services end what is left of them first
/// (`TrainingService::clean_up_leftovers`), so that none runs twice.
pub(super) fn unfinished_trials(state: &ExperimentState) -> Vec<String> {
    state
        .trials
        .iter()
        .filter(|stored| {
            !stored.status.is_final()
                || stored
                    .end
                    .as_ref()
                    .is_some_and(|end| end.stopped_with_experiment())
        })
        .map(|stored| stored.trial_id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Requeue, TrialAttempt, TrialEnd, TrialState};
    use serde_json::json;

    fn attempt(number: u32, end: Option<(TrialStatus, &str)>, requeued: bool) -> TrialAttempt {
        TrialAttempt {
            number,
            environment_id: format!("env-{number}"),
            gpu_indices: Vec::new(),
            pid: Some(100 + number),
            started_ms: i64::from(number) * 1000,
            end: end.map(|(status, message)| TrialEnd {
                seq: 0,
                time_ms: i64::from(number) * 1000 + 500,
                status,
                exit_code: None,
                signal: None,
                message: Some(message.to_string()),
                stderr_tail: None,
            }),
            requeued: requeued.then(|| Requeue {
                time_ms: i64::from(number) * 1000 + 600,
                reason: "running it again".into(),
                memory_request_mib: None,
                gpu_memory_request_mib: None,
            }),
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
        }
    }

    /// After `knob resume`, an attempt lost with its host still does not count against
    /// `maxTrialRetries`: the lost attempt is read back from the store as the manager
    /// recorded it.
    #[test]
    fn attempts_lost_with_their_host_are_counted_again_on_resume() {
        let lost = format!(
            "{}ssh to node-3 failed",
            super::super::events::ENVIRONMENT_LOST
        );
        let stored = TrialState {
            trial_id: "abcde".into(),
            sequence: 0,
            parameter_id: 0,
            parameter_label: None,
            parameters: json!({ "x": 1 }),
            lineage: None,
            status: TrialStatus::Running,
            created_ms: 0,
            attempts: vec![
                attempt(1, Some((TrialStatus::Failed, &lost)), true),
                attempt(2, Some((TrialStatus::Failed, "exit code 1")), true),
                // A message that merely mentions a lost environment, not the manager's record.
                attempt(
                    3,
                    Some((TrialStatus::Failed, "the environment lost: x")),
                    true,
                ),
                // Lost with its host but the trial was not run again (its end).
                attempt(4, Some((TrialStatus::Failed, &lost)), false),
                attempt(5, None, false),
            ],
            end: None,
            stopping: None,
            metrics: Vec::new(),
            metrics_after_stopping: Vec::new(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
        };
        assert_eq!(host_lost_attempts(&stored), 1);

        // What `restore` builds from it: attempt 5, of which one was lost, so four count and
        // with `maxTrialRetries: 4` it may run once more if this attempt fails (counting the
        // lost attempt, it could not).
        let mut book = super::super::book::TrialBook::new(true);
        let mut trial = Trial::new("abcde".into(), 0, 0, json!({ "x": 1 }));
        trial.attempt = stored.current_attempt();
        trial.lost_attempts = host_lost_attempts(&stored);
        book.insert(trial);
        assert!(book.may_retry("abcde", 4));
        assert!(!book.may_retry("abcde", 3));
    }

    /// A resumed PBT member counts its steps on from its parent's and its own earlier attempts':
    /// the tuner is told its lineage (in parameter ids) and its results in all attempts.
    #[test]
    fn a_member_is_imported_with_its_lineage_and_its_results_in_all_attempts() {
        let metric = |attempt, kind| MetricRecord {
            seq: 0,
            time_ms: 0,
            trial_id: "succ".into(),
            attempt,
            kind,
            trial_sequence: 1,
            raw: "0.5".into(),
            value: Some(0.5),
        };
        let stored = TrialState {
            trial_id: "succ".into(),
            sequence: 1,
            parameter_id: 7,
            parameter_label: Some("m0-7".into()),
            parameters: json!({ "x": 1 }),
            lineage: Some(crate::store::Lineage {
                parent: Some("par".into()),
                replaces: Some("old".into()),
                parent_step: Some(12),
            }),
            status: TrialStatus::Running,
            created_ms: 0,
            attempts: vec![attempt(1, None, true), attempt(2, None, false)],
            end: None,
            stopping: None,
            metrics: vec![
                metric(1, MetricKind::Intermediate),
                metric(1, MetricKind::Intermediate),
                metric(2, MetricKind::Intermediate),
                metric(2, MetricKind::Final),
            ],
            metrics_after_stopping: Vec::new(),
            memory_request_mib: None,
            gpu_memory_request_mib: None,
        };
        let parameter_ids = HashMap::from([("par", 3), ("old", 5), ("succ", 7)]);
        let record = import_record(
            &[],
            false,
            &parameter_ids,
            &stored,
            TrialStatus::Running,
            None,
        );
        assert_eq!(
            record.lineage,
            Some(TunerLineage {
                parent: Some(3),
                replaces: Some(5),
                parent_step: Some(12),
            })
        );
        assert_eq!(record.intermediate_results, 3);
    }
}
