//! Successive halving in brackets, shared by Hyperband and BOHB: which configuration runs next
//! at which budget, promotion of the best of a finished round, trial labels, deferral while a
//! round waits, and the rebuild of all that from imported trials.
//!
//! Configurations are numbered `k = 0, 1, 2, ...` in the order brackets start them (NNI's
//! `create_parameter_id`); a configuration keeps its number when promoted. Its parameters are
//! drawn (by the tuner, through [`Draw`]) when it is first handed out, not when its bracket
//! opens as in NNI: the same schedule, but BOHB's model sees every result known by then.
//!
//! A round is complete when every configuration in it has ended (with or without a result).
//! Then the best `n_{i+1}` of those with a result (by optimize mode; a NaN result is the worst)
//! go on to round `i + 1` in order of their result; ties keep the order the results arrived in
//! round `i`'s member order. If no configuration of the round has a result, the bracket ends
//! there (NNI raises an IndexError when fewer results than `n_{i+1}` exist; here the round just
//! promotes those it has).
//!
//! After a change of search space ([`Brackets::set_space`]) a configuration the new space does
//! not hold is neither promoted (the next best that it holds takes its place) nor handed out if
//! it was promoted before the change (its slot counts as ended without a result): handing it
//! out would end the experiment under the default `tunerErrorPolicy: error`. NNI's advisors
//! promote it all the same.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use knob_plugin_api::space::SearchSpace;
use knob_plugin_api::{log, Generated, ImportedTrial, PluginError, Suggestion};
use serde_json::Value;

use super::schedule::Schedule;
use crate::common::args::OptimizeMode;
use crate::common::observed::loss;

/// The key Hyperband and BOHB add to the parameters: the budget the trial should train for.
pub(crate) const BUDGET_KEY: &str = "TRIAL_BUDGET";

/// How trial labels look: NNI's Hyperband writes `"{cycle}-{s}_{round}_{k}"`, BOHB `"{s}_{round}_{k}"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LabelStyle {
    Hyperband,
    Bohb,
}

/// When a new bracket opens (asked for parameters with nothing queued).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opening {
    /// Hyperband's `exec_mode: parallelism`: right away.
    Always,
    /// Hyperband's `exec_mode: serial`: once the current bracket has queued its last round
    /// (NNI's `is_completed`), so that round's trials may still run.
    AfterLastRoundQueued,
    /// BOHB's: once every trial of the current bracket's last round has ended.
    AfterLastRoundEnded,
}

/// Draws the parameters of configuration `k` (without the budget) for its first round.
pub(crate) trait Draw {
    fn draw(&mut self, k: u64, budget: u64) -> Result<Value, PluginError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Slot {
    bracket: u64,
    round: usize,
    k: u64,
}

/// Slots waiting to be handed out: `count` configurations `first.k, first.k + 1, ...` of one
/// round. A bracket's first round is queued as one run, never listed: with a large `R` it has
/// hundreds of millions of members (2^29 for R 1e9, eta 2) of which an experiment starts a
/// few, so listing them (as NNI does) would take gigabytes before the first trial.
#[derive(Debug, Clone, Copy)]
struct Queued {
    first: Slot,
    count: u64,
}

impl Queued {
    fn one(slot: Slot) -> Queued {
        Queued {
            first: slot,
            count: 1,
        }
    }

    /// What is left of this run without the configurations in `holes` (ascending, in range).
    fn without(self, holes: impl Iterator<Item = u64>) -> Vec<Queued> {
        let mut pieces = Vec::new();
        let mut from = self.first.k;
        let end = self.first.k + self.count;
        for hole in holes {
            if hole > from {
                pieces.push(Queued {
                    first: Slot {
                        k: from,
                        ..self.first
                    },
                    count: hole - from,
                });
            }
            from = hole + 1;
        }
        if end > from {
            pieces.push(Queued {
                first: Slot {
                    k: from,
                    ..self.first
                },
                count: end - from,
            });
        }
        pieces
    }
}

/// A round's configurations: the first round's are a range (see [`Queued`]), a later round's
/// those promoted to it.
#[derive(Debug)]
enum Members {
    Range(std::ops::Range<u64>),
    Promoted(Vec<u64>),
}

impl Members {
    fn contains(&self, k: u64) -> bool {
        match self {
            Members::Range(range) => range.contains(&k),
            Members::Promoted(list) => list.contains(&k),
        }
    }
}

#[derive(Debug)]
struct Round {
    budget: u64,
    members: Members,
    handed: BTreeSet<u64>,
    /// Losses, in the order they arrived.
    results: Vec<(u64, f64)>,
    ended: BTreeSet<u64>,
}

impl Round {
    fn new(budget: u64, members: Members) -> Round {
        Round {
            budget,
            members,
            handed: BTreeSet::new(),
            results: Vec::new(),
            ended: BTreeSet::new(),
        }
    }

    fn complete(&self) -> bool {
        match &self.members {
            Members::Range(range) => {
                self.ended.range(range.clone()).count() as u64 == range.end - range.start
            }
            Members::Promoted(list) => list.iter().all(|k| self.ended.contains(k)),
        }
    }
}

#[derive(Debug)]
struct Bracket {
    s: u32,
    rounds: Vec<Round>,
    /// No further round will be queued (the last one is, or promotion found nothing).
    all_queued: bool,
    /// Every trial of its last round has ended.
    finished: bool,
}

/// What a finished trial was, for tuners that learn from results (BOHB's model).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) parameters: Value,
    pub(crate) budget: u64,
    pub(crate) loss: f64,
}

/// The state of every bracket opened so far.
#[derive(Debug)]
pub(crate) struct Brackets {
    schedule: Schedule,
    style: LabelStyle,
    opening: Opening,
    mode: OptimizeMode,
    brackets: BTreeMap<u64, Bracket>,
    next_bracket: u64,
    /// Parameters of each configuration drawn so far (without the budget).
    configs: BTreeMap<u64, Value>,
    /// The latest search space: configurations it does not hold go no further.
    space: Option<SearchSpace>,
    queue: VecDeque<Queued>,
    /// Parameter id → the slot its trial runs.
    trials: BTreeMap<u64, Slot>,
    deferred: VecDeque<u64>,
    ready: Vec<Suggestion>,
}

impl Brackets {
    pub(crate) fn new(
        schedule: Schedule,
        style: LabelStyle,
        opening: Opening,
        mode: OptimizeMode,
    ) -> Brackets {
        Brackets {
            schedule,
            style,
            opening,
            mode,
            brackets: BTreeMap::new(),
            next_bracket: 0,
            configs: BTreeMap::new(),
            space: None,
            queue: VecDeque::new(),
            trials: BTreeMap::new(),
            deferred: VecDeque::new(),
            ready: Vec::new(),
        }
    }

    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The search space from now on (the first one, or a change of it).
    pub(crate) fn set_space(&mut self, space: &SearchSpace) {
        self.space = Some(space.clone());
    }

    /// Parameters for trial `parameter_id`, or [`Generated::Deferred`] while a round waits.
    pub(crate) fn generate(
        &mut self,
        parameter_id: u64,
        draw: &mut dyn Draw,
    ) -> Result<Generated, PluginError> {
        if !self.deferred.is_empty() {
            // Earlier ids are served first.
            self.deferred.push_back(parameter_id);
            return Ok(Generated::Deferred);
        }
        match self.hand_out(parameter_id, draw)? {
            Some((parameters, label)) => Ok(Generated::Labeled { parameters, label }),
            None => {
                self.deferred.push_back(parameter_id);
                Ok(Generated::Deferred)
            }
        }
    }

    /// Records trial `parameter_id`'s result; what it was, when the trial is one of ours and
    /// this is its first result.
    pub(crate) fn result(&mut self, parameter_id: u64, value: f64) -> Option<Outcome> {
        let slot = *self.trials.get(&parameter_id)?;
        let loss = loss(value, self.mode);
        let round = self.round_mut(slot)?;
        if round.results.iter().any(|(k, _)| *k == slot.k) {
            return None;
        }
        round.results.push((slot.k, loss));
        let budget = round.budget;
        Some(Outcome {
            parameters: self.configs.get(&slot.k)?.clone(),
            budget,
            loss,
        })
    }

    /// Records that trial `parameter_id` ended; completes its round when it was the last.
    pub(crate) fn end(
        &mut self,
        parameter_id: u64,
        draw: &mut dyn Draw,
    ) -> Result<(), PluginError> {
        let Some(&slot) = self.trials.get(&parameter_id) else {
            return Ok(());
        };
        if let Some(round) = self.round_mut(slot) {
            round.ended.insert(slot.k);
        }
        self.complete_rounds(slot.bracket, &[]);
        self.serve_deferred(draw)
    }

    /// Suggestions for deferred ids made since the last call.
    pub(crate) fn take_ready(&mut self) -> Vec<Suggestion> {
        std::mem::take(&mut self.ready)
    }

    /// Serves deferred ids from the queue, oldest first, while it can.
    pub(crate) fn serve_deferred(&mut self, draw: &mut dyn Draw) -> Result<(), PluginError> {
        while let Some(&id) = self.deferred.front() {
            let Some((parameters, label)) = self.hand_out(id, draw)? else {
                break;
            };
            self.deferred.pop_front();
            self.ready.push(Suggestion {
                parameter_id: id,
                parameters,
                label: Some(label),
            });
        }
        Ok(())
    }

    fn round_mut(&mut self, slot: Slot) -> Option<&mut Round> {
        self.brackets
            .get_mut(&slot.bracket)?
            .rounds
            .get_mut(slot.round)
    }

    fn hand_out(
        &mut self,
        parameter_id: u64,
        draw: &mut dyn Draw,
    ) -> Result<Option<(Value, String)>, PluginError> {
        let slot = loop {
            if self.queue.is_empty() && self.may_open() {
                self.open_bracket();
            }
            let Some(queued) = self.queue.front_mut() else {
                return Ok(None);
            };
            let slot = queued.first;
            if queued.count > 1 {
                queued.first.k += 1;
                queued.count -= 1;
            } else {
                self.queue.pop_front();
            }
            if held(self.space.as_ref(), self.configs.get(&slot.k)) {
                break slot;
            }
            // Promoted before the search space changed, and not in the new one.
            log::warn(&format!(
                "bracket {} round {}: configuration {} is not in the new search space; its place is left empty",
                self.bracket_id(slot.bracket),
                slot.round,
                slot.k
            ));
            if let Some(round) = self.round_mut(slot) {
                round.handed.insert(slot.k);
                round.ended.insert(slot.k);
            }
            self.complete_rounds(slot.bracket, &[]);
        };
        let budget = self.brackets[&slot.bracket].rounds[slot.round].budget;
        let config = match self.configs.get(&slot.k) {
            Some(config) => config.clone(),
            None => {
                let config = draw.draw(slot.k, budget)?;
                self.configs.insert(slot.k, config.clone());
                config
            }
        };
        let mut parameters = config;
        if let Value::Object(map) = &mut parameters {
            map.insert(BUDGET_KEY.into(), Value::from(budget));
        }
        if let Some(round) = self.round_mut(slot) {
            round.handed.insert(slot.k);
        }
        self.trials.insert(parameter_id, slot);
        Ok(Some((parameters, self.label(slot))))
    }

    fn may_open(&self) -> bool {
        let Some(current) = self.next_bracket.checked_sub(1) else {
            return true;
        };
        let bracket = &self.brackets[&current];
        match self.opening {
            Opening::Always => true,
            Opening::AfterLastRoundQueued => bracket.all_queued,
            Opening::AfterLastRoundEnded => bracket.finished,
        }
    }

    fn open_bracket(&mut self) {
        let b = self.next_bracket;
        self.next_bracket += 1;
        let s = self.schedule.bracket_s(b);
        let (n, budget) = self.schedule.round(s, 0);
        let first = self.schedule.first_config(b);
        if n > 0 {
            self.queue.push_back(Queued {
                first: Slot {
                    bracket: b,
                    round: 0,
                    k: first,
                },
                count: n,
            });
        }
        self.brackets.insert(
            b,
            Bracket {
                s,
                rounds: vec![Round::new(budget, Members::Range(first..first + n))],
                all_queued: s == 0,
                finished: false,
            },
        );
    }

    /// Completes bracket `b`'s last round if every trial in it ended: promotes the best to the
    /// next round (those in `keep` first: trials an earlier run already started there).
    fn complete_rounds(&mut self, b: u64, keep: &[u64]) {
        let schedule = self.schedule;
        let bracket_id = self.bracket_id(b);
        let (space, configs) = (self.space.as_ref(), &self.configs);
        let Some(bracket) = self.brackets.get_mut(&b) else {
            return;
        };
        let i = bracket.rounds.len() - 1;
        if bracket.finished || !bracket.rounds[i].complete() {
            return;
        }
        if i as u32 >= bracket.s || bracket.all_queued {
            bracket.all_queued = true;
            bracket.finished = true;
            return;
        }
        let (n_next, budget) = schedule.round(bracket.s, i as u32 + 1);
        let round = &bracket.rounds[i];
        let mut ranked: Vec<(u64, f64)> = round.results.clone();
        // Stable: equal losses keep the order their results arrived in.
        ranked.sort_by(|a, b| a.1.total_cmp(&b.1));
        let mut promoted: Vec<u64> = keep.to_vec();
        for (k, _) in ranked {
            if promoted.len() as u64 >= n_next {
                break;
            }
            if !promoted.contains(&k) && held(space, configs.get(&k)) {
                promoted.push(k);
            }
        }
        if promoted.is_empty() {
            log::warn(&format!(
                "bracket {bracket_id} round {i}: no trial reported a result; the bracket ends here"
            ));
            bracket.all_queued = true;
            bracket.finished = true;
            return;
        }
        let last = i as u32 + 1 == bracket.s;
        bracket
            .rounds
            .push(Round::new(budget, Members::Promoted(promoted.clone())));
        bracket.all_queued = last;
        self.queue.extend(promoted.into_iter().map(|k| {
            Queued::one(Slot {
                bracket: b,
                round: i + 1,
                k,
            })
        }));
    }

    fn bracket_id(&self, b: u64) -> String {
        let s = self.schedule.bracket_s(b);
        match self.style {
            LabelStyle::Hyperband => format!("{}-{s}", self.schedule.cycle(b)),
            LabelStyle::Bohb => s.to_string(),
        }
    }

    fn label(&self, slot: Slot) -> String {
        format!(
            "{}_{}_{}",
            self.bracket_id(slot.bracket),
            slot.round,
            slot.k
        )
    }

    /// The slot a label names, when it is one of this schedule's.
    fn parse_label(&self, label: &str) -> Option<Slot> {
        let mut parts = label.split('_');
        let (bracket_id, round, k) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (round, k): (usize, u64) = (round.parse().ok()?, k.parse().ok()?);
        let bracket = self.schedule.bracket_of(k);
        let slot = Slot { bracket, round, k };
        (self.bracket_id(bracket) == bracket_id && round as u32 <= self.schedule.bracket_s(bracket))
            .then_some(slot)
    }

    /// Rebuilds the brackets from the trials of an earlier run (see `ImportedTrial`): every
    /// labeled trial takes its place again, rounds whose trials all ended are completed, and
    /// what was queued but not started is queued again. Returns every result, labeled or not,
    /// for tuners that learn from them; unlabeled trials count at `TRIAL_BUDGET` (or the largest
    /// budget, as NNI's BOHB imports them).
    pub(crate) fn import(&mut self, trials: &[ImportedTrial]) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        let mut placed: BTreeMap<Slot, &ImportedTrial> = BTreeMap::new();
        for trial in trials {
            let mut config = trial.parameters.clone();
            let budget = match &mut config {
                Value::Object(map) => map.remove(BUDGET_KEY).and_then(|b| b.as_f64()),
                _ => None,
            };
            if !trial.value.is_nan() {
                outcomes.push(Outcome {
                    parameters: config.clone(),
                    budget: budget.map_or(self.schedule.max_budget(), f64::floor) as u64,
                    loss: loss(trial.value, self.mode),
                });
            }
            let Some(label) = &trial.label else { continue };
            match self.parse_label(label) {
                // Every bracket before the last one opened had a trial started, so a bracket
                // far beyond the number of trials is not one this schedule opened.
                Some(slot) if slot.bracket <= trials.len() as u64 => {
                    self.configs.entry(slot.k).or_insert(config);
                    placed.insert(slot, trial);
                }
                _ => log::warn(&format!(
                    "imported trial labeled {label:?} is not one of this schedule's (R/eta or budgets changed?); it is left out of the brackets"
                )),
            }
        }
        let Some(last) = placed.keys().map(|slot| slot.bracket).max() else {
            return outcomes;
        };
        while self.next_bracket <= last {
            let b = self.next_bracket;
            self.open_bracket();
            for round in 0.. {
                let here: Vec<(Slot, &ImportedTrial)> = placed
                    .range(
                        Slot {
                            bracket: b,
                            round,
                            k: 0,
                        }..=Slot {
                            bracket: b,
                            round,
                            k: u64::MAX,
                        },
                    )
                    .map(|(slot, trial)| (*slot, *trial))
                    .collect();
                let Some(current) = self.brackets[&b].rounds.get(round) else {
                    break;
                };
                // Trials the earlier run promoted stay promoted, even if a result changed.
                let missing: Vec<u64> = here
                    .iter()
                    .map(|(slot, _)| slot.k)
                    .filter(|&k| !current.members.contains(k))
                    .collect();
                if !missing.is_empty() {
                    self.repromote(b, round, &missing);
                }
                for (slot, trial) in &here {
                    if let Some(id) = trial.parameter_id {
                        self.trials.insert(id, *slot);
                    }
                    let mode = self.mode;
                    let round = self.round_mut(*slot).expect("round exists");
                    round.handed.insert(slot.k);
                    if !trial.value.is_nan() {
                        round.results.push((slot.k, loss(trial.value, mode)));
                    }
                    if trial.has_ended() {
                        round.ended.insert(slot.k);
                    }
                }
                let keep: Vec<u64> = placed
                    .keys()
                    .filter(|slot| slot.bracket == b && slot.round == round + 1)
                    .map(|slot| slot.k)
                    .collect();
                self.complete_rounds(b, &keep);
            }
        }
        let brackets = &self.brackets;
        self.queue = std::mem::take(&mut self.queue)
            .into_iter()
            .flat_map(|queued| {
                let handed = &brackets[&queued.first.bracket].rounds[queued.first.round].handed;
                let range = queued.first.k..queued.first.k + queued.count;
                queued.without(handed.range(range).copied())
            })
            .collect();
        outcomes
    }

    /// Makes `missing` members of round `round` (> 0) of bracket `b`, in place of the
    /// lowest-ranked members not started yet.
    fn repromote(&mut self, b: u64, round: usize, missing: &[u64]) {
        let bracket = self.brackets.get_mut(&b).expect("bracket exists");
        let Some(Round {
            members: Members::Promoted(members),
            ..
        }) = bracket.rounds.get_mut(round)
        else {
            return;
        };
        for &k in missing {
            members.push(k);
            self.queue.push_back(Queued::one(Slot {
                bracket: b,
                round,
                k,
            }));
        }
        // Drop queued members beyond the round's size, last first (a promoted round is queued
        // one slot at a time).
        let (n, _) = self.schedule.round(bracket.s, round as u32);
        while members.len() as u64 > n {
            let Some(pos) = members.iter().rposition(|k| !missing.contains(k)) else {
                break;
            };
            let k = members.remove(pos);
            self.queue.retain(|queued| {
                !(queued.first.bracket == b && queued.first.round == round && queued.first.k == k)
            });
        }
    }
}

/// Whether `space` holds `config` (a configuration not drawn yet, or no space yet, is held).
fn held(space: Option<&SearchSpace>, config: Option<&Value>) -> bool {
    match (space, config) {
        (Some(space), Some(config)) => space.validate_parameters(config).is_ok(),
        _ => true,
    }
}
