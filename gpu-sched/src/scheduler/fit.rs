//! Does a request fit, where, and on which GPUs: the hot path of every placement decision.

use std::cmp::Reverse;

use crate::inventory::{EnvironmentStatus, TrialId};
use crate::request::{GpuRequest, Policy, SchedulerConfig, TrialRequest};
use crate::scheduler::positions::Positions;
use crate::scheduler::state::{EnvState, GpuLoad};

/// A request with the experiment's defaults filled in.
#[derive(Debug)]
pub(crate) struct Demand<'a> {
    pub trial: &'a TrialId,
    pub gpus: GpuDemand,
    /// Per assigned GPU; 0 when not asked.
    pub gpu_memory: u64,
    pub host_memory: u64,
    pub cpu_cores: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GpuDemand {
    /// `trialGpuNumber` unset: no GPU, and `CUDA_VISIBLE_DEVICES` left alone.
    Unmanaged,
    Count(u32),
    Devices {
        host: String,
        indices: Vec<u32>,
    },
}

impl<'a> Demand<'a> {
    /// Fills in defaults; a malformed `Device` constraint is an error that no inventory can
    /// fix, so it comes back as the rejection reason.
    pub fn resolve(
        request: &'a TrialRequest,
        config: &SchedulerConfig,
    ) -> Result<Demand<'a>, String> {
        let gpus = match &request.gpus {
            GpuRequest::None => match config.trial_gpu_number {
                None => GpuDemand::Unmanaged,
                Some(count) => GpuDemand::Count(count),
            },
            GpuRequest::GpuNumber(count) => GpuDemand::Count(*count),
            GpuRequest::Device(devices) => {
                let Some(first) = devices.first() else {
                    return Err(
                        "its Device constraint lists no GPU: list at least one (host, index) pair"
                            .to_owned(),
                    );
                };
                if let Some(other) = devices.iter().find(|device| device.host != first.host) {
                    return Err(format!(
                        "its Device constraint spans hosts {} and {}, but a trial runs on one host: list GPUs of one host",
                        first.host, other.host
                    ));
                }
                let mut indices: Vec<u32> = devices.iter().map(|device| device.index).collect();
                indices.sort_unstable();
                if let Some(pair) = indices.windows(2).find(|pair| pair[0] == pair[1]) {
                    return Err(format!(
                        "its Device constraint lists {}:{} twice: list each GPU once",
                        first.host, pair[0]
                    ));
                }
                GpuDemand::Devices {
                    host: first.host.clone(),
                    indices,
                }
            }
        };
        Ok(Demand {
            trial: &request.trial,
            gpus,
            gpu_memory: request
                .gpu_memory
                .or(config.trial_gpu_memory)
                .map_or(0, |memory| memory.bytes()),
            host_memory: request
                .host_memory
                .or(config.trial_memory_size)
                .map_or(0, |memory| memory.bytes()),
            cpu_cores: request.cpu_cores.or(config.trial_cpu_number).unwrap_or(0),
        })
    }

    /// Everything but the trial: two requests of one shape get the same answer.
    pub fn shape(&self) -> Shape {
        (
            self.gpus.clone(),
            self.gpu_memory,
            self.host_memory,
            self.cpu_cores,
        )
    }

    pub fn gpu_count(&self) -> u32 {
        match &self.gpus {
            GpuDemand::Unmanaged => 0,
            GpuDemand::Count(count) => *count,
            GpuDemand::Devices { indices, .. } => indices.len() as u32,
        }
    }
}

pub(crate) type Shape = (GpuDemand, u64, u64, u32);

/// Why an environment can never take a request, whatever finishes or frees up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Permanent {
    TooFewGpus,
    GpuMemory,
    HostMemory,
    CpuCores,
    OtherHost,
    MissingDevice(u32),
    DeviceNotAllowed(u32),
    DeviceMemory(u32),
}

pub(crate) fn permanent_blocker(env: &EnvState, demand: &Demand) -> Option<Permanent> {
    match &demand.gpus {
        GpuDemand::Unmanaged => {}
        GpuDemand::Count(count) => {
            if env.allowed_gpus < *count {
                return Some(Permanent::TooFewGpus);
            }
            if demand.gpu_memory > 0 {
                let large_enough = env
                    .loads
                    .iter()
                    .filter(|load| load.allowed && load.capacity_memory >= demand.gpu_memory)
                    .count();
                if (large_enough as u32) < *count {
                    return Some(Permanent::GpuMemory);
                }
            } else if env.roomy_gpus < *count {
                return Some(Permanent::GpuMemory);
            }
        }
        GpuDemand::Devices { host, indices } => {
            if env.env.host != *host {
                return Some(Permanent::OtherHost);
            }
            for &index in indices {
                let Some(position) = env.position_of(index) else {
                    return Some(Permanent::MissingDevice(index));
                };
                let load = &env.loads[position];
                if !load.allowed {
                    return Some(Permanent::DeviceNotAllowed(index));
                }
                // At least a byte: a GPU whose limits leave nothing takes no trial at all.
                if load.capacity_memory < demand.gpu_memory.max(1) {
                    return Some(Permanent::DeviceMemory(index));
                }
            }
        }
    }
    let host = &env.env.host_resources;
    if demand.host_memory > env.host_memory_capacity() || env.host_limits_leave_nothing() {
        return Some(Permanent::HostMemory);
    }
    if demand.cpu_cores > host.cpu_count {
        return Some(Permanent::CpuCores);
    }
    None
}

/// Resources held, within one pass over the waiting queue, for waiting trials that could not be
/// placed: later (younger) trials may not use them. This is what keeps a large request from
/// starving behind a stream of small ones. Also caches what a pass learns about refusals.
#[derive(Debug)]
pub(crate) struct Holds {
    /// One entry per environment once anything is held (empty before), all empty between
    /// passes: the scheduler lends the same buffer to every pass ([`Holds::lend`]), since on a
    /// cluster of 1 000 making and freeing it for the first waiting trial of each pass was a
    /// tenth of the pass (`sim_scale`, trials waiting while a host was down).
    per_env: Vec<EnvHold>,
    /// The entries of `per_env` written in this pass, emptied again by [`Holds::give_back`].
    touched: Vec<usize>,
    /// Free GPUs on ready environments that nobody holds, kept by placements and holds; 0 means
    /// no GPU request can be placed for the rest of the pass.
    free_unheld_gpus: u64,
    /// Whether a request of this pass was refused (waits).
    pub refused: bool,
    /// Waiting reasons written since the last placement or hold, by request shape: in a long
    /// queue most waiting trials share a shape and, once nothing changes, a reason.
    reasons: Vec<(Shape, String)>,
}
#[derive(Clone, Debug, Default)]
pub(crate) struct EnvHold {
    /// Queue position of the waiting trial holding each GPU (parallel to `EnvState::loads`).
    pub gpu_holder: Vec<Option<u32>>,
    pub free_gpus_held: u32,
    pub host_memory: u64,
    pub cpu_cores: u32,
    /// The oldest waiting trial holding host memory or cores here.
    pub host_holder: Option<u32>,
}

impl EnvHold {
    fn is_empty(&self) -> bool {
        self.gpu_holder.is_empty() && self.host_holder.is_none()
    }
}

impl Holds {
    /// Nothing held yet, with `free_gpus` free on the ready environments.
    pub fn new(free_gpus: u64) -> Holds {
        Holds::lend(free_gpus, Vec::new())
    }

    /// [`Holds::new`] over a buffer from an earlier pass's [`Holds::give_back`].
    pub fn lend(free_gpus: u64, per_env: Vec<EnvHold>) -> Holds {
        debug_assert!(
            per_env.iter().all(|hold| hold.is_empty()),
            "a lent buffer holds nothing"
        );
        Holds {
            per_env,
            touched: Vec::new(),
            free_unheld_gpus: free_gpus,
            refused: false,
            reasons: Vec::new(),
        }
    }

    /// The buffer, with everything this pass held let go, for the next pass.
    pub fn give_back(mut self) -> Vec<EnvHold> {
        for env in self.touched {
            let hold = &mut self.per_env[env];
            let mut gpu_holder = std::mem::take(&mut hold.gpu_holder);
            gpu_holder.clear();
            *hold = EnvHold {
                gpu_holder,
                ..EnvHold::default()
            };
        }
        self.per_env
    }

    pub fn no_free_gpu_left(&self) -> bool {
        self.free_unheld_gpus == 0
    }

    /// A placement changed the inventory, taking `free_gpus_taken` free GPUs.
    pub fn placed(&mut self, free_gpus_taken: u32) {
        self.free_unheld_gpus = self
            .free_unheld_gpus
            .saturating_sub(u64::from(free_gpus_taken));
        self.reasons.clear();
    }

    pub fn cached_reason(&self, shape: &Shape) -> Option<&str> {
        self.reasons
            .iter()
            .find(|(cached, _)| cached == shape)
            .map(|(_, reason)| reason.as_str())
    }

    pub fn remember_reason(&mut self, shape: Shape, reason: String) {
        self.reasons.push((shape, reason));
    }

    /// What is held on an environment; `None` when nothing is.
    pub fn get(&self, env: usize) -> Option<&EnvHold> {
        self.per_env.get(env).filter(|hold| !hold.is_empty())
    }

    pub fn gpu_holder(&self, env: usize, position: usize) -> Option<u32> {
        self.get(env)
            .and_then(|hold| hold.gpu_holder.get(position).copied().flatten())
    }

    fn env_mut(&mut self, env: usize, envs: &[EnvState]) -> &mut EnvHold {
        if self.per_env.len() < envs.len() {
            self.per_env.resize_with(envs.len(), EnvHold::default);
        }
        let hold = &mut self.per_env[env];
        if hold.is_empty() {
            self.touched.push(env);
        }
        if hold.gpu_holder.is_empty() {
            hold.gpu_holder.resize(envs[env].loads.len(), None);
        }
        hold
    }
}

/// Where a request goes now.
#[derive(Debug)]
pub(crate) struct Plan {
    pub env: usize,
    /// Positions in `EnvState::loads`, in index order.
    pub positions: Vec<usize>,
}

fn gpu_fits(load: &GpuLoad, holder: Option<u32>, gpu_memory: u64) -> bool {
    load.has_room && holder.is_none() && load.admissible_memory >= gpu_memory
}

/// CPU cores, CPU use and host memory admit the request now.
pub(crate) fn host_fits(env: &EnvState, hold: Option<&EnvHold>, demand: &Demand) -> bool {
    let (held_memory, held_cores) = hold.map_or((0, 0), |hold| (hold.host_memory, hold.cpu_cores));
    if demand.cpu_cores > 0 && env.free_cpu_cores().saturating_sub(held_cores) < demand.cpu_cores {
        return false;
    }
    if env.cpu_too_busy() || env.at_max_trials() {
        return false;
    }
    let limited = env.memory_reserve() > 0 || env.memory_use_ceiling().is_some();
    if demand.host_memory > 0 || limited {
        let available = if limited {
            env.admissible_host_memory(held_memory)
        } else {
            Some(env.unclaimed_host_memory().saturating_sub(held_memory))
        };
        if available.is_none_or(|available| available < demand.host_memory) {
            return false;
        }
    }
    true
}

/// GPUs of `env` that could take one slot of the request now.
pub(crate) fn fitting_gpu_count(env: &EnvState, hold: Option<&EnvHold>, gpu_memory: u64) -> u32 {
    match hold {
        // The cached counts are exact when memory is not asked: holds only take GPUs that no
        // placement in the same pass can touch.
        None if gpu_memory == 0 => env.free_gpus,
        Some(hold) if gpu_memory == 0 => env.free_gpus.saturating_sub(hold.free_gpus_held),
        _ => env
            .loads
            .iter()
            .enumerate()
            .filter(|&(position, load)| {
                let holder = hold.and_then(|hold| hold.gpu_holder.get(position).copied().flatten());
                gpu_fits(load, holder, gpu_memory)
            })
            .count() as u32,
    }
}

/// How many GPUs of `env` fit a `Count` request now, or `None` when the request does not fit.
#[inline]
fn fit_now(env: &EnvState, hold: Option<&EnvHold>, demand: &Demand, count: u32) -> Option<u32> {
    if !env.is_ready() || env.free_gpus < count {
        return None;
    }
    if !host_fits(env, hold, demand) {
        return None;
    }
    if count == 0 {
        return Some(0);
    }
    let fitting = fitting_gpu_count(env, hold, demand.gpu_memory);
    (fitting >= count).then_some(fitting)
}

/// The policies walk only the environments with a free GPU while fewer than one in this many
/// has one (see `Chooser::only_with_free_gpus`).
const SPARSE_FREE: usize = 8;

/// The decision inputs that are not per-environment.
pub(crate) struct Chooser<'a> {
    pub envs: &'a [EnvState],
    pub holds: &'a Holds,
    pub policy: Policy,
    pub round_robin_next: usize,
    /// The ready environments with a free GPU (see `Scheduler::with_free_gpus`).
    pub with_free_gpus: &'a Positions,
}

impl Chooser<'_> {
    pub fn plan(&self, demand: &Demand) -> Option<Plan> {
        match &demand.gpus {
            GpuDemand::Devices { host, indices } => self.plan_devices(demand, host, indices),
            GpuDemand::Unmanaged => self.plan_count(demand, 0),
            GpuDemand::Count(count) => self.plan_count(demand, *count),
        }
    }

    fn plan_devices(&self, demand: &Demand, host: &str, indices: &[u32]) -> Option<Plan> {
        self.envs
            .iter()
            .enumerate()
            .find_map(|(env_position, env)| {
                if env.env.host != host || !env.is_ready() {
                    return None;
                }
                let hold = self.holds.get(env_position);
                if !host_fits(env, hold, demand) {
                    return None;
                }
                let positions = indices
                    .iter()
                    .map(|&index| {
                        let position = env.position_of(index)?;
                        let holder = self.holds.gpu_holder(env_position, position);
                        gpu_fits(&env.loads[position], holder, demand.gpu_memory)
                            .then_some(position)
                    })
                    .collect::<Option<Vec<usize>>>()?;
                Some(Plan {
                    env: env_position,
                    positions,
                })
            })
    }

    fn plan_count(&self, demand: &Demand, count: u32) -> Option<Plan> {
        let env = match self.policy {
            Policy::RoundRobin => self.round_robin(demand, count),
            Policy::RecentlyIdle => self
                .recently_idle(demand, count)
                .or_else(|| self.round_robin(demand, count)),
            Policy::Pack | Policy::Spread => self.best_scored(demand, count),
        }?;
        Some(Plan {
            env,
            positions: self.choose_gpus(env, demand, count),
        })
    }

    /// The ready environments with a free GPU, when a request for `count` GPUs can fit on no
    /// other and they are few next to all of them (a full cluster, where a trial just ended):
    /// the policies then walk those alone. Otherwise they scan every environment, which is
    /// cheaper than a walk when most have room (`gpu_placement`).
    fn only_with_free_gpus(&self, count: u32) -> Option<&Positions> {
        (count > 0 && self.with_free_gpus.len() * SPARSE_FREE < self.envs.len())
            .then_some(self.with_free_gpus)
    }

    fn round_robin(&self, demand: &Demand, count: u32) -> Option<usize> {
        let total = self.envs.len();
        if total == 0 {
            return None;
        }
        let first = self.round_robin_next % total;
        let fits = |&(position, env): &(usize, &EnvState)| {
            fit_now(env, self.holds.get(position), demand, count).is_some()
        };
        let found = match self.only_with_free_gpus(count) {
            Some(free) => self.at(free.walk_from(first)).find(fits),
            None => {
                let all = || self.envs.iter().enumerate();
                all().skip(first).chain(all().take(first)).find(fits)
            }
        };
        found.map(|(position, _)| position)
    }

    /// The environments at these positions, with their positions.
    fn at<'b>(
        &'b self,
        positions: impl Iterator<Item = usize> + 'b,
    ) -> impl Iterator<Item = (usize, &'b EnvState)> + 'b {
        positions.map(|position| (position, &self.envs[position]))
    }

    fn recently_idle(&self, demand: &Demand, count: u32) -> Option<usize> {
        match self.only_with_free_gpus(count) {
            Some(free) => self.recently_idle_among(self.at(free.walk_from(0)), demand, count),
            None => self.recently_idle_among(self.envs.iter().enumerate(), demand, count),
        }
    }

    fn recently_idle_among<'b>(
        &self,
        envs: impl Iterator<Item = (usize, &'b EnvState)>,
        demand: &Demand,
        count: u32,
    ) -> Option<usize> {
        let mut best: Option<(u64, usize)> = None;
        for (position, env) in envs {
            let released = env.last_release;
            if released == 0 || best.is_some_and(|(tick, _)| tick >= released) {
                continue;
            }
            if fit_now(env, self.holds.get(position), demand, count).is_some() {
                best = Some((released, position));
            }
        }
        best.map(|(_, position)| position)
    }

    fn best_scored(&self, demand: &Demand, count: u32) -> Option<usize> {
        match self.only_with_free_gpus(count) {
            Some(free) => self.best_scored_among(self.at(free.walk_from(0)), demand, count),
            None => self.best_scored_among(self.envs.iter().enumerate(), demand, count),
        }
    }

    fn best_scored_among<'b>(
        &self,
        envs: impl Iterator<Item = (usize, &'b EnvState)>,
        demand: &Demand,
        count: u32,
    ) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for (position, env) in envs {
            let Some(fitting) = fit_now(env, self.holds.get(position), demand, count) else {
                continue;
            };
            let better = match best {
                None => true,
                Some((best_position, best_fitting)) => {
                    self.prefers(env, fitting, &self.envs[best_position], best_fitting, count)
                }
            };
            if better {
                best = Some((position, fitting));
            }
        }
        best.map(|(position, _)| position)
    }

    /// Strictly better than the current best (ties keep the earlier environment, so the order
    /// of registration decides and the choice is deterministic).
    #[inline]
    fn prefers(
        &self,
        env: &EnvState,
        fitting: u32,
        best: &EnvState,
        best_fitting: u32,
        count: u32,
    ) -> bool {
        if count == 0 {
            // No GPU asked: load is the number of knob trials on the environment.
            let (load, best_load) = (env.trials.len(), best.trials.len());
            return match self.policy {
                Policy::Pack => load > best_load,
                _ => load < best_load,
            };
        }
        match self.policy {
            // Best fit: the fewest fitting GPUs left over.
            Policy::Pack => fitting < best_fitting,
            // Least loaded: the largest free share, then the most free GPUs.
            _ => {
                let share = u64::from(fitting) * u64::from(best.allowed_gpus);
                let best_share = u64::from(best_fitting) * u64::from(env.allowed_gpus);
                share > best_share || (share == best_share && fitting > best_fitting)
            }
        }
    }

    fn choose_gpus(&self, env_position: usize, demand: &Demand, count: u32) -> Vec<usize> {
        if count == 0 {
            return Vec::new();
        }
        let env = &self.envs[env_position];
        let mut candidates: Vec<usize> = (0..env.loads.len())
            .filter(|&position| {
                let holder = self.holds.gpu_holder(env_position, position);
                gpu_fits(&env.loads[position], holder, demand.gpu_memory)
            })
            .collect();
        let load = |position: usize| &env.loads[position];
        match self.policy {
            // Busiest GPU that still has room, then the tightest memory fit.
            Policy::Pack => candidates.sort_by_key(|&position| {
                let load = load(position);
                (Reverse(load.trials), load.available_memory, load.index)
            }),
            // Idlest GPU: fewest trials, most memory, least utilised.
            Policy::Spread => candidates.sort_by_key(|&position| {
                let load = load(position);
                let utilization = env.env.gpus[position].utilization_percent.unwrap_or(0);
                (
                    load.trials,
                    Reverse(load.available_memory),
                    utilization,
                    load.index,
                )
            }),
            // NNI takes GPUs in index order; fewest trials first keeps shared GPUs even.
            Policy::RoundRobin | Policy::RecentlyIdle => candidates.sort_by_key(|&position| {
                let load = load(position);
                (load.trials, load.index)
            }),
        }
        candidates.truncate(count as usize);
        candidates.sort_unstable();
        candidates
    }
}

/// Holds resources for a waiting trial at queue position `waiting_position`, on the
/// environment where it is closest to fitting, so that younger trials cannot take them.
pub(crate) fn hold_for_waiting(
    envs: &[EnvState],
    holds: &mut Holds,
    demand: &Demand,
    waiting_position: u32,
) {
    let Some(target) = hold_target(envs, holds, demand) else {
        return;
    };
    let env = &envs[target];
    let wanted: Vec<usize> = match &demand.gpus {
        GpuDemand::Unmanaged => Vec::new(),
        GpuDemand::Devices { indices, .. } => indices
            .iter()
            .filter_map(|&index| env.position_of(index))
            .collect(),
        GpuDemand::Count(count) => {
            let unheld = |position: &usize| holds.gpu_holder(target, *position).is_none();
            let mut free: Vec<usize> = (0..env.loads.len())
                .filter(|position| {
                    unheld(position) && gpu_fits(&env.loads[*position], None, demand.gpu_memory)
                })
                .collect();
            // Then the busy GPUs most likely to free up first: knob's own before foreign ones,
            // the least shared first.
            let mut busy: Vec<usize> = (0..env.loads.len())
                .filter(|position| {
                    let load = &env.loads[*position];
                    unheld(position)
                        && load.allowed
                        && load.capacity_memory >= demand.gpu_memory
                        && !free.contains(position)
                })
                .collect();
            busy.sort_by_key(|&position| {
                let load = &env.loads[position];
                (load.foreign_blocked, load.trials, load.index)
            });
            free.extend(busy);
            free.truncate(*count as usize);
            free
        }
    };
    let holds_host = demand.host_memory > 0 || demand.cpu_cores > 0;
    if wanted.is_empty() && !holds_host {
        return;
    }
    let hold = holds.env_mut(target, envs);
    let mut newly_held_free = 0;
    for position in wanted {
        if hold.gpu_holder[position].is_none() {
            hold.gpu_holder[position] = Some(waiting_position);
            if env.loads[position].has_room {
                hold.free_gpus_held += 1;
                newly_held_free += 1;
            }
        }
    }
    if holds_host {
        hold.host_memory += demand.host_memory;
        hold.cpu_cores += demand.cpu_cores;
        hold.host_holder.get_or_insert(waiting_position);
    }
    if env.is_ready() {
        holds.free_unheld_gpus = holds.free_unheld_gpus.saturating_sub(newly_held_free);
    }
    holds.reasons.clear();
}

/// The environment a waiting request is closest to fitting on: one that could ever take it,
/// preferring ready ones, then the most fitting unheld GPUs, then registration order.
fn hold_target(envs: &[EnvState], holds: &Holds, demand: &Demand) -> Option<usize> {
    // When every ready environment fits none of the request's GPUs now (it asks for none, or
    // no free GPU is left unheld on any ready environment and it asks no GPU memory), the
    // first ready one that accepts it wins the search below: found without looking at the
    // other environments (on a full cluster of 1 000 the search ran for the first waiting
    // trial of every pass, `sim_scale`).
    let none_fits_now = match demand.gpus {
        GpuDemand::Count(count) if count > 0 => holds.no_free_gpu_left() && demand.gpu_memory == 0,
        _ => true,
    };
    let found = hold_target_search(envs, holds, demand, none_fits_now);
    debug_assert!(
        !none_fits_now || found == hold_target_search(envs, holds, demand, false),
        "the first ready environment is the one the whole search finds"
    );
    found
}

fn hold_target_search(
    envs: &[EnvState],
    holds: &Holds,
    demand: &Demand,
    first_ready_wins: bool,
) -> Option<usize> {
    let mut best: Option<(bool, u32, usize)> = None;
    for (position, env) in envs.iter().enumerate() {
        let accepts = matches!(
            env.env.status,
            EnvironmentStatus::Ready | EnvironmentStatus::Unavailable(_)
        );
        if !accepts || permanent_blocker(env, demand).is_some() {
            continue;
        }
        let fitting = match demand.gpus {
            GpuDemand::Count(count) if count > 0 => {
                fitting_gpu_count(env, holds.get(position), demand.gpu_memory)
            }
            _ => 0,
        };
        if first_ready_wins && env.is_ready() {
            return Some(position);
        }
        let key = (env.is_ready(), fitting, position);
        let better =
            best.is_none_or(|(ready, best_fitting, _)| (key.0, key.1) > (ready, best_fitting));
        if better {
            best = Some(key);
        }
    }
    best.map(|(_, _, position)| position)
}
