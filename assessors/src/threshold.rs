//! Threshold: Optuna's `ThresholdPruner`. A trial is stopped as soon as its latest result is
//! below `lower`, above `upper`, or NaN.
//!
//! - `n_warmup_steps`: the first that many results are never judged (Optuna counts steps from
//!   0 and skips steps < n_warmup_steps, i.e. the same first results).
//! - `interval_steps`: after the warm-up, only every interval-th result is judged (the first
//!   after the warm-up, then every interval_steps).
//! - At least one of `lower` and `upper` is required, as Optuna requires.

use knob_plugin_api::{Assessor, PluginError, Verdict};
use serde_json::Value;

use crate::common::{numbers_apart, step_of, ClassArgs};

#[derive(Debug)]
pub struct ThresholdAssessor {
    lower: Option<f64>,
    upper: Option<f64>,
    warmup_steps: usize,
    interval_steps: usize,
}

impl Assessor for ThresholdAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            "Threshold",
            class_args,
            &["lower", "upper", "n_warmup_steps", "interval_steps"],
        )?;
        let any = f64::NEG_INFINITY..=f64::INFINITY;
        let (lower, upper) = (
            args.number("lower", any.clone())?,
            args.number("upper", any)?,
        );
        match (lower, upper) {
            (None, None) => {
                return Err(
                    args.error("give lower, upper or both: results outside them stop a trial")
                )
            }
            (Some(lower), Some(upper)) if lower > upper => {
                return Err(args.error(format!("lower ({lower}) must not be above upper ({upper})")))
            }
            _ => {}
        }
        Ok(ThresholdAssessor {
            lower,
            upper,
            warmup_steps: args
                .whole_number("n_warmup_steps", 0..=u32::MAX)?
                .unwrap_or(0) as usize,
            interval_steps: args
                .whole_number("interval_steps", 1..=u32::MAX)?
                .unwrap_or(1) as usize,
        })
    }

    fn assess_trial(&mut self, _trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let step = step_of(history);
        let Some(&latest) = history.last() else {
            return Ok(Verdict::good());
        };
        if step <= self.warmup_steps
            || !(step - 1 - self.warmup_steps).is_multiple_of(self.interval_steps)
        {
            return Ok(Verdict::good());
        }
        if latest.is_nan() {
            return Ok(Verdict::stop(format!("step {step}: result NaN")));
        }
        if let Some(lower) = self.lower.filter(|&lower| latest < lower) {
            let (latest, lower) = numbers_apart(latest, lower);
            return Ok(Verdict::stop(format!(
                "step {step}: result {latest} below the lower threshold {lower}"
            )));
        }
        if let Some(upper) = self.upper.filter(|&upper| latest > upper) {
            let (latest, upper) = numbers_apart(latest, upper);
            return Ok(Verdict::stop(format!(
                "step {step}: result {latest} above the upper threshold {upper}"
            )));
        }
        Ok(Verdict::good())
    }
}
