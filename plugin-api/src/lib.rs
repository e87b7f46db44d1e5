//! knob's stable plugin ABI and the plugin author SDK.
//!
//! - Plugin authors implement [`Tuner`], [`Assessor`] or [`TrainingService`] and list them in
//!   [`export_plugin!`]; [`space`] gives them NNI's search-space model.
//! - The host (knob itself) discovers and loads plugin libraries with [`host`].
//!
//! abi_stable and libloading are implementation details of this crate: no type of theirs
//! appears in its public API.

mod abi;
pub mod config;
pub mod host;
mod labeled;
pub mod metric;
mod sdk;
pub mod service;
pub mod space;

pub use sdk::{
    accept_as_written, log, parse_class_args, status, Assessor, EventSink, Generated,
    ImportedTrial, PluginError, Suggestion, TrainingService, Tuner, Verdict,
};

#[doc(hidden)]
pub use sdk::__private;

/// The version of this crate, which is the plugin ABI version. A host accepts a plugin built
/// against the same or a newer patch of the same `0.x` line (cargo's semver rule for 0.x).
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What a plugin component is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum ComponentKind {
    Tuner,
    Assessor,
    TrainingService,
}

impl std::fmt::Display for ComponentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComponentKind::Tuner => "tuner",
            ComponentKind::Assessor => "assessor",
            ComponentKind::TrainingService => "training service",
        })
    }
}
