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

use knob_plugin_api::{parse_class_args, Assessor, PluginError, Verdict};
use serde::Deserialize;
use serde_json::Value;

use crate::common::{number, numbers_apart, optimize_mode, step_of, OptimizeMode};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatienceArgs {
    /// Required, as in Optuna.
    patience: u32,
    #[serde(default)]
    min_delta: f64,
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: OptimizeMode,
}

#[derive(Debug)]
pub struct PatienceAssessor {
    mode: OptimizeMode,
    patience: usize,
    min_delta: f64,
}

impl Assessor for PatienceAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: PatienceArgs = parse_class_args("Patience", class_args)?;
        if args.min_delta.is_nan() || args.min_delta < 0.0 {
            return Err(PluginError::new(format!(
                "classArgs of Patience: min_delta must be 0 or more, got {}",
                args.min_delta
            )));
        }
        Ok(PatienceAssessor {
            mode: args.optimize_mode,
            patience: args.patience as usize,
            min_delta: args.min_delta,
        })
    }

    fn assess_trial(&mut self, _trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let step = step_of(history);
        let window = self.patience + 1;
        if step <= window {
            return Ok(Verdict::good());
        }
        let (before, recent) = history.split_at(step - window);
        let Some(best_before) = self.mode.best(before) else {
            return Ok(Verdict::good());
        };
        let last = match window {
            1 => "the last result".to_string(),
            n => format!("the last {n} results"),
        };
        let Some(best_recent) = self.mode.best(recent) else {
            let all_nan = match window {
                1 => "the last result is NaN".to_string(),
                n => format!("the last {n} results are all NaN"),
            };
            return Ok(Verdict::stop(format!(
                "step {step}: {all_nan}, best before them {} (patience {})",
                number(best_before),
                self.patience
            )));
        };
        let allowed = match self.mode {
            OptimizeMode::Maximize => best_before - self.min_delta,
            OptimizeMode::Minimize => best_before + self.min_delta,
        };
        if !self.mode.better(allowed, best_recent) {
            return Ok(Verdict::good());
        }
        let (recent_text, before_text) = numbers_apart(best_recent, best_before);
        let tolerance = if self.min_delta > 0.0 {
            format!(" by more than min_delta {}", number(self.min_delta))
        } else {
            String::new()
        };
        Ok(Verdict::stop(format!(
            "step {step}: best of {last} {recent_text} is worse than {before_text} before them{tolerance} (patience {})",
            self.patience
        )))
    }
}
