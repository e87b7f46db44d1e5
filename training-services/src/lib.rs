//! knob's training services, built as a plugin library (`cdylib`) and as an `rlib`.
//!
//! - [`local`]: the `local` service, this machine as one environment.
//! - [`runner`]: runs one trial as a process group and feeds its protocols into events.
//! - [`trial_pool`]: the running trials of this machine (runtime, HTTP channel, file watcher);
//!   what both the local service and the knob-agent daemon run trials with.
//! - [`agent`]: the knob-agent (`src/bin/knob-agent.rs`): its daemon, attach bridge and code
//!   receiving, on a remote host.
//! - [`code_archive`]: the trial code directory as a gzip tar for remote hosts.
//! - The trial protocols: [`nni_http`] (NNI v3 HTTP channel), [`nni_file`] (NNI 2.x
//!   `parameter.cfg` and `.nni/metrics`), [`knob_protocol`] (env var, file and stdout lines);
//!   [`trial_python`]: `knob_trial` and the `nni` shim on every trial's PYTHONPATH.
//!
//! - [`agent_protocol`]: the framed messages between the `remote` service and `knob-agent`.
//! - [`remote`]: the `remote` service, SSH hosts as environments, each running a knob-agent.
//! - [`slurm`]: the `slurm` service, Slurm jobs as environments, each running a knob-agent.
//!
//! See `ARCHITECTURE-section.md` beside this crate's manifest for the invariants.

mod accept_pause;
pub mod agent;
pub mod agent_protocol;
pub mod code_archive;
pub mod knob_protocol;
pub mod lease;
pub mod limits;
pub mod local;
pub mod metrics;
pub mod nni_file;
pub mod nni_http;
pub mod process;
pub mod remote;
pub mod runner;
pub mod slurm;
mod starts;
pub mod tail;
pub mod trial_pool;
pub mod trial_python;

pub use local::{LocalArgs, LocalError, LocalService};
pub use metrics::Emit;

use knob_plugin_api::service::{CheckedConfig, ConfigProblem, ServiceContext};

/// The built-in services' names, as exported below.
pub const BUILT_IN: [&str; 3] = ["local", "remote", "slurm"];

/// The config check of a built-in service, called directly (the core reaches it through the
/// plugin ABI; tests and fuzz targets that link this crate call it here). `None` for a name that
/// is not built in.
pub fn check_built_in(
    platform: &str,
    config: &serde_json::Value,
    context: &ServiceContext,
) -> Option<Result<CheckedConfig, Vec<ConfigProblem>>> {
    match platform {
        "local" => Some(local::check_config(config, context)),
        "remote" => Some(remote::config::check_config(config, context)),
        "slurm" => Some(slurm::args::check_config(config, context)),
        _ => None,
    }
}

knob_plugin_api::export_plugin! {
    training_service "local": LocalService = "runs trials as process groups on this machine, over the NNI v3, NNI 2.x and knob trial protocols";
    training_service "remote": remote::RemoteService = "runs trials on machines reached over SSH, through a knob-agent uploaded to each";
    training_service "slurm": slurm::SlurmService = "runs trials in Slurm jobs (one allocation for many trials, or one job per trial), through a knob-agent in each job";
}
