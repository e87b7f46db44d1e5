//! An NNI assessor (built-in by name, or the user's `className`) as a knob assessor: each
//! intermediate result goes to NNI's dispatcher as `ME` (type `PERIODICAL`, with its sequence
//! number), and the dispatcher answers a bad trial with `KI` and a good one with nothing.
//!
//! Because "good" has no answer, a verdict cannot wait for one: `assess_trial` waits a short,
//! bounded time for a `KI` of that trial and otherwise lets it go on; a `KI` that comes later
//! wakes the host (ABI 1.4's waker), which asks again at once: the trial stops then, not at its
//! next intermediate result (a host without wakers: at the next result). The stop's reason
//! names the assessor.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use knob_plugin_api::{log, Assessor, PluginError, Verdict, Waker};
use serde_json::{json, Value};

use crate::args::{DispatcherArgs, Role};
use crate::process::{parse_payload, python_number, Dispatcher, Python, WakeOn};

/// How long a verdict waits for the dispatcher's `KI` when the host gave no waker (hosts before
/// ABI 1.4); a slower kill lands at the trial's next result. With a waker nothing is waited for:
/// NNI's protocol answers only a bad verdict, so every good one (nearly all of them) would cost
/// the whole wait, and the host's loop waits with it: 150 ms a result made 12 trials of 20
/// results, 4 at a time, take 38 s instead of 4. The `KI` that comes a few milliseconds later
/// wakes the host, which asks again at once.
const VERDICT_WAIT: Duration = Duration::from_millis(150);

/// The parameter id of the assessor's `ME` and `EN` (an assessor is told trials, not parameter
/// ids). An integer, not null: nni 2.10.1's dispatcher compares it with the largest id of an
/// earlier run (`Recoverable.is_created_in_previous_exp`, `None <= -1` raises TypeError), which
/// is -1 in an assessor's dispatcher (it never gets `AD`), so 0 is never taken as resumed.
const ASSESSOR_PARAMETER_ID: u64 = 0;

pub struct DispatcherAssessor {
    args: DispatcherArgs,
    what: String,
    python: Python,
    dispatcher: Option<Dispatcher>,
    /// Intermediate results already sent, per trial.
    sent: BTreeMap<String, usize>,
    /// Trials the dispatcher asked to kill.
    killed: BTreeSet<String>,
    /// Woken by the reader on each `KI`: a late kill stops the trial at once (ABI 1.4 hosts),
    /// not at its next intermediate result.
    waker: Option<Waker>,
}

impl DispatcherAssessor {
    fn ensure_started(&mut self) -> Result<&mut Dispatcher, PluginError> {
        if self.dispatcher.is_none() {
            let launch = self
                .args
                .launch(Role::Assessor, self.python.clone())
                .ok_or_else(|| {
                    PluginError::new(format!(
                        "{}: no experiment folder was given, so NNI's dispatcher cannot start",
                        self.what
                    ))
                })?;
            let wake_on = self.waker.clone().map(|waker| WakeOn {
                waker,
                codes: &["KI"],
                on_close: false,
            });
            // Not waited for (see the tuner's `ensure_started`): results sent before it is up
            // are handled after `IN`, in order, and a late `KI` wakes the host.
            let mut dispatcher = Dispatcher::start(launch, wake_on)?;
            dispatcher.send("IN", "{}")?;
            self.dispatcher = Some(dispatcher);
        }
        Ok(self.dispatcher.as_mut().expect("started above"))
    }

    fn absorb(&mut self) -> Result<(), PluginError> {
        let Some(dispatcher) = self.dispatcher.as_mut() else {
            return Ok(());
        };
        dispatcher.drain()?;
        let pending: Vec<(String, String)> = dispatcher.pending().drain(..).collect();
        for (code, content) in pending {
            match code.as_str() {
                "KI" => {
                    let trial = match parse_payload(&content) {
                        Ok(Value::String(id)) => id,
                        _ => content.trim().trim_matches('"').to_owned(),
                    };
                    self.killed.insert(trial);
                }
                "ID" | "NO" => {}
                other => log::warn(&format!(
                    "{}: ignored command {other:?} from NNI's dispatcher",
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
}

impl Assessor for DispatcherAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = DispatcherArgs::parse("NniDispatcherAssessor", class_args)?;
        let what = args.describe(Role::Assessor);
        let python = args.python(Role::Assessor)?;
        Ok(DispatcherAssessor {
            args,
            what,
            python,
            dispatcher: None,
            sent: BTreeMap::new(),
            killed: BTreeSet::new(),
            waker: None,
        })
    }

    fn set_waker(&mut self, waker: Waker) {
        self.waker = Some(waker);
        // Started now, as the experiment starts, rather than at the first intermediate result:
        // Python and nni take a second or more to start, and the host's loop would wait that
        // long with trials running (their results queued, the first ones judged late). A
        // failure here is met again, and reported, at the first verdict; without an experiment
        // folder (configs only checked) nothing starts.
        let _ = self.ensure_started();
    }

    fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        self.ensure_started()?;
        let from = self.sent.get(trial_id).copied().unwrap_or(0);
        let dispatcher = self.dispatcher.as_mut().expect("started");
        for (sequence, value) in history.iter().enumerate().skip(from) {
            let metric = json!({
                "parameter_id": ASSESSOR_PARAMETER_ID,
                "trial_job_id": trial_id,
                "type": "PERIODICAL",
                "sequence": sequence,
                "value": python_number(*value),
            });
            dispatcher.send("ME", &metric.to_string())?;
        }
        self.sent.insert(trial_id.to_owned(), history.len());
        // Asked again with nothing new (the host woke on a late `KI`): the answer is what has
        // arrived, no wait.
        if history.len() > from && self.waker.is_none() {
            let quoted = serde_json::to_string(trial_id).unwrap_or_default();
            dispatcher.wait_for(VERDICT_WAIT, |pending| {
                pending
                    .iter()
                    .any(|(code, content)| code == "KI" && content.trim() == quoted)
            })?;
        }
        self.absorb()?;
        if self.killed.contains(trial_id) {
            return Ok(Verdict::stop(format!(
                "{} (through NNI's dispatcher) stopped the trial after {} intermediate results",
                self.what,
                history.len()
            )));
        }
        Ok(Verdict::good())
    }

    fn trial_end(&mut self, trial_id: &str, status: &str) -> Result<(), PluginError> {
        if self.dispatcher.is_none() {
            return Ok(());
        }
        self.sent.remove(trial_id);
        self.killed.remove(trial_id);
        let end = json!({
            "trial_job_id": trial_id,
            "event": status,
            "hyper_params": json!({"parameter_id": ASSESSOR_PARAMETER_ID, "parameters": {}}).to_string(),
        });
        self.dispatcher
            .as_mut()
            .expect("started")
            .send("EN", &end.to_string())?;
        self.absorb()
    }
}
