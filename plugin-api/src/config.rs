//! Reading a training service's own config (its `trainingService` mapping), for
//! [`TrainingService::check_config`](crate::TrainingService::check_config).
//!
//! The host hands a service the mapping the user wrote, as JSON, without `platform` and the
//! trial settings it reads itself. [`ConfigReader`] reads it the way knob reads the rest of an
//! NNI config, so that every service behaves alike:
//! - keys match ignoring case and underscores (`ssh_key_file`, `SSHKeyFile`); `null` is "not
//!   set"; a key written twice under two spellings, and every unknown key (with the closest known
//!   name), is an error;
//! - every problem is collected (the user sees them all at once), each with its [`FieldPath`];
//!   the host turns the path into `file:line:column: trainingService.<path>: message`;
//! - NNI's value forms: durations (`30m`), GPU indices (`"0,1"`), YAML 1.1 booleans (`yes`),
//!   paths relative to the config's folder with `~` expanded;
//! - [`ConfigReader::secret`] declares a secret field, which the host then never stores or shows.

use std::path::{Component, Path, PathBuf};

use serde_json::{Map, Value};

use crate::service::{CheckedConfig, ConfigProblem, FieldPath, SecretField, ServiceContext};

/// What [`ConfigReader::secret`] refuses: the placeholder knob shows instead of a secret.
pub const REDACTED: &str = "***";

/// NNI's key matching: lowercase, underscores dropped.
pub fn normalize_key(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// The largest integer [`ConfigReader::integer`] accepts as `T`: `T`'s maximum.
fn largest<T: TryFrom<u64>>() -> u64 {
    [
        u64::MAX,
        i64::MAX as u64,
        u32::MAX.into(),
        i32::MAX as u64,
        u16::MAX.into(),
        i16::MAX as u64,
        u8::MAX.into(),
        i8::MAX as u64,
    ]
    .into_iter()
    .find(|&n| T::try_from(n).is_ok())
    .unwrap_or(0)
}

/// A short description of a value for "expected X, got Y" messages (as the host words them).
pub fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(text) => {
            const LIMIT: usize = 60;
            if text.chars().count() > LIMIT {
                let head: String = text.chars().take(LIMIT).collect();
                format!("{head:?}...")
            } else {
                format!("{text:?}")
            }
        }
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
    }
}

/// The value's kind alone ("a number"), for messages about a secret, whose value is never
/// shown: an unquoted all-digit password is a number, and echoing it would print it.
pub fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// A path in double quotes, for messages.
pub fn quoted(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// A field's value and where it is.
#[derive(Debug, Clone)]
pub struct Field<'v> {
    pub path: FieldPath,
    pub value: &'v Value,
}

/// Collects the problems, warnings and secrets found while a service reads its config.
#[derive(Debug)]
pub struct ConfigReader<'c> {
    pub context: &'c ServiceContext,
    problems: Vec<ConfigProblem>,
    warnings: Vec<ConfigProblem>,
    secrets: Vec<SecretField>,
}

impl<'c> ConfigReader<'c> {
    pub fn new(context: &'c ServiceContext) -> ConfigReader<'c> {
        ConfigReader {
            context,
            problems: Vec::new(),
            warnings: Vec::new(),
            secrets: Vec::new(),
        }
    }

    pub fn error(&mut self, path: &FieldPath, message: impl Into<String>) {
        self.problems.push(ConfigProblem {
            path: path.clone(),
            message: message.into(),
        });
    }

    pub fn warn(&mut self, path: &FieldPath, message: impl Into<String>) {
        self.warnings.push(ConfigProblem {
            path: path.clone(),
            message: message.into(),
        });
    }

    /// How many problems so far: compare before and after reading a part to know if it was good.
    pub fn problem_count(&self) -> usize {
        self.problems.len()
    }

    /// The result: the canonical config with its secrets, or every problem found.
    pub fn finish(self, config: Map<String, Value>) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        if self.problems.is_empty() {
            Ok(CheckedConfig {
                config,
                secrets: self.secrets,
                warnings: self.warnings,
                environments: None,
            })
        } else {
            Err(self.problems)
        }
    }

    /// The fields of the mapping `value` (the service's whole config is at [`FieldPath::root`]).
    /// Anything else is a problem, and `None`. A null config is an empty mapping.
    pub fn mapping<'v>(&mut self, value: &'v Value, path: FieldPath) -> Option<Fields<'v>> {
        static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
        let map = match value {
            Value::Object(map) => map,
            Value::Null if path.is_root() => EMPTY.get_or_init(Map::new),
            other => {
                self.error(
                    &path,
                    format!("expected a mapping, got {}", describe(other)),
                );
                return None;
            }
        };
        let mut entries: Vec<Entry<'v>> = Vec::with_capacity(map.len());
        for (key, value) in map {
            let normalized = normalize_key(key);
            if let Some(earlier) = entries.iter().find(|entry| entry.normalized == normalized) {
                let message = format!(
                    "{key:?} and {:?} name the same field; keep one",
                    earlier.key
                );
                self.error(&path, message);
                continue;
            }
            entries.push(Entry {
                key: key.clone(),
                normalized,
                value,
                taken: false,
            });
        }
        Some(Fields { path, entries })
    }

    /// Runs a value parser, recording its error against the field.
    pub fn parse<T>(
        &mut self,
        field: &Field<'_>,
        parser: impl FnOnce(&Value) -> Result<T, String>,
    ) -> Option<T> {
        match parser(field.value) {
            Ok(value) => Some(value),
            Err(message) => {
                self.error(&field.path, message);
                None
            }
        }
    }

    pub fn string(&mut self, field: &Field<'_>) -> Option<String> {
        self.parse(field, |value| match value {
            Value::String(text) => Ok(text.clone()),
            other => Err(format!("expected a string, got {}", describe(other))),
        })
    }

    pub fn non_empty_string(&mut self, field: &Field<'_>) -> Option<String> {
        self.parse(field, |value| match value {
            Value::String(text) if !text.trim().is_empty() => Ok(text.clone()),
            other => Err(format!(
                "expected a non-empty string, got {}",
                describe(other)
            )),
        })
    }

    pub fn boolean(&mut self, field: &Field<'_>) -> Option<bool> {
        self.parse(field, boolean)
    }

    /// An integer `>= min` (`min` 0 says "non-negative", 1 or more "positive").
    pub fn integer<T: TryFrom<u64>>(&mut self, field: &Field<'_>, min: u64) -> Option<T> {
        let kind = if min >= 1 {
            "a positive integer"
        } else {
            "a non-negative integer"
        };
        let at_most = largest::<T>();
        self.parse(field, |value| match value.as_u64() {
            Some(i) if i >= min => {
                T::try_from(i).map_err(|_| format!("{i} is too large (at most {at_most})"))
            }
            // A whole number past u64, which reads as a float (`99999999999999999999` is
            // 1e20): still an integer, so it is too large, not "expected an integer, got 1e20".
            _ if value
                .as_f64()
                .is_some_and(|f| f.fract() == 0.0 && f >= u64::MAX as f64) =>
            {
                Err(format!("too large (at most {at_most})"))
            }
            _ => Err(format!("expected {kind}, got {}", describe(value))),
        })
    }

    /// NNI's durations, in whole seconds (see [`duration_seconds`]).
    pub fn duration_seconds(&mut self, field: &Field<'_>) -> Option<u64> {
        self.parse(field, duration_seconds)
    }

    /// NNI's GPU index lists (see [`gpu_indices`]).
    pub fn gpu_indices(&mut self, field: &Field<'_>) -> Option<Vec<u32>> {
        self.parse(field, gpu_indices)
    }

    /// A percentage above 0 and at most 100 (see [`percent`]).
    pub fn percent(&mut self, field: &Field<'_>) -> Option<f64> {
        self.parse(field, percent)
    }

    /// NNI's memory sizes, in MiB (see [`size_mib`]).
    pub fn size_mib(&mut self, field: &Field<'_>) -> Option<u64> {
        self.parse(field, size_mib)
    }

    /// A path on this machine: `~` expanded, relative to the config's folder, made canonical.
    pub fn path(&mut self, field: &Field<'_>) -> Option<PathBuf> {
        let raw = self.non_empty_string(field)?;
        // $HOME, else the password database's, as the host's own config reader expands `~`.
        let home = std::env::home_dir();
        let base = self.context.config_dir.clone();
        self.parse(field, |_| resolve_path(&raw, &base, home.as_deref()))
    }

    /// A secret string (a password, a token): read like a string, and declared to the host, which
    /// never stores or shows it. `env_var` is where `knob resume` finds it when the config file
    /// the experiment was created from is gone. The placeholder `***` is refused in a config the
    /// user wrote, not in one the host stored (`ServiceContext::stored`), whose secrets are `***`
    /// until it fills them in again.
    pub fn secret(&mut self, field: &Field<'_>, env_var: Option<&str>) -> Option<String> {
        let value = self.parse(field, |value| match value {
            Value::String(text) => Ok(text.clone()),
            other => Err(format!(
                "expected a string, got {} (quote it; knob never shows a secret's value)",
                kind_of(other)
            )),
        })?;
        if value == REDACTED && !self.context.stored {
            self.error(
                &field.path,
                format!("{REDACTED:?} is the placeholder knob prints instead of a secret; write the real value"),
            );
            return None;
        }
        self.secrets.push(SecretField {
            path: field.path.clone(),
            env_var: env_var.map(str::to_owned),
        });
        Some(value)
    }
}

struct Entry<'v> {
    key: String,
    normalized: String,
    value: &'v Value,
    taken: bool,
}

/// The fields of one mapping, looked up by canonical name.
pub struct Fields<'v> {
    path: FieldPath,
    entries: Vec<Entry<'v>>,
}

impl<'v> Fields<'v> {
    /// Where this mapping is.
    pub fn path(&self) -> &FieldPath {
        &self.path
    }

    /// The field `name` (canonical camelCase) if present and not null. Marks it as known.
    pub fn take(&mut self, name: &str) -> Option<Field<'v>> {
        let wanted = normalize_key(name);
        let entry = self
            .entries
            .iter_mut()
            .find(|entry| entry.normalized == wanted)?;
        entry.taken = true;
        (!entry.value.is_null()).then(|| Field {
            path: self.path.field(name),
            value: entry.value,
        })
    }

    /// The field `name`, which must be set: its absence is a problem saying `what` it is.
    pub fn require(
        &mut self,
        reader: &mut ConfigReader<'_>,
        name: &str,
        what: &str,
    ) -> Option<Field<'v>> {
        let field = self.take(name);
        if field.is_none() {
            reader.error(&self.path.field(name), format!("required: {what}"));
        }
        field
    }

    /// Reports every key not taken as unknown, suggesting the closest of `known` (and listing
    /// them when none is close).
    pub fn finish(self, reader: &mut ConfigReader<'_>, known: &[&str]) {
        self.finish_renamed(reader, known, "", &[]);
    }

    /// [`Fields::finish`], where a key that is the old name of a known field (`renamed`:
    /// old, new; NNI v1's `ip` for v2's `host`) is said to be that, `older` naming where it
    /// comes from ("NNI v1's name"): edit distance does not lead from one to the other.
    pub fn finish_renamed(
        self,
        reader: &mut ConfigReader<'_>,
        known: &[&str],
        older: &str,
        renamed: &[(&str, &str)],
    ) {
        for entry in self.entries.iter().filter(|entry| !entry.taken) {
            let new_name = renamed
                .iter()
                .find(|(old, _)| normalize_key(old) == entry.normalized)
                .map(|(_, new)| *new);
            let hint = match (new_name, suggestion(&entry.key, known)) {
                (Some(new), _) => format!(" ({older}; write {new:?})"),
                (None, Some(name)) => format!(" (did you mean {name:?}?)"),
                (None, None) if known.is_empty() => " (this mapping takes no fields)".to_owned(),
                (None, None) => format!("; known fields: {}", known.join(", ")),
            };
            reader.error(
                &self.path.field(&entry.key),
                format!("unknown field {:?}{hint}", entry.key),
            );
        }
    }
}

/// The closest of `known` to a misspelt key, if any is close.
pub fn suggestion<'k>(written: &str, known: &[&'k str]) -> Option<&'k str> {
    let normalized = normalize_key(written);
    let best = known
        .iter()
        .map(|name| (edit_distance(&normalized, &normalize_key(name)), *name))
        .min_by_key(|(distance, _)| *distance);
    if let Some((distance, name)) = best {
        if distance <= 2.max(normalized.chars().count() / 4) {
            return Some(name);
        }
    }
    // A truncated name (`hostLossTime`) is far from the full one by edit distance.
    let mut extensions = known
        .iter()
        .filter(|name| normalized.len() >= 5 && normalize_key(name).starts_with(&normalized));
    match (extensions.next(), extensions.next()) {
        (Some(name), None) => Some(name),
        _ => None,
    }
}

/// Damerau–Levenshtein distance (optimal string alignment), for "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// NNI's booleans, plus YAML 1.1's `yes`/`no`/`on`/`off` (NNI reads configs with PyYAML).
pub fn boolean(value: &Value) -> Result<bool, String> {
    match value {
        Value::Bool(b) => Ok(*b),
        Value::String(text) => match text.to_ascii_lowercase().as_str() {
            "true" | "yes" | "on" => Ok(true),
            "false" | "no" | "off" => Ok(false),
            _ => Err(format!("expected true or false, got {}", describe(value))),
        },
        _ => Err(format!("expected true or false, got {}", describe(value))),
    }
}

/// NNI's `parse_time`: a number of seconds, or a number followed by `s`, `m`, `h` or `d`
/// (`"30m"`, `"0.5h"`), rounded up to whole seconds; positive, at most 100 years.
pub fn duration_seconds(value: &Value) -> Result<u64, String> {
    const ALLOWED: &str =
        r#"expected a duration like "30s", "30m", "2h", "1d" or a number of seconds"#;
    const UNITS: [(&str, f64); 4] = [("d", 86_400.0), ("h", 3_600.0), ("m", 60.0), ("s", 1.0)];
    let seconds = match value {
        Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
        Value::String(text) => {
            let lower = text.trim().to_ascii_lowercase();
            let parsed = UNITS.iter().find_map(|(unit, factor)| {
                let number = lower.strip_suffix(unit)?.trim();
                number.parse::<f64>().ok().map(|value| value * factor)
            });
            parsed.ok_or_else(|| format!("{ALLOWED}, got {}", describe(value)))?
        }
        _ => return Err(format!("{ALLOWED}, got {}", describe(value))),
    };
    const HUNDRED_YEARS: f64 = 100.0 * 365.0 * 86_400.0;
    let seconds = seconds.ceil();
    if seconds > HUNDRED_YEARS {
        return Err(format!(
            "must be at most 100 years, got {}",
            describe(value)
        ));
    }
    if seconds.is_nan() || seconds < 1.0 {
        return Err(format!("must be positive, got {}", describe(value)));
    }
    Ok(seconds as u64)
}

/// A percentage above 0 and at most 100: a number (`90`, `87.5`) or the same with `%` (`"90%"`).
pub fn percent(value: &Value) -> Result<f64, String> {
    const ALLOWED: &str = r#"expected a percentage above 0 and at most 100, like 90 or "90%""#;
    let number = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(text) => text
            .trim()
            .strip_suffix('%')
            .unwrap_or(text.trim())
            .trim()
            .parse::<f64>()
            .ok(),
        _ => None,
    };
    match number {
        Some(percent) if percent > 0.0 && percent <= 100.0 => Ok(percent),
        _ => Err(format!("{ALLOWED}, got {}", describe(value))),
    }
}

/// NNI's `parse_memory_size`, in MiB: a number of MiB, or a number followed by `b`, `kb`, `mb`,
/// `gb`, `tb` (binary multiples, as in NNI: `1GB` is 1024 MiB) or `kib`, `mib`, `gib`, `tib`.
/// Rounded up to whole MiB; must be positive.
pub fn size_mib(value: &Value) -> Result<u64, String> {
    const ALLOWED: &str = r#"expected a size like "10GiB", "500MB" or a number of MiB"#;
    const KIB: f64 = 1.0 / 1024.0;
    // Longest suffixes first, so that "gib" is not read as "ib" after "g".
    const UNITS: [(&str, f64); 9] = [
        ("tib", 1024.0 * 1024.0),
        ("gib", 1024.0),
        ("mib", 1.0),
        ("kib", KIB),
        ("tb", 1024.0 * 1024.0),
        ("gb", 1024.0),
        ("mb", 1.0),
        ("kb", KIB),
        ("b", KIB * KIB),
    ];
    let mib = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(text) => {
            let lower = text.trim().to_ascii_lowercase();
            UNITS.iter().find_map(|(unit, factor)| {
                let number = lower.strip_suffix(unit)?.trim();
                number.parse::<f64>().ok().map(|value| value * factor)
            })
        }
        _ => None,
    }
    .ok_or_else(|| format!("{ALLOWED}, got {}", describe(value)))?
    .ceil();
    // `u64::MAX as f64` rounds up, hence the strict bound.
    if mib.is_nan() || mib < 1.0 {
        Err(format!("must be positive, got {}", describe(value)))
    } else if mib >= (u64::MAX / (1024 * 1024)) as f64 {
        Err(format!("too large, got {}", describe(value)))
    } else {
        Ok(mib as u64)
    }
}

/// NNI's `canonical_gpu_indices`: a list of ints, an int, or a comma-separated string (`"0,1"`);
/// no negatives, no duplicates.
pub fn gpu_indices(value: &Value) -> Result<Vec<u32>, String> {
    const ALLOWED: &str =
        r#"expected GPU indices as a list ([0, 1]), a string ("0,1") or an integer"#;
    let bad = || format!("{ALLOWED}, got {}", describe(value));
    let indices: Vec<i64> = match value {
        Value::Number(n) => vec![n.as_i64().ok_or_else(bad)?],
        Value::String(text) => text
            .split(',')
            .map(|part| part.trim().parse::<i64>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?,
        Value::Array(items) => items
            .iter()
            .map(|item| {
                item.as_i64()
                    .ok_or_else(|| format!("{ALLOWED}, got {} in the list", describe(item)))
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

/// NNI's `resolve_path`: expands `~`, joins a relative path to `base_dir`, and makes it
/// canonical (symlinks resolved when the path exists, `.`/`..` removed otherwise).
pub fn resolve_path(raw: &str, base_dir: &Path, home: Option<&Path>) -> Result<PathBuf, String> {
    let expanded = if raw == "~" || raw.starts_with("~/") {
        let home = home.ok_or("cannot expand \"~\": $HOME is not set")?;
        home.join(raw.trim_start_matches('~').trim_start_matches('/'))
    } else {
        PathBuf::from(raw)
    };
    let absolute = if expanded.is_absolute() {
        expanded
    } else {
        base_dir.join(expanded)
    };
    Ok(std::fs::canonicalize(&absolute).unwrap_or_else(|_| {
        let mut normal = PathBuf::new();
        for component in absolute.components() {
            match component {
                Component::CurDir => {}
                Component::ParentDir => {
                    normal.pop();
                }
                other => normal.push(other),
            }
        }
        normal
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(config: Value) -> Result<CheckedConfig, Vec<ConfigProblem>> {
        let context = ServiceContext::default();
        let mut reader = ConfigReader::new(&context);
        let mut fields = reader.mapping(&config, FieldPath::root()).unwrap();
        let level = fields
            .take("niceLevel")
            .and_then(|field| reader.integer::<u32>(&field, 0));
        let token = fields
            .take("apiToken")
            .and_then(|field| reader.secret(&field, Some("TOKEN")));
        fields.finish(&mut reader, &["niceLevel", "apiToken"]);
        let mut canonical = Map::new();
        canonical.insert("niceLevel".into(), json!(level.unwrap_or(10)));
        canonical.insert("apiToken".into(), json!(token));
        reader.finish(canonical)
    }

    #[test]
    fn keys_match_like_nni_and_every_problem_has_a_path() {
        let checked = check(json!({"NICE_LEVEL": 5, "api_token": "s3cret"})).unwrap();
        assert_eq!(checked.config["niceLevel"], 5);
        assert_eq!(
            checked.secrets,
            vec![SecretField {
                path: FieldPath::root().field("apiToken"),
                env_var: Some("TOKEN".into())
            }]
        );
        let problems =
            check(json!({"niceLevel": -1, "nice_level": 3, "niceLevl": 3, "x": 1})).unwrap_err();
        let lines: Vec<String> = problems
            .iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect();
        assert_eq!(
            lines,
            [
                // Written twice: reported at the mapping (the root path shows as nothing).
                r#": "nice_level" and "niceLevel" name the same field; keep one"#,
                "niceLevel: expected a non-negative integer, got -1",
                r#"niceLevl: unknown field "niceLevl" (did you mean "niceLevel"?)"#,
                r#"x: unknown field "x"; known fields: niceLevel, apiToken"#,
            ]
        );
    }

    /// An integer past its type says how large it may be, also past u64, which JSON reads as
    /// a float (it said "expected a non-negative integer, got 1e20").
    #[test]
    fn a_too_large_integer_says_its_limit() {
        let message = |value: Value| {
            let problems = check(json!({ "niceLevel": value })).unwrap_err();
            format!("{}: {}", problems[0].path, problems[0].message)
        };
        assert_eq!(
            message(json!(4_294_967_296_u64)),
            "niceLevel: 4294967296 is too large (at most 4294967295)"
        );
        let past_u64: Value = serde_json::from_str("99999999999999999999").unwrap();
        assert_eq!(
            message(past_u64),
            "niceLevel: too large (at most 4294967295)"
        );
        assert_eq!(
            message(json!(1.5)),
            "niceLevel: expected a non-negative integer, got 1.5"
        );
    }

    #[test]
    fn paths_display_and_find() {
        let path = FieldPath::root()
            .field("machineList")
            .index(1)
            .field("password");
        assert_eq!(path.to_string(), "machineList[1].password");
        assert_eq!(
            serde_json::to_string(&path).unwrap(),
            r#"["machineList",1,"password"]"#
        );
        let value = json!({"machineList": [{}, {"password": "pw"}]});
        assert_eq!(path.find(&value), Some(&json!("pw")));
        assert_eq!(path.parent().to_string(), "machineList[1]");
    }

    #[test]
    fn nni_value_forms() {
        assert_eq!(duration_seconds(&json!("1.5m")), Ok(90));
        assert_eq!(duration_seconds(&json!(30)), Ok(30));
        assert!(duration_seconds(&json!("soon")).is_err());
        assert_eq!(gpu_indices(&json!("0, 2")), Ok(vec![0, 2]));
        assert_eq!(gpu_indices(&json!(1)), Ok(vec![1]));
        assert!(gpu_indices(&json!([1, 1])).is_err());
        assert_eq!(boolean(&json!("yes")), Ok(true));
        assert_eq!(edit_distance("reusemode", "resuemode"), 1);
    }
}
