//! `knob plugin list|check`.

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
}

pub fn run(command: PluginCommand) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::List { json } => list(json),
        PluginCommand::Check { file } => check(file),
    }
}

fn list(json: bool) -> anyhow::Result<ExitCode> {
    let places = plugin_search_path(&[]);
    let registry = PluginRegistry::load_from(&places);
    let mut out = std::io::stdout().lock();
    if json {
        let libraries: Vec<_> = registry
            .libraries()
            .iter()
            .map(|l| serde_json::json!({"file": l.path, "api_version": l.api_version, "components": l.components}))
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
        "{} (knob-plugin-api {})",
        library.path.display(),
        library.api_version
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
