//! `knob`: the command line. Each subcommand lives in its own module; this file only parses
//! arguments and turns errors into one line on stderr and a non-zero exit.

/// `eprintln!` for what the commands that run or serve an experiment (`create`, `resume`,
/// `view`) say: a line stderr cannot take any more (its reader went away: `knob create … 2>&1 |
/// head`, a closed terminal) is dropped. `eprintln!` would panic there, and the default
/// SIGPIPE, which the other commands keep, would kill the run (found so: the experiment was
/// left "crashed" with no trial run).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `println!` as [`errln!`] is `eprintln!`: what stdout cannot take is dropped.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `println!` for a command's answer (a list, a table), as a result: a stdout that cannot take
/// it (a full disk: `knob experiment list > /dev/full`) fails the command with one `error:`
/// line, where `println!` panicked. A reader gone away (`| head`) ends the process by SIGPIPE
/// first, as for other Unix tools.
macro_rules! stdoutln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout(), $($arg)*).map_err(crate::stdout_error)
    }};
}

/// The error of a write to stdout that failed, naming it.
fn stdout_error(error: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("cannot write to standard output: {error}")
}

/// Standard output for a command that writes its answer piece by piece (`knob top`, `knob man`,
/// `knob space sample`, `knob plugin list`): a write that fails says it was standard output,
/// as [`stdoutln!`] does; these said only "error: No space left on device (os error 28)".
pub(crate) struct Stdout(std::io::StdoutLock<'static>);

pub(crate) fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf).map_err(named_stdout_error)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush().map_err(named_stdout_error)
    }
}

fn named_stdout_error(error: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        error.kind(),
        format!("cannot write to standard output: {error}"),
    )
}

mod client;
mod create;
mod experiment;
mod gpu;
mod man;
mod manage;
mod notify;
mod plugin;
mod resume;
mod serve;
mod space;
mod table;
mod top;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Create an experiment from a config and run it (in the foreground unless --detach).
    Create(create::CreateArgs),
    /// Continue a stopped, crashed or finished experiment where it left off.
    Resume(resume::ResumeArgs),
    /// Stop a running experiment (its running trials are killed); it can be resumed.
    Stop(resume::StopArgs),
    /// List, inspect and export experiments.
    #[command(subcommand)]
    Experiment(manage::ExperimentCommand),
    /// The trials of an experiment.
    #[command(subcommand)]
    Trial(manage::TrialCommand),
    /// Change a running experiment: trialConcurrency, maxTrialNumber, maxExperimentDuration, search space.
    #[command(subcommand)]
    Update(manage::UpdateCommand),
    /// Serve the dashboard and a read-only API of an experiment from its store.
    View(manage::ViewArgs),
    /// A live terminal view of an experiment (q to quit).
    Top(top::TopArgs),
    /// Check experiment configs.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Show the GPUs, CPUs and memory knob sees on this machine (NVML, or KNOB_SIMULATE_GPUS).
    Gpu {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Try the notifications of a config (`notifications:`).
    #[command(subcommand)]
    Notify(notify::NotifyCommand),
    /// Inspect tuner, assessor and training-service plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Validate and sample NNI search-space files.
    #[command(subcommand)]
    Space(space::SpaceCommand),
    /// Print a shell completion script: `knob completions bash > ~/.local/share/bash-completion/completions/knob`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print knob's man page (roff): `knob man > ~/.local/share/man/man1/knob.1`.
    Man,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a config: print its canonical form, or every error found (exit 1).
    Check {
        file: std::path::PathBuf,
        /// Print the config as an NNI v2 document instead (an NNI v1 config converted, as NNI
        /// 2.x and 3.0 do; passwords as ***).
        #[arg(long)]
        v2: bool,
    },
}

/// glibc gives each thread that allocates an arena of its own, up to 8 a core, each reserving
/// 64 MiB of address space: under a limit on it (`ulimit -v`, a batch system's `h_vmem`) a run
/// of 64 trials at once aborted with "memory allocation of 1 bytes failed" while its real
/// memory was 70 MB, and left its experiment crashed. With such a limit, two arenas.
fn fit_malloc_to_an_address_space_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` fills `limit`; `mallopt` changes a setting of glibc's allocator,
    // called before any other thread starts.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_AS, &mut limit) == 0
            && limit.rlim_cur != libc::RLIM_INFINITY
        {
            #[cfg(target_env = "gnu")]
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

fn main() -> ExitCode {
    fit_malloc_to_an_address_space_limit();
    let cli = Cli::parse();
    // Like other Unix tools, die quietly when the reader of our output goes away (`| head`);
    // not while running or serving an experiment, which goes on, its lines dropped (`errln!`).
    if !matches!(
        cli.command,
        Command::Create(_) | Command::Resume(_) | Command::View(_)
    ) {
        // SAFETY: restoring the default disposition of a signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    install_plugin_logger();
    let result = match cli.command {
        Command::Create(args) => create::run(args),
        Command::Resume(args) => resume::resume(args),
        Command::Stop(args) => resume::stop_command(args),
        Command::Experiment(command) => manage::run_experiment(command),
        Command::Trial(command) => manage::run_trial(command),
        Command::Update(command) => manage::update(command),
        Command::View(args) => manage::view(args),
        Command::Top(args) => top::top(args),
        Command::Config(ConfigCommand::Check { file, v2 }) => create::check_config(&file, v2),
        Command::Gpu { json } => gpu::run(json),
        Command::Notify(command) => notify::run(command),
        Command::Plugin(command) => plugin::run(command),
        Command::Space(command) => space::run(command),
        Command::Completions { shell } => {
            // `generate` writes with `write_all(...).expect(...)`: into a buffer, which cannot
            // fail, then to stdout, which can.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "knob", &mut script);
            std::io::Write::write_all(&mut std::io::stdout(), &script)
                .and_then(|()| std::io::Write::flush(&mut std::io::stdout()))
                .map(|()| ExitCode::SUCCESS)
                .map_err(stdout_error)
        }
        Command::Man => man::render(Cli::command(), &mut stdout())
            .map(|()| ExitCode::SUCCESS)
            .map_err(anyhow::Error::from),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            errln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Plugins log through the host: warnings and errors always reach stderr, the rest only with
/// `KNOB_LOG=info` or `KNOB_LOG=debug`.
fn install_plugin_logger() {
    use knob_plugin_api::host::LogLevel;
    let shown = match std::env::var("KNOB_LOG")
        .unwrap_or_default()
        .to_ascii_lowercase()
        .as_str()
    {
        "trace" => LogLevel::Trace,
        "debug" => LogLevel::Debug,
        "info" => LogLevel::Info,
        _ => LogLevel::Warn,
    };
    knob_plugin_api::host::set_plugin_logger(Box::new(move |level, target, message| {
        if level <= shown {
            errln!(
                "{}: [{target}] {message}",
                format!("{level:?}").to_ascii_lowercase()
            );
        }
    }));
}
