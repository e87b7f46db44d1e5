//! The trials a model-based tuner has handed out and is waiting on, and the ids whose result it
//! has taken, so that each parameter id's result becomes at most one [`Observation`].

use std::collections::{BTreeMap, BTreeSet};

use knob_plugin_api::space::Encoding;
use knob_plugin_api::{log, PluginError};
use serde_json::Value;

use super::observed::Observation;

/// Trials handed out and still without a result (with their encoding, for the constant liar),
/// and every parameter id whose result has arrived (a second result for one is ignored).
#[derive(Debug, Default)]
pub(crate) struct RunningTrials {
    /// By parameter id; the observations' losses are NaN until the result comes.
    running: BTreeMap<u64, Observation>,
    reported: BTreeSet<u64>,
}

impl RunningTrials {
    /// Records `parameters`, just handed out for `parameter_id`, as running.
    pub(crate) fn start(
        &mut self,
        tuner: &str,
        encoding: &Encoding,
        parameter_id: u64,
        parameters: &Value,
    ) -> Result<(), PluginError> {
        let vector = encoding.encode(parameters).map_err(|e| {
            PluginError::new(format!(
                "{tuner}: produced parameters outside the space: {e}"
            ))
        })?;
        self.running.insert(
            parameter_id,
            Observation {
                parameters: parameters.clone(),
                vector,
                loss: f64::NAN,
                outcome: None,
            },
        );
        Ok(())
    }

    /// The observation a result makes: the running trial's with `loss`, or for an id this
    /// tuner did not hand out (a trial re-run after a resume) `parameters` encoded with
    /// `encoding`. `None`, with a warning where it is worth one, for a second result of an id,
    /// for parameters outside the space, and for an unknown id before any space (`encoding`
    /// `None`).
    pub(crate) fn finish(
        &mut self,
        tuner: &str,
        encoding: Option<&Encoding>,
        parameter_id: u64,
        parameters: &Value,
        loss: f64,
    ) -> Option<Observation> {
        if !self.reported.insert(parameter_id) {
            log::warn(&format!(
                "{tuner}: ignored a second result for parameters {parameter_id}"
            ));
            return None;
        }
        if let Some(observation) = self.running.remove(&parameter_id) {
            return Some(Observation {
                loss,
                ..observation
            });
        }
        match encoding?.encode(parameters) {
            Ok(vector) => Some(Observation {
                parameters: parameters.clone(),
                vector,
                loss,
                outcome: None,
            }),
            Err(e) => {
                log::warn(&format!(
                    "{tuner}: ignored the result of parameters {parameter_id}: not in the search space: {e}"
                ));
                None
            }
        }
    }

    /// Forgets a trial that ended; `true` when it was still running (it ended without a result).
    pub(crate) fn end(&mut self, parameter_id: u64) -> bool {
        self.running.remove(&parameter_id).is_some()
    }

    /// Re-encodes the running trials for a new space; those that no longer fit it are forgotten
    /// (their results, should they come, are encoded anew or ignored).
    pub(crate) fn reencode(&mut self, encoding: &Encoding) {
        self.running
            .retain(|_, o| match encoding.encode(&o.parameters) {
                Ok(vector) => {
                    o.vector = vector;
                    true
                }
                Err(_) => false,
            });
    }

    /// What a model learns from: each of `finished` as (point, loss), then, given a constant
    /// liar's made-up `lie`, each running trial (by parameter id) with that loss.
    pub(crate) fn with_finished<'a>(
        &'a self,
        finished: &'a [Observation],
        lie: Option<f64>,
    ) -> Vec<(&'a [f64], f64)> {
        let mut history: Vec<(&[f64], f64)> = finished
            .iter()
            .map(|o| (o.vector.as_slice(), o.loss))
            .collect();
        if let Some(lie) = lie {
            history.extend(self.running.values().map(|o| (o.vector.as_slice(), lie)));
        }
        history
    }

    pub(crate) fn len(&self) -> usize {
        self.running.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.running.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::RunningTrials;
    use knob_plugin_api::space::SearchSpace;
    use serde_json::json;

    #[test]
    fn each_id_gives_at_most_one_observation() {
        let space = SearchSpace::parse(r#"{"x": {"_type": "uniform", "_value": [0, 1]}}"#)
            .expect("test space");
        let encoding = space.encoding();
        let mut trials = RunningTrials::default();
        trials
            .start("T", &encoding, 1, &json!({"x": 0.25}))
            .expect("in the space");
        assert!(trials
            .start("T", &encoding, 2, &json!({"x": 7}))
            .is_err_and(|e| e
                .message()
                .starts_with("T: produced parameters outside the space")));
        assert_eq!(
            trials.with_finished(&[], Some(9.0)),
            vec![(&[0.25][..], 9.0)]
        );

        // The handed-out observation takes the loss; a second result for the id is ignored.
        let first = trials.finish("T", Some(&encoding), 1, &json!({"x": 0.25}), 0.5);
        assert_eq!(first.map(|o| (o.vector, o.loss)), Some((vec![0.25], 0.5)));
        assert!(trials.is_empty());
        assert!(trials
            .finish("T", Some(&encoding), 1, &json!({"x": 0.25}), 0.1)
            .is_none());

        // An id not handed out (a re-run after a resume) is encoded; outside the space or
        // before any space it is ignored.
        let resumed = trials.finish("T", Some(&encoding), 3, &json!({"x": 0.75}), 0.2);
        assert_eq!(resumed.map(|o| o.vector), Some(vec![0.75]));
        assert!(trials
            .finish("T", Some(&encoding), 4, &json!({"x": 2}), 0.2)
            .is_none());
        assert!(trials
            .finish("T", None, 5, &json!({"x": 0.5}), 0.2)
            .is_none());

        // Ending a trial says whether it was still running.
        trials
            .start("T", &encoding, 6, &json!({"x": 0.5}))
            .expect("in the space");
        assert_eq!(trials.len(), 1);
        assert!(trials.end(6));
        assert!(!trials.end(6));
    }
}
