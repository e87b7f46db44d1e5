//! `PBT`: population-based training with Ray Tune's `PopulationBasedTraining` semantics and
//! names (Jaderberg et al. 2017), run natively by the manager (issue 15).
//!
//! The first `population_size` parameter sets are members drawn from the search space. Each
//! member reports intermediate results ("steps"); the host hands them to
//! [`Tuner::receive_intermediate_result`] with whether the member had saved a checkpoint. As in
//! Ray, a member is judged when it has reported `perturbation_interval` steps since it was last
//! judged (and at least `burn_in_period` in all): its score at that step is its `last_score`,
//! and the members with a score are ranked. A member in the bottom `quantile_fraction` is
//! *exploited*: a member of the top quantile that has a checkpoint is chosen at random, and the
//! bottom one is stopped ([`Suggestion::stop`], recorded EARLY_STOPPED) and replaced by a new
//! trial, its successor, that starts from the top member's checkpoint (`KNOB_RESTORE_FROM`) with
//! the top member's parameters *explored*: each parameter is resampled from the space with
//! probability `resample_probability`, else a number is multiplied by one of
//! `perturbation_factors` (then rounded and clipped to the space, which Ray does not do) and a
//! `choice` moves to a neighbouring value. A top member that has not saved a checkpoint is never
//! cloned; when none has, nobody is replaced. With `synch: true` the members are judged together,
//! once every living member has reached its next interval.
//!
//! `max_steps` (knob's; Ray's is the run's `stop` criterion, checked before PBT decides) is the
//! number of steps a member trains for in all, its ancestors' included: a member that reached it
//! is not judged, since it is about to report its final result (a stop then would lose it), and
//! a member that reached it is no donor, since its successor would have no step left to run and
//! report its parent's result as its own. Without it PBT cannot tell a member's last step.
//!
//! Departures from Ray: members are processes, not paused actors, so in synchronous mode the
//! members that reached the barrier keep running until the others get there (their scores at the
//! barrier are the ones compared); and the step a successor counts from is the number of steps
//! its parent had reported when it was cloned (`Lineage::parent_step`), the checkpoint being at
//! least that far.
//!
//! Resume: every member is labeled (`m<slot>-<parameter id>`), so the host imports all of them
//! whatever their state. Members that run again keep their slot and their step count (their
//! lineage's `parent_step` plus the results they reported in all attempts, both imported), and
//! are judged at the steps they would have been without the resume (a score from before it is
//! not known: until its next judgment the member is not ranked); a slot whose last member was
//! stopped before its successor was created is filled by the next id the host asks for once a
//! donor is known (a top member's report, or the next exploitation, fills an id the tuner
//! deferred).

use std::collections::{BTreeMap, VecDeque};

use knob_plugin_api::population::{Intermediate, Lineage};
use knob_plugin_api::space::{ParamType, SearchSpace, SeededRng};
use knob_plugin_api::{log, status, Generated, ImportedTrial, PluginError, Suggestion, Tuner};
use rand::Rng;
use serde_json::{Map, Value};

use crate::common::args::{ClassArgs, OptimizeMode};
use crate::common::seed::{seed_or_entropy, SeedNotice};

const NAME: &str = "PBT";

#[derive(Debug, Clone)]
struct Member {
    slot: u64,
    parameters: Value,
    /// Steps counted before this attempt of the member: its parent's when it was cloned, and
    /// its own results in its earlier attempts (a retry, or the run after a resume, goes on from
    /// its own checkpoint, and the host numbers its results from 0 again).
    base: u64,
    /// Steps reported in all (`base` + this attempt's results).
    time: u64,
    /// The last `Intermediate::step` heard in this attempt: a step not above it begins the next.
    last_step: Option<u64>,
    last_perturbation_time: u64,
    /// Larger is better (minimised metrics are negated); NaN reads as the worst.
    last_score: Option<f64>,
    has_checkpoint: bool,
    /// Not ended and not being replaced.
    alive: bool,
    /// Ended SUCCEEDED: its checkpoint is kept (the host deletes those of members that were
    /// replaced or failed once no member it knows of starts from them).
    succeeded: bool,
}

#[derive(Debug, Clone)]
struct Successor {
    slot: u64,
    parameters: Value,
    lineage: Lineage,
}

#[derive(Debug)]
pub struct PbtTuner {
    population_size: u64,
    perturbation_interval: u64,
    burn_in_period: u64,
    /// The steps a member trains for in all (`max_steps`), when the config says.
    max_steps: Option<u64>,
    quantile_fraction: f64,
    resample_probability: f64,
    perturbation_factors: Vec<f64>,
    synch: bool,
    mode: OptimizeMode,
    rng: SeededRng,
    /// A drawn seed's log line, said once the tuner is asked for parameters.
    seed_notice: SeedNotice,
    space: Option<SearchSpace>,
    members: BTreeMap<u64, Member>,
    slots_created: u64,
    successors: VecDeque<Successor>,
    /// Slots whose member was replaced before a successor was created (only after a resume),
    /// with the member it replaces.
    vacant: VecDeque<(u64, u64)>,
    /// Ids answered with `Deferred`, oldest first.
    deferred: VecDeque<u64>,
    ready: Vec<Suggestion>,
    /// Synchronous mode: the perturbation time every living member has passed.
    barrier: u64,
    /// Whether the log said, once, that members are ranked before the population is complete.
    warned_partial_population: bool,
}

fn factors(args: &Value) -> Result<Vec<f64>, PluginError> {
    let given = args.get("perturbation_factors").filter(|v| !v.is_null());
    let Some(value) = given else {
        return Ok(vec![1.2, 0.8]);
    };
    let list: Option<Vec<f64>> = value
        .as_array()
        .filter(|a| !a.is_empty())
        .and_then(|a| a.iter().map(Value::as_f64).collect());
    match list {
        Some(list) if list.iter().all(|f| f.is_finite() && *f > 0.0) => Ok(list),
        _ => Err(PluginError::new(format!(
            "classArgs of {NAME}: perturbation_factors must be a list of numbers above 0, such as [1.2, 0.8], got {value}"
        ))),
    }
}

impl PbtTuner {
    fn score(&self, value: f64) -> f64 {
        let oriented = match self.mode {
            OptimizeMode::Maximize => value,
            OptimizeMode::Minimize => -value,
        };
        if oriented.is_nan() {
            f64::NEG_INFINITY
        } else {
            oriented
        }
    }

    /// Ray's `_quantiles`: the living members with a score, worst first; `n` is
    /// `ceil(len * quantile_fraction)`, at most half of them.
    fn quantiles(&mut self) -> (Vec<u64>, Vec<u64>) {
        let mut ranked: Vec<(u64, f64)> = self
            .members
            .iter()
            .filter(|(_, m)| m.alive)
            .filter_map(|(id, m)| Some((*id, m.last_score?)))
            .collect();
        if ranked.len() <= 1 {
            return (Vec::new(), Vec::new());
        }
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        let len = ranked.len();
        if self.slots_created < self.population_size && !self.warned_partial_population {
            // Members are processes side by side: with fewer places than members, the first
            // ones are ranked among themselves while the rest have not started (and start only
            // as others end), which is not population-based training any more.
            self.warned_partial_population = true;
            log::warn(&format!(
                "{NAME}: ranking {len} members while only {} of population_size {} have started: members beyond trialConcurrency start only when one ends (and none beyond maxTrialNumber); make both at least {}",
                self.slots_created, self.population_size, self.population_size
            ));
        }
        let mut n = (len as f64 * self.quantile_fraction).ceil() as usize;
        if n > len / 2 {
            n = len / 2;
        }
        let ids: Vec<u64> = ranked.into_iter().map(|(id, _)| id).collect();
        (ids[..n].to_vec(), ids[len - n..].to_vec())
    }

    /// Ray's `_explore` over the search space's top-level parameters.
    fn explore(&mut self, parameters: &Value) -> Value {
        let Some(space) = &self.space else {
            return parameters.clone();
        };
        let mut out = Map::new();
        for param in space.parameters() {
            let current = parameters.get(param.name()).cloned().unwrap_or(Value::Null);
            let resample = self.rng.gen::<f64>() < self.resample_probability;
            let factor =
                self.perturbation_factors[self.rng.gen_range(0..self.perturbation_factors.len())];
            let value = match param.param_type() {
                _ if resample => param.sample(&mut self.rng),
                ParamType::Choice { values } => match values.iter().position(|v| *v == current) {
                    Some(index) => {
                        let up = self.rng.gen_bool(0.5);
                        let next = if up {
                            (index + 1).min(values.len() - 1)
                        } else {
                            index.saturating_sub(1)
                        };
                        values[next].clone()
                    }
                    None => param.sample(&mut self.rng),
                },
                ParamType::NestedChoice { .. } => current,
                ParamType::RandInt { .. } => match current.as_f64() {
                    Some(x) => Value::from(param.param_type().round_and_clip(x * factor) as i64),
                    None => param.sample(&mut self.rng),
                },
                ty => match current.as_f64() {
                    Some(x) => {
                        let next = ty.round_and_clip(x * factor);
                        serde_json::Number::from_f64(next).map_or(current, Value::Number)
                    }
                    None => param.sample(&mut self.rng),
                },
            };
            out.insert(param.name().to_string(), value);
        }
        Value::Object(out)
    }

    /// Replaces `bottom` by a clone of a top member with a checkpoint, if there is one.
    fn exploit(&mut self, bottom: u64, upper: &[u64]) {
        let donors: Vec<u64> = upper
            .iter()
            .copied()
            .filter(|id| *id != bottom && self.members[id].has_checkpoint)
            .filter(|id| !self.at_max_steps(self.members[id].time))
            .collect();
        if donors.is_empty() {
            log::debug(&format!(
                "{NAME}: member {bottom} is in the bottom quantile, but no top member has a checkpoint yet; it continues"
            ));
            return;
        }
        let donor = donors[self.rng.gen_range(0..donors.len())];
        let (donor_parameters, donor_time, donor_score) = {
            let d = &self.members[&donor];
            (d.parameters.clone(), d.time, d.last_score)
        };
        let parameters = self.explore(&donor_parameters);
        let member = self.members.get_mut(&bottom).expect("a ranked member");
        member.alive = false;
        let reason = format!(
            "PBT: bottom {:.0}% at step {} (score {}); replaced by a clone of parameter id {donor} (score {}, step {donor_time}) with explored parameters",
            self.quantile_fraction * 100.0,
            member.time,
            shown(member.last_score, self.mode),
            shown(donor_score, self.mode),
        );
        self.ready.push(Suggestion::stop(bottom, &reason));
        let successor = Successor {
            slot: member.slot,
            parameters,
            lineage: Lineage {
                parent: Some(donor),
                replaces: Some(bottom),
                parent_step: Some(donor_time),
            },
        };
        self.successors.push_back(successor);
    }

    /// Hands queued successors to ids deferred earlier, and vacant slots to them when a donor is
    /// known.
    fn fill_deferred(&mut self, donor: Option<u64>) {
        if let Some(donor) = donor.filter(|d| self.members[d].has_checkpoint) {
            while !self.vacant.is_empty() && self.successors.len() < self.deferred.len() {
                let (slot, replaces) = self.vacant.pop_front().expect("not empty");
                let (parameters, time) = {
                    let d = &self.members[&donor];
                    (d.parameters.clone(), d.time)
                };
                let parameters = self.explore(&parameters);
                self.successors.push_back(Successor {
                    slot,
                    parameters,
                    lineage: Lineage {
                        parent: Some(donor),
                        replaces: Some(replaces),
                        parent_step: Some(time),
                    },
                });
            }
        }
        while !self.deferred.is_empty() {
            let Some(successor) = self.next_successor() else {
                break;
            };
            let id = self.deferred.pop_front().expect("not empty");
            let label = self.admit(id, &successor);
            self.ready.push(Suggestion::member(
                id,
                successor.parameters,
                label,
                &successor.lineage,
            ));
        }
    }

    /// Records a new member for `id`; returns its label.
    fn admit(&mut self, id: u64, successor: &Successor) -> String {
        let base = successor.lineage.parent_step.unwrap_or(0);
        self.members.insert(
            id,
            Member {
                slot: successor.slot,
                parameters: successor.parameters.clone(),
                base,
                time: base,
                last_step: None,
                last_perturbation_time: base,
                last_score: None,
                has_checkpoint: false,
                alive: true,
                succeeded: false,
            },
        );
        format!("m{}-{id}", successor.slot)
    }

    /// The next queued successor to hand out. One whose donor was itself replaced (or failed)
    /// while it waited here gets another donor: the host, which does not know of successors
    /// not handed out yet, deletes such a member's checkpoint when it ends (Ray's "deletes
    /// checkpoints it later needs", ray#9036). The new donor is the best member with a
    /// checkpoint that is living or finished (a finished member's checkpoint is kept), its
    /// parameters explored; without one the slot waits (`vacant`) for the next id asked for once
    /// a donor is known.
    fn next_successor(&mut self) -> Option<Successor> {
        while let Some(mut successor) = self.successors.pop_front() {
            let donor_gone = successor
                .lineage
                .parent
                .and_then(|parent| self.members.get(&parent))
                .is_some_and(|donor| !donor.alive && !donor.succeeded);
            if !donor_gone {
                return Some(successor);
            }
            let Some(donor) = self.best_donor() else {
                if let Some(replaces) = successor.lineage.replaces {
                    self.vacant.push_back((successor.slot, replaces));
                }
                continue;
            };
            let (parameters, time) = {
                let d = &self.members[&donor];
                (d.parameters.clone(), d.time)
            };
            successor.parameters = self.explore(&parameters);
            successor.lineage.parent = Some(donor);
            successor.lineage.parent_step = Some(time);
            return Some(successor);
        }
        None
    }

    /// The best member with a checkpoint that is living or finished (a finished member's
    /// checkpoint is kept), by its last score.
    fn best_donor(&self) -> Option<u64> {
        self.members
            .iter()
            .filter(|(_, m)| m.has_checkpoint && (m.alive || m.succeeded))
            .filter(|(_, m)| !self.at_max_steps(m.time))
            .filter_map(|(id, m)| Some((*id, m.last_score?)))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(id, _)| id)
    }

    /// A successor for the first vacant slot (one whose last member was stopped before its
    /// successor was created, at a resume; or whose donor went away while it waited), cloned
    /// from the best donor; `None` without one.
    fn successor_for_vacant(&mut self) -> Option<Successor> {
        if self.vacant.is_empty() {
            return None;
        }
        let donor = self.best_donor()?;
        let (slot, replaces) = self.vacant.pop_front().expect("not empty");
        let (parameters, time) = {
            let d = &self.members[&donor];
            (d.parameters.clone(), d.time)
        };
        Some(Successor {
            slot,
            parameters: self.explore(&parameters),
            lineage: Lineage {
                parent: Some(donor),
                replaces: Some(replaces),
                parent_step: Some(time),
            },
        })
    }

    /// The step a living member that counts from `base` was last judged at when it reached
    /// `time`: it is judged at every report `perturbation_interval` steps after the last
    /// judgment (at first, after `base`), once past `burn_in_period`.
    fn last_judged(&self, base: u64, time: u64) -> u64 {
        let first = (base + self.perturbation_interval).max(self.burn_in_period);
        if time < first {
            return base;
        }
        first + (time - first) / self.perturbation_interval * self.perturbation_interval
    }

    /// Whether a member `time` steps in has trained all its `max_steps`.
    fn at_max_steps(&self, time: u64) -> bool {
        self.max_steps.is_some_and(|max| time >= max)
    }

    /// Every slot was filled, every member has ended, and no successor waits or can be made:
    /// nothing will ever be handed out again, so the ids deferred are owed nothing.
    fn finished(&self) -> bool {
        self.slots_created >= self.population_size
            && self.members.values().all(|m| !m.alive)
            && self.successors.is_empty()
            && (self.vacant.is_empty() || self.best_donor().is_none())
    }

    /// Once the population has [`finished`](Self::finished), tells the host it owes nothing
    /// for the ids it deferred: the experiment then ends as one whose tuner ran out, not as
    /// one whose tuner gave no parameters.
    fn release_deferred_if_finished(&mut self) {
        if self.finished() {
            let ids = std::mem::take(&mut self.deferred);
            self.ready.extend(ids.into_iter().map(Suggestion::no_more));
        }
    }

    fn judge_synchronously(&mut self) {
        let living: Vec<&Member> = self.members.values().filter(|m| m.alive).collect();
        let Some(reached) = living.iter().map(|m| m.last_perturbation_time).min() else {
            return;
        };
        if reached <= self.barrier || living.iter().any(|m| m.last_score.is_none()) {
            return;
        }
        self.barrier = reached;
        let (lower, upper) = self.quantiles();
        for bottom in lower {
            self.exploit(bottom, &upper);
        }
    }
}

fn shown(score: Option<f64>, mode: OptimizeMode) -> String {
    match (score, mode) {
        (Some(s), OptimizeMode::Minimize) if s.is_finite() => format!("{}", -s),
        (Some(s), _) if s.is_finite() => format!("{s}"),
        _ => "none".into(),
    }
}

impl Tuner for PbtTuner {
    fn new(class_args: &Value) -> Result<Self, PluginError> {
        if let Some(nni) = ["all_checkpoint_dir", "factor", "fraction"]
            .into_iter()
            .find(|k| class_args.get(*k).is_some())
        {
            return Err(PluginError::new(format!(
                "classArgs of {NAME}: {nni} is an argument of NNI's PBTTuner; write name: PBTTuner (NNI's, run through its dispatcher) or use knob's PBT arguments (population_size, perturbation_interval, quantile_fraction, resample_probability, perturbation_factors, burn_in_period, max_steps, synch)"
            )));
        }
        let args = ClassArgs::new(
            NAME,
            class_args,
            &[
                "optimize_mode",
                "population_size",
                "perturbation_interval",
                "burn_in_period",
                "max_steps",
                "quantile_fraction",
                "resample_probability",
                "perturbation_factors",
                "synch",
                "seed",
            ],
        )?;
        let synch = match class_args.get("synch").filter(|v| !v.is_null()) {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(PluginError::new(format!(
                    "classArgs of {NAME}: synch must be true or false, got {other}"
                )))
            }
        };
        let (seed, seed_notice) = seed_or_entropy(NAME, args.seed()?);
        Ok(PbtTuner {
            population_size: args.integer("population_size", 8, 2, 100_000)?,
            perturbation_interval: args.integer("perturbation_interval", 5, 1, u64::MAX)?,
            burn_in_period: args.integer("burn_in_period", 0, 0, u64::MAX)?,
            max_steps: match args.has("max_steps") {
                true => Some(args.integer("max_steps", 0, 1, u64::MAX)?),
                false => None,
            },
            quantile_fraction: args.number(
                "quantile_fraction",
                0.25,
                "a number from 0 to 0.5",
                |x| (0.0..=0.5).contains(&x),
            )?,
            resample_probability: args.number(
                "resample_probability",
                0.25,
                "a number from 0 to 1",
                |x| (0.0..=1.0).contains(&x),
            )?,
            perturbation_factors: factors(class_args)?,
            synch,
            mode: args.optimize_mode_or_maximize()?,
            rng: knob_plugin_api::space::seeded_rng(seed),
            seed_notice,
            space: None,
            members: BTreeMap::new(),
            slots_created: 0,
            successors: VecDeque::new(),
            vacant: VecDeque::new(),
            deferred: VecDeque::new(),
            ready: Vec::new(),
            barrier: 0,
            warned_partial_population: false,
        })
    }

    fn update_search_space(&mut self, space: &SearchSpace) -> Result<(), PluginError> {
        self.space = Some(space.clone());
        Ok(())
    }

    fn generate_parameters(&mut self, parameter_id: u64) -> Result<Generated, PluginError> {
        self.seed_notice.log_once();
        if self.space.is_none() {
            return Err(PluginError::new(format!(
                "{NAME}: asked for parameters before it was given a search space"
            )));
        }
        let successor = if let Some(successor) = self.next_successor() {
            successor
        } else if let Some(successor) = self.successor_for_vacant() {
            // A free place and a vacant slot: filled now, not at a later exploitation, which
            // may never come while exploitations' own successors take every free place.
            successor
        } else if let Some(space) = self
            .space
            .as_ref()
            .filter(|_| self.slots_created < self.population_size)
        {
            let parameters = space.sample(&mut self.rng);
            self.slots_created += 1;
            Successor {
                slot: self.slots_created - 1,
                parameters,
                lineage: Lineage::default(),
            }
        } else if self.finished() {
            return Ok(Generated::NoMore);
        } else {
            // The population is complete: this id waits for a successor (after a resume,
            // for a vacant slot), or for the last member's end, which answers it NoMore.
            self.deferred.push_back(parameter_id);
            return Ok(Generated::Deferred);
        };
        let label = self.admit(parameter_id, &successor);
        Ok(Generated::Member {
            parameters: successor.parameters,
            label,
            lineage: successor.lineage,
        })
    }

    fn receive_trial_result(
        &mut self,
        _parameter_id: u64,
        _parameters: &Value,
        _value: f64,
    ) -> Result<(), PluginError> {
        // A member's final result changes nothing: members are compared by their steps.
        Ok(())
    }

    fn receive_intermediate_result(
        &mut self,
        parameter_id: u64,
        intermediate: Intermediate,
        value: f64,
    ) -> Result<(), PluginError> {
        let score = self.score(value);
        let (interval, burn_in) = (self.perturbation_interval, self.burn_in_period);
        let Some(member) = self.members.get_mut(&parameter_id) else {
            return Ok(());
        };
        if member
            .last_step
            .is_some_and(|last| intermediate.step <= last)
        {
            member.base = member.time;
        }
        member.last_step = Some(intermediate.step);
        member.time = member.base + intermediate.step + 1;
        member.has_checkpoint |= intermediate.checkpoint;
        let last_step = self.max_steps.is_some_and(|max| member.time >= max);
        if !member.alive
            || last_step
            || member.time < burn_in
            || member.time - member.last_perturbation_time < interval
        {
            return Ok(());
        }
        member.last_score = Some(score);
        member.last_perturbation_time = member.time;
        if self.synch {
            self.judge_synchronously();
        } else {
            let (lower, upper) = self.quantiles();
            if lower.contains(&parameter_id) {
                self.exploit(parameter_id, &upper);
            } else if upper.contains(&parameter_id) {
                self.fill_deferred(Some(parameter_id));
                return Ok(());
            }
        }
        self.fill_deferred(None);
        Ok(())
    }

    fn trial_end(&mut self, parameter_id: u64, end_status: &str) -> Result<(), PluginError> {
        if let Some(member) = self.members.get_mut(&parameter_id) {
            member.alive = false;
            member.succeeded = end_status == status::SUCCEEDED;
        }
        if end_status != status::EARLY_STOPPED {
            // It ended before the stop: nothing to replace.
            self.successors
                .retain(|s| s.lineage.replaces != Some(parameter_id));
        }
        if self.synch {
            self.judge_synchronously();
            self.fill_deferred(None);
        }
        self.release_deferred_if_finished();
        Ok(())
    }

    fn import_data(&mut self, trials: &[ImportedTrial]) -> Result<(), PluginError> {
        // Only members (labeled `m<slot>-<id>`) matter; the latest member of each slot decides
        // whether the slot lives, is done, or waits for a successor. Latest is last created (the
        // host lists trials so), not the highest id: a successor handed to an id deferred
        // earlier has a lower id than the member it replaces.
        let mut latest: BTreeMap<u64, (u64, bool)> = BTreeMap::new();
        for trial in trials {
            let (Some(id), Some(label)) = (trial.parameter_id, trial.label.as_deref()) else {
                continue;
            };
            let Some(slot) = label
                .strip_prefix('m')
                .and_then(|rest| rest.split_once('-'))
                .and_then(|(slot, _)| slot.parse::<u64>().ok())
            else {
                continue;
            };
            self.slots_created = self.slots_created.max(slot + 1);
            // It goes on from the steps it had (its parent's and its own), as uninterrupted:
            // burn-in does not begin again, and it is judged at the steps it would have been.
            let parent_step = trial
                .lineage
                .as_ref()
                .and_then(|lineage| lineage.parent_step)
                .unwrap_or(0);
            let time = parent_step + trial.intermediate_results;
            self.members.insert(
                id,
                Member {
                    slot,
                    parameters: trial.parameters.clone(),
                    base: time,
                    time,
                    last_step: None,
                    last_perturbation_time: self.last_judged(parent_step, time),
                    last_score: None,
                    has_checkpoint: false,
                    alive: !trial.has_ended(),
                    succeeded: trial.status.as_deref() == Some(status::SUCCEEDED),
                },
            );
            let stopped = trial.status.as_deref() == Some(status::EARLY_STOPPED);
            latest.insert(slot, (id, stopped));
        }
        for (slot, (id, stopped)) in latest {
            if stopped {
                self.vacant.push_back((slot, id));
            }
        }
        Ok(())
    }

    fn take_suggestions(&mut self) -> Result<Vec<Suggestion>, PluginError> {
        Ok(std::mem::take(&mut self.ready))
    }
}
