//! JSON -> [`SearchSpace`], with NNI's validation rules (`nni/common/hpo_utils/validation.py`)
//! plus the checks NNI forgets (q > 0, empty choice, nested `_name`s) and the ones that keep every
//! sample finite.

use serde_json::{Map, Value};

use super::check::as_integer;
use super::{NestedOption, ParamType, Parameter, SearchSpace, SpaceError, MAX_Z};

/// Nested choices deeper than this are rejected: recursion stays bounded on hostile input.
const MAX_DEPTH: usize = 32;

/// Longest excerpt of user JSON quoted in an error message.
const MAX_QUOTE: usize = 120;

const TYPES: &str =
    "choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal";

/// The space, or every error in it, in the order its parameters are written (nested ones
/// included): a user fixes them all in one go.
pub(super) fn space_from_value(value: &Value) -> Result<SearchSpace, Vec<SpaceError>> {
    let Value::Object(map) = value else {
        return Err(vec![SpaceError::NotAnObject(quote(value))]);
    };
    let mut errors = Vec::new();
    let space = parse_space(map, "", 0, &mut errors);
    match errors.is_empty() {
        true => Ok(space),
        false => Err(errors),
    }
}

/// The parameters of `map` that are valid; the errors of the others go to `errors`.
fn parse_space(
    map: &Map<String, Value>,
    prefix: &str,
    depth: usize,
    errors: &mut Vec<SpaceError>,
) -> SearchSpace {
    let mut params = Vec::with_capacity(map.len());
    for (name, spec) in map {
        // Inside a nested choice the option's own `_name` sits beside its parameters.
        if depth > 0 && name == "_name" {
            continue;
        }
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if depth == 0
            && (name == crate::labeled::ENVELOPE_KEY
                || name == crate::objectives::ENVELOPE_KEY
                || name == crate::metric::WHOLE_ENVELOPE_KEY
                || crate::population::is_reserved(name))
        {
            // The names mark labeled parameters, outcomes and whole metrics crossing the ABI
            // (`crate::labeled`, `crate::objectives`, `crate::metric`).
            errors.push(SpaceError::param(
                &path,
                "this name is reserved by knob; rename the parameter".to_string(),
            ));
            continue;
        }
        match parse_param(&path, spec, depth, errors) {
            Ok(ty) => params.push(Parameter {
                name: name.clone(),
                path,
                ty,
            }),
            Err(error) => errors.push(error),
        }
    }
    SearchSpace {
        params,
        json: Value::Object(map.clone()),
    }
}

/// The argument list each `_type` takes, for messages.
fn shape(type_name: &str) -> &'static str {
    match type_name {
        "choice" => "[value, ...]",
        "randint" => "[low, high]",
        "uniform" | "loguniform" => "[low, high]",
        "quniform" | "qloguniform" => "[low, high, q]",
        "normal" | "lognormal" => "[mu, sigma]",
        _ => "[mu, sigma, q]",
    }
}

/// One parameter's type; the errors of the parameters of a nested choice's options go to
/// `errors` (the choice itself is then incomplete, and the space refused for them).
fn parse_param(
    path: &str,
    spec: &Value,
    depth: usize,
    errors: &mut Vec<SpaceError>,
) -> Result<ParamType, SpaceError> {
    let err = |message: String| SpaceError::param(path, message);
    let Value::Object(spec) = spec else {
        return Err(err(format!(
            "expected an object {{\"_type\": ..., \"_value\": [...]}}, got {}",
            quote(spec)
        )));
    };
    let type_name = match spec.get("_type") {
        None => return Err(err(format!("missing \"_type\"; expected one of {TYPES}"))),
        Some(Value::String(t)) if TYPES.split(", ").any(|known| known == t) => t.as_str(),
        Some(Value::String(t)) => {
            return Err(err(format!(
                "unknown _type {:?}; expected one of {TYPES}",
                shorten_name(t)
            )))
        }
        Some(other) => {
            return Err(err(format!(
                "\"_type\" must be a string, one of {TYPES}; got {}",
                quote(other)
            )))
        }
    };
    let shape = shape(type_name);
    let args = match spec.get("_value") {
        None => {
            return Err(err(format!(
                "missing \"_value\"; {type_name} needs \"_value\": {shape}"
            )))
        }
        Some(Value::Array(args)) => args,
        Some(other) => {
            return Err(err(format!(
                "\"_value\" must be a list {shape} for {type_name}, got {}",
                quote(other)
            )))
        }
    };
    if type_name == "choice" {
        return parse_choice(path, args, depth, errors);
    }

    let arity = if type_name.starts_with('q') { 3 } else { 2 };
    let got = quote_list(args);
    if args.len() != arity {
        return Err(err(format!(
            "{type_name} needs {arity} values {shape}, got {}: {got}",
            args.len()
        )));
    }
    if type_name == "randint" {
        return match (as_integer(&args[0]), as_integer(&args[1])) {
            (Some(low), Some(high)) if low < high => Ok(ParamType::RandInt { low, high }),
            (Some(_), Some(_)) => Err(err(format!(
                "randint needs low < high (it draws from [low, high)), got {got}"
            ))),
            _ => Err(err(format!(
                "randint needs integers [low, high] within 64 bits, got {got}"
            ))),
        };
    }
    let nums: Vec<f64> = args.iter().filter_map(Value::as_f64).collect();
    if nums.len() != arity || args.iter().any(|a| !a.is_number()) {
        return Err(err(format!("{type_name} needs numbers {shape}, got {got}")));
    }
    let (a, b) = (nums[0], nums[1]);
    let q = nums.get(2).copied();
    let log = type_name.contains("log");

    if type_name.contains("normal") {
        if b <= 0.0 {
            return Err(err(format!("{type_name} needs sigma > 0, got {got}")));
        }
        // Largest magnitude a sample (or a clamped encoding) can reach, in value space.
        let (lo, hi) = (a - MAX_Z * b, a + MAX_Z * b);
        let extreme = if log {
            // exp(lo) == 0 would give a lognormal value of 0, outside its own support.
            if !hi.exp().is_finite() || lo.exp() == 0.0 {
                return Err(err(format!(
                    "{type_name} needs exp(mu ± {MAX_Z}*sigma) to be positive and finite (mu - {MAX_Z}*sigma >= -744, mu + {MAX_Z}*sigma <= 709), got {got}"
                )));
            }
            hi.exp()
        } else {
            if !lo.is_finite() || !hi.is_finite() {
                return Err(err(format!(
                    "{type_name} needs mu ± {MAX_Z}*sigma to be finite, got {got}"
                )));
            }
            lo.abs().max(hi.abs())
        };
        check_q(path, type_name, q, extreme, &got)?;
        return Ok(match (log, q) {
            (false, None) => ParamType::Normal { mu: a, sigma: b },
            (false, Some(q)) => ParamType::QNormal { mu: a, sigma: b, q },
            (true, None) => ParamType::LogNormal { mu: a, sigma: b },
            (true, Some(q)) => ParamType::QLogNormal { mu: a, sigma: b, q },
        });
    }

    if log && !(0.0 < a && a < b) {
        return Err(err(format!("{type_name} needs 0 < low < high, got {got}")));
    }
    if a >= b {
        return Err(err(format!("{type_name} needs low < high, got {got}")));
    }
    if !(b - a).is_finite() {
        return Err(err(format!(
            "{type_name} needs high - low to be finite, got {got}"
        )));
    }
    check_q(path, type_name, q, a.abs().max(b.abs()), &got)?;
    Ok(match (log, q) {
        (false, None) => ParamType::Uniform { low: a, high: b },
        (false, Some(q)) => ParamType::QUniform { low: a, high: b, q },
        (true, None) => ParamType::LogUniform { low: a, high: b },
        (true, Some(q)) => ParamType::QLogUniform { low: a, high: b, q },
    })
}

/// `q > 0`, and small enough a q that `x / q` stays finite for the largest value of the range.
fn check_q(
    path: &str,
    type_name: &str,
    q: Option<f64>,
    extreme: f64,
    got: &str,
) -> Result<(), SpaceError> {
    let Some(q) = q else { return Ok(()) };
    if q <= 0.0 {
        return Err(SpaceError::param(
            path,
            format!("{type_name} needs q > 0, got {got}"),
        ));
    }
    if !(extreme / q).is_finite() {
        return Err(SpaceError::param(
            path,
            format!("{type_name} needs q large enough that value / q stays finite, got {got}"),
        ));
    }
    Ok(())
}

fn parse_choice(
    path: &str,
    args: &[Value],
    depth: usize,
    errors: &mut Vec<SpaceError>,
) -> Result<ParamType, SpaceError> {
    let err = |message: String| SpaceError::param(path, message);
    if args.is_empty() {
        return Err(err("choice needs at least one value, got []".to_owned()));
    }
    let has_name = |v: &Value| v.as_object().is_some_and(|o| o.contains_key("_name"));
    if !args.iter().any(has_name) {
        return Ok(ParamType::Choice {
            values: args.to_vec(),
        });
    }
    if depth + 1 >= MAX_DEPTH {
        return Err(err(format!(
            "nested choices are more than {MAX_DEPTH} levels deep"
        )));
    }
    let mut options: Vec<NestedOption> = Vec::with_capacity(args.len());
    for (i, arg) in args.iter().enumerate() {
        let (map, name) = match arg.as_object().map(|o| (o, o.get("_name"))) {
            Some((map, Some(Value::String(name)))) => (map, name),
            Some((_, Some(other))) => {
                return Err(err(format!(
                    "nested choice option {i} has \"_name\" {}; it must be a string",
                    quote(other)
                )))
            }
            _ => {
                return Err(err(format!(
                    "nested choice option {i} has no \"_name\" (got {}); when one choice value is an object with \"_name\", every value must be",
                    quote(arg)
                )))
            }
        };
        if let Some(first) = options.iter().position(|o| &o.name == name) {
            return Err(err(format!(
                "nested choice has two options named {:?} (options {first} and {i}); option names must be unique",
                shorten_name(name)
            )));
        }
        let space = parse_space(map, &format!("{path}/{name}"), depth + 1, errors);
        options.push(NestedOption {
            name: name.clone(),
            space,
        });
    }
    Ok(ParamType::NestedChoice { options })
}

/// A JSON value as compact one-line text, cut to [`MAX_QUOTE`] characters.
pub(super) fn quote(v: &Value) -> String {
    shorten(v.to_string())
}

/// `[a, b, c]` with a space after each comma, as messages quote `_value` lists.
pub(super) fn quote_list(values: &[Value]) -> String {
    shorten(list(values))
}

/// `[a, b, c]`, not shortened.
pub(super) fn list(values: &[Value]) -> String {
    let items: Vec<String> = values.iter().map(Value::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// A name from outside (a parameter's, an option's, a key a tuner handed out) as messages quote
/// it: cut to [`MAX_QUOTE`] characters as values are, since a tuner's key can be megabytes.
pub(crate) fn shorten_name(name: &str) -> String {
    match name.char_indices().nth(MAX_QUOTE) {
        Some((cut, _)) => format!("{}...", &name[..cut]),
        None => name.to_owned(),
    }
}

fn shorten(mut s: String) -> String {
    if s.chars().count() > MAX_QUOTE {
        let cut = s.char_indices().nth(MAX_QUOTE).map_or(s.len(), |(i, _)| i);
        s.truncate(cut);
        s.push_str("...");
    }
    s
}
