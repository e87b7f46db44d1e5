//! Runs the real `knob` binary. Tests that need the built-in plugin libraries expect
//! `cargo build --workspace` to have run (the README's test command does it first): the
//! libraries must sit next to the binary, where a user's install puts them.

mod api;
mod api_security;
mod assessor;
mod browser;
mod create;
mod hyperband;
mod live_run;
mod machine_limits;
mod multi_objective;
mod nni;
mod nni_dispatcher;
mod nni_names;
mod nni_v1;
mod nnictl;
mod notify;
mod pbt;
mod plugin;
mod plugin_checks;
#[path = "../../../training-services/tests/it/prerequisite.rs"]
mod prerequisite;
mod remote;
mod resume;
mod secrets;
mod shared_machine;
mod slurm;
mod space;
mod third_party_service;
mod tuner_output;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn knob() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_knob"));
    // Only the directory of the binary is searched unless a test says otherwise.
    command
        .env_remove("KNOB_PLUGIN_PATH")
        .env("XDG_DATA_HOME", "/nonexistent-knob-test");
    command
}

/// Runs `command` to its end: its exit code (minus the signal's number when a signal ended it,
/// so that a failing assertion says which: -9, -11), stdout and stderr.
pub fn run(command: &mut Command) -> (i32, String, String) {
    use std::os::unix::process::ExitStatusExt;
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().expect("cannot run knob");
    (
        status
            .code()
            .unwrap_or_else(|| -status.signal().unwrap_or(1)),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A `knob create --detach` or `knob resume --detach` started in the background, by the pid its
/// output names; killed when the test ends, however it ends.
pub struct Background(pub u32);

impl Background {
    pub fn from_output(stdout: &str) -> Background {
        let pid = stdout
            .split("(pid ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no pid in {stdout:?}"));
        Background(pid)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.0.to_string()])
            .status();
    }
}

/// The directory holding the `knob` binary and, after `cargo build --workspace`, the
/// built-in plugin libraries.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_knob"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A CSV export's header and rows, read as CSV (a cell such as `final_raw` holds commas and
/// quotes).
pub fn csv_table(csv: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let header = reader.headers().unwrap().iter().map(String::from).collect();
    let rows = reader
        .records()
        .map(|row| row.unwrap().iter().map(String::from).collect())
        .collect();
    (header, rows)
}

/// Replaces machine-specific paths so outputs can be compared as text.
pub fn normalize(text: &str) -> String {
    text.replace(&bin_dir().display().to_string(), "$BIN")
        .replace(&repo_root().display().to_string(), "$REPO")
}
