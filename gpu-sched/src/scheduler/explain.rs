//! One-line reasons: why a trial can never be placed (naming the largest environment and what
//! to change), and why it waits (naming what is busy). Built only when a placement fails, so
//! the hot path never formats text.

use std::fmt::Write;

use crate::bytes::ByteSize;
use crate::inventory::{
    describe_indices, EnvironmentStatus, GpuSource, HeldElsewhere, HostHeldElsewhere, HostHolder,
};
use crate::ledger::STANDING;
use crate::request::TrialRequest;
use crate::scheduler::fit::{
    fitting_gpu_count, permanent_blocker, Demand, GpuDemand, Holds, Permanent,
};
use crate::scheduler::state::{share, EnvState};

/// Environments described in a waiting reason before the rest are only counted.
const SHOWN_ENVIRONMENTS: usize = 3;
/// Busy GPUs described per environment before the rest are only counted.
const SHOWN_GPUS: usize = 4;
/// Other experiments' trials holding host cores (memory) described before the rest are only
/// summed.
const SHOWN_HOLDERS: usize = 4;

fn plural(count: u64, one: &str, many: &str) -> String {
    if count == 1 {
        format!("1 {one}")
    } else {
        format!("{count} {many}")
    }
}

fn join_and(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [only] => only.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// "2 GPUs with 10 GiB each, 4 CPU cores and 8 GiB of host memory".
pub(crate) fn describe_demand(demand: &Demand) -> String {
    let mut parts = Vec::new();
    let count = demand.gpu_count();
    let gpus = match &demand.gpus {
        GpuDemand::Devices { host, indices } => Some(format!(
            "{} {} on {host}",
            if indices.len() == 1 { "GPU" } else { "GPUs" },
            describe_indices(indices.iter().copied())
        )),
        _ if count > 0 => Some(plural(u64::from(count), "GPU", "GPUs")),
        _ => None,
    };
    if let Some(mut gpus) = gpus {
        if demand.gpu_memory > 0 {
            let each = if count > 1 { " each" } else { "" };
            write!(gpus, " with {}{each}", ByteSize(demand.gpu_memory)).unwrap();
        }
        parts.push(gpus);
    }
    if demand.cpu_cores > 0 {
        parts.push(plural(u64::from(demand.cpu_cores), "CPU core", "CPU cores"));
    }
    if demand.host_memory > 0 {
        parts.push(format!("{} of host memory", ByteSize(demand.host_memory)));
    }
    if parts.is_empty() {
        "no GPU".to_owned()
    } else {
        join_and(&parts)
    }
}

/// `Some(reason)` when no environment could ever take the request. A starting environment
/// (resources unknown) or an empty inventory means "not known yet", so no rejection.
pub(crate) fn rejection(envs: &[EnvState], demand: &Demand) -> Option<String> {
    // Runs before every decision: stop at the first environment that settles it, which is
    // usually the first one.
    let mut any_counted = false;
    for env in envs {
        match env.env.status {
            EnvironmentStatus::Draining => continue,
            EnvironmentStatus::Starting => return None,
            _ => {}
        }
        // No permanent blocker here: this environment may take it one day, so no rejection.
        permanent_blocker(env, demand)?;
        any_counted = true;
    }
    if !any_counted {
        return None;
    }
    let counted: Vec<&EnvState> = envs
        .iter()
        .filter(|env| env.env.status != EnvironmentStatus::Draining)
        .collect();
    let asks = format!("the trial asks for {}", describe_demand(demand));
    if let GpuDemand::Devices { host, .. } = &demand.gpus {
        let Some(env) = counted.iter().find(|env| env.env.host == *host) else {
            let mut hosts: Vec<&str> = counted.iter().map(|env| env.env.host.as_str()).collect();
            hosts.dedup();
            return Some(format!(
                "{asks}, but no environment is on host {host} (hosts: {}): fix the Device constraint",
                hosts.join(", ")
            ));
        };
        let blocker = permanent_blocker(env, demand)?;
        return Some(format!(
            "{asks}, but {}",
            permanent_text(env, demand, blocker, &env.env.host)
        ));
    }
    // The first registered among the largest, by GPUs, then GPU memory, host memory, cores.
    let size = |env: &EnvState| {
        let largest_gpu = env
            .loads
            .iter()
            .filter(|load| load.allowed)
            .map(|load| load.total_memory)
            .max();
        let host = &env.env.host_resources;
        (
            env.allowed_gpus,
            largest_gpu,
            host.memory_total,
            host.cpu_count,
        )
    };
    let mut largest = counted[0];
    for env in &counted[1..] {
        if size(env) > size(largest) {
            largest = env;
        }
    }
    let blocker = permanent_blocker(largest, demand)?;
    let subject = format!("the largest environment, {},", largest.env.id);
    Some(format!(
        "{asks}, but {}",
        permanent_text(largest, demand, blocker, &subject)
    ))
}

/// "<subject> has …: <what to change>".
fn permanent_text(env: &EnvState, demand: &Demand, blocker: Permanent, subject: &str) -> String {
    let count = demand.gpu_count();
    let host = &env.env.host_resources;
    match blocker {
        Permanent::TooFewGpus => {
            let found = env.loads.len() as u64;
            let allowed = u64::from(env.allowed_gpus);
            let has = if allowed < found {
                format!(
                    "has {} of which gpuIndices allows {allowed}",
                    plural(found, "GPU", "GPUs")
                )
            } else if found == 0 {
                match &env.env.gpu_source {
                    GpuSource::Unavailable { reason } => format!("has no GPU ({reason})"),
                    _ => "has no GPU".to_owned(),
                }
            } else {
                format!("has {}", plural(found, "GPU", "GPUs"))
            };
            let change = if allowed == 0 && found > 0 {
                // The GPUs are there: only the indices name none of them.
                format!(
                    "list GPUs it has (indices 0 to {}) in gpuIndices, or set trialGpuNumber to 0",
                    found - 1
                )
            } else if allowed == 0 {
                "set trialGpuNumber to 0, or run on a machine with an NVIDIA GPU".to_owned()
            } else {
                format!("ask for {allowed} or fewer, or add an environment with {count} GPUs")
            };
            format!("{subject} {has}: {change}")
        }
        Permanent::GpuMemory => {
            let mut capacities: Vec<u64> = env
                .loads
                .iter()
                .filter(|load| load.allowed)
                .map(|load| load.capacity_memory)
                .collect();
            capacities.sort_unstable_by(|a, b| b.cmp(a));
            let large_enough = capacities
                .iter()
                .filter(|&&capacity| capacity >= demand.gpu_memory.max(1))
                .count();
            // The most each of `count` GPUs could be promised.
            let feasible = capacities[count as usize - 1];
            let mut totals: Vec<u64> = env
                .loads
                .iter()
                .filter(|load| load.allowed)
                .map(|load| load.total_memory)
                .collect();
            totals.sort_unstable_by(|a, b| b.cmp(a));
            let largest_total = totals[0];
            let up_to = match gpu_limits_text(env) {
                Some(limits) => format!(
                    "its GPUs have up to {}, of which {limits} leave up to {}",
                    ByteSize(largest_total),
                    ByteSize(capacities[0])
                ),
                None => format!("its GPUs have up to {}", ByteSize(capacities[0])),
            };
            let with = if demand.gpu_memory > 0 {
                format!(" with {} or more", ByteSize(demand.gpu_memory))
            } else {
                " with memory left by the limits".to_owned()
            };
            let change = gpu_change(env, totals[count as usize - 1], feasible, demand.gpu_memory);
            format!(
                "{subject} has {}{with} ({up_to}): {change}",
                plural(large_enough as u64, "GPU", "GPUs"),
            )
        }
        Permanent::HostMemory => {
            let mut kept = Vec::new();
            let reserve = env.memory_reserve();
            if reserve > 0 {
                kept.push(format!("keeps {} free (memoryReserve)", ByteSize(reserve)));
            }
            if let Some(percent) = env.env.limits.max_memory_utilization {
                kept.push(format!("lets {percent}% be used (maxMemoryUtilization)"));
            }
            let kept = if kept.is_empty() {
                String::new()
            } else {
                format!(" and {}", join_and(&kept))
            };
            let change = limit_change(
                Limit {
                    request: "trialMemorySize",
                    reserve: env.env.limits.min_available_memory.map(|reserve| ("memoryReserve", reserve)),
                    utilization: "maxMemoryUtilization",
                },
                host.memory_total.bytes(),
                env.host_memory_capacity(),
                demand.host_memory,
            );
            format!("{subject} has {} of memory{kept}: {change}", host.memory_total)
        }
        Permanent::CpuCores => format!(
            "{subject} has {}: lower trialCpuNumber to {} or less",
            plural(u64::from(host.cpu_count), "CPU core", "CPU cores"),
            host.cpu_count
        ),
        Permanent::MissingDevice(index) => format!(
            "{subject} has no GPU {index} (its GPUs: {}): fix the Device constraint",
            describe_indices(env.loads.iter().map(|load| load.index))
        ),
        Permanent::DeviceNotAllowed(index) => format!(
            "GPU {index} on {subject} is outside its gpuIndices ({}): fix the Device constraint or gpuIndices",
            describe_indices(env.loads.iter().filter(|load| load.allowed).map(|load| load.index))
        ),
        Permanent::DeviceMemory(index) => {
            let load = env.position_of(index).map(|position| &env.loads[position]);
            let total = load.map_or(0, |load| load.total_memory);
            let capacity = load.map_or(0, |load| load.capacity_memory);
            let limits = match gpu_limits_text(env) {
                Some(limits) if capacity < total => {
                    format!(", of which {limits} leave {}", ByteSize(capacity))
                }
                _ => String::new(),
            };
            format!(
                "GPU {index} on {subject} has {}{limits}: {}",
                ByteSize(total),
                gpu_change(env, total, capacity, demand.gpu_memory)
            )
        }
        Permanent::OtherHost => format!("{subject} is not host {}", env.env.host),
    }
}

/// The fields of one kind of memory limit, for the advice of a refusal.
struct Limit {
    request: &'static str,
    reserve: Option<(&'static str, ByteSize)>,
    utilization: &'static str,
}

/// What to change when the limits leave `capacity` of `total` and a trial asks `asked` (0: none)
/// of it: the request, while the limits leave something; the limits otherwise, since no request
/// could fit then (lowering it to "0 B or less" cannot be done).
fn limit_change(limit: Limit, total: u64, capacity: u64, asked: u64) -> String {
    if capacity > 0 {
        return format!("lower {} to {} or less", limit.request, ByteSize(capacity));
    }
    match limit.reserve {
        Some((field, reserve)) if reserve.bytes() >= total => {
            if asked == 0 {
                format!("lower {field} below {}", ByteSize(total))
            } else if asked < total {
                format!("lower {field} to {} or less", ByteSize(total - asked))
            } else {
                format!(
                    "lower {field} and {} to {} or less together",
                    limit.request,
                    ByteSize(total)
                )
            }
        }
        _ => format!("raise {}", limit.utilization),
    }
}

/// [`limit_change`] for one GPU of `total` memory.
fn gpu_change(env: &EnvState, total: u64, capacity: u64, asked: u64) -> String {
    limit_change(
        Limit {
            request: "trialGpuMemory",
            reserve: env
                .env
                .limits
                .gpu_memory_reserve
                .map(|reserve| ("gpuMemoryReserve", reserve)),
            utilization: "maxGpuMemoryUtilization",
        },
        total,
        capacity,
        asked,
    )
}

/// "gpuMemoryReserve 2 GiB and maxGpuMemoryUtilization 80%", or `None` without GPU limits.
fn gpu_limits_text(env: &EnvState) -> Option<String> {
    let limits = &env.env.limits;
    let mut parts = Vec::new();
    if let Some(reserve) = limits.gpu_memory_reserve {
        parts.push(format!("gpuMemoryReserve {reserve}"));
    }
    if let Some(percent) = limits.max_gpu_memory_utilization {
        parts.push(format!("maxGpuMemoryUtilization {percent}%"));
    }
    (!parts.is_empty()).then(|| join_and(&parts))
}

/// Whether an environment could ever take the demand, as a waiting reason counts them: not
/// draining, and starting (its resources unknown) or with nothing that always blocks it.
fn eligible(env: &EnvState, demand: &Demand) -> bool {
    match env.env.status {
        EnvironmentStatus::Draining => false,
        EnvironmentStatus::Starting => true,
        _ => permanent_blocker(env, demand).is_none(),
    }
}

/// How many environments could ever take the demand (see [`eligible`]).
pub(crate) fn eligible_count(envs: &[EnvState], demand: &Demand) -> usize {
    envs.iter().filter(|env| eligible(env, demand)).count()
}

/// Why a request that could fit some day does not fit now: "waiting for 2 GPUs: node1: 1 of
/// 2 GPUs free (GPU 0 runs t1, GPU 3 held for waiting trial t9); node2: starting; and 3 more
/// environments". `eligible_envs`, when the caller knows it, is [`eligible_count`]: the
/// environments after the ones described are then not looked at.
pub(crate) fn waiting(
    envs: &[EnvState],
    holds: &Holds,
    demand: &Demand,
    waiting: &[TrialRequest],
    eligible_envs: Option<usize>,
) -> String {
    let asks_nothing = demand.gpu_count() == 0 && demand.cpu_cores == 0 && demand.host_memory == 0;
    let mut text = if asks_nothing {
        // "waiting for no GPU" read as if the trial waited for GPUs.
        "waiting to start: ".to_owned()
    } else {
        format!("waiting for {}: ", describe_demand(demand))
    };
    if envs.is_empty() {
        text.push_str("no environment is registered yet");
        return text;
    }
    let mut shown = 0;
    let mut more = 0;
    for (position, env) in envs.iter().enumerate() {
        let status = &env.env.status;
        if !eligible(env, demand) {
            continue;
        }
        if shown == SHOWN_ENVIRONMENTS {
            if let Some(count) = eligible_envs {
                more = count.saturating_sub(SHOWN_ENVIRONMENTS) as u64;
                break;
            }
            more += 1;
            continue;
        }
        if shown > 0 {
            text.push_str("; ");
        }
        shown += 1;
        write!(text, "{}: ", env.env.id).unwrap();
        match status {
            EnvironmentStatus::Starting => text.push_str("starting"),
            EnvironmentStatus::Unavailable(reason) => {
                write!(text, "unavailable ({reason})").unwrap()
            }
            _ => text.push_str(&busy_environment(env, position, holds, demand, waiting)),
        }
    }
    if shown == 0 {
        text.push_str("every environment is draining");
    } else if more > 0 {
        write!(
            text,
            "; and {}",
            plural(more, "more environment", "more environments")
        )
        .unwrap();
    }
    text
}

fn held_by(waiting: &[TrialRequest], position: u32) -> String {
    let mut text = String::new();
    write_held_by(&mut text, waiting, position);
    text
}

/// Whose turn a held resource is: "waiting trial t9".
fn write_held_by(out: &mut String, waiting: &[TrialRequest], position: u32) {
    match waiting.get(position as usize) {
        Some(request) => write!(out, "waiting trial {}", request.trial).unwrap(),
        None => out.push_str("an earlier waiting trial"),
    }
}

/// What blocks a ready environment that could take the request once something frees up.
fn busy_environment(
    env: &EnvState,
    env_position: usize,
    holds: &Holds,
    demand: &Demand,
    waiting: &[TrialRequest],
) -> String {
    let hold = holds.get(env_position);
    let host = &env.env.host_resources;
    let mut issues = Vec::new();
    // What the waiting trials of this pass hold here, and who else holds or was promised it.
    let notes = |kind: HostShare, held: u64| {
        let mut notes = elsewhere_notes(env, kind);
        if let Some(holder) = hold.and_then(|hold| hold.host_holder).filter(|_| held > 0) {
            notes.push(format!(
                "{} held for {}",
                kind.amount(held),
                held_by(waiting, holder)
            ));
        }
        notes
    };
    let held_cores = hold.map_or(0, |hold| hold.cpu_cores);
    if demand.cpu_cores > 0 && env.free_cpu_cores().saturating_sub(held_cores) < demand.cpu_cores {
        issues.push(format!(
            "{} of {} CPU cores free{}",
            env.free_cpu_cores().saturating_sub(held_cores),
            host.cpu_count,
            parenthesized(&notes(HostShare::CpuCores, u64::from(held_cores)))
        ));
    }
    if env.at_max_trials() {
        issues.push(format!(
            "runs {}, as many as it takes",
            plural(env.trials.len() as u64, "trial", "trials")
        ));
    }
    if env.cpu_too_busy() {
        let limit = env.env.limits.max_cpu_utilization.unwrap_or(0.0);
        issues.push(match host.cpu_utilization_percent {
            Some(percent) => format!("CPU at {percent:.0}% (maxCpuUtilization {limit}%)"),
            None => format!("CPU use not measured yet (maxCpuUtilization {limit}%)"),
        });
    }
    let reserve = env.memory_reserve();
    let held_memory = hold.map_or(0, |hold| hold.host_memory);
    let available = env.unclaimed_host_memory().saturating_sub(held_memory);
    if (demand.host_memory > 0 || reserve > 0) && available < demand.host_memory + reserve {
        let mut memory_notes = Vec::new();
        if reserve > 0 {
            memory_notes.push(format!("memoryReserve {} kept free", ByteSize(reserve)));
        }
        memory_notes.extend(notes(HostShare::Memory, held_memory));
        issues.push(format!(
            "{} of memory available{}",
            ByteSize(available),
            parenthesized(&memory_notes)
        ));
    } else if let Some(ceiling) = env.memory_use_ceiling() {
        let total = host.memory_total.bytes();
        let in_use = total.saturating_sub(available);
        if in_use + demand.host_memory > ceiling {
            let with = if demand.host_memory > 0 {
                format!(
                    ", {:.0}% with the trial's {}",
                    percent_of(in_use + demand.host_memory, total),
                    ByteSize(demand.host_memory)
                )
            } else {
                String::new()
            };
            let mut memory_notes = vec![format!(
                "maxMemoryUtilization {}%",
                env.env.limits.max_memory_utilization.unwrap_or(0.0)
            )];
            memory_notes.extend(notes(HostShare::Memory, held_memory));
            issues.push(format!(
                "host memory {:.0}% used{with}{}",
                percent_of(in_use, total),
                parenthesized(&memory_notes)
            ));
        }
    }
    let count = demand.gpu_count();
    if count > 0 {
        let positions: Vec<usize> = match &demand.gpus {
            GpuDemand::Devices { indices, .. } => indices
                .iter()
                .filter_map(|&index| env.position_of(index))
                .collect(),
            _ => (0..env.loads.len()).collect(),
        };
        let blocked: Vec<(usize, GpuBlocker)> = positions
            .iter()
            .filter_map(|&position| {
                gpu_blocker(env, env_position, position, holds, demand)
                    .map(|blocker| (position, blocker))
            })
            .collect();
        let fitting = match demand.gpus {
            GpuDemand::Devices { .. } => count - blocked.len() as u32,
            _ => fitting_gpu_count(env, hold, demand.gpu_memory),
        };
        if fitting < count
            || !blocked.is_empty() && matches!(demand.gpus, GpuDemand::Devices { .. })
        {
            let mut gpus = if count == 1 {
                "no GPU free".to_owned()
            } else {
                format!("{fitting} of {count} GPUs free")
            };
            // Written in place: on a full cluster a reason describes a dozen busy GPUs, and one
            // string for each part, joined, was half of its cost (`sim_scale`).
            if !blocked.is_empty() {
                gpus.push_str(" (");
                for (shown, &(position, blocker)) in blocked.iter().take(SHOWN_GPUS).enumerate() {
                    if shown > 0 {
                        gpus.push_str(", ");
                    }
                    describe_gpu_blocker(&mut gpus, env, position, blocker, demand, waiting);
                }
                let extra = blocked.len().saturating_sub(SHOWN_GPUS);
                if extra > 0 {
                    write!(gpus, ", {extra} more busy").unwrap();
                }
                gpus.push(')');
            }
            issues.push(gpus);
        }
    }
    if issues.is_empty() {
        // Nothing above blocks it, so it fits here now; it waits only because older trials in
        // this pass hold what it would need elsewhere in its shape (a Device request whose host
        // has two environments, say). Say so rather than print an empty reason.
        issues.push("would fit, but older waiting trials come first".to_owned());
    }
    issues.join(", ")
}

/// " (a, b)", or nothing without parts.
fn parenthesized(parts: &[String]) -> String {
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// The host resource a note is about.
#[derive(Clone, Copy)]
enum HostShare {
    CpuCores,
    Memory,
}

impl HostShare {
    fn of(self, holder: &HostHolder) -> u64 {
        match self {
            HostShare::CpuCores => u64::from(holder.cpu_cores),
            HostShare::Memory => holder.host_memory.bytes(),
        }
    }

    fn total(self, held: &HostHeldElsewhere) -> u64 {
        match self {
            HostShare::CpuCores => u64::from(held.cpu_cores),
            HostShare::Memory => held.host_memory.bytes(),
        }
    }

    /// "1 core", "2 cores", "10 GiB".
    fn amount(self, amount: u64) -> String {
        match self {
            HostShare::CpuCores => plural(amount, "core", "cores"),
            HostShare::Memory => ByteSize(amount).to_string(),
        }
    }
}

/// What other experiments hold of the host's cores (memory) here, and what is promised first
/// to their older waiting requests, as GPU reasons name a GPU's holders: "1 core held by trial
/// t1 of experiment a", "2 cores promised first to the waiting trials of experiment b (asked
/// earlier)". Without the ledger saying who, "… held by other experiments".
fn elsewhere_notes(env: &EnvState, kind: HostShare) -> Vec<String> {
    let held = &env.env.host_held_elsewhere;
    let holders: Vec<&HostHolder> = held
        .holders
        .iter()
        .filter(|holder| kind.of(holder) > 0)
        .collect();
    let mut notes = Vec::new();
    for holder in holders.iter().take(SHOWN_HOLDERS) {
        let whom = match &holder.trial {
            Some(trial) => format!("trial {trial} of experiment {}", holder.experiment),
            None => format!("the waiting trials of experiment {}", holder.experiment),
        };
        let amount = kind.amount(kind.of(holder));
        notes.push(if holder.asked_earlier {
            format!("{amount} promised first to {whom} (asked earlier)")
        } else {
            format!("{amount} held by {whom}")
        });
    }
    let not_shown: u64 = holders
        .iter()
        .skip(SHOWN_HOLDERS)
        .map(|holder| kind.of(holder))
        .sum();
    if not_shown > 0 {
        notes.push(format!(
            "{} more held by or promised to other experiments",
            kind.amount(not_shown)
        ));
    }
    let named: u64 = holders.iter().map(|holder| kind.of(holder)).sum();
    let unnamed = kind.total(held).saturating_sub(named);
    if unnamed > 0 {
        notes.push(format!(
            "{} held by other experiments",
            kind.amount(unnamed)
        ));
    }
    notes
}

/// What keeps one allowed GPU from taking a slot of the request now.
#[derive(Clone, Copy)]
enum GpuBlocker {
    /// Held for the waiting trial at this queue position.
    Held(u32),
    Foreign,
    /// Runs as many trials as it may (this many).
    Full(u32),
    Memory,
}

/// What keeps one allowed GPU from taking a slot of the request now; `None` if it can (or is
/// not in the allow-list, which is a permanent matter, not a busy one). Decided without
/// formatting: a reason describes only the first few of an environment's busy GPUs.
fn gpu_blocker(
    env: &EnvState,
    env_position: usize,
    position: usize,
    holds: &Holds,
    demand: &Demand,
) -> Option<GpuBlocker> {
    let load = &env.loads[position];
    let gpu = &env.env.gpus[position];
    if !load.allowed {
        return None;
    }
    if let Some(holder) = holds.gpu_holder(env_position, position) {
        return Some(GpuBlocker::Held(holder));
    }
    if load.foreign_blocked {
        return Some(GpuBlocker::Foreign);
    }
    let max = gpu.trial_limit(env.env.limits.max_trial_number_per_gpu);
    if load.trials + load.elsewhere >= max {
        return Some(GpuBlocker::Full(max));
    }
    if load.over_limit || load.admissible_memory < demand.gpu_memory {
        return Some(GpuBlocker::Memory);
    }
    None
}

/// One busy GPU, as a reason names it, written at the end of `out`.
fn describe_gpu_blocker(
    out: &mut String,
    env: &EnvState,
    position: usize,
    blocker: GpuBlocker,
    demand: &Demand,
    waiting: &[TrialRequest],
) {
    let load = &env.loads[position];
    let gpu = &env.env.gpus[position];
    match blocker {
        GpuBlocker::Held(holder) => {
            write!(out, "GPU {} held for ", load.index).unwrap();
            write_held_by(out, waiting, holder);
        }
        GpuBlocker::Foreign => {
            let pids: Vec<String> = gpu
                .foreign_processes
                .iter()
                .map(|process| process.pid.to_string())
                .collect();
            let memory = gpu.foreign_memory();
            let using = if memory.bytes() > 0 {
                format!(" using {memory}")
            } else {
                String::new()
            };
            let word = if pids.len() == 1 { "pid" } else { "pids" };
            write!(
                out,
                "GPU {} runs foreign {word} {}{using} and useActiveGpu is off",
                load.index,
                pids.join(", ")
            )
            .unwrap();
        }
        GpuBlocker::Full(max) => {
            write!(out, "GPU {} ", load.index).unwrap();
            let (promised, held): (Vec<&HeldElsewhere>, Vec<&HeldElsewhere>) = gpu
                .held_elsewhere
                .iter()
                .partition(|held| held.asked_earlier);
            if !gpu.trials.is_empty() || !held.is_empty() {
                out.push_str("runs ");
                let mut first = true;
                let mut separate = |out: &mut String| {
                    if !std::mem::take(&mut first) {
                        out.push_str(", ");
                    }
                };
                for trial in &gpu.trials {
                    separate(out);
                    write!(out, "{trial}").unwrap();
                }
                for held in held {
                    separate(out);
                    write!(
                        out,
                        "trial {} of experiment {}",
                        held.trial, held.experiment
                    )
                    .unwrap();
                }
                if max > 1 {
                    write!(out, " ({max} per GPU)").unwrap();
                }
                if !promised.is_empty() {
                    out.push_str(" and is ");
                }
            }
            // Nothing runs for a promise: the GPU waits for a trial of another experiment that
            // asked first (the ledger grants no newer request of others it while it waits).
            for (shown, promise) in promised.iter().enumerate() {
                out.push_str(if shown == 0 {
                    "promised first to "
                } else {
                    ", "
                });
                if promise.trial == STANDING {
                    write!(
                        out,
                        "the waiting trials of experiment {}",
                        promise.experiment
                    )
                } else {
                    write!(
                        out,
                        "waiting trial {} of experiment {}",
                        promise.trial, promise.experiment
                    )
                }
                .unwrap();
                if shown + 1 == promised.len() {
                    out.push_str(" (asked earlier)");
                }
            }
        }
        GpuBlocker::Memory => out.push_str(&gpu_memory_blocker(env, position, demand)),
    }
}

/// Why a GPU's memory does not admit the request: its free memory, and the limit that holds it
/// back when one does.
fn gpu_memory_blocker(env: &EnvState, position: usize, demand: &Demand) -> String {
    let load = &env.loads[position];
    let limits = &env.env.limits;
    let free = ByteSize(load.available_memory);
    if let Some(reserve) = limits.gpu_memory_reserve {
        if load.available_memory < reserve.bytes() + demand.gpu_memory {
            return format!(
                "GPU {} has {free} free (gpuMemoryReserve {reserve} kept free)",
                load.index
            );
        }
    }
    if let Some(percent) = limits.max_gpu_memory_utilization {
        let in_use = load.total_memory - load.available_memory;
        if in_use + demand.gpu_memory > share(load.total_memory, percent) {
            let with = if demand.gpu_memory > 0 {
                format!(
                    ", {:.0}% with the trial's {}",
                    percent_of(in_use + demand.gpu_memory, load.total_memory),
                    ByteSize(demand.gpu_memory)
                )
            } else {
                String::new()
            };
            return format!(
                "GPU {} memory {:.0}% used{with} (maxGpuMemoryUtilization {percent}%)",
                load.index,
                percent_of(in_use, load.total_memory)
            );
        }
    }
    format!("GPU {} has {free} free", load.index)
}

fn percent_of(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}
