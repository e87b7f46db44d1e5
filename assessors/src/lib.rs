//! knob's built-in early-stopping assessors, exported as one plugin library.
//!
//! Each rule lives in its own module, and its module documentation says exactly what it does
//! and where it differs from the NNI or Optuna rule it follows. What several share
//! (`optimize_mode`, NaN-aware bests, numbers in reasons) lives in `common`.
//!
//! Every rule is deterministic (same calls, same verdicts), refuses unknown classArgs naming the
//! known ones, never takes a NaN result for a best, and gives a one-line reason with a stop.

mod asha;
mod common;
mod curvefitting;
mod medianstop;
mod patience;
mod threshold;

pub use asha::AshaAssessor;
pub use curvefitting::{predict as predict_learning_curve, CurvefittingAssessor, Prediction};
pub use medianstop::MedianstopAssessor;
pub use patience::PatienceAssessor;
pub use threshold::ThresholdAssessor;

knob_plugin_api::export_plugin! {
    assessor "Medianstop": MedianstopAssessor = "median stopping rule (NNI's Medianstop): stops a trial whose best so far is worse than the median of completed trials' running averages at the same step";
    assessor "Curvefitting": CurvefittingAssessor = "learning-curve extrapolation (NNI's Curvefitting): stops a trial whose predicted result at epoch_num is worse than threshold x the best completed result";
    assessor "ASHA": AshaAssessor = "asynchronous successive halving as a stopping rule: at each rung min_resource*eta^k, only the top 1/eta go on";
    assessor "Threshold": ThresholdAssessor = "stops a trial whose latest result leaves [lower, upper] or is NaN (Optuna's ThresholdPruner)";
    assessor "Patience": PatienceAssessor = "stops a trial that has not improved for patience steps (Optuna's PatientPruner)";
}
