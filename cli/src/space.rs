//! `knob space validate|sample`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use knob_plugin_api::space::{seeded_rng, SearchSpace};

#[derive(Subcommand)]
pub enum SpaceCommand {
    /// Check an NNI search-space file (JSON, or YAML as `searchSpaceFile` takes); print its
    /// parameters, or its problem with file:line:column (exit 1).
    Validate { file: PathBuf },
    /// Draw parameter sets from a search space, one JSON object per line.
    Sample {
        file: PathBuf,
        /// How many to draw.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: u64,
        /// Seed for a reproducible draw (default: random).
        #[arg(long)]
        seed: Option<u64>,
    },
}

pub fn run(command: SpaceCommand) -> anyhow::Result<ExitCode> {
    match command {
        SpaceCommand::Validate { file } => {
            let space = read_space(&file)?;
            let mut out = crate::stdout();
            writeln!(
                out,
                "{}: valid search space with {}",
                file.display(),
                crate::table::counted(space.all_parameters().len(), "parameter")
            )?;
            for parameter in space.all_parameters() {
                writeln!(
                    out,
                    "  {:<24} {}",
                    parameter.path(),
                    parameter.param_type().type_name()
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SpaceCommand::Sample { file, count, seed } => {
            let space = read_space(&file)?;
            let seed = seed.unwrap_or_else(|| {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                nanos.as_nanos() as u64 ^ u64::from(std::process::id())
            });
            let mut rng = seeded_rng(seed);
            let mut out = std::io::BufWriter::new(crate::stdout());
            for _ in 0..count {
                writeln!(out, "{}", space.sample(&mut rng))?;
            }
            out.flush()?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Reads a search-space file as a config's `searchSpaceFile` does (JSON, or YAML), so a space that
/// `knob create` accepts validates here too; a problem is one line with file:line:column.
fn read_space(file: &Path) -> anyhow::Result<SearchSpace> {
    read_space_value(file).map(|(space, _)| space)
}

/// [`read_space`], with the space's JSON as well.
pub fn read_space_value(file: &Path) -> anyhow::Result<(SearchSpace, serde_json::Value)> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let value = knob_core::config::parse_search_space(file, &text).map_err(|errors| {
        let mut lines = errors.iter().map(|error| {
            let place = match error.pos {
                Some(pos) => format!("{}:{}:{}", file.display(), pos.line, pos.column),
                None => file.display().to_string(),
            };
            format!("{place}: {}", error.message)
        });
        // Every error, each on its `error:` line; the last is the one returned.
        let last = lines.next_back().unwrap_or_default();
        for line in lines {
            errln!("error: {line}");
        }
        anyhow::anyhow!("{last}")
    })?;
    let space =
        SearchSpace::from_value(&value).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    Ok((space, value))
}
