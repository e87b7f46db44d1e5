//! The plugin author's side: safe traits to implement and the `export_plugin!` macro.
//!
//! A plugin author implements [`Tuner`], [`Assessor`] or [`TrainingService`] on plain Rust types
//! and lists them in one `export_plugin!` invocation. The adaptors in this module turn those
//! implementations into the ABI objects of `crate::abi`, and catch every panic on the way: a
//! panic inside a plugin fails that one call, never the host (abi_stable would abort the process).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RSlice, RStr, RString, RVec};
use serde_json::Value;

use crate::abi::{
    AbiComponentKind, AbiGenerated, AbiLogLevel, AbiResult, AbiSuggestion, AbiVerdict, AssessorAbi,
    AssessorAbi_TO, AssessorInContextAbi, AssessorInContextAbi_TO, EventSinkBox, HostLoggerBox,
    TrainingServiceAbi, TrainingServiceAbi_TO, TrainingServiceWithRequestsAbi,
    TrainingServiceWithRequestsAbi_TO, TunerAbi, TunerAbi_TO,
};
use crate::service::{
    CheckedConfig, ConfigCheck, ConfigProblem, EnvironmentChanges, FieldPath, ServiceContext,
    ServiceEvent, ServiceRequest, TrialRequest,
};
use crate::space::SearchSpace;
use crate::ComponentKind;

/// The error a plugin returns: one line that tells the user what went wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginError(String);

impl PluginError {
    pub fn new(message: impl Into<String>) -> PluginError {
        PluginError(message.into())
    }
    pub fn message(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PluginError {}

impl From<crate::space::SpaceError> for PluginError {
    fn from(e: crate::space::SpaceError) -> PluginError {
        PluginError(e.to_string())
    }
}

/// What a tuner answers when asked for parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum Generated {
    /// A JSON object of parameters, as the trial will receive them.
    Parameters(Value),
    /// Parameters with the parameter id the trial sees in place of the host's number: NNI's
    /// Hyperband and BOHB give trials string ids such as `"0-4_0_3"` (see [`Suggestion::label`]).
    Labeled { parameters: Value, label: String },
    /// A member of a population (population-based training, `crate::population`): parameters,
    /// the id the trial sees (as [`Generated::Labeled`]) and where it comes from. The host then
    /// hands the tuner each of the trial's intermediate results
    /// ([`Tuner::receive_intermediate_result`]) and starts it from its parent's checkpoint.
    Member {
        parameters: Value,
        label: String,
        lineage: crate::population::Lineage,
    },
    /// Nothing more to try: the experiment ends once running trials finish.
    NoMore,
    /// Not now; the tuner will hand out parameters for this id later via
    /// [`Tuner::take_suggestions`] (e.g. when a result it waits for arrives).
    Deferred,
}

/// Parameters a tuner emits unprompted, for an id it was asked about earlier.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    pub parameter_id: u64,
    pub parameters: Value,
    /// The parameter id the trial sees (`parameter_id` of NNI's `parameter.cfg` and v3 channel)
    /// when it is not the host's number: NNI's Hyperband and BOHB name a trial by bracket, round
    /// and configuration (`"0-4_0_3"`). The host stores it with the trial and hands it back in
    /// [`ImportedTrial::label`] on resume; the tuner's calls keep using `parameter_id`.
    pub label: Option<String>,
}

impl Suggestion {
    /// A population member for a deferred id (see [`Generated::Member`]).
    pub fn member(
        parameter_id: u64,
        parameters: Value,
        label: String,
        lineage: &crate::population::Lineage,
    ) -> Suggestion {
        let text = crate::population::wrap_member(parameters, label, lineage);
        Suggestion {
            parameter_id,
            parameters: serde_json::from_str(&text).expect("our own JSON"),
            label: None,
        }
    }

    /// Answers an id the tuner deferred as [`Generated::NoMore`] would have: nothing for it, and
    /// nothing more to try. The host settles the id, asks for no more parameters, and ends the
    /// experiment once running trials finish. Without it, a tuner whose deferred ids nothing
    /// will pay (a population whose every member has ended) left the host waiting for them, and
    /// the experiment ended with a warning that the tuner gave no parameters.
    pub fn no_more(parameter_id: u64) -> Suggestion {
        Suggestion {
            parameter_id,
            parameters: serde_json::from_str(&crate::population::wrap_no_more())
                .expect("our own JSON"),
            label: None,
        }
    }

    /// Asks the host to stop the running member with this parameter id: it is killed and
    /// recorded EARLY_STOPPED with `reason`. Only members ([`Generated::Member`]) can be stopped.
    pub fn stop(parameter_id: u64, reason: &str) -> Suggestion {
        Suggestion {
            parameter_id,
            parameters: serde_json::from_str(&crate::population::wrap_stop(reason))
                .expect("our own JSON"),
            label: None,
        }
    }
}

/// A trial of an earlier run of the experiment, handed to [`Tuner::import_data`] on resume
/// (NNI's import format: `{"parameter": {...}, "value": ...}`, plus what knob knows).
///
/// The host imports every trial of the earlier run, in the order the trials were created (not
/// always their parameter ids' order: PBT's successor handed to an id deferred earlier has a
/// lower id than the member it replaces), so that a tuner can rebuild what it had handed out, not only what it had learnt: a
/// seeded tuner that knew only the trials with a result drew the parameters of the others
/// again after a resume. A trial with a result (its first final of its last attempt; a
/// non-finite or unreadable one is a NaN `value`, as the live run told the tuner) has its final
/// `status`. A trial without one has [`ImportedTrial::no_result`] set and a NaN `value`: one
/// that ended without reporting has its final `status` (the live run told the tuner of it only
/// through `trial_end`), one that will run again (it was waiting or running, or cancelled by a
/// stop of the experiment, which is imported `WAITING`) has status `WAITING` or `RUNNING`, so
/// that [`ImportedTrial::has_ended`] tells it from one that ended for good, and its result
/// will arrive under `parameter_id`. Count such a trial as handed out (never suggest its
/// parameters again, advance whatever a seeded replay counts), not as a result. A tuner that
/// gave its trials a [`Suggestion::label`] rebuilds what it was waiting for from the labels.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ImportedTrial {
    #[serde(rename = "parameter")]
    pub parameters: Value,
    /// The final result; NaN (JSON `null`) when there is none.
    #[serde(with = "nan_as_null")]
    pub value: f64,
    /// The host's parameter id of the trial (absent in imports from elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameter_id: Option<u64>,
    /// The label the tuner gave the trial's parameters, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The trial's status (see [`status`]); absent in imports from elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// In an experiment with `objectives`, for a tuner that takes them ([`Tuner::takes_objectives`]):
    /// the trial's outcome (`value` is then its first value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objectives: Option<crate::Outcome>,
    /// For a tuner that takes whole metrics ([`Tuner::takes_whole_metrics`]): the final result
    /// as the trial reported it, parsed as [`Tuner::receive_trial_metric`] gets it (`value` is
    /// then its default number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<Value>,
    /// The trial has reported no result (its `value` is NaN): it ended without one, or it will
    /// run again (see [`ImportedTrial`]). Absent, as in imports from elsewhere: a result.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_result: bool,
    /// A population member's lineage ([`crate::Generated::Member`]), with parameter ids as the
    /// tuner gave them; absent for any other trial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<crate::population::Lineage>,
    /// How many intermediate results the trial reported, in all its attempts: a member that
    /// runs again counts its steps on from there (the host numbers a new attempt's results
    /// from 0 again, [`crate::population::Intermediate::step`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub intermediate_results: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ImportedTrial {
    /// A finished trial with a result, as NNI imports it.
    pub fn new(parameters: Value, value: f64) -> ImportedTrial {
        ImportedTrial {
            parameters,
            value,
            parameter_id: None,
            label: None,
            status: None,
            objectives: None,
            metric: None,
            no_result: false,
            lineage: None,
            intermediate_results: 0,
        }
    }

    /// A trial of the earlier run that reported no result: NaN `value`, `status` as it stands.
    pub fn without_result(parameters: Value, status: &str) -> ImportedTrial {
        ImportedTrial {
            status: Some(status.to_owned()),
            no_result: true,
            ..ImportedTrial::new(parameters, f64::NAN)
        }
    }

    /// Whether this is a result to learn from, as a live run's `receive_trial_result` is.
    pub fn is_result(&self) -> bool {
        !self.no_result
    }

    /// Whether the trial has ended (its status is final, or unknown because it was imported
    /// with a result from elsewhere).
    pub fn has_ended(&self) -> bool {
        !matches!(
            self.status.as_deref(),
            Some(status::WAITING | status::RUNNING)
        )
    }
}

/// JSON has no NaN: serde_json writes it as `null`, which a plain `f64` refuses to read back.
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        if value.is_finite() {
            serializer.serialize_f64(*value)
        } else {
            // Infinities too: serde_json would write them as null anyway.
            serializer.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
    }
}

/// Trial statuses as strings, as they cross to `trial_end` (the set may grow; match loosely).
pub mod status {
    pub const SUCCEEDED: &str = "SUCCEEDED";
    pub const FAILED: &str = "FAILED";
    pub const USER_CANCELED: &str = "USER_CANCELED";
    pub const SYS_CANCELED: &str = "SYS_CANCELED";
    pub const EARLY_STOPPED: &str = "EARLY_STOPPED";
    /// Only in [`super::ImportedTrial::status`]: the trial has not ended and will run again.
    pub const WAITING: &str = "WAITING";
    /// Only in [`super::ImportedTrial::status`]: the trial has not ended and will run again.
    pub const RUNNING: &str = "RUNNING";
}

/// A tuner, after NNI's dispatcher semantics. Every call is made from one thread, in order.
pub trait Tuner: Send + 'static {
    /// Builds the tuner from its `classArgs` (a JSON object, or null when none were given).
    fn new(class_args: &Value) -> Result<Self, PluginError>
    where
        Self: Sized;
    /// Called before the first `generate_parameters` and whenever the user edits the space.
    /// An `Err` refuses the space, one line saying why (an empty space, a parameter the tuner
    /// reserves): the tuner must then keep the space it had, since a refused edit is answered
    /// to the user and the experiment goes on with that one. Check before changing anything.
    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError>;
    /// Parameters for the trial with this parameter id.
    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError>;
    /// The final result (NNI's "default" metric) of a trial this tuner generated.
    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError>;
    /// Whether this tuner takes vector objectives. In an experiment with `objectives` (a
    /// knob extension), the host refuses a tuner that does not ("tuner X optimises one
    /// objective"), and gives one that does each final result through
    /// [`Tuner::receive_trial_outcome`], and each imported trial's outcome in
    /// [`ImportedTrial::objectives`].
    // An associated function, not a const: a trait with an associated const cannot be a
    // `dyn Tuner`, which benches and hosts use.
    fn takes_objectives() -> bool
    where
        Self: Sized,
    {
        false
    }
    /// The final result of a trial in an experiment with `objectives`, for a tuner that
    /// [takes them](Tuner::takes_objectives): every listed metric, the objectives as losses to
    /// minimise and the constraints' violations (see [`crate::objectives`]). The default hands
    /// the first value to [`Tuner::receive_trial_result`].
    fn receive_trial_outcome(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        outcome: &crate::Outcome,
    ) -> Result<(), PluginError> {
        let value = outcome.values.first().copied().unwrap_or(f64::NAN);
        self.receive_trial_result(parameter_id, parameters, value)
    }
    /// Whether this tuner takes a final result as the trial reported it: the host then calls
    /// [`Tuner::receive_trial_metric`] with the whole metric (a dict's every entry) where it
    /// could read it. NNI hands its tuners what the trial reported, and a user's own tuner class
    /// may read any entry of a dict; knob's own tuners optimise the default number.
    fn takes_whole_metrics() -> bool
    where
        Self: Sized,
    {
        false
    }
    /// The final result of a trial for a tuner that [takes whole
    /// metrics](Tuner::takes_whole_metrics): `value` is its default number (NaN when it has
    /// none), `metric` the metric as reported, parsed (NaN and the infinities in it are the
    /// strings [`crate::metric::NAN`], [`crate::metric::INF`] and [`crate::metric::NEG_INF`]).
    /// The default hands `value` to [`Tuner::receive_trial_result`].
    fn receive_trial_metric(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
        _metric: &Value,
    ) -> Result<(), PluginError> {
        self.receive_trial_result(parameter_id, parameters, value)
    }
    /// An intermediate result of a population member ([`Generated::Member`]), with its number
    /// and whether the member had saved a checkpoint by then. Only members' results come here;
    /// answer through [`Tuner::take_suggestions`] ([`Suggestion::stop`], [`Suggestion::member`]).
    fn receive_intermediate_result(
        &mut self,
        _parameter_id: u64,
        _intermediate: crate::population::Intermediate,
        _value: f64,
    ) -> Result<(), PluginError> {
        Ok(())
    }
    /// A trial ended with `status` (see [`status`]), whether or not it reported a result.
    fn trial_end(&mut self, _parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        Ok(())
    }
    /// Finished trials of an earlier run of the experiment, to rebuild state on resume; knob
    /// lists them in the order they were created.
    fn import_data(&mut self, _trials: &[ImportedTrial]) -> Result<(), PluginError> {
        Ok(())
    }
    /// Parameters produced since the last call for ids answered with [`Generated::Deferred`]
    /// (or [`Suggestion::no_more`] for such ids once the tuner knows it will never pay them).
    /// The host calls this after each `receive_trial_result` and `trial_end`, and whenever the
    /// tuner wakes it (see [`Tuner::set_waker`]). An error ends the experiment: a tuner that
    /// computes its deferred answers elsewhere (another process, a thread) and finds that work
    /// failed says so here, where a host waiting on it with nothing running hears it.
    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        Ok(Vec::new())
    }
    /// A [`Waker`], right after `new`, from hosts of plugin ABI 1.4 and later. A tuner whose
    /// deferred ids may be answered outside any call (by another process, a thread, a timer)
    /// keeps it, calls [`Waker::wake`] once such parameters are ready, and returns true: the
    /// host then calls [`Tuner::take_suggestions`] at once, and keeps waiting for it while ids
    /// are deferred even when no trial runs. The default drops it and returns false (the host
    /// ends an experiment whose tuner defers with nothing running, as it always did).
    fn set_waker(&mut self, _waker: Waker) -> bool {
        false
    }
}

/// Wakes the host from any thread of a plugin (plugin ABI 1.4): see [`Tuner::set_waker`] and
/// [`Assessor::set_waker`]. Cheap to clone; waking costs one message to the host's loop.
#[derive(Clone)]
pub struct Waker(Arc<EventSinkBox>);

impl Waker {
    pub fn wake(&self) {
        self.0.emit(RStr::from_str("{}"));
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waker")
    }
}

/// An assessor's verdict on a running trial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub keep_going: bool,
    /// Why, in words a user understands ("step 7: best 0.61 below median 0.74 of 12 trials").
    pub reason: String,
}

impl Verdict {
    pub fn good() -> Verdict {
        Verdict {
            keep_going: true,
            reason: String::new(),
        }
    }
    pub fn stop(reason: impl Into<String>) -> Verdict {
        Verdict {
            keep_going: false,
            reason: reason.into(),
        }
    }
}

/// Which way a metric is better: NNI's `optimize_mode`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum OptimizeMode {
    /// Larger is better (NNI's default).
    #[default]
    Maximize,
    Minimize,
}

impl OptimizeMode {
    /// As `optimize_mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizeMode::Maximize => "maximize",
            OptimizeMode::Minimize => "minimize",
        }
    }
}

/// What an assessor is told about its experiment, once, right after it is built
/// ([`Assessor::set_context`]). Fields may be added (it crosses as JSON; a field a plugin does
/// not know is ignored, one a host does not send takes its default).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct AssessorContext {
    /// The experiment's optimization direction (`tuner.classArgs.optimize_mode`; maximize when
    /// the config does not say). Intermediate and final results are raw, as trials report them:
    /// which way is better is for the assessor to read here.
    pub optimize_mode: OptimizeMode,
}

impl AssessorContext {
    pub fn new(optimize_mode: OptimizeMode) -> AssessorContext {
        AssessorContext { optimize_mode }
    }
}

/// An early-stopping rule, after NNI's assessor semantics. Every call is made from one thread,
/// in order.
pub trait Assessor: Send + 'static {
    fn new(class_args: &Value) -> Result<Self, PluginError>
    where
        Self: Sized;
    /// The experiment's context (its optimization direction), once, right after `new` and
    /// before any other call. A host older than contexts (plugin ABI 1.1 and before) never
    /// calls it: keep a default (NNI's is maximize).
    fn set_context(&mut self, _context: &AssessorContext) -> Result<(), PluginError> {
        Ok(())
    }
    /// Judges a running trial from its intermediate results so far (oldest first).
    fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError>;
    /// A trial's final result (raw, as reported; NaN when it was not a finite number), when it
    /// arrives: before the trial's `trial_end`. Trials of an earlier run get theirs on resume.
    fn trial_final(&mut self, _trial_id: &str, _value: f64) -> Result<(), PluginError> {
        Ok(())
    }
    /// A trial ended with `status` (see [`status`]).
    fn trial_end(&mut self, _trial_id: &str, _status: &str) -> Result<(), PluginError> {
        Ok(())
    }
    /// A [`Waker`], right after `set_context`, from hosts of plugin ABI 1.4 and later. An
    /// assessor that decides about a trial outside its calls (a verdict computed elsewhere)
    /// calls [`Waker::wake`] then: the host asks it again at once about every running trial
    /// that has intermediate results ([`Assessor::assess_trial`] with the history it already
    /// had), so the trial stops without waiting for its next result. The default drops it.
    fn set_waker(&mut self, _waker: Waker) {}
}

/// Where a training service reports what happens; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct EventSink {
    sink: Arc<EventSinkBox>,
    /// The SDK's last answer about the service's environments (see
    /// [`TrainingService::environment_changes`]), shared with the service's adaptor.
    answered: Answered,
}

impl EventSink {
    fn new(sink: EventSinkBox) -> EventSink {
        EventSink {
            sink: Arc::new(sink),
            answered: Answered::default(),
        }
    }

    pub fn emit(&self, event: &ServiceEvent) {
        // The host now holds this report, not the one the SDK answered last: the next answer
        // sends the environment in full, whether or not it is the same as that one.
        if let ServiceEvent::Environment { environment } = event {
            if let Ok(mut answered) = self.answered.lock() {
                if let Some(answered) = answered.as_mut() {
                    answered.reports.remove(&environment.id);
                }
            }
        }
        // Serializing our own enum cannot fail; fall back to a warning rather than panicking.
        let json = serde_json::to_string(event).unwrap_or_else(|e| {
            format!(r#"{{"type":"warning","message":"unserializable event: {e}"}}"#)
        });
        self.sink.emit(RStr::from_str(&json));
    }
}

/// A training service: it owns environments (machines, allocations) and runs trials on them.
/// It reports everything that happens through the [`EventSink`] it was built with.
///
/// A service is chosen by a config's `platform` (its name in [`export_plugin!`]) and gets that
/// `trainingService` mapping as its config. The associated functions without `self`
/// ([`check_config`](TrainingService::check_config),
/// [`clean_up_leftovers`](TrainingService::clean_up_leftovers)) run before any object exists.
pub trait TrainingService: Send + 'static {
    /// Builds the service from its config alone: what services written before
    /// [`TrainingService::create`] implement. Implement `create` instead.
    fn new(config: &Value, events: EventSink) -> Result<Self, PluginError>
    where
        Self: Sized,
    {
        let _ = (config, events);
        Err(PluginError::new(
            "this training service needs its experiment context (TrainingService::create), which this knob does not give; upgrade knob",
        ))
    }
    /// Builds the service from its config, as [`TrainingService::check_config`] made it
    /// canonical (secrets in clear), and what the host says about the experiment. The default
    /// calls [`TrainingService::new`].
    fn create(
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<Self, PluginError>
    where
        Self: Sized,
    {
        let _ = context;
        Self::new(config, events)
    }
    /// Checks the service's own config (the `trainingService` mapping as the user wrote it,
    /// without `platform`, `trialCommand`, `trialCodeDirectory`, `trialGpuNumber` and
    /// `nniManagerIp`, which the host reads) and returns its canonical form and secret fields, or
    /// every problem found. [`crate::config::ConfigReader`] does the usual work. The default
    /// accepts any mapping as written, with no secrets.
    fn check_config(
        config: &Value,
        context: &ServiceContext,
    ) -> Result<CheckedConfig, Vec<ConfigProblem>>
    where
        Self: Sized,
    {
        let _ = context;
        accept_as_written(config)
    }
    /// On resume, before anything starts: ends whatever an earlier run of this experiment left
    /// running for these trials (`context.experiment_id` names the experiment) wherever this
    /// service runs them, so that a trial run again never runs twice. Returns one line per thing
    /// ended, for the log. The default has nothing to end.
    fn clean_up_leftovers(
        config: &Value,
        context: &ServiceContext,
        trial_ids: &[String],
    ) -> Result<Vec<String>, PluginError>
    where
        Self: Sized,
    {
        let _ = (config, context, trial_ids);
        Ok(Vec::new())
    }
    /// The environments as they are now, each with its inventory (gpu-sched JSON); the host asks
    /// again while trials wait for resources, so report fresh numbers.
    fn environments(&mut self) -> Result<Vec<crate::service::Environment>, PluginError>;
    /// The environments as they are now, in full only those whose report changed since this
    /// service's answer of generation `since` (see [`EnvironmentChanges`]); what the host asks
    /// every few seconds while trials wait (hosts from 2026-11-26 on). Implement it only when
    /// the service knows what changed without building every report, and then answer every
    /// time: `since` is always a generation this method gave, or `None`, and an unknown one
    /// asks for every report in full; an environment whose report the service sent in a
    /// [`ServiceEvent::Environment`] since counts as changed. The default, `Ok(None)`, leaves it to the SDK: it calls
    /// [`TrainingService::environments`] and compares each report's JSON with the one it
    /// answered last, so that only changed reports cross to the host.
    fn environment_changes(
        &mut self,
        since: Option<u64>,
    ) -> Result<Option<EnvironmentChanges>, PluginError> {
        let _ = since;
        Ok(None)
    }
    /// Starts a trial; its start, metrics and end arrive later as events. An error that
    /// contains "the trial was not started" promises that nothing of it runs: the host then
    /// tries it again a few times (a host whose connection just dropped); any other error ends
    /// the trial FAILED.
    fn start_trial(&mut self, request: TrialRequest) -> Result<(), PluginError>;
    /// Stops a trial's whole process group; `reason` is recorded with its end event.
    fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), PluginError>;
    /// Stops every trial and releases every environment.
    fn shutdown(&mut self) -> Result<(), PluginError>;
    /// Population-based training: no living member needs the checkpoint folder of trial
    /// `trial_id` (its `KNOB_CHECKPOINT_DIR`) any more. A service whose trials write to a file
    /// system of their own (a remote host's) deletes the folder there; the host deletes
    /// `<experiment>/trials/<trial_id>/checkpoint` on its own machine itself, so a service
    /// whose trials write there needs nothing. Called once per trial, after it ended, on every
    /// service of the experiment (hosts of plugin ABI 1.5 and later); keep it short (start the
    /// deletion and return). An error is a warning. The default does nothing.
    fn delete_checkpoint(&mut self, trial_id: &str) -> Result<(), PluginError> {
        let _ = trial_id;
        Ok(())
    }
    /// The experiment's `trialConcurrency` is now `trial_concurrency` (`knob update
    /// concurrency`; hosts of 2026-11-30 on): the host starts up to that many trials at once
    /// from now on. A service that sized something by the value in its
    /// [`ServiceContext::trial`] (jobs it lets into a cluster's queue, allocations it holds)
    /// follows it here; keep the call short. An error is a warning. The default does nothing.
    fn set_trial_concurrency(&mut self, trial_concurrency: u32) -> Result<(), PluginError> {
        let _ = trial_concurrency;
        Ok(())
    }
    /// None of the experiment's trials waits to be placed any more (the last one started, or
    /// was canceled or ended), after some did; [`TrainingService::environments`] is not asked
    /// again until one waits (hosts of 2026-12-02 on). A service that holds anything for its
    /// waiting trials (a place in a shared machine's line) lets it go here; keep the call
    /// short. An error is a warning. The default does nothing.
    fn nothing_waits(&mut self) -> Result<(), PluginError> {
        Ok(())
    }
    /// Population-based training: successor `trial_id` was just created to start from the
    /// checkpoint of trial `donor` (its `KNOB_RESTORE_TRIAL`), which keeps training and
    /// overwriting its folder. A service whose trials write to a file system of their own (a
    /// remote host's) copies the donor's folder there now, and makes `trial_id` start from that
    /// copy (its `KNOB_RESTORE_FROM`) wherever it later runs it; return `true` once the copy is
    /// under way (keep the call short: start the copy and return, and finish it before
    /// `trial_id` starts). Called on the service that ran `donor` (hosts of plugin ABI 1.5 and
    /// later), only when the host cannot see the donor's folder on its own machine (there it
    /// copies the folder itself). An error is a warning. The default returns `false`: not
    /// supported; the successor starts from the donor's folder as it is when it starts.
    fn snapshot_checkpoint(&mut self, trial_id: &str, donor: &str) -> Result<bool, PluginError> {
        let _ = (trial_id, donor);
        Ok(false)
    }
    /// Population-based training: successor `trial_id` needs the copy of its donor's folder
    /// that [`TrainingService::snapshot_checkpoint`] took no more (it ended and will not be
    /// tried again). A service that took one deletes it now (keep the call short: start the
    /// deletion and return); until then it keeps the copy across the successor's attempts, so
    /// that every attempt starts from the same state. Called once per successor, on every
    /// service of the experiment (hosts of plugin ABI 1.5 and later). An error is a warning.
    /// The default does nothing.
    fn delete_snapshot(&mut self, trial_id: &str) -> Result<(), PluginError> {
        let _ = trial_id;
        Ok(())
    }
    /// Population-based training in a hybrid experiment: successor `trial_id` is about to
    /// start under another service, and the host cannot see the folder of its donor `donor`,
    /// which this service ran. A service whose trials write to a file system of their own
    /// copies the copy it took for `trial_id` ([`TrainingService::snapshot_checkpoint`]), or
    /// without one the donor's folder as it is now, to folder `dest` on the host's machine, and
    /// returns `true` once it is there (the successor's start waits for this call). The default
    /// returns `false`: not supported; the host then warns that the successor starts without
    /// its donor's checkpoint.
    fn fetch_snapshot(
        &mut self,
        trial_id: &str,
        donor: &str,
        dest: &std::path::Path,
    ) -> Result<bool, PluginError> {
        let _ = (trial_id, donor, dest);
        Ok(false)
    }
}

/// What a service that does not check its config accepts: any mapping, as written (and what the
/// host assumes of a plugin built before configs were checked by their service).
pub fn accept_as_written(config: &Value) -> Result<CheckedConfig, Vec<ConfigProblem>> {
    match config {
        Value::Object(map) => Ok(CheckedConfig {
            config: map.clone(),
            ..CheckedConfig::default()
        }),
        Value::Null => Ok(CheckedConfig::default()),
        other => Err(vec![ConfigProblem {
            path: FieldPath::root(),
            message: format!("expected a mapping, got {}", crate::config::describe(other)),
        }]),
    }
}

/// Log through the host's logger (a plugin's own `tracing`/`log` setup cannot reach the host).
pub mod log {
    use super::*;

    pub(crate) static HOST_LOGGER: OnceLock<HostLoggerBox> = OnceLock::new();

    fn log(level: AbiLogLevel, message: &str) {
        match HOST_LOGGER.get() {
            Some(logger) => logger.log(level, RStr::from_str("plugin"), RStr::from_str(message)),
            // Dropped when stderr is gone: a panic here would unwind out of the plugin.
            None => {
                use std::io::Write as _;
                let _ = writeln!(std::io::stderr(), "[{level:?}] {message}");
            }
        }
    }
    pub fn error(message: &str) {
        log(AbiLogLevel::Error, message)
    }
    pub fn warn(message: &str) {
        log(AbiLogLevel::Warn, message)
    }
    pub fn info(message: &str) {
        log(AbiLogLevel::Info, message)
    }
    pub fn debug(message: &str) {
        log(AbiLogLevel::Debug, message)
    }
}

// ---------------------------------------------------------------------------------------------
// Adaptors from the safe traits to the ABI traits.

/// Runs one call into plugin code, turning an error or a panic into a one-line message. After a
/// panic the object's state is unknown, so it refuses every later call.
fn guarded<R>(
    label: &str,
    method: &str,
    poisoned: &mut bool,
    call: impl FnOnce() -> Result<R, PluginError>,
) -> AbiResult<R> {
    if *poisoned {
        return RResult::RErr(
            format!("{label} is unusable: it panicked in an earlier call").into(),
        );
    }
    let outer = IN_GUARDED_CALL.replace(true);
    let result = catch_unwind(AssertUnwindSafe(call));
    IN_GUARDED_CALL.set(outer);
    match result {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(e)) => RResult::RErr(e.0.into()),
        Err(payload) => {
            *poisoned = true;
            let place = PANIC_PLACE
                .take()
                .map(|place| format!(" (at {place})"))
                .unwrap_or_default();
            RResult::RErr(
                format!(
                    "{label} panicked in {method}: {}{place}",
                    panic_message(&*payload)
                )
                .into(),
            )
        }
    }
}

thread_local! {
    /// Whether this thread is inside a [`guarded`] call, whose error will carry the panic.
    static IN_GUARDED_CALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the last panic of a guarded call happened, for its error.
    static PANIC_PLACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Replaces the default panic hook of this library's copy of std (a plugin `.so` links its own,
/// so the host's hook and other plugins are untouched). The default hook prints the panic and a
/// backtrace note on stderr, over the host's progress display; here a panic in a guarded call
/// is only remembered (its error says "<component> panicked in <method>: <message> (at
/// <file:line:col>)", and the host records that in the experiment's log) and logged at debug
/// level, and a panic outside any call (a plugin's own thread) is logged through the host at
/// error level, since nothing else will report it.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let place = info
                .location()
                .map(|l| format!("{}:{}:{}", l.file(), l.line(), l.column()))
                .unwrap_or_else(|| "an unknown place".into());
            let message = panic_message(info.payload());
            if IN_GUARDED_CALL.get() {
                log::debug(&format!("panic at {place}: {message}"));
                PANIC_PLACE.set(Some(place));
            } else {
                let thread = std::thread::current();
                let thread = thread.name().unwrap_or("unnamed");
                log::error(&format!(
                    "thread {thread} of a plugin panicked at {place}: {message}"
                ));
            }
        }));
    });
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

fn parse_json(label: &str, what: &str, text: RStr<'_>) -> Result<Value, PluginError> {
    serde_json::from_str(text.as_str())
        .map_err(|e| PluginError::new(format!("{label}: invalid {what} from host: {e}")))
}

struct TunerAdaptor<T> {
    inner: T,
    label: String,
    poisoned: bool,
}

impl<T: Tuner> TunerAbi for TunerAdaptor<T> {
    fn update_search_space(&mut self, search_space_json: RStr<'_>) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(
            &self.label,
            "update_search_space",
            &mut self.poisoned,
            || {
                let space = SearchSpace::parse(search_space_json.as_str())?;
                inner.update_search_space(&space)
            },
        )
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> AbiResult<AbiGenerated> {
        let inner = &mut self.inner;
        guarded(
            &self.label,
            "generate_parameters",
            &mut self.poisoned,
            || {
                Ok(match inner.generate_parameters(parameter_id)? {
                    Generated::Parameters(p) => AbiGenerated::Parameters(p.to_string().into()),
                    Generated::Labeled { parameters, label } => {
                        AbiGenerated::Parameters(crate::labeled::wrap(parameters, label).into())
                    }
                    Generated::Member {
                        parameters,
                        label,
                        lineage,
                    } => AbiGenerated::Parameters(
                        crate::population::wrap_member(parameters, label, &lineage).into(),
                    ),
                    Generated::NoMore => AbiGenerated::NoMore,
                    Generated::Deferred => AbiGenerated::Deferred,
                })
            },
        )
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters_json: RStr<'_>,
        value: f64,
    ) -> AbiResult<()> {
        let (inner, label) = (&mut self.inner, &self.label);
        guarded(label, "receive_trial_result", &mut self.poisoned, || {
            let parameters = parse_json(label, "parameters", parameters_json)?;
            // Only a tuner that made members is sent their intermediate results.
            let parameters = match crate::population::unwrap_intermediate(parameters) {
                Ok(intermediate) => {
                    return inner.receive_intermediate_result(parameter_id, intermediate, value)
                }
                Err(parameters) => parameters,
            };
            // Only a tuner that takes whole metrics is sent one (`tuner_takes_whole_metrics`).
            let parameters = match crate::metric::unwrap_whole(parameters)
                .map_err(|e| PluginError::new(format!("{label}: invalid metric from host: {e}")))?
            {
                (parameters, Some(metric)) => {
                    return inner.receive_trial_metric(parameter_id, &parameters, value, &metric)
                }
                (parameters, None) => parameters,
            };
            // Only a tuner that takes objectives is sent an outcome (`tuner_takes_objectives`).
            match crate::objectives::unwrap(parameters)
                .map_err(|e| PluginError::new(format!("{label}: invalid outcome from host: {e}")))?
            {
                (parameters, Some(outcome)) => {
                    inner.receive_trial_outcome(parameter_id, &parameters, &outcome)
                }
                (parameters, None) => inner.receive_trial_result(parameter_id, &parameters, value),
            }
        })
    }

    fn trial_end(&mut self, parameter_id: u64, status: RStr<'_>) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(&self.label, "trial_end", &mut self.poisoned, || {
            inner.trial_end(parameter_id, status.as_str())
        })
    }

    fn import_data(&mut self, trials_json: RStr<'_>) -> AbiResult<()> {
        let (inner, label) = (&mut self.inner, &self.label);
        guarded(label, "import_data", &mut self.poisoned, || {
            let trials: Vec<ImportedTrial> =
                serde_json::from_str(trials_json.as_str()).map_err(|e| {
                    PluginError::new(format!("{label}: invalid imported trials from host: {e}"))
                })?;
            inner.import_data(&trials)
        })
    }

    fn take_suggestions(&mut self) -> AbiResult<RVec<AbiSuggestion>> {
        let inner = &mut self.inner;
        guarded(&self.label, "take_suggestions", &mut self.poisoned, || {
            Ok(inner
                .take_suggestions()?
                .into_iter()
                .map(|s| AbiSuggestion {
                    parameter_id: s.parameter_id,
                    parameters: match s.label {
                        None => s.parameters.to_string(),
                        Some(label) => crate::labeled::wrap(s.parameters, label),
                    }
                    .into(),
                })
                .collect())
        })
    }
}

struct AssessorAdaptor<A> {
    inner: A,
    label: String,
    poisoned: bool,
}

impl<A: Assessor> AssessorAbi for AssessorAdaptor<A> {
    fn assess_trial(
        &mut self,
        trial_id: RStr<'_>,
        history: RSlice<'_, f64>,
    ) -> AbiResult<AbiVerdict> {
        let inner = &mut self.inner;
        guarded(&self.label, "assess_trial", &mut self.poisoned, || {
            let verdict = inner.assess_trial(trial_id.as_str(), history.as_slice())?;
            Ok(AbiVerdict {
                keep_going: verdict.keep_going,
                reason: verdict.reason.into(),
            })
        })
    }

    fn trial_end(&mut self, trial_id: RStr<'_>, status: RStr<'_>) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(&self.label, "trial_end", &mut self.poisoned, || {
            inner.trial_end(trial_id.as_str(), status.as_str())
        })
    }
}

impl<A: Assessor> AssessorInContextAbi for AssessorAdaptor<A> {
    fn assess_trial(
        &mut self,
        trial_id: RStr<'_>,
        history: RSlice<'_, f64>,
    ) -> AbiResult<AbiVerdict> {
        AssessorAbi::assess_trial(self, trial_id, history)
    }

    fn trial_end(&mut self, trial_id: RStr<'_>, status: RStr<'_>) -> AbiResult<()> {
        AssessorAbi::trial_end(self, trial_id, status)
    }

    fn trial_final(&mut self, trial_id: RStr<'_>, value: f64) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(&self.label, "trial_final", &mut self.poisoned, || {
            inner.trial_final(trial_id.as_str(), value)
        })
    }
}

struct TrainingServiceAdaptor<S> {
    inner: S,
    label: String,
    poisoned: bool,
    /// The last answer to [`ServiceRequest::EnvironmentChanges`] the SDK worked out itself,
    /// shared with the service's [`EventSink`].
    answered: Answered,
}

/// See [`TrainingServiceAdaptor::answered`].
type Answered = Arc<std::sync::Mutex<Option<AnsweredEnvironments>>>;

/// An answer to [`ServiceRequest::EnvironmentChanges`]: its generation and each environment's
/// report as it crossed to the host (JSON), by id.
struct AnsweredEnvironments {
    generation: u64,
    reports: std::collections::HashMap<String, String>,
}

impl AnsweredEnvironments {
    /// The answer to [`ServiceRequest::EnvironmentChanges`], as JSON: the service's own
    /// ([`TrainingService::environment_changes`]), or else every report of
    /// [`TrainingService::environments`] compared, as JSON text, with the one answered last
    /// (the same text is the same report; a report written otherwise, in another key order
    /// say, is only sent again). The reports that changed are written once and sent as
    /// written.
    fn answer<S: TrainingService>(
        inner: &mut S,
        answered: &Answered,
        since: Option<u64>,
    ) -> Result<String, PluginError> {
        let json = |e: serde_json::Error| PluginError::new(e.to_string());
        if let Some(changes) = inner.environment_changes(since)? {
            return serde_json::to_string(&changes).map_err(json);
        }
        // Written before the lock is taken: the service's threads emit events meanwhile.
        let environments: Vec<(String, String)> = inner
            .environments()?
            .into_iter()
            .map(|environment| Ok((serde_json::to_string(&environment)?, environment.id)))
            .collect::<Result<_, serde_json::Error>>()
            .map_err(json)?;
        let mut answered = answered
            .lock()
            .map_err(|_| PluginError::new("the SDK's last answer is unreadable after a panic"))?;
        let previous = answered
            .as_ref()
            .filter(|answered| Some(answered.generation) == since)
            .map(|answered| &answered.reports);
        let generation = answered
            .as_ref()
            .map_or(1, |answered| answered.generation.wrapping_add(1));
        let mut reports = std::collections::HashMap::with_capacity(environments.len());
        let mut ids = Vec::with_capacity(environments.len());
        let mut changed = String::from("[");
        for (report, id) in environments {
            if previous.and_then(|reports| reports.get(&id)) != Some(&report) {
                if changed.len() > 1 {
                    changed.push(',');
                }
                changed.push_str(&report);
            }
            ids.push(id.clone());
            reports.insert(id, report);
        }
        changed.push(']');
        let answer = format!(
            r#"{{"generation":{generation},"ids":{},"changed":{changed}}}"#,
            serde_json::to_string(&ids).map_err(json)?
        );
        *answered = Some(AnsweredEnvironments {
            generation,
            reports,
        });
        Ok(answer)
    }
}

impl<S: TrainingService> TrainingServiceAbi for TrainingServiceAdaptor<S> {
    fn environments(&mut self) -> AbiResult<RString> {
        let inner = &mut self.inner;
        guarded(&self.label, "environments", &mut self.poisoned, || {
            let envs = inner.environments()?;
            serde_json::to_string(&envs)
                .map(RString::from)
                .map_err(|e| PluginError::new(e.to_string()))
        })
    }

    fn start_trial(&mut self, request_json: RStr<'_>) -> AbiResult<()> {
        let (inner, label) = (&mut self.inner, &self.label);
        guarded(label, "start_trial", &mut self.poisoned, || {
            let request: TrialRequest =
                serde_json::from_str(request_json.as_str()).map_err(|e| {
                    PluginError::new(format!("{label}: invalid trial request from host: {e}"))
                })?;
            inner.start_trial(request)
        })
    }

    fn kill_trial(&mut self, trial_id: RStr<'_>, reason: RStr<'_>) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(&self.label, "kill_trial", &mut self.poisoned, || {
            inner.kill_trial(trial_id.as_str(), reason.as_str())
        })
    }

    fn shutdown(&mut self) -> AbiResult<()> {
        let inner = &mut self.inner;
        guarded(&self.label, "shutdown", &mut self.poisoned, || {
            inner.shutdown()
        })
    }
}

impl<S: TrainingService> TrainingServiceWithRequestsAbi for TrainingServiceAdaptor<S> {
    fn environments(&mut self) -> AbiResult<RString> {
        TrainingServiceAbi::environments(self)
    }

    fn start_trial(&mut self, request_json: RStr<'_>) -> AbiResult<()> {
        TrainingServiceAbi::start_trial(self, request_json)
    }

    fn kill_trial(&mut self, trial_id: RStr<'_>, reason: RStr<'_>) -> AbiResult<()> {
        TrainingServiceAbi::kill_trial(self, trial_id, reason)
    }

    fn shutdown(&mut self) -> AbiResult<()> {
        TrainingServiceAbi::shutdown(self)
    }

    fn request(&mut self, request_json: RStr<'_>) -> AbiResult<RString> {
        let (inner, label, answered) = (&mut self.inner, &self.label, &self.answered);
        // A kind this build does not know (a newer host) is an error the host expects.
        let request: ServiceRequest = match serde_json::from_str(request_json.as_str()) {
            Ok(request) => request,
            Err(e) => {
                return RResult::RErr(
                    format!("{label}: unknown request from host ({e}); built against an older knob-plugin-api")
                        .into(),
                )
            }
        };
        // A failure is named by the method the plugin's author wrote (`environments`, …), not
        // by this transport.
        let method = match &request {
            ServiceRequest::EnvironmentChanges { .. } => "environments",
            ServiceRequest::DeleteCheckpoint { .. } => "delete_checkpoint",
            ServiceRequest::TrialConcurrency { .. } => "set_trial_concurrency",
            ServiceRequest::NothingWaits => "nothing_waits",
            ServiceRequest::SnapshotCheckpoint { .. } => "snapshot_checkpoint",
            ServiceRequest::DeleteSnapshot { .. } => "delete_snapshot",
            ServiceRequest::FetchSnapshot { .. } => "fetch_snapshot",
        };
        guarded(label, method, &mut self.poisoned, || {
            let answer = match request {
                ServiceRequest::EnvironmentChanges { since } => {
                    return AnsweredEnvironments::answer(inner, answered, since).map(RString::from);
                }
                ServiceRequest::DeleteCheckpoint { trial_id } => {
                    inner.delete_checkpoint(&trial_id)?;
                    "null"
                }
                ServiceRequest::TrialConcurrency { trial_concurrency } => {
                    inner.set_trial_concurrency(trial_concurrency)?;
                    "null"
                }
                ServiceRequest::NothingWaits => {
                    inner.nothing_waits()?;
                    "null"
                }
                ServiceRequest::SnapshotCheckpoint { trial_id, donor } => {
                    if inner.snapshot_checkpoint(&trial_id, &donor)? {
                        "true"
                    } else {
                        "false"
                    }
                }
                ServiceRequest::DeleteSnapshot { trial_id } => {
                    inner.delete_snapshot(&trial_id)?;
                    "null"
                }
                ServiceRequest::FetchSnapshot {
                    trial_id,
                    donor,
                    dest,
                } => {
                    if inner.fetch_snapshot(&trial_id, &donor, &dest)? {
                        "true"
                    } else {
                        "false"
                    }
                }
            };
            Ok(RString::from(answer))
        })
    }
}

/// The ABI object of a tuner built in this process: the same adaptor `export_plugin!` puts
/// around a plugin's tuner (errors and panics become one-line errors), without a library.
#[cfg(feature = "host")]
pub(crate) fn in_process_tuner<T: Tuner>(inner: T, name: &str) -> crate::abi::TunerBox {
    let adaptor = TunerAdaptor {
        inner,
        label: format!("tuner {name}"),
        poisoned: false,
    };
    TunerAbi_TO::from_value(adaptor, TD_Opaque)
}

/// Like [`in_process_tuner`], for an assessor told the experiment's context (as ABI 1.2 builds
/// them).
#[cfg(feature = "host")]
pub(crate) fn in_process_assessor<A: Assessor>(
    mut inner: A,
    name: &str,
    context: &AssessorContext,
) -> Result<crate::abi::AssessorInContextBox, PluginError> {
    inner.set_context(context)?;
    let adaptor = AssessorAdaptor {
        inner,
        label: format!("assessor {name}"),
        poisoned: false,
    };
    Ok(AssessorInContextAbi_TO::from_value(adaptor, TD_Opaque))
}

/// Like [`in_process_tuner`], for a training service; `build` gets the sink its events go to.
#[cfg(feature = "host")]
pub(crate) fn in_process_training_service<S: TrainingService>(
    name: &str,
    events: EventSinkBox,
    build: impl FnOnce(EventSink) -> Result<S, PluginError>,
) -> Result<crate::abi::TrainingServiceWithRequestsBox, PluginError> {
    let sink = EventSink::new(events);
    let answered = sink.answered.clone();
    let inner = build(sink)?;
    let adaptor = TrainingServiceAdaptor {
        inner,
        label: format!("training service {name}"),
        poisoned: false,
        answered,
    };
    Ok(TrainingServiceWithRequestsAbi_TO::from_value(
        adaptor, TD_Opaque,
    ))
}

// ---------------------------------------------------------------------------------------------
// What `export_plugin!` expands to calls into here.

/// Not public API: the items `export_plugin!` needs, so plugin crates do not depend on
/// abi_stable themselves.
#[doc(hidden)]
pub mod __private {
    use super::*;
    pub use crate::abi::PluginModuleRef;
    pub use abi_stable::library::{
        __call_root_module_loader, CheckTypeLayout, LibHeader, RootModuleResult,
    };

    pub type TunerCtor = fn(&str, &Value) -> Result<TunerBox, PluginError>;
    pub type AssessorCtor = fn(&str, &Value) -> Result<AssessorBox, PluginError>;
    pub type AssessorInContextCtor =
        fn(&str, &Value, &AssessorContext) -> Result<AssessorInContextBox, PluginError>;

    /// An assessor's constructors: without a context (hosts before ABI 1.2), with one, and
    /// with one and a waker (ABI 1.4).
    pub struct AssessorFns {
        pub plain: AssessorCtor,
        pub in_context: AssessorInContextCtor,
        pub waking: AssessorWakingCtor,
    }
    pub type ServiceCtor =
        fn(&str, &Value, &ServiceContext, EventSink) -> Result<TrainingServiceBox, PluginError>;
    pub type ServiceCheck =
        fn(&Value, &ServiceContext) -> Result<CheckedConfig, Vec<ConfigProblem>>;
    pub type ServiceCleanUp =
        fn(&Value, &ServiceContext, &[String]) -> Result<Vec<String>, PluginError>;

    pub type ServiceWithRequestsCtor = fn(
        &str,
        &Value,
        &ServiceContext,
        EventSink,
    )
        -> Result<TrainingServiceWithRequestsBox, PluginError>;

    /// A training service's functions: its constructors (without and with requests, ABI 1.5)
    /// and the calls made without an object.
    pub struct ServiceFns {
        pub create: ServiceCtor,
        pub create_with_requests: ServiceWithRequestsCtor,
        pub check: ServiceCheck,
        pub clean_up: ServiceCleanUp,
    }

    /// Builds a tuner and gives it a waker; says whether the tuner keeps it.
    pub type TunerWakingCtor = fn(&str, &Value, Waker) -> Result<(TunerBox, bool), PluginError>;
    pub type AssessorWakingCtor =
        fn(&str, &Value, &AssessorContext, Waker) -> Result<AssessorInContextBox, PluginError>;

    /// A tuner's constructors (without and with a waker) and whether it takes vector objectives
    /// and whole metrics.
    pub struct TunerFns {
        pub create: TunerCtor,
        pub create_waking: TunerWakingCtor,
        pub takes_objectives: fn() -> bool,
        pub takes_whole_metrics: fn() -> bool,
    }

    pub enum Ctor {
        Tuner(TunerFns),
        Assessor(AssessorFns),
        TrainingService(ServiceFns),
    }

    pub struct Entry {
        pub name: &'static str,
        pub version: &'static str,
        pub description: &'static str,
        pub ctor: Ctor,
    }

    impl Entry {
        fn kind(&self) -> ComponentKind {
            match self.ctor {
                Ctor::Tuner(_) => ComponentKind::Tuner,
                Ctor::Assessor(_) => ComponentKind::Assessor,
                Ctor::TrainingService(_) => ComponentKind::TrainingService,
            }
        }
    }

    pub fn tuner_ctor<T: Tuner>(name: &str, class_args: &Value) -> Result<TunerBox, PluginError> {
        let inner = T::new(class_args)?;
        let adaptor = TunerAdaptor {
            inner,
            label: format!("tuner {name}"),
            poisoned: false,
        };
        Ok(TunerAbi_TO::from_value(adaptor, TD_Opaque))
    }

    pub fn tuner_waking_ctor<T: Tuner>(
        name: &str,
        class_args: &Value,
        waker: Waker,
    ) -> Result<(TunerBox, bool), PluginError> {
        let mut inner = T::new(class_args)?;
        let wakes = inner.set_waker(waker);
        let adaptor = TunerAdaptor {
            inner,
            label: format!("tuner {name}"),
            poisoned: false,
        };
        Ok((TunerAbi_TO::from_value(adaptor, TD_Opaque), wakes))
    }

    pub fn assessor_waking_ctor<A: Assessor>(
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
        waker: Waker,
    ) -> Result<AssessorInContextBox, PluginError> {
        let mut inner = A::new(class_args)?;
        inner.set_context(context)?;
        inner.set_waker(waker);
        let adaptor = AssessorAdaptor {
            inner,
            label: format!("assessor {name}"),
            poisoned: false,
        };
        Ok(AssessorInContextAbi_TO::from_value(adaptor, TD_Opaque))
    }

    pub fn assessor_ctor<A: Assessor>(
        name: &str,
        class_args: &Value,
    ) -> Result<AssessorBox, PluginError> {
        let inner = A::new(class_args)?;
        let adaptor = AssessorAdaptor {
            inner,
            label: format!("assessor {name}"),
            poisoned: false,
        };
        Ok(AssessorAbi_TO::from_value(adaptor, TD_Opaque))
    }

    pub fn assessor_in_context_ctor<A: Assessor>(
        name: &str,
        class_args: &Value,
        context: &AssessorContext,
    ) -> Result<AssessorInContextBox, PluginError> {
        let mut inner = A::new(class_args)?;
        inner.set_context(context)?;
        let adaptor = AssessorAdaptor {
            inner,
            label: format!("assessor {name}"),
            poisoned: false,
        };
        Ok(AssessorInContextAbi_TO::from_value(adaptor, TD_Opaque))
    }

    pub fn service_ctor<S: TrainingService>(
        name: &str,
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<TrainingServiceBox, PluginError> {
        let answered = events.answered.clone();
        let inner = S::create(config, context, events)?;
        let adaptor = TrainingServiceAdaptor {
            inner,
            label: format!("training service {name}"),
            poisoned: false,
            answered,
        };
        Ok(TrainingServiceAbi_TO::from_value(adaptor, TD_Opaque))
    }

    pub fn service_with_requests_ctor<S: TrainingService>(
        name: &str,
        config: &Value,
        context: &ServiceContext,
        events: EventSink,
    ) -> Result<TrainingServiceWithRequestsBox, PluginError> {
        let answered = events.answered.clone();
        let inner = S::create(config, context, events)?;
        let adaptor = TrainingServiceAdaptor {
            inner,
            label: format!("training service {name}"),
            poisoned: false,
            answered,
        };
        Ok(TrainingServiceWithRequestsAbi_TO::from_value(
            adaptor, TD_Opaque,
        ))
    }

    pub fn components(entries: &[Entry]) -> RVec<AbiComponentInfo> {
        entries
            .iter()
            .map(|e| AbiComponentInfo {
                kind: match e.kind() {
                    ComponentKind::Tuner => AbiComponentKind::Tuner,
                    ComponentKind::Assessor => AbiComponentKind::Assessor,
                    ComponentKind::TrainingService => AbiComponentKind::TrainingService,
                },
                name: e.name.into(),
                version: e.version.into(),
                description: e.description.into(),
            })
            .collect()
    }

    /// Finds the entry, parses the class args and runs the constructor, catching panics.
    fn construct<B>(
        entries: &[Entry],
        kind: ComponentKind,
        name: RStr<'_>,
        class_args_json: RStr<'_>,
        run: impl FnOnce(&Entry, &Value) -> Option<Result<B, PluginError>>,
    ) -> AbiResult<B> {
        let Some(entry) = entries
            .iter()
            .find(|e| e.kind() == kind && e.name == name.as_str())
        else {
            return RResult::RErr(format!("this library has no {kind} named {name}").into());
        };
        let mut poisoned = false;
        guarded(
            &format!("{kind} {name}"),
            "its constructor",
            &mut poisoned,
            || {
                let class_args: Value =
                    serde_json::from_str(class_args_json.as_str()).map_err(|e| {
                        PluginError::new(format!(
                            "classArgs of {kind} {name} are not valid JSON: {e}"
                        ))
                    })?;
                run(entry, &class_args)
                    .unwrap_or_else(|| Err(PluginError::new(format!("{name} is not a {kind}"))))
            },
        )
    }

    pub fn new_tuner(entries: &[Entry], name: RStr<'_>, args: RStr<'_>) -> AbiResult<TunerBox> {
        construct(entries, ComponentKind::Tuner, name, args, |e, a| {
            match &e.ctor {
                Ctor::Tuner(fns) => Some((fns.create)(e.name, a)),
                _ => None,
            }
        })
    }

    pub fn tuner_takes_objectives(entries: &[Entry], name: RStr<'_>) -> bool {
        entries.iter().any(|e| {
            e.name == name.as_str()
                && matches!(&e.ctor, Ctor::Tuner(fns) if (fns.takes_objectives)())
        })
    }

    pub fn tuner_takes_whole_metrics(entries: &[Entry], name: RStr<'_>) -> bool {
        entries.iter().any(|e| {
            e.name == name.as_str()
                && matches!(&e.ctor, Ctor::Tuner(fns) if (fns.takes_whole_metrics)())
        })
    }

    pub fn new_assessor(
        entries: &[Entry],
        name: RStr<'_>,
        args: RStr<'_>,
    ) -> AbiResult<AssessorBox> {
        construct(
            entries,
            ComponentKind::Assessor,
            name,
            args,
            |e, a| match &e.ctor {
                Ctor::Assessor(fns) => Some((fns.plain)(e.name, a)),
                _ => None,
            },
        )
    }

    pub fn new_assessor_in_context(
        entries: &[Entry],
        name: RStr<'_>,
        args: RStr<'_>,
        context: RStr<'_>,
    ) -> AbiResult<AssessorInContextBox> {
        construct(
            entries,
            ComponentKind::Assessor,
            name,
            args,
            |e, a| match &e.ctor {
                Ctor::Assessor(fns) => Some(
                    serde_json::from_str::<AssessorContext>(context.as_str())
                        .map_err(|err| {
                            PluginError::new(format!(
                                "assessor {}: invalid context from host: {err}",
                                e.name
                            ))
                        })
                        .and_then(|c| (fns.in_context)(e.name, a, &c)),
                ),
                _ => None,
            },
        )
    }

    // ---- appended-fields: begin ----
    pub fn new_tuner_with_waker(
        entries: &[Entry],
        name: RStr<'_>,
        args: RStr<'_>,
        events: EventSinkBox,
    ) -> AbiResult<crate::abi::AbiWakingTuner> {
        let waker = Waker(Arc::new(events));
        construct(entries, ComponentKind::Tuner, name, args, |e, a| {
            match &e.ctor {
                Ctor::Tuner(fns) => Some(
                    (fns.create_waking)(e.name, a, waker)
                        .map(|(tuner, wakes)| crate::abi::AbiWakingTuner { tuner, wakes }),
                ),
                _ => None,
            }
        })
    }

    pub fn new_assessor_with_waker(
        entries: &[Entry],
        name: RStr<'_>,
        args: RStr<'_>,
        context: RStr<'_>,
        events: EventSinkBox,
    ) -> AbiResult<AssessorInContextBox> {
        let waker = Waker(Arc::new(events));
        construct(
            entries,
            ComponentKind::Assessor,
            name,
            args,
            |e, a| match &e.ctor {
                Ctor::Assessor(fns) => Some(
                    serde_json::from_str::<AssessorContext>(context.as_str())
                        .map_err(|err| {
                            PluginError::new(format!(
                                "assessor {}: invalid context from host: {err}",
                                e.name
                            ))
                        })
                        .and_then(|c| (fns.waking)(e.name, a, &c, waker)),
                ),
                _ => None,
            },
        )
    }
    // ---- appended-fields: end ----

    /// The old constructor: config only, an empty context (what hosts before contexts called).
    pub fn new_training_service(
        entries: &[Entry],
        name: RStr<'_>,
        args: RStr<'_>,
        events: EventSinkBox,
    ) -> AbiResult<TrainingServiceBox> {
        create_training_service(entries, name, args, RStr::from_str("{}"), events)
    }

    pub fn create_training_service(
        entries: &[Entry],
        name: RStr<'_>,
        config: RStr<'_>,
        context: RStr<'_>,
        events: EventSinkBox,
    ) -> AbiResult<TrainingServiceBox> {
        let sink = EventSink::new(events);
        construct(
            entries,
            ComponentKind::TrainingService,
            name,
            config,
            |e, a| match &e.ctor {
                Ctor::TrainingService(fns) => Some(
                    read_context(e.name, context).and_then(|c| (fns.create)(e.name, a, &c, sink)),
                ),
                _ => None,
            },
        )
    }

    // ---- appended-fields: begin ----
    pub fn create_training_service_with_requests(
        entries: &[Entry],
        name: RStr<'_>,
        config: RStr<'_>,
        context: RStr<'_>,
        events: EventSinkBox,
    ) -> AbiResult<TrainingServiceWithRequestsBox> {
        let sink = EventSink::new(events);
        construct(
            entries,
            ComponentKind::TrainingService,
            name,
            config,
            |e, a| match &e.ctor {
                Ctor::TrainingService(fns) => Some(
                    read_context(e.name, context)
                        .and_then(|c| (fns.create_with_requests)(e.name, a, &c, sink)),
                ),
                _ => None,
            },
        )
    }
    // ---- appended-fields: end ----

    fn read_context(name: &str, context: RStr<'_>) -> Result<ServiceContext, PluginError> {
        serde_json::from_str(context.as_str()).map_err(|e| {
            PluginError::new(format!(
                "training service {name}: invalid context from host: {e}"
            ))
        })
    }

    /// Runs one of a service's object-less calls, found by name, catching panics.
    fn service_call(
        entries: &[Entry],
        name: RStr<'_>,
        method: &str,
        config: RStr<'_>,
        context: RStr<'_>,
        call: impl FnOnce(&ServiceFns, &Value, &ServiceContext) -> Result<String, PluginError>,
    ) -> AbiResult<RString> {
        let Some(entry) = entries
            .iter()
            .find(|e| e.kind() == ComponentKind::TrainingService && e.name == name.as_str())
        else {
            return RResult::RErr(
                format!("this library has no training service named {name}").into(),
            );
        };
        let Ctor::TrainingService(fns) = &entry.ctor else {
            unreachable!("the kind was checked")
        };
        let mut poisoned = false;
        guarded(
            &format!("training service {name}"),
            method,
            &mut poisoned,
            || {
                let config: Value = serde_json::from_str(config.as_str()).map_err(|e| {
                    PluginError::new(format!(
                        "training service {name}: invalid config from host: {e}"
                    ))
                })?;
                let context = read_context(entry.name, context)?;
                call(fns, &config, &context)
            },
        )
        .map(RString::from)
    }

    pub fn check_training_service(
        entries: &[Entry],
        name: RStr<'_>,
        config: RStr<'_>,
        context: RStr<'_>,
    ) -> AbiResult<RString> {
        service_call(
            entries,
            name,
            "check_config",
            config,
            context,
            |fns, config, context| {
                let answer = match (fns.check)(config, context) {
                    Ok(checked) => ConfigCheck::Checked(checked),
                    Err(problems) => ConfigCheck::Problems(problems),
                };
                serde_json::to_string(&answer).map_err(|e| PluginError::new(e.to_string()))
            },
        )
    }

    pub fn clean_up_training_service(
        entries: &[Entry],
        name: RStr<'_>,
        config: RStr<'_>,
        context: RStr<'_>,
        trial_ids: RStr<'_>,
    ) -> AbiResult<RString> {
        service_call(
            entries,
            name,
            "clean_up_leftovers",
            config,
            context,
            |fns, config, context| {
                let trial_ids: Vec<String> = serde_json::from_str(trial_ids.as_str())
                    .map_err(|e| PluginError::new(format!("invalid trial ids from host: {e}")))?;
                let reports = (fns.clean_up)(config, context, &trial_ids)?;
                serde_json::to_string(&reports).map_err(|e| PluginError::new(e.to_string()))
            },
        )
    }

    pub fn set_host_logger(logger: HostLoggerBox) {
        // A library is initialised once; a second logger (a second host?) is ignored.
        let _ = log::HOST_LOGGER.set(logger);
        super::install_panic_hook();
    }

    pub fn api_version_ptr() -> *const std::ffi::c_char {
        crate::abi::API_VERSION_NUL.as_ptr().cast()
    }

    pub fn abi_version_ptr() -> *const std::ffi::c_char {
        crate::abi::ABI_VERSION_NUL.as_ptr().cast()
    }

    pub use crate::abi::{
        AbiComponentInfo, AbiResult, AbiWakingTuner, AssessorBox, AssessorInContextBox,
        EventSinkBox, HostLoggerBox, PluginModule, TrainingServiceBox,
        TrainingServiceWithRequestsBox, TunerBox,
    };
    pub use abi_stable::prefix_type::PrefixTypeTrait;
    pub use abi_stable::std_types::{RStr, RString, RVec};
}

/// Exports a plugin library's components. Use it once, at the root of a `cdylib` crate:
///
/// ```ignore
/// knob_plugin_api::export_plugin! {
///     tuner "Random": RandomTuner = "random search, seeded, never repeats a point";
///     assessor "Patience": PatienceAssessor = "stops a trial that has not improved for N steps";
/// }
/// ```
///
/// Each line is `tuner`, `assessor` or `training_service`, the component's name as configs
/// write it, the type implementing [`Tuner`], [`Assessor`] or [`TrainingService`], and a
/// one-line description. The component version is the exporting crate's version.
#[macro_export]
macro_rules! export_plugin {
    ($($kind:ident $name:literal : $ty:ty = $description:literal;)*) => {
        #[doc(hidden)]
        static __KNOB_PLUGIN_ENTRIES: &[$crate::__private::Entry] = &[$(
            $crate::__private::Entry {
                name: $name,
                version: env!("CARGO_PKG_VERSION"),
                description: $description,
                ctor: $crate::__knob_ctor!($kind, $ty),
            },
        )*];

        #[doc(hidden)]
        #[export_name = "knob_plugin_api_version"]
        pub extern "C" fn __knob_plugin_api_version() -> *const ::std::ffi::c_char {
            $crate::__private::api_version_ptr()
        }

        #[doc(hidden)]
        #[export_name = "knob_plugin_abi_version"]
        pub extern "C" fn __knob_plugin_abi_version() -> *const ::std::ffi::c_char {
            $crate::__private::abi_version_ptr()
        }

        #[doc(hidden)]
        #[export_name = "_1as_0lib_1header_0root_bmodule_bloader"]
        pub static __KNOB_ROOT_MODULE: $crate::__private::LibHeader = {
            use $crate::__private as p;
            extern "C" fn components() -> p::RVec<p::AbiComponentInfo> {
                p::components(__KNOB_PLUGIN_ENTRIES)
            }
            extern "C" fn set_host_logger(logger: p::HostLoggerBox) {
                p::set_host_logger(logger)
            }
            extern "C" fn new_tuner(name: p::RStr<'_>, args: p::RStr<'_>) -> p::AbiResult<p::TunerBox> {
                p::new_tuner(__KNOB_PLUGIN_ENTRIES, name, args)
            }
            extern "C" fn new_assessor(name: p::RStr<'_>, args: p::RStr<'_>) -> p::AbiResult<p::AssessorBox> {
                p::new_assessor(__KNOB_PLUGIN_ENTRIES, name, args)
            }
            extern "C" fn new_training_service(
                name: p::RStr<'_>,
                args: p::RStr<'_>,
                events: p::EventSinkBox,
            ) -> p::AbiResult<p::TrainingServiceBox> {
                p::new_training_service(__KNOB_PLUGIN_ENTRIES, name, args, events)
            }
            // ---- appended-fields: begin ----
            extern "C" fn check_training_service(
                name: p::RStr<'_>,
                config: p::RStr<'_>,
                context: p::RStr<'_>,
            ) -> p::AbiResult<p::RString> {
                p::check_training_service(__KNOB_PLUGIN_ENTRIES, name, config, context)
            }
            extern "C" fn create_training_service(
                name: p::RStr<'_>,
                config: p::RStr<'_>,
                context: p::RStr<'_>,
                events: p::EventSinkBox,
            ) -> p::AbiResult<p::TrainingServiceBox> {
                p::create_training_service(__KNOB_PLUGIN_ENTRIES, name, config, context, events)
            }
            extern "C" fn clean_up_training_service(
                name: p::RStr<'_>,
                config: p::RStr<'_>,
                context: p::RStr<'_>,
                trial_ids: p::RStr<'_>,
            ) -> p::AbiResult<p::RString> {
                p::clean_up_training_service(__KNOB_PLUGIN_ENTRIES, name, config, context, trial_ids)
            }
            extern "C" fn new_assessor_in_context(
                name: p::RStr<'_>,
                args: p::RStr<'_>,
                context: p::RStr<'_>,
            ) -> p::AbiResult<p::AssessorInContextBox> {
                p::new_assessor_in_context(__KNOB_PLUGIN_ENTRIES, name, args, context)
            }
            extern "C" fn tuner_takes_objectives(name: p::RStr<'_>) -> bool {
                p::tuner_takes_objectives(__KNOB_PLUGIN_ENTRIES, name)
            }
            extern "C" fn new_tuner_with_waker(
                name: p::RStr<'_>,
                args: p::RStr<'_>,
                events: p::EventSinkBox,
            ) -> p::AbiResult<p::AbiWakingTuner> {
                p::new_tuner_with_waker(__KNOB_PLUGIN_ENTRIES, name, args, events)
            }
            extern "C" fn new_assessor_with_waker(
                name: p::RStr<'_>,
                args: p::RStr<'_>,
                context: p::RStr<'_>,
                events: p::EventSinkBox,
            ) -> p::AbiResult<p::AssessorInContextBox> {
                p::new_assessor_with_waker(__KNOB_PLUGIN_ENTRIES, name, args, context, events)
            }
            extern "C" fn create_training_service_with_requests(
                name: p::RStr<'_>,
                config: p::RStr<'_>,
                context: p::RStr<'_>,
                events: p::EventSinkBox,
            ) -> p::AbiResult<p::TrainingServiceWithRequestsBox> {
                p::create_training_service_with_requests(
                    __KNOB_PLUGIN_ENTRIES,
                    name,
                    config,
                    context,
                    events,
                )
            }
            extern "C" fn tuner_takes_whole_metrics(name: p::RStr<'_>) -> bool {
                p::tuner_takes_whole_metrics(__KNOB_PLUGIN_ENTRIES, name)
            }
            // ---- appended-fields: end ----
            fn root_module() -> p::PluginModuleRef {
                <p::PluginModule as p::PrefixTypeTrait>::leak_into_prefix(p::PluginModule {
                    components,
                    set_host_logger,
                    new_tuner,
                    new_assessor,
                    new_training_service,
                    // ---- appended-fields: begin ----
                    check_training_service,
                    create_training_service,
                    clean_up_training_service,
                    new_assessor_in_context,
                    tuner_takes_objectives,
                    new_tuner_with_waker,
                    new_assessor_with_waker,
                    create_training_service_with_requests,
                    tuner_takes_whole_metrics,
                    // ---- appended-fields: end ----
                })
            }
            extern "C" fn erased_root_module() -> p::RootModuleResult {
                p::__call_root_module_loader(root_module)
            }
            // SAFETY: the same construction `#[abi_stable::export_root_module]` expands to; the
            // symbol name is checked against abi_stable's at compile time in `abi.rs`.
            unsafe { p::LibHeader::from_constructor::<p::PluginModuleRef>(erased_root_module, p::CheckTypeLayout::Yes) }
        };
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __knob_ctor {
    (tuner, $ty:ty) => {
        $crate::__private::Ctor::Tuner($crate::__private::TunerFns {
            create: $crate::__private::tuner_ctor::<$ty>,
            create_waking: $crate::__private::tuner_waking_ctor::<$ty>,
            takes_objectives: <$ty as $crate::Tuner>::takes_objectives,
            takes_whole_metrics: <$ty as $crate::Tuner>::takes_whole_metrics,
        })
    };
    (assessor, $ty:ty) => {
        $crate::__private::Ctor::Assessor($crate::__private::AssessorFns {
            plain: $crate::__private::assessor_ctor::<$ty>,
            in_context: $crate::__private::assessor_in_context_ctor::<$ty>,
            waking: $crate::__private::assessor_waking_ctor::<$ty>,
        })
    };
    (training_service, $ty:ty) => {
        $crate::__private::Ctor::TrainingService($crate::__private::ServiceFns {
            create: $crate::__private::service_ctor::<$ty>,
            create_with_requests: $crate::__private::service_with_requests_ctor::<$ty>,
            check: <$ty as $crate::TrainingService>::check_config,
            clean_up: <$ty as $crate::TrainingService>::clean_up_leftovers,
        })
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn imported_trials_read_nni_s_format_and_carry_knob_s_fields_only_when_set() {
        // NNI's import format, and what hosts before labels sent, still reads.
        let old: ImportedTrial =
            serde_json::from_value(json!({"parameter": {"x": 1}, "value": 0.5})).unwrap();
        assert_eq!(old, ImportedTrial::new(json!({"x": 1}), 0.5));
        assert!(old.has_ended());
        assert_eq!(
            serde_json::to_value(&old).unwrap(),
            json!({"parameter": {"x": 1}, "value": 0.5})
        );
        // A labeled trial without a result: NaN crosses as null and comes back NaN.
        let mut running = ImportedTrial::new(json!({"x": 2}), f64::NAN);
        running.parameter_id = Some(7);
        running.label = Some("0-1_0_2".into());
        running.status = Some(status::RUNNING.into());
        let text = serde_json::to_string(&running).unwrap();
        assert_eq!(
            text,
            r#"{"parameter":{"x":2},"value":null,"parameter_id":7,"label":"0-1_0_2","status":"RUNNING"}"#
        );
        let back: ImportedTrial = serde_json::from_str(&text).unwrap();
        assert!(back.value.is_nan() && !back.has_ended());
        assert_eq!(back.label.as_deref(), Some("0-1_0_2"));
    }

    /// A service that takes no snapshot (the default) and one that does.
    struct Service {
        snapshots: bool,
    }

    impl TrainingService for Service {
        fn new(config: &Value, _events: EventSink) -> Result<Self, PluginError> {
            Ok(Service {
                snapshots: config["snapshots"] == json!(true),
            })
        }
        fn environments(&mut self) -> Result<Vec<crate::service::Environment>, PluginError> {
            Ok(vec![crate::service::Environment {
                id: "box".into(),
                host: "box".into(),
                ready: true,
                inventory: json!({ "gpus": 1 }),
            }])
        }
        fn start_trial(&mut self, _request: TrialRequest) -> Result<(), PluginError> {
            Ok(())
        }
        fn kill_trial(&mut self, _trial_id: &str, _reason: &str) -> Result<(), PluginError> {
            Ok(())
        }
        fn shutdown(&mut self) -> Result<(), PluginError> {
            Ok(())
        }
        fn snapshot_checkpoint(
            &mut self,
            trial_id: &str,
            donor: &str,
        ) -> Result<bool, PluginError> {
            if self.snapshots {
                assert_eq!((trial_id, donor), ("succ", "donor"));
            }
            Ok(self.snapshots)
        }
    }

    #[cfg(feature = "host")]
    #[test]
    fn a_snapshot_request_is_answered_and_a_kind_added_later_reads_as_unknown() {
        let ask = |snapshots: bool, request: &str| {
            let mut adaptor = TrainingServiceAdaptor {
                inner: Service { snapshots },
                label: "training service fixture".into(),
                poisoned: false,
                answered: Default::default(),
            };
            TrainingServiceWithRequestsAbi::request(&mut adaptor, RStr::from_str(request))
                .into_result()
                .map(|a| a.to_string())
                .map_err(|e| e.to_string())
        };
        let snapshot = r#"{"type":"snapshot_checkpoint","trial_id":"succ","donor":"donor"}"#;
        assert_eq!(ask(false, snapshot), Ok("false".to_string()));
        assert_eq!(ask(true, snapshot), Ok("true".to_string()));
        // Its deletion, which the default does (nothing) and answers.
        let delete = r#"{"type":"delete_snapshot","trial_id":"succ"}"#;
        assert_eq!(ask(false, delete), Ok("null".to_string()));
        // Bringing the copy to the host's machine: the default takes none.
        let fetch = r#"{"type":"fetch_snapshot","trial_id":"succ","donor":"donor","dest":"/e/trials/succ/restore"}"#;
        assert_eq!(ask(false, fetch), Ok("false".to_string()));
        // A new trialConcurrency: the default does nothing with it, and answers.
        let concurrency = r#"{"type":"trial_concurrency","trial_concurrency":3}"#;
        assert_eq!(ask(false, concurrency), Ok("null".to_string()));
        // A kind this SDK does not know: the host reads the error as "nothing done".
        let later = ask(true, r#"{"type":"a_later_kind","trial_id":"succ"}"#).unwrap_err();
        assert!(crate::host::unknown_request(&later), "{later}");
        let failed = "training service fixture: the copy failed";
        assert!(!crate::host::unknown_request(failed));
    }

    #[test]
    fn environment_changes_are_relative_to_the_last_answer_only() {
        let mut adaptor = TrainingServiceAdaptor {
            inner: Service { snapshots: false },
            label: "training service fixture".into(),
            poisoned: false,
            answered: Default::default(),
        };
        let mut ask = |since: &str| {
            let request = format!(r#"{{"type":"environment_changes","since":{since}}}"#);
            let answer =
                TrainingServiceWithRequestsAbi::request(&mut adaptor, RStr::from_str(&request))
                    .into_result()
                    .unwrap();
            let answer: EnvironmentChanges = serde_json::from_str(answer.as_str()).unwrap();
            (answer.generation, answer.ids, answer.changed.len())
        };
        let one = vec!["box".to_string()];
        assert_eq!(ask("null"), (1, one.clone(), 1));
        assert_eq!(ask("1"), (2, one.clone(), 0));
        // Since an answer other than the last (one the host did not get, say): all in full.
        assert_eq!(ask("1"), (3, one.clone(), 1));
        assert_eq!(ask("7"), (4, one.clone(), 1));
        assert_eq!(ask("null"), (5, one.clone(), 1));
        assert_eq!(ask("5"), (6, one, 0));
    }
}
