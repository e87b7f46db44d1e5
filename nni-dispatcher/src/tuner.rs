//! An NNI tuner or advisor (built-in by name, or the user's `className`) as a knob tuner: each
//! call becomes the command NNI's manager would send its dispatcher.
//!
//! Parameter ids: the dispatcher numbers its own (`_create_parameter_id`, or an advisor's
//! string ids such as `"0-4_0_3"`), so every trial is labeled with the dispatcher's id, the id
//! an NNI trial would see, and the host's numbers map to it. Labels also bring every trial of
//! an earlier run back on resume, finished or not: what `FD` and `AD` need.
//!
//! Suggestions: `GE 1` is answered by `TR` (parameters) or `NO` (none now). A tuner may answer
//! later (advisors and PBT keep a credit and send `TR` when a result frees one; a slow tuner
//! may take longer than the wait): such ids are deferred, and every `TR` is given, in order, to
//! the oldest id still owed one (`take_suggestions`). A `TR` after `NO` is accepted the same way.
//! The reader thread wakes the host on every `TR` (ABI 1.4's waker), so a late one is taken at
//! once, not at the host's next call; `set_waker` says so, and the host then waits for this
//! tuner while it owes parameters even when no trial runs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{log, Generated, ImportedTrial, PluginError, Suggestion, Tuner, Waker};
use serde_json::{json, Value};

use crate::args::{DispatcherArgs, Role};
use crate::process::{parse_payload, python_json, python_number, Dispatcher, Python, WakeOn};

/// How long a `GE` may go unanswered before its id is deferred (a late `TR` still counts, and
/// wakes the host). The host's loop waits while this call runs (for a stop, other trials'
/// results, deadlines), so the wait is short: NNI's TPE and Random answer in milliseconds; a
/// GP or Metis tuner that thinks for seconds or minutes is answered late, through the waker.
const SUGGESTION_WAIT: Duration = Duration::from_secs(1);

/// How long a trial's `EN` follows its final `ME`. NNI's dispatcher handles `ME` on one worker
/// thread and `EN` on another (its assessor queue), so an `EN` sent right behind its `ME` can be
/// handled first: NNI's TPE then drops the trial's parameters at `trial_end` and fails with a
/// KeyError at `receive_trial_result`. NNI's own manager sends `EN` only when its training
/// service next polls the trial's status, seconds later; knob waits this long.
const END_AFTER_FINAL: Duration = Duration::from_secs(2);

/// What the trial of a host parameter id was given.
#[derive(Debug, Clone)]
struct Issued {
    /// The dispatcher's parameter id (a number, or an advisor's string).
    dispatcher_id: Value,
    /// The `TR` payload: `EN` hands it back as `hyper_params`.
    hyper_params: String,
}

pub struct DispatcherTuner {
    args: DispatcherArgs,
    what: String,
    python: Python,
    space: Option<Value>,
    dispatcher: Option<Dispatcher>,
    issued: BTreeMap<u64, Issued>,
    /// Host ids deferred and still owed parameters, oldest first.
    owed: VecDeque<u64>,
    ready: Vec<Suggestion>,
    /// An earlier run's trials, sent once the dispatcher is up (resume).
    imported: Vec<ImportedTrial>,
    /// Woken by the reader on each `TR`: a late one is taken at once (ABI 1.4 hosts).
    waker: Option<Waker>,
    /// Whether the dispatcher answered `IN` (`ID`): until then a `GE` cannot be answered, so
    /// none is waited for.
    initialized: bool,
    /// Host ids whose final result went to the dispatcher as `ME` and whose `EN` has not.
    finals_sent: BTreeSet<u64>,
    /// The dispatcher answered `NO` and no `TR` came since: said once, in a warning.
    said_no_more: bool,
}

impl DispatcherTuner {
    /// Sends a trial's final result to NNI's dispatcher (`ME`, FINAL), `value` the JSON text
    /// the trial reported (or its number's).
    fn send_final(&mut self, parameter_id: u64, value: String) -> Result<(), PluginError> {
        self.ensure_started()?;
        let issued = self.issued(parameter_id)?.clone();
        let metric = json!({
            "parameter_id": issued.dispatcher_id,
            "trial_job_id": trial_job_id(parameter_id),
            "type": "FINAL",
            "sequence": 0,
            "value": value,
        });
        self.dispatcher
            .as_mut()
            .expect("started")
            .send("ME", &metric.to_string())?;
        self.finals_sent.insert(parameter_id);
        self.absorb()
    }

    fn ensure_started(&mut self) -> Result<&mut Dispatcher, PluginError> {
        if self.dispatcher.is_none() {
            let launch = self.args.launch(Role::Tuner, self.python.clone()).ok_or_else(|| {
                PluginError::new(format!(
                    "{}: no experiment folder was given, so NNI's dispatcher cannot start (configs are only checked)",
                    self.what
                ))
            })?;
            // A failure wakes the host as well: one that waits for deferred ids with nothing
            // running hears it at once (`take_suggestions`), not when its patience runs out.
            let wake_on = self.waker.clone().map(|waker| WakeOn {
                waker,
                codes: &["TR", "ER"],
                on_close: true,
            });
            // Not waited for: `ID` comes when Python, nni and the tuner's constructor are up,
            // seconds later (minutes for a user's tuner that loads a model), and the host's loop
            // would wait that long (a `knob stop` with it). NNI's dispatcher handles commands
            // in order, so what follows `IN` is handled after it; the first `GE` is deferred
            // and its late `TR` wakes the host.
            let mut dispatcher = Dispatcher::start(launch, wake_on)?;
            let space = self.space.clone().unwrap_or_else(|| json!({}));
            dispatcher.send("IN", &space.to_string())?;
            // Resume, as NNI's manager does right after `ID`: the finished trials to learn from
            // (`FD`), then every trial of the earlier run (`AD`): the dispatcher continues its
            // ids after theirs, and the final results of those that run again are imported.
            if let Some(finished) = finished_data(&self.imported) {
                dispatcher.send("FD", &finished)?;
            }
            let earlier: Vec<Value> = self
                .imported
                .iter()
                .filter_map(|t| {
                    let id = dispatcher_id_of(t.label.as_deref()?);
                    id.is_u64().then(|| {
                        json!({"parameter_id": id, "parameter_source": "resumed", "parameters": t.parameters})
                    })
                })
                .collect();
            if !earlier.is_empty() {
                dispatcher.send("AD", &Value::Array(earlier).to_string())?;
            }
            self.dispatcher = Some(dispatcher);
        }
        Ok(self.dispatcher.as_mut().expect("started above"))
    }

    /// Turns what the dispatcher sent into suggestions; warns about what knob does not act on.
    fn absorb(&mut self) -> Result<(), PluginError> {
        let Some(dispatcher) = self.dispatcher.as_mut() else {
            return Ok(());
        };
        dispatcher.drain()?;
        let pending: Vec<(String, String)> = dispatcher.pending().drain(..).collect();
        for (code, content) in pending {
            match code.as_str() {
                "TR" => {
                    self.said_no_more = false;
                    self.new_trial(&content)?
                }
                // Nothing more now: the ids stay owed; a later TR may still pay them (an
                // advisor's next bracket, a tuner given a new search space), as NNI waits too.
                // Said, since the host's wait would otherwise read as a tuner slow to start.
                "NO" if !self.said_no_more => {
                    self.said_no_more = true;
                    log::warn(&format!(
                        "{}: the tuner has no more parameters for now (NNI's NoMoreTrialError); knob waits for it to send more, as NNI does, and the experiment ends once nothing runs and none came in 10 minutes; `knob stop` ends it now",
                        self.what
                    ))
                }
                "NO" => {}
                "KI" => log::warn(&format!(
                    "{}: the tuner asked to kill trial {content}; only an assessor's kill is acted on",
                    self.what
                )),
                "SP" => log::warn(&format!(
                    "{}: ignored a multi-phase parameter (SP), which knob does not support",
                    self.what
                )),
                "ID" => self.initialized = true,
                other => log::warn(&format!(
                    "{}: ignored an unknown command {other:?} from NNI's dispatcher",
                    self.what
                )),
            }
        }
        // A dispatcher that ended behind what it sent (its `ID` among them) is seen as ended
        // only once that is taken: now.
        match self.dispatcher.as_mut() {
            Some(dispatcher) => dispatcher.drain(),
            None => Ok(()),
        }
    }

    fn new_trial(&mut self, content: &str) -> Result<(), PluginError> {
        let payload = parse_payload(content).map_err(|e| {
            PluginError::new(format!(
                "{}: unreadable parameters from NNI's dispatcher ({e}): {content}",
                self.what
            ))
        })?;
        let parameters = payload.get("parameters").cloned().unwrap_or(Value::Null);
        let dispatcher_id = payload.get("parameter_id").cloned().unwrap_or(Value::Null);
        let Some(host_id) = self.owed.pop_front() else {
            log::warn(&format!(
                "{}: NNI's dispatcher sent parameters nobody asked for (parameter id {dispatcher_id}); dropped",
                self.what
            ));
            return Ok(());
        };
        let label = label_of(&dispatcher_id);
        self.issued.insert(
            host_id,
            Issued {
                dispatcher_id,
                hyper_params: content.to_owned(),
            },
        );
        self.ready.push(Suggestion {
            parameter_id: host_id,
            parameters,
            label: Some(label),
        });
        Ok(())
    }

    fn issued(&self, host_id: u64) -> Result<&Issued, PluginError> {
        self.issued.get(&host_id).ok_or_else(|| {
            PluginError::new(format!(
                "{}: parameter id {host_id} was not handed out by NNI's dispatcher",
                self.what
            ))
        })
    }
}

/// The label a trial carries: the dispatcher's id as text.
fn label_of(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The dispatcher's id back from a label: a number where it reads as one.
fn dispatcher_id_of(label: &str) -> Value {
    label
        .parse::<u64>()
        .map(Value::from)
        .unwrap_or_else(|_| Value::String(label.to_owned()))
}

/// The trial id NNI's manager would give: knob binds results by its own ids, and the dispatcher
/// only needs a stable one per parameter id (advisors map it back).
fn trial_job_id(host_id: u64) -> String {
    format!("knob{host_id}")
}

/// `FD`'s payload, as NNI's manager sends it on resume: every trial that ended with a result,
/// `{"parameter": ..., "value": ...}`, the value as the trial reported it (a dict whole) where
/// the host gave it, else its number; `None` when there is none.
fn finished_data(trials: &[ImportedTrial]) -> Option<String> {
    let finished: Vec<Value> = trials
        .iter()
        .filter(|t| t.has_ended() && t.value.is_finite())
        .map(|t| {
            let value = t.metric.clone().unwrap_or_else(|| json!(t.value));
            json!({"parameter": t.parameters, "value": value})
        })
        .collect();
    (!finished.is_empty()).then(|| python_json(&Value::Array(finished)))
}

impl Tuner for DispatcherTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = DispatcherArgs::parse("NniDispatcher", class_args)?;
        let what = args.describe(Role::Tuner);
        let python = args.python(Role::Tuner)?;
        Ok(DispatcherTuner {
            args,
            what,
            python,
            space: None,
            dispatcher: None,
            issued: BTreeMap::new(),
            owed: VecDeque::new(),
            ready: Vec::new(),
            imported: Vec::new(),
            waker: None,
            initialized: false,
            finals_sent: Default::default(),
            said_no_more: false,
        })
    }

    fn set_waker(&mut self, waker: Waker) -> bool {
        self.waker = Some(waker);
        true
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let json = space.json().clone();
        if let Some(dispatcher) = self.dispatcher.as_mut() {
            dispatcher.send("SS", &json.to_string())?;
        }
        self.space = Some(json);
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.ensure_started()?;
        // An earlier id still owed takes the next TR (the oldest owed id is paid first), so
        // waiting cannot pay this one: it is deferred at once, as is one asked for before the
        // dispatcher answered `IN` (it is still starting: Python, nni, the tuner's
        // constructor). Otherwise the first answer ends a short wait; a NO too (the tuner has
        // nothing now: NNI's PBTTuner until a generation's last result is in). An id not paid
        // in the wait is deferred, and a later TR pays it (`take_suggestions`, which the reader
        // thread's waker makes the host call at once). Waiting longer would hold the tuner's
        // thread with every result queued behind it (the host's loop waits 20 ms of it at
        // most): an advisor or PBTTuner that pays its credit only when a result comes in would
        // then never answer.
        let wait = if self.owed.is_empty() && self.initialized {
            SUGGESTION_WAIT
        } else {
            Duration::ZERO
        };
        self.owed.push_back(parameter_id);
        let dispatcher = self.dispatcher.as_mut().expect("started");
        dispatcher.send("GE", "1")?;
        dispatcher.wait_for(wait, |pending| {
            pending.iter().any(|(code, _)| code == "TR" || code == "NO")
        })?;
        self.absorb()?;
        match self
            .ready
            .iter()
            .position(|s| s.parameter_id == parameter_id)
        {
            Some(index) => {
                let suggestion = self.ready.remove(index);
                Ok(Generated::Labeled {
                    parameters: suggestion.parameters,
                    label: suggestion.label.unwrap_or_default(),
                })
            }
            None => Ok(Generated::Deferred),
        }
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        _parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        self.send_final(parameter_id, python_number(value))
    }

    /// NNI hands its tuner the final result as the trial reported it: a dict whole, whose
    /// entries a user's own class may read (`value['accuracy']`); its built-in tuners take the
    /// default number out themselves (`extract_scalar_reward`).
    fn takes_whole_metrics() -> bool {
        true
    }

    fn receive_trial_metric(
        &mut self,
        parameter_id: u64,
        _parameters: &Value,
        _value: f64,
        metric: &Value,
    ) -> Result<(), PluginError> {
        self.send_final(parameter_id, python_json(metric))
    }

    fn trial_end(&mut self, parameter_id: u64, status: &str) -> Result<(), PluginError> {
        self.ensure_started()?;
        // An id deferred and never paid (the host gave up on it) is no longer owed.
        if let Some(index) = self.owed.iter().position(|id| *id == parameter_id) {
            self.owed.remove(index);
            return self.absorb();
        }
        let issued = self.issued(parameter_id)?.clone();
        let end = json!({
            "trial_job_id": trial_job_id(parameter_id),
            "event": status,
            "hyper_params": issued.hyper_params,
        });
        let dispatcher = self.dispatcher.as_mut().expect("started");
        if self.finals_sent.remove(&parameter_id) {
            dispatcher.send_later("EN", &end.to_string(), END_AFTER_FINAL)?;
        } else {
            dispatcher.send("EN", &end.to_string())?;
        }
        self.absorb()
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        for trial in trials {
            if let (Some(host_id), Some(label)) = (trial.parameter_id, &trial.label) {
                let dispatcher_id = dispatcher_id_of(label);
                let hyper_params = json!({
                    "parameter_id": dispatcher_id,
                    "parameter_source": "algorithm",
                    "parameters": trial.parameters,
                    "parameter_index": 0,
                })
                .to_string();
                self.issued.insert(
                    host_id,
                    Issued {
                        dispatcher_id,
                        hyper_params,
                    },
                );
            }
        }
        match self.dispatcher.as_mut() {
            // Imported while running (NNI's `nnictl experiment import`): FD only.
            Some(dispatcher) => {
                if let Some(finished) = finished_data(trials) {
                    dispatcher.send("FD", &finished)?;
                }
            }
            None => self.imported.extend_from_slice(trials),
        }
        Ok(())
    }

    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        // A failure ends the experiment, so what else is ready no longer matters.
        self.absorb()?;
        Ok(std::mem::take(&mut self.ready))
    }
}
