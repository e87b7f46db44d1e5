//! `knob notify test --config F`: one test message to every sink of a config's `notifications`,
//! one line per sink saying whether it went out.

use std::path::PathBuf;
use std::process::ExitCode;

use knob_core::config::ServicePlugins;
use knob_core::experiment;
use knob_core::notify;

#[derive(clap::Subcommand)]
pub enum NotifyCommand {
    /// Send a test message to every webhook and mail recipient of a config's `notifications`;
    /// one line per sink, exit 1 if any failed.
    Test {
        /// The experiment config (NNI v2 YAML or JSON) with `notifications:`.
        #[arg(long, short = 'c')]
        config: PathBuf,
    },
}

pub fn run(command: NotifyCommand) -> anyhow::Result<ExitCode> {
    let NotifyCommand::Test { config: path } = command;
    // The whole config is checked, as `knob create` would: a test of a config that cannot run
    // would prove little.
    let services = ServicePlugins::new();
    let (config, warnings) = experiment::load_config(&path, &services)?;
    for warning in warnings {
        errln!("warning: {warning}");
    }
    let Some(notifications) = &config.notifications else {
        anyhow::bail!(
            "{}: no notifications to test; add notifications: {{webhook: {{url: ...}}}} or {{email: {{host: ..., to: [...]}}}}",
            path.display()
        );
    };
    let mut failed = 0;
    for (sink, result) in notify::send_test(notifications, &path.display().to_string()) {
        match result {
            Ok(()) => outln!("{sink}: sent"),
            Err(error) => {
                failed += 1;
                outln!("{sink}: failed: {error}");
            }
        }
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
