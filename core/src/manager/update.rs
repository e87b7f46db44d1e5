//! Changes to a running experiment (`knob update`, the HTTP API).

use knob_plugin_api::space::SearchSpace;
use serde_json::Value;

use super::{Manager, ManagerError, Refusal, Update, UpdateOutcome};
use crate::store::{StoreEvent, TrialStatus};

/// Refuses an empty search space (`{}`) given to an experiment that exists (`knob update
/// searchspace`, the API, `knob resume --search-space`), for every tuner: it leaves a tuner
/// nothing to search, and TPE, Random and the others then end the run at once, DONE, as if
/// every point had been tried. `knob create` takes `searchSpace: {}` (NNI does, for a tuner
/// that makes up its own parameters); replacing a space by an empty one is a mistake.
pub fn check_new_search_space(space: &Value) -> Result<(), String> {
    match space.as_object() {
        Some(parameters) if parameters.is_empty() => Err(
            "the search space is empty ({}): it would leave the tuner nothing to search and end the experiment; give at least one parameter"
                .into(),
        ),
        _ => Ok(()),
    }
}

impl Manager {
    /// Applies one update. `Err` (outer) only for store failures, which end the experiment; a
    /// refused update is `Ok(Err(why))`, answered to whoever asked.
    pub(super) async fn apply(
        &mut self,
        update: Update,
    ) -> Result<Result<UpdateOutcome, Refusal>, ManagerError> {
        let (field, value) = match &update {
            Update::TrialConcurrency(0) => {
                return Ok(Err("trialConcurrency must be at least 1".into()))
            }
            Update::TrialConcurrency(n) => ("trialConcurrency", Value::from(*n)),
            Update::MaxTrialNumber(0) => {
                return Ok(Err("maxTrialNumber must be at least 1".into()))
            }
            // As `knob resume --max-trial-number` refuses it: the budget would read "7 of 3".
            Update::MaxTrialNumber(n) if *n < self.book.len() => {
                let created = self.book.len();
                return Ok(Err(format!(
                    "maxTrialNumber {n} is below the {created} trials already created; give at least {created} (that many stops the creation of new ones)"
                )
                .into()));
            }
            Update::MaxTrialNumber(n) => ("maxTrialNumber", Value::from(*n)),
            Update::MaxExperimentDuration(d) if d.is_zero() => {
                return Ok(Err("maxExperimentDuration must be positive".into()))
            }
            Update::MaxExperimentDuration(d) => ("maxExperimentDuration", Value::from(d.as_secs())),
            Update::SearchSpace(space) => {
                if let Err(refusal) = check_new_search_space(space) {
                    return Ok(Err(format!(
                        "{refusal}; the experiment goes on with the search space it had"
                    )
                    .into()));
                }
                if let Err(e) = SearchSpace::from_value(space) {
                    return Ok(Err(e.to_string().into()));
                }
                // The tuner is asked before the space is stored: one it refuses (Hyperband's
                // TRIAL_BUDGET parameter) is the user's to correct,
                // and the experiment goes on with the space it had. Stored first, a refusal
                // ended the experiment, and every resume gave the tuner that space again.
                if let Err(refusal) = self.tuner.set_space(space).await? {
                    return Ok(Err(format!(
                        "{refusal}; the experiment goes on with the search space it had"
                    )
                    .into()));
                }
                ("searchSpace", space.clone())
            }
            Update::KillTrial(trial_id) => {
                return Ok(match self.book.get(trial_id) {
                    None => Err(format!("no trial {trial_id} in this experiment").into()),
                    // As the API's own check before it asks: 409.
                    Some(trial) if trial.status.is_final() => Err(Refusal::Conflict(format!(
                        "trial {trial_id} already ended ({})",
                        trial.status.as_str()
                    ))),
                    Some(_) => {
                        self.kill(
                            trial_id,
                            TrialStatus::UserCanceled,
                            "killed by the user".into(),
                        )
                        .await?;
                        // Its host cannot be reached: the service keeps the kill for when it
                        // answers. Said so, rather than "killed" of a trial that runs on
                        // meanwhile (and may end with its own result first).
                        Ok(match self.unreachable(trial_id) {
                            Some((environment, why)) => UpdateOutcome::KillPending {
                                host: self
                                    .environments
                                    .host_of(&environment)
                                    .unwrap_or(environment),
                                why,
                            },
                            None => UpdateOutcome::Applied,
                        })
                    }
                });
            }
            Update::AddTrial(parameters) => {
                // An added trial counts against `maxTrialNumber` as the tuner's do (NNI refuses
                // it with "reach maxTrialNum"): without this check any number were added and
                // run, the budget reading "41 / 6".
                let spent =
                    (self.config.max_trial_number).filter(|&max| self.book.budget_spent(Some(max)));
                if let Some(max) = spent {
                    let created = self.book.len();
                    let id = &self.id;
                    let room = created.max(max) + 1;
                    return Ok(Err(Refusal::Conflict(format!(
                        "the trial budget is used up: maxTrialNumber is {max} and {created} trials were created; raise it to add one (`knob update trialnum {id} {room}`, or PATCH /api/v1/experiment {{\"maxTrialNumber\": {room}}})"
                    ))));
                }
                let space = SearchSpace::from_value(&self.config.search_space)
                    .map_err(|e| ManagerError::Unsupported(e.to_string()))?;
                if let Err(e) = space.validate_parameters(parameters) {
                    return Ok(Err(e.to_string().into()));
                }
                let parameter_id = self.tuner.reserve_parameter_id();
                let trial_id = self
                    .submit(parameter_id, parameters.clone(), None, None)
                    .await?;
                return Ok(Ok(UpdateOutcome::TrialAdded(trial_id)));
            }
        };
        self.store
            .append(StoreEvent::ConfigUpdated {
                field: field.into(),
                value,
            })
            .await?;
        match update {
            Update::TrialConcurrency(n) => {
                self.config.trial_concurrency = n;
                // A service that sized its queue or its allocations by the value it was
                // created with follows the new one (a cluster's: it refused every trial past
                // its old count).
                for index in 0..self.services.len() {
                    let reply = self.services[index].handle.set_trial_concurrency(n);
                    self.warn_if_it_fails(reply, None, move |e| {
                        format!("trialConcurrency {n} was not taken by a training service: {e}")
                    });
                }
            }
            Update::MaxTrialNumber(n) => self.config.max_trial_number = Some(n),
            Update::MaxExperimentDuration(d) => {
                self.config.max_experiment_duration = Some(d);
                self.timers.set_max_duration(d);
            }
            // The tuner took it above.
            Update::SearchSpace(space) => self.config.search_space = space,
            Update::KillTrial(_) | Update::AddTrial(_) => unreachable!("answered above"),
        }
        self.publish(None);
        Ok(Ok(UpdateOutcome::Applied))
    }
}
