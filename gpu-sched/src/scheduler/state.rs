//! The scheduler's per-environment bookkeeping: the registered [`Environment`] plus compact,
//! derived load figures that the placement scan reads instead of the public model.

use std::collections::BTreeSet;

use crate::inventory::{Environment, EnvironmentStatus, TrialId};
use crate::placement::Assignment;
use crate::scheduler::Assignments;

/// Derived state of one GPU, recomputed whenever its inputs change.
///
/// Architecture invariant: `loads[i]` always describes `env.gpus[i]` as the probe last reported
/// it plus every assignment the scheduler holds on it, so the scan never has to look at the
/// (larger, string-carrying) public model.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GpuLoad {
    pub index: u32,
    /// In the environment's `gpuIndices` allow-list.
    pub allowed: bool,
    /// Runs foreign processes while `useActiveGpu` is off.
    pub foreign_blocked: bool,
    pub trials: u32,
    /// Trials of other experiments holding this GPU (the lease ledger).
    pub elsewhere: u32,
    /// GPU memory declared by the knob trials on this GPU.
    pub declared_memory: u64,
    /// What a new trial can count on: the measured free memory, or the total less foreign use
    /// and the declared memory of knob trials that may not have allocated it yet, whichever is
    /// smaller.
    pub available_memory: u64,
    pub total_memory: u64,
    /// The most GPU memory a new trial may be promised here now under `gpuMemoryReserve` and
    /// `maxGpuMemoryUtilization` (`available_memory` when neither is set); 0 when `over_limit`.
    pub admissible_memory: u64,
    /// What the limits would let a trial have on this GPU were it empty: a request above it
    /// can never run here.
    pub capacity_memory: u64,
    /// The memory in use already breaks `gpuMemoryReserve` or `maxGpuMemoryUtilization`, so
    /// the GPU takes no trial, not even one that asks for no memory.
    pub over_limit: bool,
    /// Allowed, not foreign-blocked, below `maxTrialNumberPerGpu` and within the memory limits.
    pub has_room: bool,
}

#[derive(Clone, Debug)]
pub(crate) struct EnvState {
    pub env: Environment,
    /// Parallel to `env.gpus`.
    pub loads: Vec<GpuLoad>,
    /// GPUs with `has_room`.
    pub free_gpus: u32,
    /// GPUs in the allow-list that exist.
    pub allowed_gpus: u32,
    /// Of those, the ones whose memory limits leave some memory (`capacity_memory` above 0): a
    /// `gpuMemoryReserve` as large as the GPU leaves no room for any trial, not even one that
    /// asks for no memory, so such a GPU can never take one.
    pub roomy_gpus: u32,
    pub declared_host_memory: u64,
    pub declared_cpu_cores: u32,
    pub trials: BTreeSet<TrialId>,
    /// Release-clock tick of the latest trial release here; 0 once recently-idle has used it.
    pub last_release: u64,
}

impl EnvState {
    pub fn new(mut env: Environment, assignments: &Assignments) -> EnvState {
        env.gpus.sort_by_key(|gpu| gpu.index);
        let mut state = EnvState {
            env,
            loads: Vec::new(),
            free_gpus: 0,
            allowed_gpus: 0,
            roomy_gpus: 0,
            declared_host_memory: 0,
            declared_cpu_cores: 0,
            trials: BTreeSet::new(),
            last_release: 0,
        };
        state.rebuild(assignments);
        state
    }

    /// Takes a fresh probe of the same environment, keeping the trials placed on it.
    pub fn replace(&mut self, mut env: Environment, assignments: &Assignments) {
        env.gpus.sort_by_key(|gpu| gpu.index);
        self.env = env;
        self.rebuild(assignments);
    }

    pub fn is_ready(&self) -> bool {
        self.env.status == EnvironmentStatus::Ready
    }

    pub fn position_of(&self, index: u32) -> Option<usize> {
        self.loads.iter().position(|load| load.index == index)
    }

    /// Host memory not yet promised to knob trials (this experiment's and, from the lease
    /// ledger, others') and measured available, whichever is smaller (the reserve the limits
    /// keep free is not subtracted).
    pub fn unclaimed_host_memory(&self) -> u64 {
        let host = &self.env.host_resources;
        let unpromised = host.memory_total.bytes().saturating_sub(
            self.declared_host_memory + self.env.host_held_elsewhere.host_memory.bytes(),
        );
        host.memory_available.bytes().min(unpromised)
    }

    pub fn memory_reserve(&self) -> u64 {
        self.env
            .limits
            .min_available_memory
            .map_or(0, |reserve| reserve.bytes())
    }

    /// The most host memory `maxMemoryUtilization` lets be in use, or `None` without the limit.
    pub fn memory_use_ceiling(&self) -> Option<u64> {
        self.env
            .limits
            .max_memory_utilization
            .map(|percent| share(self.env.host_resources.memory_total.bytes(), percent))
    }

    /// The most host memory a new trial may ask for now, `held` being what waiting trials hold
    /// in this pass: under `memoryReserve` and `maxMemoryUtilization`. `None` when memory in use
    /// already breaks a limit.
    pub fn admissible_host_memory(&self, held: u64) -> Option<u64> {
        let available = self.unclaimed_host_memory().saturating_sub(held);
        let mut admissible = available.checked_sub(self.memory_reserve())?;
        if let Some(ceiling) = self.memory_use_ceiling() {
            let in_use = self
                .env
                .host_resources
                .memory_total
                .bytes()
                .saturating_sub(available);
            admissible = admissible.min(ceiling.checked_sub(in_use)?);
        }
        Some(admissible)
    }

    /// The most host memory a trial could be placed with here were knob's claims gone, from
    /// the memory measured available: [`admissible_host_memory`](Self::admissible_host_memory)
    /// without the claims, and at most the capacity.
    pub fn measured_host_memory_room(&self) -> Option<u64> {
        let host = &self.env.host_resources;
        let available = host.memory_available.bytes().min(host.memory_total.bytes());
        let mut room = available.checked_sub(self.memory_reserve())?;
        if let Some(ceiling) = self.memory_use_ceiling() {
            let in_use = host.memory_total.bytes() - available;
            room = room.min(ceiling.checked_sub(in_use)?);
        }
        Some(room.min(self.host_memory_capacity()))
    }

    /// The most host memory a trial could get here with nothing else running.
    pub fn host_memory_capacity(&self) -> u64 {
        let total = self.env.host_resources.memory_total.bytes();
        let capacity = total.saturating_sub(self.memory_reserve());
        self.memory_use_ceiling()
            .map_or(capacity, |ceiling| capacity.min(ceiling))
    }

    pub fn free_cpu_cores(&self) -> u32 {
        self.env
            .host_resources
            .cpu_count
            .saturating_sub(self.declared_cpu_cores + self.env.host_held_elsewhere.cpu_cores)
    }

    /// Runs as many trials as its `max_trials` limit allows.
    pub fn at_max_trials(&self) -> bool {
        self.env
            .limits
            .max_trials
            .is_some_and(|most| self.trials.len() >= most as usize)
    }

    /// CPU use at or above the environment's limit, or not known while there is a limit: a
    /// probe's first sample has no CPU figure (it is a difference of two samples), and a host
    /// whose use is unknown is not one known to be below the limit. The trial waits for the
    /// next probe, which the training service takes soon after (the `local` one takes its
    /// first two samples a moment apart when the limit is set).
    pub fn cpu_too_busy(&self) -> bool {
        match (
            self.env.limits.max_cpu_utilization,
            self.env.host_resources.cpu_utilization_percent,
        ) {
            (Some(limit), Some(current)) => current >= limit,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The most host memory the limits ever leave a trial is none: a `memoryReserve` (or a
    /// `maxMemoryUtilization`) that keeps the whole memory free admits no trial, not even one
    /// that asks for no memory.
    pub fn host_limits_leave_nothing(&self) -> bool {
        let limited = self.memory_reserve() > 0 || self.memory_use_ceiling().is_some();
        limited && self.host_memory_capacity() == 0
    }

    pub fn hold(&mut self, assignment: &Assignment) {
        self.trials.insert(assignment.trial.clone());
        self.declared_host_memory += assignment.host_memory.bytes();
        self.declared_cpu_cores += assignment.cpu_cores;
        for &index in assignment.gpu_indices.iter().flatten() {
            // A GPU missing from the latest probe keeps its claim in the assignment and is
            // counted again if it comes back.
            if let Some(position) = self.position_of(index) {
                self.loads[position].trials += 1;
                self.loads[position].declared_memory += assignment.gpu_memory.bytes();
                self.env.gpus[position]
                    .trials
                    .push(assignment.trial.clone());
                self.refresh_gpu(position);
            }
        }
    }

    pub fn drop_hold(&mut self, assignment: &Assignment) {
        self.trials.remove(&assignment.trial);
        self.declared_host_memory = self
            .declared_host_memory
            .saturating_sub(assignment.host_memory.bytes());
        self.declared_cpu_cores = self.declared_cpu_cores.saturating_sub(assignment.cpu_cores);
        for &index in assignment.gpu_indices.iter().flatten() {
            if let Some(position) = self.position_of(index) {
                let load = &mut self.loads[position];
                load.trials = load.trials.saturating_sub(1);
                load.declared_memory = load
                    .declared_memory
                    .saturating_sub(assignment.gpu_memory.bytes());
                self.env.gpus[position]
                    .trials
                    .retain(|trial| *trial != assignment.trial);
                self.refresh_gpu(position);
            }
        }
    }

    fn rebuild(&mut self, assignments: &Assignments) {
        let limits = &self.env.limits;
        self.loads = self
            .env
            .gpus
            .iter()
            .map(|gpu| GpuLoad {
                index: gpu.index,
                allowed: limits.allows_gpu(gpu.index),
                foreign_blocked: !limits.use_active_gpu && !gpu.foreign_processes.is_empty(),
                total_memory: gpu.memory_total.bytes(),
                ..GpuLoad::default()
            })
            .collect();
        for gpu in &mut self.env.gpus {
            gpu.trials.clear();
        }
        self.allowed_gpus = self.loads.iter().filter(|load| load.allowed).count() as u32;
        self.free_gpus = 0;
        self.declared_host_memory = 0;
        self.declared_cpu_cores = 0;
        for position in 0..self.loads.len() {
            self.refresh_gpu(position);
        }
        self.roomy_gpus = self
            .loads
            .iter()
            .filter(|load| load.allowed && load.capacity_memory > 0)
            .count() as u32;
        let trials = std::mem::take(&mut self.trials);
        for trial in &trials {
            if let Some(assignment) = assignments.get(trial) {
                self.hold(assignment);
            }
        }
    }

    /// Recomputes one GPU's derived figures and keeps `free_gpus` in step.
    fn refresh_gpu(&mut self, position: usize) {
        let gpu = &self.env.gpus[position];
        let max_trials = gpu.trial_limit(self.env.limits.max_trial_number_per_gpu);
        let load = &mut self.loads[position];
        let had_room = load.has_room;
        load.elsewhere = gpu.held_elsewhere.len() as u32;
        let elsewhere_memory: u64 = gpu
            .held_elsewhere
            .iter()
            .map(|held| held.gpu_memory.bytes())
            .sum();
        let promised = gpu.foreign_memory().bytes() + load.declared_memory + elsewhere_memory;
        load.available_memory = gpu
            .memory_free
            .bytes()
            .min(load.total_memory.saturating_sub(promised));
        let limits = &self.env.limits;
        let reserve = limits
            .gpu_memory_reserve
            .map_or(0, |reserve| reserve.bytes());
        let ceiling = limits
            .max_gpu_memory_utilization
            .map(|percent| share(load.total_memory, percent));
        let mut admissible = load.available_memory.checked_sub(reserve);
        let mut capacity = load.total_memory.saturating_sub(reserve);
        if let Some(ceiling) = ceiling {
            let in_use = load.total_memory - load.available_memory;
            admissible = admissible.and_then(|free| Some(free.min(ceiling.checked_sub(in_use)?)));
            capacity = capacity.min(ceiling);
        }
        load.over_limit = admissible.is_none();
        load.admissible_memory = admissible.unwrap_or(0);
        load.capacity_memory = capacity;
        load.has_room = load.allowed
            && !load.foreign_blocked
            && load.trials + load.elsewhere < max_trials
            && !load.over_limit;
        match (had_room, load.has_room) {
            (false, true) => self.free_gpus += 1,
            (true, false) => self.free_gpus -= 1,
            _ => {}
        }
    }
}

/// `percent` of `total`, rounded down.
pub(crate) fn share(total: u64, percent: f32) -> u64 {
    (total as f64 * f64::from(percent) / 100.0) as u64
}
