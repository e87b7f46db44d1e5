//! The machine's lease ledger (`knob_gpu_sched::ledger`) as the trial pools use it: every knob
//! experiment on this machine (the `local` service in its `knob` process, each `knob-agent`
//! daemon on a remote host) records there what its trials hold, so that two experiments never
//! put more trials on a GPU than `maxTrialNumberPerGpu` allows, nor promise it more memory
//! than it has.
//!
//! - A trial placed on GPUs (or with a memory or CPU request) takes a lease before it starts;
//!   one that must wait goes back to the core's scheduler to be placed again (or, where the
//!   host cannot take it back, keeps its ticket in the ledger and starts when granted; see
//!   `TrialPool`), and gives its lease back when it ends.
//! - What other experiments hold, and the GPUs promised to their older requests, go into the
//!   inventory the service reports ([`MachineLeases::annotate`]), so the core's gpu-sched places
//!   around them and a trial that waits names the other experiment as the holder.
//! - While the core's trials wait for GPUs, CPU cores or memory other experiments hold, the
//!   service stands in line for what its trial may use and would fit on (the core asks for environments again
//!   only while a trial waits), so that an experiment that refills a GPU the moment it frees it
//!   cannot starve this one. The `local`
//!   service does so in its `environments`; a `knob-agent` when its `remote` service tells it
//!   (`ToAgent::StandInLine`, sent from the service's `environments`). Once none waits, the
//!   host says so and each leaves the line at once (`LocalService::nothing_waits`;
//!   `ToAgent::LeaveLine` from the `remote` service's `nothing_waits`).

use std::path::PathBuf;
use std::sync::Mutex;

use knob_gpu_sched::ledger::{
    Acquired, Holder, Lease, Ledger, LedgerError, STANDING, THIS_MACHINE,
};
use knob_gpu_sched::HostResources;
use knob_gpu_sched::{ByteSize, Environment, SchedulerConfig};
use knob_plugin_api::service::{TrialRequest, TrialSettings};

const MIB: u64 = 1024 * 1024;

/// Set to `0` (or `false`, `no`, `off`) to keep a service out of the machine's ledger (it then
/// sees only its own trials, as knob did before the ledger).
pub const LEDGER_VAR: &str = "KNOB_GPU_LEDGER";

/// One process's view of the machine's ledger.
#[derive(Debug)]
pub struct MachineLeases {
    ledger: Ledger,
    /// The machine within the ledger: every service on this host uses the same name.
    machine: String,
    /// Each GPU's total memory at the latest probe ([`Self::annotate`]), passed with every
    /// lease so that the ledger can refuse one that would overfill a GPU.
    gpu_memory_totals: Mutex<Vec<(u32, ByteSize)>>,
    /// The host's CPU cores and memory at the latest probe, passed with every lease so that
    /// the ledger can grant one beside an older waiting request that leaves room for both.
    host_resources: Mutex<Option<HostResources>>,
}

impl MachineLeases {
    /// The ledger under `$KNOB_HOME` (see `knob_gpu_sched::ledger::default_dir`); `None` when
    /// [`LEDGER_VAR`] is `0`.
    pub fn open_default() -> Result<Option<MachineLeases>, LedgerError> {
        // The booleans configs take, so that `KNOB_GPU_LEDGER=false` does not leave the
        // ledger on in silence.
        let off = |v: String| {
            v.trim() == "0"
                || knob_plugin_api::config::boolean(&serde_json::Value::String(v.trim().into()))
                    == Ok(false)
        };
        if std::env::var(LEDGER_VAR).is_ok_and(off) {
            return Ok(None);
        }
        MachineLeases::open(knob_gpu_sched::ledger::default_dir()).map(Some)
    }

    pub fn open(dir: impl Into<PathBuf>) -> Result<MachineLeases, LedgerError> {
        Ok(MachineLeases {
            ledger: Ledger::open(dir)?,
            machine: THIS_MACHINE.to_string(),
            gpu_memory_totals: Mutex::new(Vec::new()),
            host_resources: Mutex::new(None),
        })
    }

    fn holder(experiment: &str) -> Holder {
        Holder::this_process(experiment)
    }

    /// Whether a trial takes a lease: it was placed on GPUs or asks for memory or CPU cores.
    pub fn wants_lease(request: &TrialRequest) -> bool {
        let resources = &request.resources;
        request.gpu_indices.as_ref().is_some_and(|g| !g.is_empty())
            || resources.memory_mib.is_some()
            || resources.cpu_cores.is_some()
            || resources.gpu_memory_mib.is_some()
    }

    fn lease(&self, request: &TrialRequest) -> Lease {
        let resources = &request.resources;
        let host = self
            .host_resources
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Lease {
            holder: Self::holder(&request.experiment_id),
            trial: request.trial_id.clone(),
            machine: self.machine.clone(),
            gpus: request.gpu_indices.clone().unwrap_or_default(),
            max_per_gpu: resources.max_trials_per_gpu.unwrap_or(1).max(1),
            gpu_memory: ByteSize(resources.gpu_memory_mib.unwrap_or(0) * MIB),
            host_memory: ByteSize(resources.memory_mib.unwrap_or(0) * MIB),
            cpu_cores: resources.cpu_cores.unwrap_or(0),
            ticket: 0,
            granted_ms: 0,
            gpu_memory_totals: self
                .gpu_memory_totals
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            cpu_total: host.as_ref().map_or(0, |host| host.cpu_count),
            host_memory_total: host.map_or(ByteSize::ZERO, |host| host.memory_total),
            process_group: None,
        }
    }

    /// Asks for the trial's lease (again, while it waits).
    pub fn acquire(&self, request: &TrialRequest) -> Result<Acquired, LedgerError> {
        self.ledger.acquire(&self.lease(request))
    }

    /// Records the process group the trial started in, which keeps its lease while the group
    /// lives (`Lease::process_group`).
    pub fn record_process_group(
        &self,
        request: &TrialRequest,
        group: u32,
    ) -> Result<(), LedgerError> {
        self.ledger.record_process_group(
            &Self::holder(&request.experiment_id),
            &request.trial_id,
            group,
        )
    }

    /// Gives back what the trial held or asked for.
    pub fn release(&self, experiment: &str, trial: &str) -> Result<(), LedgerError> {
        self.ledger.release(&Self::holder(experiment), trial)
    }

    /// Drops the experiment's place in the line, when none of its trials waits any more (the
    /// host said so, or the service stops): what it named goes to the other experiments at
    /// once, not once the place lapsed ([`STANDING_TTL`](knob_gpu_sched::ledger::STANDING_TTL)).
    pub fn leave_line(&self, experiment: &str) -> Result<(), LedgerError> {
        self.ledger
            .leave_line(&Self::holder(experiment), &self.machine)
    }

    /// Adds to `environment` (this machine as probed, with the experiment's limits) what other
    /// processes' trials hold here, and the GPUs promised to their requests older than this
    /// process's place in line. Then, for the experiment whose trials wait (`waiting`: its id
    /// and what each trial asks for), stands in line for the GPUs, CPU cores and memory held
    /// elsewhere that its trial may use and waits for, or renews its place (which keeps what it
    /// stood for, freed since, until its trial takes it); it leaves the line when its trial asks
    /// for no GPU, cores or memory or could not start even with no knob trial on the machine
    /// (`LedgerState::to_stand_for`), so that it never holds anything back from an experiment
    /// that can use it.
    pub fn annotate(
        &self,
        environment: &mut Environment,
        waiting: Option<(&str, &SchedulerConfig)>,
    ) -> Result<(), LedgerError> {
        *self
            .gpu_memory_totals
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = environment
            .gpus
            .iter()
            .map(|gpu| (gpu.index, gpu.memory_total))
            .collect();
        *self
            .host_resources
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(environment.host_resources.clone());
        let me = std::process::id();
        let state = self.ledger.snapshot()?;
        let mine = state
            .requests
            .iter()
            .find(|r| r.lease.trial == STANDING && r.lease.holder.pid == me)
            .map(|r| r.lease.ticket);
        let probed = environment.clone();
        state.annotate(environment, &self.machine, me, mine);
        if let Some((experiment, demand)) = waiting {
            let holder = Self::holder(experiment);
            match state.to_stand_for(&probed, environment, &self.machine, me, demand) {
                Some(stand_for) => {
                    self.ledger
                        .stand_in_line(&holder, &self.machine, &stand_for)?;
                }
                None => self.ledger.leave_line(&holder, &self.machine)?,
            }
        }
        Ok(())
    }
}

/// What each trial of an experiment asks for, from its config: which GPUs held elsewhere its
/// waiting trials stand in line for ([`MachineLeases::annotate`]).
pub fn demand_of_settings(trial: &TrialSettings) -> SchedulerConfig {
    SchedulerConfig {
        trial_gpu_number: trial.trial_gpu_number,
        trial_gpu_memory: trial
            .trial_gpu_memory_mib
            .map(|mib| ByteSize(mib.saturating_mul(MIB))),
        trial_memory_size: trial
            .trial_memory_size_mib
            .map(|mib| ByteSize(mib.saturating_mul(MIB))),
        trial_cpu_number: trial.trial_cpu_number,
        ..SchedulerConfig::default()
    }
}

/// The same, learned from a trial the experiment started, for a service made without its
/// experiment's settings.
pub fn demand_of_request(request: &TrialRequest) -> SchedulerConfig {
    let resources = &request.resources;
    SchedulerConfig {
        trial_gpu_number: request.gpu_indices.as_ref().map(|gpus| gpus.len() as u32),
        trial_gpu_memory: resources
            .gpu_memory_mib
            .map(|mib| ByteSize(mib.saturating_mul(MIB))),
        trial_memory_size: resources
            .memory_mib
            .map(|mib| ByteSize(mib.saturating_mul(MIB))),
        trial_cpu_number: resources.cpu_cores,
        ..SchedulerConfig::default()
    }
}

/// Whether an answer lets the trial start now, else why not.
pub fn waiting_reason(acquired: Acquired) -> Option<String> {
    match acquired {
        Acquired::Granted => None,
        Acquired::Waiting(reason) => Some(reason),
    }
}
