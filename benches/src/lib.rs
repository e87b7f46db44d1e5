//! Shared fixtures for knob's criterion benches (the benches themselves live in `benches/`).
//!
//! Fixtures sit here rather than in the bench files so that every bench builds its inputs the
//! same way and the fixtures themselves are compiled (and clippy-checked) as a library.

pub mod gpu_sched;
pub mod harness;
