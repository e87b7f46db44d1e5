//! A numeric encoding of parameters objects for model-based tuners (TPE, GP, evolution).
//!
//! One `f64` per parameter of [`SearchSpace::all_parameters`] (nested ones included). The value
//! is the parameter in the space where its prior is simple, like NNI's "formatted" parameters:
//!
//! | type | dimension | prior |
//! |---|---|---|
//! | choice, nested choice | index of the value, `0..size` | uniform over indices |
//! | randint | `value - low`, `0..size` | uniform over integers |
//! | (q)uniform | `(x - low) / (high - low)` in `[0, 1]` | uniform |
//! | (q)loguniform | `(ln x - ln low) / (ln high - ln low)` in `[0, 1]` | uniform |
//! | (q)normal | `(x - mu) / sigma`, clamped to `±MAX_Z` | standard normal |
//! | (q)lognormal | `(ln x - mu) / sigma`, clamped to `±MAX_Z` | standard normal |
//!
//! A sub-parameter of a nested-choice option that is not chosen is *inactive*: `encode` writes
//! NaN there and `decode` ignores whatever is there. [`Dim::condition`] says when a dimension is
//! active, so a tuner can model it only where it exists.

use serde_json::{Map, Value};

use super::check::{as_integer, json_eq};
use super::{quantize, standard_normal, ParamType, SearchSpace, SpaceError, MAX_Z};
use rand::Rng;

/// Maps parameters objects of one space to `Vec<f64>` and back. Owns a copy of the space.
#[derive(Debug, Clone, PartialEq)]
pub struct Encoding {
    space: SearchSpace,
    dims: Vec<Dim>,
}

/// One dimension of an [`Encoding`]: which parameter, what kind of number, when it is active.
#[derive(Debug, Clone, PartialEq)]
pub struct Dim {
    path: String,
    kind: DimKind,
    condition: Option<Condition>,
}

/// What kind of number a dimension holds; see the module docs for the mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DimKind {
    /// An unordered index `0..size` (choice, nested choice). Decoding rounds and clamps.
    Categorical { size: u64 },
    /// An ordered integer `0..size` (randint, offset by `low`). Decoding rounds and clamps.
    /// Exact while `size <= 2^53`, as f64 is.
    Integer { size: u64 },
    /// A real in `[0, 1]` (the uniform family). Decoding clamps, then applies q and the clip.
    Unit,
    /// A real whose prior is the standard normal (the normal family). Decoding clamps to
    /// `±MAX_Z`, then applies q.
    Gaussian,
}

/// A dimension is active when dimension `dim` (a nested choice, itself active) has chosen option
/// number `option`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Condition {
    /// Index of the nested choice's dimension; always before the conditioned dimension.
    pub dim: usize,
    /// Index of the option that activates the conditioned dimension.
    pub option: usize,
}

impl Dim {
    /// The parameter's path, as [`super::Parameter::path`].
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What kind of number the dimension holds.
    pub fn kind(&self) -> DimKind {
        self.kind
    }

    /// `None` for parameters that always exist; the enclosing nested choice otherwise.
    pub fn condition(&self) -> Option<Condition> {
        self.condition
    }
}

impl DimKind {
    /// The smallest and largest value `decode` distinguishes: `(0, size - 1)`, `(0, 1)` or
    /// `(-MAX_Z, MAX_Z)`. Values outside are clamped.
    pub fn range(self) -> (f64, f64) {
        match self {
            DimKind::Categorical { size } | DimKind::Integer { size } => {
                (0.0, size.saturating_sub(1) as f64)
            }
            DimKind::Unit => (0.0, 1.0),
            DimKind::Gaussian => (-MAX_Z, MAX_Z),
        }
    }
}

impl Encoding {
    /// The encoding of `space`.
    pub fn new(space: &SearchSpace) -> Encoding {
        let mut dims = Vec::new();
        add_dims(space, None, &mut dims);
        Encoding {
            space: space.clone(),
            dims,
        }
    }

    /// The dimensions: `dims()[i]` is `space().all_parameters()[i]`.
    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    /// Number of dimensions.
    pub fn len(&self) -> usize {
        self.dims.len()
    }

    /// Whether there is no dimension (an empty space).
    pub fn is_empty(&self) -> bool {
        self.dims.is_empty()
    }

    /// The space this encodes.
    pub fn space(&self) -> &SearchSpace {
        &self.space
    }

    /// Which dimensions of `vector` are active (their nested choices chose their option).
    pub fn active(&self, vector: &[f64]) -> Vec<bool> {
        let mut active = Vec::with_capacity(self.dims.len());
        for dim in &self.dims {
            let on = match dim.condition {
                None => true,
                Some(c) => {
                    let size = match self.dims[c.dim].kind {
                        DimKind::Categorical { size } => size,
                        _ => 0,
                    };
                    active[c.dim]
                        && vector
                            .get(c.dim)
                            .is_some_and(|&x| !x.is_nan() && to_index(x, size) == c.option as u64)
                }
            };
            active.push(on);
        }
        active
    }

    /// Draws a vector from the prior: a uniform index for categorical and integer dimensions,
    /// `U[0, 1)` for [`DimKind::Unit`], `N(0, 1)` for [`DimKind::Gaussian`], NaN where inactive.
    /// Its `decode` is distributed as [`SearchSpace::sample`]; model-based tuners start from it.
    pub fn sample_vector<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<f64> {
        let mut vector: Vec<f64> = Vec::with_capacity(self.dims.len());
        for dim in &self.dims {
            // A parent's NaN (inactive) never equals an option index.
            let active = dim
                .condition
                .is_none_or(|c| vector[c.dim] == c.option as f64);
            vector.push(match dim.kind {
                _ if !active => f64::NAN,
                DimKind::Categorical { size } | DimKind::Integer { size } => {
                    rng.gen_range(0..size) as f64
                }
                DimKind::Unit => rng.gen::<f64>(),
                DimKind::Gaussian => standard_normal(rng),
            });
        }
        vector
    }

    /// Encodes a parameters object (checked with [`SearchSpace::validate_parameters`] first).
    /// Inactive dimensions are NaN; active ones are finite.
    pub fn encode(&self, params: &Value) -> Result<Vec<f64>, SpaceError> {
        self.space.validate_parameters(params)?;
        let mut out = Vec::with_capacity(self.dims.len());
        encode_space(&self.space, params.as_object(), &mut out);
        Ok(out)
    }

    /// Decodes a vector into a parameters object as NNI hands it to a trial: indices rounded and
    /// clamped, reals clamped to their range, q-types rounded, the uniform family clipped. Any
    /// finite or infinite number is accepted in an active dimension; NaN only in inactive ones.
    pub fn decode(&self, vector: &[f64]) -> Result<Value, SpaceError> {
        if vector.len() != self.dims.len() {
            return Err(SpaceError::Encoding(format!(
                "has {} numbers, the search space has {} dimensions",
                vector.len(),
                self.dims.len()
            )));
        }
        let mut cursor = 0;
        let map = self.decode_space(&self.space, vector, &mut cursor, true)?;
        Ok(Value::Object(map))
    }

    fn decode_space(
        &self,
        space: &SearchSpace,
        vector: &[f64],
        cursor: &mut usize,
        active: bool,
    ) -> Result<Map<String, Value>, SpaceError> {
        let mut map = Map::new();
        for p in space.parameters() {
            let i = *cursor;
            *cursor += 1;
            let x = vector[i];
            if active && x.is_nan() {
                return Err(SpaceError::Encoding(format!(
                    "dimension {i} ({:?}) is NaN but active; only parameters of unchosen nested options may be NaN",
                    super::parse::shorten_name(&p.path)
                )));
            }
            match &p.ty {
                ParamType::NestedChoice { options } => {
                    let chosen = to_index(x, options.len() as u64) as usize;
                    for (k, option) in options.iter().enumerate() {
                        let on = active && k == chosen;
                        let sub = self.decode_space(&option.space, vector, cursor, on)?;
                        if on {
                            let mut obj = Map::new();
                            obj.insert("_name".to_owned(), Value::String(option.name.clone()));
                            obj.extend(sub);
                            map.insert(p.name.clone(), Value::Object(obj));
                        }
                    }
                }
                ty if active => {
                    map.insert(p.name.clone(), decode_scalar(ty, x));
                }
                _ => {}
            }
        }
        Ok(map)
    }
}

fn add_dims(space: &SearchSpace, condition: Option<Condition>, dims: &mut Vec<Dim>) {
    for p in space.parameters() {
        let kind = match &p.ty {
            ParamType::Choice { values } => DimKind::Categorical {
                size: values.len() as u64,
            },
            ParamType::NestedChoice { options } => DimKind::Categorical {
                size: options.len() as u64,
            },
            ParamType::RandInt { low, high } => DimKind::Integer {
                size: high.abs_diff(*low),
            },
            ty if ty.bounds().is_some() => DimKind::Unit,
            _ => DimKind::Gaussian,
        };
        let dim = dims.len();
        dims.push(Dim {
            path: p.path.clone(),
            kind,
            condition,
        });
        if let ParamType::NestedChoice { options } = &p.ty {
            for (option, o) in options.iter().enumerate() {
                add_dims(&o.space, Some(Condition { dim, option }), dims);
            }
        }
    }
}

/// Rounds to the nearest index in `0..size` (NaN gives 0).
fn to_index(x: f64, size: u64) -> u64 {
    if x.is_nan() {
        return 0;
    }
    // `as` saturates, and the clamp below keeps it in range.
    (x.round_ties_even().max(0.0) as u64).min(size.saturating_sub(1))
}

/// `params` is `None` below an unchosen option: every dimension there is NaN.
fn encode_space(space: &SearchSpace, params: Option<&Map<String, Value>>, out: &mut Vec<f64>) {
    for p in space.parameters() {
        let value = params.and_then(|m| m.get(&p.name));
        match &p.ty {
            ParamType::NestedChoice { options } => {
                let chosen = value.and_then(|v| v.get("_name")).and_then(|name| {
                    options
                        .iter()
                        .position(|o| json_eq(&o.name.as_str().into(), name))
                });
                out.push(chosen.map_or(f64::NAN, |k| k as f64));
                for (k, option) in options.iter().enumerate() {
                    let sub = if chosen == Some(k) {
                        value.and_then(Value::as_object)
                    } else {
                        None
                    };
                    encode_space(&option.space, sub, out);
                }
            }
            ty => out.push(value.map_or(f64::NAN, |v| encode_scalar(ty, v))),
        }
    }
}

fn encode_scalar(ty: &ParamType, value: &Value) -> f64 {
    let x = value.as_f64().unwrap_or(f64::NAN);
    let unit = |t: f64| t.clamp(0.0, 1.0);
    let z = |t: f64| t.clamp(-MAX_Z, MAX_Z);
    match *ty {
        ParamType::Choice { ref values } => values
            .iter()
            .position(|c| json_eq(c, value))
            .map_or(f64::NAN, |i| i as f64),
        ParamType::RandInt { low, .. } => {
            as_integer(value).map_or(f64::NAN, |v| (i128::from(v) - i128::from(low)) as f64)
        }
        ParamType::Uniform { low, high } | ParamType::QUniform { low, high, .. } => {
            unit((x - low) / (high - low))
        }
        ParamType::LogUniform { low, high } | ParamType::QLogUniform { low, high, .. } => {
            unit((x.ln() - low.ln()) / (high.ln() - low.ln()))
        }
        ParamType::Normal { mu, sigma } | ParamType::QNormal { mu, sigma, .. } => {
            z((x - mu) / sigma)
        }
        // A qlognormal value of 0 has ln = -inf: it clamps to -MAX_Z, which decodes back to 0
        // whenever q is not absurdly small.
        ParamType::LogNormal { mu, sigma } | ParamType::QLogNormal { mu, sigma, .. } => {
            z((x.ln() - mu) / sigma)
        }
        ParamType::NestedChoice { .. } => f64::NAN,
    }
}

fn decode_scalar(ty: &ParamType, x: f64) -> Value {
    let t = x.clamp(0.0, 1.0);
    let z = x.clamp(-MAX_Z, MAX_Z);
    let number = match *ty {
        ParamType::Choice { ref values } => {
            return values[to_index(x, values.len() as u64) as usize].clone()
        }
        ParamType::RandInt { low, high } => {
            let offset = to_index(x, high.abs_diff(low));
            // low + offset < high, so it fits in i64.
            return Value::from((i128::from(low) + i128::from(offset)) as i64);
        }
        ParamType::Uniform { low, high } | ParamType::QUniform { low, high, .. } => {
            low + t * (high - low)
        }
        ParamType::LogUniform { low, high } | ParamType::QLogUniform { low, high, .. } => {
            (low.ln() + t * (high.ln() - low.ln())).exp()
        }
        ParamType::Normal { mu, sigma } | ParamType::QNormal { mu, sigma, .. } => mu + sigma * z,
        ParamType::LogNormal { mu, sigma } | ParamType::QLogNormal { mu, sigma, .. } => {
            (mu + sigma * z).exp()
        }
        ParamType::NestedChoice { .. } => return Value::Null,
    };
    Value::from(quantize(number, ty.q(), ty.bounds()))
}
