//! Does a parameters object belong to a space? Used when a user adds a trial by hand and before
//! encoding imported results.

use serde_json::{Map, Value};

use super::parse::{quote, quote_list};
use super::{one_line, ParamType, Parameter, SearchSpace, SpaceError};

pub(super) fn validate_parameters(space: &SearchSpace, params: &Value) -> Result<(), SpaceError> {
    match params {
        Value::Object(map) => check_space(space, map, "", false),
        other => Err(SpaceError::Parameters(format!(
            "must be a JSON object of parameter values, got {}",
            quote(other)
        ))),
    }
}

fn check_space(
    space: &SearchSpace,
    map: &Map<String, Value>,
    prefix: &str,
    nested: bool,
) -> Result<(), SpaceError> {
    for p in space.parameters() {
        match map.get(&p.name) {
            Some(value) => check_value(p, value)?,
            None => {
                return Err(SpaceError::value(
                    &p.path,
                    format!("missing; the search space has it as {}", p.ty),
                ))
            }
        }
    }
    // Every parameter of the space is in `map` (above), so a key outside it shows in the count.
    // Looked up one by one, every key walked the whole space: a suggestion over 40 000
    // parameters took 6.5 s to check.
    let own_keys = map.len() - usize::from(nested && map.contains_key("_name"));
    if own_keys <= space.len() {
        return Ok(());
    }
    let known: std::collections::HashSet<&str> =
        space.parameters().iter().map(Parameter::name).collect();
    for key in map.keys() {
        if (nested && key == "_name") || known.contains(key.as_str()) {
            continue;
        }
        let names: Vec<&str> = space.parameters().iter().map(|p| p.name()).collect();
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}/{key}")
        };
        let expected = if names.is_empty() {
            "nothing is expected here".to_owned()
        } else {
            format!("expected only [{}]", one_line(&names))
        };
        return Err(SpaceError::value(
            &path,
            format!("not in the search space; {expected}"),
        ));
    }
    Ok(())
}

fn check_value(p: &Parameter, value: &Value) -> Result<(), SpaceError> {
    let err = |message: String| Err(SpaceError::value(&p.path, message));
    let ty = &p.ty;
    match ty {
        ParamType::Choice { values } => {
            if values.iter().any(|c| json_eq(c, value)) {
                return Ok(());
            }
            err(format!(
                "{} is not one of the choice's values {}",
                quote(value),
                quote_list(values)
            ))
        }
        ParamType::NestedChoice { options } => {
            let chosen = value
                .get("_name")
                .and_then(Value::as_str)
                .and_then(|name| options.iter().find(|o| o.name == name));
            match (value.as_object(), chosen) {
                (Some(map), Some(option)) => check_space(
                    &option.space,
                    map,
                    &format!("{}/{}", p.path, option.name),
                    true,
                ),
                _ => {
                    let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
                    err(format!(
                        "expected an object {{\"_name\": one of [{}], ...}}, got {}",
                        one_line(&names),
                        quote(value)
                    ))
                }
            }
        }
        ParamType::RandInt { low, high } => match as_integer(value) {
            Some(v) if (*low..*high).contains(&v) => Ok(()),
            _ => err(format!(
                "expected an integer in [{low}, {high}) (randint), got {}",
                quote(value)
            )),
        },
        _ => {
            let Some(x) = value.as_f64() else {
                return err(format!("expected a number ({ty}), got {}", quote(value)));
            };
            if let Some((low, high)) = ty.bounds() {
                if !(low <= x && x <= high) {
                    return err(format!("{} is outside {ty}", quote(value)));
                }
                // Rounding then clipping puts low and high themselves in the range.
                if x == low || x == high {
                    return Ok(());
                }
            }
            match ty {
                ParamType::LogNormal { .. } if x <= 0.0 => {
                    return err(format!("{} is not > 0 ({ty})", quote(value)))
                }
                ParamType::QLogNormal { .. } if x < 0.0 => {
                    return err(format!("{} is not >= 0 ({ty})", quote(value)))
                }
                _ => {}
            }
            match ty.q() {
                Some(q) if !is_multiple(x, q) => {
                    err(format!("{} is not a multiple of q ({ty})", quote(value)))
                }
                _ => Ok(()),
            }
        }
    }
}

/// Whether `x` is `k * q` for an integer k, up to the float error of computing `k * q` (a user
/// writes 0.3 where NNI produced 0.30000000000000004).
fn is_multiple(x: f64, q: f64) -> bool {
    let k = (x / q).round_ties_even();
    (x - k * q).abs() <= 1e-9 * x.abs().max(q)
}

/// JSON equality where numbers compare by value (`1 == 1.0`): YAML, Python and JavaScript
/// disagree about which integers are floats.
pub(super) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x == y
            } else if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                x == y
            } else {
                x.as_f64() == y.as_f64()
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, a)| y.get(k).is_some_and(|b| json_eq(a, b)))
        }
        _ => a == b,
    }
}

/// An integer: a JSON integer, or a float with no fractional part (YAML writes `1.0`), within
/// `i64`.
pub(super) fn as_integer(v: &Value) -> Option<i64> {
    if let Some(i) = v.as_i64() {
        return Some(i);
    }
    let f = v.as_f64()?;
    // 2^63 is exact in f64; anything in [-2^63, 2^63) converts without saturating.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    (f.fract() == 0.0 && (-TWO_63..TWO_63).contains(&f)).then_some(f as i64)
}
