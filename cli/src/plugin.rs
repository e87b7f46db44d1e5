//! `knob plugin list|check|try`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use knob_plugin_api::host::{load_library, plugin_search_path, PluginLibrary, PluginRegistry};

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
    /// lines, each checked against the search space (a bad one ends the run, exit 1).
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
    let mut tuner = registry.tuner_object(&name, &class_args)?;
    tuner.update_search_space(&space_json)?;
    let mut out = std::io::stdout().lock();
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
        match tuner.generate_parameters(id)? {
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
            let mut suggestions = tuner.receive_trial_result(done, &parameters, value)?;
            suggestions.extend(tuner.trial_end(done, knob_plugin_api::status::SUCCEEDED)?);
            for suggestion in suggestions {
                emit(&mut out, suggestion.parameter_id, &suggestion.parameters)?;
                pending.push_back((suggestion.parameter_id, suggestion.parameters));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
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
    let mut out = std::io::stdout().lock();
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
            write_library(&mut std::io::stdout().lock(), &library)?;
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
