//! NNI's value formats: durations, memory sizes, GPU index lists, paths.
//!
//! Each parser returns the canonical value or a message saying what is allowed.

use std::path::{Component, Path, PathBuf};

use super::yaml::{Node, Value};

/// NNI's `parse_time`: a number of seconds, or a number followed by `s`, `m`, `h` or `d`
/// (`"30m"`, `"0.5h"`), rounded up to whole seconds. Must be positive.
pub(crate) fn duration_seconds(node: &Node) -> Result<u64, String> {
    const ALLOWED: &str =
        r#"expected a duration like "30s", "30m", "2h", "1d" or a number of seconds"#;
    const UNITS: [(&str, f64); 4] = [("d", 86_400.0), ("h", 3_600.0), ("m", 60.0), ("s", 1.0)];
    let seconds = match &node.value {
        Value::Int(i) => *i as f64,
        Value::UInt(u) => *u as f64,
        Value::Float(f) => *f,
        Value::Str(text) => {
            let lower = text.trim().to_ascii_lowercase();
            let parsed = UNITS.iter().find_map(|(unit, factor)| {
                let number = lower.strip_suffix(unit)?.trim();
                number.parse::<f64>().ok().map(|value| value * factor)
            });
            parsed.ok_or_else(|| format!("{ALLOWED}, got {}", node.describe()))?
        }
        _ => return Err(format!("{ALLOWED}, got {}", node.describe())),
    };
    // A cap keeps `Instant + duration` from overflowing wherever the limit is enforced.
    const HUNDRED_YEARS: f64 = 100.0 * 365.0 * 86_400.0;
    if seconds.ceil() > HUNDRED_YEARS {
        return Err(format!(
            "must be at most 100 years, got {}",
            node.describe()
        ));
    }
    positive_whole(seconds.ceil(), node)
}

/// [`duration_seconds`] for text from outside a config file (a command-line flag).
pub fn duration_text_seconds(text: &str) -> Result<u64, String> {
    let node = Node {
        value: Value::Str(text.to_string()),
        pos: None,
    };
    let as_number = text.trim().parse::<f64>().ok().map(|seconds| Node {
        value: Value::Float(seconds),
        pos: None,
    });
    duration_seconds(as_number.as_ref().unwrap_or(&node))
}

/// The shared-machine limits given in percent (knob extension), each a top-level shortcut and a
/// field of every environment.
pub(crate) const PERCENT_LIMITS: [&str; 3] = [
    "maxCpuUtilization",
    "maxMemoryUtilization",
    "maxGpuMemoryUtilization",
];
/// The shared-machine limits given as memory sizes (canonical: MiB).
pub(crate) const SIZE_LIMITS: [&str; 2] = ["memoryReserve", "gpuMemoryReserve"];

/// A percentage above 0 and at most 100 (`90`, `"90%"`), as the training services read it.
pub(crate) fn percent(node: &Node) -> Result<f64, String> {
    let value = node.to_json().map_err(|(_, message)| message)?;
    knob_plugin_api::config::percent(&value)
}

/// NNI's `parse_memory_size`, returning MiB (`knob_plugin_api::config::size_mib`, which the
/// training services read their own sizes with, so both accept the same spellings).
pub(crate) fn size_mib(node: &Node) -> Result<u64, String> {
    let value = node.to_json().map_err(|(_, message)| message)?;
    knob_plugin_api::config::size_mib(&value)
}

fn positive_whole(value: f64, node: &Node) -> Result<u64, String> {
    // `u64::MAX as f64` rounds up, hence the strict bound.
    if value.is_nan() || value < 1.0 {
        Err(format!("must be positive, got {}", node.describe()))
    } else if value >= u64::MAX as f64 {
        Err(format!("too large, got {}", node.describe()))
    } else {
        Ok(value as u64)
    }
}

/// NNI's `canonical_gpu_indices` + `validate_gpu_indices`: a list of ints, an int, or a
/// comma-separated string (`"0,1"`); no negatives, no duplicates.
pub(crate) fn gpu_indices(node: &Node) -> Result<Vec<u32>, String> {
    const ALLOWED: &str =
        r#"expected GPU indices as a list ([0, 1]), a string ("0,1") or an integer"#;
    let bad = || format!("{ALLOWED}, got {}", node.describe());
    let indices: Vec<i64> = match &node.value {
        Value::Int(i) => vec![*i],
        Value::Str(text) => text
            .split(',')
            .map(|part| part.trim().parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?,
        Value::Seq(items) => items
            .iter()
            .map(|item| match item.value {
                Value::Int(i) => Ok(i),
                _ => Err(format!("{ALLOWED}, got {} in the list", item.describe())),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    let mut canonical = Vec::with_capacity(indices.len());
    for index in indices {
        let index = u32::try_from(index)
            .map_err(|_| format!("GPU index {index} is negative or too large"))?;
        if canonical.contains(&index) {
            return Err(format!("GPU index {index} is listed twice"));
        }
        canonical.push(index);
    }
    Ok(canonical)
}

/// NNI's booleans, plus YAML 1.1's `yes`/`no`/`on`/`off`: NNI reads configs with PyYAML, which
/// takes those as booleans, so existing configs may use them.
pub(crate) fn boolean(node: &Node) -> Result<bool, String> {
    match &node.value {
        Value::Bool(b) => Ok(*b),
        Value::Str(text) => match text.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" => Ok(true),
            "false" | "no" | "off" => Ok(false),
            _ => Err(format!("expected true or false, got {}", node.describe())),
        },
        _ => Err(format!("expected true or false, got {}", node.describe())),
    }
}

/// NNI's `resolve_path`: expands `~` and `~user` (Python's `os.path.expanduser`), joins a
/// relative path to `base_dir` (the config file's folder), and makes it canonical (symlinks
/// resolved when the path exists, `.`/`..` removed otherwise).
pub(crate) fn resolve_path(
    raw: &str,
    base_dir: &Path,
    home: Option<&Path>,
) -> Result<PathBuf, String> {
    let expanded = expand_user(raw, home)?;
    let absolute = if expanded.is_absolute() {
        expanded
    } else {
        base_dir.join(expanded)
    };
    let resolved =
        std::fs::canonicalize(&absolute).unwrap_or_else(|_| normalize_lexically(&absolute));
    check_utf8(&resolved)?;
    Ok(resolved)
}

/// A path knob uses must be text: the store records the config as JSON, and trials get their
/// folders in environment variables knob writes as text. One with other bytes (a folder named in
/// Latin-1) had been stored as a null config, so every trial failed ("could not start: path
/// contains invalid UTF-8 characters") and `knob resume` could not read the experiment back.
pub(crate) fn check_utf8(path: &Path) -> Result<(), String> {
    match path.to_str() {
        Some(_) => Ok(()),
        None => Err(format!(
            "{path:?} is not valid UTF-8, and knob keeps paths as text (in its store, in the trials' environment); rename the folder, or move what it holds to a path that is"
        )),
    }
}

/// `~` and `~/…` in `home`, `~user` and `~user/…` in that user's home folder, as Python's
/// `os.path.expanduser` (which NNI uses) does: `~root/x` had been taken as a folder `~root`
/// beside the config. Like Python's, a name that is no user here leaves the path as written.
fn expand_user(raw: &str, home: Option<&Path>) -> Result<PathBuf, String> {
    let Some(after_tilde) = raw.strip_prefix('~') else {
        return Ok(PathBuf::from(raw));
    };
    let (user, rest) = after_tilde.split_once('/').unwrap_or((after_tilde, ""));
    let user_home = if user.is_empty() {
        home.ok_or("cannot expand \"~\": $HOME is not set")?
            .to_path_buf()
    } else {
        match nix::unistd::User::from_name(user) {
            Ok(Some(found)) => found.dir,
            Ok(None) => return Ok(PathBuf::from(raw)),
            Err(e) => return Err(format!("cannot expand \"~{user}\": {e}")),
        }
    };
    Ok(user_home.join(rest.trim_start_matches('/')))
}

fn normalize_lexically(path: &Path) -> PathBuf {
    let mut normal = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                normal.pop();
            }
            other => normal.push(other),
        }
    }
    normal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tilde_paths_expand_as_pythons_expanduser_does() {
        let home = Path::new("/home/someone");
        let base = Path::new("/configs");
        let root = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(0))
            .unwrap()
            .expect("a user of uid 0");
        let (root, root_home) = (root.name, root.dir);
        let cases = [
            ("~", home.to_path_buf()),
            ("~/x", home.join("x")),
            (&format!("~{root}") as &str, root_home.clone()),
            (&format!("~{root}/knobx/y"), root_home.join("knobx/y")),
            ("~no-such-user-here/x", base.join("~no-such-user-here/x")),
            ("a/~/b", base.join("a/~/b")),
        ];
        for (raw, expected) in cases {
            let resolved = resolve_path(raw, base, Some(home)).unwrap();
            assert_eq!(
                resolved,
                std::fs::canonicalize(&expected).unwrap_or(expected),
                "{raw}"
            );
        }
        assert_eq!(
            resolve_path("~/x", base, None).unwrap_err(),
            "cannot expand \"~\": $HOME is not set"
        );
    }
}
