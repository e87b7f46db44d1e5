//! A component's `classArgs`, read into the author's type: [`parse_class_args`].
//!
//! serde's own messages name neither the key nor, in words, what it wants (`invalid value:
//! integer `-3`, expected u64`; `expected struct TpeArgs`, a Rust type's name). Deserializing
//! through `serde_path_to_error` gives the path of the bad key, and a type mismatch is worded
//! again from serde's `expected` part and the value as written: `tpe_args.n_startup_jobs:
//! expected a whole number ≥ 0, got -5`. The config reader finds the key's line and column from
//! that path (`core::config::algorithm`).

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::{Path, Segment};

use crate::PluginError;

/// Deserializes a component's `classArgs` into `T`, with a message naming the component and the
/// path of the key it is about (`classArgs of TPE: tpe_args.n_startup_jobs: expected a whole
/// number ≥ 0, got -5`). Give `T` `#[serde(deny_unknown_fields)]`: serde's message then lists
/// the known arguments.
pub fn parse_class_args<T: DeserializeOwned>(
    component: &str,
    class_args: &Value,
) -> Result<T, PluginError> {
    let args = if class_args.is_null() {
        Value::Object(Default::default())
    } else {
        class_args.clone()
    };
    serde_path_to_error::deserialize(&args).map_err(|error| {
        let message = describe(error.path(), &error.inner().to_string(), &args);
        PluginError::new(format!("classArgs of {component}: {message}"))
    })
}

/// `path: what is wrong`, or `what is wrong` alone for the classArgs as a whole or a message
/// that already starts with the key (`optimize_mode must be ...`, a custom deserializer's).
fn describe(path: &Path, serde_message: &str, args: &Value) -> String {
    let last = path.iter().next_back().and_then(|segment| match segment {
        Segment::Map { key } => Some(key.as_str()),
        _ => None,
    });
    // serde names an unknown key itself, and the path ends at it: say where it was found.
    let unknown =
        last.is_some_and(|last| serde_message.starts_with(&format!("unknown field `{last}`")));
    let keys = path_text(path, if unknown { 1 } else { 0 });
    let message = match mismatch(serde_message) {
        Some((unexpected, expected)) => {
            let got = match value_at(args, path) {
                Some(value) => written(value),
                None => unexpected_in_words(unexpected),
            };
            format!("expected {}, got {got}", expected_in_words(expected))
        }
        None => serde_message.to_owned(),
    };
    if keys.is_empty() {
        return message;
    }
    // A custom message that names its own key ("seed must be ..."): the path in its place.
    if let Some(rest) = last.and_then(|last| message.strip_prefix(last)) {
        if rest.starts_with(' ') {
            return format!("{keys}{rest}");
        }
    }
    format!("{keys}: {message}")
}

/// The path as a config writes it: `tpe_args.n_startup_jobs`, `points[2].x`; empty for the
/// classArgs themselves. It stops before a step serde could not name, and leaves out the last
/// `drop_last` steps.
fn path_text(path: &Path, drop_last: usize) -> String {
    let mut text = String::new();
    for segment in path
        .iter()
        .take(path.iter().len().saturating_sub(drop_last))
    {
        match segment {
            Segment::Seq { index } => text.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    text
}

/// The value the path leads to in the classArgs as given.
fn value_at<'v>(args: &'v Value, path: &Path) -> Option<&'v Value> {
    let mut value = args;
    for segment in path {
        value = match (segment, value) {
            (Segment::Seq { index }, Value::Array(items)) => items.get(*index)?,
            (Segment::Map { key }, Value::Object(map)) => map.get(key)?,
            // A unit variant is the string itself; a variant with content, a one-key mapping.
            (Segment::Enum { variant }, Value::Object(map)) => map.get(variant)?,
            (Segment::Enum { .. }, _) => value,
            _ => return None,
        };
    }
    Some(value)
}

/// serde's `invalid type: X, expected Y` and `invalid value: X, expected Y`, as (X, Y).
fn mismatch(message: &str) -> Option<(&str, &str)> {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))?;
    let at = rest.rfind(", expected ")?;
    Some((&rest[..at], &rest[at + ", expected ".len()..]))
}

/// A value as the message quotes it: a scalar as JSON, a list or mapping by its kind.
fn written(value: &Value) -> String {
    const LIMIT: usize = 60;
    match value {
        Value::Array(_) => "a list".to_owned(),
        Value::Object(_) => "a mapping".to_owned(),
        Value::String(text) if text.chars().count() > LIMIT => {
            let head: String = text.chars().take(LIMIT).collect();
            format!("{head:?}...")
        }
        other => other.to_string(),
    }
}

/// serde's `expected` words for the types classArgs use, without Rust's names (`u64`,
/// `struct TpeArgs`).
fn expected_in_words(expected: &str) -> String {
    let range = |min: i128, max: i128| format!("a whole number from {min} to {max}");
    match expected {
        "u64" | "u128" | "usize" => "a whole number ≥ 0".to_owned(),
        "u8" => range(0, u8::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "i64" | "i128" | "isize" => "a whole number".to_owned(),
        "i8" => range(i8::MIN.into(), i8::MAX.into()),
        "i16" => range(i16::MIN.into(), i16::MAX.into()),
        "i32" => range(i32::MIN.into(), i32::MAX.into()),
        "f32" | "f64" => "a number".to_owned(),
        "a boolean" => "true or false".to_owned(),
        "a sequence" => "a list".to_owned(),
        "a map" => "a mapping".to_owned(),
        "unit" => "null".to_owned(),
        // serde_json's word for an enum given neither a name nor a one-key mapping.
        "string or map" => "a name (a string)".to_owned(),
        other if other.starts_with("struct ") => "a mapping".to_owned(),
        other if other.starts_with("tuple struct ") || other.starts_with("tuple ") => {
            "a list".to_owned()
        }
        other if other.starts_with("unit struct ") || other.starts_with("unit variant") => {
            "null".to_owned()
        }
        other if other.starts_with("enum ") => "a name (a string)".to_owned(),
        other => other.to_owned(),
    }
}

/// serde's words for the value it refused (`integer `-3``, `string "32"`), where the path did
/// not lead to it.
fn unexpected_in_words(unexpected: &str) -> String {
    if let Some((_, quoted)) = unexpected.split_once(" `") {
        return quoted.trim_end_matches('`').to_owned();
    }
    if let Some(text) = unexpected.strip_prefix("string ") {
        return text.to_owned();
    }
    match unexpected {
        "map" => "a mapping".to_owned(),
        "sequence" => "a list".to_owned(),
        "unit value" | "null" => "null".to_owned(),
        other => other.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        population_size: Option<u64>,
        step: Option<u32>,
        rate: Option<f64>,
        flag: Option<bool>,
        #[serde(default, deserialize_with = "mode")]
        optimize_mode: Option<String>,
        inner: Option<Inner>,
        kind: Option<Kind>,
        points: Option<Vec<Inner>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        n_startup_jobs: Option<u64>,
        #[serde(default, deserialize_with = "liar")]
        liar: Option<String>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Kind {
        Knob,
        Nni,
    }

    /// A custom deserializer's message, which names its key (as the tuners' `optimize_mode`).
    fn mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let value = Value::deserialize(d)?;
        Err(serde::de::Error::custom(format!(
            "optimize_mode must be \"maximize\" or \"minimize\", got {value}"
        )))
    }

    fn liar<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        let value = Value::deserialize(d)?;
        Err(serde::de::Error::custom(format!(
            "liar must be \"best\" or null, got {value}"
        )))
    }

    fn check(args: Value, expect: Expect) {
        let error = parse_class_args::<Args>("Tuner", &args).unwrap_err();
        expect.assert_eq(error.message());
    }

    #[test]
    fn a_bad_argument_is_named_by_its_path_and_the_type_in_words() {
        check(
            json!({"population_size": -3}),
            expect!["classArgs of Tuner: population_size: expected a whole number ≥ 0, got -3"],
        );
        check(
            json!({"population_size": "32"}),
            expect![[
                r#"classArgs of Tuner: population_size: expected a whole number ≥ 0, got "32""#
            ]],
        );
        check(
            json!({"step": 1.5}),
            expect![
                "classArgs of Tuner: step: expected a whole number from 0 to 4294967295, got 1.5"
            ],
        );
        check(
            json!({"rate": "fast"}),
            expect![[r#"classArgs of Tuner: rate: expected a number, got "fast""#]],
        );
        check(
            json!({"flag": "yes"}),
            expect![[r#"classArgs of Tuner: flag: expected true or false, got "yes""#]],
        );
        check(
            json!({"inner": {"n_startup_jobs": -5}}),
            expect![
                "classArgs of Tuner: inner.n_startup_jobs: expected a whole number ≥ 0, got -5"
            ],
        );
        check(
            json!({"inner": "bad"}),
            expect![[r#"classArgs of Tuner: inner: expected a mapping, got "bad""#]],
        );
        check(
            json!({"points": [{}, {"n_startup_jobs": true}]}),
            expect!["classArgs of Tuner: points[1].n_startup_jobs: expected a whole number ≥ 0, got true"],
        );
        check(
            json!({"points": {"a": 1}}),
            expect!["classArgs of Tuner: points: expected a list, got a mapping"],
        );
        check(
            json!({"kind": 3}),
            expect!["classArgs of Tuner: kind: expected a name (a string), got 3"],
        );
        check(
            json!(5),
            expect!["classArgs of Tuner: expected a mapping, got 5"],
        );
    }

    #[test]
    fn messages_that_name_their_key_keep_their_words() {
        check(
            json!({"optimze_mode": "max"}),
            expect!["classArgs of Tuner: unknown field `optimze_mode`, expected one of `population_size`, `step`, `rate`, `flag`, `optimize_mode`, `inner`, `kind`, `points`"],
        );
        check(
            json!({"inner": {"n_startup": 1}}),
            expect!["classArgs of Tuner: inner: unknown field `n_startup`, expected `n_startup_jobs` or `liar`"],
        );
        check(
            json!({"kind": "optuna"}),
            expect!["classArgs of Tuner: kind: unknown variant `optuna`, expected `knob` or `nni`"],
        );
        check(
            json!({"optimize_mode": "max"}),
            expect![[
                r#"classArgs of Tuner: optimize_mode must be "maximize" or "minimize", got "max""#
            ]],
        );
        // Nested, the key's own name gives way to its path.
        check(
            json!({"inner": {"liar": 1}}),
            expect![[r#"classArgs of Tuner: inner.liar must be "best" or null, got 1"#]],
        );
    }
}
