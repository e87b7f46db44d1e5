//! Reading a YAML tree field by field while collecting every error.
//!
//! NNI matches keys case- and underscore-insensitively (`trial_command`, `TrialCommand` and
//! `trialcommand` are all `trialCommand`), and treats `null` as "not set". [`Fields`] implements
//! both, reports keys that name the same field twice, and reports every unknown key with the
//! closest known name.

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::units;
use super::yaml::{Node, Pos, Value};

/// Collects errors and warnings while the config is read; owns what every field reader needs.
pub(crate) struct Reader {
    pub file: String,
    pub base_dir: PathBuf,
    pub home: Option<PathBuf>,
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<ConfigError>,
    /// The config file, absolute (services are told, see `ServiceContext::config_file`).
    pub config_file: Option<PathBuf>,
    /// NNI's top-level shortcut fields, canonical.
    pub shortcuts: serde_json::Map<String, serde_json::Value>,
    /// `pluginPaths`, where the training services may come from.
    pub plugin_paths: Vec<PathBuf>,
    /// The training-service entries, for their plugins to check.
    pub pending: Vec<super::training_service::PendingService>,
    /// The tuner and assessor, for their plugins to build.
    pub pending_algorithms: Vec<super::algorithm::PendingAlgorithm>,
}

impl Reader {
    pub fn error(&mut self, pos: Option<Pos>, field: &str, message: impl Into<String>) {
        let error = self.located(pos, field, message.into());
        self.errors.push(error);
    }

    pub fn warn(&mut self, pos: Option<Pos>, field: &str, message: impl Into<String>) {
        let warning = self.located(pos, field, message.into());
        self.warnings.push(warning);
    }

    /// An error inside another file the config names (a search-space file).
    pub fn error_in(
        &mut self,
        file: &Path,
        pos: Option<Pos>,
        field: &str,
        message: impl Into<String>,
    ) {
        let error = ConfigError {
            file: file.display().to_string(),
            ..self.located(pos, field, message.into())
        };
        self.errors.push(error);
    }

    fn located(&self, pos: Option<Pos>, field: &str, message: String) -> ConfigError {
        ConfigError {
            file: self.file.clone(),
            line: pos.map(|pos| pos.line),
            column: pos.map(|pos| pos.column),
            field: field.to_owned(),
            message,
        }
    }

    /// Runs a value parser, recording its error against the field.
    pub fn parse<T>(
        &mut self,
        field: &Field<'_>,
        parser: impl FnOnce(&Node) -> Result<T, String>,
    ) -> Option<T> {
        match parser(field.node) {
            Ok(value) => Some(value),
            Err(message) => {
                self.error(field.node.pos, &field.path, message);
                None
            }
        }
    }

    pub fn string(&mut self, field: &Field<'_>) -> Option<String> {
        self.parse(field, |node| match &node.value {
            Value::Str(text) => Ok(text.clone()),
            _ => Err(format!("expected a string, got {}", node.describe())),
        })
    }

    pub fn non_empty_string(&mut self, field: &Field<'_>) -> Option<String> {
        self.parse(field, |node| match &node.value {
            Value::Str(text) if !text.trim().is_empty() => Ok(text.clone()),
            _ => Err(format!(
                "expected a non-empty string, got {}",
                node.describe()
            )),
        })
    }

    pub fn boolean(&mut self, field: &Field<'_>) -> Option<bool> {
        self.parse(field, units::boolean)
    }

    /// An integer `>= min` (`min` is 0 or 1, and the message says "non-negative" or "positive").
    pub fn integer<T: TryFrom<i64>>(&mut self, field: &Field<'_>, min: i64) -> Option<T> {
        let kind = if min >= 1 {
            "a positive integer"
        } else {
            "a non-negative integer"
        };
        let at_most = largest::<T>();
        self.parse(field, |node| match node.value {
            Value::Int(i) if i >= min => {
                T::try_from(i).map_err(|_| format!("{i} is too large (at most {at_most})"))
            }
            // A whole number past i64, which YAML reads as a float (`99999999999999999999`
            // is 1e20): still an integer, so the message is the same, without the float's text.
            Value::UInt(_) => Err(format!("too large (at most {at_most})")),
            Value::Float(f) if f.fract() == 0.0 && f >= i64::MAX as f64 => {
                Err(format!("too large (at most {at_most})"))
            }
            _ => Err(format!("expected {kind}, got {}", node.describe())),
        })
    }

    /// A path, resolved against the config file's folder.
    pub fn path(&mut self, field: &Field<'_>) -> Option<PathBuf> {
        let raw = self.non_empty_string(field)?;
        let (base_dir, home) = (self.base_dir.clone(), self.home.clone());
        self.parse(field, |_| {
            units::resolve_path(&raw, &base_dir, home.as_deref())
        })
    }

    /// A path that must name an existing directory.
    pub fn directory(&mut self, field: &Field<'_>) -> Option<PathBuf> {
        let path = self.path(field)?;
        self.check_directory(field.node.pos, &field.path, path)
    }

    pub fn check_directory(
        &mut self,
        pos: Option<Pos>,
        field: &str,
        path: PathBuf,
    ) -> Option<PathBuf> {
        match std::fs::metadata(&path) {
            Ok(metadata) if metadata.is_dir() => Some(path),
            Ok(_) => {
                self.error(pos, field, format!("{} is not a directory", quoted(&path)));
                None
            }
            Err(error) => {
                self.error(
                    pos,
                    field,
                    format!(
                        "directory {} does not exist ({})",
                        quoted(&path),
                        plain_io(&error)
                    ),
                );
                None
            }
        }
    }

    /// A folder knob makes if it is missing (`experimentWorkingDirectory`): refused when it, or
    /// the nearest folder above it that exists, is something else (a file), which `create`
    /// would otherwise meet as an OS error about a path inside it. `what_to_do` ends the message.
    pub fn check_makeable_directory(
        &mut self,
        pos: Option<Pos>,
        field: &str,
        path: PathBuf,
        what_to_do: &str,
    ) -> Option<PathBuf> {
        for existing in path.ancestors() {
            match std::fs::metadata(existing) {
                Ok(metadata) if metadata.is_dir() => return Some(path),
                Ok(_) if existing == path => {
                    let message = format!("{} is not a directory; {what_to_do}", quoted(&path));
                    self.error(pos, field, message);
                    return None;
                }
                Ok(_) => {
                    let message = format!(
                        "{} cannot be made: {} is not a directory; {what_to_do}",
                        quoted(&path),
                        quoted(existing)
                    );
                    self.error(pos, field, message);
                    return None;
                }
                // Missing, or under a file: what is above it says which.
                Err(error)
                    if matches!(
                        error.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                    ) => {}
                // Unreadable (permissions): `create` says what the OS says.
                Err(_) => return Some(path),
            }
        }
        Some(path)
    }

    /// A mapping whose values become JSON (class args).
    pub fn json_object(
        &mut self,
        field: &Field<'_>,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        if !matches!(field.node.value, Value::Map(_)) {
            self.error(
                field.node.pos,
                &field.path,
                format!("expected a mapping, got {}", field.node.describe()),
            );
            return None;
        }
        match field.node.to_json() {
            Ok(serde_json::Value::Object(object)) => Some(object),
            Ok(_) => None,
            Err((pos, message)) => {
                self.error(pos.or(field.node.pos), &field.path, message);
                None
            }
        }
    }

    /// One of `choices`, matched ignoring case, `-` and `_`.
    pub fn choice<T: Copy>(&mut self, field: &Field<'_>, choices: &[(&str, T)]) -> Option<T> {
        let names: Vec<String> = choices
            .iter()
            .map(|(name, _)| format!("{name:?}"))
            .collect();
        self.parse(field, |node| {
            let chosen = node.as_str().and_then(|text| {
                let wanted = normalize_choice(text);
                choices
                    .iter()
                    .find(|(name, _)| normalize_choice(name) == wanted)
            });
            chosen.map(|(_, value)| *value).ok_or_else(|| {
                format!(
                    "expected one of {}, got {}",
                    names.join(", "),
                    node.describe()
                )
            })
        })
    }
}

fn normalize_choice(text: &str) -> String {
    text.chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The largest integer [`Reader::integer`] accepts as `T`: `T`'s maximum, or i64's for a wider
/// `T` (the YAML tree holds integers as i64, so that is u64's too).
fn largest<T: TryFrom<i64>>() -> i64 {
    [
        i64::MAX,
        u32::MAX.into(),
        i32::MAX.into(),
        u16::MAX.into(),
        i16::MAX.into(),
        u8::MAX.into(),
        i8::MAX.into(),
    ]
    .into_iter()
    .find(|&n| T::try_from(n).is_ok())
    .unwrap_or(0)
}

/// A path in double quotes, for messages.
pub(crate) fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// An I/O error without Rust's " (os error N)" suffix.
pub(crate) fn plain_io(error: &std::io::Error) -> String {
    let text = error.to_string();
    match text.find(" (os error") {
        Some(index) => text[..index].to_owned(),
        None => text,
    }
}

/// A field's value with its canonical path, e.g. `trainingService.gpuIndices`.
pub(crate) struct Field<'a> {
    pub node: &'a Node,
    pub path: String,
}

/// The key and value of `name` in a mapping (`None` for anything else), keys matched as NNI
/// matches them ([`normalize_key`]).
pub(crate) fn map_entry<'n>(node: &'n Node, name: &str) -> Option<(&'n Node, &'n Node)> {
    let Value::Map(pairs) = &node.value else {
        return None;
    };
    let wanted = normalize_key(name);
    pairs
        .iter()
        .find(|(key, _)| normalize_key(&key.key_text()) == wanted)
        .map(|(key, value)| (key, value))
}

/// The items of a field written as one value or as a list of them, each with its path
/// (`field[i]` in a list); `None` when the value is neither a string nor a list.
pub(crate) fn one_or_list<'a>(field: &Field<'a>) -> Option<Vec<Field<'a>>> {
    match &field.node.value {
        Value::Str(_) => Some(vec![Field {
            node: field.node,
            path: field.path.clone(),
        }]),
        Value::Seq(items) => Some(
            items
                .iter()
                .enumerate()
                .map(|(index, node)| Field {
                    node,
                    path: format!("{}[{index}]", field.path),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// NNI's `case_insensitive`: lowercase, underscores dropped.
pub(crate) fn normalize_key(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

struct Entry<'a> {
    key: &'a Node,
    normalized: String,
    value: &'a Node,
    taken: bool,
}

/// The fields of one mapping, looked up by canonical name.
pub(crate) struct Fields<'a> {
    path: String,
    pub pos: Option<Pos>,
    entries: Vec<Entry<'a>>,
}

impl<'a> Fields<'a> {
    /// Opens a mapping; reports an error and returns `None` for anything else.
    pub fn open(reader: &mut Reader, node: &'a Node, path: &str) -> Option<Fields<'a>> {
        let Value::Map(pairs) = &node.value else {
            reader.error(
                node.pos,
                path,
                format!("expected a mapping, got {}", node.describe()),
            );
            return None;
        };
        let mut entries: Vec<Entry<'a>> = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let normalized = normalize_key(&key.key_text());
            if let Some(earlier) = entries.iter().find(|entry| entry.normalized == normalized) {
                let message = format!(
                    "{:?} and {:?} (line {}) name the same field; keep one",
                    key.key_text(),
                    earlier.key.key_text(),
                    earlier
                        .key
                        .pos
                        .map_or_else(|| "?".to_owned(), |pos| pos.line.to_string()),
                );
                reader.error(key.pos, path, message);
                continue;
            }
            entries.push(Entry {
                key,
                normalized,
                value,
                taken: false,
            });
        }
        Some(Fields {
            path: path.to_owned(),
            pos: node.pos,
            entries,
        })
    }

    pub fn child_path(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    /// The field `name` (canonical camelCase) if present and not null. Marks it as known.
    pub fn take(&mut self, name: &str) -> Option<Field<'a>> {
        let wanted = normalize_key(name);
        let path = self.child_path(name);
        let entry = self
            .entries
            .iter_mut()
            .find(|entry| entry.normalized == wanted)?;
        entry.taken = true;
        let node = entry.value;
        (!node.is_null()).then_some(Field { node, path })
    }

    /// The keys not taken, as written, with their values (null ones too), all marked as known:
    /// what a mapping hands on to someone else to read.
    pub fn rest(mut self) -> Vec<(String, &'a Node)> {
        self.entries
            .iter_mut()
            .filter(|entry| !entry.taken)
            .map(|entry| {
                entry.taken = true;
                (entry.key.key_text(), entry.value)
            })
            .collect()
    }

    /// Reports every key not taken as unknown, suggesting the closest of `known`.
    pub fn finish(self, reader: &mut Reader, known: &[&str]) {
        for entry in self.entries.iter().filter(|entry| !entry.taken) {
            let written = entry.key.key_text();
            let hint = suggestion(&written, known)
                .map(|hint| format!(" ({hint})"))
                .unwrap_or_default();
            reader.error(
                entry.key.pos,
                &self.path,
                format!("unknown field {written:?}{hint}"),
            );
        }
    }
}

/// "did you mean ..." for a misspelt key, or how to write an NNI v1 key in v2.
fn suggestion(written: &str, known: &[&str]) -> Option<String> {
    let normalized = normalize_key(written);
    // NNI v1 fields in a config without `trainingServicePlatform` (with it, the config is v1 and
    // converted, see `v1.rs`).
    const V1_KEYS: [(&str, &str); 11] = [
        ("authorname", "an NNI v1 field; drop it"),
        ("maxexecduration", "NNI v1; write maxExperimentDuration"),
        ("maxtrialnum", "NNI v1; write maxTrialNumber"),
        ("searchspacepath", "NNI v1; write searchSpaceFile"),
        (
            "trial",
            "NNI v1; write trialCommand and trialCodeDirectory at top level",
        ),
        (
            "localconfig",
            "NNI v1; write these fields under trainingService",
        ),
        (
            "machinelist",
            "write machineList under the trainingService entry whose platform takes it",
        ),
        ("builtintunername", "NNI v1; write name"),
        ("builtinassessorname", "NNI v1; write name"),
        ("codedir", "NNI v1; write codeDirectory"),
        ("logdir", "NNI v1; write experimentWorkingDirectory"),
    ];
    let best = known
        .iter()
        .map(|name| {
            (
                strsim::damerau_levenshtein(&normalized, &normalize_key(name)),
                *name,
            )
        })
        .min_by_key(|(distance, _)| *distance);
    if let Some((distance, name)) = best {
        if distance <= 2.max(normalized.chars().count() / 4) {
            return Some(format!("did you mean {name:?}?"));
        }
    }
    // A truncated name (`experimentWorkingDir`) is far from the full one by edit distance.
    let mut extensions = known
        .iter()
        .filter(|name| normalized.len() >= 5 && normalize_key(name).starts_with(&normalized));
    if let (Some(name), None) = (extensions.next(), extensions.next()) {
        return Some(format!("did you mean {name:?}?"));
    }
    // A name without its prefix (`name` in NNI's own config_detailed.yml, `concurrency`).
    let mut shortenings = known
        .iter()
        .filter(|name| normalized.len() >= 4 && normalize_key(name).ends_with(&normalized));
    if let (Some(name), None) = (shortenings.next(), shortenings.next()) {
        return Some(format!("did you mean {name:?}?"));
    }
    V1_KEYS
        .iter()
        .find(|(key, _)| *key == normalized)
        .map(|(_, hint)| (*hint).to_owned())
}
