//! Never handing out a point twice: the first unseen candidate, else fresh random draws, else
//! the next unseen point of NNI's grid walk (as NNI's `Deduplicator`), else nothing is left.

use knob_plugin_api::log;
use knob_plugin_api::space::{SearchSpace, SeededRng};
use serde_json::Value;

use super::grid::Grid;
use super::history::History;

/// Random draws tried once a tuner's own candidates all repeat earlier points.
const RANDOM_DRAWS: usize = 32;

/// Every point handed out or imported, and the grid walk that finds unseen ones when a tuner's
/// model keeps proposing known points (a small discrete space, or a converged model).
#[derive(Debug, Default)]
pub(crate) struct Unseen {
    history: History,
    grid: Option<Grid>,
}

impl Unseen {
    /// Records a point as seen (handed out or imported); `false` when it already was.
    pub(crate) fn insert(&mut self, params: &Value) -> bool {
        self.history.insert(params)
    }

    /// Restarts the grid walk (after a change of search space); seen points stay seen.
    pub(crate) fn reset_grid(&mut self) {
        self.grid = None;
    }

    /// The first of `candidates` not seen before, else the first unseen of a few random draws
    /// from `space`, else the next unseen grid point; recorded as seen. `None`: every point of a
    /// finite space has been handed out.
    pub(crate) fn pick(
        &mut self,
        tuner: &str,
        space: &SearchSpace,
        rng: &mut SeededRng,
        candidates: impl IntoIterator<Item = Value>,
    ) -> Option<Value> {
        if self.grid.as_ref().is_some_and(Grid::is_exhausted) {
            return None;
        }
        for params in candidates {
            if self.history.insert(&params) {
                return Some(params);
            }
        }
        for _ in 0..RANDOM_DRAWS {
            let params = space.sample(rng);
            if self.history.insert(&params) {
                return Some(params);
            }
        }
        let grid = self.grid.get_or_insert_with(|| {
            log::info(&format!(
                "{tuner}: its candidates and {RANDOM_DRAWS} random draws all repeated earlier points; taking unseen points from a grid walk"
            ));
            Grid::new(space.clone())
        });
        while let Some(params) = grid.next_point() {
            if self.history.insert(&params) {
                return Some(params);
            }
        }
        log::info(&format!(
            "{tuner}: every point of the search space has been tried"
        ));
        None
    }
}
