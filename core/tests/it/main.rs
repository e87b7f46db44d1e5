//! knob-core's integration tests: one binary, one module per area.

mod api_stream;
mod config;
mod config_v1;
mod experiment;
mod store;
