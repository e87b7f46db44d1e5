//! Simulated inventories from a short spec, so that tests, demos and benchmarks run on machines
//! without GPUs: `KNOB_SIMULATE_GPUS="4x80GiB"`.

use std::collections::BTreeSet;

use crate::bytes::ByteSize;
use crate::error::SimulationSpecError;
use crate::inventory::{
    Environment, EnvironmentLimits, EnvironmentStatus, Gpu, GpuSource, HostResources,
};

/// The environment variable that replaces NVML with a simulated inventory.
pub const SIMULATE_GPUS_VAR: &str = "KNOB_SIMULATE_GPUS";

/// The most GPUs one spec may simulate, over all its environments: far more than any real
/// cluster knob schedules on, while a typo such as `1000000x80GiB` is refused in one line
/// instead of taking most of a minute and 700 MB to build and then to schedule over.
pub const MAX_SIMULATED_GPUS: usize = 4096;

/// Host figures for a simulated environment when neither the spec nor a real probe gives them.
const DEFAULT_CPU_COUNT: u32 = 16;
const DEFAULT_MEMORY: ByteSize = ByteSize::gib(64);

/// A parsed spec.
///
/// Grammar: environments separated by `;`, each an optional `name=` followed by `,`-separated
/// items: `COUNTxSIZE` (that many GPUs of that memory; several groups add up), `cpu=N` and
/// `mem=SIZE`. Examples: `4x80GiB`; `2x80GiB,2x40GiB,cpu=32`;
/// `node1=8x80GiB,mem=512GiB;node2=4x24GiB`. With more than one environment each needs a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedInventory {
    spec: String,
    environments: Vec<SimulatedEnvironment>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct SimulatedEnvironment {
    name: Option<String>,
    gpu_memory: Vec<ByteSize>,
    cpu_count: Option<u32>,
    memory: Option<ByteSize>,
}

impl SimulatedInventory {
    pub fn parse(spec: &str) -> Result<SimulatedInventory, SimulationSpecError> {
        let fail = |problem: String| SimulationSpecError {
            spec: spec.to_owned(),
            problem,
        };
        let parts: Vec<&str> = spec
            .split(';')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .collect();
        if parts.is_empty() {
            return Err(fail("it is empty".to_owned()));
        }
        let mut environments = Vec::new();
        let mut gpus = 0;
        for part in &parts {
            let environment = parse_environment(part, MAX_SIMULATED_GPUS - gpus).map_err(&fail)?;
            gpus += environment.gpu_memory.len();
            environments.push(environment);
        }
        if environments.len() > 1 {
            let mut names = BTreeSet::new();
            for env in &environments {
                let Some(name) = &env.name else {
                    return Err(fail(
                        "several environments need a name each (`name=4x80GiB`)".to_owned(),
                    ));
                };
                if !names.insert(name) {
                    return Err(fail(format!("environment {name} appears twice")));
                }
            }
        }
        Ok(SimulatedInventory {
            spec: spec.trim().to_owned(),
            environments,
        })
    }

    /// Reads [`SIMULATE_GPUS_VAR`]; `Ok(None)` when it is unset or blank.
    pub fn from_env() -> Result<Option<SimulatedInventory>, SimulationSpecError> {
        match std::env::var(SIMULATE_GPUS_VAR) {
            Ok(spec) if !spec.trim().is_empty() => SimulatedInventory::parse(&spec).map(Some),
            _ => Ok(None),
        }
    }

    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// The simulated environments, ready and idle. An unnamed environment gets `default_id`
    /// and host `localhost`. CPU and memory not given in the spec come from `real_host` when
    /// given (a demo on this machine), else from fixed defaults (16 cores, 64 GiB) so that tests
    /// see the same inventory everywhere.
    pub fn environments(
        &self,
        default_id: &str,
        real_host: Option<&HostResources>,
    ) -> Vec<Environment> {
        self.environments
            .iter()
            .map(|sim| {
                let (id, host) = match &sim.name {
                    Some(name) => (name.clone(), name.clone()),
                    None => (default_id.to_owned(), "localhost".to_owned()),
                };
                let gpus = sim
                    .gpu_memory
                    .iter()
                    .zip(0u32..)
                    .map(|(&memory, index)| Gpu {
                        uuid: format!("GPU-simulated-{id}-{index}"),
                        ..Gpu::idle(index, format!("Simulated GPU ({memory})"), memory)
                    })
                    .collect();
                let host_resources = match real_host {
                    Some(real) => HostResources {
                        cpu_count: sim.cpu_count.unwrap_or(real.cpu_count),
                        cpu_utilization_percent: real.cpu_utilization_percent,
                        memory_total: sim.memory.unwrap_or(real.memory_total),
                        memory_available: sim.memory.unwrap_or(real.memory_available),
                    },
                    None => HostResources {
                        cpu_count: sim.cpu_count.unwrap_or(DEFAULT_CPU_COUNT),
                        cpu_utilization_percent: Some(0.0),
                        memory_total: sim.memory.unwrap_or(DEFAULT_MEMORY),
                        memory_available: sim.memory.unwrap_or(DEFAULT_MEMORY),
                    },
                };
                Environment {
                    id: id.into(),
                    host,
                    status: EnvironmentStatus::Ready,
                    gpus,
                    gpu_source: GpuSource::Simulated {
                        spec: self.spec.clone(),
                    },
                    host_resources,
                    limits: EnvironmentLimits::default(),
                    host_held_elsewhere: Default::default(),
                }
            })
            .collect()
    }
}

/// Parses one environment of at most `gpus_left` GPUs (what [`MAX_SIMULATED_GPUS`] leaves
/// after the environments before it).
fn parse_environment(text: &str, gpus_left: usize) -> Result<SimulatedEnvironment, String> {
    let (name, items) = match text.split_once('=') {
        Some((name, rest)) if !name.contains(',') && !matches!(name.trim(), "cpu" | "mem") => {
            let name = name.trim();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(format!("`{name}` is not an environment name"));
            }
            (Some(name.to_owned()), rest)
        }
        _ => (None, text),
    };
    let mut env = SimulatedEnvironment {
        name,
        gpu_memory: Vec::new(),
        cpu_count: None,
        memory: None,
    };
    for item in items.split(',').map(str::trim) {
        if let Some(count) = item.strip_prefix("cpu=") {
            let count = whole_number(count)
                .filter(|&count| count > 0)
                .ok_or_else(|| format!("`{item}` needs a whole number of cores above 0"))?;
            let count = u32::try_from(count).map_err(|_| {
                format!(
                    "`{item}` is more cores than can be simulated ({})",
                    u32::MAX
                )
            })?;
            env.cpu_count = Some(count);
        } else if let Some(size) = item.strip_prefix("mem=") {
            let memory = simulated_size(item, size)?;
            if memory.bytes() == 0 {
                return Err(format!("`{item}` gives the machine no memory"));
            }
            env.memory = Some(memory);
        } else if let Some((count, size)) = item.split_once(['x', 'X']) {
            // A count too large for any integer is past the bound as well, not "missing".
            let count = whole_number(count)
                .filter(|&count| count > 0)
                .ok_or_else(|| format!("`{item}` needs a GPU count above 0 before the x"))?;
            if size.trim().is_empty() {
                return Err(format!("`{item}` needs a memory size after the x"));
            }
            let memory = simulated_size(item, size)?;
            if memory.bytes() == 0 {
                return Err(format!("`{item}` gives GPUs no memory"));
            }
            // Checked before anything is allocated for them.
            if count > (gpus_left - env.gpu_memory.len()) as u64 {
                return Err(format!(
                    "`{item}` takes the spec past {MAX_SIMULATED_GPUS} GPUs, the most that can be simulated"
                ));
            }
            env.gpu_memory
                .extend(std::iter::repeat_n(memory, count as usize));
        } else {
            return Err(format!(
                "`{item}` is neither COUNTxSIZE, cpu=N nor mem=SIZE"
            ));
        }
    }
    Ok(env)
}

/// Digits alone, as a number; one too large for `u64` reads as `u64::MAX` (past every bound).
fn whole_number(text: &str) -> Option<u64> {
    let text = text.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse().unwrap_or(u64::MAX))
}

/// The size in `item` (`size` is its text): with a unit, since a bare number is bytes and
/// `4x80` surely did not mean GPUs of 80 bytes.
fn simulated_size(item: &str, size: &str) -> Result<ByteSize, String> {
    let size = size.trim();
    if !size.is_empty() && size.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(format!(
            "`{item}` needs a unit after {size}, such as {size}GiB"
        ));
    }
    size.parse::<ByteSize>()
        .map_err(|e| format!("`{item}`: {e}"))
}
