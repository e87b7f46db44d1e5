//! `knob`: the command line. Each subcommand lives in its own module; this file only parses
//! arguments and turns errors into one line on stderr and a non-zero exit.

mod plugin;
mod space;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "knob",
    version,
    about = "Hyperparameter tuning experiments: runs NNI experiments unchanged"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Inspect tuner, assessor and training-service plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Validate and sample NNI search-space files.
    #[command(subcommand)]
    Space(space::SpaceCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plugin(command) => plugin::run(command),
        Command::Space(command) => space::run(command),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
