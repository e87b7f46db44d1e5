//! Curvefitting: NNI's learning-curve extrapolation assessor (after Domhan et al. 2015).
//!
//! From `start_step` results on, and every `gap` results after that, a trial's results are fitted
//! with NNI's 12 curve families; the families that fit and agree form an ensemble whose average
//! at `epoch_num` is the prediction. The trial is stopped when the prediction is worse than
//! `threshold` × the best final result of the trials completed so far. Until a trial has
//! completed, or when fewer than 4 families agree, every trial goes on.
//!
//! What knob does as NNI does (`model_factory.py`): least-squares fits (Levenberg–Marquardt, as
//! SciPy's `curve_fit`) from NNI's starting parameters; a family is kept when its squared error
//! over the points is below n·mean²; of those, the ensemble is the families whose prediction
//! at `epoch_num` lies strictly within median ± (n/10)·std of the kept families' values at
//! the last point; fewer than 4 → no prediction. A completed trial's final result is its last
//! intermediate result, as in NNI.
//!
//! Deviations, each to make the verdict deterministic or correct:
//! - NNI weights the ensemble by 20 Metropolis steps of size 0.0005 from uniform weights, a
//!   random walk that moves no weight by more than a few hundredths; knob uses the uniform
//!   weights it starts from, so the prediction is the ensemble's mean, the same every run.
//! - NNI's fits start from the parameters of the previous fit of any trial (a global that each
//!   fit overwrites); knob starts every fit from NNI's initial parameters.
//! - NNI takes a completed trial's final result from the history of whichever trial was
//!   assessed last (wrong with several trials running); knob uses the ending trial's own.
//! - `optimize_mode` (a knob extension; without it, the experiment's direction from
//!   `set_context`, where NNI always maximizes): when minimizing, the curves are fitted to the
//!   negated results.
//! - The stop line is best − (1 − threshold)·|best| (best + … when minimizing): NNI's
//!   threshold × best for a positive best, and still "a little worse than the best" when the
//!   best is negative.
//! - While a trial still climbs (its latest result above every earlier one), a family whose
//!   prediction is below that latest result is left out before the agreement filter: NNI's
//!   loose error filter lets through fits stuck flat at the mean, and its agreement filter
//!   (which compares predictions at `epoch_num` with values at the last point) can keep those
//!   and drop the families that fit, so it stopped a trial rising 1, 2, …, 7 on a prediction
//!   of 4.2 for epoch 10 (NNI itself keeps that trial only because its fits fail more often).
//!   So a climbing trial is never judged on a prediction below what it already reached.
//! - NaN results are left out of the fit (the other points keep their epochs).
//! - A trial that starts over (a retry: a history no longer than at its last judgment) is
//!   judged again from `start_step` on.

mod curves;
mod fit;

use std::collections::BTreeMap;

use knob_plugin_api::{status, Assessor, AssessorContext, PluginError, Verdict};
use serde_json::Value;

use crate::common::{number, numbers_apart, step_of, ClassArgs, Direction, OptimizeMode};

pub use self::prediction::{predict, Prediction};

#[derive(Debug)]
pub struct CurvefittingAssessor {
    direction: Direction,
    epoch_num: usize,
    start_step: usize,
    threshold: f64,
    gap: usize,
    /// The latest history of each running trial, for its final result when it ends.
    running: BTreeMap<String, Vec<f64>>,
    /// The step at which each trial was last judged, for `gap`.
    last_judged: BTreeMap<String, usize>,
    best_completed: Option<f64>,
}

impl Assessor for CurvefittingAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            "Curvefitting",
            class_args,
            &[
                "epoch_num",
                "start_step",
                "threshold",
                "gap",
                "optimize_mode",
            ],
        )?;
        // NNI's ranges and defaults; epoch_num has no default in NNI's validator.
        let Some(epoch_num) = args.whole_number("epoch_num", 1..=9999)? else {
            return Err(args.error("epoch_num is required: the epoch whose result to predict"));
        };
        Ok(CurvefittingAssessor {
            direction: args.optimize_mode()?,
            epoch_num: epoch_num as usize,
            start_step: args.whole_number("start_step", 0..=9999)?.unwrap_or(6) as usize,
            threshold: args.number("threshold", 0.0..=9999.0)?.unwrap_or(0.95),
            gap: args.whole_number("gap", 1..=9999)?.unwrap_or(1) as usize,
            running: BTreeMap::new(),
            last_judged: BTreeMap::new(),
            best_completed: None,
        })
    }

    fn set_context(&mut self, context: &AssessorContext) -> Result<(), PluginError> {
        self.direction.follow(context);
        Ok(())
    }

    fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        self.running.insert(trial_id.to_string(), history.to_vec());
        let Some(best) = self.best_completed else {
            return Ok(Verdict::good());
        };
        let step = step_of(history);
        if step < self.start_step || step == 0 {
            return Ok(Verdict::good());
        }
        // A step at or before the last judged one means the trial started over (a retry).
        if let Some(&judged) = self.last_judged.get(trial_id) {
            if step > judged && step - judged < self.gap {
                return Ok(Verdict::good());
            }
        }
        self.last_judged.insert(trial_id.to_string(), step);

        // The curve families rise to an asymptote: fit a minimized metric upside down.
        let oriented: Vec<f64> = match self.direction.get() {
            OptimizeMode::Maximize => history.to_vec(),
            OptimizeMode::Minimize => history.iter().map(|v| -v).collect(),
        };
        let Some(prediction) = predict(&oriented, self.epoch_num) else {
            return Ok(Verdict::good());
        };
        let predicted = match self.direction.get() {
            OptimizeMode::Maximize => prediction.value,
            OptimizeMode::Minimize => -prediction.value,
        };
        let margin = (1.0 - self.threshold) * best.abs();
        let line = match self.direction.get() {
            OptimizeMode::Maximize => best - margin,
            OptimizeMode::Minimize => best + margin,
        };
        if self.direction.get().better(predicted, line) {
            return Ok(Verdict::good());
        }
        let (predicted_text, line_text) = numbers_apart(predicted, line);
        Ok(Verdict::stop(format!(
            "step {step}: predicted {predicted_text} at epoch {epoch} (mean of {models} curve models), \
             not {better} {line_text} (threshold {threshold} × best {best})",
            epoch = self.epoch_num,
            models = prediction.models.len(),
            better = match self.direction.get() {
                OptimizeMode::Maximize => "above",
                OptimizeMode::Minimize => "below",
            },
            threshold = number(self.threshold),
            best = number(best),
        )))
    }

    fn trial_end(&mut self, trial_id: &str, trial_status: &str) -> Result<(), PluginError> {
        self.last_judged.remove(trial_id);
        let Some(history) = self.running.remove(trial_id) else {
            return Ok(());
        };
        if trial_status != status::SUCCEEDED {
            return Ok(());
        }
        if let Some(&last) = history.iter().rev().find(|v| !v.is_nan()) {
            if self
                .best_completed
                .is_none_or(|best| self.direction.get().better(last, best))
            {
                self.best_completed = Some(last);
            }
        }
        Ok(())
    }
}

mod prediction {
    use super::curves::FAMILIES;
    use super::fit::least_squares;

    /// NNI's `LEAST_FITTED_FUNCTION`: fewer agreeing families means "wait for more results".
    const MIN_MODELS: usize = 4;

    /// An ensemble prediction.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Prediction {
        /// The ensemble's mean value at the target epoch.
        pub value: f64,
        /// The families in the ensemble, in NNI's order.
        pub models: Vec<&'static str>,
    }

    /// Predicts the value at epoch `target` (counted from 1) of a rising learning curve whose
    /// results so far are `history` (epoch 1 first; NaN entries are skipped), or `None` when
    /// fewer than 4 curve families fit and agree.
    pub fn predict(history: &[f64], target: usize) -> Option<Prediction> {
        let points: Vec<(f64, f64)> = history
            .iter()
            .enumerate()
            .filter(|(_, y)| !y.is_nan())
            .map(|(i, &y)| ((i + 1) as f64, y))
            .collect();
        let &(last_x, latest) = points.last()?;
        // Still climbing: the latest result is above every earlier one.
        let rising = points[..points.len() - 1].iter().all(|p| p.1 < latest);
        let n = points.len() as f64;
        let mean = points.iter().map(|p| p.1).sum::<f64>() / n;
        let allowed_error = mean * mean * n;

        // Fit every family; keep those whose squared error is below n·mean² (NNI's filter).
        let mut fitted = Vec::new();
        for family in &FAMILIES {
            let params = least_squares(family.value, &points, family.initial);
            let error: f64 = points
                .iter()
                .map(|&(x, y)| ((family.value)(x, &params) - y).powi(2))
                .sum();
            let at_target = (family.value)(target as f64, &params);
            // Every family is a curve that rises towards an asymptote (NNI's weighting gives no
            // weight to an ensemble that does not rise), so one that puts a still-climbing trial
            // below a result it already has has not captured this curve: a fit stuck flat at the
            // mean or on a step. NNI's loose error filter lets such fits through, and its
            // agreement filter can then keep them and drop the families that fit, predicting a
            // fall (4.2 at epoch 10 for 1, 2, ..., 7). Left out, the ensemble never predicts
            // below the latest result of a rising curve.
            if error < allowed_error && !(rising && at_target < latest) {
                let at_last = (family.value)(last_x, &params);
                fitted.push((family.name, at_last, at_target));
            }
        }
        if fitted.is_empty() {
            return None;
        }

        // Agreement: prediction at the target within median ± (n/10)·std of the values at the
        // last point (NNI compares the two, strictly).
        let mut at_last: Vec<f64> = fitted.iter().map(|f| f.1).collect();
        at_last.sort_by(f64::total_cmp);
        let median = if at_last.len() % 2 == 1 {
            at_last[at_last.len() / 2]
        } else {
            (at_last[at_last.len() / 2 - 1] + at_last[at_last.len() / 2]) / 2.0
        };
        let count = at_last.len() as f64;
        let spread_mean = at_last.iter().sum::<f64>() / count;
        let std = (at_last
            .iter()
            .map(|v| (v - spread_mean).powi(2))
            .sum::<f64>()
            / count)
            .sqrt();
        let epsilon = history.len() as f64 / 10.0 * std;
        let ensemble: Vec<(&'static str, f64)> = fitted
            .iter()
            .filter(|f| f.2.is_finite() && f.2 < median + epsilon && f.2 > median - epsilon)
            .map(|f| (f.0, f.2))
            .collect();
        if ensemble.len() < MIN_MODELS {
            return None;
        }
        let value = ensemble.iter().map(|m| m.1).sum::<f64>() / ensemble.len() as f64;
        Some(Prediction {
            value,
            models: ensemble.iter().map(|m| m.0).collect(),
        })
    }
}
