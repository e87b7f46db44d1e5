//! CMAES: the covariance matrix adaptation evolution strategy with IPOP restarts (Auger and
//! Hansen, 2005), over the numeric parameters in [`UnitCube`] coordinates. NNI has no CMA-ES;
//! this follows the tutorial's defaults ([`strategy`]) and Optuna's `CmaEsSampler` in spirit.
//!
//! - Numeric parameters (the uniform and normal families, randint) form CMA-ES's vector in
//!   `[0, 1]^d`: log types in log space, the normal family through its distribution function;
//!   integers and q-types are treated as continuous and rounded when a point is decoded. Draws
//!   outside the cube are redrawn a few times, then clipped.
//! - Categorical parameters (choice, nested choice) are not in the vector: each is drawn on its
//!   own from the values of the best quarter of the results so far (at most 16 of them), every
//!   value keeping weight 1 and each of those results adding 3, so nothing is ruled out. Uniform
//!   before the first result. Parameters of an unchosen nested option are ignored.
//! - A generation is λ points (`population_size`, default `4 + ⌊3 ln d⌋`, at most 65536); the distribution is
//!   updated once λ of them have results. A trial that ends without a result counts as the worst.
//!   More trials running than λ draw from the same distribution; results of an earlier
//!   generation arrive too late to update it and only inform the categorical choice.
//! - IPOP: when the distribution converges (step below 1e-6 of a range), degenerates, stays flat
//!   for many generations, or keeps proposing points already tried, the search restarts from a
//!   random mean with `sigma0` and a population twice as large.
//! - No point is handed out twice; when the distribution keeps repeating points even after a
//!   restart, an unseen random or grid point is taken instead (`NoMore` once a finite space is
//!   used up).
//! - Resume: imported trials are replayed: the tuner regenerates what it would have suggested
//!   and, when that is the imported point, takes the result as if it had just arrived; so a run
//!   resumed with its sequential history suggests exactly what the uninterrupted run would.
//!   Other imported points (another seed, another tuner) are injected into the current
//!   generation with their distance from the mean clipped (Hansen, 2011).

mod strategy;

use std::collections::BTreeMap;

use knob_plugin_api::space::{seeded_rng, SearchSpace, SeededRng};
use knob_plugin_api::{log, parse_class_args, Generated, ImportedTrial, PluginError, Tuner};
use rand::Rng;
use serde::Deserialize;
use serde_json::Value;

use crate::common::args::{optimize_mode, OptimizeMode};
use crate::common::history::canonical;
use crate::common::observed::loss;
use crate::common::seed::{seed, seed_or_entropy, SeedNotice};
use crate::common::unit_cube::{Axis, UnitCube};
use crate::common::unseen::Unseen;
use strategy::Strategy;

const NAME: &str = "CMAES";
/// Draws from the distribution tried before it counts as stuck on points already handed out.
const DUPLICATE_DRAWS: usize = 20;
/// The largest population: IPOP's doublings stop here, and a larger `population_size` is
/// refused, as one generation's draws are held in memory at once (λ vectors of d numbers).
const MAX_POPULATION: usize = 1 << 16;
/// At most this many of the best results shape the categorical draws.
const CATEGORICAL_ELITE: usize = 16;

/// CMA-ES with IPOP restarts; see the module documentation.
#[derive(Debug)]
pub struct CmaEsTuner {
    settings: Settings,
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    /// One stream for the whole run: replaying imported trials repeats every draw in order.
    rng: SeededRng,
    cube: Option<UnitCube>,
    /// The cube dimensions CMA-ES models (everything but choices), in order.
    numeric: Vec<usize>,
    unseen: Unseen,
    run: Option<Run>,
    /// Every result: parameters, their point in the current cube (if they fit it), loss.
    observations: Vec<(Value, Option<Vec<f64>>, f64)>,
    /// Handed-out points without a result: parameter id → (generation, CMA-ES vector).
    pending: BTreeMap<u64, (u64, Vec<f64>)>,
}

#[derive(Debug, Clone)]
struct Settings {
    mode: OptimizeMode,
    sigma0: f64,
    population: Option<usize>,
}

/// One CMA-ES run between restarts.
#[derive(Debug, Clone)]
struct Run {
    strategy: Strategy,
    restarts: u32,
    /// Counts generations over all runs, so a late result is never mistaken for a current one.
    generation: u64,
    finished: Vec<(Vec<f64>, f64)>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CmaEsArgs {
    #[serde(default, deserialize_with = "optimize_mode")]
    optimize_mode: Option<OptimizeMode>,
    #[serde(default, deserialize_with = "seed")]
    seed: Option<u64>,
    sigma0: Option<f64>,
    population_size: Option<u64>,
}

impl CmaEsTuner {
    /// The seed in use, given or drawn: `classArgs: {seed: <it>}` replays this run.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

fn invalid_arg(message: impl std::fmt::Display) -> PluginError {
    PluginError::new(format!("classArgs of {NAME}: {message}"))
}

impl Tuner for CmaEsTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args: CmaEsArgs = parse_class_args(NAME, class_args)?;
        let sigma0 = match args.sigma0 {
            None => 0.2,
            Some(s) if s > 0.0 && s <= 1.0 => s,
            Some(s) => {
                return Err(invalid_arg(format!(
                    "sigma0 is a fraction of each parameter's range, in (0, 1]; got {s}"
                )))
            }
        };
        let population = match args.population_size {
            None => None,
            Some(p) if (2..=MAX_POPULATION as u64).contains(&p) => Some(p as usize),
            Some(p) => {
                return Err(invalid_arg(format!(
                    "population_size must be a whole number from 2 to {MAX_POPULATION}, got {p}"
                )))
            }
        };
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed);
        Ok(CmaEsTuner {
            settings: Settings {
                // Maximize, as knob's core reads an absent optimize_mode for a tuner NNI does
                // not have (`Direction::default_for`), so "best" is what it optimises for.
                mode: args.optimize_mode.unwrap_or(OptimizeMode::Maximize),
                sigma0,
                population,
            },
            seed,
            seed_notice,
            rng: seeded_rng(seed),
            cube: None,
            numeric: Vec::new(),
            unseen: Unseen::default(),
            run: None,
            observations: Vec::new(),
            pending: BTreeMap::new(),
        })
    }

    /// Takes the new space and starts a fresh distribution in it; results stay known.
    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        let cube = UnitCube::new(space);
        self.numeric = (0..cube.len())
            .filter(|&i| !matches!(cube.axes()[i], Axis::Categorical { .. }))
            .collect();
        if self.numeric.is_empty() && !cube.axes().is_empty() {
            log::warn(&format!(
                "{NAME}: the search space has only choices; they are drawn from the best results so far (TPE models them better)"
            ));
        }
        for observation in &mut self.observations {
            observation.1 = cube.encode(&observation.0).ok();
        }
        self.cube = Some(cube);
        self.run = None;
        self.pending.clear();
        self.unseen.reset_grid();
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        if self.cube.is_none() {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        }
        Ok(match self.ask() {
            Some((params, vector, generation)) => {
                self.pending.insert(parameter_id, (generation, vector));
                Generated::Parameters(params)
            }
            None => Generated::NoMore,
        })
    }

    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        let loss = loss(value, self.settings.mode);
        self.observe(parameters, loss);
        match self.pending.remove(&parameter_id) {
            Some((generation, vector)) => self.tell(generation, vector, loss),
            // A trial this tuner did not generate (one re-run after a resume).
            None => self.inject(parameters, loss),
        }
        Ok(())
    }

    /// A trial that ended without a result counts as the worst, so its generation completes.
    fn trial_end(&mut self, parameter_id: u64, _status: &str) -> Result<(), PluginError> {
        if let Some((generation, vector)) = self.pending.remove(&parameter_id) {
            self.tell(generation, vector, f64::INFINITY);
        }
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        if self.cube.is_none() {
            return Err(PluginError::new(format!(
                "{NAME}: import_data before the search space; the space is needed to replay"
            )));
        }
        let mut replayed = 0;
        for trial in trials {
            // One that ended without a result counts as the worst, as `trial_end` counted it.
            let loss = loss(trial.value, self.settings.mode);
            let before = (self.rng.clone(), self.run.clone());
            match self.ask() {
                // One that runs again is pending, as it was: its result arrives under its id.
                Some((params, vector, generation))
                    if !trial.has_ended() && canonical(&params) == canonical(&trial.parameters) =>
                {
                    self.unseen.insert(&trial.parameters);
                    if let Some(id) = trial.parameter_id {
                        self.pending.insert(id, (generation, vector));
                    }
                    replayed += 1;
                }
                Some((params, vector, generation))
                    if canonical(&params) == canonical(&trial.parameters) =>
                {
                    self.observe(&trial.parameters, loss);
                    self.tell(generation, vector, loss);
                    replayed += 1;
                }
                _ if !trial.has_ended() => {
                    (self.rng, self.run) = before;
                    self.unseen.insert(&trial.parameters);
                }
                _ => {
                    (self.rng, self.run) = before;
                    self.unseen.insert(&trial.parameters);
                    self.observe(&trial.parameters, loss);
                    self.inject(&trial.parameters, loss);
                }
            }
        }
        log::info(&format!(
            "{NAME}: imported {} trials, {replayed} of them replayed exactly",
            trials.len()
        ));
        Ok(())
    }
}

impl CmaEsTuner {
    fn observe(&mut self, parameters: &Value, loss: f64) {
        self.unseen.insert(parameters);
        let point = self.cube.as_ref().and_then(|c| c.encode(parameters).ok());
        self.observations.push((parameters.clone(), point, loss));
    }

    /// The current run, started on first use.
    fn run(&mut self) -> &mut Run {
        if self.run.is_none() {
            let dims = self.numeric.len();
            let run = Run {
                strategy: Strategy::new(
                    vec![0.5; dims],
                    self.settings.sigma0,
                    self.base_population(),
                ),
                restarts: 0,
                generation: 0,
                finished: Vec::new(),
            };
            self.run = Some(run);
        }
        self.run.as_mut().expect("just set")
    }

    fn base_population(&self) -> usize {
        let dims = self.numeric.len().max(1) as f64;
        self.settings
            .population
            .unwrap_or(4 + (3.0 * dims.ln()).floor() as usize)
    }

    /// IPOP: a new run from a random mean with twice the population.
    fn restart(&mut self, reason: &str) {
        let dims = self.numeric.len();
        let base = self.base_population();
        let (restarts, generation) = {
            let run = self.run();
            (run.restarts + 1, run.generation + 1)
        };
        let population = base
            .saturating_mul(1usize << restarts.min(16))
            .min(MAX_POPULATION);
        let mean: Vec<f64> = (0..dims).map(|_| self.rng.gen::<f64>()).collect();
        log::info(&format!(
            "{NAME}: restart {restarts} ({reason}); population {population}"
        ));
        self.run = Some(Run {
            strategy: Strategy::new(mean, self.settings.sigma0, population),
            restarts,
            generation,
            finished: Vec::new(),
        });
    }

    /// The next point to try, its CMA-ES vector and generation; `None` when a finite space has
    /// no unseen point left.
    fn ask(&mut self) -> Option<(Value, Vec<f64>, u64)> {
        for attempt in 0..2 {
            for _ in 0..DUPLICATE_DRAWS {
                let mut rng = self.rng.clone();
                let run = self.run();
                let vector = run.strategy.sample(&mut rng);
                let generation = run.generation;
                let point = self.assemble(&vector, &mut rng);
                self.rng = rng;
                let cube = self.cube.as_ref()?;
                let Ok(params) = cube.decode(&point) else {
                    continue;
                };
                if self.unseen.insert(&params) {
                    return Some((params, vector, generation));
                }
            }
            if attempt == 0 {
                self.restart("its draws keep repeating points already tried");
            }
        }
        let cube = self.cube.as_ref()?;
        let params = self.unseen.pick(NAME, cube.space(), &mut self.rng, [])?;
        let vector = self.vector_of(&params)?;
        let run = self.run.as_ref()?;
        Some((params, run.strategy.clip_injected(&vector), run.generation))
    }

    /// A full cube point: the numeric dimensions from `vector`, categorical ones drawn from the
    /// best results, unchosen nested options emptied.
    fn assemble(&self, vector: &[f64], rng: &mut SeededRng) -> Vec<f64> {
        let Some(cube) = &self.cube else {
            return Vec::new();
        };
        let mut point = vec![f64::NAN; cube.len()];
        for (&dim, &x) in self.numeric.iter().zip(vector) {
            point[dim] = x;
        }
        let mut elite: Vec<(&Vec<f64>, f64)> = self
            .observations
            .iter()
            .filter_map(|(_, p, loss)| Some((p.as_ref()?, *loss)))
            .collect();
        elite.sort_by(|a, b| a.1.total_cmp(&b.1));
        elite.truncate((elite.len() / 4).clamp(1, CATEGORICAL_ELITE));
        for (dim, axis) in cube.axes().iter().enumerate() {
            if let Axis::Categorical { size } = *axis {
                let mut weights = vec![1.0; size as usize];
                for (p, _) in &elite {
                    if let Some(w) = weights
                        .get_mut(p[dim] as usize)
                        .filter(|_| !p[dim].is_nan())
                    {
                        *w += 3.0;
                    }
                }
                point[dim] = draw_index(&weights, rng) as f64;
            }
        }
        cube.repair(&mut point, rng);
        point
    }

    /// The CMA-ES vector of a parameters object (an inactive numeric dimension at the centre).
    fn vector_of(&self, params: &Value) -> Option<Vec<f64>> {
        let point = self.cube.as_ref()?.encode(params).ok()?;
        Some(
            self.numeric
                .iter()
                .map(|&d| if point[d].is_nan() { 0.5 } else { point[d] })
                .collect(),
        )
    }

    /// A result for a point of `generation`: updates the distribution once λ are in.
    fn tell(&mut self, generation: u64, vector: Vec<f64>, loss: f64) {
        let run = self.run();
        if generation != run.generation {
            return;
        }
        run.finished.push((vector, loss));
        if run.finished.len() < run.strategy.population() {
            return;
        }
        let finished = std::mem::take(&mut run.finished);
        run.strategy.tell(&finished);
        run.generation += 1;
        if let Some(reason) = run.strategy.stop_reason() {
            self.restart(reason);
        }
    }

    /// A result for a point the distribution did not propose, joined to the current generation.
    fn inject(&mut self, parameters: &Value, loss: f64) {
        let Some(vector) = self.vector_of(parameters) else {
            return;
        };
        let run = self.run();
        let clipped = run.strategy.clip_injected(&vector);
        let generation = run.generation;
        self.tell(generation, clipped, loss);
    }
}

/// An index drawn with probability proportional to `weights` (all positive).
fn draw_index(weights: &[f64], rng: &mut SeededRng) -> usize {
    let total: f64 = weights.iter().sum();
    let mut target = rng.gen::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if target < *w {
            return i;
        }
        target -= w;
    }
    weights.len().saturating_sub(1)
}
