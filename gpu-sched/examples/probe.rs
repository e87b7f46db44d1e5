//! Prints what knob detects on this machine as JSON: GPUs through NVML (or the simulated
//! inventory in `KNOB_SIMULATE_GPUS`), CPU and memory through sysinfo. Without a driver the
//! environment has no GPUs and `gpu_source` says why.
//!
//! Run: `cargo run -p knob-gpu-sched --example probe`
//!      `KNOB_SIMULATE_GPUS=4x80GiB cargo run -p knob-gpu-sched --example probe`

use std::io::Write;
use std::process::ExitCode;

use knob_gpu_sched::probe::LocalProbe;
use knob_gpu_sched::Inventory;

fn main() -> ExitCode {
    let mut probe = match LocalProbe::new("local") {
        Ok(probe) => probe,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Nothing of knob's runs here, so every GPU process is foreign.
    let inventory = Inventory {
        environments: probe.sample_blocking(&|_pid| false),
    };
    let json = match serde_json::to_string_pretty(&inventory) {
        Ok(json) => json,
        Err(error) => {
            eprintln!("error: cannot write the inventory as JSON: {error}");
            return ExitCode::FAILURE;
        }
    };
    match writeln!(std::io::stdout().lock(), "{json}") {
        // A closed pipe (`| head`) is the reader's choice, not a failure.
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: cannot print the inventory: {error}");
            ExitCode::FAILURE
        }
    }
}
