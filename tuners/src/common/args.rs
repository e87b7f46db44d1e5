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

/// classArgs read one at a time, for tuners whose arguments have ranges: every message names
/// the tuner and the argument and says what is allowed ("classArgs of Hyperband: eta must be a
/// whole number from 2 to 1000000, got 1.5").
pub(crate) struct ClassArgs {
    tuner: &'static str,
    map: serde_json::Map<String, Value>,
}

impl ClassArgs {
    /// `value` is the classArgs object (or null); a key not in `known` is an error listing them.
    pub(crate) fn new(
        tuner: &'static str,
        value: &Value,
        known: &[&str],
    ) -> Result<ClassArgs, knob_plugin_api::PluginError> {
        let map = match value {
            Value::Null => serde_json::Map::new(),
            Value::Object(map) => map.clone(),
            other => {
                return Err(knob_plugin_api::PluginError::new(format!(
                    "classArgs of {tuner} must be an object, got {other}"
                )))
            }
        };
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(knob_plugin_api::PluginError::new(format!(
                "classArgs of {tuner}: unknown argument {unknown:?}; {tuner} takes {}",
                known.join(", ")
            )));
        }
        Ok(ClassArgs { tuner, map })
    }

    fn error(&self, name: &str, expected: &str, got: &Value) -> knob_plugin_api::PluginError {
        knob_plugin_api::PluginError::new(format!(
            "classArgs of {}: {name} must be {expected}, got {got}",
            self.tuner
        ))
    }

    fn given(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    /// A whole number in `min..=max` (a float with no fraction counts, as YAML may write one).
    pub(crate) fn integer(
        &self,
        name: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> Result<u64, knob_plugin_api::PluginError> {
        let Some(value) = self.given(name) else {
            return Ok(default);
        };
        let whole = value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x <= u64::MAX as f64)
                .map(|x| x as u64)
        });
        match whole {
            Some(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(self.error(name, &format!("a whole number from {min} to {max}"), value)),
        }
    }

    /// A number accepted by `ok`, which `expected` describes ("a number above 0").
    pub(crate) fn number(
        &self,
        name: &str,
        default: f64,
        expected: &str,
        ok: impl Fn(f64) -> bool,
    ) -> Result<f64, knob_plugin_api::PluginError> {
        let Some(value) = self.given(name) else {
            return Ok(default);
        };
        match value.as_f64() {
            Some(x) if x.is_finite() && ok(x) => Ok(x),
            _ => Err(self.error(name, expected, value)),
        }
    }

    /// One of `options` (the first is the default).
    pub(crate) fn choice(
        &self,
        name: &str,
        options: &[&'static str],
    ) -> Result<&'static str, knob_plugin_api::PluginError> {
        let Some(value) = self.given(name) else {
            return Ok(options[0]);
        };
        options
            .iter()
            .find(|o| value.as_str() == Some(**o))
            .copied()
            .ok_or_else(|| {
                let quoted: Vec<String> = options.iter().map(|o| format!("{o:?}")).collect();
                self.error(name, &quoted.join(" or "), value)
            })
    }

    /// NNI's `optimize_mode`, `maximize` when absent.
    pub(crate) fn optimize_mode_or_maximize(
        &self,
    ) -> Result<OptimizeMode, knob_plugin_api::PluginError> {
        Ok(
            match self.choice("optimize_mode", &["maximize", "minimize"])? {
                "minimize" => OptimizeMode::Minimize,
                _ => OptimizeMode::Maximize,
            },
        )
    }

    /// knob's `seed` (absent: drawn and logged by `seed::seed_or_entropy`).
    pub(crate) fn seed(&self) -> Result<Option<u64>, knob_plugin_api::PluginError> {
        match self.given("seed") {
            None => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or_else(|| {
                self.error(
                    "seed",
                    &format!("a whole number from 0 to {}", u64::MAX),
                    value,
                )
            }),
        }
    }

    /// Whether the argument was given (not null).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.given(name).is_some()
    }
}
