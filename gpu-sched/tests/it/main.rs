//! knob-gpu-sched's integration tests: one binary, one module per concern.

mod bytes;
mod constraints;
mod end_to_end;
mod fairness;
mod ledger;
mod lifecycle;
mod limits;
mod policies;
mod probe;
mod results;
mod simulate;
mod support;
