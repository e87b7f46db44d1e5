//! Patience: Optuna's `PatientPruner` (without a wrapped pruner). A trial is stopped when the
//! best of its last `patience` + 1 results is worse than the best before them by more than
//! `min_delta`.
//!
//! Optuna's rule exactly: with n results, nothing is judged while n ≤ patience + 1; then,
//! maximizing, stop when best(before) − min_delta > best(last patience + 1) (minimizing: when
//! best(before) + min_delta < best(last …)). `min_delta` is a tolerance: the recent results
//! may fall that far short of the earlier best before the trial is stopped.
//!
//! NaN results are never a best. Where all of the last patience + 1 results are NaN and an
//! earlier one was a number, the trial is stopped (Optuna's `nanmax` comparison would go on).

use knob_plugin_api::{Assessor, AssessorContext, PluginError, Verdict};
use serde_json::Value;

use crate::common::{number, numbers_apart, step_of, ClassArgs, Direction, OptimizeMode};

#[derive(Debug)]
pub struct PatienceAssessor {
    direction: Direction,
    patience: usize,
    min_delta: f64,
}

impl Assessor for PatienceAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            "Patience",
            class_args,
            &["patience", "min_delta", "optimize_mode"],
        )?;
        // Required, as in Optuna.
        let Some(patience) = args.whole_number("patience", 0..=u32::MAX)? else {
            return Err(
                args.error("patience is required: how many results without improvement to allow")
            );
        };
        Ok(PatienceAssessor {
            direction: args.optimize_mode()?,
            patience: patience as usize,
            min_delta: args
                .number("min_delta", 0.0..=f64::INFINITY)?
                .unwrap_or(0.0),
        })
    }

    fn set_context(&mut self, context: &AssessorContext) -> Result<(), PluginError> {
        self.direction.follow(context);
        Ok(())
    }

    fn assess_trial(&mut self, _trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let step = step_of(history);
        let window = self.patience + 1;
        if step <= window {
            return Ok(Verdict::good());
        }
        let (before, recent) = history.split_at(step - window);
        let Some(best_before) = self.direction.get().best(before) else {
            return Ok(Verdict::good());
        };
        let Some(best_recent) = self.direction.get().best(recent) else {
            let all_nan = match window {
                1 => "the last result is NaN".to_string(),
                n => format!("the last {n} results are all NaN"),
            };
            return Ok(Verdict::stop(format!(
                "step {step}: {all_nan}; the best before was {} (patience {})",
                number(best_before),
                self.patience
            )));
        };
        let allowed = match self.direction.get() {
            OptimizeMode::Maximize => best_before - self.min_delta,
            OptimizeMode::Minimize => best_before + self.min_delta,
        };
        if !self.direction.get().better(allowed, best_recent) {
            return Ok(Verdict::good());
        }
        let (recent_text, before_text) = numbers_apart(best_recent, best_before);
        let tolerance = if self.min_delta > 0.0 {
            format!(" by more than min_delta {}", number(self.min_delta))
        } else {
            String::new()
        };
        let recent = match window {
            1 => format!("the last result, {recent_text}, is worse than {before_text} before it"),
            n => format!(
                "the best of the last {n} results, {recent_text}, is worse than {before_text} before them"
            ),
        };
        Ok(Verdict::stop(format!(
            "step {step}: {recent}{tolerance} (patience {})",
            self.patience
        )))
    }
}
