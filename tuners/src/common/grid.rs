//! NNI's grid walk (`nni/algorithms/hpo/gridsearch_tuner.py`, NNI 3.0), shared by GridSearch and
//! by Random's de-duplication fallback (NNI's `Deduplicator` does the same).
//!
//! Every parameter, nested ones included, is one *dimension* (in `SearchSpace::all_parameters`
//! order). A categorical dimension (choice, nested choice, randint) is the list of its indices. A
//! continuous one is a list of *fractions* in (0, 1) of its distribution: `x` stands for
//! `low + x (high - low)` in the uniform family (in log space for log types) and for the
//! `x`-quantile in the normal family; the value then gets NNI's rounding and clipping.
//!
//! The walk goes in rounds ("epochs"). Round 1 puts every continuous dimension at its midpoint
//! (fraction 1/2). Each later round halves every interval of fractions that can still give new
//! values, appending the midpoints (1/4, 3/4; then 1/8, 3/8, ...). A midpoint is kept only when its
//! value differs from the values on both sides (the ends 0 and 1 are never grid points, so they
//! count as different); an interval whose two ends give the same value is dropped. So q-types
//! stop once each of their values has a grid point, and a grid of only choices, integers and
//! q-types ends. Within a round, points are visited like an odometer over the active
//! dimensions (the last dimension fastest) and a point is skipped when every index in it comes
//! from an earlier round. A nested choice's sub-dimensions only move while their option is the
//! chosen one.
//!
//! Differences from NNI, all at the extremes of floating point:
//! - the normal family's standardized value is clamped to about ±8.21 sigma (the
//!   quantile of `1 - 2^-53`, the fraction closest to 1 an f64 holds), so both tails end alike.
//!   NNI compares against `-inf`/`+inf` at fractions 0 and 1, which makes its walk over a q-normal
//!   type go on until it crashes on `round(inf)`;
//! - an interval too narrow for its midpoint to lie strictly inside (in f64) is dropped, where
//!   NNI keeps adding the same fraction every round;
//! - a round that adds no fraction (possible with q-types) is passed over at once rather than
//!   walked through, which gives the same points.

use knob_plugin_api::log;
use knob_plugin_api::space::{Condition, ParamType, SearchSpace};
use serde_json::{Map, Value};

use super::quantile::standard_normal_quantile;

/// A position in NNI's grid walk over one search space.
#[derive(Debug)]
pub(crate) struct Grid {
    space: SearchSpace,
    dims: Vec<GridDim>,
    /// Index into each dimension's candidates; `None` before a round's first point.
    vector: Option<Vec<u64>>,
    /// Per dimension, how many candidates earlier rounds had.
    epoch_bar: Vec<u64>,
    round: u32,
    exhausted: bool,
}

#[derive(Debug)]
struct GridDim {
    ty: ParamType,
    /// The nested choice (and option) this dimension belongs to.
    condition: Option<Condition>,
    axis: Axis,
}

#[derive(Debug)]
enum Axis {
    /// Indices `0..size` of a choice, nested choice or randint.
    Categorical { size: u64 },
    /// Fractions in the order rounds added them, and the intervals still worth halving.
    Continuous {
        fractions: Vec<f64>,
        divisions: Vec<(f64, f64)>,
    },
}

impl GridDim {
    fn len(&self) -> u64 {
        match &self.axis {
            Axis::Categorical { size } => *size,
            Axis::Continuous { fractions, .. } => fractions.len() as u64,
        }
    }

    /// The value of candidate `index`; `Null` for a nested choice, whose object the caller builds.
    fn value(&self, index: u64) -> Value {
        match (&self.ty, &self.axis) {
            (ParamType::Choice { values }, _) => values[index as usize].clone(),
            // low + index < high, so it fits in i64.
            (ParamType::RandInt { low, .. }, _) => {
                Value::from((i128::from(*low) + i128::from(index)) as i64)
            }
            (ty, Axis::Continuous { fractions, .. }) => {
                Value::from(continuous_value(ty, fractions[index as usize]))
            }
            (_, Axis::Categorical { .. }) => Value::Null,
        }
    }
}

impl Grid {
    /// Round 1 of the walk over `space`.
    pub(crate) fn new(space: SearchSpace) -> Grid {
        let encoding = space.encoding();
        let dims: Vec<GridDim> = space
            .all_parameters()
            .into_iter()
            .zip(encoding.dims())
            .map(|(param, dim)| {
                let ty = param.param_type().clone();
                let axis = match ty.size() {
                    Some(size) => Axis::Categorical { size },
                    None => Axis::Continuous {
                        fractions: vec![0.5],
                        divisions: [(0.0, 0.5), (0.5, 1.0)]
                            .into_iter()
                            .filter(|&(l, r)| less(&ty, l, r))
                            .collect(),
                    },
                };
                GridDim {
                    ty,
                    condition: dim.condition(),
                    axis,
                }
            })
            .collect();
        let grid = Grid {
            epoch_bar: vec![0; dims.len()],
            space,
            dims,
            vector: None,
            round: 1,
            exhausted: false,
        };
        log::info(&format!("grid initialized, size: {}", grid.size_info()));
        grid
    }

    /// Whether every point of the grid has been visited (only possible when no dimension is
    /// continuous without a q).
    pub(crate) fn is_exhausted(&self) -> bool {
        self.exhausted
    }

    /// The next point of the walk as a parameters object, or `None` when the grid is used up.
    pub(crate) fn next_point(&mut self) -> Option<Value> {
        loop {
            if self.exhausted {
                return None;
            }
            self.advance();
            let Some(vector) = &self.vector else {
                self.refine();
                continue;
            };
            let old = vector
                .iter()
                .zip(&self.epoch_bar)
                .all(|(index, bar)| index < bar);
            if !old {
                return Some(self.parameters(vector));
            }
        }
    }

    /// NNI's `_next_vector`: the odometer step over the active dimensions.
    fn advance(&mut self) {
        let Some(vector) = &mut self.vector else {
            self.vector = Some(vec![0; self.dims.len()]);
            return;
        };
        let active = active_dims(&self.dims, vector);
        for i in (0..self.dims.len()).rev().filter(|&i| active[i]) {
            if vector[i] + 1 < self.dims[i].len() {
                vector[i] += 1;
                return;
            }
            vector[i] = 0;
        }
        self.vector = None;
    }

    /// NNI's `_next_grid`: halves the intervals of every continuous dimension, or marks the grid
    /// used up when no interval can give a new value any more.
    fn refine(&mut self) {
        loop {
            let mut updated = false;
            let mut grew = false;
            for (i, dim) in self.dims.iter_mut().enumerate() {
                self.epoch_bar[i] = dim.len();
                let Axis::Continuous { divisions, .. } = &dim.axis else {
                    continue;
                };
                let mut new_fractions = Vec::new();
                let mut new_divisions = Vec::new();
                for &(l, r) in divisions {
                    let mid = (l + r) / 2.0;
                    if !(l < mid && mid < r) {
                        continue;
                    }
                    let diff_l = less(&dim.ty, l, mid);
                    let diff_r = less(&dim.ty, mid, r);
                    // The ends 0 and 1 are no grid points, so a midpoint next to them is new even
                    // when its value equals the end's.
                    if (diff_l || l == 0.0) && (diff_r || r == 1.0) {
                        new_fractions.push(mid);
                        updated = true;
                    }
                    if diff_l {
                        new_divisions.push((l, mid));
                        updated |= l == 0.0;
                    }
                    if diff_r {
                        new_divisions.push((mid, r));
                        updated |= r == 1.0;
                    }
                }
                grew |= !new_fractions.is_empty();
                if let Axis::Continuous {
                    fractions,
                    divisions,
                } = &mut dim.axis
                {
                    fractions.extend(new_fractions);
                    *divisions = new_divisions;
                }
            }
            if !updated {
                log::info("search space has been fully explored");
                self.exhausted = true;
                return;
            }
            self.round += 1;
            if grew {
                log::info(&format!(
                    "grid subdivided (round {}), new size: {}",
                    self.round,
                    self.size_info()
                ));
                return;
            }
        }
    }

    /// The parameters object for `vector`, as a trial receives it.
    fn parameters(&self, vector: &[u64]) -> Value {
        let mut cursor = 0;
        Value::Object(self.build(&self.space, vector, &mut cursor, true))
    }

    /// Walks `space` in dimension order from `cursor`; emits values only when `active`.
    fn build(
        &self,
        space: &SearchSpace,
        vector: &[u64],
        cursor: &mut usize,
        active: bool,
    ) -> Map<String, Value> {
        let mut map = Map::new();
        for param in space.parameters() {
            let i = *cursor;
            *cursor += 1;
            let index = vector[i];
            match param.param_type() {
                ParamType::NestedChoice { options } => {
                    for (k, option) in options.iter().enumerate() {
                        let chosen = active && k as u64 == index;
                        let sub = self.build(option.space(), vector, cursor, chosen);
                        if chosen {
                            let mut object = Map::new();
                            object.insert(
                                "_name".to_owned(),
                                Value::String(option.name().to_owned()),
                            );
                            object.extend(sub);
                            map.insert(param.name().to_owned(), Value::Object(object));
                        }
                    }
                }
                _ if active => {
                    map.insert(param.name().to_owned(), self.dims[i].value(index));
                }
                _ => {}
            }
        }
        map
    }

    /// NNI's size message: `7` for one dimension, `(2×3) = 6` for several.
    fn size_info(&self) -> String {
        let sizes: Vec<u64> = self.dims.iter().map(GridDim::len).collect();
        if sizes.len() == 1 {
            return sizes[0].to_string();
        }
        let product = sizes
            .iter()
            .fold(1u128, |acc, &s| acc.saturating_mul(u128::from(s)));
        let factors: Vec<String> = sizes.iter().map(u64::to_string).collect();
        format!("({}) = {product}", factors.join("×"))
    }
}

/// NNI's `is_activated_in`, for every dimension: its nested choice is active and on its option.
fn active_dims(dims: &[GridDim], vector: &[u64]) -> Vec<bool> {
    let mut active = Vec::with_capacity(dims.len());
    for dim in dims {
        let on = match dim.condition {
            None => true,
            Some(c) => active[c.dim] && vector[c.dim] == c.option as u64,
        };
        active.push(on);
    }
    active
}

/// NNI's `_less`: whether fraction `x` of `ty` gives a smaller value than fraction `y`.
fn less(ty: &ParamType, x: f64, y: f64) -> bool {
    continuous_value(ty, x) < continuous_value(ty, y)
}

/// The value of a continuous type at fraction `x` of its distribution, rounded and clipped as
/// NNI's `deformat_parameters` does (NNI's `_cdf_inverse` then `_deformat_single_parameter`).
pub(crate) fn continuous_value(ty: &ParamType, x: f64) -> f64 {
    let z = || {
        let tail = -standard_normal_quantile(f64::EPSILON / 2.0);
        standard_normal_quantile(x).clamp(-tail, tail)
    };
    let raw = match *ty {
        ParamType::Uniform { low, high } | ParamType::QUniform { low, high, .. } => {
            low + (high - low) * x
        }
        ParamType::LogUniform { low, high } | ParamType::QLogUniform { low, high, .. } => {
            let (a, b) = (low.ln(), high.ln());
            (a + (b - a) * x).exp()
        }
        ParamType::Normal { mu, sigma } | ParamType::QNormal { mu, sigma, .. } => mu + sigma * z(),
        ParamType::LogNormal { mu, sigma } | ParamType::QLogNormal { mu, sigma, .. } => {
            (mu + sigma * z()).exp()
        }
        ParamType::Choice { .. } | ParamType::NestedChoice { .. } | ParamType::RandInt { .. } => x,
    };
    ty.round_and_clip(raw)
}
