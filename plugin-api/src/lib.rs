//! knob's stable plugin ABI and the plugin author SDK.
//!
//! - Plugin authors implement [`Tuner`], [`Assessor`] or [`TrainingService`] and list them in
//!   [`export_plugin!`]; [`space`] gives them NNI's search-space model.
//! - The host (knob itself) discovers and loads plugin libraries with `host` (the `host`
//!   feature, on by default; plugins depend with `default-features = false`).
//!
//! abi_stable and libloading are implementation details of this crate: no type of theirs
//! appears in its public API.

// Without the host, what only the loader reads is unused.
#[cfg_attr(not(feature = "host"), allow(dead_code))]
mod abi;
mod class_args;
pub mod config;
#[cfg(feature = "host")]
pub mod host;
#[cfg_attr(not(feature = "host"), allow(dead_code))]
mod labeled;
pub mod metric;
pub mod objectives;
pub mod population;
mod sdk;
pub mod secrets;
pub mod service;
pub mod space;
pub mod text;

pub use class_args::parse_class_args;
pub use objectives::Outcome;
pub use sdk::{
    accept_as_written, log, status, Assessor, AssessorContext, EventSink, Generated, ImportedTrial,
    OptimizeMode, PluginError, Suggestion, TrainingService, Tuner, Verdict, Waker,
};

#[doc(hidden)]
pub use sdk::__private;

/// The version of this crate. It says nothing about compatibility: see [`ABI_VERSION`].
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version of the binary interface between knob and its plugins, separate from the crate's
/// and raised only when that interface changes. A host loads a plugin built for the same major
/// ABI version (an older minor gets the old behaviour for what it lacks); a pre-release ABI only
/// matches itself (semver: it promises no compatibility).
pub const ABI_VERSION: &str = abi::ABI_VERSION;

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
