//! The coordinates GP and CMA-ES search in: the search space's [`Encoding`] with every ordered
//! dimension mapped onto `[0, 1]`, so that one length scale or one step size means the same
//! thing in every direction.
//!
//! | encoding dimension | coordinate |
//! |---|---|
//! | (q)uniform, (q)loguniform (already `[0, 1]`, log types in log space) | unchanged |
//! | (q)normal, (q)lognormal (standardized, prior `N(0, 1)`) | `Φ(z)`: the prior becomes uniform |
//! | randint, `size` values | `index / (size - 1)`; decoding rounds to the nearest integer |
//! | choice, nested choice | the index itself, unordered |
//!
//! Inactive dimensions (parameters of an unchosen nested option) are NaN, as in the encoding.
//! q-types and integers are rounded only when a point is decoded; [`UnitCube::snap`] rounds a
//! point in place by decoding and encoding it again.

use knob_plugin_api::space::{Condition, DimKind, Encoding, SearchSpace, SpaceError, MAX_Z};
use rand::Rng;
use serde_json::Value;

use super::normal_tail::normal_cdf_precise;
use super::quantile::standard_normal_quantile;

/// What kind of coordinate one dimension is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Axis {
    /// A real in `[0, 1]`; `gaussian` when it is `Φ` of a normal-family parameter.
    Continuous { gaussian: bool },
    /// An integer `0..size` at `index / (size - 1)`: ordered, rounded on decoding.
    Integer { size: u64 },
    /// An unordered index `0..size`, stored as the index.
    Categorical { size: u64 },
}

impl Axis {
    /// The distance between neighbouring values in coordinate units (0 for continuous axes).
    pub(crate) fn resolution(self) -> f64 {
        match self {
            Axis::Continuous { .. } => 0.0,
            Axis::Integer { size } => 1.0 / (size.max(2) - 1) as f64,
            Axis::Categorical { .. } => 1.0,
        }
    }
}

/// The unit-cube view of one search space.
#[derive(Debug, Clone)]
pub(crate) struct UnitCube {
    encoding: Encoding,
    axes: Vec<Axis>,
    conditions: Vec<Option<Condition>>,
}

impl UnitCube {
    pub(crate) fn new(space: &SearchSpace) -> UnitCube {
        let encoding = space.encoding();
        let axes = encoding
            .dims()
            .iter()
            .map(|dim| match dim.kind() {
                DimKind::Unit => Axis::Continuous { gaussian: false },
                DimKind::Gaussian => Axis::Continuous { gaussian: true },
                DimKind::Integer { size } => Axis::Integer { size },
                DimKind::Categorical { size } => Axis::Categorical { size },
            })
            .collect();
        let conditions = encoding.dims().iter().map(|dim| dim.condition()).collect();
        UnitCube {
            encoding,
            axes,
            conditions,
        }
    }

    pub(crate) fn axes(&self) -> &[Axis] {
        &self.axes
    }

    pub(crate) fn len(&self) -> usize {
        self.axes.len()
    }

    pub(crate) fn space(&self) -> &SearchSpace {
        self.encoding.space()
    }

    /// A parameters object of the space as a point (NaN where inactive).
    pub(crate) fn encode(&self, params: &Value) -> Result<Vec<f64>, SpaceError> {
        let encoded = self.encoding.encode(params)?;
        Ok(encoded
            .iter()
            .zip(&self.axes)
            .map(|(&x, axis)| match *axis {
                _ if x.is_nan() => f64::NAN,
                Axis::Continuous { gaussian: false } | Axis::Categorical { .. } => x,
                Axis::Continuous { gaussian: true } => normal_cdf_precise(x),
                Axis::Integer { size } if size <= 1 => 0.0,
                Axis::Integer { size } => x / (size - 1) as f64,
            })
            .collect())
    }

    /// The parameters object a point stands for, rounded and clipped as NNI does. Every active
    /// coordinate must be a number (see [`UnitCube::repair`]).
    pub(crate) fn decode(&self, point: &[f64]) -> Result<Value, SpaceError> {
        let encoded: Vec<f64> = point
            .iter()
            .zip(&self.axes)
            .map(|(&u, axis)| match *axis {
                _ if u.is_nan() => f64::NAN,
                Axis::Continuous { gaussian: false } | Axis::Categorical { .. } => u,
                Axis::Continuous { gaussian: true } => {
                    standard_normal_quantile(u.clamp(0.0, 1.0)).clamp(-MAX_Z, MAX_Z)
                }
                Axis::Integer { size } => u * (size.max(1) - 1) as f64,
            })
            .collect();
        self.encoding.decode(&encoded)
    }

    /// The parameters object of `point` and the point it encodes back to (integers and q-types
    /// on their values, inactive dimensions NaN).
    pub(crate) fn snap(&self, point: &[f64]) -> Result<(Value, Vec<f64>), SpaceError> {
        let params = self.decode(point)?;
        let snapped = self.encode(&params)?;
        Ok((params, snapped))
    }

    /// Makes `point` consistent after a move: categorical coordinates become valid indices,
    /// ordered ones are clamped to `[0, 1]`, a dimension that became active gets a value drawn
    /// from its prior, one that became inactive becomes NaN.
    pub(crate) fn repair<R: Rng + ?Sized>(&self, point: &mut [f64], rng: &mut R) {
        for i in 0..self.len() {
            let active = self.conditions[i]
                .is_none_or(|c| !point[c.dim].is_nan() && point[c.dim] == c.option as f64);
            point[i] = if !active {
                f64::NAN
            } else if point[i].is_nan() {
                self.sample_axis(i, rng)
            } else {
                match self.axes[i] {
                    Axis::Categorical { size } => {
                        point[i].round().clamp(0.0, size.saturating_sub(1) as f64)
                    }
                    _ => point[i].clamp(0.0, 1.0),
                }
            };
        }
    }

    /// A point drawn from the prior (the decoded point is distributed as
    /// [`SearchSpace::sample`], up to the rounding of q-types).
    pub(crate) fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> Vec<f64> {
        let mut point = vec![f64::NAN; self.len()];
        self.repair(&mut point, rng);
        point
    }

    /// One coordinate drawn from the prior of dimension `i`.
    pub(crate) fn sample_axis<R: Rng + ?Sized>(&self, i: usize, rng: &mut R) -> f64 {
        match self.axes[i] {
            Axis::Continuous { .. } => rng.gen::<f64>(),
            Axis::Integer { size } if size <= 1 => 0.0,
            Axis::Integer { size } => rng.gen_range(0..size) as f64 / (size - 1) as f64,
            Axis::Categorical { size } => rng.gen_range(0..size.max(1)) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_plugin_api::space::seeded_rng;

    const SPACE: &str = r#"{
        "lr": {"_type": "qloguniform", "_value": [0.001, 1, 0.001]},
        "init": {"_type": "normal", "_value": [0, 2]},
        "layers": {"_type": "randint", "_value": [1, 5]},
        "opt": {"_type": "choice", "_value": [
            {"_name": "sgd", "m": {"_type": "uniform", "_value": [0, 1]}},
            {"_name": "adam"}]}
    }"#;

    #[test]
    fn samples_decode_into_the_space_and_snap_is_idempotent() {
        let space = SearchSpace::parse(SPACE).unwrap();
        let cube = UnitCube::new(&space);
        let mut rng = seeded_rng(3);
        for _ in 0..200 {
            let point = cube.sample(&mut rng);
            let (params, snapped) = cube.snap(&point).unwrap();
            space.validate_parameters(&params).unwrap();
            let (again, resnapped) = cube.snap(&snapped).unwrap();
            assert_eq!(params["layers"], again["layers"]);
            assert_eq!(params["lr"], again["lr"]);
            let (a, b) = (
                params["init"].as_f64().unwrap(),
                again["init"].as_f64().unwrap(),
            );
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
            for (x, y) in snapped.iter().zip(&resnapped) {
                assert!(x.is_nan() && y.is_nan() || (x - y).abs() < 1e-12);
            }
            // Exactly the chosen option's sub-parameter is present.
            let sgd = params["opt"]["_name"] == "sgd";
            assert_eq!(snapped[4].is_nan(), !sgd);
        }
    }
}
