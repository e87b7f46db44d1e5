//! The tuner driver: what the manager asks of the tuner and what it owes it.
//!
//! It hands out parameter ids, counts the ids the tuner deferred (it still owes parameters for
//! them, which count as in flight against `trialConcurrency`), queues what the tuner emits
//! unprompted, remembers that it said NoMore (until a new search space), and checks each
//! parameter set against the current search space under `tunerErrorPolicy` (one asked for
//! before the space was updated and paid late is dropped whatever the policy). It tells the tuner
//! every trial's end, so that a tuner's constant liar (TPE's, GP's: a running trial pretends
//! to have returned a made-up loss) forgets the trial once it is over.
//!
//! It knows no store and no trial: the loop records what the driver reports, and creates the
//! trials.
//!
//! A final result and an end are *told*: the call is queued on the tuner's thread and the loop
//! goes on without waiting for its answer. The tuner takes its calls in order, so it sees the
//! same sequence as if each had been waited for; their answers (what the tuner emitted in
//! return, or its failure) are taken in the same order, as they come. A trial's final result,
//! its end and the next trial's parameters thus cost one wait for the tuner's thread instead of
//! three.
//!
//! Asking for parameters waits for the answer only [`ANSWER_WAIT`]: a tuner that thinks longer
//! (a GP fitting its model on hundreds of results, a user's tuner that trains a model of its
//! own) has its id deferred, as a tuner may defer ids itself, and the loop goes on with the
//! other trials (their results, ends, deadlines, the user's commands) meanwhile. The answer is
//! taken in when it comes (`answered`, which wakes the loop), in order with the calls around
//! it. Only the calls whose answer the loop needs at once wait for every answer before theirs
//! (`settle`): a new search space, a resume's import, a population member's intermediate result.

use std::collections::VecDeque;
use std::time::Duration;

use knob_plugin_api::host::{HostError, Reply, TunerHandle};
use knob_plugin_api::population::{read_suggestion, Emitted, Intermediate, Lineage};
use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{Generated, ImportedTrial, Outcome, Suggestion};
use serde_json::Value;
use tokio::time::Instant;

use super::tuner_output;
use crate::config::TunerErrorPolicy;
use crate::store::TrialStatus;

/// What the tuner answered when asked for parameters.
#[derive(Debug, PartialEq)]
pub(super) enum Handout {
    /// Parameters for `parameter_id` (with the id the trial sees, when the tuner labels).
    Parameters {
        parameter_id: u64,
        parameters: Value,
        label: Option<String>,
        /// A population member's origin (PBT, `Generated::Member`).
        lineage: Option<Lineage>,
    },
    /// Later, unprompted (counted as in flight until then).
    Deferred,
    /// Nothing more to try (first time only; the driver remembers it).
    NoMore,
}

/// Whether a parameter set may become a trial.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Check {
    Accepted,
    /// Outside the search space but run as it is (`tunerErrorPolicy: allow`); the warning to
    /// record, for the first such set only.
    Allowed(Option<String>),
    /// Refused and dropped (`tunerErrorPolicy: skip`): the warning to record. The tuner must be
    /// told with [`TunerDriver::dropped`].
    Dropped(String),
    /// Refused, and the experiment ends with this message.
    Fatal(String),
}

/// How long asking for parameters waits for the tuner's answer before the id is deferred and
/// the loop goes on. knob's TPE answers in 1.4 ms at 3 000 results (`tpe_cost`), its GPTuner in
/// 0.2–0.3 s at 256 (the loop then waited for every such fit).
pub(super) const ANSWER_WAIT: Duration = Duration::from_millis(20);

/// A call to the tuner whose answer is not taken in yet.
enum Pending {
    /// A call whose answer is what the tuner emitted with it: a result, an end, what a tuner
    /// that woke the loop has ready.
    Told(Reply<Vec<Suggestion>>),
    /// Parameters asked for this id, not answered within [`ANSWER_WAIT`]: the id is deferred.
    Asked(u64, Reply<Generated>),
}

/// A pending call's answer.
enum Answer {
    Told(Vec<Suggestion>),
    Asked(u64, Generated),
}

impl Pending {
    /// Waits for the answer; cut short, it takes nothing (see `Reply::answer`).
    async fn answer(&mut self) -> Result<Answer, HostError> {
        Ok(match self {
            Pending::Told(reply) => Answer::Told(reply.answer().await?),
            Pending::Asked(parameter_id, reply) => {
                Answer::Asked(*parameter_id, reply.answer().await?)
            }
        })
    }

    /// The answer if it is there now.
    fn try_answer(self) -> Result<Result<Answer, HostError>, Pending> {
        match self {
            Pending::Told(reply) => match reply.try_get() {
                Ok(answer) => Ok(answer.map(Answer::Told)),
                Err(reply) => Err(Pending::Told(reply)),
            },
            Pending::Asked(parameter_id, reply) => match reply.try_get() {
                Ok(answer) => Ok(answer.map(|generated| Answer::Asked(parameter_id, generated))),
                Err(reply) => Err(Pending::Asked(parameter_id, reply)),
            },
        }
    }
}

pub(super) struct TunerDriver {
    tuner: TunerHandle,
    policy: TunerErrorPolicy,
    next_parameter_id: u64,
    /// Parameter ids the tuner deferred and still owes parameters for.
    deferred: u64,
    /// What the tuner emitted unprompted (parameters, population members, stops), not yet
    /// taken.
    suggested: VecDeque<Emitted>,
    exhausted: bool,
    /// The search space the tuner was last given, which every parameter set it hands out must
    /// belong to.
    space: SearchSpace,
    /// The first parameter id asked for under `space`: an id asked for earlier and paid late
    /// (a deferred one) may hold parameters of the space before.
    space_since: u64,
    /// Parameter sets refused and dropped (`tunerErrorPolicy: skip`), in all and in a row.
    dropped: u64,
    drops_in_a_row: u64,
    /// Parameter sets outside the search space run as they are (`tunerErrorPolicy: allow`).
    allowed: u64,
    /// Calls whose answers are not taken in yet (told calls, parameters asked for and
    /// deferred), oldest first: their answers are taken in this order.
    pending: VecDeque<Pending>,
    /// How long asking for parameters waits for the answer ([`ANSWER_WAIT`]).
    answer_wait: Duration,
    /// The tuner said NoMore in a late answer (or unprompted, for an id it deferred) and the
    /// loop has not heard of it
    /// (`take_late_no_more`).
    late_no_more: bool,
}

impl TunerDriver {
    /// Lets the tuner go once what it was told has run, and resolves when it has stopped (see
    /// `TunerHandle::close`).
    pub fn close(self) -> impl std::future::Future<Output = ()> {
        self.tuner.close()
    }

    /// Drives `tuner`, whose output must belong to `space`.
    pub fn new(tuner: TunerHandle, space: SearchSpace, policy: TunerErrorPolicy) -> TunerDriver {
        TunerDriver {
            tuner,
            policy,
            next_parameter_id: 0,
            deferred: 0,
            suggested: VecDeque::new(),
            exhausted: false,
            space,
            space_since: 0,
            dropped: 0,
            drops_in_a_row: 0,
            allowed: 0,
            pending: VecDeque::new(),
            late_no_more: false,
            answer_wait: ANSWER_WAIT,
        }
    }

    /// A resumed experiment: parameter ids go on from the store's counter.
    pub fn continue_from(&mut self, next_parameter_id: u64) {
        self.next_parameter_id = next_parameter_id;
    }

    /// A parameter id for parameters that do not come from the tuner (a trial the user adds).
    pub fn reserve_parameter_id(&mut self) -> u64 {
        let id = self.next_parameter_id;
        self.next_parameter_id += 1;
        id
    }

    /// How many parameter sets the tuner still owes (deferred ids, its own and those it did
    /// not answer in time): they count as trials in flight.
    pub fn in_flight(&self) -> u64 {
        self.deferred
    }

    /// Whether some call's answer is still to come: `answered` will wake the loop with it.
    pub fn awaits_answers(&self) -> bool {
        !self.pending.is_empty()
    }

    /// True once after a late answer said NoMore: the loop records it.
    pub fn take_late_no_more(&mut self) -> bool {
        std::mem::take(&mut self.late_no_more)
    }

    /// Whether the tuner said NoMore for the current search space.
    pub fn exhausted(&self) -> bool {
        self.exhausted
    }

    /// Parameter sets refused and dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The next thing the tuner emitted unprompted or answered late; parameters (a member's too)
    /// settle one deferred id, a stop of a population member settles none. Takes in the answers
    /// that have come first (`take_answered`). Without `room` for another trial (the user
    /// lowered `trialConcurrency` while the tuner owed parameters), plain parameters stay queued,
    /// still owed, and so does what is behind them; a population's members and stops are taken
    /// (a stop frees the place its successor takes).
    pub fn take_suggestion(&mut self, room: bool) -> Result<Option<Emitted>, HostError> {
        self.take_answered()?;
        if !room && matches!(self.suggested.front(), Some(Emitted::Parameters(_))) {
            return Ok(None);
        }
        let Some(emitted) = self.suggested.pop_front() else {
            return Ok(None);
        };
        if matches!(emitted, Emitted::Parameters(_) | Emitted::Member { .. }) {
            self.deferred = self.deferred.saturating_sub(1);
        }
        Ok(Some(emitted))
    }

    /// Tells the tuner that every parameter set it answered and no trial will run (the
    /// experiment ends, or its budget was lowered to what had run) ended SYS_CANCELED, so that
    /// it no longer counts them as pending: a raised budget would otherwise find them in its
    /// constant liar's fantasies. A population stop asked for is dropped with them, and so is
    /// parameters for an id a trial has (`has_trial`: the tuner emitted it twice).
    pub fn cancel_unrun(&mut self, has_trial: impl Fn(u64) -> bool) {
        while let Some(emitted) = self.suggested.pop_front() {
            let parameter_id = match emitted {
                Emitted::Parameters(suggestion) => suggestion.parameter_id,
                Emitted::Member { parameter_id, .. } => parameter_id,
                Emitted::Stop(_) | Emitted::NoMore { .. } => continue,
            };
            self.deferred = self.deferred.saturating_sub(1);
            if !has_trial(parameter_id) {
                self.tell_dropped(parameter_id);
            }
        }
    }

    /// Waits for the answers to every pending call, in order, and takes them in; the first
    /// that failed fails here, as it would have where it was made.
    pub async fn settle(&mut self) -> Result<(), HostError> {
        while let Some(mut pending) = self.pending.pop_front() {
            let answer = pending.answer().await?;
            self.take_in(answer);
        }
        Ok(())
    }

    /// Takes in the answers that have come, in order, up to the first still to come.
    pub fn take_answered(&mut self) -> Result<(), HostError> {
        while let Some(pending) = self.pending.pop_front() {
            match pending.try_answer() {
                Ok(answer) => self.take_in(answer?),
                Err(pending) => {
                    self.pending.push_front(pending);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Waits for the oldest pending call's answer, then takes in it and whatever else has
    /// come; never resolves with none pending. Cut short (another branch of the loop's
    /// `select!` won), it takes nothing.
    pub async fn answered(&mut self) -> Result<(), HostError> {
        let Some(oldest) = self.pending.front_mut() else {
            return std::future::pending().await;
        };
        let answer = oldest.answer().await;
        self.pending.pop_front();
        self.take_in(answer?);
        self.take_answered()
    }

    fn take_in(&mut self, answer: Answer) {
        match answer {
            Answer::Told(suggestions) => self.absorb(suggestions),
            Answer::Asked(parameter_id, generated) => self.take_late(parameter_id, generated),
        }
    }

    /// The late answer for a deferred id: parameters join what the tuner emitted (they settle
    /// the id when taken), NoMore settles it at once, Deferred leaves it owed (the tuner pays it
    /// on its own, as for an id it deferred in time).
    fn take_late(&mut self, parameter_id: u64, generated: Generated) {
        let emitted = match generated {
            Generated::Parameters(parameters) => Emitted::Parameters(Suggestion {
                parameter_id,
                parameters,
                label: None,
            }),
            Generated::Labeled { parameters, label } => Emitted::Parameters(Suggestion {
                parameter_id,
                parameters,
                label: Some(label),
            }),
            Generated::Member {
                parameters,
                label,
                lineage,
            } => Emitted::Member {
                parameter_id,
                parameters,
                label,
                lineage,
            },
            Generated::Deferred => return,
            Generated::NoMore => return self.no_more_for_deferred(),
        };
        self.suggested.push_back(emitted);
    }

    /// A deferred id answered NoMore, late or unprompted: settled at once, and the tuner is
    /// exhausted.
    fn no_more_for_deferred(&mut self) {
        self.deferred = self.deferred.saturating_sub(1);
        if !self.exhausted {
            self.exhausted = true;
            self.late_no_more = true;
        }
    }

    fn absorb(&mut self, suggestions: Vec<Suggestion>) {
        for emitted in suggestions.into_iter().map(read_suggestion) {
            match emitted {
                Emitted::NoMore { .. } => self.no_more_for_deferred(),
                emitted => self.suggested.push_back(emitted),
            }
        }
    }

    /// Hands the tuner an intermediate result of a population member.
    pub async fn intermediate_result(
        &mut self,
        parameter_id: u64,
        intermediate: Intermediate,
        value: f64,
    ) -> Result<(), HostError> {
        self.settle().await?;
        let suggestions = self
            .tuner
            .receive_intermediate_result(parameter_id, intermediate, value)
            .get()
            .await?;
        self.absorb(suggestions);
        Ok(())
    }

    pub fn label(&self) -> &str {
        self.tuner.label()
    }

    /// Whether the tuner keeps a waker: it may hand over parameters it deferred outside a call
    /// (`Tuner::set_waker`), so the loop may wait for it with nothing running.
    pub fn wakes(&self) -> bool {
        self.tuner.wakes()
    }

    /// The tuner woke the loop: asks for what it has ready (parameters for ids it deferred),
    /// taken in like any answer.
    pub fn take_woken(&mut self) -> Result<(), HostError> {
        self.pending
            .push_back(Pending::Told(self.tuner.take_suggestions()));
        self.take_answered()
    }

    /// Asks the tuner for the parameters of a fresh parameter id, and waits [`ANSWER_WAIT`] at
    /// most for the answers before it and its own; later, the id is deferred. With an id
    /// already deferred so, the tuner is still thinking: the id is deferred without a wait.
    /// Parameters that come behind what the answers before them emitted are deferred too, and
    /// queued behind it (`take_suggestion`), so that trials are created in the order the tuner
    /// produced their parameters.
    pub async fn generate(&mut self) -> Result<Handout, HostError> {
        // A failure already in (a result the tuner could not take) ends the call before the
        // tuner is asked anything more.
        self.take_answered()?;
        let parameter_id = self.reserve_parameter_id();
        let reply = self.tuner.generate_parameters(parameter_id);
        let thinking = self
            .pending
            .iter()
            .any(|pending| matches!(pending, Pending::Asked(..)));
        self.pending.push_back(Pending::Asked(parameter_id, reply));
        if !thinking {
            let deadline = Instant::now() + self.answer_wait;
            while let Some(oldest) = self.pending.front_mut() {
                let Ok(answer) = tokio::time::timeout_at(deadline, oldest.answer()).await else {
                    break;
                };
                self.pending.pop_front();
                match answer? {
                    // Handed out in the order the tuner produced them: behind what the answers
                    // before it emitted (a promotion a result earned), or at once.
                    Answer::Asked(id, generated) if id == parameter_id => {
                        if self.suggested.is_empty() {
                            return Ok(self.handout(parameter_id, generated));
                        }
                        self.deferred += 1;
                        self.take_late(parameter_id, generated);
                        return Ok(Handout::Deferred);
                    }
                    answer => self.take_in(answer),
                }
            }
        }
        self.deferred += 1;
        Ok(Handout::Deferred)
    }

    /// What the tuner answered in time for `parameter_id`.
    fn handout(&mut self, parameter_id: u64, generated: Generated) -> Handout {
        match generated {
            Generated::Parameters(parameters) => Handout::Parameters {
                parameter_id,
                parameters,
                label: None,
                lineage: None,
            },
            Generated::Labeled { parameters, label } => Handout::Parameters {
                parameter_id,
                parameters,
                label: Some(label),
                lineage: None,
            },
            Generated::Member {
                parameters,
                label,
                lineage,
            } => Handout::Parameters {
                parameter_id,
                parameters,
                label: Some(label),
                lineage: Some(lineage),
            },
            Generated::Deferred => {
                self.deferred += 1;
                Handout::Deferred
            }
            Generated::NoMore => {
                self.exhausted = true;
                Handout::NoMore
            }
        }
    }

    /// Whether a parameter set the tuner handed out may become a trial: one the search space
    /// does not hold ends the experiment (`tunerErrorPolicy: error`) or is dropped and counted
    /// (`skip`; too many in a row end it too).
    pub fn check(&mut self, parameter_id: u64, parameters: &Value) -> Check {
        let Some(refusal) =
            tuner_output::refusal(self.tuner.label(), parameter_id, &self.space, parameters)
        else {
            self.drops_in_a_row = 0;
            return Check::Accepted;
        };
        // Asked for before the space was updated and paid late (NNI's dispatcher answers in
        // order, so a `GE` sent before `SS` is drawn from the earlier space): not the tuner's
        // fault, and no trial may run outside the space the user set, so it is dropped
        // whatever the policy, and not counted as a refusal in a row.
        if parameter_id < self.space_since {
            self.dropped += 1;
            return Check::Dropped(format!(
                "{refusal}; it was asked for before the search space was updated, so it is dropped"
            ));
        }
        match self.policy {
            TunerErrorPolicy::Error => Check::Fatal(format!(
                "{refusal} (tunerErrorPolicy: skip drops such parameters instead, allow runs them as NNI does)"
            )),
            TunerErrorPolicy::Allow => {
                self.allowed += 1;
                Check::Allowed((self.allowed == 1).then(|| {
                    format!("{refusal}; run as it is (tunerErrorPolicy: allow), and so is every later such set, without a warning")
                }))
            }
            TunerErrorPolicy::Skip => {
                self.dropped += 1;
                self.drops_in_a_row += 1;
                if self.drops_in_a_row >= TunerErrorPolicy::MAX_DROPS_IN_A_ROW {
                    return Check::Fatal(format!(
                        "{refusal}; {} parameter sets in a row were refused, so the experiment ends (tunerErrorPolicy: skip)",
                        self.drops_in_a_row
                    ));
                }
                Check::Dropped(format!(
                    "{refusal}; dropped (tunerErrorPolicy: skip), {} so far",
                    self.dropped
                ))
            }
        }
    }

    /// Tells the tuner a dropped parameter set ended SYS_CANCELED, so that it stops waiting
    /// for it (told, see `trial_ended`).
    pub fn tell_dropped(&mut self, parameter_id: u64) {
        self.trial_ended(parameter_id, TrialStatus::SysCanceled);
    }

    /// Tells the tuner a trial of `parameter_id` ended with `status`. Told, not waited for:
    /// its answer is taken in as it comes.
    pub fn trial_ended(&mut self, parameter_id: u64, status: TrialStatus) {
        let reply = self.tuner.trial_end(parameter_id, status.as_str().into());
        self.pending.push_back(Pending::Told(reply));
    }

    /// Whether the tuner takes a final result as the trial reported it (see `final_result`).
    pub fn takes_whole_metrics(&self) -> bool {
        self.tuner.takes_whole_metrics()
    }

    /// Hands the tuner a trial's final result: its outcome, in an experiment with objectives
    /// whose final could be read; else the metric as reported (`raw`, given only to a tuner
    /// that [takes it](TunerDriver::takes_whole_metrics)) with its value; else the value. Told,
    /// not waited for: its answer is taken in as it comes.
    pub fn final_result(
        &mut self,
        parameter_id: u64,
        parameters: Value,
        value: f64,
        outcome: Option<Outcome>,
        raw: Option<String>,
    ) {
        let reply = match (outcome, raw) {
            (Some(outcome), _) => {
                self.tuner
                    .receive_trial_outcome(parameter_id, parameters, outcome)
            }
            (None, Some(raw)) => {
                self.tuner
                    .receive_trial_metric(parameter_id, parameters, value, raw)
            }
            (None, None) => self
                .tuner
                .receive_trial_result(parameter_id, parameters, value),
        };
        self.pending.push_back(Pending::Told(reply));
    }

    /// Gives the tuner a search space (at the start, and on an update); what it hands out from
    /// now on must belong to it, and a tuner that had run out may have more to try. `Ok(Err)`
    /// is the tuner's refusal of this space, one line: it keeps the space it had
    /// (`Tuner::update_search_space`), so the caller may go on with that one. Other errors (an
    /// earlier call's, a tuner gone) are the tuner's own failure.
    pub async fn set_space(&mut self, space: &Value) -> Result<Result<(), String>, HostError> {
        self.settle().await?;
        match self.tuner.update_search_space(space.clone()).get().await {
            // A panic is no refusal: the SDK's adaptor refuses every later call.
            Err(HostError::Call { message })
                if !message.contains(" panicked in update_search_space: ") =>
            {
                return Ok(Err(message))
            }
            answer => answer?,
        }
        if let Ok(parsed) = SearchSpace::from_value(space) {
            self.space = parsed;
        }
        self.space_since = self.next_parameter_id;
        self.exhausted = false;
        Ok(Ok(()))
    }

    /// A resumed experiment's earlier trials.
    pub async fn import(&mut self, trials: Vec<ImportedTrial>) -> Result<(), HostError> {
        self.settle().await?;
        self.tuner.import_data(trials).get().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::host::in_process;
    use knob_plugin_api::{PluginError, Tuner};
    use serde_json::json;
    use std::sync::{Arc, Mutex};

    /// Answers `generate_parameters` from a script, and emits the parameters it deferred when
    /// told of a trial's end. Every call is written to `calls`.
    struct Scripted {
        script: VecDeque<Generated>,
        owed: Vec<u64>,
        calls: Arc<Mutex<Vec<String>>>,
        /// `receive_trial_result` fails (after writing its call down).
        results_fail: bool,
    }

    impl Tuner for Scripted {
        fn new(_: &Value) -> Result<Self, PluginError> {
            unreachable!("built directly")
        }
        fn update_search_space(&mut self, _: &SearchSpace) -> Result<(), PluginError> {
            self.calls.lock().unwrap().push("space".into());
            Ok(())
        }
        fn generate_parameters(&mut self, id: u64) -> Result<Generated, PluginError> {
            let answer = self.script.pop_front().unwrap_or(Generated::NoMore);
            if answer == Generated::Deferred {
                self.owed.push(id);
            }
            Ok(answer)
        }
        fn receive_trial_result(&mut self, id: u64, _: &Value, v: f64) -> Result<(), PluginError> {
            self.calls.lock().unwrap().push(format!("result {id} {v}"));
            if self.results_fail {
                return Err(PluginError::new("cannot take results"));
            }
            Ok(())
        }
        fn trial_end(&mut self, id: u64, status: &str) -> Result<(), PluginError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("end {id} {status}"));
            Ok(())
        }
        fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
            Ok(self
                .owed
                .drain(..)
                .map(|parameter_id| Suggestion {
                    parameter_id,
                    parameters: json!({"x": 0.5}),
                    label: None,
                })
                .collect())
        }
    }

    fn driver(
        script: Vec<Generated>,
        policy: TunerErrorPolicy,
    ) -> (TunerDriver, Arc<Mutex<Vec<String>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let tuner = Scripted {
            script: script.into(),
            owed: Vec::new(),
            calls: calls.clone(),
            results_fail: false,
        };
        let space =
            SearchSpace::from_value(&json!({"x": {"_type": "uniform", "_value": [0, 1]}})).unwrap();
        let handle = in_process::tuner("Scripted", tuner);
        (TunerDriver::new(handle, space, policy), calls)
    }

    fn parameters(x: f64) -> Generated {
        Generated::Parameters(json!({ "x": x }))
    }

    #[tokio::test]
    async fn ids_count_on_and_deferred_ids_are_in_flight_until_suggested() {
        let (mut driver, calls) = driver(
            vec![parameters(0.1), Generated::Deferred, parameters(0.2)],
            TunerErrorPolicy::Error,
        );
        driver.continue_from(10);
        assert!(matches!(
            driver.generate().await.unwrap(),
            Handout::Parameters {
                parameter_id: 10,
                ..
            }
        ));
        assert_eq!(driver.generate().await.unwrap(), Handout::Deferred);
        assert_eq!(driver.in_flight(), 1);
        assert_eq!(driver.reserve_parameter_id(), 12);
        assert!(matches!(
            driver.generate().await.unwrap(),
            Handout::Parameters {
                parameter_id: 13,
                ..
            }
        ));
        assert!(driver.take_suggestion(true).unwrap().is_none());
        // A trial's end lets the tuner hand out what it owed for id 11.
        driver.trial_ended(10, TrialStatus::Succeeded);
        let Some(Emitted::Parameters(suggestion)) = driver.take_suggestion(true).unwrap() else {
            panic!("parameters for the deferred id");
        };
        assert_eq!(suggestion.parameter_id, 11);
        assert_eq!(driver.in_flight(), 0);
        driver.final_result(13, json!({"x": 0.2}), 0.75, None, None);
        driver.settle().await.unwrap();
        assert_eq!(
            *calls.lock().unwrap(),
            ["end 10 SUCCEEDED", "result 13 0.75"]
        );
    }

    #[tokio::test]
    async fn no_more_is_remembered_until_a_new_space() {
        let (mut driver, calls) = driver(vec![Generated::NoMore], TunerErrorPolicy::Error);
        assert!(!driver.exhausted());
        assert_eq!(driver.generate().await.unwrap(), Handout::NoMore);
        assert!(driver.exhausted());
        driver
            .set_space(&json!({"x": {"_type": "uniform", "_value": [0, 10]}}))
            .await
            .unwrap()
            .unwrap();
        assert!(!driver.exhausted());
        assert_eq!(*calls.lock().unwrap(), ["space"]);
        // The new space is the one parameter sets are checked against.
        assert_eq!(driver.check(0, &json!({"x": 5.0})), Check::Accepted);
    }

    /// An id asked for before the space was updated and paid late may hold parameters of the
    /// earlier space: dropped, even under `tunerErrorPolicy: error`, and not counted in a row;
    /// an id asked for after the update is the tuner's to get right.
    #[tokio::test]
    async fn parameters_asked_for_under_an_earlier_space_are_dropped_not_fatal() {
        let (mut driver, _) = driver(vec![Generated::Deferred], TunerErrorPolicy::Error);
        assert_eq!(driver.generate().await.unwrap(), Handout::Deferred);
        driver
            .set_space(&json!({"x": {"_type": "uniform", "_value": [5, 6]}}))
            .await
            .unwrap()
            .unwrap();
        let Check::Dropped(warning) = driver.check(0, &json!({"x": 0.5})) else {
            panic!("parameter id 0 was asked for under the earlier space");
        };
        assert!(
            warning.ends_with(
                "it was asked for before the search space was updated, so it is dropped"
            ),
            "{warning}"
        );
        assert_eq!(driver.check(0, &json!({"x": 5.5})), Check::Accepted);
        assert!(matches!(
            driver.check(1, &json!({"x": 0.5})),
            Check::Fatal(_)
        ));
    }

    #[tokio::test]
    async fn refused_parameters_end_the_experiment_or_are_dropped_and_counted() {
        let (mut strict, _) = driver(vec![], TunerErrorPolicy::Error);
        assert_eq!(strict.check(0, &json!({"x": 0.5})), Check::Accepted);
        let Check::Fatal(message) = strict.check(1, &json!({"x": 2.0})) else {
            panic!("an out-of-range value must be refused");
        };
        assert!(
            message.starts_with("tuner Scripted handed out parameters the search space does not hold (parameter id 1)")
                && message.ends_with("(tunerErrorPolicy: skip drops such parameters instead, allow runs them as NNI does)"),
            "{message}"
        );

        let (mut lenient, calls) = driver(vec![], TunerErrorPolicy::Skip);
        let Check::Dropped(warning) = lenient.check(4, &json!({"y": 1})) else {
            panic!("dropped under skip");
        };
        assert!(
            warning.ends_with("; dropped (tunerErrorPolicy: skip), 1 so far"),
            "{warning}"
        );
        lenient.tell_dropped(4);
        lenient.settle().await.unwrap();
        assert_eq!(*calls.lock().unwrap(), ["end 4 SYS_CANCELED"]);
        // An accepted set resets the run of drops, not the count.
        assert_eq!(lenient.check(5, &json!({"x": 0.5})), Check::Accepted);
        for n in 1..TunerErrorPolicy::MAX_DROPS_IN_A_ROW {
            assert!(matches!(lenient.check(n, &json!({})), Check::Dropped(_)));
        }
        let Check::Fatal(message) = lenient.check(0, &json!({})) else {
            panic!("too many drops in a row end the experiment");
        };
        assert!(message.ends_with(
            "; 100 parameter sets in a row were refused, so the experiment ends (tunerErrorPolicy: skip)"
        ), "{message}");
        assert_eq!(lenient.dropped(), 101);
    }

    #[tokio::test]
    async fn told_calls_reach_the_tuner_in_order_and_a_failure_is_taken_in_before_the_next_call() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let tuner = Scripted {
            script: vec![parameters(0.1), parameters(0.2)].into(),
            owed: Vec::new(),
            calls: calls.clone(),
            results_fail: true,
        };
        let space =
            SearchSpace::from_value(&json!({"x": {"_type": "uniform", "_value": [0, 1]}})).unwrap();
        let mut driver = TunerDriver::new(
            in_process::tuner("Scripted", tuner),
            space,
            TunerErrorPolicy::Error,
        );
        assert!(matches!(
            driver.generate().await.unwrap(),
            Handout::Parameters { .. }
        ));
        // Told: neither waits for the tuner's answer, and the failure is not seen yet.
        driver.final_result(0, json!({"x": 0.1}), 0.5, None, None);
        driver.trial_ended(0, TrialStatus::Succeeded);
        // The next call takes the answers in first: the failure ends it, as it would have
        // ended the final result's own call; the tuner got the end after the result.
        let error = driver.generate().await.unwrap_err();
        assert!(error.to_string().contains("cannot take results"), "{error}");
        assert_eq!(*calls.lock().unwrap(), ["result 0 0.5", "end 0 SUCCEEDED"]);
        // Taken in once: what follows goes on.
        assert!(driver.take_suggestion(true).unwrap().is_none());
    }

    /// Answers `generate_parameters` with `{"x": id / 100}` once it may: each call waits for a
    /// message on `go` (at most 10 s), a model being fitted. Runs on a thread of its own.
    struct Thinking {
        go: std::sync::mpsc::Receiver<()>,
        /// Answers NoMore from this id on.
        no_more_from: u64,
    }

    impl Tuner for Thinking {
        fn new(_: &Value) -> Result<Self, PluginError> {
            unreachable!("built directly")
        }
        fn update_search_space(&mut self, _: &SearchSpace) -> Result<(), PluginError> {
            Ok(())
        }
        fn generate_parameters(&mut self, id: u64) -> Result<Generated, PluginError> {
            let _ = self.go.recv_timeout(std::time::Duration::from_secs(10));
            if id >= self.no_more_from {
                return Ok(Generated::NoMore);
            }
            Ok(Generated::Parameters(json!({ "x": id as f64 / 100.0 })))
        }
        fn receive_trial_result(&mut self, _: u64, _: &Value, _: f64) -> Result<(), PluginError> {
            Ok(())
        }
    }

    fn thinking(no_more_from: u64) -> (TunerDriver, std::sync::mpsc::Sender<()>) {
        let (go, wait) = std::sync::mpsc::channel();
        let tuner = Thinking {
            go: wait,
            no_more_from,
        };
        let space =
            SearchSpace::from_value(&json!({"x": {"_type": "uniform", "_value": [0, 1]}})).unwrap();
        let handle = in_process::tuner_on_thread("Thinking", tuner);
        (TunerDriver::new(handle, space, TunerErrorPolicy::Error), go)
    }

    #[tokio::test]
    async fn parameters_not_answered_in_time_are_deferred_and_taken_in_order_when_they_come() {
        let (mut driver, go) = thinking(u64::MAX);
        // Still thinking after ANSWER_WAIT: deferred, counted in flight.
        assert_eq!(driver.generate().await.unwrap(), Handout::Deferred);
        assert_eq!(driver.in_flight(), 1);
        assert!(driver.awaits_answers());
        // Asked again while it thinks: deferred at once (not after a wait of a minute), queued
        // behind the first.
        driver.answer_wait = std::time::Duration::from_secs(60);
        let asked = std::time::Instant::now();
        assert_eq!(driver.generate().await.unwrap(), Handout::Deferred);
        assert!(asked.elapsed().as_secs() < 30, "{:?}", asked.elapsed());
        assert_eq!(driver.in_flight(), 2);
        assert!(driver.take_suggestion(true).unwrap().is_none());
        // The answers come in the order asked, each settling its id once taken.
        go.send(()).unwrap();
        go.send(()).unwrap();
        let mut ids = Vec::new();
        while ids.len() < 2 {
            tokio::time::timeout(std::time::Duration::from_secs(10), driver.answered())
                .await
                .expect("the answers come")
                .unwrap();
            while let Some(emitted) = driver.take_suggestion(true).unwrap() {
                let Emitted::Parameters(suggestion) = emitted else {
                    panic!("parameters");
                };
                assert_eq!(
                    suggestion.parameters,
                    json!({ "x": suggestion.parameter_id as f64 / 100.0 })
                );
                ids.push(suggestion.parameter_id);
            }
        }
        assert_eq!(ids, [0, 1]);
        assert_eq!(driver.in_flight(), 0);
        assert!(!driver.awaits_answers());
        // Answered in time: handed out as before.
        go.send(()).unwrap();
        assert!(matches!(
            driver.generate().await.unwrap(),
            Handout::Parameters {
                parameter_id: 2,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn a_late_no_more_settles_its_id_and_is_told_once() {
        let (mut driver, go) = thinking(0);
        assert_eq!(driver.generate().await.unwrap(), Handout::Deferred);
        go.send(()).unwrap();
        driver.settle().await.unwrap();
        assert!(driver.exhausted());
        assert_eq!(driver.in_flight(), 0);
        assert!(driver.take_late_no_more());
        assert!(!driver.take_late_no_more());
    }
}
