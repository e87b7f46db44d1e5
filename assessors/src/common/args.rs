//! classArgs: read one by one, so that every message names the argument, says what it must be,
//! and an unknown name is refused with the known ones listed.

use std::ops::RangeInclusive;

use knob_plugin_api::{AssessorContext, PluginError};
use serde_json::{Map, Value};

/// Whether higher or lower intermediate results are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OptimizeMode {
    /// NNI's default for every assessor.
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

/// Which way an assessor judges: its own `optimize_mode` classArg when given (the user said so
/// for this assessor); otherwise the experiment's direction, which the host tells it through
/// `set_context` (the tuner's: minimize for TPE and Anneal), so that a TPE experiment's
/// improving losses are not stopped as "worse". Maximize (NNI's default) until told, and from
/// a host too old to tell.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Direction {
    mode: OptimizeMode,
    from_class_args: bool,
}

impl Direction {
    pub(crate) fn get(self) -> OptimizeMode {
        self.mode
    }

    /// Takes the experiment's direction, unless the classArgs gave one.
    pub(crate) fn follow(&mut self, context: &AssessorContext) {
        if !self.from_class_args {
            self.mode = match context.optimize_mode {
                knob_plugin_api::OptimizeMode::Maximize => OptimizeMode::Maximize,
                knob_plugin_api::OptimizeMode::Minimize => OptimizeMode::Minimize,
            };
        }
    }
}

/// A component's classArgs, being read.
pub(crate) struct ClassArgs {
    component: &'static str,
    args: Map<String, Value>,
}

impl ClassArgs {
    /// Refuses anything but an object (or null: no classArgs), and any name not in `known`.
    pub(crate) fn new(
        component: &'static str,
        class_args: &Value,
        known: &[&str],
    ) -> Result<ClassArgs, PluginError> {
        let args = match class_args {
            Value::Null => Map::new(),
            Value::Object(args) => args.clone(),
            other => {
                return Err(PluginError::new(format!(
                    "classArgs of {component} must be an object, got {other}"
                )))
            }
        };
        // serde_json's map is sorted: the first unknown name is the same every time.
        if let Some(unknown) = args.keys().find(|name| !known.contains(&name.as_str())) {
            return Err(PluginError::new(format!(
                "classArgs of {component}: unknown argument `{unknown}`; known: {}",
                known.join(", ")
            )));
        }
        Ok(ClassArgs { component, args })
    }

    /// "classArgs of <component>: <what>".
    pub(crate) fn error(&self, what: impl std::fmt::Display) -> PluginError {
        PluginError::new(format!("classArgs of {}: {what}", self.component))
    }

    /// A whole number in `range`, or `None` when absent (or null).
    pub(crate) fn whole_number(
        &self,
        name: &str,
        range: RangeInclusive<u32>,
    ) -> Result<Option<u32>, PluginError> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        let in_range = value
            .as_f64()
            .filter(|v| v.fract() == 0.0)
            .filter(|v| (f64::from(*range.start())..=f64::from(*range.end())).contains(v));
        // "of at least N" alone refused a value far above N (`grace_period: 1e11`) as if it
        // were below it: a value past the end is told the end.
        let past_the_end = value.as_f64().is_some_and(|v| v > f64::from(*range.end()));
        match in_range {
            Some(v) => Ok(Some(v as u32)),
            None if *range.end() == u32::MAX && !past_the_end => Err(self.error(format!(
                "{name} must be a whole number of at least {}, got {value}",
                range.start()
            ))),
            None => Err(self.error(format!(
                "{name} must be a whole number from {} to {}, got {value}",
                range.start(),
                range.end()
            ))),
        }
    }

    /// A finite number in `range`, or `None` when absent (or null).
    pub(crate) fn number(
        &self,
        name: &str,
        range: RangeInclusive<f64>,
    ) -> Result<Option<f64>, PluginError> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        match value.as_f64().filter(|v| range.contains(v)) {
            Some(v) => Ok(Some(v)),
            None if range.end().is_infinite() && range.start().is_infinite() => {
                Err(self.error(format!("{name} must be a number, got {value}")))
            }
            None if range.end().is_infinite() => Err(self.error(format!(
                "{name} must be a number of at least {}, got {value}",
                range.start()
            ))),
            None => Err(self.error(format!(
                "{name} must be a number from {} to {}, got {value}",
                range.start(),
                range.end()
            ))),
        }
    }

    /// NNI's `optimize_mode`; when absent, the experiment's direction once `set_context` tells
    /// it (see [`Direction`]). NNI's Medianstop only logs a warning for a misspelt mode and
    /// maximizes; a silent wrong direction stops the wrong trials, so knob refuses it.
    pub(crate) fn optimize_mode(&self) -> Result<Direction, PluginError> {
        let given = |mode| Direction {
            mode,
            from_class_args: true,
        };
        match self.get("optimize_mode") {
            None => Ok(Direction {
                mode: OptimizeMode::Maximize,
                from_class_args: false,
            }),
            Some(Value::String(s)) if s == "maximize" => Ok(given(OptimizeMode::Maximize)),
            Some(Value::String(s)) if s == "minimize" => Ok(given(OptimizeMode::Minimize)),
            Some(other) => Err(self.error(format!(
                "optimize_mode must be \"maximize\" or \"minimize\", got {other}"
            ))),
        }
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.args.get(name).filter(|v| !v.is_null())
    }
}
