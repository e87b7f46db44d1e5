//! `optimize_mode`, as NNI's assessors accept it.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Whether higher or lower intermediate results are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OptimizeMode {
    /// NNI's default for every assessor.
    #[default]
    Maximize,
    Minimize,
}

impl OptimizeMode {
    /// `a` strictly better than `b`. NaN is never better than anything, nor worse.
    pub(crate) fn better(self, a: f64, b: f64) -> bool {
        match self {
            OptimizeMode::Maximize => a > b,
            OptimizeMode::Minimize => a < b,
        }
    }

    /// The best value of `values`, skipping NaN: a NaN intermediate result is never the best.
    /// `None` when there is no number at all.
    pub(crate) fn best(self, values: &[f64]) -> Option<f64> {
        values
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .reduce(|best, v| if self.better(v, best) { v } else { best })
    }

    /// "below" for maximize, "above" for minimize: where a worse value lies.
    pub(crate) fn worse_side(self) -> &'static str {
        match self {
            OptimizeMode::Maximize => "below",
            OptimizeMode::Minimize => "above",
        }
    }
}

/// For `#[serde(default, deserialize_with = "optimize_mode")]`: serde's own message for a bad
/// value ("unknown variant `max`") would not name the argument. NNI's Medianstop only logs a
/// warning for a misspelt mode and maximizes; a silent wrong direction stops the wrong trials,
/// so knob refuses it.
pub(crate) fn optimize_mode<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<OptimizeMode, D::Error> {
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(OptimizeMode::Maximize),
        Some(Value::String(s)) if s == "maximize" => Ok(OptimizeMode::Maximize),
        Some(Value::String(s)) if s == "minimize" => Ok(OptimizeMode::Minimize),
        Some(other) => Err(serde::de::Error::custom(format!(
            "optimize_mode must be \"maximize\" or \"minimize\", got {other}"
        ))),
    }
}
