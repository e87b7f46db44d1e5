//! The scheduler: registered environments, the trials placed on them, and the decisions.

mod explain;
mod fit;
mod positions;
mod state;

use std::collections::HashMap;

use crate::bytes::ByteSize;
use crate::error::InventoryError;
use crate::inventory::{Environment, EnvironmentId, EnvironmentStatus, Inventory, TrialId};
use crate::placement::{Assignment, Placement};
use crate::request::{Policy, SchedulerConfig, TrialRequest};
use fit::{hold_for_waiting, Chooser, Demand, EnvHold, GpuDemand, Holds, Plan, Shape};
use positions::Positions;
use state::EnvState;

/// The placed, unreleased trials, by trial id.
pub(crate) type Assignments = HashMap<TrialId, Assignment>;

/// Whether a placement pass works out why each trial that has to wait waits
/// ([`Scheduler::place_queue_with`]). The reason goes over every environment (and names the
/// trials that hold their GPUs): with 1 000 environments it costs more than the decisions, and a
/// caller that records a changed reason at most now and then need not pay it on every pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reasons {
    Explained,
    /// Each `TmpNoAvailableGpu` has an empty reason.
    Unexplained,
}

/// Decides where waiting trials run and keeps track of what each placed trial holds.
///
/// API boundary: pure, synchronous and deterministic. It never probes, sleeps or spawns; the
/// core feeds it environments (from probes or agents) and trial ends, and asks it to place the
/// waiting queue after every event that may have freed something.
/// Cloning gives an independent copy, e.g. to try a what-if without touching the real one.
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    envs: Vec<EnvState>,
    env_positions: HashMap<EnvironmentId, usize>,
    /// By trial id, hashed: every request of every pass is looked up here first, and a
    /// B-tree's string comparisons over 8 000 placed trials were a fifth to a quarter
    /// of a pass (`sim_scale`, 100 000 trials while a host was down).
    assignments: Assignments,
    /// Environment position round-robin tries first.
    round_robin_next: usize,
    /// Counts releases; recently-idle compares these ticks instead of wall time, so its
    /// choices do not depend on the clock.
    release_clock: u64,
    /// The ready environments' free GPUs (`EnvState::free_gpus`) summed, kept as they change: a
    /// pass over a busy cluster learns that no GPU is free without visiting every environment.
    ready_free_gpus: u64,
    /// The positions of the ready environments with a free GPU, kept as they change: a request
    /// for GPUs fits nowhere else, and on a full cluster of 1 000 a placement then looks at the
    /// one or two environments where a trial just ended instead of all of them (`sim_scale`;
    /// while many have a free GPU it scans them all, see `Chooser::only_with_free_gpus`).
    with_free_gpus: Positions,
    /// How many environments could ever take a request of each shape asked about since the
    /// inventory last changed (registered, probed, marked or removed): a waiting reason counts
    /// them, and on a cluster of 1 000 the count was half of each reason's cost (`sim_scale`).
    eligible: Vec<(Shape, usize)>,
    /// What every pass's [`Holds`] writes in, empty between passes (see [`Holds::lend`]).
    hold_buffer: Vec<EnvHold>,
}

/// What an environment adds to [`Scheduler::ready_free_gpus`].
fn ready_free_gpus(env: &EnvState) -> u64 {
    if env.is_ready() {
        u64::from(env.free_gpus)
    } else {
        0
    }
}

impl Scheduler {
    pub fn new(config: SchedulerConfig) -> Scheduler {
        Scheduler {
            config,
            envs: Vec::new(),
            env_positions: HashMap::new(),
            assignments: Assignments::new(),
            round_robin_next: 0,
            release_clock: 0,
            ready_free_gpus: 0,
            with_free_gpus: Positions::default(),
            eligible: Vec::new(),
            hold_buffer: Vec::new(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn set_policy(&mut self, policy: Policy) {
        self.config.policy = policy;
    }

    /// Registers an environment, or takes a fresh probe of one already registered. Trials placed
    /// on it keep their GPUs (the `trials` lists of the given GPUs are ignored and rebuilt).
    pub fn upsert_environment(&mut self, environment: Environment) -> Result<(), InventoryError> {
        environment.check_consistency()?;
        self.eligible.clear();
        match self.env_positions.get(&environment.id) {
            Some(&position) => self.change_env(position, |env, assignments| {
                env.replace(environment, assignments)
            }),
            None => {
                self.env_positions
                    .insert(environment.id.clone(), self.envs.len());
                let env = EnvState::new(environment, &self.assignments);
                self.ready_free_gpus += ready_free_gpus(&env);
                if ready_free_gpus(&env) > 0 {
                    self.with_free_gpus.insert(self.envs.len());
                }
                self.envs.push(env);
            }
        }
        Ok(())
    }

    pub fn set_environment_status(
        &mut self,
        environment: &EnvironmentId,
        status: EnvironmentStatus,
    ) -> Result<(), InventoryError> {
        let position = self.position(environment)?;
        self.eligible.clear();
        self.change_env(position, |env, _| env.env.status = status);
        Ok(())
    }

    /// Forgets an environment that is gone for good. Returns the assignments of the trials that
    /// were placed there: they are released, and the core decides their fate.
    pub fn remove_environment(
        &mut self,
        environment: &EnvironmentId,
    ) -> Result<Vec<Assignment>, InventoryError> {
        let position = self.position(environment)?;
        self.eligible.clear();
        let removed = self.envs.remove(position);
        self.ready_free_gpus -= ready_free_gpus(&removed);
        // The later environments moved up a position: the set is made again (a rare event).
        self.with_free_gpus = Positions::default();
        for (position, env) in self.envs.iter().enumerate() {
            if ready_free_gpus(env) > 0 {
                self.with_free_gpus.insert(position);
            }
        }
        self.env_positions.remove(environment);
        for later in self.env_positions.values_mut() {
            if *later > position {
                *later -= 1;
            }
        }
        if self.round_robin_next > position {
            self.round_robin_next -= 1;
        }
        Ok(removed
            .trials
            .iter()
            .filter_map(|trial| self.assignments.remove(trial))
            .collect())
    }

    pub fn environment(&self, environment: &EnvironmentId) -> Option<&Environment> {
        self.env_positions
            .get(environment)
            .map(|&position| &self.envs[position].env)
    }

    /// In registration order.
    pub fn environments(&self) -> impl Iterator<Item = &Environment> {
        self.envs.iter().map(|state| &state.env)
    }

    /// An owned copy of every environment, with the trials placed on each GPU.
    pub fn inventory(&self) -> Inventory {
        Inventory {
            environments: self.environments().cloned().collect(),
        }
    }

    /// The most GPU memory one trial could ever be promised on one GPU of a registered
    /// environment (an allowed GPU, emptied, under its environment's `gpuMemoryReserve` and
    /// `maxGpuMemoryUtilization`); `None` without a GPU. The core caps a GPU memory request it
    /// raises after an out-of-memory end here, so that the raise cannot by itself make a trial
    /// that ran impossible to place.
    pub fn largest_gpu_capacity(&self) -> Option<ByteSize> {
        self.envs
            .iter()
            .flat_map(|state| state.loads.iter())
            .filter(|load| load.allowed)
            .map(|load| load.capacity_memory)
            .max()
            .map(ByteSize)
    }

    /// The most host memory one trial could ever be promised on a ready environment (its total
    /// under `memoryReserve` and `maxMemoryUtilization`): a request above it is refused.
    /// `None` without a ready environment.
    pub fn largest_host_memory_capacity(&self) -> Option<ByteSize> {
        self.envs
            .iter()
            .filter(|state| state.is_ready())
            .map(|state| state.host_memory_capacity())
            .max()
            .map(ByteSize)
    }

    /// The most host memory one trial could be placed with on a ready environment as last
    /// measured, knob's own claims aside: what the limits leave of the memory available then.
    /// A host never has all its memory available, so a request at its capacity would wait for
    /// good; the core caps a host memory request it raised beyond the capacity here instead.
    pub fn largest_host_memory_room(&self) -> Option<ByteSize> {
        self.envs
            .iter()
            .filter(|state| state.is_ready())
            .filter_map(|state| state.measured_host_memory_room())
            .max()
            .map(ByteSize)
    }

    pub fn assignment(&self, trial: &TrialId) -> Option<&Assignment> {
        self.assignments.get(trial)
    }

    /// Every placed, unreleased trial, ordered by trial id.
    pub fn assignments(&self) -> impl Iterator<Item = &Assignment> {
        let mut by_trial: Vec<&Assignment> = self.assignments.values().collect();
        by_trial.sort_unstable_by(|a, b| a.trial.cmp(&b.trial));
        by_trial.into_iter()
    }

    /// Places one trial (a queue of one).
    pub fn place(&mut self, request: &TrialRequest) -> Placement {
        self.place_queue(std::slice::from_ref(request))
            .pop()
            .expect("one placement per request")
    }

    /// Decides every waiting trial, oldest first, and holds the GPUs of those placed. Returns
    /// one placement per request, in the same order.
    ///
    /// `waiting` must be in arrival order: a trial that cannot be placed holds, for the rest of
    /// this call, the resources it is closest to fitting on, so younger trials are placed only
    /// on what no older trial is waiting for. Call this again after every trial end, probe or
    /// environment change; nothing is held between calls. A trial that already holds an
    /// assignment gets it back unchanged.
    pub fn place_queue(&mut self, waiting: &[TrialRequest]) -> Vec<Placement> {
        self.place_queue_with(waiting, Reasons::Explained)
    }

    /// [`place_queue`](Self::place_queue), saying whether to work out why the trials that wait
    /// do. The decisions are the same either way; with [`Reasons::Unexplained`] each
    /// `TmpNoAvailableGpu` has an empty reason.
    pub fn place_queue_with(
        &mut self,
        waiting: &[TrialRequest],
        reasons: Reasons,
    ) -> Vec<Placement> {
        // When no GPU has room, as on a busy cluster between two trial ends, no GPU request is
        // searched for at all (each search goes over every GPU).
        debug_assert_eq!(
            self.ready_free_gpus,
            self.envs.iter().map(ready_free_gpus).sum::<u64>(),
            "the free GPUs kept as they change"
        );
        debug_assert!(
            self.with_free_gpus
                .walk_from(0)
                .eq((0..self.envs.len())
                    .filter(|&position| ready_free_gpus(&self.envs[position]) > 0)),
            "the environments with a free GPU kept as they change"
        );
        let mut holds = Holds::lend(self.ready_free_gpus, std::mem::take(&mut self.hold_buffer));
        let mut placements = Vec::with_capacity(waiting.len());
        for (queue_position, request) in waiting.iter().enumerate() {
            let placement =
                self.decide(request, queue_position as u32, &mut holds, waiting, reasons);
            placements.push(placement);
        }
        self.hold_buffer = holds.give_back();
        placements
    }

    /// What [`place`](Self::place) would answer now, without holding anything or advancing
    /// round-robin.
    pub fn preview(&self, request: &TrialRequest) -> Placement {
        if let Some(assignment) = self.assignments.get(&request.trial) {
            return succeed(assignment);
        }
        let holds = Holds::new(self.ready_free_gpus);
        let demand = match Demand::resolve(request, &self.config) {
            Ok(demand) => demand,
            Err(reason) => return reject_malformed(reason),
        };
        if let Some(reason) = explain::rejection(&self.envs, &demand) {
            return Placement::RequireExceedTotal { reason };
        }
        match self.chooser(&holds).plan(&demand) {
            Some(plan) => Placement::Succeed {
                environment: self.envs[plan.env].env.id.clone(),
                gpu_indices: self.gpu_indices(&demand, &plan),
            },
            None => Placement::TmpNoAvailableGpu {
                reason: explain::waiting(
                    &self.envs,
                    &holds,
                    &demand,
                    std::slice::from_ref(request),
                    None,
                ),
            },
        }
    }

    /// `Err(reason)` when no registered environment could ever take the request: what
    /// `knob create` checks before starting an experiment whose trials could never run.
    pub fn check_request(&self, request: &TrialRequest) -> Result<(), String> {
        let demand = Demand::resolve(request, &self.config)
            .map_err(|reason| format!("the trial cannot be placed: {reason}"))?;
        match explain::rejection(&self.envs, &demand) {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    /// Frees what a trial held, the moment its process group is gone. `None` if it held
    /// nothing (never placed, or already released).
    pub fn release(&mut self, trial: &TrialId) -> Option<Assignment> {
        let assignment = self.assignments.remove(trial)?;
        self.release_clock += 1;
        if let Some(&position) = self.env_positions.get(&assignment.environment) {
            let release_clock = self.release_clock;
            self.change_env(position, |env, _| {
                env.drop_hold(&assignment);
                env.last_release = release_clock;
            });
        }
        Some(assignment)
    }

    fn position(&self, environment: &EnvironmentId) -> Result<usize, InventoryError> {
        self.env_positions.get(environment).copied().ok_or_else(|| {
            InventoryError::UnknownEnvironment {
                environment: environment.clone(),
            }
        })
    }

    fn chooser<'a>(&'a self, holds: &'a Holds) -> Chooser<'a> {
        Chooser {
            envs: &self.envs,
            holds,
            policy: self.config.policy,
            round_robin_next: self.round_robin_next,
            with_free_gpus: &self.with_free_gpus,
        }
    }

    fn decide(
        &mut self,
        request: &TrialRequest,
        queue_position: u32,
        holds: &mut Holds,
        waiting: &[TrialRequest],
        reasons: Reasons,
    ) -> Placement {
        if let Some(assignment) = self.assignments.get(&request.trial) {
            return succeed(assignment);
        }
        let demand = match Demand::resolve(request, &self.config) {
            Ok(demand) => demand,
            Err(reason) => return reject_malformed(reason),
        };
        if let Some(reason) = explain::rejection(&self.envs, &demand) {
            return Placement::RequireExceedTotal { reason };
        }
        // Once every free GPU is taken or held, no GPU request can be placed in this pass;
        // skipping the scan (and the hold, which could only claim busy GPUs that nothing later
        // in this pass could use either) keeps long queues linear.
        let exhausted = demand.gpu_count() > 0 && holds.no_free_gpu_left();
        if !exhausted {
            if let Some(plan) = self.chooser(holds).plan(&demand) {
                return self.commit(&demand, plan, holds);
            }
        }
        // Explained before its own hold, which would otherwise show up as the blocker.
        let shape = demand.shape();
        let reason = match (reasons, holds.cached_reason(&shape)) {
            (Reasons::Unexplained, _) => String::new(),
            (Reasons::Explained, Some(reason)) => reason.to_owned(),
            (Reasons::Explained, None) => {
                let eligible = self.eligible_envs(&demand, &shape);
                let reason = explain::waiting(&self.envs, holds, &demand, waiting, Some(eligible));
                holds.remember_reason(shape, reason.clone());
                reason
            }
        };
        // The first request of a pass to wait holds what it is closest to fitting on even with no
        // GPU free: the requests behind it then say whose turn those GPUs are.
        if !exhausted || !holds.refused {
            hold_for_waiting(&self.envs, holds, &demand, queue_position);
        }
        holds.refused = true;
        Placement::TmpNoAvailableGpu { reason }
    }

    /// How many environments could ever take a request of this demand (see `eligible`).
    fn eligible_envs(&mut self, demand: &Demand, shape: &Shape) -> usize {
        let cached = self
            .eligible
            .iter()
            .find(|(cached, _)| cached == shape)
            .map(|&(_, count)| count);
        debug_assert!(
            cached.is_none_or(|count| count == explain::eligible_count(&self.envs, demand)),
            "the eligible environments counted since the inventory last changed"
        );
        cached.unwrap_or_else(|| {
            let count = explain::eligible_count(&self.envs, demand);
            self.eligible.push((shape.clone(), count));
            count
        })
    }

    /// Changes one environment, keeping `ready_free_gpus` in step.
    fn change_env<R>(
        &mut self,
        position: usize,
        change: impl FnOnce(&mut EnvState, &Assignments) -> R,
    ) -> R {
        let env = &mut self.envs[position];
        let before = ready_free_gpus(env);
        let result = change(env, &self.assignments);
        let after = ready_free_gpus(env);
        self.ready_free_gpus = self.ready_free_gpus - before + after;
        if after > 0 {
            self.with_free_gpus.insert(position);
        } else {
            self.with_free_gpus.remove(position);
        }
        result
    }

    fn gpu_indices(&self, demand: &Demand, plan: &Plan) -> Option<Vec<u32>> {
        match demand.gpus {
            GpuDemand::Unmanaged => None,
            _ => Some(
                plan.positions
                    .iter()
                    .map(|&position| self.envs[plan.env].loads[position].index)
                    .collect(),
            ),
        }
    }

    fn commit(&mut self, demand: &Demand, plan: Plan, holds: &mut Holds) -> Placement {
        let assignment = Assignment {
            trial: demand.trial.clone(),
            environment: self.envs[plan.env].env.id.clone(),
            gpu_indices: self.gpu_indices(demand, &plan),
            gpu_memory: ByteSize(demand.gpu_memory),
            host_memory: ByteSize(demand.host_memory),
            cpu_cores: demand.cpu_cores,
        };
        let free_before = self.envs[plan.env].free_gpus;
        self.change_env(plan.env, |env, _| {
            env.hold(&assignment);
            // NNI's recently-idle forgets an environment's release once it has been used.
            env.last_release = 0;
        });
        holds.placed(free_before - self.envs[plan.env].free_gpus);
        self.round_robin_next = (plan.env + 1) % self.envs.len();
        let placement = succeed(&assignment);
        self.assignments
            .insert(assignment.trial.clone(), assignment);
        placement
    }
}

fn succeed(assignment: &Assignment) -> Placement {
    Placement::Succeed {
        environment: assignment.environment.clone(),
        gpu_indices: assignment.gpu_indices.clone(),
    }
}

fn reject_malformed(reason: String) -> Placement {
    Placement::RequireExceedTotal {
        reason: format!("the trial cannot be placed: {reason}"),
    }
}
