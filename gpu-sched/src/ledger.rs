//! The machine's lease ledger: what every knob experiment on this machine (and every agent on a
//! remote host) holds of its GPUs, CPU cores and memory, so that two experiments never put more
//! trials on a GPU than `maxTrialNumberPerGpu` allows, nor promise it more memory than it has.
//!
//! One JSON file, `$KNOB_HOME/gpu-ledger.json`, read and rewritten (temp file, then rename)
//! under an exclusive `flock` of `gpu-ledger.lock`. The kernel drops the lock of a process that
//! dies, SIGKILL included, so a dead holder never blocks the others; its leases are reclaimed by
//! the next operation of anyone, which checks every holder's process (pid and start time, so a
//! reused pid is not taken for the holder). Every grant, release and reclaim is also appended to
//! `gpu-ledger.journal` (one JSON line each), which lets a test or a person replay who held what.
//!
//! Fairness: each request gets a ticket when it is first made. A request is granted only if
//! every GPU it names has room and no older request of another holder still waiting names one
//! of them, and, for its CPU cores (memory), only if it fits beside the leases and the older
//! requests of other holders that wait for cores (memory) there. So requests are served first
//! come, first served per GPU, CPU cores and memory, and a large request cannot be starved by
//! a stream of small ones. A waiting request must be renewed (asked again) within
//! [`REQUEST_TTL`]; one its holder stopped asking for is dropped. A holder's own requests never
//! hold each other back: the order among one experiment's trials is its scheduler's.
//!
//! A trial that waits in its experiment's scheduler (every GPU it could use, or the CPU cores or
//! memory it asks for, is held by another experiment) has not asked the ledger yet, so it would
//! have no ticket, and an experiment that refills a GPU (takes the cores again) in the same
//! instant it frees it would starve it. Its holder therefore
//! [stands in line](Ledger::stand_in_line) for what others hold that its trial may use and
//! waits for ([`LedgerState::to_stand_for`]): a standing request (trial [`STANDING`]) with a
//! ticket, renewed while its trials wait (within [`STANDING_TTL`]). It blocks newer requests of
//! others for those GPUs (cores, memory) like any request, and the holder's next request for one
//! of them takes its ticket. A GPU (the cores, the memory) stays in it until one of the
//! holder's trials is granted it with the ticket, or the request lapses: when the other
//! experiment frees the GPU, the holder's scheduler sees it free and places a trial there a
//! moment later, and in that moment the GPU must stay promised to it, or the experiment that
//! freed it takes it back at its next retry. A trial that waits for its own experiment's trials
//! as well (two GPUs, one of them its own trial's) stands in line too, for the GPUs of others
//! and of its own trials: its own trials end by themselves, and what the other experiment frees
//! meanwhile would otherwise be refilled by it at every retry.
//!
//! Like the probes, this does I/O; the [`Scheduler`](crate::Scheduler) never calls it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::bytes::ByteSize;
use crate::inventory::{trials_per_gpu, Environment, HeldElsewhere, HostHolder};
use crate::placement::Placement;
use crate::request::{SchedulerConfig, TrialRequest};
use crate::scheduler::Scheduler;

/// A waiting request not asked for again within this long is dropped.
pub const REQUEST_TTL: Duration = Duration::from_secs(30);
/// A standing request not renewed within this long is dropped: its holder's trials stopped
/// waiting (its scheduler asks again every 5 s while one waits).
pub const STANDING_TTL: Duration = Duration::from_secs(12);
/// The ledger's name for the machine it is on: the local service, `knob gpu` and a remote
/// host's agents all use it, so they see each other.
pub const THIS_MACHINE: &str = "local";
/// The trial name of a holder's standing request (see [`Ledger::stand_in_line`]).
pub const STANDING: &str = "(waiting trials)";

const LEDGER_FILE: &str = "gpu-ledger.json";
const LOCK_FILE: &str = "gpu-ledger.lock";
const JOURNAL_FILE: &str = "gpu-ledger.journal";
/// A journal this long is moved to `gpu-ledger.journal.1` (replacing the one before) and a new
/// one begun: two lines a trial would otherwise grow it for good on a shared server (about
/// 30 MB per 100 000 trials).
pub const JOURNAL_ROTATE_BYTES: u64 = 16 << 20;

/// Why the ledger could not be used, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("GPU lease ledger {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    // Nothing re-records a running experiment's leases in a new ledger: moving the file away
    // while experiments run would let another take the GPUs their trials use.
    #[error("GPU lease ledger {path} is not a ledger knob wrote ({message}); until it is replaced, trials start without leases and experiments here do not see each other's: once no knob experiment runs on this machine, move it away and knob begins a new one (moved away sooner, the running experiments' leases are lost)")]
    Corrupt { path: String, message: String },
}

/// Who holds a lease: an experiment, in the process that runs its trials here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub experiment: String,
    pub pid: u32,
    /// The process's start time in clock ticks since boot (`/proc/PID/stat` field 22), so that
    /// a pid reused by another process is not taken for the holder.
    pub started: u64,
}

impl Holder {
    /// This process, holding for `experiment`.
    pub fn this_process(experiment: impl Into<String>) -> Holder {
        let pid = std::process::id();
        Holder {
            experiment: experiment.into(),
            pid,
            started: process_start_time(pid).unwrap_or(0),
        }
    }

    /// Whether the process is still there (the same process, not one that reused its pid).
    pub fn is_alive(&self) -> bool {
        process_start_time(self.pid).is_some_and(|started| started == self.started)
    }
}

/// What one trial holds on one machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub holder: Holder,
    pub trial: String,
    /// The machine within the ledger's host (`local`, or the environment an agent serves).
    pub machine: String,
    pub gpus: Vec<u32>,
    /// The holder's `maxTrialNumberPerGpu`: nobody adds a trial to these GPUs beyond it.
    pub max_per_gpu: u32,
    pub gpu_memory: ByteSize,
    pub host_memory: ByteSize,
    pub cpu_cores: u32,
    pub ticket: u64,
    /// Milliseconds since the Unix epoch.
    pub granted_ms: u64,
    /// The total memory of each GPU in `gpus` (index, bytes) as the requester probed it: a
    /// request with `gpu_memory` is granted only while the leases on each GPU, its own added,
    /// promise no more than that. Two experiments that placed against the same probe would
    /// otherwise both be granted a GPU their requests overfill together. Empty from a
    /// requester that does not say: then only the trial count limits the GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_memory_totals: Vec<(u32, ByteSize)>,
    /// The machine's CPU cores and memory as the requester probed it. While an older request of
    /// another holder waits for cores (memory) here, a request for them is granted only if the
    /// leases and the older requests, its own added, promise no more than that; 0 from a
    /// requester that does not say: then it waits behind the older request.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu_total: u32,
    #[serde(default, skip_serializing_if = "no_bytes")]
    pub host_memory_total: ByteSize,
    /// The process group the trial runs in, once started ([`Ledger::record_process_group`]).
    /// Trials run in groups of their own and outlive a holder killed with SIGKILL: the lease is
    /// kept while any process of the group lives, so that a GPU is not given to another trial
    /// while the killed experiment's trial still runs on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_group: Option<u32>,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn no_bytes(value: &ByteSize) -> bool {
    *value == ByteSize::ZERO
}

/// What a holder's waiting trials stand in line for on one machine ([`Ledger::stand_in_line`]):
/// the GPUs others hold that its trial may use, and its trial's CPU cores and memory when
/// those are what others' leases keep from it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StandFor {
    pub gpus: Vec<u32>,
    pub cpu_cores: u32,
    pub host_memory: ByteSize,
}

impl StandFor {
    /// Standing for these GPUs only.
    pub fn gpus(gpus: &[u32]) -> StandFor {
        StandFor {
            gpus: gpus.to_vec(),
            ..StandFor::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == StandFor::default()
    }
}

/// A request waiting for its GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub lease: Lease,
    /// When it was last asked for (milliseconds since the Unix epoch).
    pub renewed_ms: u64,
}

/// The whole ledger as stored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerState {
    pub next_ticket: u64,
    pub leases: Vec<Lease>,
    pub requests: Vec<Request>,
}

impl LedgerState {
    /// The leases on `machine`'s GPU `index`.
    pub fn on_gpu<'a>(&'a self, machine: &'a str, index: u32) -> impl Iterator<Item = &'a Lease> {
        self.leases
            .iter()
            .filter(move |lease| lease.machine == machine && lease.gpus.contains(&index))
    }
}

impl LedgerState {
    /// Adds to `environment` (`machine` as probed) what the trials of processes other than `me`
    /// hold there (`Gpu::held_elsewhere`, `Environment::host_held_elsewhere`), and the GPUs
    /// promised to their requests older than `my_ticket` (all of them when `me` is not in
    /// line), marked `asked_earlier` (promised to a waiting trial: nothing runs there).
    pub fn annotate(
        &self,
        environment: &mut Environment,
        machine: &str,
        me: u32,
        my_ticket: Option<u64>,
    ) {
        let others = self
            .leases
            .iter()
            .filter(|lease| lease.machine == machine && lease.holder.pid != me);
        for lease in others {
            add_host_holder(environment, lease, false);
            mark_held(environment, lease, lease.max_per_gpu, false);
        }
        let promised = self.requests.iter().filter(|request| {
            request.lease.machine == machine
                && request.lease.holder.pid != me
                && my_ticket.is_none_or(|mine| request.lease.ticket < mine)
        });
        for request in promised {
            let lease = &request.lease;
            // Promised like the GPUs: the ledger grants no newer request of others the cores or
            // memory it waits for while they do not fit beside it (`blocker`).
            add_host_holder(environment, lease, true);
            // A limit of 1: the request blocks every newer one of others for these GPUs
            // (`blocker`), however many trials its holder allows per GPU.
            mark_held(environment, lease, 1, true);
        }
    }
}

impl LedgerState {
    /// What the waiting trials of `me` (process) on `machine`, asking what `demand` says,
    /// should stand in line for ([`Ledger::stand_in_line`]), from `probed` (the machine as
    /// probed, with the experiment's limits, before [`annotate`](Self::annotate)) and `seen`
    /// (the same after it). `None` when standing in line cannot help them: they ask for no
    /// GPU, CPU cores or memory, or they could not start even with no knob trial here, their
    /// own ended too (they wait for measured host memory, or can never be placed). Otherwise
    /// the GPUs others hold or were promised that the trial may use (`gpuIndices`) and would
    /// fit on once freed (and, for a trial that also waits for its own experiment's trials, the
    /// GPUs those hold), and the trial's CPU cores (memory) when others' leases keep them
    /// short; empty when it waits for nothing others hold (it fits beside them, its own trials
    /// ended): that renews a place already taken, whose GPUs it waits for its own trials to
    /// use, and takes none. A resource it does not wait for is never taken from an experiment
    /// that can use it.
    pub fn to_stand_for(
        &self,
        probed: &Environment,
        seen: &Environment,
        machine: &str,
        me: u32,
        demand: &SchedulerConfig,
    ) -> Option<StandFor> {
        let asks_cpu_cores = demand.trial_cpu_number.unwrap_or(0) > 0;
        let asks_host_memory = demand.trial_memory_size.is_some_and(|size| size.0 > 0);
        let asks_gpus = demand.trial_gpu_number.unwrap_or(0) > 0;
        if !asks_gpus && !asks_cpu_cores && !asks_host_memory {
            return None;
        }
        // The machine with only this process's own leases on it: what the trial would find if
        // every other experiment's trial ended.
        let own: Vec<&Lease> = self
            .leases
            .iter()
            .filter(|lease| lease.machine == machine && lease.holder.pid == me)
            .collect();
        let with_own_host_leases = |environment: &Environment| {
            let mut environment = environment.clone();
            let held = &mut environment.host_held_elsewhere;
            for lease in &own {
                held.host_memory = ByteSize(held.host_memory.0 + lease.host_memory.0);
                held.cpu_cores += lease.cpu_cores;
            }
            environment
        };
        let mut alone = with_own_host_leases(probed);
        for lease in &own {
            mark_held(&mut alone, lease, lease.max_per_gpu, false);
        }
        let fits = |environment: &Environment, demand: &SchedulerConfig| {
            let mut scheduler = Scheduler::new(demand.clone());
            scheduler.upsert_environment(environment.clone()).is_ok()
                && matches!(
                    scheduler.preview(&TrialRequest::new(STANDING)),
                    Placement::Succeed { .. }
                )
        };
        // A trial that fits only once this experiment's own trials end too still stands in
        // line for what others hold: its own trials end by themselves, and without a place the
        // GPU (cores, memory) another experiment frees in the meantime is taken again by it at
        // its next retry, so that the trial could wait for ever. It is measured on the machine
        // with nothing of knob's on it.
        let waits_for_own = !fits(&alone, demand);
        if waits_for_own && !fits(probed, demand) {
            return None;
        }
        if fits(seen, demand) {
            return Some(StandFor::default());
        }
        let mut stand_for = StandFor::default();
        // The host alone, asked for one resource: short here (with this process's own leases
        // too), though it would fit were the others gone?
        let host_only = SchedulerConfig {
            trial_gpu_number: None,
            trial_gpu_memory: None,
            trial_memory_size: None,
            trial_cpu_number: None,
            ..demand.clone()
        };
        let seen_with_own = with_own_host_leases(seen);
        // Short only because of this experiment's own leases, a resource is no other's to give:
        // then it is stood for only if others' leases keep it short once those ended.
        let waits_for = |only: SchedulerConfig| {
            if fits(&alone, &only) {
                !fits(&seen_with_own, &only)
            } else {
                fits(probed, &only) && !fits(seen, &only)
            }
        };
        if asks_cpu_cores
            && waits_for(SchedulerConfig {
                trial_cpu_number: demand.trial_cpu_number,
                ..host_only.clone()
            })
        {
            stand_for.cpu_cores = demand.trial_cpu_number.unwrap_or(0);
        }
        if asks_host_memory
            && waits_for(SchedulerConfig {
                trial_memory_size: demand.trial_memory_size,
                ..host_only.clone()
            })
        {
            stand_for.host_memory = demand.trial_memory_size.unwrap_or_default();
        }
        if !asks_gpus {
            return Some(stand_for);
        }
        // Each GPU others hold, asked alone: may the trial use it, and would one GPU's share of
        // it (its memory, the GPU limits) fit there once the others are gone?
        let one_gpu = SchedulerConfig {
            trial_gpu_number: Some(1),
            trial_memory_size: None,
            trial_cpu_number: None,
            ..demand.clone()
        };
        let base = if waits_for_own { probed } else { &alone };
        let fits_gpu = |index: u32| {
            let mut only = base.clone();
            only.limits.gpu_indices = Some(vec![index]);
            fits(&only, &one_gpu)
        };
        stand_for.gpus = seen
            .gpus
            .iter()
            .filter(|gpu| !gpu.held_elsewhere.is_empty() && probed.limits.allows_gpu(gpu.index))
            .map(|gpu| gpu.index)
            .filter(|&index| fits_gpu(index))
            .collect();
        if waits_for_own && !stand_for.gpus.is_empty() {
            // It waits for others' GPUs and its own: the GPUs its own trials free are promised
            // to it too, or the other experiment, which waits for them as well, takes the first
            // one freed and the trial waits for that experiment's next trial. Only then: an
            // experiment whose trials wait for its own alone keeps no GPU from anyone.
            for lease in &own {
                for &index in &lease.gpus {
                    if probed.limits.allows_gpu(index)
                        && !stand_for.gpus.contains(&index)
                        && fits_gpu(index)
                    {
                        stand_for.gpus.push(index);
                    }
                }
            }
            stand_for.gpus.sort_unstable();
        }
        Some(stand_for)
    }
}

/// Counts `lease`'s CPU cores and host memory as held elsewhere (promised, when
/// `asked_earlier`), naming its holder for the waiting reasons.
fn add_host_holder(environment: &mut Environment, lease: &Lease, asked_earlier: bool) {
    if lease.cpu_cores == 0 && lease.host_memory.0 == 0 {
        return;
    }
    let held = &mut environment.host_held_elsewhere;
    held.host_memory = ByteSize(held.host_memory.0 + lease.host_memory.0);
    held.cpu_cores += lease.cpu_cores;
    held.holders.push(HostHolder {
        experiment: lease.holder.experiment.clone(),
        trial: (lease.trial != STANDING).then(|| lease.trial.clone()),
        host_memory: lease.host_memory,
        cpu_cores: lease.cpu_cores,
        asked_earlier,
    });
}

/// Records on each of `environment`'s GPUs that `lease` names that it is held elsewhere (only
/// promised to it, when `asked_earlier`: a request that waits), which limits the GPU to
/// `max_per_gpu` trials.
fn mark_held(environment: &mut Environment, lease: &Lease, max_per_gpu: u32, asked_earlier: bool) {
    for gpu in environment
        .gpus
        .iter_mut()
        .filter(|gpu| lease.gpus.contains(&gpu.index))
    {
        gpu.held_elsewhere.push(HeldElsewhere {
            experiment: lease.holder.experiment.clone(),
            trial: lease.trial.clone(),
            gpu_memory: lease.gpu_memory,
            max_per_gpu: Some(max_per_gpu),
            asked_earlier,
        });
    }
}

/// What [`Ledger::acquire`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is held (now, or already).
    Granted,
    /// Not yet: one line naming what holds it (the other experiment and its trial, or an older
    /// request).
    Waiting(String),
}

/// One machine-wide ledger.
#[derive(Clone, Debug)]
pub struct Ledger {
    dir: PathBuf,
}

impl Ledger {
    /// The ledger in `dir` (usually [`default_dir`]); the folder is made if missing.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Ledger, LedgerError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| LedgerError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(Ledger { dir })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(LEDGER_FILE)
    }

    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(JOURNAL_FILE)
    }

    /// Asks for `want` (its `ticket` and `granted_ms` are filled in here). Granted when every
    /// GPU it names has room under every holder's `maxTrialNumberPerGpu` (and, for its
    /// `gpu_memory`, beside what the leases there promise) and no older waiting
    /// request names one of them; otherwise the request waits, keeping its ticket, and must be
    /// asked for again (within [`REQUEST_TTL`]) until granted or [`released`](Self::release).
    pub fn acquire(&self, want: &Lease) -> Result<Acquired, LedgerError> {
        self.update(|state, journal| {
            let same = |lease: &Lease| lease.holder == want.holder && lease.trial == want.trial;
            if state.leases.iter().any(same) {
                return Acquired::Granted;
            }
            let now = now_ms();
            let position = state.requests.iter().position(|r| same(&r.lease));
            let standing = state.requests.iter().find(|r| {
                r.lease.trial == STANDING
                    && r.lease.holder == want.holder
                    && r.lease.machine == want.machine
                    && stands_for_some_of(&r.lease, want)
            });
            let ticket = match (position, standing) {
                (Some(at), _) => {
                    state.requests[at].renewed_ms = now;
                    state.requests[at].lease.ticket
                }
                // The trial's place in line is the one its holder took while it waited.
                (None, Some(standing)) => standing.lease.ticket,
                (None, None) => {
                    state.next_ticket += 1;
                    state.next_ticket
                }
            };
            if let Some(reason) = blocker(state, want, ticket) {
                if position.is_none() {
                    let mut lease = want.clone();
                    lease.ticket = ticket;
                    state.requests.push(Request {
                        lease,
                        renewed_ms: now,
                    });
                }
                return Acquired::Waiting(reason);
            }
            if let Some(at) = position {
                state.requests.remove(at);
            }
            // A standing request whose place this grant took has these GPUs (cores, memory) no
            // more: its holder stands for them again at its next probe if more trials wait.
            if let Some(at) = state.requests.iter().position(|r| {
                r.lease.trial == STANDING
                    && r.lease.holder == want.holder
                    && r.lease.machine == want.machine
                    && r.lease.ticket == ticket
            }) {
                let standing = &mut state.requests[at].lease;
                standing.gpus.retain(|gpu| !want.gpus.contains(gpu));
                if want.cpu_cores > 0 {
                    standing.cpu_cores = 0;
                }
                if want.host_memory.0 > 0 {
                    standing.host_memory = ByteSize::ZERO;
                }
                if standing.gpus.is_empty()
                    && standing.cpu_cores == 0
                    && standing.host_memory.0 == 0
                {
                    state.requests.remove(at);
                }
            }
            let mut lease = want.clone();
            lease.ticket = ticket;
            lease.granted_ms = now;
            journal.push(JournalEntry::new("grant", &lease));
            state.leases.push(lease);
            Acquired::Granted
        })
    }

    /// Takes (or renews) `holder`'s place in line for what `stand_for` names on `machine`, for
    /// its trials that wait until another experiment frees it. What is already in its request
    /// stays there (until one of its trials is granted it, or the request lapses), so an empty
    /// `stand_for` only renews a place already taken. Returns the ticket, `None` when not in
    /// line. See the module documentation.
    pub fn stand_in_line(
        &self,
        holder: &Holder,
        machine: &str,
        stand_for: &StandFor,
    ) -> Result<Option<u64>, LedgerError> {
        self.update(|state, _| {
            let at = state.requests.iter().position(|r| {
                r.lease.trial == STANDING && r.lease.holder == *holder && r.lease.machine == machine
            });
            let now = now_ms();
            match at {
                Some(at) => {
                    let request = &mut state.requests[at];
                    request.renewed_ms = now;
                    let lease = &mut request.lease;
                    for gpu in &stand_for.gpus {
                        if !lease.gpus.contains(gpu) {
                            lease.gpus.push(*gpu);
                        }
                    }
                    lease.cpu_cores = lease.cpu_cores.max(stand_for.cpu_cores);
                    lease.host_memory = lease.host_memory.max(stand_for.host_memory);
                    Some(lease.ticket)
                }
                None if stand_for.is_empty() => None,
                None => {
                    state.next_ticket += 1;
                    state.requests.push(Request {
                        lease: Lease {
                            holder: holder.clone(),
                            trial: STANDING.into(),
                            machine: machine.into(),
                            gpus: stand_for.gpus.clone(),
                            max_per_gpu: 1,
                            gpu_memory: ByteSize::ZERO,
                            host_memory: stand_for.host_memory,
                            cpu_cores: stand_for.cpu_cores,
                            ticket: state.next_ticket,
                            granted_ms: 0,
                            gpu_memory_totals: Vec::new(),
                            cpu_total: 0,
                            host_memory_total: ByteSize::ZERO,
                            process_group: None,
                        },
                        renewed_ms: now,
                    });
                    Some(state.next_ticket)
                }
            }
        })
    }

    /// Drops `holder`'s place in line on `machine` (its waiting trials can use nothing others
    /// hold), so that it holds back no other experiment.
    pub fn leave_line(&self, holder: &Holder, machine: &str) -> Result<(), LedgerError> {
        self.update(|state, _| {
            state.requests.retain(|r| {
                !(r.lease.trial == STANDING
                    && r.lease.holder == *holder
                    && r.lease.machine == machine)
            });
        })
    }

    /// Gives back what a trial held (nothing if it held nothing), and drops its request.
    pub fn release(&self, holder: &Holder, trial: &str) -> Result<(), LedgerError> {
        self.update(|state, journal| {
            let same = |lease: &Lease| lease.holder == *holder && lease.trial == trial;
            for lease in state.leases.iter().filter(|lease| same(lease)) {
                journal.push(JournalEntry::new("release", lease));
            }
            state.leases.retain(|lease| !same(lease));
            state.requests.retain(|request| !same(&request.lease));
        })
    }

    /// Records the process group a trial holding a lease runs in (nothing when it holds none:
    /// it ended meanwhile, or took no lease), so that its lease outlives its holder as long as
    /// the trial does (see [`Lease::process_group`]).
    pub fn record_process_group(
        &self,
        holder: &Holder,
        trial: &str,
        group: u32,
    ) -> Result<(), LedgerError> {
        self.update(|state, _| {
            for lease in state
                .leases
                .iter_mut()
                .filter(|lease| lease.holder == *holder && lease.trial == trial)
            {
                lease.process_group = Some(group);
            }
        })
    }

    /// The ledger now, dead holders' leases reclaimed.
    pub fn snapshot(&self) -> Result<LedgerState, LedgerError> {
        self.update(|state, _| state.clone())
    }

    /// Runs `change` on the ledger under the lock, after reclaiming what dead holders and
    /// expired requests hold, and writes the result back.
    fn update<T>(
        &self,
        change: impl FnOnce(&mut LedgerState, &mut Vec<JournalEntry>) -> T,
    ) -> Result<T, LedgerError> {
        let _lock = self.lock()?;
        let path = self.path();
        let mut state = match std::fs::read(&path) {
            Ok(bytes) if bytes.is_empty() => LedgerState::default(),
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LedgerError::Corrupt {
                path: path.display().to_string(),
                message: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => LedgerState::default(),
            Err(source) => return Err(self.io(&path, source)),
        };
        let before = state.clone();
        let mut journal = Vec::new();
        reclaim(&mut state, &mut journal);
        let result = change(&mut state, &mut journal);
        if state != before {
            let temp = self
                .dir
                .join(format!("{LEDGER_FILE}.{}.tmp", std::process::id()));
            let text = serde_json::to_vec_pretty(&state).expect("the ledger serializes");
            std::fs::write(&temp, text).map_err(|source| self.io(&temp, source))?;
            std::fs::rename(&temp, &path).map_err(|source| self.io(&path, source))?;
        }
        if !journal.is_empty() {
            let journal_path = self.journal_path();
            // Under the lock, as every write: no other writer appends while it moves.
            let full = std::fs::metadata(&journal_path)
                .is_ok_and(|meta| meta.len() >= JOURNAL_ROTATE_BYTES);
            if full {
                let older = self.dir.join(format!("{JOURNAL_FILE}.1"));
                std::fs::rename(&journal_path, &older)
                    .map_err(|source| self.io(&journal_path, source))?;
            }
            let mut file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&journal_path)
                .map_err(|source| self.io(&journal_path, source))?;
            let mut text = String::new();
            for entry in &journal {
                text.push_str(&serde_json::to_string(entry).expect("an entry serializes"));
                text.push('\n');
            }
            file.write_all(text.as_bytes())
                .map_err(|source| self.io(&journal_path, source))?;
        }
        Ok(result)
    }

    fn lock(&self) -> Result<Flock<File>, LedgerError> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| self.io(&path, source))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, errno)| self.io(&path, std::io::Error::from(errno)))
    }

    fn io(&self, path: &Path, source: std::io::Error) -> LedgerError {
        LedgerError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// `grant`, `release` or `reclaim` (its holder died).
    pub op: String,
    pub at_ms: u64,
    pub experiment: String,
    pub pid: u32,
    pub trial: String,
    pub machine: String,
    pub gpus: Vec<u32>,
}

impl JournalEntry {
    fn new(op: &str, lease: &Lease) -> JournalEntry {
        JournalEntry {
            op: op.to_owned(),
            at_ms: now_ms(),
            experiment: lease.holder.experiment.clone(),
            pid: lease.holder.pid,
            trial: lease.trial.clone(),
            machine: lease.machine.clone(),
            gpus: lease.gpus.clone(),
        }
    }
}

/// Drops the leases and requests of dead holders, and requests nobody renewed.
fn reclaim(state: &mut LedgerState, journal: &mut Vec<JournalEntry>) {
    let mut alive: Vec<(u32, bool)> = Vec::new();
    let mut is_alive = |holder: &Holder| match alive.iter().find(|(pid, _)| *pid == holder.pid) {
        Some((_, known)) => *known,
        None => {
            let known = holder.is_alive();
            alive.push((holder.pid, known));
            known
        }
    };
    state.leases.retain(|lease| {
        let keep = is_alive(&lease.holder) || lease.process_group.is_some_and(group_lives);
        if !keep {
            journal.push(JournalEntry::new("reclaim", lease));
        }
        keep
    });
    let now = now_ms();
    state.requests.retain(|request| {
        let ttl = if request.lease.trial == STANDING {
            STANDING_TTL
        } else {
            REQUEST_TTL
        };
        is_alive(&request.lease.holder)
            && now.saturating_sub(request.renewed_ms) <= ttl.as_millis() as u64
    });
}

/// Whether a process of group `group` is still there (a zombie too, for the moment before its
/// new parent reaps it). `EPERM` means there is one, of another user.
fn group_lives(group: u32) -> bool {
    let Ok(group) = i32::try_from(group) else {
        return false;
    };
    group > 1
        && !matches!(
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(group), None),
            Err(nix::errno::Errno::ESRCH)
        )
}

/// Whether standing request `standing` holds a place for some of what `want` asks.
fn stands_for_some_of(standing: &Lease, want: &Lease) -> bool {
    standing.gpus.iter().any(|gpu| want.gpus.contains(gpu))
        || (standing.cpu_cores > 0 && want.cpu_cores > 0)
        || (standing.host_memory.0 > 0 && want.host_memory.0 > 0)
}

/// Why `want` (with `ticket`) cannot be granted now, or `None` if it can.
fn blocker(state: &LedgerState, want: &Lease, ticket: u64) -> Option<String> {
    gpu_blocker(state, want, ticket).or_else(|| host_blocker(state, want, ticket))
}

/// Why `want` must wait for CPU cores or memory: an older request of another holder waits for
/// them here, and `want` does not fit beside it and the leases (as `want`'s requester probed
/// the machine; without its figures, not at all). Without such a request the requester's
/// scheduler, which sees the others' leases, has decided: first come, first served, so that a
/// request for many cores is not starved by a stream of small ones.
fn host_blocker(state: &LedgerState, want: &Lease, ticket: u64) -> Option<String> {
    let older: Vec<&Lease> = state
        .requests
        .iter()
        .map(|request| &request.lease)
        .filter(|lease| {
            lease.ticket < ticket && lease.machine == want.machine && lease.holder != want.holder
        })
        .collect();
    let leases = || {
        state
            .leases
            .iter()
            .filter(|lease| lease.machine == want.machine)
    };
    if want.cpu_cores > 0 {
        let mut waiting: Vec<&&Lease> = older.iter().filter(|lease| lease.cpu_cores > 0).collect();
        waiting.sort_by_key(|lease| lease.ticket);
        let promised: u64 = leases()
            .map(|lease| u64::from(lease.cpu_cores))
            .chain(waiting.iter().map(|lease| u64::from(lease.cpu_cores)))
            .sum();
        if let Some(first) = waiting.first() {
            if promised + u64::from(want.cpu_cores) > u64::from(want.cpu_total) {
                return Some(format!(
                    "CPU cores promised first to {} (asked earlier)",
                    describe(first, want)
                ));
            }
        }
    }
    if want.host_memory.0 > 0 {
        let mut waiting: Vec<&&Lease> = older
            .iter()
            .filter(|lease| lease.host_memory.0 > 0)
            .collect();
        waiting.sort_by_key(|lease| lease.ticket);
        let promised: u64 = leases()
            .map(|lease| lease.host_memory.0)
            .chain(waiting.iter().map(|lease| lease.host_memory.0))
            .sum();
        if let Some(first) = waiting.first() {
            if promised.saturating_add(want.host_memory.0) > want.host_memory_total.0 {
                return Some(format!(
                    "memory promised first to {} (asked earlier)",
                    describe(first, want)
                ));
            }
        }
    }
    None
}

/// Why `want` (with `ticket`) cannot be granted one of its GPUs now, or `None` if it can.
fn gpu_blocker(state: &LedgerState, want: &Lease, ticket: u64) -> Option<String> {
    for &gpu in &want.gpus {
        let held: Vec<&Lease> = state.on_gpu(&want.machine, gpu).collect();
        let limit = trials_per_gpu(held.iter().map(|lease| lease.max_per_gpu), want.max_per_gpu);
        if held.len() as u32 >= limit {
            let holders: Vec<String> = held.iter().map(|lease| describe(lease, want)).collect();
            return Some(format!("GPU {gpu} held by {}", holders.join(", ")));
        }
        // A GPU nobody holds is always granted: the requester's scheduler found the trial fits
        // it, and refusing there would leave it waiting for nothing.
        let total = want
            .gpu_memory_totals
            .iter()
            .find(|(index, _)| *index == gpu)
            .map(|&(_, total)| total);
        if let Some(total) = total.filter(|_| want.gpu_memory.0 > 0 && !held.is_empty()) {
            let promised: u64 = held.iter().map(|lease| lease.gpu_memory.0).sum();
            if promised.saturating_add(want.gpu_memory.0) > total.0 {
                let holders: Vec<String> = held
                    .iter()
                    .map(|lease| format!("{} ({})", describe(lease, want), lease.gpu_memory))
                    .collect();
                return Some(format!(
                    "GPU {gpu} has {total}, of which {} promised to {}: {} left, {} asked",
                    ByteSize(promised),
                    holders.join(", "),
                    ByteSize(total.0.saturating_sub(promised)),
                    want.gpu_memory
                ));
            }
        }
        let older = state.requests.iter().find(|request| {
            request.lease.ticket < ticket
                && request.lease.machine == want.machine
                && request.lease.gpus.contains(&gpu)
                && request.lease.holder != want.holder
        });
        if let Some(older) = older {
            return Some(format!(
                "GPU {gpu} promised first to {} (asked earlier)",
                describe(&older.lease, want)
            ));
        }
    }
    None
}

/// "trial abc of experiment exp2 (pid 123)", or "trial abc" for the asker's own experiment.
fn describe(lease: &Lease, asker: &Lease) -> String {
    if lease.trial == STANDING {
        format!(
            "the waiting trials of experiment {} (pid {})",
            lease.holder.experiment, lease.holder.pid
        )
    } else if lease.holder == asker.holder {
        format!("trial {}", lease.trial)
    } else {
        format!(
            "trial {} of experiment {} (pid {})",
            lease.trial, lease.holder.experiment, lease.holder.pid
        )
    }
}

/// knob's per-user home (`$KNOB_HOME`, else `$XDG_DATA_HOME/knob`, else
/// `~/.local/share/knob`), where the ledger lives, and knob-core's registry and logs
/// (`registry::knob_home`).
pub fn default_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("KNOB_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(home);
    }
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        // std's home_dir: $HOME, else the user's entry in the password database (a service or
        // `env -i` without HOME would otherwise get knob's home in whatever folder it ran in).
        .or_else(|| std::env::home_dir().map(|h| h.join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."))
        .join("knob")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// When process `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`): with
/// the pid, it names one process, not a later one that got the same pid. `None` when the
/// process is gone (or is a zombie, which holds nothing any more). The experiment registry
/// checks its runners with it too.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses; the fields after it start
    // after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    // `rest` starts at field 3 (state), so field 22 is the 20th from here.
    fields.nth(18)?.parse().ok()
}
