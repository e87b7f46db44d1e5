//! The objects the host holds for plugin components: safe wrappers over the ABI objects
//! (called on the current thread), and handles that run each one on a thread of its own.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc};

use abi_stable::std_types::{RResult, RSlice, RStr, RString};
use serde_json::Value;

use super::HostError;
use crate::abi::{
    AbiGenerated, AssessorBox, AssessorInContextBox, TrainingServiceBox,
    TrainingServiceWithRequestsBox, TunerBox,
};
use crate::service::{Environment, ServiceRequest, TrialRequest};
use crate::{Generated, ImportedTrial, Suggestion, Verdict};

/// A call's answer; an error becomes "<label> failed in <method>: <message>" (a panic's message
/// already says "<label> panicked in <method>", and is kept as it is). A leading "<name>: " of
/// the plugin's own message is dropped, so the name is said once. The message is made one line
/// ([`super::plugin_text`]), a panic's too (its payload is the plugin's text).
fn called<T>(label: &str, method: &str, raw: RResult<T, RString>) -> Result<T, HostError> {
    raw.into_result().map_err(|message| HostError::Call {
        message: failed_in(label, method, message.as_str()),
    })
}

pub(crate) fn failed_in(label: &str, method: &str, message: &str) -> String {
    let message = &super::plugin_text(label, message);
    if message.starts_with(label) {
        return message.to_owned();
    }
    let name = label.rsplit_once(' ').map_or(label, |(_, name)| name);
    let own = message
        .strip_prefix(name)
        .and_then(|rest| rest.strip_prefix(": "))
        .unwrap_or(message);
    format!("{label} failed in {method}: {own}")
}

// ---------------------------------------------------------------------------------------------
// Component objects: safe wrappers over the ABI objects, called on the current thread.

/// A tuner from a plugin. Calls run on the caller's thread; see [`TunerHandle`].
pub struct TunerObject {
    pub(super) raw: TunerBox,
    pub(super) label: String,
    /// Whether its library says it takes vector objectives (`Tuner::takes_objectives`); a
    /// library built before objectives does not.
    pub(super) takes_objectives: bool,
    /// Whether it was given a waker and keeps it (`Tuner::set_waker`, ABI 1.4): it may answer
    /// deferred ids outside any call.
    pub(super) wakes: bool,
    /// Whether its library says it takes a final result as the trial reported it
    /// (`Tuner::takes_whole_metrics`, ABI 1.6); a library built before does not.
    pub(super) takes_whole_metrics: bool,
}

impl TunerObject {
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Names it otherwise than by its component ("tuner NniDispatcher") in its calls' errors,
    /// where the host knows better what it runs (the user's NNI class).
    pub fn relabel(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    /// Whether the tuner takes vector objectives ([`crate::Tuner::takes_objectives`]).
    pub fn takes_objectives(&self) -> bool {
        self.takes_objectives
    }

    /// Whether the tuner may answer deferred ids on its own and wake the host
    /// ([`crate::Tuner::set_waker`]).
    pub fn wakes(&self) -> bool {
        self.wakes
    }

    /// Hands over the final result of a trial in an experiment with `objectives`: the whole
    /// outcome to a tuner that takes objectives, its first value to any other.
    pub fn receive_trial_outcome(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        outcome: &crate::Outcome,
    ) -> Result<Vec<Suggestion>, HostError> {
        let first = outcome.values.first().copied().unwrap_or(f64::NAN);
        if !self.takes_objectives {
            return self.receive_trial_result(parameter_id, parameters, first);
        }
        let wrapped = crate::objectives::wrap(parameters, outcome);
        called(
            &self.label,
            "receive_trial_result",
            self.raw
                .receive_trial_result(parameter_id, RStr::from_str(&wrapped), first),
        )?;
        self.take_suggestions()
    }

    pub fn update_search_space(&mut self, search_space: &Value) -> Result<(), HostError> {
        called(
            &self.label,
            "update_search_space",
            self.raw
                .update_search_space(RStr::from_str(&search_space.to_string())),
        )
    }

    pub fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, HostError> {
        Ok(
            match called(
                &self.label,
                "generate_parameters",
                self.raw.generate_parameters(parameter_id),
            )? {
                AbiGenerated::Parameters(json) => {
                    let value =
                        serde_json::from_str(json.as_str()).map_err(|e| HostError::Call {
                            message: format!(
                                "{} returned parameters that are not JSON: {e}",
                                self.label
                            ),
                        })?;
                    match crate::population::unwrap_member(value) {
                        Ok((parameters, label, lineage)) => Generated::Member {
                            parameters,
                            label,
                            lineage,
                        },
                        Err(value) => match crate::labeled::unwrap(value) {
                            (parameters, None) => Generated::Parameters(parameters),
                            (parameters, Some(label)) => Generated::Labeled { parameters, label },
                        },
                    }
                }
                AbiGenerated::NoMore => Generated::NoMore,
                AbiGenerated::Deferred => Generated::Deferred,
            },
        )
    }

    /// Hands over a final result; returns what the tuner emitted unprompted in response.
    pub fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<Vec<Suggestion>, HostError> {
        let parameters = parameters.to_string();
        called(
            &self.label,
            "receive_trial_result",
            self.raw
                .receive_trial_result(parameter_id, RStr::from_str(&parameters), value),
        )?;
        self.take_suggestions()
    }

    /// Hands over a final result with the metric as the trial reported it (`raw`, its text):
    /// the whole metric, a dict's every entry, to a tuner that [takes
    /// it](crate::Tuner::takes_whole_metrics), and `value` (its default number) to any other,
    /// or when `raw` cannot be read.
    pub fn receive_trial_metric(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
        raw: &str,
    ) -> Result<Vec<Suggestion>, HostError> {
        let metric = match crate::metric::parse_lenient(raw) {
            Ok(metric) if self.takes_whole_metrics => metric,
            _ => return self.receive_trial_result(parameter_id, parameters, value),
        };
        let wrapped = crate::metric::wrap_whole(parameters, &metric);
        called(
            &self.label,
            "receive_trial_result",
            self.raw
                .receive_trial_result(parameter_id, RStr::from_str(&wrapped), value),
        )?;
        self.take_suggestions()
    }

    /// Hands over an intermediate result of a population member; returns what the tuner emitted
    /// in response (stops and members: read them with [`crate::population::read_suggestion`]).
    pub fn receive_intermediate_result(
        &mut self,
        parameter_id: u64,
        intermediate: crate::population::Intermediate,
        value: f64,
    ) -> Result<Vec<Suggestion>, HostError> {
        let text = crate::population::wrap_intermediate(intermediate);
        called(
            &self.label,
            "receive_trial_result",
            self.raw
                .receive_trial_result(parameter_id, RStr::from_str(&text), value),
        )?;
        self.take_suggestions()
    }

    /// Reports a trial's end; returns what the tuner emitted unprompted in response.
    pub fn trial_end(
        &mut self,
        parameter_id: u64,
        status: &str,
    ) -> Result<Vec<Suggestion>, HostError> {
        called(
            &self.label,
            "trial_end",
            self.raw.trial_end(parameter_id, RStr::from_str(status)),
        )?;
        self.take_suggestions()
    }

    pub fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), HostError> {
        // Outcomes and whole metrics go only to a tuner that takes them; any other keeps NNI's
        // import format.
        let stripped: Vec<ImportedTrial>;
        let extra = |t: &ImportedTrial| {
            (t.objectives.is_some() && !self.takes_objectives)
                || (t.metric.is_some() && !self.takes_whole_metrics)
        };
        let trials = if !trials.iter().any(extra) {
            trials
        } else {
            stripped = trials
                .iter()
                .map(|t| ImportedTrial {
                    objectives: t.objectives.clone().filter(|_| self.takes_objectives),
                    metric: t.metric.clone().filter(|_| self.takes_whole_metrics),
                    ..t.clone()
                })
                .collect();
            &stripped
        };
        let json = serde_json::to_string(trials).map_err(|e| HostError::Call {
            message: e.to_string(),
        })?;
        called(
            &self.label,
            "import_data",
            self.raw.import_data(RStr::from_str(&json)),
        )
    }

    /// What the tuner produced unprompted since the last call (for ids it deferred).
    pub fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, HostError> {
        let raw = called(&self.label, "take_suggestions", self.raw.take_suggestions())?;
        raw.into_iter()
            .map(|s| {
                let parameters =
                    serde_json::from_str(s.parameters.as_str()).map_err(|e| HostError::Call {
                        message: format!(
                            "{} emitted parameters that are not JSON: {e}",
                            self.label
                        ),
                    })?;
                let (parameters, label) = crate::labeled::unwrap(parameters);
                Ok(Suggestion {
                    parameter_id: s.parameter_id,
                    parameters,
                    label,
                })
            })
            .collect()
    }
}

/// An assessor object as its library made it.
pub(super) enum AssessorRaw {
    /// Built by a library for ABI 1.1 or before: no context, no finals.
    Plain(AssessorBox),
    /// Built with the experiment's context (ABI 1.2).
    InContext(AssessorInContextBox),
}

/// An assessor from a plugin, called on the current thread.
pub struct AssessorObject {
    pub(super) raw: AssessorRaw,
    pub(super) label: String,
}

impl AssessorObject {
    /// See [`TunerObject::relabel`].
    pub fn relabel(&mut self, label: impl Into<String>) {
        self.label = label.into();
    }

    pub fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, HostError> {
        let (trial_id, history) = (RStr::from_str(trial_id), RSlice::from_slice(history));
        let raw = match &mut self.raw {
            AssessorRaw::Plain(raw) => raw.assess_trial(trial_id, history),
            AssessorRaw::InContext(raw) => raw.assess_trial(trial_id, history),
        };
        let verdict = called(&self.label, "assess_trial", raw)?;
        Ok(Verdict {
            keep_going: verdict.keep_going,
            reason: verdict.reason.into_string(),
        })
    }

    /// A trial's final result. An assessor of a library built before ABI 1.2 has no such
    /// call: it does not learn finals, as before.
    pub fn trial_final(&mut self, trial_id: &str, value: f64) -> Result<(), HostError> {
        match &mut self.raw {
            AssessorRaw::Plain(_) => Ok(()),
            AssessorRaw::InContext(raw) => called(
                &self.label,
                "trial_final",
                raw.trial_final(RStr::from_str(trial_id), value),
            ),
        }
    }

    pub fn trial_end(&mut self, trial_id: &str, status: &str) -> Result<(), HostError> {
        let (trial_id, status) = (RStr::from_str(trial_id), RStr::from_str(status));
        let raw = match &mut self.raw {
            AssessorRaw::Plain(raw) => raw.trial_end(trial_id, status),
            AssessorRaw::InContext(raw) => raw.trial_end(trial_id, status),
        };
        called(&self.label, "trial_end", raw)
    }
}

/// A training service's ABI object: as plugins built before ABI 1.5 make them, or one that
/// also answers requests.
pub(super) enum ServiceRaw {
    Plain(TrainingServiceBox),
    WithRequests(TrainingServiceWithRequestsBox),
}

/// A training service from a plugin, called on the current thread.
pub struct TrainingServiceObject {
    pub(super) raw: ServiceRaw,
    pub(super) label: String,
    /// The generation of the service's last answer to
    /// [`TrainingServiceObject::environment_reports`], which its next answer is relative to;
    /// `None` before the first or after a failed one.
    answered: Option<u64>,
    /// The service does not answer [`ServiceRequest::EnvironmentChanges`] (built before it):
    /// it is asked `environments` instead, without asking it first each time.
    whole_lists: bool,
}

/// One environment of a service's answer to [`TrainingServiceObject::environment_reports`].
#[derive(Debug, Clone, PartialEq)]
pub enum EnvironmentReport {
    /// Its report in full: new or changed since the previous answer (or from a service that
    /// sends every report every time, which may be the same as before).
    Full(Environment),
    /// Its id: the service reports it exactly as in its previous answer to
    /// `environment_reports`.
    Same(String),
}

impl TrainingServiceObject {
    pub(super) fn new(raw: ServiceRaw, label: String) -> TrainingServiceObject {
        TrainingServiceObject {
            raw,
            label,
            answered: None,
            whole_lists: false,
        }
    }

    /// Every environment the service has now, in its order: in full those whose report
    /// changed since this object's previous answer (every one the first time), by id the
    /// others. What the host asks while trials wait, every few seconds: the service compares
    /// (the SDK does, on the service's side, [`ServiceRequest::EnvironmentChanges`]), so that
    /// only what changed is read and handed on. A service built before that request answers
    /// with its whole list, each report in full.
    pub fn environment_reports(&mut self) -> Result<Vec<EnvironmentReport>, HostError> {
        let answer = match &mut self.raw {
            ServiceRaw::WithRequests(raw) if !self.whole_lists => {
                let request = serde_json::to_string(&ServiceRequest::EnvironmentChanges {
                    since: self.answered.take(),
                })
                .map_err(|e| HostError::Call {
                    message: e.to_string(),
                })?;
                match raw.request(RStr::from_str(&request)).into_result() {
                    Ok(answer) => Some(answer),
                    Err(message) if unknown_request(message.as_str()) => None,
                    Err(message) => {
                        return Err(HostError::Call {
                            message: failed_in(&self.label, "environments", message.as_str()),
                        })
                    }
                }
            }
            _ => None,
        };
        let Some(answer) = answer else {
            self.whole_lists = true;
            let environments = self.environments()?;
            return Ok(environments
                .into_iter()
                .map(EnvironmentReport::Full)
                .collect());
        };
        let changes: crate::service::EnvironmentChanges = serde_json::from_str(answer.as_str())
            .map_err(|e| HostError::Call {
                message: format!("{} described its environments in bad JSON: {e}", self.label),
            })?;
        let mut changed: std::collections::HashMap<String, Environment> = changes
            .changed
            .into_iter()
            .map(|environment| (environment.id.clone(), environment))
            .collect();
        let mut reports: Vec<EnvironmentReport> = changes
            .ids
            .into_iter()
            .map(|id| match changed.remove(&id) {
                Some(environment) => EnvironmentReport::Full(environment),
                None => EnvironmentReport::Same(id),
            })
            .collect();
        // A report sent in full without its id in the list is still a report.
        reports.extend(changed.into_values().map(EnvironmentReport::Full));
        self.answered = Some(changes.generation);
        Ok(reports)
    }

    pub fn environments(&mut self) -> Result<Vec<Environment>, HostError> {
        let raw = match &mut self.raw {
            ServiceRaw::Plain(raw) => raw.environments(),
            ServiceRaw::WithRequests(raw) => raw.environments(),
        };
        let json = called(&self.label, "environments", raw)?;
        serde_json::from_str(json.as_str()).map_err(|e| HostError::Call {
            message: format!("{} described its environments in bad JSON: {e}", self.label),
        })
    }

    pub fn start_trial(&mut self, request: &TrialRequest) -> Result<(), HostError> {
        let json = serde_json::to_string(request).map_err(|e| HostError::Call {
            message: e.to_string(),
        })?;
        let raw = match &mut self.raw {
            ServiceRaw::Plain(raw) => raw.start_trial(RStr::from_str(&json)),
            ServiceRaw::WithRequests(raw) => raw.start_trial(RStr::from_str(&json)),
        };
        called(&self.label, "start_trial", raw)
    }

    pub fn kill_trial(&mut self, trial_id: &str, reason: &str) -> Result<(), HostError> {
        let (trial_id, reason) = (RStr::from_str(trial_id), RStr::from_str(reason));
        let raw = match &mut self.raw {
            ServiceRaw::Plain(raw) => raw.kill_trial(trial_id, reason),
            ServiceRaw::WithRequests(raw) => raw.kill_trial(trial_id, reason),
        };
        called(&self.label, "kill_trial", raw)
    }

    pub fn shutdown(&mut self) -> Result<(), HostError> {
        let raw = match &mut self.raw {
            ServiceRaw::Plain(raw) => raw.shutdown(),
            ServiceRaw::WithRequests(raw) => raw.shutdown(),
        };
        called(&self.label, "shutdown", raw)
    }

    /// Asks the service to do `request`. `Ok(false)`: the service was built before requests
    /// (plugin ABI 1.4 and earlier) and was not asked.
    pub fn request(&mut self, request: &ServiceRequest) -> Result<bool, HostError> {
        Ok(self.request_answer(request)?.is_some())
    }

    /// Asks the service to do `request`, and returns its answer (JSON). `Ok(None)`: the
    /// service was built before requests (plugin ABI 1.4 and earlier) and was not asked, or
    /// before this kind of request, which its SDK refuses as unknown (see
    /// [`unknown_request`]): nothing was done.
    pub fn request_answer(
        &mut self,
        request: &ServiceRequest,
    ) -> Result<Option<serde_json::Value>, HostError> {
        let ServiceRaw::WithRequests(raw) = &mut self.raw else {
            return Ok(None);
        };
        let json = serde_json::to_string(request).map_err(|e| HostError::Call {
            message: e.to_string(),
        })?;
        match raw.request(RStr::from_str(&json)).into_result() {
            Ok(answer) => Ok(Some(
                serde_json::from_str(answer.as_str()).unwrap_or(serde_json::Value::Null),
            )),
            Err(message) if unknown_request(message.as_str()) => Ok(None),
            Err(message) => Err(HostError::Call {
                message: failed_in(&self.label, "request", message.as_str()),
            }),
        }
    }

    /// Asks the service to delete trial `trial_id`'s checkpoint folder wherever it keeps one
    /// of its own (see `TrainingService::delete_checkpoint`); `Ok(false)` where it was built
    /// before it could be asked.
    pub fn delete_checkpoint(&mut self, trial_id: &str) -> Result<bool, HostError> {
        self.request(&ServiceRequest::DeleteCheckpoint {
            trial_id: trial_id.to_string(),
        })
    }

    /// Tells the service the experiment's `trialConcurrency` changed (see
    /// `TrainingService::set_trial_concurrency`); `Ok(false)` where it was built before it
    /// could be told.
    pub fn set_trial_concurrency(&mut self, trial_concurrency: u32) -> Result<bool, HostError> {
        self.request(&ServiceRequest::TrialConcurrency { trial_concurrency })
    }

    /// Tells the service that none of the experiment's trials waits any more (see
    /// `TrainingService::nothing_waits`); `Ok(false)` where it was built before it could be
    /// told.
    pub fn nothing_waits(&mut self) -> Result<bool, HostError> {
        self.request(&ServiceRequest::NothingWaits)
    }

    /// Asks the service to copy trial `donor`'s checkpoint folder now for successor
    /// `trial_id` (see `TrainingService::snapshot_checkpoint`). `Ok(true)`: a copy is being
    /// taken; `Ok(false)`: the service does not take one (the SDK's default), or was built
    /// before it could be asked.
    pub fn snapshot_checkpoint(&mut self, trial_id: &str, donor: &str) -> Result<bool, HostError> {
        let answer = self.request_answer(&ServiceRequest::SnapshotCheckpoint {
            trial_id: trial_id.to_string(),
            donor: donor.to_string(),
        })?;
        Ok(answer == Some(serde_json::Value::Bool(true)))
    }

    /// Asks the service to delete the copy of a donor's checkpoint folder it took for successor
    /// `trial_id` (see `TrainingService::delete_snapshot`); `Ok(false)` where it was built
    /// before it could be asked.
    pub fn delete_snapshot(&mut self, trial_id: &str) -> Result<bool, HostError> {
        self.request(&ServiceRequest::DeleteSnapshot {
            trial_id: trial_id.to_string(),
        })
    }

    /// Asks the service to bring the copy of trial `donor`'s checkpoint folder it took for
    /// successor `trial_id` (or the donor's folder) to `dest` on this machine (see
    /// `TrainingService::fetch_snapshot`); answers once done. `Ok(true)`: it is there;
    /// `Ok(false)`: the service does not (the SDK's default), or was built before it could be
    /// asked.
    pub fn fetch_snapshot(
        &mut self,
        trial_id: &str,
        donor: &str,
        dest: &std::path::Path,
    ) -> Result<bool, HostError> {
        let answer = self.request_answer(&ServiceRequest::FetchSnapshot {
            trial_id: trial_id.to_string(),
            donor: donor.to_string(),
            dest: dest.to_path_buf(),
        })?;
        Ok(answer == Some(serde_json::Value::Bool(true)))
    }
}

/// Whether a service's error to a request says that its SDK does not know the request's kind:
/// the SDK's adaptor (plugin ABI 1.5 on) answers a kind added after it was built with this
/// message, which the host takes as "nothing done".
pub(crate) fn unknown_request(message: &str) -> bool {
    message.contains(": unknown request from host (")
}

// ---------------------------------------------------------------------------------------------
// Threads

type Job<T> = Box<dyn FnOnce(&mut T) + Send>;

/// Owns a component object and runs calls on it in order: on a dedicated thread (plugins), or
/// inline on the caller's thread (components built in this process, see
/// [`super::in_process`]), where a call has finished when it returns.
pub(super) struct PluginThread<T> {
    runner: Runner<T>,
    pub(super) label: Arc<str>,
}

enum Runner<T> {
    /// The jobs' sender, and what says that the thread has dropped the object (after the last
    /// job) and ended.
    Thread(mpsc::Sender<Job<T>>, tokio::sync::oneshot::Receiver<()>),
    Inline(Arc<std::sync::Mutex<T>>),
}

impl<T: Send + 'static> PluginThread<T> {
    pub(super) fn spawn(label: String, mut object: T) -> PluginThread<T> {
        let (jobs, inbox) = mpsc::channel::<Job<T>>();
        let (ended, ended_rx) = tokio::sync::oneshot::channel();
        let thread_name: String = format!("knob {label}").chars().take(15).collect();
        let label_on_thread = label.clone();
        // If the OS refuses a thread, `jobs` is dropped with the closure and every call
        // reports the component as gone, which is the truth.
        let _ = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || {
                // Every job runs the component's code.
                let _in_plugin = super::in_plugin::InPlugin::enter(&label_on_thread);
                while let Ok(job) = inbox.recv() {
                    job(&mut object);
                }
                drop(object);
                let _ = ended.send(());
            });
        PluginThread {
            runner: Runner::Thread(jobs, ended_rx),
            label: label.into(),
        }
    }

    /// Lets the component go: the calls already made run, then the object is dropped (a
    /// plugin's own stop: NNI's dispatcher hears of the trials' ends and the experiment's, and
    /// exits). Resolves once that is done. A process that exits without waiting for it kills
    /// the thread part-way, and with it what the drop was still doing.
    pub(super) fn close(self) -> impl std::future::Future<Output = ()> {
        let ended = match self.runner {
            Runner::Thread(jobs, ended) => {
                drop(jobs);
                Some(ended)
            }
            Runner::Inline(object) => {
                drop(object);
                None
            }
        };
        async move {
            if let Some(ended) = ended {
                // An error: the thread is gone (or never started) without saying so.
                let _ = ended.await;
            }
        }
    }

    /// Calls run on the caller's thread before `call` returns: no thread hop, so a caller on a
    /// paused tokio clock sees every call finished before time moves (the simulator).
    pub(super) fn inline(label: String, object: T) -> PluginThread<T> {
        PluginThread {
            runner: Runner::Inline(Arc::new(std::sync::Mutex::new(object))),
            label: label.into(),
        }
    }

    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut T) -> Result<R, HostError> + Send + 'static,
    ) -> Reply<R> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let label = self.label.clone();
        let job: Job<T> = Box::new(move |object| {
            let result = catch_unwind(AssertUnwindSafe(|| f(object))).unwrap_or_else(|_| {
                Err(HostError::Call {
                    message: format!("{label}: host-side panic while calling it"),
                })
            });
            let _ = reply.send(result);
        });
        let sent = match &self.runner {
            Runner::Thread(jobs, _) => jobs.send(job).is_ok(),
            Runner::Inline(object) => match object.lock() {
                Ok(mut object) => {
                    job(&mut object);
                    true
                }
                // A panic while it was held; the job's own catch_unwind makes this unreachable.
                Err(_) => false,
            },
        };
        Reply {
            answer: sent.then_some(answer),
            label: self.label.clone(),
        }
    }
}

/// The answer to one call on a component thread: `.await` it from async code, or `wait()`.
pub struct Reply<R> {
    answer: Option<tokio::sync::oneshot::Receiver<Result<R, HostError>>>,
    label: Arc<str>,
}

impl<R> Reply<R> {
    pub async fn get(self) -> Result<R, HostError> {
        let gone = HostError::Gone {
            label: self.label.to_string(),
        };
        match self.answer {
            Some(answer) => answer.await.unwrap_or(Err(gone)),
            None => Err(gone),
        }
    }

    /// Waits for the answer, like [`Reply::get`], but by reference: a wait cut short (one
    /// branch of a `select!`, a timeout) takes nothing, and the reply can be waited for again.
    /// Once it has answered, the reply is spent: asked again, it says the component is gone.
    pub async fn answer(&mut self) -> Result<R, HostError> {
        let gone = HostError::Gone {
            label: self.label.to_string(),
        };
        let Some(answer) = self.answer.as_mut() else {
            return Err(gone);
        };
        let answer = answer.await;
        self.answer = None;
        answer.unwrap_or(Err(gone))
    }

    /// The answer if it is there now (always, for a component run inline), else the reply
    /// back, to wait for later: what lets a caller that must not wait on a busy component
    /// (a training service stuck in a long start) go on without it.
    pub fn try_get(mut self) -> Result<Result<R, HostError>, Reply<R>> {
        let gone = || HostError::Gone {
            label: self.label.to_string(),
        };
        let Some(answer) = self.answer.as_mut() else {
            return Ok(Err(gone()));
        };
        match answer.try_recv() {
            Ok(answer) => Ok(answer),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => Err(self),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => Ok(Err(gone())),
        }
    }

    /// Blocks the current thread for the answer. Not for use inside an async runtime.
    pub fn wait(self) -> Result<R, HostError> {
        let gone = HostError::Gone {
            label: self.label.to_string(),
        };
        match self.answer {
            Some(answer) => answer.blocking_recv().unwrap_or(Err(gone)),
            None => Err(gone),
        }
    }
}

/// A tuner running on its own thread.
pub struct TunerHandle {
    pub(super) thread: PluginThread<TunerObject>,
    /// [`TunerObject::takes_objectives`].
    pub(super) takes_objectives: bool,
    /// Whether it may wake the host ([`TunerObject::wakes`]).
    pub(super) wakes: bool,
    /// [`TunerObject::takes_whole_metrics`].
    pub(super) takes_whole_metrics: bool,
}

impl TunerHandle {
    /// Runs `object` on a thread of its own.
    pub fn new(object: TunerObject) -> TunerHandle {
        TunerHandle {
            takes_objectives: object.takes_objectives,
            wakes: object.wakes,
            takes_whole_metrics: object.takes_whole_metrics,
            thread: PluginThread::spawn(object.label.clone(), object),
        }
    }

    /// Lets the tuner go once the calls already made have run; resolves when it has been
    /// dropped (see `PluginThread::close`).
    pub fn close(self) -> impl std::future::Future<Output = ()> {
        self.thread.close()
    }
    pub fn label(&self) -> &str {
        &self.thread.label
    }
    /// Whether the tuner may answer deferred ids on its own and wake the host
    /// ([`crate::Tuner::set_waker`]).
    pub fn wakes(&self) -> bool {
        self.wakes
    }
    /// What the tuner produced unprompted since the last call (after it woke the host).
    pub fn take_suggestions(&self) -> Reply<Vec<Suggestion>> {
        self.thread.call(|t| t.take_suggestions())
    }
    /// Whether the tuner takes vector objectives ([`crate::Tuner::takes_objectives`]).
    pub fn takes_objectives(&self) -> bool {
        self.takes_objectives
    }
    pub fn receive_trial_outcome(
        &self,
        parameter_id: u64,
        parameters: Value,
        outcome: crate::Outcome,
    ) -> Reply<Vec<Suggestion>> {
        self.thread
            .call(move |t| t.receive_trial_outcome(parameter_id, &parameters, &outcome))
    }
    pub fn update_search_space(&self, search_space: Value) -> Reply<()> {
        self.thread
            .call(move |t| t.update_search_space(&search_space))
    }
    pub fn generate_parameters(&self, parameter_id: u64) -> Reply<Generated> {
        self.thread
            .call(move |t| t.generate_parameters(parameter_id))
    }
    pub fn receive_trial_result(
        &self,
        parameter_id: u64,
        parameters: Value,
        value: f64,
    ) -> Reply<Vec<Suggestion>> {
        self.thread
            .call(move |t| t.receive_trial_result(parameter_id, &parameters, value))
    }
    /// Whether the tuner takes a final result as the trial reported it
    /// ([`crate::Tuner::takes_whole_metrics`]).
    pub fn takes_whole_metrics(&self) -> bool {
        self.takes_whole_metrics
    }
    /// [`TunerObject::receive_trial_metric`].
    pub fn receive_trial_metric(
        &self,
        parameter_id: u64,
        parameters: Value,
        value: f64,
        raw: String,
    ) -> Reply<Vec<Suggestion>> {
        self.thread
            .call(move |t| t.receive_trial_metric(parameter_id, &parameters, value, &raw))
    }
    pub fn trial_end(&self, parameter_id: u64, status: String) -> Reply<Vec<Suggestion>> {
        self.thread
            .call(move |t| t.trial_end(parameter_id, &status))
    }
    pub fn receive_intermediate_result(
        &self,
        parameter_id: u64,
        intermediate: crate::population::Intermediate,
        value: f64,
    ) -> Reply<Vec<Suggestion>> {
        self.thread
            .call(move |t| t.receive_intermediate_result(parameter_id, intermediate, value))
    }
    pub fn import_data(&self, trials: Vec<ImportedTrial>) -> Reply<()> {
        self.thread.call(move |t| t.import_data(&trials))
    }
}

/// An assessor running on its own thread.
pub struct AssessorHandle(pub(super) PluginThread<AssessorObject>);

impl AssessorHandle {
    /// Runs `object` on a thread of its own.
    pub fn new(object: AssessorObject) -> AssessorHandle {
        AssessorHandle(PluginThread::spawn(object.label.clone(), object))
    }

    /// Lets the assessor go once the calls already made have run; resolves when it has been
    /// dropped (see `PluginThread::close`).
    pub fn close(self) -> impl std::future::Future<Output = ()> {
        self.0.close()
    }
    pub fn label(&self) -> &str {
        &self.0.label
    }
    /// `history` is shared, not copied: the manager's copy grows in place between calls.
    pub fn assess_trial(
        &self,
        trial_id: String,
        history: impl Into<std::sync::Arc<Vec<f64>>>,
    ) -> Reply<Verdict> {
        let history = history.into();
        self.0.call(move |a| a.assess_trial(&trial_id, &history))
    }
    pub fn trial_final(&self, trial_id: String, value: f64) -> Reply<()> {
        self.0.call(move |a| a.trial_final(&trial_id, value))
    }
    pub fn trial_end(&self, trial_id: String, status: String) -> Reply<()> {
        self.0.call(move |a| a.trial_end(&trial_id, &status))
    }
}

/// A training service running on its own thread.
pub struct TrainingServiceHandle(
    pub(super) PluginThread<TrainingServiceObject>,
    Arc<std::sync::Mutex<QueuedStarts>>,
);

/// The starts asked of a service and not yet sent to it (they wait on its thread behind its
/// other calls), and those of them a kill came for meanwhile. A stop that came while many
/// starts were queued (a burst after `trialConcurrency` was raised) had every trial's process
/// started, then killed: 182 of 200 spawned after the stop, some running to their end while
/// the experiment was ending. A start whose kill came first is not sent: it is answered
/// [`crate::service::NOT_STARTED`], and its kill, with nothing to kill, is not sent either.
#[derive(Default)]
struct QueuedStarts {
    queued: std::collections::HashSet<String>,
    killed: std::collections::HashSet<String>,
}

fn lock_starts(starts: &std::sync::Mutex<QueuedStarts>) -> std::sync::MutexGuard<'_, QueuedStarts> {
    // Both sets are changed whole under the lock: a panic elsewhere leaves them meaningful.
    starts
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl TrainingServiceHandle {
    pub(super) fn new(thread: PluginThread<TrainingServiceObject>) -> TrainingServiceHandle {
        TrainingServiceHandle(thread, Default::default())
    }

    pub fn label(&self) -> &str {
        &self.0.label
    }
    pub fn environments(&self) -> Reply<Vec<Environment>> {
        self.0.call(|s| s.environments())
    }
    /// See [`TrainingServiceObject::environment_reports`].
    pub fn environment_reports(&self) -> Reply<Vec<EnvironmentReport>> {
        self.0.call(|s| s.environment_reports())
    }
    /// Not sent if the trial's kill comes while the start waits on the service's thread (see
    /// [`QueuedStarts`]).
    pub fn start_trial(&self, request: TrialRequest) -> Reply<()> {
        let starts = self.1.clone();
        lock_starts(&starts).queued.insert(request.trial_id.clone());
        let label = self.0.label.clone();
        self.0.call(move |s| {
            let killed = {
                let mut starts = lock_starts(&starts);
                starts.queued.remove(&request.trial_id);
                starts.killed.contains(&request.trial_id)
            };
            if killed {
                return Err(HostError::Call {
                    message: format!(
                        "{label}: {}: it was killed before its start reached the service",
                        crate::service::NOT_STARTED
                    ),
                });
            }
            s.start_trial(&request)
        })
    }
    pub fn kill_trial(&self, trial_id: String, reason: String) -> Reply<()> {
        let starts = self.1.clone();
        {
            let mut queued = lock_starts(&starts);
            if queued.queued.contains(&trial_id) {
                queued.killed.insert(trial_id.clone());
            }
        }
        self.0.call(move |s| {
            // Its start was not sent (it ran before this, in order): nothing runs to kill.
            if lock_starts(&starts).killed.remove(&trial_id) {
                return Ok(());
            }
            s.kill_trial(&trial_id, &reason)
        })
    }
    pub fn shutdown(&self) -> Reply<()> {
        self.0.call(|s| s.shutdown())
    }
    /// See [`TrainingServiceObject::delete_checkpoint`].
    pub fn delete_checkpoint(&self, trial_id: String) -> Reply<bool> {
        self.0.call(move |s| s.delete_checkpoint(&trial_id))
    }
    /// See [`TrainingServiceObject::set_trial_concurrency`].
    pub fn set_trial_concurrency(&self, trial_concurrency: u32) -> Reply<bool> {
        self.0
            .call(move |s| s.set_trial_concurrency(trial_concurrency))
    }
    /// See [`TrainingServiceObject::nothing_waits`].
    pub fn nothing_waits(&self) -> Reply<bool> {
        self.0.call(|s| s.nothing_waits())
    }
    /// See [`TrainingServiceObject::snapshot_checkpoint`].
    pub fn snapshot_checkpoint(&self, trial_id: String, donor: String) -> Reply<bool> {
        self.0
            .call(move |s| s.snapshot_checkpoint(&trial_id, &donor))
    }
    /// See [`TrainingServiceObject::delete_snapshot`].
    pub fn delete_snapshot(&self, trial_id: String) -> Reply<bool> {
        self.0.call(move |s| s.delete_snapshot(&trial_id))
    }
    /// See [`TrainingServiceObject::fetch_snapshot`].
    pub fn fetch_snapshot(
        &self,
        trial_id: String,
        donor: String,
        dest: std::path::PathBuf,
    ) -> Reply<bool> {
        self.0
            .call(move |s| s.fetch_snapshot(&trial_id, &donor, &dest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_not_there_yet_is_given_back_to_wait_for_and_an_inline_one_is_there_at_once() {
        let busy = PluginThread::spawn("busy".into(), ());
        let (release, released) = std::sync::mpsc::channel::<()>();
        // The component is busy with a first call (a long start, say) when the second is made.
        let first = busy.call(move |()| {
            released.recv().map_err(|e| HostError::Call {
                message: e.to_string(),
            })
        });
        let second = busy.call(|()| Ok(7));
        let second = match second.try_get() {
            Err(reply) => reply,
            Ok(answer) => panic!("answered while the component was busy: {answer:?}"),
        };
        release.send(()).unwrap();
        assert!(first.wait().is_ok());
        assert_eq!(second.wait().unwrap(), 7);

        let inline = PluginThread::inline("inline".into(), ());
        assert_eq!(inline.call(|()| Ok(8)).try_get().ok().unwrap().unwrap(), 8);

        // A component gone answers Gone, at once.
        let gone = Reply::<u8> {
            answer: None,
            label: "gone".into(),
        };
        assert!(matches!(gone.try_get(), Ok(Err(HostError::Gone { .. }))));
    }
}
