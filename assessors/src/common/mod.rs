//! What several assessors share: `optimize_mode`, NaN-aware "best so far", and printing numbers
//! in verdict reasons.

pub(crate) mod args;
pub(crate) mod numbers;

pub(crate) use args::{ClassArgs, Direction, OptimizeMode};
pub(crate) use numbers::{number, numbers_apart};

/// The step a verdict talks about: how many intermediate results the trial has reported.
/// knob counts steps from 1, as NNI's assessors count `len(trial_history)`.
pub(crate) fn step_of(history: &[f64]) -> usize {
    history.len()
}
