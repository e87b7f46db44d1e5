//! Threshold: Optuna's `ThresholdPruner`. A trial is stopped as soon as its latest result is
//! below `lower`, above `upper`, or NaN.
//!
//! - `n_warmup_steps`: the first that many results are never judged (Optuna counts steps from
//!   0 and skips steps < n_warmup_steps, i.e. the same first results).
//! - `interval_steps`: after the warm-up, only every interval-th result is judged (the first
//!   after the warm-up, then every interval_steps).
//! - At least one of `lower` and `upper` is required, as Optuna requires.

use knob_plugin_api::{parse_class_args, Assessor, PluginError, Verdict};
use serde::Deserialize;
use serde_json::Value;

use crate::common::{numbers_apart, step_of};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThresholdArgs {
    lower: Option<f64>,
    upper: Option<f64>,
    #[serde(default)]
    n_warmup_steps: u32,
    #[serde(default = "default_interval_steps")]
    interval_steps: u32,
}

fn default_interval_steps() -> u32 {
    1
}

#[derive(Debug)]
pub struct ThresholdAssessor {
    lower: Option<f64>,
    upper: Option<f64>,
    warmup_steps: usize,
    interval_steps: usize,
}

impl Assessor for ThresholdAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: ThresholdArgs = parse_class_args("Threshold", class_args)?;
        let invalid =
            |what: String| Err(PluginError::new(format!("classArgs of Threshold: {what}")));
        match (args.lower, args.upper) {
            (None, None) => {
                return invalid(
                    "give lower, upper or both: results outside them stop a trial".into(),
                )
            }
            (Some(lower), Some(upper)) if lower > upper => {
                return invalid(format!("lower ({lower}) must not be above upper ({upper})"))
            }
            _ => {}
        }
        if args.interval_steps < 1 {
            return invalid("interval_steps must be at least 1".into());
        }
        Ok(ThresholdAssessor {
            lower: args.lower,
            upper: args.upper,
            warmup_steps: args.n_warmup_steps as usize,
            interval_steps: args.interval_steps as usize,
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
