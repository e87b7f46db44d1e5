//! NNI search spaces: parse, validate, sample, encode.
//!
//! A search space is NNI's JSON, `{"name": {"_type": T, "_value": [...]}, ...}`, with the ten
//! types `choice` (a value that is an object with `_name` opens a nested sub-space), `randint`,
//! `uniform`, `quniform`, `loguniform`, `qloguniform`, `normal`, `qnormal`, `lognormal` and
//! `qlognormal`. Semantics follow NNI's `hpo_utils` exactly: q-types are
//! `clip(round(x / q) * q, low, high)` (round half to even, like Python) for the uniform family and
//! unclipped for the normal family; log types sample in log space.
//!
//! - [`SearchSpace`] is the validated, typed model, in the JSON's key order.
//! - [`SearchSpace::sample`] draws a parameters object exactly as NNI hands it to a trial.
//! - [`Encoding`] maps parameters objects to numeric vectors and back, for model-based tuners.
//! - [`SearchSpace::validate_parameters`] checks that a parameters object belongs to the space.

mod check;
mod encode;
mod error;
mod parse;
mod sample;

use std::fmt;

use serde_json::Value;

pub use encode::{Condition, Dim, DimKind, Encoding};
pub use error::SpaceError;
pub use sample::{quantize, standard_normal};

/// The random number generator tuners should use: PCG64 is portable (same stream on every
/// platform and pointer width) and cheap to seed, so a seeded experiment replays exactly.
pub type SeededRng = rand_pcg::Pcg64;

/// A [`SeededRng`] from a 64-bit seed (expanded with `SeedableRng::seed_from_u64`).
pub fn seeded_rng(seed: u64) -> SeededRng {
    rand::SeedableRng::seed_from_u64(seed)
}

/// How many standard deviations from `mu` a normal-family value may lie.
///
/// The sampler never goes past ~8.6 sigma (Box–Muller on 53-bit uniforms), so a space is only
/// accepted when `mu ± MAX_Z * sigma` (and its `exp` for log types) is finite, and encodings clamp
/// standardised values to `[-MAX_Z, MAX_Z]`: no sample, encoding or decoding is ever infinite.
pub const MAX_Z: f64 = 10.0;

/// A validated search space: its parameters in the order the JSON gave them.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchSpace {
    params: Vec<Parameter>,
    /// The JSON it was read from, for plugins that hand the space on as written (NNI's
    /// dispatcher gets it in `IN` and `SS`).
    json: Value,
}

/// One parameter of a space: its name, its path and its type with arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Parameter {
    name: String,
    path: String,
    ty: ParamType,
}

/// A parameter's `_type` and its `_value` arguments, checked.
///
/// The uniform family guarantees `low < high` (and `0 < low` for log types), the normal family
/// `sigma > 0`, q-types `q > 0`, `randint` `low < high`, choices at least one value.
#[derive(Debug, Clone, PartialEq)]
pub enum ParamType {
    /// `choice` of plain JSON values (numbers, strings, anything but nested `_name` objects).
    Choice { values: Vec<Value> },
    /// `choice` whose values are `{"_name": ..., <sub-space>}` objects.
    NestedChoice { options: Vec<NestedOption> },
    /// `randint`: an integer in `[low, high)`.
    RandInt { low: i64, high: i64 },
    /// `uniform` on `[low, high]`.
    Uniform { low: f64, high: f64 },
    /// `quniform`: `clip(round(uniform(low, high) / q) * q, low, high)`.
    QUniform { low: f64, high: f64, q: f64 },
    /// `loguniform`: `exp(uniform(ln low, ln high))`.
    LogUniform { low: f64, high: f64 },
    /// `qloguniform`: `clip(round(loguniform(low, high) / q) * q, low, high)`.
    QLogUniform { low: f64, high: f64, q: f64 },
    /// `normal(mu, sigma)`, unbounded.
    Normal { mu: f64, sigma: f64 },
    /// `qnormal`: `round(normal(mu, sigma) / q) * q`, unclipped.
    QNormal { mu: f64, sigma: f64, q: f64 },
    /// `lognormal`: `exp(normal(mu, sigma))`.
    LogNormal { mu: f64, sigma: f64 },
    /// `qlognormal`: `round(exp(normal(mu, sigma)) / q) * q`, unclipped (may be 0).
    QLogNormal { mu: f64, sigma: f64, q: f64 },
}

/// One option of a nested choice: its `_name` and the sub-space that is active when it is chosen.
#[derive(Debug, Clone, PartialEq)]
pub struct NestedOption {
    name: String,
    space: SearchSpace,
}

impl SearchSpace {
    /// Parses and validates NNI search-space JSON text.
    pub fn parse(json: &str) -> Result<SearchSpace, SpaceError> {
        let value: Value =
            serde_json::from_str(json).map_err(|e| SpaceError::Json(e.to_string()))?;
        SearchSpace::from_value(&value)
    }

    /// Validates an already parsed JSON value (e.g. the `searchSpace` of a YAML config).
    pub fn from_value(value: &Value) -> Result<SearchSpace, SpaceError> {
        parse::space_from_value(value).map_err(|mut errors| errors.swap_remove(0))
    }

    /// [`SearchSpace::from_value`], with every error in the space (in the order its parameters
    /// are written, nested ones included) where it has any, not only the first.
    pub fn from_value_all(value: &Value) -> Result<SearchSpace, Vec<SpaceError>> {
        parse::space_from_value(value)
    }

    /// The JSON the space was read from, as written.
    pub fn json(&self) -> &Value {
        &self.json
    }

    /// The top-level parameters, in JSON key order.
    pub fn parameters(&self) -> &[Parameter] {
        &self.params
    }

    /// The top-level parameter called `name`.
    pub fn get(&self, name: &str) -> Option<&Parameter> {
        self.params.iter().find(|p| p.name == name)
    }

    /// Number of top-level parameters.
    pub fn len(&self) -> usize {
        self.params.len()
    }

    /// Whether the space has no parameter (NNI accepts `{}`; trials then get `{}`).
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Every parameter, nested ones included, depth first: a nested choice, then its options'
    /// sub-parameters in option order. This is NNI's `format_search_space` order and the order of
    /// [`Encoding`]'s dimensions.
    pub fn all_parameters(&self) -> Vec<&Parameter> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect<'a>(&'a self, out: &mut Vec<&'a Parameter>) {
        for p in &self.params {
            out.push(p);
            if let ParamType::NestedChoice { options } = &p.ty {
                for option in options {
                    option.space.collect(out);
                }
            }
        }
    }

    /// Draws a parameters object exactly as NNI hands it to a trial: `randint` gives a JSON
    /// integer, `choice` the chosen JSON value, a nested choice `{"_name": ..., <sub-values>}`.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> Value {
        Value::Object(
            self.params
                .iter()
                .map(|p| (p.name.clone(), p.sample(rng)))
                .collect(),
        )
    }

    /// Checks that `params` is a parameters object of this space: every parameter present (and
    /// only those), each value of its type and in its range, q-types on a multiple of q.
    pub fn validate_parameters(&self, params: &Value) -> Result<(), SpaceError> {
        check::validate_parameters(self, params)
    }

    /// The numeric encoding of this space, see [`Encoding`].
    pub fn encoding(&self) -> Encoding {
        Encoding::new(self)
    }
}

impl Parameter {
    /// The key in its (sub-)space's JSON object.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/`-separated path from the top: `lr`, or `optimizer/adam/lr` for parameter `lr` of option
    /// `adam` of nested choice `optimizer`. Unique within a space, used in every error message.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The type and its arguments.
    pub fn param_type(&self) -> &ParamType {
        &self.ty
    }

    /// Draws this parameter's value as NNI would put it in a trial's parameters.
    pub fn sample<R: rand::Rng + ?Sized>(&self, rng: &mut R) -> Value {
        sample::sample_type(&self.ty, rng)
    }
}

impl NestedOption {
    /// The option's `_name`, which trials receive as `{"_name": name, ...}`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameters that exist only when this option is chosen.
    pub fn space(&self) -> &SearchSpace {
        &self.space
    }
}

impl ParamType {
    /// The NNI `_type` string (`choice` for nested choices too).
    pub fn type_name(&self) -> &'static str {
        match self {
            ParamType::Choice { .. } | ParamType::NestedChoice { .. } => "choice",
            ParamType::RandInt { .. } => "randint",
            ParamType::Uniform { .. } => "uniform",
            ParamType::QUniform { .. } => "quniform",
            ParamType::LogUniform { .. } => "loguniform",
            ParamType::QLogUniform { .. } => "qloguniform",
            ParamType::Normal { .. } => "normal",
            ParamType::QNormal { .. } => "qnormal",
            ParamType::LogNormal { .. } => "lognormal",
            ParamType::QLogNormal { .. } => "qlognormal",
        }
    }

    /// Whether the type is a finite set of candidates (choice, nested choice, randint), as NNI's
    /// `ParameterSpec.categorical`.
    pub fn is_categorical(&self) -> bool {
        self.size().is_some()
    }

    /// Number of candidates of a categorical type; `None` for the continuous ones.
    pub fn size(&self) -> Option<u64> {
        match self {
            ParamType::Choice { values } => Some(values.len() as u64),
            ParamType::NestedChoice { options } => Some(options.len() as u64),
            ParamType::RandInt { low, high } => Some(high.abs_diff(*low)),
            _ => None,
        }
    }

    /// The quantum of a q-type.
    pub fn q(&self) -> Option<f64> {
        match self {
            ParamType::QUniform { q, .. }
            | ParamType::QLogUniform { q, .. }
            | ParamType::QNormal { q, .. }
            | ParamType::QLogNormal { q, .. } => Some(*q),
            _ => None,
        }
    }

    /// `[low, high]` of the uniform family (values are clipped to it); `None` otherwise.
    pub fn bounds(&self) -> Option<(f64, f64)> {
        match self {
            ParamType::Uniform { low, high }
            | ParamType::QUniform { low, high, .. }
            | ParamType::LogUniform { low, high }
            | ParamType::QLogUniform { low, high, .. } => Some((*low, *high)),
            _ => None,
        }
    }

    /// Whether the type is sampled in log space (the four `*log*` types).
    pub fn is_log(&self) -> bool {
        matches!(
            self,
            ParamType::LogUniform { .. }
                | ParamType::QLogUniform { .. }
                | ParamType::LogNormal { .. }
                | ParamType::QLogNormal { .. }
        )
    }

    /// Turns a raw float a tuner computed into a valid value of this type, NNI's
    /// `deformat_parameters` rule: q-types `round(x / q) * q`, then the uniform family is clipped to
    /// `[low, high]`; `randint` rounds and clips to `[low, high - 1]`. Choices return `x` as is.
    pub fn round_and_clip(&self, x: f64) -> f64 {
        match self {
            ParamType::RandInt { low, high } => {
                let x = if x.is_nan() { *low as f64 } else { x };
                // max/min, not clamp: clamp panics on a hand-built `low >= high`.
                x.round_ties_even()
                    .min(high.saturating_sub(1) as f64)
                    .max(*low as f64)
            }
            ParamType::Choice { .. } | ParamType::NestedChoice { .. } => x,
            _ => quantize(x, self.q(), self.bounds()),
        }
    }
}

impl fmt::Display for ParamType {
    /// `uniform [0, 1]`, `choice ["a", 2]`, `choice {conv, pool}` for a nested choice.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.type_name();
        match self {
            ParamType::Choice { values } => write!(f, "{name} {}", parse::list(values)),
            ParamType::NestedChoice { options } => {
                let names: Vec<&str> = options.iter().map(|o| o.name.as_str()).collect();
                write!(f, "{name} {{{}}}", one_line(&names))
            }
            ParamType::RandInt { low, high } => write!(f, "{name} [{low}, {high})"),
            ParamType::Uniform { low, high } | ParamType::LogUniform { low, high } => {
                write!(f, "{name} [{}, {}]", num(*low), num(*high))
            }
            ParamType::QUniform { low, high, q } | ParamType::QLogUniform { low, high, q } => {
                write!(f, "{name} [{}, {}] q={}", num(*low), num(*high), num(*q))
            }
            ParamType::Normal { mu, sigma } | ParamType::LogNormal { mu, sigma } => {
                write!(f, "{name} mu={} sigma={}", num(*mu), num(*sigma))
            }
            ParamType::QNormal { mu, sigma, q } | ParamType::QLogNormal { mu, sigma, q } => {
                write!(
                    f,
                    "{name} mu={} sigma={} q={}",
                    num(*mu),
                    num(*sigma),
                    num(*q)
                )
            }
        }
    }
}

/// Names joined by `, `, escaped so that a name holding a newline keeps messages on one line, each
/// cut as `parse::shorten_name` cuts it.
pub(crate) fn one_line(names: &[&str]) -> String {
    let escaped: Vec<String> = names
        .iter()
        .map(|n| parse::shorten_name(n).escape_debug().to_string())
        .collect();
    escaped.join(", ")
}

/// `3` for integral values, JSON's shortest form otherwise (`1e-5`, not Rust's `0.00001`).
fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        Value::from(x).to_string()
    }
}

impl fmt::Display for SearchSpace {
    /// One line per parameter (nested ones included): `path: type args`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for p in self.all_parameters() {
            writeln!(f, "{}: {}", p.path.escape_debug(), p.ty)?;
        }
        Ok(())
    }
}
