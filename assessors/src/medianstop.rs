//! Medianstop: NNI's median stopping rule (Google Vizier).
//!
//! A running trial is stopped at step S when its best result up to S is strictly worse than the
//! median, over the trials that completed successfully and reported at least S results, of
//! their running averages at step S. Before `start_step` results, and while no completed trial
//! reached S, every trial goes on.
//!
//! Same as NNI's `MedianstopAssessor`, including its choice of median for an even count (the
//! lower middle value when maximizing, the upper one when minimizing: the more lenient one
//! either way). Differences, all about inputs NNI does not handle:
//! - NaN results are skipped: never a trial's best, and not part of a running average (the
//!   average at step S is over the numbers among the first S results). A trial with no number
//!   at all is stopped once there is a median to compare with; a completed trial with no
//!   number up to S does not count at S.
//! - A misspelt `optimize_mode` is an error (NNI warns and maximizes).
//! - Without `optimize_mode` it judges in the experiment's direction (`set_context`: minimize
//!   under TPE or Anneal), where NNI's maximizes whatever the tuner does.
//! - A trial that starts over (a retry) is judged on its new history alone.

use std::collections::BTreeMap;

use knob_plugin_api::{status, Assessor, AssessorContext, PluginError, Verdict};
use serde_json::Value;

use crate::common::{number, numbers_apart, step_of, ClassArgs, Direction, OptimizeMode};

#[derive(Debug)]
pub struct MedianstopAssessor {
    direction: Direction,
    start_step: usize,
    /// What is kept of each running trial, for its verdicts and for when it ends.
    running: BTreeMap<String, Running>,
    /// Per successfully completed trial (in completion order), its running average at each
    /// step; NaN where it had no number yet.
    completed_averages: Vec<Vec<f64>>,
}

impl Assessor for MedianstopAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new("Medianstop", class_args, &["optimize_mode", "start_step"])?;
        Ok(MedianstopAssessor {
            direction: args.optimize_mode()?,
            // NNI's range.
            start_step: args.whole_number("start_step", 0..=9999)?.unwrap_or(0) as usize,
            running: BTreeMap::new(),
            completed_averages: Vec::new(),
        })
    }

    fn set_context(&mut self, context: &AssessorContext) -> Result<(), PluginError> {
        self.direction.follow(context);
        Ok(())
    }

    fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let step = step_of(history);
        if step < self.start_step || step == 0 {
            return Ok(Verdict::good());
        }
        let running = match self.running.get_mut(trial_id) {
            Some(running) => running,
            None => self.running.entry(trial_id.to_string()).or_default(),
        };
        let mode = self.direction.get();
        running.follow(history, mode);
        let best = running.best;

        let mut averages: Vec<f64> = self
            .completed_averages
            .iter()
            .filter_map(|averages| averages.get(step - 1).copied())
            .filter(|average| !average.is_nan())
            .collect();
        if averages.is_empty() {
            return Ok(Verdict::good());
        }
        averages.sort_by(f64::total_cmp);
        let median = match self.direction.get() {
            OptimizeMode::Maximize => averages[(averages.len() - 1) / 2],
            OptimizeMode::Minimize => averages[averages.len() / 2],
        };
        let completed = match averages.len() {
            1 => "1 completed trial".to_string(),
            n => format!("{n} completed trials"),
        };
        let Some(best) = best else {
            let median = number(median);
            return Ok(Verdict::stop(format!(
                "step {step}: no numeric result yet (all NaN), median {median} of {completed}"
            )));
        };
        if self.direction.get().better(median, best) {
            let (best, median) = numbers_apart(best, median);
            let side = self.direction.get().worse_side();
            return Ok(Verdict::stop(format!(
                "step {step}: best {best} {side} median {median} of {completed}"
            )));
        }
        Ok(Verdict::good())
    }

    fn trial_end(&mut self, trial_id: &str, trial_status: &str) -> Result<(), PluginError> {
        let Some(history) = self.running.remove(trial_id) else {
            return Ok(());
        };
        if trial_status == status::SUCCEEDED {
            self.completed_averages
                .push(running_averages(&history.history));
        }
        Ok(())
    }
}

/// A running trial's history as last handed over, and its best number.
#[derive(Debug, Default)]
struct Running {
    history: Vec<f64>,
    best: Option<f64>,
}

impl Running {
    /// Takes the trial's history as handed over now. The host hands the whole history at each
    /// call, the earlier results unchanged, so only the new ones are added (copied whole and
    /// scanned for the best each time, a trial of 100 000 results cost 5·10⁹ copies); one that
    /// does not go on from the kept one (a retry starts over from step 1) replaces it.
    fn follow(&mut self, history: &[f64], mode: OptimizeMode) {
        let kept = self.history.len();
        let goes_on = kept <= history.len()
            && (kept == 0 || self.history[kept - 1].to_bits() == history[kept - 1].to_bits());
        let new = if goes_on {
            &history[kept..]
        } else {
            self.history.clear();
            self.best = None;
            history
        };
        self.history.extend_from_slice(new);
        if let Some(best_new) = mode.best(new) {
            self.best = Some(match self.best {
                Some(best) if !mode.better(best_new, best) => best,
                _ => best_new,
            });
        }
    }
}

/// The average of the numbers among the first 1, 2, … results (NaN until the first number).
fn running_averages(history: &[f64]) -> Vec<f64> {
    let (mut sum, mut count) = (0.0, 0u32);
    history
        .iter()
        .map(|&value| {
            if !value.is_nan() {
                sum += value;
                count += 1;
            }
            if count == 0 {
                f64::NAN
            } else {
                sum / f64::from(count)
            }
        })
        .collect()
}
