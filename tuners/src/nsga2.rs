//! NSGA2: multi-objective evolution after Optuna's `NSGAIISampler` (Deb et al. 2002), with
//! Optuna's defaults: population 50, uniform crossover with probability 0.9 and swapping
//! probability 0.5, mutation probability 1/#parameters, constrained domination.
//!
//! Generations, as Optuna counts them: a trial belongs to the generation after the latest one
//! with at least `population_size` finished trials (generation 0 while none has). Generation 0
//! is random. The parent population of generation g+1 is the elite of the parents of g and the
//! finished trials of g: non-dominated ranks under constrained domination (a feasible trial
//! dominates an infeasible one, the smaller total violation wins between infeasible ones), the
//! last rank that does not fit cut by crowding distance after a shuffle. It is computed once,
//! when first needed, as Optuna caches it. A child: with probability `crossover_prob`, two
//! parents chosen by binary tournament (the dominating one of two random members) and each
//! top-level parameter taken from the second with probability `swapping_prob`; otherwise one
//! parent's parameters. Then each parameter is drawn afresh from the space with probability
//! `mutation_prob`. Failed trials and trials without a complete outcome take no part.
//!
//! Departures: parameters are crossed and mutated whole at the top level (a nested choice moves
//! with its sub-parameters); a child equal to a point already handed out is drawn again (up to
//! 16 times, then at random), since knob never hands out a point twice; on resume, imported
//! trials are put back into generations in parameter-id order. Each child draws from its own
//! stream `step_rng(seed, step)` (`step`: trials handed out or imported before it) and each
//! generation's elite from `step_rng(seed, u64::MAX - generation)`, not from one stream for the
//! run: a resumed run, whose import does not replay the draws, then continues as the
//! uninterrupted one with the same seed.

use std::collections::BTreeMap;

use knob_plugin_api::objectives::{constrained_dominates, non_dominated_ranks};
use knob_plugin_api::space::{SearchSpace, SeededRng};
use knob_plugin_api::{Generated, ImportedTrial, Outcome, PluginError, Tuner};
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{Map, Value};

use crate::common::args::ClassArgs;
use crate::common::history::History;
use crate::common::seed::{seed_or_entropy, step_rng, SeedNotice};

const REDRAWS: usize = 16;

#[derive(Debug)]
pub struct Nsga2Tuner {
    population_size: usize,
    mutation_prob: Option<f64>,
    crossover_prob: f64,
    swapping_prob: f64,
    seed: u64,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    space: Option<SearchSpace>,
    /// Every trial handed out or imported: its generation and parameters.
    trials: BTreeMap<u64, (usize, Value)>,
    /// Finished trials with a complete outcome.
    outcomes: BTreeMap<u64, Outcome>,
    /// `parents[g]`: the parent population of generation g+1, fixed once computed.
    parents: Vec<Vec<u64>>,
    history: History,
}

impl Nsga2Tuner {
    /// The generation a trial handed out now belongs to, computing parent populations up to it.
    fn current_generation(&mut self) -> usize {
        loop {
            let generation = self.parents.len();
            let finished: Vec<u64> = self
                .trials
                .iter()
                .filter(|(id, (g, _))| *g == generation && self.outcomes.contains_key(id))
                .map(|(id, _)| *id)
                .collect();
            if finished.len() < self.population_size {
                return generation;
            }
            let mut pool: Vec<u64> = self.parents.last().cloned().unwrap_or_default();
            pool.extend(finished);
            let elite = self.elite(pool, generation);
            self.parents.push(elite);
        }
    }

    /// The parent population of generation `generation + 1`.
    fn elite(&self, pool: Vec<u64>, generation: usize) -> Vec<u64> {
        let points: Vec<&Outcome> = pool.iter().map(|id| &self.outcomes[id]).collect();
        let ranks = non_dominated_ranks(&points);
        let mut elite = Vec::with_capacity(self.population_size);
        for rank in ranks {
            if elite.len() + rank.len() <= self.population_size {
                elite.extend(rank.iter().map(|&i| pool[i]));
                continue;
            }
            let mut members = rank;
            // Its own stream, apart from the children's (`u64::MAX - g` is never a step).
            members.shuffle(&mut step_rng(self.seed, u64::MAX - generation as u64));
            let distances =
                crowding_distances(&members.iter().map(|&i| points[i]).collect::<Vec<_>>());
            let mut order: Vec<usize> = (0..members.len()).collect();
            // Stable: the shuffle breaks ties among equal distances.
            order.sort_by(|&a, &b| distances[b].total_cmp(&distances[a]));
            let room = self.population_size - elite.len();
            elite.extend(order.into_iter().take(room).map(|k| pool[members[k]]));
            break;
        }
        elite
    }

    /// Binary tournament: of two distinct random members, the one that dominates, else either.
    fn tournament(&self, population: &[u64], rng: &mut SeededRng) -> u64 {
        if population.len() == 1 {
            return population[0];
        }
        let a = population[rng.gen_range(0..population.len())];
        let mut b = a;
        while b == a {
            b = population[rng.gen_range(0..population.len())];
        }
        let (oa, ob) = (&self.outcomes[&a], &self.outcomes[&b]);
        if constrained_dominates(oa, ob) {
            a
        } else if constrained_dominates(ob, oa) {
            b
        } else if rng.gen_bool(0.5) {
            a
        } else {
            b
        }
    }

    fn child(&self, space: &SearchSpace, parents: &[u64], rng: &mut SeededRng) -> Value {
        let first = self.tournament(parents, rng);
        let chosen: Value = if rng.gen::<f64>() < self.crossover_prob && parents.len() > 1 {
            let others: Vec<u64> = parents.iter().copied().filter(|&p| p != first).collect();
            let second = self.tournament(&others, rng);
            let (a, b) = (&self.trials[&first].1, &self.trials[&second].1);
            let mut child = Map::new();
            for parameter in space.parameters() {
                let from_second = rng.gen::<f64>() < self.swapping_prob;
                let source = if from_second { b } else { a };
                if let Some(value) = source.get(parameter.name()) {
                    child.insert(parameter.name().to_string(), value.clone());
                }
            }
            Value::Object(child)
        } else {
            self.trials[&first].1.clone()
        };
        let mutation_prob = self
            .mutation_prob
            .unwrap_or(1.0 / space.len().max(1) as f64);
        let mut out = Map::new();
        for parameter in space.parameters() {
            let inherited = chosen.get(parameter.name()).cloned();
            let keep = rng.gen::<f64>() >= mutation_prob;
            let value = match inherited {
                Some(value) if keep => value,
                _ => parameter.sample(rng),
            };
            out.insert(parameter.name().to_string(), value);
        }
        let out = Value::Object(out);
        // Parents from before an edit of the space may hold values it refuses: draw afresh.
        match space.validate_parameters(&out) {
            Ok(()) => out,
            Err(_) => space.sample(rng),
        }
    }
}

/// Crowding distance of each point (Deb et al.): the boundary points of each objective are
/// infinitely far, the others add the normalised gap between their neighbours.
fn crowding_distances(points: &[&Outcome]) -> Vec<f64> {
    let n = points.len();
    let mut distance = vec![0.0; n];
    let Some(first) = points.first() else {
        return distance;
    };
    for m in 0..first.losses.len() {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| points[a].losses[m].total_cmp(&points[b].losses[m]));
        let (low, high) = (points[order[0]].losses[m], points[order[n - 1]].losses[m]);
        distance[order[0]] = f64::INFINITY;
        distance[order[n - 1]] = f64::INFINITY;
        if high == low {
            continue;
        }
        for k in 1..n.saturating_sub(1) {
            let gap = points[order[k + 1]].losses[m] - points[order[k - 1]].losses[m];
            distance[order[k]] += gap / (high - low);
        }
    }
    distance
}

impl Tuner for Nsga2Tuner {
    fn takes_objectives() -> bool {
        true
    }

    fn new(class_args: &Value) -> Result<Self, PluginError> {
        let args = ClassArgs::new(
            "NSGA2",
            class_args,
            &[
                "seed",
                "population_size",
                "mutation_prob",
                "crossover_prob",
                "swapping_prob",
            ],
        )?;
        let population_size = args.integer("population_size", 50, 2, 1_000_000)? as usize;
        let probability = |name: &str, default: f64| {
            args.number(name, default, "a probability from 0 to 1", |p| {
                (0.0..=1.0).contains(&p)
            })
        };
        let mutation_prob = match class_args.get("mutation_prob") {
            None | Some(Value::Null) => None,
            Some(_) => Some(probability("mutation_prob", 0.0)?),
        };
        let crossover_prob = probability("crossover_prob", 0.9)?;
        let swapping_prob = probability("swapping_prob", 0.5)?;
        let (seed, seed_notice) = seed_or_entropy("NSGA2", args.seed()?);
        Ok(Nsga2Tuner {
            population_size,
            mutation_prob,
            crossover_prob,
            swapping_prob,
            seed,
            seed_notice,
            space: None,
            trials: BTreeMap::new(),
            outcomes: BTreeMap::new(),
            parents: Vec::new(),
            history: History::default(),
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.space = Some(space.clone());
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        let Some(space) = self.space.clone() else {
            return Err(PluginError::new(
                "NSGA2: asked for parameters before it was given a search space",
            ));
        };
        let generation = self.current_generation();
        let parents = match generation {
            0 => Vec::new(),
            g => self.parents[g - 1].clone(),
        };
        let mut rng = step_rng(self.seed, self.trials.len() as u64);
        let mut params = Value::Null;
        for _ in 0..REDRAWS {
            params = if parents.is_empty() {
                space.sample(&mut rng)
            } else {
                self.child(&space, &parents, &mut rng)
            };
            if self.history.insert(&params) {
                break;
            }
        }
        self.trials
            .insert(parameter_id, (generation, params.clone()));
        Ok(Generated::Parameters(params))
    }

    /// A scalar result (an experiment without `objectives`): one objective, maximised as NNI's
    /// default optimize_mode says; the host refuses NSGA2 nowhere, so it optimises the value.
    fn receive_trial_result(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        value: f64,
    ) -> Result<(), PluginError> {
        let outcome = Outcome {
            values: vec![value],
            losses: vec![-value],
            violations: Vec::new(),
        };
        self.receive_trial_outcome(parameter_id, parameters, &outcome)
    }

    fn receive_trial_outcome(
        &mut self,
        parameter_id: u64,
        parameters: &Value,
        outcome: &Outcome,
    ) -> Result<(), PluginError> {
        if !outcome.is_complete() {
            return Ok(());
        }
        if !self.trials.contains_key(&parameter_id) {
            let generation = self.current_generation();
            self.trials
                .insert(parameter_id, (generation, parameters.clone()));
        }
        self.outcomes.insert(parameter_id, outcome.clone());
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        let mut ordered: Vec<&ImportedTrial> = trials.iter().collect();
        ordered.sort_by_key(|t| t.parameter_id);
        let mut next_id = self.trials.keys().next_back().map_or(0, |id| id + 1);
        for trial in ordered {
            self.history.insert(&trial.parameters);
            let id = trial.parameter_id.unwrap_or_else(|| {
                next_id += 1;
                u64::MAX / 2 + next_id
            });
            let generation = self.current_generation();
            self.trials
                .insert(id, (generation, trial.parameters.clone()));
            let outcome = trial.objectives.clone().or_else(|| {
                trial.value.is_finite().then(|| Outcome {
                    values: vec![trial.value],
                    losses: vec![-trial.value],
                    violations: Vec::new(),
                })
            });
            if let Some(outcome) = outcome.filter(Outcome::is_complete) {
                self.outcomes.insert(id, outcome);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(losses: &[f64]) -> Outcome {
        Outcome::minimised(losses, &[])
    }

    #[test]
    fn crowding_distance_favours_the_ends_and_the_sparse() {
        let points = [
            outcome(&[0.0, 4.0]),
            outcome(&[1.0, 3.0]),
            outcome(&[1.1, 2.9]),
            outcome(&[4.0, 0.0]),
        ];
        let refs: Vec<&Outcome> = points.iter().collect();
        let d = crowding_distances(&refs);
        assert!(d[0].is_infinite() && d[3].is_infinite());
        assert!(d[2] > d[1], "{d:?}");
    }
}
