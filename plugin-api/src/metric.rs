//! Decoding the metric values trials report, shared by the core (which hands the number to
//! tuners) and training services (which check a report before passing it on).
//!
//! NNI trials send a value as JSON text produced by `json_tricks`, which writes `NaN`,
//! `Infinity` and `-Infinity` as bare words that strict JSON (and serde_json) rejects; a
//! script that prints a float itself writes `nan`, `inf` or `-inf`, read the same way. A value
//! is a number, or an object whose `"default"` entry is the number tuners optimise; the object's
//! other entries are extra metrics for the user. The raw text is always stored as sent; this
//! module only extracts the default number.

use serde_json::Value;

/// The number a tuner sees, or why there is none.
pub fn default_value(raw: &str) -> Result<f64, String> {
    let value = parse_lenient(raw)?;
    let default = match &value {
        Value::Object(map) => map
            .get("default")
            .ok_or_else(|| format!("metric {} has no \"default\" entry", abbreviate(raw)))?,
        other => other,
    };
    number(default).ok_or_else(|| format!("metric {} is not a number", abbreviate(raw)))
}

/// Parses a metric value that may contain NaN / Infinity / -Infinity outside strings (and NNI's
/// double-encoded form: a JSON string that holds the JSON of the value).
pub fn parse_lenient(raw: &str) -> Result<Value, String> {
    let value = parse_json_lenient(raw)
        .map_err(|e| format!("metric {} is not JSON: {e}", abbreviate(raw)))?;
    match value {
        // NNI 2.x's file channel and some wrappers encode the value twice.
        Value::String(inner) if !is_sentinel(&inner) => match parse_json_lenient(&inner) {
            Ok(decoded) => Ok(decoded),
            Err(_) => Ok(Value::String(inner)),
        },
        other => Ok(other),
    }
}

/// Parses JSON text in which NaN, Infinity and -Infinity may appear outside strings (as Python's
/// `json` writes them); they become the strings [`NAN`], [`INF`] and [`NEG_INF`]. A whole text
/// may also be any spelling Python's `float()` reads as one of them (`nan`, `inf`, `-inf`,
/// `+Infinity`, any case), as `print(loss)` writes a loss that diverged.
pub fn parse_json_lenient(text: &str) -> Result<Value, serde_json::Error> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(e) => {
            if let Some(sentinel) = python_non_finite(text) {
                return Ok(Value::String(sentinel.into()));
            }
            if !text.contains(['N', 'I']) {
                return Err(e);
            }
            serde_json::from_str(&protect_non_finite(text))
        }
    }
}

/// The sentinel of a whole text that Python's `float()` reads as NaN or an infinity: `nan`,
/// `inf` or `infinity` in any case, with an optional sign. Only a whole value: inside an
/// object or a list the words stay JSON's (`NaN`, `Infinity`), which is what Python's `json`
/// writes there, so that a mistyped word in a dict is still an error.
fn python_non_finite(text: &str) -> Option<&'static str> {
    let text = text.trim();
    let (negative, word) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if word.eq_ignore_ascii_case("nan") {
        Some(NAN)
    } else if word.eq_ignore_ascii_case("inf") || word.eq_ignore_ascii_case("infinity") {
        Some(if negative { NEG_INF } else { INF })
    } else {
        None
    }
}

/// What `NaN` outside a string reads as in [`parse_json_lenient`]'s result.
pub const NAN: &str = "__knob_NaN__";
/// What `Infinity` outside a string reads as.
pub const INF: &str = "__knob_Infinity__";
/// What `-Infinity` outside a string reads as.
pub const NEG_INF: &str = "__knob_-Infinity__";

fn is_sentinel(s: &str) -> bool {
    s == NAN || s == INF || s == NEG_INF
}

fn number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) if s == NAN => Some(f64::NAN),
        Value::String(s) if s == INF => Some(f64::INFINITY),
        Value::String(s) if s == NEG_INF => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// Replaces the bare words NaN, Infinity and -Infinity outside JSON strings by sentinel
/// strings, so that serde_json can parse the rest.
fn protect_non_finite(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len() + 16);
    let mut in_string = false;
    let mut escaped = false;
    let mut rest = raw;
    while let Some(c) = rest.chars().next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        let replaced = [("-Infinity", NEG_INF), ("Infinity", INF), ("NaN", NAN)]
            .into_iter()
            .find(|(word, _)| rest.starts_with(word));
        if let Some((word, sentinel)) = replaced {
            out.push('"');
            out.push_str(sentinel);
            out.push('"');
            rest = &rest[word.len()..];
            continue;
        }
        if c == '"' {
            in_string = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

// A final result goes to a tuner that takes whole metrics (`Tuner::takes_whole_metrics`) with
// its parameters, as `{"$knob_metric": {"parameters": {...}, "metric": <the metric>}}`, and
// only to a tuner whose library said it does (`PluginModule::tuner_takes_whole_metrics`), so
// no tuner built before ever sees it. It cannot be a trial's parameters: `SearchSpace::parse`
// refuses a top-level parameter of that name.
pub(crate) const WHOLE_ENVELOPE_KEY: &str = "$knob_metric";

/// The JSON text of parameters with the whole metric (the host sends it; a plugin only
/// unwraps).
#[cfg(feature = "host")]
pub(crate) fn wrap_whole(parameters: &Value, metric: &Value) -> String {
    serde_json::json!({
        WHOLE_ENVELOPE_KEY: {"parameters": parameters, "metric": metric}
    })
    .to_string()
}

/// Splits what the host sent into parameters and the whole metric (`None` for anything else).
pub(crate) fn unwrap_whole(value: Value) -> Result<(Value, Option<Value>), String> {
    let Value::Object(mut outer) = value else {
        return Ok((value, None));
    };
    if outer.len() != 1 || !outer.contains_key(WHOLE_ENVELOPE_KEY) {
        return Ok((Value::Object(outer), None));
    }
    let Some(Value::Object(mut inner)) = outer.remove(WHOLE_ENVELOPE_KEY) else {
        return Err(format!("{WHOLE_ENVELOPE_KEY} is not an object"));
    };
    let parameters = inner.remove("parameters").unwrap_or(Value::Null);
    let metric = inner
        .remove("metric")
        .ok_or_else(|| format!("{WHOLE_ENVELOPE_KEY} has no metric"))?;
    Ok((parameters, Some(metric)))
}

fn abbreviate(raw: &str) -> String {
    const MAX: usize = 60;
    let trimmed = raw.trim();
    if trimmed.chars().count() <= MAX {
        format!("{trimmed:?}")
    } else {
        let head: String = trimmed.chars().take(MAX).collect();
        format!("{head:?}… ({} bytes)", trimmed.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_form_trials_send() {
        assert_eq!(default_value("0.5"), Ok(0.5));
        assert_eq!(default_value(r#"{"default": 2, "loss": 0.1}"#), Ok(2.0));
        assert_eq!(default_value(r#""0.25""#), Ok(0.25));
        assert_eq!(default_value(r#""{\"default\": 3}""#), Ok(3.0));
        assert!(default_value("NaN").unwrap().is_nan());
        assert_eq!(default_value("-Infinity"), Ok(f64::NEG_INFINITY));
        assert_eq!(
            default_value(r#"{"default": Infinity, "note": "NaN stays text"}"#),
            Ok(f64::INFINITY)
        );
        assert_eq!(parse_lenient(r#"{"note": "NaN"}"#).unwrap()["note"], "NaN");
    }

    #[test]
    fn lenient_json_reads_python_non_finite_numbers_outside_strings() {
        let value =
            parse_json_lenient(r#"{"a": NaN, "b": -Infinity, "c": "NaN\"Infinity"}"#).unwrap();
        assert_eq!(
            (value["a"].as_str(), value["b"].as_str()),
            (Some(NAN), Some(NEG_INF))
        );
        assert_eq!(value["c"], "NaN\"Infinity");
        assert_eq!(parse_json_lenient("Infinity").unwrap(), INF);
        assert!(parse_json_lenient("NaNa").is_err());
        assert!(parse_json_lenient("{oops").is_err());
    }

    #[test]
    fn a_whole_value_may_be_spelt_as_python_prints_a_non_finite_float() {
        // `print(f"KNOB_INTERMEDIATE {loss}")` of a diverged loss; `float()` reads each back.
        for (text, expected) in [
            ("nan", f64::NAN),
            ("-nan", f64::NAN),
            ("NAN", f64::NAN),
            ("inf", f64::INFINITY),
            ("+inf", f64::INFINITY),
            ("-inf", f64::NEG_INFINITY),
            ("infinity", f64::INFINITY),
            ("-Infinity", f64::NEG_INFINITY),
            ("+INFINITY", f64::INFINITY),
            (" -inf ", f64::NEG_INFINITY),
        ] {
            let read = default_value(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(
                read.total_cmp(&expected).is_eq() || (read.is_nan() && expected.is_nan()),
                "{text:?}: {read}"
            );
        }
        assert_eq!(parse_json_lenient("-inf").unwrap(), NEG_INF);
        // Only a whole value: JSON's own words inside an object, as before, and nothing else.
        assert!(parse_json_lenient(r#"{"default": nan}"#).is_err());
        assert!(parse_json_lenient(r#"{"default": inf}"#).is_err());
        for garbage in ["nana", "infinit", "in f", "--inf", "+-inf", "nan nan", "∞"] {
            assert!(default_value(garbage).is_err(), "{garbage:?}");
        }
    }

    #[test]
    fn garbage_gets_a_one_line_reason() {
        assert_eq!(
            default_value("hello"),
            Err("metric \"hello\" is not JSON: expected value at line 1 column 1".into())
        );
        assert_eq!(
            default_value(r#"{"loss": 1}"#),
            Err(r#"metric "{\"loss\": 1}" has no "default" entry"#.into())
        );
        assert_eq!(
            default_value("[1]"),
            Err("metric \"[1]\" is not a number".into())
        );
        // The largest numbers a float holds, and past them (knob_trial refuses such an int).
        assert_eq!(default_value(&format!("-1{}", "0".repeat(308))), Ok(-1e308));
        assert_eq!(
            default_value(&format!("1{}", "0".repeat(400))),
            Err(format!(
                "metric \"1{}\"… (401 bytes) is not JSON: number out of range at line 1 column 401",
                "0".repeat(59)
            ))
        );
        let long = "x".repeat(10_000);
        let err = default_value(&long).unwrap_err();
        assert!(err.len() < 200 && err.contains("(10000 bytes)"), "{err}");
    }
}
