//! Finished trials as model-based tuners see them: the encoded point and a loss to minimize.

use knob_plugin_api::space::Encoding;
use knob_plugin_api::{log, ImportedTrial, Outcome};
use serde_json::Value;

use super::args::OptimizeMode;

/// A finished trial: its parameters, their encoding (`Encoding::encode` of exactly what the
/// trial received, so an imported trial and a handed-out one are the same numbers) and its loss.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub(crate) parameters: Value,
    pub(crate) vector: Vec<f64>,
    pub(crate) loss: f64,
    /// In an experiment with `objectives`, for a tuner that takes them (TPE): the whole result.
    pub(crate) outcome: Option<Outcome>,
}

/// The value a tuner minimizes: the metric, negated under `maximize`. A NaN metric (a trial that
/// reported garbage) is the worst loss there is, `+inf`, in either mode.
pub(crate) fn loss(value: f64, mode: OptimizeMode) -> f64 {
    match mode {
        _ if value.is_nan() => f64::INFINITY,
        OptimizeMode::Minimize => value,
        OptimizeMode::Maximize => -value,
    }
}

/// Encodes imported trials in order, skipping (with a warning) those that do not belong to the
/// space (it may have changed since they ran).
pub(crate) fn encode_imported(
    tuner: &str,
    encoding: &Encoding,
    trials: &[ImportedTrial],
    mode: OptimizeMode,
) -> Vec<Observation> {
    let mut out = Vec::with_capacity(trials.len());
    for trial in trials {
        match encoding.encode(&trial.parameters) {
            Ok(vector) => out.push(Observation {
                parameters: trial.parameters.clone(),
                vector,
                loss: loss(trial.value, mode),
                outcome: trial.objectives.clone(),
            }),
            Err(e) => log::warn(&format!(
                "{tuner}: skipped imported trial {}: not in the search space: {e}",
                trial.parameters
            )),
        }
    }
    out
}

/// Re-encodes observations for a new space, dropping those that no longer fit it.
pub(crate) fn reencode(tuner: &str, encoding: &Encoding, observations: &mut Vec<Observation>) {
    let before = observations.len();
    observations.retain_mut(|o| match encoding.encode(&o.parameters) {
        Ok(vector) => {
            o.vector = vector;
            true
        }
        Err(_) => false,
    });
    if observations.len() < before {
        log::warn(&format!(
            "{tuner}: the new search space leaves out {} of {before} finished trials; they no longer guide suggestions",
            before - observations.len()
        ));
    }
}
