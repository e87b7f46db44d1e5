//! knob-agent: runs knob's trials on a remote host, reached over SSH only. See
//! `knob_training_services::agent`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use knob_training_services::agent::attach::{attach, AttachOptions};
use knob_training_services::agent::daemon::{serve, ServeOptions};
use knob_training_services::agent::{
    copy_code, receive_code, version_line, AgentError, DEFAULT_ORPHAN_TIMEOUT,
};
use knob_training_services::agent_protocol::HEARTBEAT_TIMEOUT;
use knob_training_services::code_archive::Unpacked;

#[derive(Parser)]
#[command(
    name = "knob-agent",
    about = "Runs knob trials on this host for a knob manager connected over SSH",
    disable_version_flag = true
)]
struct Cli {
    /// Print "knob-agent <version> protocol <n> <arch>" and exit.
    #[arg(long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The daemon of one experiment's environment: runs trials, listens on DIR/agent.sock.
    Serve {
        #[arg(long)]
        dir: PathBuf,
        /// Started by `attach`: exit if a connection closes before any hello came.
        #[arg(long, hide = true)]
        exit_without_hello: bool,
        #[command(flatten)]
        timing: Timing,
    },
    /// Bridges stdin/stdout to the daemon of DIR, starting it if none runs.
    Attach {
        #[arg(long)]
        dir: PathBuf,
        /// Fail instead of starting a daemon when none listens (a Slurm job's daemon is the
        /// job script's).
        #[arg(long)]
        no_start: bool,
        #[command(flatten)]
        timing: Timing,
    },
    /// Unpacks a trial code archive from stdin into DEST (atomically).
    ReceiveCode {
        #[arg(long)]
        dest: PathBuf,
    },
    /// Copies the complete code directory FROM into TO (atomically), unless TO is complete:
    /// an experiment's trials run in their own copy, never in the shared cache.
    CopyCode {
        #[arg(long)]
        from: PathBuf,
        #[arg(long)]
        to: PathBuf,
    },
}

#[derive(clap::Args)]
struct Timing {
    /// With no manager connected for this long, kill every trial and exit.
    #[arg(long, default_value_t = DEFAULT_ORPHAN_TIMEOUT.as_secs_f64())]
    orphan_timeout_secs: f64,
    /// Drop a connection that sends nothing for this long (trials keep running).
    #[arg(long, default_value_t = HEARTBEAT_TIMEOUT.as_secs_f64(), hide = true)]
    heartbeat_timeout_secs: f64,
    /// SIGTERM to SIGKILL for a killed trial.
    #[arg(long, default_value_t = 5.0)]
    grace_period_secs: f64,
}

impl Timing {
    fn durations(&self) -> anyhow::Result<[Duration; 3]> {
        let secs = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| *d <= Duration::from_secs(7 * 24 * 3600))
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "--{name} must be a number of seconds from 0 to 604800, got {value}"
                    )
                })
        };
        Ok([
            secs("orphan-timeout-secs", self.orphan_timeout_secs)?,
            secs("heartbeat-timeout-secs", self.heartbeat_timeout_secs)?,
            secs("grace-period-secs", self.grace_period_secs)?,
        ])
    }

    fn as_args(&self) -> Vec<String> {
        vec![
            format!("--orphan-timeout-secs={}", self.orphan_timeout_secs),
            format!("--heartbeat-timeout-secs={}", self.heartbeat_timeout_secs),
            format!("--grace-period-secs={}", self.grace_period_secs),
        ]
    }
}

fn main() -> ExitCode {
    // As `knob` does (see its `fit_malloc_to_an_address_space_limit`): under a limit on the
    // address space (a cluster's `ulimit -v`), two malloc arenas, not 64 MiB reserved a thread.
    let (limit, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_AS)
        .unwrap_or((nix::sys::resource::RLIM_INFINITY, 0));
    if limit != nix::sys::resource::RLIM_INFINITY {
        // SAFETY: a setting of glibc's allocator, before any other thread starts.
        #[cfg(target_env = "gnu")]
        unsafe {
            nix::libc::mallopt(nix::libc::M_ARENA_MAX, 2);
        }
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if cli.version {
        println!("{}", version_line());
        return Ok(ExitCode::SUCCESS);
    }
    match cli.command {
        None => anyhow::bail!(
            "knob-agent: name a command (serve, attach, receive-code, copy-code) or --version; see --help"
        ),
        Some(Command::Serve {
            dir,
            exit_without_hello,
            timing,
        }) => {
            let [orphan_timeout, heartbeat_timeout, grace_period] = timing.durations()?;
            let mut options = ServeOptions::new(dir);
            options.orphan_timeout = orphan_timeout;
            options.heartbeat_timeout = heartbeat_timeout;
            options.grace_period = grace_period;
            options.exit_without_hello = exit_without_hello;
            serve(options)?;
        }
        Some(Command::Attach {
            dir,
            no_start,
            timing,
        }) => {
            timing.durations()?;
            attach(&AttachOptions {
                dir,
                serve_args: timing.as_args(),
                start: !no_start,
            })?;
            // The stdin thread may still be blocked on a read; it must not keep us alive.
            std::process::exit(0);
        }
        Some(Command::ReceiveCode { dest }) => {
            match receive_code(std::io::stdin().lock(), &dest)? {
                Unpacked::Written { files, bytes } => {
                    println!(
                        "unpacked {files} files ({bytes} bytes) into {}",
                        dest.display()
                    )
                }
                Unpacked::AlreadyThere => println!("{} is already complete", dest.display()),
            }
        }
        Some(Command::CopyCode { from, to }) => {
            match copy_code(&from, &to).map_err(AgentError::CopyCode)? {
                Unpacked::Written { files, bytes } => {
                    println!("copied {files} files ({bytes} bytes) into {}", to.display())
                }
                Unpacked::AlreadyThere => println!("{} is already complete", to.display()),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
