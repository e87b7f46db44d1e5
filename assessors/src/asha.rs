//! ASHA: asynchronous successive halving (Li et al. 2018) as a stopping rule, as Optuna's
//! `SuccessiveHalvingPruner` and Ray Tune's `ASHAScheduler` apply it.
//!
//! Rungs sit at steps min_resource · eta^k (k = 0, 1, …) below `max_resource`. When a trial
//! reaches a rung, its result at that step is recorded there, and it goes on only if that result
//! is among the top ⌊n/eta⌋ (at least the top 1) of the n results recorded at that rung so far,
//! its own included (Optuna's rule; ties go on). Nothing waits: a trial is judged against the
//! trials that reached the rung before it, so the first trials at a rung always go on.
//!
//! - `grace_period`: no trial is stopped before this step (rungs below it record nothing).
//! - `max_resource`: the last step a trial runs; there is no rung at or above it, since a trial
//!   that reached it has done all its work. Unset: rungs continue without end.
//! - A NaN result at a rung stops the trial (as Optuna does) and is not recorded.
//! - A trial that starts over (a retry: a shorter history than last time) is judged again at
//!   each rung, its new result replacing its old one.
//! - `eta` is accepted as another name for `reduction_factor`, as Hyperband configs spell it.

use std::collections::BTreeMap;

use knob_plugin_api::{Assessor, AssessorContext, PluginError, Verdict};
use serde_json::Value;

use crate::common::{numbers_apart, step_of, ClassArgs, Direction, OptimizeMode};

/// Optuna's and Ray Tune's default.
const DEFAULT_REDUCTION_FACTOR: u32 = 4;

#[derive(Debug)]
pub struct AshaAssessor {
    direction: Direction,
    reduction_factor: u64,
    min_resource: u64,
    max_resource: Option<u64>,
    grace_period: u64,
    /// Rung step → each trial's result there (one per trial: a retried trial replaces its own).
    rungs: BTreeMap<u64, BTreeMap<String, f64>>,
    /// Per trial, the highest rung it has been judged at.
    judged_up_to: BTreeMap<String, u64>,
    /// Per trial, the length of the history last seen: a shorter one means the trial started
    /// over (a retry), and its rungs are judged again.
    last_step: BTreeMap<String, u64>,
}

impl Assessor for AshaAssessor {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            "ASHA",
            class_args,
            &[
                "optimize_mode",
                "reduction_factor",
                "eta",
                "min_resource",
                "max_resource",
                "grace_period",
            ],
        )?;
        let factor = |name| args.whole_number(name, 2..=u32::MAX);
        let reduction_factor = match (factor("reduction_factor")?, factor("eta")?) {
            (Some(_), Some(_)) => {
                return Err(
                    args.error("reduction_factor and eta are the same setting; give only one")
                )
            }
            (Some(factor), None) | (None, Some(factor)) => factor,
            (None, None) => DEFAULT_REDUCTION_FACTOR,
        };
        let min_resource = args
            .whole_number("min_resource", 1..=u32::MAX)?
            .unwrap_or(1);
        let max_resource = args.whole_number("max_resource", 1..=u32::MAX)?;
        if let Some(max) = max_resource.filter(|&max| max <= min_resource) {
            return Err(args.error(format!(
                "max_resource ({max}) must be above min_resource ({min_resource})"
            )));
        }
        Ok(AshaAssessor {
            direction: args.optimize_mode()?,
            reduction_factor: reduction_factor.into(),
            min_resource: min_resource.into(),
            max_resource: max_resource.map(u64::from),
            grace_period: args
                .whole_number("grace_period", 0..=u32::MAX)?
                .unwrap_or(0)
                .into(),
            rungs: BTreeMap::new(),
            judged_up_to: BTreeMap::new(),
            last_step: BTreeMap::new(),
        })
    }

    fn set_context(&mut self, context: &AssessorContext) -> Result<(), PluginError> {
        self.direction.follow(context);
        Ok(())
    }

    fn assess_trial(&mut self, trial_id: &str, history: &[f64]) -> Result<Verdict, PluginError> {
        let step = step_of(history) as u64;
        if self
            .last_step
            .insert(trial_id.to_string(), step)
            .is_some_and(|last| step <= last)
        {
            self.judged_up_to.remove(trial_id);
        }
        let judged = self.judged_up_to.get(trial_id).copied().unwrap_or(0);
        // Every rung passed since the last call, lowest first (one per call when results
        // arrive one at a time, as they do).
        let mut rung = self.min_resource;
        while rung <= step && self.max_resource.is_none_or(|max| rung < max) {
            if rung > judged {
                self.judged_up_to.insert(trial_id.to_string(), rung);
                if rung >= self.grace_period {
                    let value = history[rung as usize - 1];
                    if let Some(reason) = self.judge_at_rung(rung, trial_id, value) {
                        return Ok(Verdict::stop(reason));
                    }
                }
            }
            rung = match rung.checked_mul(self.reduction_factor) {
                Some(next) => next,
                None => break,
            };
        }
        Ok(Verdict::good())
    }

    fn trial_end(&mut self, trial_id: &str, _status: &str) -> Result<(), PluginError> {
        // Its results stay in the rungs: later trials are judged against every trial that got
        // there, stopped or not.
        self.judged_up_to.remove(trial_id);
        self.last_step.remove(trial_id);
        Ok(())
    }
}

impl AshaAssessor {
    /// Records `value` at `rung`; the reason to stop, if it is not in the top 1/eta there.
    fn judge_at_rung(&mut self, rung: u64, trial_id: &str, value: f64) -> Option<String> {
        let recorded = self.rungs.entry(rung).or_default();
        if value.is_nan() {
            recorded.remove(trial_id);
            return Some(format!(
                "step {rung}: result NaN at this rung (never in the top 1/{})",
                self.reduction_factor
            ));
        }
        recorded.insert(trial_id.to_string(), value);
        let n = recorded.len();
        let kept = (n / self.reduction_factor as usize).max(1);
        let mut ranked: Vec<f64> = recorded.values().copied().collect();
        // Best first.
        ranked.sort_by(|a, b| match self.direction.get() {
            OptimizeMode::Maximize => b.total_cmp(a),
            OptimizeMode::Minimize => a.total_cmp(b),
        });
        let cutoff = ranked[kept - 1];
        if !self.direction.get().better(cutoff, value) {
            return None;
        }
        let (value, cutoff) = numbers_apart(value, cutoff);
        let side = self.direction.get().worse_side();
        let rank = match kept {
            1 => "best".to_string(),
            k => format!("{}{} best", k, ordinal_suffix(k)),
        };
        Some(format!(
            "step {rung}: {value} {side} {cutoff}, the {rank} of {n} results at this rung \
             (top 1/{eta} go on)",
            eta = self.reduction_factor
        ))
    }
}

fn ordinal_suffix(n: usize) -> &'static str {
    match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    }
}
