//! `knob plugin list|check|try`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use knob_plugin_api::host::{
    load_library, plugin_search_path, PluginLibrary, PluginRegistry, Reply,
};

#[derive(Subcommand)]
pub enum PluginCommand {
    /// List every plugin found on the plugin path (the knob executable's directory,
    /// $KNOB_PLUGIN_PATH, $XDG_DATA_HOME/knob/plugins) and what it provides.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Load one plugin file and print its components, or why it does not load (exit 1).
    Check { file: PathBuf },
    /// Run a tuner of one plugin file outside any experiment: print its suggestions as JSON
    /// lines, each checked against the search space (a bad one ends the run, exit 1). A call
    /// the tuner has not answered in a minute is said on stderr; one not answered in ten
    /// minutes ends the run (exit 1), as an experiment gives up on a tuner that owes parameters.
    Try(TryArgs),
}

#[derive(clap::Args)]
pub struct TryArgs {
    /// The plugin file.
    file: PathBuf,
    /// The search space (JSON or YAML, as a config's searchSpaceFile).
    #[arg(long)]
    space: PathBuf,
    /// How many parameter sets to ask for.
    #[arg(short = 'n', default_value_t = 10)]
    n: u64,
    /// The tuner's classArgs, as JSON.
    #[arg(long, default_value = "{}")]
    class_args: String,
    /// Which tuner of the file (needed when it exports several).
    #[arg(long)]
    tuner: Option<String>,
    /// A file of final results, one number a line, given to the tuner in order as the result of
    /// each suggestion (then its trial_end SUCCEEDED); without it (or --results-expr) no result
    /// is given.
    #[arg(long, conflicts_with = "results_expr")]
    results: Option<PathBuf>,
    /// A Python expression computing each suggestion's final result from its parameters, `x`
    /// (a dict; `math` is imported), evaluated by python3: e.g. `-(x["a"] - 3) ** 2`.
    #[arg(long, value_name = "EXPR", allow_hyphen_values = true)]
    results_expr: Option<String>,
}

/// Where `knob plugin try` takes final results from.
enum Results {
    None,
    /// A file's numbers, in order, while they last.
    Listed(std::vec::IntoIter<f64>),
    /// A Python expression of the parameters.
    Expr(String),
}

/// Evaluates `--results-expr` for one parameter set: the expression is compiled once per call
/// (one short-lived python3 a suggestion: `plugin try` asks for a handful).
const RESULTS_EXPR_PY: &str = r#"
import json, math, sys
try:
    value = float(eval(compile(sys.argv[1], "--results-expr", "eval"), {"math": math, "x": json.loads(sys.argv[2])}))
except Exception as e:
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(1)
print(repr(value))
"#;

impl Results {
    fn next(&mut self, id: u64, parameters: &serde_json::Value) -> anyhow::Result<Option<f64>> {
        match self {
            Results::None => Ok(None),
            Results::Listed(values) => Ok(values.next()),
            Results::Expr(expr) => {
                let output = std::process::Command::new("python3")
                    .args([
                        "-c",
                        RESULTS_EXPR_PY,
                        expr.as_str(),
                        &parameters.to_string(),
                    ])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .map_err(|e| anyhow::anyhow!("--results-expr needs python3 on PATH: {e}"))?;
                let stdout = String::from_utf8_lossy(&output.stdout);
                if !output.status.success() {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    anyhow::bail!(
                        "--results-expr {expr:?} failed for parameter id {id} ({parameters}): {}",
                        stderr.trim().lines().last().unwrap_or("python3 failed")
                    );
                }
                stdout.trim().parse::<f64>().map(Some).map_err(|_| {
                    anyhow::anyhow!(
                        "--results-expr {expr:?} gave {:?} for parameter id {id}, not a number",
                        stdout.trim()
                    )
                })
            }
        }
    }
}

pub fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::List { json } => list(json),
        PluginCommand::Check { file } => check(file),
        PluginCommand::Try(args) => try_tuner(args),
    }
}

/// `knob plugin try`: a plugin author's loop without an experiment. Suggestions are printed as
/// `{"parameter_id": N, "parameters": {...}}` lines (`"deferred": true` for an id answered
/// later, `"no_more": true` when the tuner is done); each is checked as the manager checks it
/// (`knob_core::manager::tuner_output_refusal`, the same function).
fn try_tuner(args: TryArgs) -> anyhow::Result<ExitCode> {
    use knob_plugin_api::{ComponentKind, Generated};
    let library = load_library(&args.file)?;
    let registry = PluginRegistry::load_from(std::slice::from_ref(&args.file));
    let tuners: Vec<&str> = library
        .components
        .iter()
        .filter(|c| c.kind == ComponentKind::Tuner)
        .map(|c| c.name.as_str())
        .collect();
    let name = match (&args.tuner, tuners.as_slice()) {
        (Some(name), _) => name.clone(),
        (None, [only]) => only.to_string(),
        (None, []) => anyhow::bail!("{}: exports no tuner", args.file.display()),
        (None, several) => anyhow::bail!(
            "{} exports several tuners ({}); pick one with --tuner",
            args.file.display(),
            several.join(", ")
        ),
    };
    let class_args: serde_json::Value = serde_json::from_str(&args.class_args)
        .map_err(|e| anyhow::anyhow!("--class-args is not JSON: {e}"))?;
    // As a config's `classArgs` must be a mapping: a list reached some tuners as fields in
    // order, and came back as serde's "invalid length 4, expected struct AnnealArgs".
    if !class_args.is_object() {
        anyhow::bail!(
            "--class-args must be a JSON object of the tuner's arguments, such as '{{\"optimize_mode\": \"minimize\"}}', got {}",
            args.class_args.trim()
        );
    }
    let (space, space_json) = crate::space::read_space_value(&args.space)?;
    let mut results = match (&args.results, &args.results_expr) {
        (None, None) => Results::None,
        (None, Some(expr)) => Results::Expr(expr.clone()),
        (Some(file), _) => Results::Listed(read_results(file)?.into_iter()),
    };
    // On a thread of its own, so that a call that never returns is noticed (`answered`).
    let tuner = registry.tuner(&name, &class_args)?;
    let waiter = Waiter {
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?,
        label: tuner.label().to_owned(),
    };
    waiter.answer(tuner.update_search_space(space_json), "update_search_space")?;
    let mut out = crate::stdout();
    let label = tuner.label().to_owned();
    let mut pending = std::collections::VecDeque::new();
    let emit =
        |out: &mut dyn Write, id: u64, parameters: &serde_json::Value| -> anyhow::Result<()> {
            // The experiment's own check: the space, plus what NNI's tuners add (TRIAL_BUDGET,
            // PBT's checkpoint folders) and BatchTuner's listed sets.
            if let Some(refusal) =
                knob_core::manager::tuner_output_refusal(&label, id, &space, parameters)
            {
                anyhow::bail!("{refusal}");
            }
            writeln!(
                out,
                "{}",
                serde_json::json!({"parameter_id": id, "parameters": parameters})
            )?;
            Ok(())
        };
    for id in 0..args.n {
        match waiter.answer(tuner.generate_parameters(id), "generate_parameters")? {
            Generated::Parameters(parameters)
            | Generated::Labeled { parameters, .. }
            | Generated::Member { parameters, .. } => {
                emit(&mut out, id, &parameters)?;
                pending.push_back((id, parameters));
            }
            Generated::Deferred => writeln!(
                out,
                "{}",
                serde_json::json!({"parameter_id": id, "deferred": true})
            )?,
            Generated::NoMore => {
                writeln!(
                    out,
                    "{}",
                    serde_json::json!({"parameter_id": id, "no_more": true})
                )?;
                break;
            }
        }
        // One result per suggestion, in order, while there are results.
        while let Some((done, parameters)) = pending.pop_front() {
            let Some(value) = results.next(done, &parameters)? else {
                pending.push_front((done, parameters));
                break;
            };
            let mut suggestions = waiter.answer(
                tuner.receive_trial_result(done, parameters.clone(), value),
                "receive_trial_result",
            )?;
            suggestions.extend(waiter.answer(
                tuner.trial_end(done, knob_plugin_api::status::SUCCEEDED.into()),
                "trial_end",
            )?);
            for suggestion in suggestions {
                emit(&mut out, suggestion.parameter_id, &suggestion.parameters)?;
                pending.push_back((suggestion.parameter_id, suggestion.parameters));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// How long `knob plugin try` waits for a tuner's answer: a notice after `notice`, the end
/// after `give_up`.
#[derive(Clone, Copy)]
struct Patience {
    notice: std::time::Duration,
    give_up: std::time::Duration,
}

impl Patience {
    /// An experiment's, for a tuner that owes parameters while nothing runs (in `plugin try`
    /// nothing else runs either): the same constants, so that the two cannot drift.
    const EXPERIMENTS: Patience = Patience {
        notice: knob_core::manager::TUNER_QUIET_NOTICE,
        give_up: knob_core::manager::TUNER_PATIENCE,
    };
}

/// Waits for the answers of `plugin try`'s tuner, with an experiment's [`Patience`], its notice
/// a `warning:` on stderr.
struct Waiter {
    runtime: tokio::runtime::Runtime,
    label: String,
}

impl Waiter {
    fn answer<R>(&self, reply: Reply<R>, method: &str) -> anyhow::Result<R> {
        answered(
            &self.runtime,
            reply,
            &self.label,
            method,
            Patience::EXPERIMENTS,
            |notice| errln!("warning: {notice}"),
        )
    }
}

/// The answer of the tuner's call `method`, waited for as [`Patience`] says: `notice` gets what
/// it waits for once the wait passes `patience.notice`, and the run ends with an error once it
/// passes `patience.give_up`. It waited silently for ever on a call that never returned.
fn answered<R>(
    runtime: &tokio::runtime::Runtime,
    mut reply: Reply<R>,
    label: &str,
    method: &str,
    patience: Patience,
    notice: impl FnOnce(String),
) -> anyhow::Result<R> {
    runtime.block_on(async {
        if let Ok(answer) = tokio::time::timeout(patience.notice, reply.answer()).await {
            return Ok(answer?);
        }
        notice(format!(
            "{label} has not answered {method} in {} s (a tuner starting up or fitting its model may take this long); knob plugin try ends if it has not in {} s",
            patience.notice.as_secs(),
            patience.give_up.as_secs()
        ));
        let rest = patience.give_up.saturating_sub(patience.notice);
        match tokio::time::timeout(rest, reply.answer()).await {
            Ok(answer) => Ok(answer?),
            Err(_) => anyhow::bail!(
                "{label} did not answer {method} in {} s, so knob plugin try ends (an experiment gives up on a tuner after as long); a call that never returns is a bug of the tuner",
                patience.give_up.as_secs()
            ),
        }
    })
}

/// A `--results` file: one number a line (blank lines skipped).
fn read_results(file: &std::path::Path) -> anyhow::Result<Vec<f64>> {
    std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            line.trim().parse::<f64>().map_err(|_| {
                anyhow::anyhow!(
                    "{}:{}: expected a number, got {:?}",
                    file.display(),
                    index + 1,
                    line.trim()
                )
            })
        })
        .collect::<anyhow::Result<_>>()
}

fn list(json: bool) -> anyhow::Result<ExitCode> {
    let places = plugin_search_path(&[]);
    let registry = PluginRegistry::load_from(&places);
    let mut out = crate::stdout();
    if json {
        let libraries: Vec<_> = registry
            .libraries()
            .iter()
            .map(|l| serde_json::json!({"file": l.path, "api_version": l.api_version, "abi_version": l.abi_version, "components": l.components}))
            .collect();
        let problems: Vec<String> = registry
            .problems()
            .iter()
            .map(ToString::to_string)
            .collect();
        let searched: Vec<_> = places.iter().map(|p| p.display().to_string()).collect();
        let doc =
            serde_json::json!({"searched": searched, "libraries": libraries, "problems": problems});
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    if registry.libraries().is_empty() {
        let searched: Vec<_> = places.iter().map(|p| p.display().to_string()).collect();
        writeln!(out, "no plugins found; searched: {}", searched.join(", "))?;
    }
    for library in registry.libraries() {
        write_library(&mut out, library)?;
    }
    for problem in registry.problems() {
        eprintln!("warning: {problem}");
    }
    Ok(ExitCode::SUCCESS)
}

fn check(file: PathBuf) -> anyhow::Result<ExitCode> {
    match load_library(&file) {
        Ok(library) => {
            write_library(&mut crate::stdout(), &library)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn write_library(out: &mut impl Write, library: &PluginLibrary) -> std::io::Result<()> {
    writeln!(
        out,
        "{} (knob-plugin-api {}, ABI {})",
        library.path.display(),
        library.api_version,
        library.abi_version
    )?;
    let name_width = library
        .components
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(0);
    for c in &library.components {
        let kind = c.kind.to_string();
        writeln!(
            out,
            "  {kind:<16} {:<name_width$}  {:<8} {}",
            c.name, c.version, c.description
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use knob_plugin_api::host::in_process;
    use knob_plugin_api::space::SearchSpace;
    use knob_plugin_api::{Generated, PluginError, Tuner};
    use serde_json::Value;

    use super::*;

    /// Answers `generate_parameters` once told to on its channel (or never, once it is gone).
    struct Held(mpsc::Receiver<()>);

    impl Tuner for Held {
        fn new(_class_args: &Value) -> Result<Self, PluginError> {
            unreachable!("built directly")
        }
        fn update_search_space(&mut self, _space: &SearchSpace) -> Result<(), PluginError> {
            Ok(())
        }
        fn generate_parameters(&mut self, _parameter_id: u64) -> Result<Generated, PluginError> {
            let _ = self.0.recv();
            Ok(Generated::NoMore)
        }
        fn receive_trial_result(
            &mut self,
            _parameter_id: u64,
            _parameters: &Value,
            _value: f64,
        ) -> Result<(), PluginError> {
            Ok(())
        }
    }

    /// A call the tuner has not answered is said once its notice time passes, and ends the run
    /// at its patience, as an experiment's wait for such a tuner does; one answered after the
    /// notice is taken as it comes. `plugin try` waited silently for ever.
    #[test]
    fn a_tuner_call_that_is_not_answered_is_said_then_given_up() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let patience = Patience {
            notice: Duration::from_millis(50),
            give_up: Duration::from_millis(300),
        };
        let (release, hold) = mpsc::channel();
        let tuner = in_process::tuner_on_thread("Held", Held(hold));
        let mut notices = Vec::new();
        let error = answered(
            &runtime,
            tuner.generate_parameters(0),
            tuner.label(),
            "generate_parameters",
            patience,
            |notice| notices.push(notice),
        )
        .unwrap_err()
        .to_string();
        expect_test::expect![[r#"
            [
                "tuner Held has not answered generate_parameters in 0 s (a tuner starting up or fitting its model may take this long); knob plugin try ends if it has not in 0 s",
            ]
        "#]]
        .assert_debug_eq(&notices);
        assert!(
            error.starts_with(
                "tuner Held did not answer generate_parameters in 0 s, so knob plugin try ends"
            ),
            "{error}"
        );

        // Answered after the notice: the answer, and the notice once.
        let reply = tuner.generate_parameters(1);
        release.send(()).unwrap();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            release.send(()).unwrap();
        });
        let mut notices = 0;
        let answer = answered(
            &runtime,
            reply,
            tuner.label(),
            "generate_parameters",
            patience,
            |_| notices += 1,
        );
        late.join().unwrap();
        assert_eq!(answer.unwrap(), Generated::NoMore);
        assert_eq!(notices, 1);
    }
}
