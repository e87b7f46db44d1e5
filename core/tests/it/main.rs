//! knob-core's integration tests: one binary, one module per area.

mod config;
mod store;
