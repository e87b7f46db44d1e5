//! NNI's Python algorithms under knob. NNI runs every Python tuner, assessor and advisor the
//! same way: its manager starts `python -m nni --exp_params <base64 config>` (the dispatcher)
//! and talks to it over the tuner command channel, a WebSocket the manager serves. This plugin
//! is that manager side, as a knob tuner (`NniDispatcher`) and assessor
//! (`NniDispatcherAssessor`): knob's core picks it for a `className`, or for an NNI name knob has
//! no native version of, and hands it the algorithm as written (see `args`).
//!
//! The dispatcher starts on the first call that needs it (never while a config is only
//! checked); its Python is checked at construction (`import nni`, and the version, which sets
//! the framing: nni 3.0's JSON messages or 2.8-2.10's `XX<payload>`).

mod args;
mod assessor;
/// The tests' prerequisites (a Python with nni), as every crate's tests name them.
#[cfg(test)]
#[path = "../../training-services/tests/it/prerequisite.rs"]
mod prerequisite;
mod process;
mod tuner;
mod websocket;

pub use args::DispatcherArgs;
pub use assessor::DispatcherAssessor;
pub use process::{framing_of, parse_payload, Framing};
pub use tuner::DispatcherTuner;

knob_plugin_api::export_plugin! {
    tuner "NniDispatcher": DispatcherTuner = "NNI's own Python tuners and advisors (built-in names knob lacks, or className), run by NNI's dispatcher (python -m nni) over its tuner command channel";
    assessor "NniDispatcherAssessor": DispatcherAssessor = "NNI's own Python assessors (className, or useNniImplementation), run by NNI's dispatcher over its tuner command channel";
}
