//! `knob gpu`: what knob sees on this machine — GPUs through NVML (or `KNOB_SIMULATE_GPUS`),
//! CPUs and memory — and, without a usable driver, why there are no GPUs; and from the
//! machine's lease ledger, which experiment's trials hold (or wait for) each GPU.

use std::process::ExitCode;

use knob_gpu_sched::ledger::{self, Ledger, LedgerState, THIS_MACHINE};
use knob_gpu_sched::probe::LocalProbe;
use knob_gpu_sched::{ByteSize, GpuSource, Inventory};

use crate::table::render;

pub fn run(json: bool) -> anyhow::Result<ExitCode> {
    // Named for what it is: the training service that runs trials here reports it under its
    // own environment id.
    let mut probe = LocalProbe::new("this-machine")?;
    // Nothing of knob's runs from here, so every GPU process is foreign.
    let mut inventory = Inventory {
        environments: probe.sample_blocking(&|_pid| false),
    };
    // A ledger that cannot be read hides only who holds what: the machine is still shown, as
    // experiments still run on it (their trials without leases).
    let leases = read_ledger().unwrap_or_else(|e| {
        errln!("warning: cannot show which experiments hold the GPUs: {e:#}");
        None
    });
    if let (Some(state), Some(environment)) = (&leases, inventory.environments.first_mut()) {
        // This process holds nothing: every lease is another process's. It stands in no line,
        // so a ticket of 0 (older than every request) marks no request as holding a GPU: what
        // waits is listed apart (`waiting`), not as a holder.
        state.annotate(environment, THIS_MACHINE, std::process::id(), Some(0));
    }
    let waiting = leases.as_ref().map(waiting_requests).unwrap_or_default();
    if json {
        let mut value = serde_json::to_value(&inventory)?;
        value["waiting"] = serde_json::to_value(&waiting)?;
        stdoutln!("{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    for environment in &inventory.environments {
        let host = &environment.host_resources;
        let cpu = host
            .cpu_utilization_percent
            .map(|u| format!(", {u:.0}% busy"))
            .unwrap_or_default();
        stdoutln!(
            "{} ({}): {} CPUs{cpu}, memory {} of {} available",
            environment.id.as_str(),
            environment.host,
            host.cpu_count,
            host.memory_available,
            host.memory_total
        )?;
        match &environment.gpu_source {
            GpuSource::Nvml {
                driver_version,
                cuda_version,
                warnings,
            } => {
                let cuda = cuda_version
                    .as_deref()
                    .map(|v| format!(", CUDA {v}"))
                    .unwrap_or_default();
                stdoutln!("  NVML: driver {driver_version}{cuda}")?;
                for warning in warnings {
                    stdoutln!("  warning: {warning}")?;
                }
            }
            GpuSource::Simulated { spec } => {
                stdoutln!("  simulated GPUs (KNOB_SIMULATE_GPUS={spec})")?
            }
            GpuSource::Unavailable { reason } => stdoutln!("  no GPUs: {reason}")?,
            GpuSource::Declared => {}
        }
        if environment.gpus.is_empty() {
            continue;
        }
        let rows: Vec<Vec<String>> = environment
            .gpus
            .iter()
            .map(|gpu| {
                let held: Vec<String> = gpu
                    .held_elsewhere
                    .iter()
                    .map(|held| format!("{} trial {}", held.experiment, held.trial))
                    .collect();
                let processes: Vec<String> = gpu
                    .foreign_processes
                    .iter()
                    .map(|p| match p.used_memory {
                        Some(memory) => format!("{} ({memory})", p.pid),
                        None => p.pid.to_string(),
                    })
                    .collect();
                vec![
                    gpu.index.to_string(),
                    gpu.name.clone(),
                    format!("{} / {}", gpu.memory_used, gpu.memory_total),
                    gpu.utilization_percent
                        .map(|u| format!("{u}%"))
                        .unwrap_or_else(|| "-".into()),
                    if processes.is_empty() {
                        "-".into()
                    } else {
                        processes.join(", ")
                    },
                    if held.is_empty() {
                        "-".into()
                    } else {
                        held.join(", ")
                    },
                ]
            })
            .collect();
        let header = ["gpu", "name", "memory used", "util", "processes", "held by"];
        for line in render(&header, &rows).lines() {
            stdoutln!("  {line}")?;
        }
        let host = &environment.host_held_elsewhere;
        if !host.is_empty() {
            stdoutln!(
                "  knob trials hold {} of memory and {} CPU cores",
                host.host_memory,
                host.cpu_cores
            )?;
        }
    }
    if !waiting.is_empty() {
        let requests: Vec<String> = waiting.iter().map(Waiting::describe).collect();
        stdoutln!("waiting, first come first served: {}", requests.join("; "))?;
    }
    if let Some(state) = &leases {
        let experiments: std::collections::BTreeSet<String> = state
            .leases
            .iter()
            .map(|lease| format!("{} (pid {})", lease.holder.experiment, lease.holder.pid))
            .collect();
        if !experiments.is_empty() {
            let list: Vec<String> = experiments.into_iter().collect();
            stdoutln!("experiments holding leases here: {}", list.join(", "))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A request in the ledger for GPUs, CPU cores or memory of this machine, waiting for them to
/// be free.
#[derive(serde::Serialize)]
struct Waiting {
    experiment: String,
    pid: u32,
    /// The trial that asked; `None` for an experiment's trials that wait in its scheduler,
    /// for which it stands in line.
    trial: Option<String>,
    gpus: Vec<u32>,
    #[serde(skip_serializing_if = "is_zero")]
    cpu_cores: u32,
    #[serde(skip_serializing_if = "is_no_memory")]
    memory: ByteSize,
    /// Its place in line: the lower, the sooner served.
    ticket: u64,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn is_no_memory(value: &ByteSize) -> bool {
    *value == ByteSize::ZERO
}

impl Waiting {
    fn describe(&self) -> String {
        let who = match &self.trial {
            Some(trial) => format!("trial {trial} of {}", self.experiment),
            None => format!("{}'s waiting trials", self.experiment),
        };
        let mut wanted = Vec::new();
        if !self.gpus.is_empty() {
            let gpus: Vec<String> = self.gpus.iter().map(u32::to_string).collect();
            let s = if gpus.len() == 1 { "" } else { "s" };
            wanted.push(format!("GPU{s} {}", gpus.join(", ")));
        }
        if self.cpu_cores > 0 {
            let s = if self.cpu_cores == 1 { "" } else { "s" };
            wanted.push(format!("{} CPU core{s}", self.cpu_cores));
        }
        if self.memory != ByteSize::ZERO {
            wanted.push(format!("{} of memory", self.memory));
        }
        format!("{who} (pid {}) for {}", self.pid, wanted.join(", "))
    }
}

/// The ledger's waiting requests on this machine, oldest first.
fn waiting_requests(state: &LedgerState) -> Vec<Waiting> {
    let mut waiting: Vec<Waiting> = state
        .requests
        .iter()
        .map(|request| &request.lease)
        .filter(|lease| lease.machine == THIS_MACHINE)
        .map(|lease| Waiting {
            experiment: lease.holder.experiment.clone(),
            pid: lease.holder.pid,
            trial: (lease.trial != ledger::STANDING).then(|| lease.trial.clone()),
            gpus: lease.gpus.clone(),
            cpu_cores: lease.cpu_cores,
            memory: lease.host_memory,
            ticket: lease.ticket,
        })
        .collect();
    waiting.sort_by_key(|request| request.ticket);
    waiting
}

/// The machine's lease ledger (dead holders' leases reclaimed), if any experiment ever used one
/// here.
fn read_ledger() -> anyhow::Result<Option<LedgerState>> {
    let dir = ledger::default_dir();
    if !dir.is_dir() {
        return Ok(None);
    }
    let ledger = Ledger::open(dir)?;
    if !ledger.path().exists() {
        return Ok(None);
    }
    Ok(Some(ledger.snapshot()?))
}
