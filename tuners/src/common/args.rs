//! classArgs that many tuners accept.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// NNI's `optimize_mode`. Tuners that do not look at results accept it and ignore it, so a
/// config can switch tuners without editing classArgs; a misspelt value is still an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptimizeMode {
    Maximize,
    Minimize,
}

/// For `#[serde(default, deserialize_with = "optimize_mode")]`: serde's own message for a bad
/// value ("unknown variant `max`") does not name the argument.
pub(crate) fn optimize_mode<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<OptimizeMode>, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s == "maximize" => Ok(Some(OptimizeMode::Maximize)),
        Some(Value::String(s)) if s == "minimize" => Ok(Some(OptimizeMode::Minimize)),
        Some(other) => Err(serde::de::Error::custom(format!(
            "optimize_mode must be \"maximize\" or \"minimize\", got {other}"
        ))),
    }
}
