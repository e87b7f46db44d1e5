//! The environment variables knob reads secrets from, defined here once: the API token of
//! `knob create`/`resume`/`view` and of the commands that talk to a running experiment, and
//! the variables `knob resume` takes a config's secrets from when the config file the
//! experiment was created from no longer has them.
//!
//! A user who exports one before `knob create` would otherwise hand it to every process knob
//! starts, and a trial is user code that may log its whole environment (an experiment tracker
//! that records `os.environ`). So nothing knob starts for user code inherits them: the trials
//! of every built-in service (`knob_training_services::process::spawn_in_own_group`, which
//! the local service and the agent on a remote host or in a Slurm job go through), the
//! Slurm jobs and steps knob submits (whose environment `sbatch` and `srun` would otherwise
//! copy from knob's), and NNI's dispatcher, which runs a `className` tuner or assessor: all
//! through [`remove_from`]. A training service of another crate that starts processes itself
//! should leave these out as well. The variable a third-party service names for its own secret
//! field (`config::ConfigReader::secret`) is not in this list; that service's own trials are
//! its business.

/// The API token (`--token`'s default, and what `knob update`, `knob trial kill` and `knob top`
/// send to an experiment started with one).
pub const API_TOKEN: &str = "KNOB_API_TOKEN";
/// An SSH password of a remote machine (`machineList[].password`).
pub const SSH_PASSWORD: &str = "KNOB_SSH_PASSWORD";
/// The passphrase of a remote machine's SSH key (`machineList[].sshPassphrase`).
pub const SSH_PASSPHRASE: &str = "KNOB_SSH_PASSPHRASE";
/// The SMTP password of the notifications' mail (`notifications.email.password`).
pub const SMTP_PASSWORD: &str = "KNOB_SMTP_PASSWORD";
/// The secret the notifications' webhook sends (`notifications.webhook.secret`).
pub const WEBHOOK_SECRET: &str = "KNOB_WEBHOOK_SECRET";
/// The notifications' webhook URL, whose path is the key of a Slack (Teams, Discord, …)
/// webhook (`notifications.webhook.url`).
pub const WEBHOOK_URL: &str = "KNOB_WEBHOOK_URL";

/// Every variable above: what no process knob starts for user code inherits.
pub const SECRET_VARIABLES: [&str; 6] = [
    API_TOKEN,
    SSH_PASSWORD,
    SSH_PASSPHRASE,
    SMTP_PASSWORD,
    WEBHOOK_SECRET,
    WEBHOOK_URL,
];

/// Leaves every variable of [`SECRET_VARIABLES`] out of what `command` inherits: for any process
/// that runs user code (a trial, a Slurm job, NNI's dispatcher with a user's own tuner).
pub fn remove_from(command: &mut std::process::Command) {
    for name in SECRET_VARIABLES {
        command.env_remove(name);
    }
}
