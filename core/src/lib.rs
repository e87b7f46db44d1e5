//! knob-core: the experiment model (config, trials, metrics), the trial-management loop,
//! the store and the HTTP API.
pub mod api;
pub mod backoff;
pub mod config;
pub mod experiment;
pub mod export;
pub mod importance;
pub mod manager;
pub mod nni_dispatch;
pub mod notify;
pub mod objectives;
pub mod registry;
#[cfg(feature = "sim")]
pub mod sim;
pub mod store;
