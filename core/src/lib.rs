//! knob-core: the experiment model (config, trials, metrics), the trial-management loop,
//! the store and the HTTP API.
pub mod config;
pub mod store;
