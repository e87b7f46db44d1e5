//! GPU and resource placement for the manager: environments as their services report them
//! (inventories as gpu-sched JSON, the local machine's too), and gpu-sched deciding which
//! waiting trial runs where (and so which service starts it).

use knob_gpu_sched::{
    ByteSize, Environment, EnvironmentId, EnvironmentStatus, Placement, Reasons, Scheduler,
    SchedulerConfig, TrialId, TrialRequest,
};

use tokio::time::Instant;

use knob_plugin_api::service::{TrialRequest as ServiceTrialRequest, TrialResources};

use super::{Manager, ManagerError};
use crate::config::ExperimentConfig;
use crate::store::TrialStatus;

const MIB: u64 = 1024 * 1024;

/// A waiting trial's reason is recorded (a `waiting: …` warning) when it starts to wait, and a
/// changed one after a gap that doubles from [`WAITING_REASON_FIRST_GAP`] with each one
/// recorded, up to [`WAITING_REASON_EVERY`]. The reason names the trials that hold the GPUs,
/// so it changes whenever one of them ends; recording every change wrote several warnings a
/// trial while a host of 1 000 was down (`sim_scale`: 1.8 a trial at 100 000 trials). The first
/// changes come soon, since they are the ones a user waits for (a cluster allocation's pending
/// reason comes seconds after the trial started to wait for it).
pub(super) const WAITING_REASON_EVERY: std::time::Duration = std::time::Duration::from_secs(60);
const WAITING_REASON_FIRST_GAP: std::time::Duration = std::time::Duration::from_secs(2);

/// How long after the last recorded reason a changed one is recorded, `recorded` having been
/// recorded for the attempt so far.
fn waiting_reason_gap(recorded: u32) -> std::time::Duration {
    WAITING_REASON_FIRST_GAP
        .saturating_mul(1 << recorded.saturating_sub(1).min(6))
        .min(WAITING_REASON_EVERY)
}

/// How old a probe may be when trials are placed on an environment with a limit judged on the
/// host's use now (see `Manager::probe_for_host_use_limits`): a trial started every few
/// seconds pays a probe each, one started more often shares one.
const HOST_USE_PROBE_AGE: std::time::Duration = std::time::Duration::from_secs(2);

/// How long trials wait for such a probe before they are placed on what is known.
const HOST_USE_PROBE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a waiting trial's reason, if it changed, is to be recorded at `now`.
fn reason_due(trial: &super::trial::Trial, now: Instant) -> bool {
    trial
        .waiting_warned_at
        .is_none_or(|at| now >= at + waiting_reason_gap(trial.waiting_reasons_recorded))
}

/// A waiting trial's own requests: `None` takes the experiment's (`trialMemorySize`,
/// `trialGpuMemory`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnRequest {
    pub trial_id: String,
    /// Host memory (MiB).
    pub memory_mib: Option<u64>,
    /// GPU memory (MiB) on each of its GPUs.
    pub gpu_memory_mib: Option<u64>,
}

/// Owns the scheduler for one experiment.
pub struct Placer {
    scheduler: Scheduler,
    request_template: TrialRequest,
    /// Counts the changes to the scheduler's state (environments registered, marked, removed;
    /// trials placed or released).
    changes: u64,
    /// The last round that placed nothing, every trial waiting for a GPU: `changes` then, its
    /// requests, whether it worked out the reasons, and what it said. While trials wait for a
    /// GPU the loop asks again every turn; with nothing changed the answer is the same, and
    /// working it out again (every waiting trial against every GPU of every environment, and
    /// why it waits) made a turn cost grow with the environments times the trials waiting
    /// (`sim_scale`, 1 000 environments).
    blocked: Option<Blocked>,
}

struct Blocked {
    changes: u64,
    requests: Vec<OwnRequest>,
    reasons: Reasons,
    placements: Vec<Placement>,
}

impl Placer {
    /// An empty scheduler for this config's trials; environments are added as their services
    /// report them ([`Placer::upsert`]).
    pub fn new(config: &ExperimentConfig) -> Placer {
        Placer::with_settings(SchedulerConfig {
            trial_gpu_number: config.trial_gpu_number,
            trial_gpu_memory: config.trial_gpu_memory_mib.map(|mib| ByteSize(mib * MIB)),
            trial_memory_size: config.trial_memory_size_mib.map(|mib| ByteSize(mib * MIB)),
            trial_cpu_number: config.trial_cpu_number,
            policy: config.placement_policy,
        })
    }

    /// An empty scheduler with these settings.
    pub(super) fn with_settings(settings: SchedulerConfig) -> Placer {
        let scheduler = Scheduler::new(settings);
        Placer {
            scheduler,
            request_template: TrialRequest::new("template"),
            changes: 0,
            blocked: None,
        }
    }

    /// Before anything starts: when every training service knew its environments while it
    /// checked the config (this machine, probed), whether a trial of this config could ever be
    /// placed on one of them. The error is one line saying why not (for example that there is no
    /// NVIDIA driver while `trialGpuNumber` is 1). With a service that knows its environments
    /// only once started (hosts it connects to), the check waits until they are reported.
    pub fn preflight(config: &ExperimentConfig) -> Result<(), String> {
        let mut placer = Placer::new(config);
        let asks_for_gpus = config.trial_gpu_number.is_some_and(|gpus| gpus > 0);
        for service in &config.training_service {
            let Some(environments) = &service.environments else {
                return Ok(());
            };
            for environment in environments {
                let mut inventory: Environment =
                    serde_json::from_value(environment.inventory.clone()).map_err(|e| {
                        format!(
                            "training service {} reported environment {} with an inventory that cannot be read: {e}",
                            service.platform(),
                            environment.id
                        )
                    })?;
                inventory.id = environment.id.as_str().into();
                // A GPU index the machine does not have is a mistake in the config (a typo, a
                // config from a larger machine), not a GPU fallen off the bus mid-run. Only for
                // trials that ask for GPUs: with `trialGpuNumber` 0 or unset `gpuIndices` places
                // nothing, and such a config runs unchanged on a machine with fewer GPUs or
                // none, as under NNI (the first probe still notes the index).
                if asks_for_gpus {
                    inventory
                        .check_limits_match_gpus()
                        .map_err(|e| e.to_string())?;
                }
                placer.upsert(inventory)?;
            }
        }
        placer.check()
    }

    /// `Err(reason)` when no registered environment could ever take a trial of this config.
    pub fn check(&self) -> Result<(), String> {
        self.scheduler.check_request(&self.request_template)
    }

    /// Registers an environment as its service probed it (limits applied), or takes a fresh
    /// probe of one; trials placed there keep what they hold.
    pub fn upsert(&mut self, environment: Environment) -> Result<(), String> {
        self.changes += 1;
        self.scheduler
            .upsert_environment(environment)
            .map_err(|e| e.to_string())
    }

    /// Takes no new trial there until it is registered again; it still counts for whether a
    /// trial could ever fit (it may come back).
    pub fn set_unavailable(&mut self, environment: &str, reason: &str) {
        self.changes += 1;
        // An environment never registered (unreachable from the start) has nothing to mark.
        let _ = self.scheduler.set_environment_status(
            &EnvironmentId::from(environment),
            EnvironmentStatus::Unavailable(reason.to_string()),
        );
    }

    /// Takes no new trial there until it is ready; being set up, it counts for whether a trial
    /// could ever fit whatever its inventory says (its resources are not known yet).
    pub fn set_starting(&mut self, environment: &str) {
        self.changes += 1;
        let _ = self.scheduler.set_environment_status(
            &EnvironmentId::from(environment),
            EnvironmentStatus::Starting,
        );
    }

    /// Retires an environment (a cluster allocation that ended, or ends soon): it takes no new
    /// trial, keeps what its running trials hold, and no longer counts as one that may take
    /// trials, so that trials do not wait for it.
    pub fn set_draining(&mut self, environment: &str) {
        self.changes += 1;
        let _ = self.scheduler.set_environment_status(
            &EnvironmentId::from(environment),
            EnvironmentStatus::Draining,
        );
    }

    /// Forgets an environment that is gone; what its trials held is released.
    pub fn remove(&mut self, environment: &str) {
        self.changes += 1;
        let _ = self
            .scheduler
            .remove_environment(&EnvironmentId::from(environment));
    }

    /// How many changes the scheduler's state has seen (see `changes`).
    #[cfg(test)]
    pub(super) fn changes(&self) -> u64 {
        self.changes
    }

    pub fn knows(&self, environment: &str) -> bool {
        self.scheduler
            .environment(&EnvironmentId::from(environment))
            .is_some()
    }

    /// Whether any environment takes trials now or may again (registered and not draining).
    pub fn has_environment(&self) -> bool {
        self.scheduler
            .environments()
            .any(|environment| environment.status != EnvironmentStatus::Draining)
    }

    /// Places waiting trials, oldest first, each with its own memory requests where they are
    /// not the experiment's (raised after it ran out of memory); returns each one's placement.
    pub fn place(&mut self, waiting: &[OwnRequest]) -> Vec<Placement> {
        self.place_with(waiting, Reasons::Explained)
    }

    /// [`Placer::place`], saying whether the trials that wait get their reason (see
    /// [`Reasons`]; the decisions are the same).
    pub fn place_with(&mut self, waiting: &[OwnRequest], reasons: Reasons) -> Vec<Placement> {
        if let Some(blocked) = &self.blocked {
            if blocked.changes == self.changes
                && blocked.requests.as_slice() == waiting
                && (blocked.reasons == Reasons::Explained || reasons == Reasons::Unexplained)
            {
                return blocked.placements.clone();
            }
        }
        let requests: Vec<TrialRequest> = waiting
            .iter()
            .map(|own| TrialRequest {
                trial: own.trial_id.as_str().into(),
                host_memory: own
                    .memory_mib
                    .map(|mib| ByteSize(mib * MIB))
                    .or(self.request_template.host_memory),
                gpu_memory: own
                    .gpu_memory_mib
                    .map(|mib| ByteSize(mib * MIB))
                    .or(self.request_template.gpu_memory),
                ..self.request_template.clone()
            })
            .collect();
        let placements = self.scheduler.place_queue_with(&requests, reasons);
        if placements
            .iter()
            .all(|placement| matches!(placement, Placement::TmpNoAvailableGpu { .. }))
        {
            self.blocked = Some(Blocked {
                changes: self.changes,
                requests: waiting.to_vec(),
                reasons,
                placements: placements.clone(),
            });
        } else {
            self.changes += 1;
            self.blocked = None;
        }
        placements
    }

    /// What the largest GPU could ever give one trial (MiB), see
    /// [`Scheduler::largest_gpu_capacity`].
    pub fn largest_gpu_capacity_mib(&self) -> Option<u64> {
        self.scheduler
            .largest_gpu_capacity()
            .map(|bytes| bytes.0 / MIB)
    }

    /// What the environments could give one trial's host memory (MiB), see
    /// [`Scheduler::largest_host_memory_capacity`] and [`Scheduler::largest_host_memory_room`];
    /// `None` without a ready environment.
    pub(super) fn largest_host_memory_room_mib(&self) -> Option<super::trial::HostMemoryRoom> {
        Some(super::trial::HostMemoryRoom {
            capacity: self.scheduler.largest_host_memory_capacity()?.0 / MIB,
            available: self.scheduler.largest_host_memory_room()?.0 / MIB,
        })
    }

    /// Whether an environment's host memory is `mib` (`trialMemorySize`): one its service
    /// sized by the request (a cluster allocation of its size), which a larger `trialMemorySize`
    /// makes larger. The memory of others (a machine) is what it is.
    pub fn sized_by_memory_request(&self, mib: u64) -> bool {
        self.scheduler
            .environments()
            .any(|environment| environment.host_resources.memory_total.0 / MIB == mib)
    }

    /// The environment a trial holds resources on, if any.
    pub fn assigned_environment(&self, trial_id: &str) -> Option<&str> {
        self.scheduler
            .assignment(&TrialId::from(trial_id))
            .map(|assignment| assignment.environment.0.as_str())
    }

    /// Frees what a trial held; call once its process group is gone.
    pub fn release(&mut self, trial_id: &str) {
        self.changes += 1;
        self.scheduler.release(&TrialId::from(trial_id));
    }
}

impl Manager {
    /// Asks gpu-sched where waiting trials go, oldest first, and starts those it placed.
    pub(super) async fn place_waiting(&mut self) -> Result<(), ManagerError> {
        let mut waiting = self.book.placeable(Instant::now());
        if waiting.is_empty() {
            // The last waiting trial may have been canceled or ended since the last round.
            self.tell_nothing_waits();
            return Ok(());
        }
        // More trials than `trialConcurrency` are not yet ended only after the user lowered it
        // (or added trials): then those not placed yet wait until fewer than it run, be they
        // new or handed back by their service unstarted (`on_place_again`).
        let concurrency = u64::from(self.config.trial_concurrency);
        if self.book.active_count() > concurrency {
            let placed = self.book.placed_count();
            let room = concurrency.saturating_sub(placed) as usize;
            let now = Instant::now();
            let reason = format!(
                "{placed} trials run or are starting, and trialConcurrency is {concurrency}"
            );
            for trial_id in waiting.split_off(room.min(waiting.len())) {
                self.note_waiting(trial_id, &reason, now).await?;
            }
            if waiting.is_empty() {
                return Ok(());
            }
        }
        if !self.environments.can_place() {
            // Not while a trial still runs in an environment that was retired, not lost (an
            // allocation whose time runs out): its result is worth its end, after which this
            // round comes again. One whose environment is gone has its end on the way, or none.
            let runs_on = |id: &String| {
                self.book[id.as_str()].status == TrialStatus::Running
                    && self.environments.assigned_environment(id).is_some()
            };
            if self.book.active_ids().iter().any(runs_on) {
                return Ok(());
            }
            // A host not reached yet that its service still tries (an sshd not up yet when
            // the experiment started): the trials wait for it, saying so. Failing them, or
            // the experiment, while the service still tried ended a run whose host came up a
            // minute late; once the service gives up, the error below says why.
            if let Some(reason) = self.environments.unreached() {
                let now = Instant::now();
                self.timers.reprobe_later(now);
                for trial_id in waiting {
                    self.note_waiting(trial_id, &reason, now).await?;
                }
                return Ok(());
            }
            return Err(ManagerError::NoEnvironment(
                self.environments.no_environment_reason(),
            ));
        }
        if self.probe_for_host_use_limits().await? {
            // Its answer wakes the loop, which places them then.
            return Ok(());
        }
        let requests: Vec<OwnRequest> = waiting
            .iter()
            .map(|id| OwnRequest {
                trial_id: id.clone(),
                memory_mib: self.book[id].memory_request_mib,
                gpu_memory_mib: self.book[id].gpu_memory_request_mib,
            })
            .collect();
        // Why a trial waits is worked out over every environment, and recorded only when it
        // changed and the trial's gap since the last one has passed: a round with no reason due
        // skips it (`sim_scale`: 18 % of the loop's time at 100 000 trials while a host was down).
        let now = Instant::now();
        let reasons = if waiting
            .iter()
            .any(|id| reason_due(&self.book[id.as_str()], now))
        {
            Reasons::Explained
        } else {
            Reasons::Unexplained
        };
        let placements = self.environments.place_with(&requests, reasons);
        // The re-probe is owed from when a trial first waited, not from this round: cancelled
        // only when none waits. Pushed back by every round, it never came while other trials'
        // events kept the loop busy, and a GPU freed outside knob went unseen.
        let mut any_waits = false;
        for (trial_id, placement) in waiting.into_iter().zip(placements) {
            match placement {
                Placement::Succeed {
                    environment,
                    gpu_indices,
                } => {
                    self.launch(&trial_id, environment.as_str(), gpu_indices)
                        .await?
                }
                // No environment known holds it, but one not reached yet may: its resources
                // are not known until its service reaches it.
                Placement::RequireExceedTotal { reason }
                    if self.environments.unreached().is_some() =>
                {
                    any_waits = true;
                    self.timers.reprobe_later(Instant::now());
                    let unreached = self.environments.unreached().unwrap_or_default();
                    self.note_waiting(trial_id, &format!("{reason}; {unreached}"), now)
                        .await?;
                }
                Placement::RequireExceedTotal { reason } => {
                    let reason = match raised_request(&self.book[&trial_id]) {
                        Some(raised) => refused_after_raise(
                            &raised,
                            self.book[&trial_id].memory_request_mib,
                            self.config
                                .trial_memory_size_mib
                                .is_some_and(|mib| self.environments.sized_by_memory_request(mib)),
                            &reason,
                        ),
                        None => reason,
                    };
                    self.end_trial(
                        &trial_id,
                        TrialStatus::Failed,
                        Some(reason),
                        None,
                        None,
                        String::new(),
                    )
                    .await?
                }
                Placement::TmpNoAvailableGpu { reason } => {
                    any_waits = true;
                    self.trials_waited = true;
                    self.timers.reprobe_later(Instant::now());
                    self.note_waiting(trial_id, &reason, now).await?;
                }
            }
        }
        if !any_waits {
            self.timers.cancel_reprobe();
            self.tell_nothing_waits();
        }
        Ok(())
    }

    /// Once no trial waits to be placed (none is left unplaced, a trial handed back and
    /// pausing before it is placed again included) after some waited, tells each service
    /// (`TrainingService::nothing_waits`): one that stood in a shared machine's line for its
    /// waiting trials leaves it now. Until it lapsed (12 s), its place kept the GPUs, cores or
    /// memory it named from every other experiment, idle once this one's trials no longer
    /// waited for them.
    fn tell_nothing_waits(&mut self) {
        if !self.trials_waited || self.book.any_unplaced() {
            return;
        }
        self.trials_waited = false;
        for index in 0..self.services.len() {
            let reply = self.services[index].handle.nothing_waits();
            self.warn_if_it_fails(reply, None, |e| {
                format!("a training service could not be told that no trial waits: {e}")
            });
        }
    }

    /// Records why waiting trial `trial_id` waits, when the reason changed and one is due
    /// ([`reason_due`]): a warning the console and the store show.
    async fn note_waiting(
        &mut self,
        trial_id: String,
        reason: &str,
        now: Instant,
    ) -> Result<(), ManagerError> {
        let trial = self
            .book
            .get_mut(&trial_id)
            .expect("waiting trial is known");
        if !reason_due(trial, now) || trial.waiting_reason.as_deref() == Some(reason) {
            return Ok(());
        }
        trial.waiting_reason = Some(reason.to_owned());
        trial.waiting_warned_at = Some(now);
        trial.waiting_reasons_recorded += 1;
        self.warn(Some(trial_id), format!("waiting: {reason}"))
            .await
    }

    /// Probes again, before trials are placed, each service whose environments have a limit
    /// judged on the host's use now (`maxCpuUtilization`, `memoryReserve`,
    /// `maxMemoryUtilization`) and whose last probe is older than [`HOST_USE_PROBE_AGE`]:
    /// otherwise an experiment whose trials never waited for anything else placed every one
    /// against the probe of its start (H2 F4, H3 F6). Experiments without such a limit pay
    /// nothing. Returns whether such a probe is still on its way: the trials wait for its answer,
    /// for at most [`HOST_USE_PROBE_PATIENCE`] (a service busy with a long start answers late,
    /// and the environments of the others must not stall for it).
    async fn probe_for_host_use_limits(&mut self) -> Result<bool, ManagerError> {
        let now = Instant::now();
        let mut on_its_way = false;
        for index in 0..self.services.len() {
            if !self.environments.host_use_limited(index) {
                continue;
            }
            let slot = &self.services[index];
            if let Some(asked) = slot.reprobe_asked {
                on_its_way |= now.duration_since(asked) < HOST_USE_PROBE_PATIENCE;
                continue;
            }
            if slot
                .probed_at
                .is_some_and(|at| now.duration_since(at) < HOST_USE_PROBE_AGE)
            {
                continue;
            }
            self.reprobe(index).await?;
            on_its_way |= self.services[index].reprobe_asked.is_some();
        }
        Ok(on_its_way)
    }

    /// Hands a placed trial to the service that owns its environment.
    pub(super) async fn launch(
        &mut self,
        trial_id: &str,
        environment: &str,
        gpu_indices: Option<Vec<u32>>,
    ) -> Result<(), ManagerError> {
        let Some(service) = self.environments.owner_of(environment) else {
            // The scheduler only knows environments a service reported, so this is a bug; the
            // trial waits for the next placement rather than the experiment failing.
            self.environments.release(trial_id);
            self.environments.forget(environment);
            return self
                .warn(
                    Some(trial_id.to_string()),
                    format!("placed on environment {environment}, which no training service owns; placing it again"),
                )
                .await;
        };
        if self
            .bring_parent_snapshot(trial_id, service, environment, &gpu_indices)
            .await?
        {
            // Handed to its service once the copy is here (`on_parent_snapshot_fetched`).
            return Ok(());
        }
        self.hand_to_service(trial_id, environment, gpu_indices, service)
            .await
    }

    /// Hands a placed trial to `service`, which owns its environment.
    pub(super) async fn hand_to_service(
        &mut self,
        trial_id: &str,
        environment: &str,
        gpu_indices: Option<Vec<u32>>,
        service: usize,
    ) -> Result<(), ManagerError> {
        let trial = self.book.get_mut(trial_id).expect("placed trial is known");
        trial.launched = true;
        trial.service = Some(service);
        trial.environment = Some(environment.to_string());
        trial.gpu_indices = gpu_indices.clone();
        // Each attempt writes its own files: a retried or resumed trial keeps the earlier
        // attempt's output apart.
        let attempt = trial.attempt + 1;
        let trial_dir = match attempt {
            1 => self.dir.join("trials").join(trial_id),
            n => self
                .dir
                .join("trials")
                .join(trial_id)
                .join(format!("attempt-{n}")),
        };
        let mut env = std::collections::BTreeMap::new();
        if gpu_indices.is_some() {
            // NVML (which placed the trial) numbers GPUs in PCI bus order; make CUDA agree.
            env.insert("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string());
        }
        if let Some(shim) = self.config.nni_shim {
            // Read by the trial runner (training-services' `trial_python`) and by the shim.
            env.insert(
                "KNOB_NNI_SHIM".to_string(),
                if shim { "1" } else { "0" }.to_string(),
            );
        }
        if let Some(parent) = trial.lineage.as_ref().and_then(|l| l.parent.clone()) {
            env.insert(super::population::RESTORE_TRIAL_ENV.to_string(), parent);
        }
        let request = ServiceTrialRequest {
            experiment_id: self.id.clone(),
            trial_id: trial_id.to_string(),
            sequence: trial.sequence,
            parameter_id: trial.parameter_id,
            parameter_label: trial.parameter_label.clone(),
            parameters: trial.parameters.clone(),
            environment_id: environment.to_string(),
            command: self.config.trial_command.clone(),
            code_dir: self.config.trial_code_directory.clone(),
            trial_dir,
            gpu_indices,
            env,
            resources: TrialResources {
                memory_mib: trial
                    .memory_request_mib
                    .or(self.config.trial_memory_size_mib),
                gpu_memory_mib: trial
                    .gpu_memory_request_mib
                    .or(self.config.trial_gpu_memory_mib),
                cpu_cores: self.config.trial_cpu_number,
                max_trials_per_gpu: None,
            },
        };
        // The loop does not wait for the process to be spawned (milliseconds on a busy machine):
        // its start arrives as a service event, a failure to start as a `StartFailed`.
        let reply = self.services[service].handle.start_trial(request);
        let start_failures = self.start_failures_tx.clone();
        let asked = self.unanswered.asked(trial_id);
        let trial_id = trial_id.to_string();
        tokio::spawn(async move {
            let answer = reply.get().await;
            drop(asked);
            if let Err(e) = answer {
                let _ = start_failures.send((trial_id, format!("could not start: {e}")));
            }
        });
        self.publish(None);
        Ok(())
    }
}

/// How long a trial its service handed back unstarted (`ServiceEvent::PlaceAgain`) waits
/// before it is placed again. The service reported the environment anew first, so the next
/// placement sees what was taken; the pause only bounds the round trips, should the scheduler
/// and the service keep disagreeing about what is free.
const PLACE_AGAIN_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

impl Manager {
    /// A trial its service handed back unstarted, what it was placed on being taken meanwhile
    /// by another experiment (`ServiceEvent::PlaceAgain`): it waits for a placement again, as
    /// any waiting trial (it counts as no failed start), with the service's reason as why. So
    /// it may take another free GPU, and a `trialConcurrency` lowered meanwhile holds for it.
    pub(super) async fn on_place_again(
        &mut self,
        service: usize,
        trial_id: String,
        reason: String,
    ) -> Result<(), ManagerError> {
        let platform = &self.services[service].platform;
        let ignored = match self.book.get(&trial_id) {
            Some(trial) if trial.status.is_final() => return Ok(()),
            Some(trial) if trial.service != Some(service) => {
                Some("a trial it was not asked to run")
            }
            Some(trial) if trial.status == TrialStatus::Waiting && trial.launched => None,
            Some(_) => Some("a trial that had started"),
            None => Some("an unknown trial"),
        };
        if let Some(what) = ignored {
            let warning =
                format!("training service {platform} handed back {what}; ignored: {reason}");
            return self.warn(Some(trial_id), warning).await;
        }
        // A kill decided while it was on its way ends it as decided (see `on_start_failed`).
        if let Some((status, why)) = self.book[trial_id.as_str()].kill.clone() {
            return self
                .end_trial(&trial_id, status, Some(why), None, None, String::new())
                .await;
        }
        let now = Instant::now();
        self.environments.release(&trial_id);
        self.book
            .new_attempt(&trial_id, Some(now + PLACE_AGAIN_PAUSE));
        let trial = self.book.get_mut(&trial_id).expect("known trial");
        trial.waiting_reason = Some(reason.clone());
        trial.waiting_warned_at = Some(now);
        trial.waiting_reasons_recorded = 1;
        self.trials_waited = true;
        self.timers.reprobe_later(now);
        self.publish(None);
        self.warn(Some(trial_id), format!("waiting: {reason}"))
            .await
    }
}

/// Why a trial whose request was raised after it ran out of memory (`raised`, as
/// [`raised_request`] says it) can never be placed, in one line. The scheduler's own advice
/// (lower trialMemorySize or trialGpuMemory) is for a request from the config, not one knob
/// raised, so it is left out; in its place, for raised host memory, what would hold it: where
/// environments are `sized_by_request` (an allocation asked for with trialMemorySize), a
/// `trialMemorySize` of at least the raised request; elsewhere (a machine, whose memory is what
/// it is) less memory used or a larger host.
fn refused_after_raise(
    raised: &str,
    memory_request_mib: Option<u64>,
    sized_by_request: bool,
    reason: &str,
) -> String {
    let why = [": lower trialMemorySize to ", ": lower trialGpuMemory to "]
        .iter()
        .filter_map(|advice| reason.find(advice))
        .min()
        .map_or(reason, |at| &reason[..at]);
    let what_to_do = match memory_request_mib {
        Some(mib) if sized_by_request => format!(
            "; to run it, set trialMemorySize to {mib} MiB or more (an environment sized by trialMemorySize then holds it), or lower maxOomRetries to fail sooner"
        ),
        Some(_) => "; no environment here has that much memory: make the trial use less, add a host with more, or lower maxOomRetries to fail sooner".to_string(),
        None => "; lower maxOomRetries to fail sooner".to_string(),
    };
    format!(
        "after it ran out of memory its request was raised to {raised} (maxOomRetries), which no environment can give: {why}{what_to_do}"
    )
}

/// "3000 MiB of memory" / "6000 MiB of GPU memory" / both, for a trial whose requests were
/// raised after it ran out of memory; `None` when it asks for the experiment's.
fn raised_request(trial: &super::trial::Trial) -> Option<String> {
    let raised: Vec<String> = [
        trial
            .memory_request_mib
            .map(|mib| format!("{mib} MiB of memory")),
        trial
            .gpu_memory_request_mib
            .map(|mib| format!("{mib} MiB of GPU memory")),
    ]
    .into_iter()
    .flatten()
    .collect();
    (!raised.is_empty()).then(|| raised.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::{refused_after_raise, waiting_reason_gap};
    use std::time::Duration;

    #[test]
    fn a_changed_waiting_reason_waits_longer_each_time_up_to_a_minute() {
        let gaps: Vec<u64> = (1..=8).map(|n| waiting_reason_gap(n).as_secs()).collect();
        assert_eq!(gaps, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(waiting_reason_gap(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_raised_request_no_environment_holds_is_refused_in_one_line_saying_what_to_do() {
        let message = refused_after_raise(
            "302 MiB of memory",
            Some(302),
            true,
            "needs 302 MiB of memory; box-1 has 64 MiB of memory: lower trialMemorySize to 64 MiB or less",
        );
        assert_eq!(
            message,
            "after it ran out of memory its request was raised to 302 MiB of memory (maxOomRetries), which no environment can give: needs 302 MiB of memory; box-1 has 64 MiB of memory; to run it, set trialMemorySize to 302 MiB or more (an environment sized by trialMemorySize then holds it), or lower maxOomRetries to fail sooner"
        );
        assert!(!message.contains('\n'));
        // A machine's memory is what it is: a larger trialMemorySize would be refused.
        let machine = refused_after_raise(
            "48 GiB of memory",
            Some(49152),
            false,
            "the trial asks for 48 GiB of host memory, but the largest environment, local, has 23.5 GiB of memory: lower trialMemorySize to 23.5 GiB or less",
        );
        assert_eq!(
            machine,
            "after it ran out of memory its request was raised to 48 GiB of memory (maxOomRetries), which no environment can give: the trial asks for 48 GiB of host memory, but the largest environment, local, has 23.5 GiB of memory; no environment here has that much memory: make the trial use less, add a host with more, or lower maxOomRetries to fail sooner"
        );
        let gpu = refused_after_raise(
            "6000 MiB of GPU memory",
            None,
            false,
            "box-1 has no GPU with 6000 MiB or more: lower trialGpuMemory to 4 GiB or less",
        );
        assert!(
            gpu.ends_with(
                "box-1 has no GPU with 6000 MiB or more; lower maxOomRetries to fail sooner"
            ),
            "{gpu}"
        );
    }
}
