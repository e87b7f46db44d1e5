//! What the training service reports: trial starts, metrics and ends, and warnings.

use knob_plugin_api::metric::default_value;
use knob_plugin_api::service::{MetricKind, ServiceEvent};

use super::services::{TaggedEvent, MAX_HOST_LOSS_REQUEUES};
use super::timers::retry_backoff;

/// How the end message of an attempt lost with its host begins: `knob resume` reads it back to
/// count such attempts again (they do not count against `maxTrialRetries`).
pub(super) const ENVIRONMENT_LOST: &str = "environment lost: ";
use super::event_loop::Turn;
use super::{trial, Manager, ManagerError};
use crate::store::{
    MetricKind as StoredMetricKind, Rejection, StoreError, StoreEvent, TrialStatus,
};

impl Manager {
    pub(super) async fn on_service_event(
        &mut self,
        service: usize,
        event: ServiceEvent,
    ) -> Result<(), ManagerError> {
        match event {
            ServiceEvent::Environment { environment } => {
                self.on_environment(service, environment).await?
            }
            ServiceEvent::TrialStarted { trial_id, pid } => {
                let Some(trial) = self.book.get(&trial_id) else {
                    return self
                        .warn(Some(trial_id), "start reported for an unknown trial".into())
                        .await;
                };
                if trial.service != Some(service) {
                    let platform = self.services[service].platform.clone();
                    return self
                        .warn(
                            Some(trial_id),
                            format!("start reported by training service {platform}, which was not asked to run it; ignored"),
                        )
                        .await;
                }
                if trial.status.is_final() {
                    // Its end came first (see `TrialEnded` below): the trial is over as far as
                    // the store says, and what this run reports is not recorded.
                    let platform = self.services[service].platform.clone();
                    return self
                        .warn(
                            Some(trial_id),
                            format!("start reported by training service {platform} after the trial ended; ignored, and so is what it reports from now on"),
                        )
                        .await;
                }
                let deadline = self
                    .config
                    .max_trial_duration
                    .map(|d| tokio::time::Instant::now() + d);
                if let Some(trial) = self.book.start_attempt(&trial_id, pid, deadline) {
                    let attempt = trial.attempt;
                    let environment_id = trial.environment.clone().unwrap_or_default();
                    let gpu_indices = trial.gpu_indices.clone().unwrap_or_default();
                    let event = StoreEvent::TrialStarted {
                        trial_id: trial_id.clone(),
                        attempt,
                        environment_id,
                        gpu_indices,
                        pid,
                    };
                    // Settled later (see `end_trial`): the trial runs already, and the
                    // loop goes on to its other events while this commits.
                    let ack = self.store.append(event);
                    self.unsettled
                        .push_back(super::event_loop::Unsettled::event(ack));
                    let early = std::mem::take(
                        &mut self
                            .book
                            .get_mut(&trial_id)
                            .expect("known trial")
                            .early_metrics,
                    );
                    if !early.is_empty() {
                        let early = early
                            .into_iter()
                            .map(|(kind, sequence, value)| {
                                (service, trial_id.clone(), kind, sequence, value)
                            })
                            .collect();
                        self.on_metrics(early).await?;
                    }
                }
            }
            ServiceEvent::Metric {
                trial_id,
                kind,
                sequence,
                value,
            } => {
                self.on_metrics(vec![(service, trial_id, kind, sequence, value)])
                    .await?;
            }
            ServiceEvent::TrialEnded {
                trial_id,
                exit_code,
                signal,
                stderr_tail,
                // The manager knows why it asked for a kill; see `Trial::kill`.
                killed_reason: _,
                environment_lost,
                ended_ms,
            } => {
                let Some(trial) = self.book.get(&trial_id) else {
                    return self
                        .warn(Some(trial_id), "end reported for an unknown trial".into())
                        .await;
                };
                if trial.status.is_final() {
                    return Ok(());
                }
                if trial.service != Some(service) {
                    let platform = self.services[service].platform.clone();
                    return self
                        .warn(
                            Some(trial_id),
                            format!("end reported by training service {platform}, which was not asked to run it; ignored"),
                        )
                        .await;
                }
                if let Some(lost) = environment_lost {
                    return self.on_environment_lost(&trial_id, lost).await;
                }
                // A kill decided after the trial had ended did not end it: its host, unreachable
                // meanwhile, reports the end only now (a `maxTrialDuration` that ran out while
                // it could not be reached, a stop of the experiment). It ended on its own.
                let kill = trial
                    .kill
                    .as_ref()
                    .filter(|_| !matches!((ended_ms, trial.kill_decided_ms), (Some(ended), Some(decided)) if ended < decided));
                // Its service never reported it started: the store holds no attempt, no result
                // of it can have been recorded, and whether it ran at all is unknown. A clean
                // exit is no success then (it was recorded SUCCEEDED with 0 attempts, and the
                // results of its real run, reported after, were dropped unseen).
                let unstarted = trial.status != TrialStatus::Running;
                let platform = self.services[service].platform.clone();
                let (status, reason) = match (kill, exit_code) {
                    (Some((status, reason)), _) => (*status, Some(reason.clone())),
                    (None, Some(0)) if unstarted => (
                        TrialStatus::Failed,
                        Some(format!(
                            "training service {platform} reported it ended (exit code 0) before reporting it started; no result of it is recorded"
                        )),
                    ),
                    (None, Some(0)) if trial.objective_problem.is_some() => {
                        (TrialStatus::Failed, trial.objective_problem.clone())
                    }
                    (None, Some(0)) => (TrialStatus::Succeeded, trial.final_problem.clone()),
                    (None, _) => (
                        TrialStatus::Failed,
                        Some(trial::failure_reason(exit_code, signal, &stderr_tail)),
                    ),
                };
                let oom = trial::out_of_memory(exit_code, signal, &stderr_tail);
                let retries = self.config.max_trial_retries
                    + if oom.is_some() {
                        self.config.max_oom_retries
                    } else {
                        0
                    };
                if unstarted && kill.is_none() {
                    let held = trial.early_metrics.len();
                    let dropped = match held {
                        0 => String::new(),
                        n => format!("; the {n} metric(s) it reported before are dropped"),
                    };
                    self.notice(format!(
                        "trial {trial_id}: training service {platform} reported its end before its start; it ends FAILED{dropped}"
                    ))
                    .await?;
                }
                let trial = &self.book[&trial_id];
                // A trial its service never reported started has no attempt in the store to
                // run again (nor to count against `retries`): it ends FAILED with the service's
                // reason, as a start that failed half-way does (it may have run).
                if status == TrialStatus::Failed
                    && trial.status == TrialStatus::Running
                    && self.book.may_retry(&trial_id, retries)
                    && !self.closed_for_retries()
                {
                    let backoff = retry_backoff(trial.attempt);
                    let mut reason = format!(
                        "attempt {} failed: {}",
                        trial.attempt,
                        reason.unwrap_or_default()
                    );
                    if let (Some(oom), true) = (oom, self.config.max_oom_retries > 0) {
                        reason.push_str(&self.raise_memory_request(&trial_id, oom));
                    }
                    return self.requeue(&trial_id, reason, backoff).await;
                }
                self.end_trial_at(
                    &trial_id,
                    status,
                    reason,
                    exit_code,
                    signal,
                    stderr_tail,
                    ended_ms,
                )
                .await?;
            }
            ServiceEvent::CheckpointSaved { trial_id } => {
                if let Some(trial) = self.book.get_mut(&trial_id) {
                    trial.has_checkpoint = true;
                }
            }
            ServiceEvent::TrialUsage {
                trial_id,
                peak_memory_mib,
                peak_gpu_memory_mib,
            } => {
                if let Some(trial) = self.book.get_mut(&trial_id) {
                    trial.peak_memory_mib = peak_memory_mib;
                    trial.peak_gpu_memory_mib = peak_gpu_memory_mib;
                }
            }
            ServiceEvent::StartFailed { trial_id, message } => {
                let platform = &self.services[service].platform;
                let ignored = match self.book.get(&trial_id) {
                    Some(trial) if trial.service != Some(service) => Some(format!(
                        "training service {platform} reported a failed start of a trial it was not asked to run; ignored: {message}"
                    )),
                    Some(trial) if trial.status == TrialStatus::Waiting && trial.launched => None,
                    // Ended meanwhile (the experiment stopped, the trial was cancelled): the
                    // failure changes nothing.
                    Some(trial) if trial.status.is_final() => return Ok(()),
                    Some(_) => Some(format!(
                        "training service {platform} reported a failed start of a trial that had started; ignored: {message}"
                    )),
                    None => Some(format!(
                        "training service {platform} reported a failed start of an unknown trial; ignored: {message}"
                    )),
                };
                match ignored {
                    // Worded as a refusal in the call is (`place_waiting`).
                    None => {
                        self.on_start_failed(trial_id, format!("could not start: {message}"))
                            .await?
                    }
                    Some(warning) => self.warn(Some(trial_id), warning).await?,
                }
            }
            ServiceEvent::PlaceAgain { trial_id, reason } => {
                self.on_place_again(service, trial_id, reason).await?
            }
            // A service's own warnings (a host unreachable, a connection restored) concern
            // environments, which the console shows; a trial's stay in the store.
            ServiceEvent::Warning {
                trial_id: None,
                message,
            } => self.service_problem(message).await?,
            ServiceEvent::Warning { trial_id, message } => self.warn(trial_id, message).await?,
        }
        Ok(())
    }

    /// Raises the memory request of a trial that ran out of memory (host memory, or GPU memory
    /// for a trial placed on GPUs that ran out of it) from what it asked for and what its
    /// service saw it use; returns the note for its requeue reason ("" when nothing is known
    /// to learn from).
    fn raise_memory_request(&mut self, trial_id: &str, oom: trial::OutOfMemory) -> String {
        let largest_gpu = self.environments.largest_gpu_capacity_mib();
        let room = self.environments.largest_host_memory_room_mib();
        let trial = self.book.get_mut(trial_id).expect("known trial");
        let on_gpus = trial
            .gpu_indices
            .as_ref()
            .is_some_and(|gpus| !gpus.is_empty());
        if oom == trial::OutOfMemory::Gpu && on_gpus {
            let asked = trial
                .gpu_memory_request_mib
                .or(self.config.trial_gpu_memory_mib);
            let peak = trial.peak_gpu_memory_mib;
            let Some(raised) = trial::raised_gpu_memory_request(asked, peak, largest_gpu) else {
                return String::new();
            };
            trial.gpu_memory_request_mib = Some(raised);
            return trial::raised_gpu_memory_note(asked, peak, raised);
        }
        let asked = trial
            .memory_request_mib
            .or(self.config.trial_memory_size_mib);
        let Some(raised) = trial::raised_host_memory_request(asked, trial.peak_memory_mib, room)
        else {
            return String::new();
        };
        trial.memory_request_mib = Some(raised);
        trial::raised_memory_note(
            asked,
            trial.peak_memory_mib,
            trial.peak_gpu_memory_mib,
            raised,
        )
    }

    /// A trial ended because its environment was lost: that attempt is recorded FAILED with the
    /// reason, the environment is forgotten, and the trial runs again elsewhere as a new attempt
    /// (at most [`MAX_HOST_LOSS_REQUEUES`] times; these do not count against
    /// `maxTrialRetries`). A trial the manager was killing anyway ends as it asked.
    async fn on_environment_lost(
        &mut self,
        trial_id: &str,
        lost: String,
    ) -> Result<(), ManagerError> {
        let trial = &self.book[trial_id];
        let environment = trial.environment.clone();
        let kill = trial.kill.clone();
        let losses = trial.host_losses;
        if let Some(environment) = &environment {
            self.lose_environment(environment, &lost).await?;
        }
        if let Some((status, reason)) = kill {
            return self
                .end_trial(trial_id, status, Some(reason), None, None, String::new())
                .await;
        }
        let message = format!("{ENVIRONMENT_LOST}{lost}");
        if losses >= MAX_HOST_LOSS_REQUEUES || self.closed_for_retries() {
            let message = if losses >= MAX_HOST_LOSS_REQUEUES {
                format!(
                    "{message} (its host was lost {} times; not run again)",
                    losses + 1
                )
            } else {
                message
            };
            return self
                .end_trial(
                    trial_id,
                    TrialStatus::Failed,
                    Some(message),
                    None,
                    None,
                    String::new(),
                )
                .await;
        }
        self.book
            .get_mut(trial_id)
            .expect("known trial")
            .host_losses += 1;
        if self.book[trial_id].status != TrialStatus::Running {
            // Handed to the service but never started: nothing to record; place it again.
            self.environments.release(trial_id);
            self.book.unlaunch(trial_id);
            return self
                .warn(
                    Some(trial_id.to_string()),
                    format!("{message}; placing it again"),
                )
                .await;
        }
        self.book
            .get_mut(trial_id)
            .expect("known trial")
            .lost_attempts += 1;
        // The attempt's own record: FAILED, with why. The trial itself goes on.
        let attempt_end = StoreEvent::TrialEnded {
            trial_id: trial_id.to_string(),
            attempt: self.book[trial_id].attempt,
            status: TrialStatus::Failed,
            exit_code: None,
            signal: None,
            message: Some(message.clone()),
            stderr_tail: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
            ended_ms: None,
        };
        self.requeue_after(
            trial_id,
            Some(attempt_end),
            format!(
                "attempt {} failed: {message}; running it again elsewhere (host loss {} of at most {MAX_HOST_LOSS_REQUEUES})",
                self.book[trial_id].attempt,
                losses + 1
            ),
            std::time::Duration::ZERO,
        )
        .await
    }

    /// Handles a batch of service events in order; each run of consecutive metrics is
    /// recorded with one group commit before any of them is acted on. Returns [`Turn::Quiet`]
    /// when the batch was only intermediate results that were recorded and nothing else.
    pub(super) async fn on_service_events(
        &mut self,
        batch: Vec<TaggedEvent>,
    ) -> Result<Turn, ManagerError> {
        let mut metrics = Vec::new();
        let mut turn = Turn::Quiet;
        for (service, event) in batch {
            match event {
                Ok(ServiceEvent::Metric {
                    trial_id,
                    kind,
                    sequence,
                    value,
                }) => {
                    metrics.push((service, trial_id, kind, sequence, value));
                    continue;
                }
                Ok(other) => {
                    self.on_metrics(std::mem::take(&mut metrics)).await?;
                    self.on_service_event(service, other).await?;
                }
                Err(message) => self.warn(None, message).await?,
            }
            turn = Turn::Changed;
        }
        match self.on_metrics(metrics).await? {
            Turn::Quiet => Ok(turn),
            Turn::Changed => Ok(Turn::Changed),
        }
    }

    /// Records metrics, each with the service that reported it (all appends first, then every
    /// acknowledgement), then acts on each. [`Turn::Quiet`] when each was only recorded: an
    /// intermediate result that nothing here acts on.
    pub(super) async fn on_metrics(
        &mut self,
        metrics: Vec<(usize, String, MetricKind, u64, String)>,
    ) -> Result<Turn, ManagerError> {
        let mut turn = Turn::Quiet;
        let mut recorded = Vec::with_capacity(metrics.len());
        for (service, trial_id, kind, sequence, raw) in metrics {
            let Some(trial) = self.book.get(&trial_id) else {
                self.warn(Some(trial_id), "metric for an unknown trial ignored".into())
                    .await?;
                turn = Turn::Changed;
                continue;
            };
            if trial.status.is_final() {
                self.warn(
                    Some(trial_id),
                    "metric after the trial ended ignored".into(),
                )
                .await?;
                turn = Turn::Changed;
                continue;
            }
            if trial.status != TrialStatus::Running {
                self.on_early_metric(service, trial_id, kind, sequence, raw)
                    .await?;
                turn = Turn::Changed;
                continue;
            }
            let decoded = match kind {
                MetricKind::Final if !self.config.objectives.is_empty() => {
                    let read = crate::objectives::outcome(&self.config.objectives, &raw);
                    self.stash_outcome(&trial_id, read)
                }
                MetricKind::Intermediate if !self.config.objectives.is_empty() => {
                    crate::objectives::intermediate_value(&self.config.objectives, &raw)
                }
                _ => default_value(&raw),
            };
            let Some(trial) = self.book.get(&trial_id) else {
                continue;
            };
            // An intermediate result that nothing here acts on (no assessor judges it, no
            // population tuner hears of it) is not waited for: that wait was a park of the loop
            // for the writer's commit on most turns of a long run. `settle` takes its ack.
            let acted_on = matches!(kind, MetricKind::Final)
                || decoded.is_err()
                || self.assessor.is_some()
                || trial.lineage.is_some();
            // A tuner that takes the metric as reported (NNI's, whose user's class may read
            // any entry of a dict) is given its text with the value.
            let whole = (matches!(kind, MetricKind::Final) && self.tuner.takes_whole_metrics())
                .then(|| raw.clone());
            let ack = self.store.append(StoreEvent::Metric {
                trial_id: trial_id.clone(),
                attempt: trial.attempt.max(1),
                kind: match kind {
                    MetricKind::Intermediate => StoredMetricKind::Intermediate,
                    MetricKind::Final => StoredMetricKind::Final,
                },
                trial_sequence: sequence,
                raw,
                value: decoded.as_ref().ok().copied().filter(|v| v.is_finite()),
            });
            if acted_on {
                turn = Turn::Changed;
                recorded.push((ack, trial_id, kind, decoded, whole));
            } else {
                self.unsettled
                    .push_back(super::event_loop::Unsettled::metric(ack, trial_id));
            }
        }
        let mut durable = Vec::with_capacity(recorded.len());
        for (ack, trial_id, kind, decoded, whole) in recorded {
            match ack.await {
                Ok(_) => durable.push((trial_id, kind, decoded, whole)),
                // The same report delivered twice (a retried PUT, say) is stored once.
                Err(StoreError::Rejected {
                    reason: Rejection::DuplicateMetric { .. },
                    ..
                }) => {
                    self.warn(Some(trial_id), "duplicate metric ignored".into())
                        .await?
                }
                Err(e) => return Err(e.into()),
            }
        }
        for (trial_id, kind, decoded, whole) in durable {
            match (kind, decoded) {
                (_, Ok(value)) => self.act_on_metric(trial_id, kind, value, whole).await?,
                (MetricKind::Final, Err(reason))
                    if self
                        .book
                        .get(&trial_id)
                        .is_some_and(|t| t.objective_problem.is_some()) =>
                {
                    self.warn(Some(trial_id.clone()), format!("{reason}; the trial fails"))
                        .await?;
                    if let Some(trial) = self.book.get_mut(&trial_id) {
                        trial.final_value.get_or_insert(f64::NAN);
                    }
                }
                (MetricKind::Final, Err(reason)) => {
                    self.on_unreadable_final(trial_id, reason).await?
                }
                (MetricKind::Intermediate, Err(reason)) => {
                    self.warn(
                        Some(trial_id),
                        format!("{reason}; the assessor does not see it"),
                    )
                    .await?
                }
            }
        }
        Ok(turn)
    }

    /// A metric for a trial its service has not reported started: the store has no attempt to
    /// record it with (it refused it, and that ended the experiment). One for the start the
    /// service was asked for (its output reader ran ahead of its start report) is kept and
    /// recorded once the start is, at most [`MAX_EARLY_METRICS`] of them; any other (a trial
    /// not handed to this service, or waiting to run again) is dropped with a warning.
    async fn on_early_metric(
        &mut self,
        service: usize,
        trial_id: String,
        kind: MetricKind,
        sequence: u64,
        raw: String,
    ) -> Result<(), ManagerError> {
        let platform = self.services[service].platform.clone();
        let trial = self.book.get_mut(&trial_id).expect("known trial");
        let asked = trial.launched && trial.service == Some(service);
        if asked && trial.early_metrics.len() < MAX_EARLY_METRICS {
            trial.early_metrics.push((kind, sequence, raw));
            if trial.early_metrics.len() > 1 {
                return Ok(());
            }
            return self
                .warn(
                    Some(trial_id),
                    format!("training service {platform} reported a metric before it reported the trial started; it is recorded once the start is"),
                )
                .await;
        }
        let why = if asked {
            format!("{MAX_EARLY_METRICS} are held already")
        } else {
            "the trial is not running there".into()
        };
        self.warn(
            Some(trial_id),
            format!("metric reported by training service {platform} before it reported the trial started ignored ({why})"),
        )
        .await
    }

    /// Keeps a final's outcome for the tuner (`act_on_metric`) and gives the number the store
    /// records with it: the first objective's value. A final that lacks a listed metric (or
    /// has one that is not a number) makes the trial fail with the metric named; the tuner is
    /// not given it and learns of the trial through its end.
    fn stash_outcome(
        &mut self,
        trial_id: &str,
        read: Result<knob_plugin_api::Outcome, crate::objectives::OutcomeProblem>,
    ) -> Result<f64, String> {
        let Some(trial) = self.book.get_mut(trial_id) else {
            return Err("unknown trial".into());
        };
        // Only the first final of an attempt counts (a second is recorded and ignored).
        if trial.final_value.is_some()
            || trial.outcome.is_some()
            || trial.objective_problem.is_some()
        {
            return Ok(f64::NAN);
        }
        match read {
            Ok(outcome) => {
                let first = self
                    .config
                    .objectives
                    .iter()
                    .zip(&outcome.values)
                    .find(|(o, _)| o.constraint.is_none())
                    .map_or(f64::NAN, |(_, v)| *v);
                trial.outcome = Some(outcome);
                Ok(first)
            }
            Err(problem) => {
                let message = problem.to_string();
                trial.objective_problem = Some(message.clone());
                self.console_warning(trial_id, &message);
                Err(message)
            }
        }
    }

    /// A warning about one trial for the console (the progress display's notices), beside the
    /// one the store keeps.
    pub(super) fn console_warning(&mut self, trial_id: &str, text: &str) {
        std::sync::Arc::make_mut(&mut self.notices).push(super::Notice {
            warning: true,
            text: format!("trial {trial_id}: {text}"),
        });
    }

    /// A final result that cannot be read as a number is still the trial's final (the first
    /// one counts, as for any final): kept as sent, shown on the console, given as the trial's
    /// end message, and handed to the tuner as NaN, the worst, as a resume will import it. The
    /// trial's status still comes from its exit: retrying a script that prints the same line
    /// would only spend the budget.
    async fn on_unreadable_final(
        &mut self,
        trial_id: String,
        reason: String,
    ) -> Result<(), ManagerError> {
        let Some(trial) = self.book.get_mut(&trial_id) else {
            return Ok(());
        };
        if trial.final_value.is_none() && !trial.status.is_final() {
            let problem = unreadable_final_message(&reason);
            trial.final_problem = Some(problem.clone());
            self.console_warning(&trial_id, &problem);
        }
        self.warn(
            Some(trial_id.clone()),
            format!("{reason}; the tuner sees it as NaN (the worst)"),
        )
        .await?;
        self.act_on_metric(trial_id, MetricKind::Final, f64::NAN, None)
            .await
    }

    /// The assessor woke the loop: it decided about a trial outside a call (NNI's dispatcher
    /// sends its kill when it is ready). Asks it again, with the history it already had, about
    /// every running trial that has intermediate results, and stops those it gives up on.
    pub(super) async fn reassess(&mut self) -> Result<(), ManagerError> {
        let candidates: Vec<(String, u32, std::sync::Arc<Vec<f64>>)> = self
            .book
            .active_ids()
            .iter()
            .filter_map(|id| self.book.get(id))
            .filter(|t| !t.status.is_final() && t.kill.is_none() && !t.intermediate.is_empty())
            .map(|t| (t.id.clone(), t.attempt, t.intermediate.clone()))
            .collect();
        for (trial_id, attempt, history) in candidates {
            let Some(assessor) = &mut self.assessor else {
                return Ok(());
            };
            let answers = assessor.assess(trial_id, attempt, history).await;
            self.on_assessor_answers(answers).await?;
        }
        Ok(())
    }

    /// Acts on what the assessor answered, in the turn it was asked or later: a stop is carried
    /// out only while the attempt it judged still runs and is not being stopped already (a
    /// late verdict on a trial that ended, or runs again, means nothing now); a failed call
    /// costs that call, never the experiment.
    pub(super) async fn on_assessor_answers(
        &mut self,
        answers: Vec<super::assessor_driver::Answer>,
    ) -> Result<(), ManagerError> {
        use super::assessor_driver::Answer;
        for answer in answers {
            match answer {
                Answer::Stop {
                    trial_id,
                    attempt,
                    reason,
                } => {
                    let judged = self.book.get(&trial_id).is_some_and(|t| {
                        t.status == TrialStatus::Running && t.attempt == attempt && t.kill.is_none()
                    });
                    if judged {
                        self.kill(&trial_id, TrialStatus::EarlyStopped, reason)
                            .await?;
                    }
                }
                Answer::Failed { trial_id, message } => {
                    self.warn(Some(trial_id), format!("assessor: {message}"))
                        .await?
                }
            }
        }
        Ok(())
    }

    /// Hands a recorded metric to the assessor (intermediate) or the tuner (final; `whole`, the
    /// metric as reported, for a tuner that takes it).
    pub(super) async fn act_on_metric(
        &mut self,
        trial_id: String,
        kind: MetricKind,
        value: f64,
        whole: Option<String>,
    ) -> Result<(), ManagerError> {
        let Some(trial) = self.book.get_mut(&trial_id) else {
            return Ok(());
        };
        if trial.status.is_final() {
            return Ok(());
        }
        match kind {
            MetricKind::Intermediate => {
                let value = as_result(value);
                // The assessor's copy of the last call is usually gone (it answered), so this
                // pushes in place; one still unanswered keeps the history it was asked about.
                std::sync::Arc::make_mut(&mut trial.intermediate).push(value);
                // A trial already being stopped needs no more verdicts.
                if trial.kill.is_some() {
                    return Ok(());
                }
                let history = trial.intermediate.clone();
                if trial.lineage.is_some() {
                    let intermediate = knob_plugin_api::population::Intermediate {
                        step: history.len() as u64 - 1,
                        checkpoint: trial.has_checkpoint,
                    };
                    let parameter_id = trial.parameter_id;
                    self.tuner
                        .intermediate_result(parameter_id, intermediate, value)
                        .await?;
                }
                let attempt = trial.attempt;
                if let Some(assessor) = &mut self.assessor {
                    // An assessor that fails (or panics) costs its verdict, not the experiment;
                    // one that thinks long (or is stuck) is not waited for (`AssessorDriver`).
                    let answers = assessor.assess(trial_id, attempt, history).await;
                    self.on_assessor_answers(answers).await?;
                }
            }
            MetricKind::Final => {
                if let Some(first) = trial.final_value {
                    // Said on the console too (once): a script that reports its final every
                    // epoch otherwise learnt only from the store that all but the first were
                    // dropped (NNI's tuner is given each).
                    let message = second_final_message(first);
                    if !std::mem::replace(&mut self.told_second_final, true) {
                        self.console_warning(&trial_id, &message);
                    }
                    return self.warn(Some(trial_id), message).await;
                }
                // NaN and ±Infinity are reported values but no result: the store keeps them as
                // text without a value, so the live run, the tuner and a resume all see NaN.
                let value = if value.is_finite() { value } else { f64::NAN };
                trial.final_value = Some(value);
                let (parameter_id, parameters) = (trial.parameter_id, trial.parameters.clone());
                let outcome = trial.outcome.take();
                trial.infeasible = outcome.as_ref().is_some_and(|o| !o.is_feasible());
                // Whether it may be the best is known now; it becomes the best only once it
                // ends SUCCEEDED (`TrialBook::set_status`), never if it then fails or is killed.
                trial.result_ranks = crate::objectives::outcome_ranks(value, outcome.as_ref());
                // Told, not waited for: `fill` takes its answer in (see `TunerDriver`).
                self.tuner
                    .final_result(parameter_id, parameters, value, outcome, whole);
                // Told, as to the tuner: an assessor that fails costs what it would have learnt
                // (a warning when its answer comes).
                if let Some(assessor) = &mut self.assessor {
                    assessor.trial_final(trial_id, value);
                }
            }
        }
        self.publish(None);
        Ok(())
    }
}

/// How many metrics of a trial reported before its start are kept for it (see
/// `Manager::on_early_metric`): a service that never reports the start must not fill memory.
const MAX_EARLY_METRICS: usize = 1000;

/// The end message of a trial whose final result could not be read (see
/// `Manager::on_unreadable_final`); `reason` is [`default_value`]'s.
pub(super) fn unreadable_final_message(reason: &str) -> String {
    format!("final result unreadable: {reason}; recorded as sent, no value (the tuner sees NaN)")
}

/// The warning for a final result that came after the attempt's first, `kept` (which stays its
/// result, README "Trial protocols"), and what to report instead. The later value is in the
/// store as sent (`knob experiment export`, the API's metrics).
pub(super) fn second_final_message(kept: f64) -> String {
    let kept = if kept.is_nan() {
        "NaN: no result".to_string()
    } else {
        kept.to_string()
    };
    format!(
        "second final result ignored: a trial's result is the first final it reports ({kept}); report the final once, and per-epoch values as intermediate results"
    )
}

/// An intermediate result as the assessor and the tuner are given it: ±Infinity is no result,
/// as NaN is (README, "Trial protocols"), and is handed on as NaN, which every assessor skips.
/// Passed as it was, one `-Infinity` at a step pinned Medianstop's median there at `-inf`
/// for the rest of the experiment, and every later trial was stopped at that step.
pub(super) fn as_result(value: f64) -> f64 {
    if value.is_finite() {
        value
    } else {
        f64::NAN
    }
}
