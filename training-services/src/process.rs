//! Trial processes: `/bin/bash -c <command>` as the leader of a new process group, signals to
//! the whole tree it started ([`TrialTree`]), and the tail of its stderr.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::process::Stdio;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Lines of stderr carried in `TrialEnded`.
pub const STDERR_TAIL_LINES: usize = 20;
/// Bytes of stderr read for those lines, so one endless line cannot make the event huge.
pub const STDERR_TAIL_BYTES: u64 = 4096;

/// Inherited variables that would switch `nni` away from the channels knob serves (reuse mode
/// makes it print metrics to stdout instead); a trial should not pick them up from knob's own
/// environment by accident.
const CONFLICTING_INHERITED_VARS: [&str; 2] = ["REUSE_MODE", "MULTI_PHASE"];

/// The most open files a trial pool asks for: a trial costs its service a few (the stdout pipe,
/// the stdout and stderr files, its metric files while they are read), and a soft limit of 1024
/// (the usual default) would fail the starts of a few hundred trials at once with EMFILE. Not
/// the hard limit itself, which may be a million: trials inherit the soft limit, and a program
/// that closes every descriptor up to it before an exec would pay for each.
const OPEN_FILES_WANTED: u64 = 1 << 16;

/// Raises this process's soft limit of open files towards [`OPEN_FILES_WANTED`], as far as the
/// hard limit allows (no privilege needed). Called by each trial pool; a failure leaves the
/// limit as it was, and [`start_failure_note`] then names it when a start fails for it.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let wanted = OPEN_FILES_WANTED.min(hard);
    if soft < wanted {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, wanted, hard);
    }
}

/// What follows the error text of a trial start that failed for want of a resource the machine
/// gives back (descriptors, processes, memory, disk space): what to do, and the plugin API's promise that
/// nothing of the trial runs, on which the core tries the start again after a pause instead of
/// failing the trial. Empty for any other error.
pub fn start_failure_note(error: &std::io::Error) -> String {
    use nix::libc::{EAGAIN, EDQUOT, EMFILE, ENFILE, ENOMEM, ENOSPC};
    let hint = match error.raw_os_error() {
        Some(EMFILE) => {
            let limit = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(soft, _)| soft.to_string())
                .unwrap_or_else(|_| "unknown".into());
            format!(
                " (this process may open {limit} files, `ulimit -n`; raise the limit where knob starts, or lower trialConcurrency)"
            )
        }
        Some(ENFILE) => " (the system's table of open files is full)".to_string(),
        Some(EAGAIN | ENOMEM) => String::new(),
        // A trial's folder on a full disk (or over quota): space comes back as other trials
        // end or the user frees it, and then the start works.
        Some(ENOSPC | EDQUOT) => {
            " (the disk under the trial's folder is full: free space on its filesystem)".to_string()
        }
        _ => return String::new(),
    };
    format!("{hint}; {}", knob_plugin_api::service::NOT_STARTED)
}

/// The bytes still free to an unprivileged writer on the filesystem holding `path` when under
/// 1 MiB: too little for a trial's output, let alone its next files.
pub fn nearly_full(path: &Path) -> Option<u64> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let stats = nix::sys::statvfs::statvfs(existing).ok()?;
    let free = stats
        .blocks_available()
        .saturating_mul(stats.fragment_size());
    (free < 1 << 20).then_some(free)
}

/// Starts `command` under `/bin/bash -c` in `code_dir`, in a process group of its own (so the
/// whole tree it starts can be signalled at once), with `env` added to knob's environment less
/// its secrets ([`remove_secret_variables`]), stdin closed, stdout piped to the caller, and
/// stderr into `stderr`.
///
/// Must be called inside a tokio runtime. The [`Leader`] keeps the leader's pid known as one
/// knob started (see [`TrialTree`]'s scan) until it is dropped, once the trial has ended.
pub fn spawn_in_own_group(
    command: &str,
    code_dir: &Path,
    env: &[(String, OsString)],
    stderr: File,
) -> std::io::Result<(Child, Leader)> {
    let mut bash = Command::new("/bin/bash");
    // `--`: a command that starts with `-` or `+` (`-u main.py` from a templated config) is
    // the command, not bash's options (`/bin/bash: - : invalid option`).
    bash.args(["-c", "--"])
        .arg(command)
        .current_dir(code_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .process_group(0)
        .kill_on_drop(false);
    for name in CONFLICTING_INHERITED_VARS {
        bash.env_remove(name);
    }
    remove_secret_variables(&mut bash);
    bash.envs(env.iter().map(|(k, v)| (k, v)));
    let child = bash.spawn()?;
    let leader = Leader::new(child.id());
    Ok((child, leader))
}

/// Leaves knob's secret variables (`knob_plugin_api::secrets::SECRET_VARIABLES`: the API
/// token, SSH and SMTP passwords, …) out of what `command` inherits. Every trial is started
/// through [`spawn_in_own_group`], here or in an agent; a Slurm job or step gets knob's
/// environment through `sbatch` and `srun` (`--export` defaults to all of it) and so is started
/// without them too. A trial is user code that may log its whole environment.
pub fn remove_secret_variables(command: &mut Command) {
    knob_plugin_api::secrets::remove_from(command.as_std_mut());
}

/// The pids of the trial leaders this process started whose trials have not ended: processes
/// that are surely not any trial's descendants (knob started them).
fn leaders() -> std::sync::MutexGuard<'static, std::collections::BTreeSet<u32>> {
    static LEADERS: std::sync::Mutex<std::collections::BTreeSet<u32>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    LEADERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A trial leader's pid, known as one knob started until this is dropped. Dropped once the
/// trial has ended and its last scan is done: a pid known longer could, after the pid counter
/// went round, be another trial's descendant's.
#[derive(Debug)]
pub struct Leader(Option<u32>);

impl Leader {
    fn new(pid: Option<u32>) -> Leader {
        if let Some(pid) = pid {
            leaders().insert(pid);
        }
        Leader(pid)
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            leaders().remove(&pid);
        }
    }
}

/// The variable every process of one run of a trial inherits, with a value no other run on
/// this host has (see [`TrialTree`]).
pub const TRIAL_RUN_ENV: &str = "KNOB_TRIAL_RUN";

/// A fresh value for [`TRIAL_RUN_ENV`]: this process's pid, when it started (a later process
/// with the same pid has a later start), and a count of the runs it started.
pub fn new_trial_run_mark() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static STARTED: OnceLock<u128> = OnceLock::new();
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    format!("{}.{started}.{run}", std::process::id())
}

/// Every process one run of a trial started: the members of its process group, and the
/// processes that carry its [`TRIAL_RUN_ENV`] mark. A process that left the group (a `setsid`
/// child, a double-forked daemon, re-parented to init) keeps the environment it was started
/// with, so it is found by the mark; the group alone would miss it and it would outlive the
/// trial. A mark unique to the run, not the experiment and trial ids, keeps an identical id of
/// another experiment on the same host (or another attempt) out of it. Only a process that
/// cleared its environment and left the group before a scan saw it escapes.
#[derive(Debug, Clone)]
pub struct TrialTree {
    /// The group is the leader's pid; `None` only if the OS gave no pid.
    pgid: Option<u32>,
    /// `KNOB_TRIAL_RUN=<mark>`, as the entry appears in `/proc/<pid>/environ`.
    entry: Vec<u8>,
    /// Taken before the leader was spawned: no process of the run started earlier.
    not_before: BeforeSpawn,
    /// The processes outside the group a scan found carrying the mark, by pid and start time
    /// (shared by the tree's clones): each stays the trial's until it is gone, whatever its
    /// environment reads later. Why: a process that is exiting has no environment to read, and
    /// one killed on a loaded machine can wait seconds for a CPU to exit on (a process in a
    /// session of its own, `setsid`, is scheduled as a group of its own: up to 5 s with three
    /// runs at once of `lifecycle::a_process_that_left_the_group_is_stopped_even_while_it_execs`
    /// on the 2-vCPU VM). Looked up by its environment alone, it read as gone while it still
    /// ran, and the trial ended before it (4 of 6 such runs failed).
    found: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<u32, Option<StartTicks>>>>,
}

/// How long, at most, [`TrialTree`]'s scan reads again the environment of a process in the
/// middle of execve(2) (see [`Mark::MidExec`]), and its first pause between reads, doubled
/// after each up to [`MID_EXEC_LONGEST_PAUSE`]. An exec's window is well under a millisecond of
/// CPU, but a process that waits for a CPU stays in it: on a loaded machine (load 9 on 2 cores)
/// a fixed 10 ms of re-reads missed one now and then, 150 ms still did at load 20, and 600 ms
/// did with three runs at once of
/// `lifecycle::a_process_that_left_the_group_is_stopped_even_while_it_execs` (a process
/// exec'ing itself in a loop, in a session of its own, which the scheduler left waiting for a
/// CPU for seconds: 2 of 17 runs failed, each with the process still between the two halves
/// of an exec). Doubling keeps the reads few; the time is paid only for a process that stays
/// in the middle of an exec (a process whose environment is really empty is told apart and
/// costs nothing). Each read is itself a few reads of one open file ([`SETTLE_PAUSES`]).
const MID_EXEC_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
const MID_EXEC_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_micros(500);
const MID_EXEC_LONGEST_PAUSE: std::time::Duration = std::time::Duration::from_millis(32);

/// Pauses between reads of one open `/proc/<pid>/environ` that read empty, before the file is
/// given up (and the scan opens it again later).
///
/// Why the same file: opening it waits while the process is inside execve(2) (the kernel's
/// `exec_update_lock`, taken for the switch to the new memory) and returns just after, with the
/// new memory, whose environment the kernel has not written yet. A process that execs in a loop
/// spends much of its time there, so opens keep meeting that moment (4–14 % of fresh opens of
/// such a looper read empty on the quiet VM, 0.03–0.07 % with these re-reads), and under CI's
/// load two dozen fresh opens in 600 ms all did now and then: the escape of
/// `lifecycle::a_process_that_left_the_group_is_stopped_even_while_it_execs`. The file opened
/// then reads the new environment a fraction of a millisecond later, once the kernel has
/// written it, and before the next exec can replace that memory.
const SETTLE_PAUSES: [std::time::Duration; 4] = [
    std::time::Duration::from_micros(100),
    std::time::Duration::from_micros(200),
    std::time::Duration::from_micros(400),
    std::time::Duration::from_micros(800),
];

/// What a process's environment says about a trial's mark.
enum Mark {
    Carried,
    /// Its environment lacks the mark, is really empty, or cannot be read (another user's);
    /// or the process is gone or exiting (it starts nothing more).
    Absent,
    /// Read empty or not at all (ESRCH) while the process is in the middle of execve(2): its
    /// new memory has no environment yet (`env_end` in `/proc/<pid>/stat` is 0), or the file
    /// opened read the memory of an exec the process has since left.
    MidExec,
}

/// Where the clocks and the kernel's pid counter stood just before a trial's leader was
/// spawned: every process of the run started later, and (until the counter wraps) got a larger
/// pid than the counter's `last_pid` then.
///
/// A scan reads `/proc/<pid>/stat` (the kernel formats fifty fields: the dearest file of a
/// process) only of processes whose pid the counter handed out after the spawn (above
/// `last_pid`, and not above where the counter stands once `/proc` was listed: a higher pid is
/// an older process's, from the counter's previous turn), while it can tell that it has not
/// wrapped since: the counter's value now is not below `last_pid`, and either too little time
/// has passed for it to have gone all the way round (at most a million pids a second, far more
/// than any machine forks), or, within [`FORK_COUNT_HORIZON`], too few forks have happened
/// (see [`ForkCount`]). On a machine of a few hundred processes that turns each scan of a short
/// trial from hundreds of reads into a handful (a quarter of knob's CPU in
/// `trial_overhead.sh`). Otherwise, or without the counter, every process is looked at.
#[derive(Debug, Clone, Copy)]
pub struct BeforeSpawn {
    ticks: StartTicks,
    /// `/proc/sys/kernel/ns_last_pid`: the last pid handed out in this pid namespace.
    last_pid: Option<u32>,
    at: std::time::Instant,
    /// How long the counter surely takes to wrap (1 µs a pid of `pid_max`).
    wrap_time: std::time::Duration,
    /// `/proc/sys/kernel/pid_max`, read once a process (see [`pid_max`]).
    pid_max: u32,
    /// Read only where `wrap_time` is shorter than [`FORK_COUNT_HORIZON`] (a `pid_max` below a
    /// million, such as the 32 768 of many VMs and containers, whose 33 ms a trial under load
    /// outlives): the kernel's fork count and tasks before the spawn.
    forks: Option<ForkCount>,
}

/// How long after a trial's spawn the fork count may tell that the pid counter has not wrapped.
/// A fork the kernel refuses after giving it a pid (over a cgroup's `pids.max`) moves the
/// counter without being counted; within this time that would take tens of thousands of such
/// refusals a second at the smallest common `pid_max` (32 768). A trial that runs longer pays
/// one full scan at its end, which its length dwarfs.
pub const FORK_COUNT_HORIZON: std::time::Duration = std::time::Duration::from_secs(1);

/// The kernel's count of forks since boot (`processes` in `/proc/stat`, every pid namespace)
/// and its number of tasks, threads included (the fourth field of `/proc/loadavg`).
///
/// Why it bounds the pid counter: after a pid `last_pid` was handed out, a new process can get
/// a pid at or below it only once the counter has gone past `pid_max` and started again at 300
/// (`RESERVED_PIDS`). If the counter is now at or above `last_pid`, that took a whole turn: every
/// pid from 300 to `pid_max` visited once, each either handed to a fork (counted here) or
/// stepped over because it was in use when the turn began (a task's pid, or the number of a
/// process group or session whose leader is gone, at most one of each a task: three a task).
/// So fewer forks than `pid_max - 300 - 3 × tasks` since mean no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkCount {
    forks: u64,
    tasks: u64,
}

/// The kernel's pids below this are kept for its own threads; a wrapped counter starts here.
const RESERVED_PIDS: u64 = 300;

/// How old a fork count read by an earlier trial of this process may be to serve as a spawn's
/// count before it. A count read earlier is still a count before the spawn: the forks between
/// the two only add to those counted since, so at worst the scan looks at every process. Each
/// read formats the whole of `/proc/stat` (a third of [`BeforeSpawn::now`] in
/// `trial_overhead.sh`, read at each trial). A turn takes some thirty thousand forks at the
/// smallest common `pid_max`; what a machine forks in this time is a small part of that.
const FORK_COUNT_REUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// The latest fork count read by this process, and when it had been read.
static LATEST_FORKS: std::sync::Mutex<Option<(u64, std::time::Instant)>> =
    std::sync::Mutex::new(None);

/// The fork count now (`processes` in `/proc/stat`), kept as the latest read.
fn read_forks() -> Option<u64> {
    let forks = parse_forks(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let read_by = std::time::Instant::now();
    *LATEST_FORKS.lock().unwrap_or_else(|p| p.into_inner()) = Some((forks, read_by));
    Some(forks)
}

/// A fork count read at or before now: the latest read when it is younger than
/// [`FORK_COUNT_REUSE`], else a new one.
fn forks_so_far() -> Option<u64> {
    let latest = *LATEST_FORKS.lock().unwrap_or_else(|p| p.into_inner());
    match latest {
        Some((forks, read_by)) if read_by.elapsed() < FORK_COUNT_REUSE => Some(forks),
        _ => read_forks(),
    }
}

impl ForkCount {
    /// The fork count so far (see [`forks_so_far`]) and the tasks now; `None` where `/proc`
    /// does not give them.
    fn now() -> Option<ForkCount> {
        // Read before the tasks: a task started between the two reads is counted as a fork.
        let forks = forks_so_far()?;
        let loadavg = std::fs::read_to_string("/proc/loadavg").ok()?;
        let tasks = parse_tasks(&loadavg)?;
        Some(ForkCount { forks, tasks })
    }

    /// Whether the pid counter cannot have made a whole turn between `self` and a fork count
    /// of `forks_now` (see [`ForkCount`]).
    fn too_few_for_a_turn(&self, forks_now: u64, pid_max: u32) -> bool {
        let Some(forks) = forks_now.checked_sub(self.forks) else {
            return false;
        };
        let in_use = self.tasks.saturating_mul(3);
        forks.saturating_add(in_use) < u64::from(pid_max).saturating_sub(RESERVED_PIDS)
    }
}

/// `processes` of a `/proc/stat` text: forks since boot.
fn parse_forks(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("processes "))?
        .trim()
        .parse()
        .ok()
}

/// The number of tasks of a `/proc/loadavg` text (`0.20 0.18 0.12 1/80 11206`: 80).
fn parse_tasks(loadavg: &str) -> Option<u64> {
    let running_and_total = loadavg.split_ascii_whitespace().nth(3)?;
    running_and_total.split_once('/')?.1.parse().ok()
}

/// A number in a `/proc` file of one number.
fn read_number(path: &str) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `/proc/sys/kernel/pid_max`, read once a process: it was a fifth of [`BeforeSpawn::now`]
/// read at each trial. Root may change it at any time; a value raised since only makes the
/// bounds above more cautious (a turn takes longer than they assume), while one lowered below
/// the counter while knob runs is not seen: the window assumes no one does that to a machine
/// running trials.
fn pid_max() -> Option<u32> {
    static PID_MAX: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *PID_MAX.get_or_init(|| read_number("/proc/sys/kernel/pid_max"))
}

impl BeforeSpawn {
    pub fn now() -> BeforeSpawn {
        let pid_max = pid_max();
        let wrap_time = std::time::Duration::from_micros(u64::from(pid_max.unwrap_or(0)));
        // Before the counter: what it hands out after this read is counted as a fork.
        let forks = (pid_max.is_some() && wrap_time < FORK_COUNT_HORIZON)
            .then(ForkCount::now)
            .flatten();
        let last_pid = read_number("/proc/sys/kernel/ns_last_pid").filter(|_| pid_max.is_some());
        BeforeSpawn {
            ticks: StartTicks::now(),
            last_pid,
            at: std::time::Instant::now(),
            wrap_time,
            pid_max: pid_max.unwrap_or(0),
            forks,
        }
    }

    /// For a scan whose listing of `/proc` was taken just before: the pids its processes of
    /// the run can have. When the counter cannot have wrapped since the spawn, those it handed
    /// out since, up to where it stands now (a process listed was started before now); every
    /// pid otherwise.
    fn new_pids(&self) -> PidWindow {
        let every = PidWindow {
            above: 0,
            up_to: u32::MAX,
        };
        let Some(last_pid) = self.last_pid else {
            return every;
        };
        let counter_now = read_number("/proc/sys/kernel/ns_last_pid");
        match counter_now {
            Some(now) if now >= last_pid && self.no_turn_since(self.at.elapsed(), read_forks) => {
                PidWindow {
                    above: last_pid,
                    up_to: now,
                }
            }
            _ => every,
        }
    }

    /// Whether the counter cannot have made a whole turn `elapsed` after the spawn, with
    /// `forks_now` the fork count now (read only when the time alone cannot tell).
    fn no_turn_since(
        &self,
        elapsed: std::time::Duration,
        forks_now: impl FnOnce() -> Option<u64>,
    ) -> bool {
        if elapsed < self.wrap_time {
            return true;
        }
        let Some(before) = self.forks.filter(|_| elapsed < FORK_COUNT_HORIZON) else {
            return false;
        };
        forks_now().is_some_and(|now| before.too_few_for_a_turn(now, self.pid_max))
    }
}

/// The pids a scan looks at: those above `above`, up to `up_to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PidWindow {
    above: u32,
    up_to: u32,
}

impl PidWindow {
    fn holds(&self, pid: u32) -> bool {
        pid > self.above && pid <= self.up_to
    }

    /// Whether every pid of the window is one of `known` (at most [`KNOWN_WINDOW`] of them are
    /// looked at; a wider window is not).
    fn only(&self, known: &std::collections::BTreeSet<u32>) -> bool {
        let width = self.up_to.saturating_sub(self.above);
        width <= KNOWN_WINDOW
            && (self.above.saturating_add(1)..=self.up_to).all(|pid| known.contains(&pid))
    }
}

/// The widest pid window [`TrialTree`]'s scan compares with the leaders knob started before it
/// lists `/proc`: a short trial's window holds its own leader and those of the trials started
/// beside it, a few pids.
const KNOWN_WINDOW: u32 = 64;

/// The pids `/proc` lists now, in one listing, before the pid window is read (see
/// [`BeforeSpawn::new_pids`]); `None` without `/proc`.
fn listed_pids() -> Option<Vec<u32>> {
    let entries = std::fs::read_dir("/proc").ok()?;
    Some(
        entries
            .flatten()
            .filter_map(|entry| entry_pid(&entry))
            .collect(),
    )
}

/// The pid a `/proc` entry names, when it names a process.
fn entry_pid(entry: &std::fs::DirEntry) -> Option<u32> {
    entry.file_name().to_str()?.parse().ok()
}

/// A process start time as `/proc/<pid>/stat` gives it (field 22: clock ticks since boot).
///
/// A scan reads the environment only of processes that started after the trial's leader was
/// spawned: reading another process's environment costs a look into its memory, and on a busy
/// machine every other process was there before the trial (scanning each one's environment
/// three times a trial was most of the local service's cost a trial in `trial_overhead.sh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct StartTicks(u64);

impl StartTicks {
    /// Now, less one tick for the rounding of both clocks: at or before the start of any
    /// process created from now on. Zero (every process looked at) when the clock cannot be
    /// read.
    pub fn now() -> StartTicks {
        use nix::time::{clock_gettime, ClockId};
        use nix::unistd::{sysconf, SysconfVar};
        // The kernel's start times count CLOCK_BOOTTIME in USER_HZ ticks.
        let hz = sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .and_then(|hz| u64::try_from(hz).ok())
            .filter(|&hz| hz > 0);
        let (Some(hz), Ok(now)) = (hz, clock_gettime(ClockId::CLOCK_BOOTTIME)) else {
            return StartTicks(0);
        };
        let nanos = u128::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u128::try_from(now.tv_nsec()).unwrap_or(0);
        let ticks = nanos * u128::from(hz) / 1_000_000_000;
        StartTicks(u64::try_from(ticks).unwrap_or(u64::MAX).saturating_sub(1))
    }
}

impl TrialTree {
    /// `not_before`: [`BeforeSpawn::now`] taken before the leader was spawned.
    pub fn new(pgid: Option<u32>, mark: &str, not_before: BeforeSpawn) -> TrialTree {
        TrialTree {
            pgid,
            entry: format!("{TRIAL_RUN_ENV}={mark}").into_bytes(),
            not_before,
            found: Default::default(),
        }
    }

    /// The processes found earlier (see `found`) that still run: the same pid, started at the
    /// same time, not a zombie.
    fn found_still_running(&self) -> std::collections::BTreeMap<u32, Option<StartTicks>> {
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found.retain(|&pid, start| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .is_some_and(|stat| {
                    parse_state_and_group(&stat).is_some_and(|(state, _)| !has_ended(state))
                        && parse_start(&stat) == *start
                })
        });
        found.clone()
    }

    /// The pids of the live processes (zombies are finished) that carry the mark but are not
    /// in the group, and whether the group has a live member. Without `/proc` (not Linux),
    /// none, and a group that answers signals counts as alive. Async for its pauses while a
    /// process is in the middle of an exec (up to [`MID_EXEC_PATIENCE`]): a thread of the
    /// trials' runtime blocked that long would hold up the other trials' supervision.
    async fn scan(&self) -> (Vec<i32>, bool) {
        let group_answers = self.pgid.is_some_and(|pgid| {
            i32::try_from(pgid).is_ok_and(|raw| killpg(Pid::from_raw(raw), None).is_ok())
        });
        // Every process of the run got a pid in the window, the pids handed out since the
        // spawn. When the group is empty and every pid of the window went to a trial leader
        // knob started (this trial's, and those of trials started beside it: knob's children,
        // none of them a descendant of this trial), the run has no process left, without
        // listing `/proc` (a short trial's end: that listing was most of its scan's cost in
        // `trial_overhead.sh`). Any other pid in the window (a process a trial started, a
        // thread, another program's process) means the listing below, as before.
        let found = self.found_still_running();
        if !group_answers && found.is_empty() && self.not_before.new_pids().only(&leaders()) {
            return (Vec::new(), false);
        }
        let Some(listed) = listed_pids() else {
            return (Vec::new(), group_answers);
        };
        let me = std::process::id();
        let window = self.not_before.new_pids();
        let mut marked = Vec::new();
        let mut mid_exec = Vec::new();
        let mut group_alive = false;
        for pid in listed {
            if pid == me || found.contains_key(&pid) || !window.holds(pid) {
                continue;
            }
            let Some(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok() else {
                continue;
            };
            let Some((state, group)) = parse_state_and_group(&stat) else {
                continue;
            };
            if has_ended(state) {
                continue;
            }
            if Some(group) == self.pgid {
                group_alive = true;
                continue;
            }
            // A kernel thread has no environment and no trial started it; a process that is
            // exiting has none left to read (it would read as mid-exec) and can start nothing.
            // One of the run's that exits was found before it was signalled (`found`).
            if is_kernel_thread(&stat) || is_exiting(&stat) {
                continue;
            }
            // Older than the run: not one of its processes (an unreadable start time is looked at).
            let start = parse_start(&stat);
            if start.is_some_and(|start| start < self.not_before.ticks) {
                continue;
            }
            match self.read_mark(pid) {
                Mark::Carried => marked.push((pid, start)),
                Mark::MidExec => mid_exec.push((pid, start)),
                Mark::Absent => {}
            }
        }
        // A process in the middle of execve(2) shows an empty environment, or none at all
        // (ESRCH), until the kernel has written the new one (the `setsid` of `setsid sleep
        // 1000` is in that window right after it left the group).
        // Missed, it would never be signalled, and a scan that finds nothing after the
        // leader's exit is the last one. So it is read again until it shows one, for a bounded
        // time.
        let mut pause = MID_EXEC_FIRST_PAUSE;
        let mut waited = std::time::Duration::ZERO;
        while !mid_exec.is_empty() && waited < MID_EXEC_PATIENCE {
            tokio::time::sleep(pause).await;
            waited += pause;
            pause = (pause * 2).min(MID_EXEC_LONGEST_PAUSE);
            mid_exec.retain(|&(pid, start)| match self.read_mark(pid) {
                Mark::Carried => {
                    marked.push((pid, start));
                    false
                }
                Mark::MidExec => true,
                Mark::Absent => false,
            });
        }
        let mut found = self.found.lock().unwrap_or_else(|p| p.into_inner());
        found.extend(marked);
        let marked = found
            .keys()
            .filter_map(|&pid| i32::try_from(pid).ok())
            .collect();
        (marked, group_alive && group_answers)
    }

    /// Whether process `pid`'s environment carries this run's mark.
    fn read_mark(&self, pid: u32) -> Mark {
        match environ_or_why_none(pid) {
            Ok(environ) if environ.split(|&b| b == 0).any(|v| v == self.entry) => Mark::Carried,
            Ok(_) => Mark::Absent,
            Err(why) => why,
        }
    }

    /// Whether any process of the trial still runs.
    pub async fn alive(&self) -> bool {
        let (marked, group_alive) = self.scan().await;
        group_alive || !marked.is_empty()
    }

    /// Sends `signal` to the group and to each marked process outside it; false when there was
    /// nothing to signal.
    pub async fn signal(&self, signal: Signal) -> bool {
        let (marked, _) = self.scan().await;
        let mut any = self.pgid.is_some_and(|pgid| signal_group(pgid, signal));
        for pid in marked {
            // A marked process is this trial's. One that exited since the scan makes this fail;
            // its pid reused by another process within these microseconds is the same window
            // `kill(1)` of a pid read from `ps` has.
            any |= nix::sys::signal::kill(Pid::from_raw(pid), signal).is_ok();
        }
        any
    }
}

impl TrialTree {
    /// The resident memory of the group's live processes now, in bytes (`VmRSS` of each
    /// member; processes that left the group are not counted, which would need every
    /// process's environment read). 0 without `/proc`.
    pub fn resident_bytes(&self) -> u64 {
        let kib: u64 = self
            .group_pids()
            .into_iter()
            .map(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|status| vm_rss_kib(&status))
                    .unwrap_or(0)
            })
            .sum();
        kib * 1024
    }

    /// The pids of the group's live processes now (as [`TrialTree::resident_bytes`] counts
    /// them), for matching against the GPUs' compute processes. None without `/proc`.
    pub fn group_pids(&self) -> Vec<u32> {
        let Some(pgid) = self.pgid else {
            return Vec::new();
        };
        let Some(groups) = live_groups(self.not_before.at) else {
            return Vec::new();
        };
        let window = self.not_before.new_pids();
        groups
            .members
            .get(&pgid)
            .map(|pids| {
                pids.iter()
                    .copied()
                    .filter(|&pid| window.holds(pid))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Every live process's group, as one reading of `/proc` found them, shared by the trials whose
/// memory is sampled at about the same time. Each running trial is sampled every second (every
/// 200 ms with a memory limit, `runner::watch_memory`); when each sample listed `/proc` and read
/// the `stat` of every process started since its trial's spawn, the cost grew with trials ×
/// processes: with 128 trials sleeping, two thirds of the manager's CPU, a third of a core.
/// Samples fall on shared ticks ([`next_sample_tick`]), so one reading serves them all.
struct LiveGroups {
    taken: std::time::Instant,
    members: std::collections::HashMap<u32, Vec<u32>>,
}

/// How old a reading of the groups may be and still serve a sample.
const LIVE_GROUPS_MAX_AGE: std::time::Duration = std::time::Duration::from_millis(100);

static LIVE_GROUPS: std::sync::Mutex<Option<std::sync::Arc<LiveGroups>>> =
    std::sync::Mutex::new(None);

/// How many times `/proc` was read for [`LiveGroups`] (for tests).
static LIVE_GROUPS_READS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The groups as read at most [`LIVE_GROUPS_MAX_AGE`] ago and not before `not_before` (a
/// reading older than a trial's spawn cannot hold its processes); read again otherwise, once,
/// while the other samplers that want it wait. None without `/proc`.
fn live_groups(not_before: std::time::Instant) -> Option<std::sync::Arc<LiveGroups>> {
    let mut cached = LIVE_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(groups) = cached
        .as_ref()
        .filter(|g| g.taken >= not_before && g.taken.elapsed() < LIVE_GROUPS_MAX_AGE)
    {
        return Some(groups.clone());
    }
    let taken = std::time::Instant::now();
    let listed = listed_pids()?;
    LIVE_GROUPS_READS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut members: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for pid in listed {
        let Some((state, group)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| parse_state_and_group(&stat))
        else {
            continue;
        };
        if !has_ended(state) {
            members.entry(group).or_default().push(pid);
        }
    }
    let groups = std::sync::Arc::new(LiveGroups { taken, members });
    *cached = Some(groups.clone());
    Some(groups)
}

/// When a sampler that last sampled at `now` samples next: the first multiple of `every` since
/// a moment fixed once a process, so that the samplers of every trial with the same `every`
/// wake together and share one reading of `/proc` ([`LiveGroups`]).
pub fn next_sample_tick(
    now: tokio::time::Instant,
    every: std::time::Duration,
) -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = tokio::time::Instant::from_std(*EPOCH.get_or_init(std::time::Instant::now));
    let every_ns = every.as_nanos().max(1);
    let since = now.saturating_duration_since(epoch).as_nanos();
    let ticks = since / every_ns + 1;
    let offset = u64::try_from(ticks * every_ns).unwrap_or(u64::MAX);
    epoch + std::time::Duration::from_nanos(offset)
}

/// `/proc/<pid>/environ`, read in one `read(2)` where it fits 128 KiB. The kernel reads it
/// from the memory the process had when the file was opened, and reads nothing once that
/// memory is gone: a process that calls execve(2) between two reads would show the part
/// before it and then an end, and a mark further on would be missed (`std::fs::read` starts
/// with a 32-byte read). One read sees all of one memory, or nothing (read again).
///
/// The read goes into a buffer kept by the calling thread, and only what was read is copied
/// out: zeroing a fresh 128 KiB for each read cost more than the read itself, most of a
/// trial's environment reads in `trial_overhead.sh`.
pub fn read_environ(pid: u32) -> std::io::Result<Vec<u8>> {
    read_open_environ(&mut File::open(format!("/proc/{pid}/environ"))?)
}

/// [`read_environ`], read again from the same open file after each of [`SETTLE_PAUSES`] while
/// it reads empty (a process in the middle of execve(2)); empty if it still does.
fn read_environ_settled(pid: u32) -> std::io::Result<Vec<u8>> {
    let mut file = File::open(format!("/proc/{pid}/environ"))?;
    let mut environ = read_open_environ(&mut file)?;
    for pause in SETTLE_PAUSES {
        if !environ.is_empty() {
            break;
        }
        std::thread::sleep(pause);
        file.seek(SeekFrom::Start(0))?;
        environ = read_open_environ(&mut file)?;
    }
    Ok(environ)
}

/// Process `pid`'s environment ([`read_environ_settled`]), or why there is none to read:
/// [`Mark::MidExec`] while it is in the middle of execve(2), else [`Mark::Absent`].
fn environ_or_why_none(pid: u32) -> Result<Vec<u8>, Mark> {
    match read_environ_settled(pid) {
        Ok(environ) if environ.is_empty() => Err(why_no_environ(pid)),
        Ok(environ) => Ok(environ),
        // The kernel answers ESRCH while the process has no memory of its own: in the middle
        // of execve(2), or exiting.
        Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => Err(why_no_environ(pid)),
        // Gone, or another user's process (not readable, and not ours: ours run as us).
        Err(_) => Err(Mark::Absent),
    }
}

/// How long [`kill_leftovers`] goes on looking while it finds processes of the earlier run
/// still running (killed but not yet dying: a process that was left waiting for a CPU for
/// seconds after its SIGKILL, see [`MID_EXEC_PATIENCE`]) or in the middle of an exec.
const LEFTOVER_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
const LEFTOVER_LONGEST_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// Kills (SIGKILL) every process whose environment names experiment `experiment_id`
/// (`NNI_EXP_ID`) and one of `trial_ids` (`NNI_TRIAL_JOB_ID`): what an earlier run of the
/// experiment left running. Identifying them by environment, not by a recorded pid, cannot
/// hit an unrelated process that reused the pid. Returns how many processes of each trial, in
/// the order of `trial_ids`, it killed.
///
/// One look at `/proc` is not enough: a process in the middle of execve(2) shows no
/// environment (a trial's shell script runs each command so), and one killed may keep running
/// for seconds on a loaded machine. So it looks again, pausing longer each time, until a look
/// finds none of them but the dying, for up to [`LEFTOVER_PATIENCE`]. A process the run forks
/// meanwhile inherits the environment and is found by the next look.
pub fn kill_leftovers(experiment_id: &str, trial_ids: &[String]) -> Vec<usize> {
    let experiment_entry = format!("NNI_EXP_ID={experiment_id}");
    let me = std::process::id();
    // Each process killed, by pid and start time (a pid reused meanwhile is another process).
    let mut killed: std::collections::BTreeMap<(u32, Option<StartTicks>), usize> =
        Default::default();
    let started = std::time::Instant::now();
    let mut pause = MID_EXEC_FIRST_PAUSE;
    while let Some(listed) = listed_pids() {
        let mut look_again = false;
        for pid in listed {
            if pid == me {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some((state, _)) = parse_state_and_group(&stat) else {
                continue;
            };
            // Dying or dead already, or not a process a trial could have started.
            if has_ended(state) || is_exiting(&stat) || is_kernel_thread(&stat) {
                continue;
            }
            let environ = match environ_or_why_none(pid) {
                Ok(environ) => environ,
                Err(why) => {
                    look_again |= matches!(why, Mark::MidExec);
                    continue;
                }
            };
            let mut of_experiment = false;
            let mut trial = None;
            for variable in environ.split(|&b| b == 0) {
                of_experiment |= variable == experiment_entry.as_bytes();
                if let Some(id) = variable.strip_prefix(b"NNI_TRIAL_JOB_ID=") {
                    trial = trial_ids.iter().position(|wanted| wanted.as_bytes() == id);
                }
            }
            let (true, Some(trial)) = (of_experiment, trial) else {
                continue;
            };
            let Ok(raw) = i32::try_from(pid) else {
                continue;
            };
            // One of ours, identified above; it may be gone already.
            if nix::sys::signal::kill(Pid::from_raw(raw), Signal::SIGKILL).is_ok() {
                killed.insert((pid, parse_start(&stat)), trial);
                look_again = true;
            }
        }
        if !look_again || started.elapsed() >= LEFTOVER_PATIENCE {
            break;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(LEFTOVER_LONGEST_PAUSE);
    }
    let mut counts = vec![0; trial_ids.len()];
    for trial in killed.into_values() {
        counts[trial] += 1;
    }
    counts
}

/// The rest of an open `/proc/<pid>/environ` from where it stands (see [`read_environ`]).
fn read_open_environ(file: &mut File) -> std::io::Result<Vec<u8>> {
    const ONE_READ: usize = 128 * 1024;
    thread_local! {
        static BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    BUFFER.with_borrow_mut(|environ| {
        if environ.len() < ONE_READ {
            environ.resize(ONE_READ, 0);
        }
        let mut length = 0;
        loop {
            match file.read(&mut environ[length..]) {
                Ok(0) => break,
                Ok(n) => length += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if length == environ.len() {
                environ.resize(length * 2, 0);
            }
        }
        let read = environ[..length].to_vec();
        // A rare huge environment does not keep its buffer's size on the thread.
        if environ.len() > ONE_READ {
            environ.truncate(ONE_READ);
            environ.shrink_to_fit();
        }
        Ok(read)
    })
}

/// Why process `pid`'s environment read empty, from its `/proc/<pid>/stat` now: gone, a zombie
/// or exiting, or an environment that is really empty (`env -i`: its bounds are set and equal),
/// is [`Mark::Absent`]; otherwise it is in the middle of an exec ([`Mark::MidExec`]). Without
/// the bounds (a kernel before 3.5), any live process is taken to be mid-exec.
fn why_no_environ(pid: u32) -> Mark {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Mark::Absent;
    };
    let ended = parse_state_and_group(&stat).is_none_or(|(state, _)| has_ended(state));
    let really_empty = environ_bounds(&stat).is_some_and(|(start, end)| end != 0 && start == end);
    if ended || is_exiting(&stat) || really_empty {
        Mark::Absent
    } else {
        Mark::MidExec
    }
}

/// Fields 50 and 51 of a `/proc/<pid>/stat` line: where the process's environment starts and
/// ends in its memory; the end is 0 until execve(2) has written it.
fn environ_bounds(stat: &str) -> Option<(u64, u64)> {
    let end_of_name = stat.rfind(')')?;
    let mut fields = stat[end_of_name + 1..]
        .split_ascii_whitespace()
        .skip(50 - 3);
    let start = fields.next()?.parse().ok()?;
    let end = fields.next()?.parse().ok()?;
    Some((start, end))
}

/// Whether a process state from `/proc/<pid>/stat` is that of one that has finished: a zombie
/// (`Z`, not yet reaped) or dead (`X`).
fn has_ended(state: char) -> bool {
    matches!(state, 'Z' | 'X')
}

/// Whether a `/proc/<pid>/stat` line is that of a process that is exiting (`PF_EXITING` in the
/// flags): its memory, and so its environment, may be gone already, and it runs no more code
/// of its own.
fn is_exiting(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x0000_0004;
    stat_flags(stat).is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Field 9 of a `/proc/<pid>/stat` line, the process's flags.
fn stat_flags(stat: &str) -> Option<u64> {
    stat.rfind(')')
        .and_then(|end| stat[end + 1..].split_ascii_whitespace().nth(9 - 3))
        .and_then(|flags| flags.parse::<u64>().ok())
}

/// Whether a `/proc/<pid>/stat` line is a kernel thread's (`PF_KTHREAD` in field 9, the
/// flags): it has no environment, and no trial started it.
fn is_kernel_thread(stat: &str) -> bool {
    const PF_KTHREAD: u64 = 0x0020_0000;
    stat_flags(stat).is_some_and(|flags| flags & PF_KTHREAD != 0)
}

/// The start time (field 22) of a `/proc/<pid>/stat` line.
fn parse_start(stat: &str) -> Option<StartTicks> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Fields from 3 (state) on; the start time is field 22.
    let start = after_name.split_ascii_whitespace().nth(22 - 3)?;
    start.parse().ok().map(StartTicks)
}

/// `VmRSS` of a `/proc/<pid>/status` text, in KiB.
fn vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Sends `signal` to every process of group `pgid`; false when the group is gone.
pub fn signal_group(pgid: u32, signal: Signal) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    killpg(Pid::from_raw(pgid), signal).is_ok()
}

/// State and process group from a `/proc/<pid>/stat` line. The command name in parentheses
/// may hold spaces and parentheses, so fields are counted from the last `)`.
fn parse_state_and_group(stat: &str) -> Option<(char, u32)> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let _parent = fields.next()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, group))
}

/// Opens `path`, a file of a trial's folder, with `options`, and only if it is a regular file.
/// The trial may have put anything there: a FIFO (whose `open` waits for a writer for ever:
/// a trial's end waited on it, and `knob stop` with it), a link to `/dev/zero` (a read without
/// end) or to any other file of this user. So the last component is not followed and the
/// `open` does not wait (`O_NOFOLLOW | O_NONBLOCK`); a refusal's error says what was there.
pub fn open_trial_file(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    let refused = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {what}; knob reads and writes only a regular file there"),
        )
    };
    let file = options
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => refused("a symbolic link"),
            // A FIFO opened for writing with no reader.
            Some(nix::libc::ENXIO) => refused("a FIFO"),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if kind.is_file() {
        return Ok(file);
    }
    Err(refused(if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() || kind.is_block_device() {
        "a device"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }))
}

/// The last [`STDERR_TAIL_LINES`] lines of the file at `path`, read from at most its last
/// [`STDERR_TAIL_BYTES`] bytes; empty when it cannot be read (or is not a regular file: see
/// [`open_trial_file`]).
pub fn stderr_tail(path: &Path) -> String {
    let Ok(mut file) = open_trial_file(path, OpenOptions::new().read(true)) else {
        return String::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = length.saturating_sub(STDERR_TAIL_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_err()
        || file
            .take(STDERR_TAIL_BYTES)
            .read_to_end(&mut bytes)
            .is_err()
    {
        return String::new();
    }
    let text = String::from_utf8_lossy(&bytes);
    let mut text: &str = &text;
    if start > 0 {
        // The read began inside a line; drop that fragment unless it is all there is.
        if let Some(newline) = text.find('\n') {
            text = &text[newline + 1..];
        }
    }
    let lines: Vec<&str> = text.trim_end_matches(['\n', '\r']).lines().collect();
    lines[lines.len().saturating_sub(STDERR_TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a scan to its end on a runtime of its own (it pauses on tokio's timer).
    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(future)
    }

    /// A command starting with `-` is the command: bash read it as its own options
    /// (`/bin/bash: - : invalid option`) and the trial failed before running anything.
    #[test]
    fn a_command_starting_with_a_dash_is_run_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let stderr = File::create(dir.path().join("stderr")).unwrap();
        let stdout = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (child, _leader) = spawn_in_own_group(
                    "-no-such-command 2>/dev/null || echo ran",
                    dir.path(),
                    &[],
                    stderr,
                )
                .unwrap();
                child.wait_with_output().await.unwrap().stdout
            });
        let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
        assert_eq!(String::from_utf8_lossy(&stdout), "ran\n", "{stderr}");
    }

    #[test]
    fn stat_lines_with_odd_names() {
        let stat = "4242 (a) b (c)) S 1 4200 4200 0 -1 4194560";
        assert_eq!(parse_state_and_group(stat), Some(('S', 4200)));
        assert_eq!(parse_state_and_group("1 (x) Z 0 7 7"), Some(('Z', 7)));
        assert_eq!(parse_state_and_group("garbage"), None);
        let full = "4242 (a b) S 1 4200 4200 0 -1 4194560 10 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10";
        assert_eq!(parse_start(full), Some(StartTicks(98765)));
        assert_eq!(parse_start(stat), None);
        assert_eq!(
            vm_rss_kib("Name:\tx\nVmPeak:\t  10 kB\nVmRSS:\t    2048 kB\n"),
            Some(2048)
        );
        assert_eq!(vm_rss_kib("Name:\tkthreadd\n"), None);
        assert!(!is_kernel_thread(full));
        let kworker = "77 (kworker/0:1-events) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 9";
        assert!(is_kernel_thread(kworker));
    }

    #[test]
    fn a_process_started_after_start_ticks_now_is_not_older() {
        let before = StartTicks::now();
        assert!(before > StartTicks(0), "CLOCK_BOOTTIME and CLK_TCK read");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let started = parse_start(&stat).expect("a start time");
        assert!(started >= before, "{started:?} before {before:?}");
    }

    /// `sleep 5` carrying `mark`, in a process group of its own (found by its mark alone),
    /// once it runs `sleep`: until it has exec'd, `/proc` shows the parent's environment, which
    /// has no mark (waited for at most 5 s).
    fn marked_sleep(mark: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        let child = std::process::Command::new("sleep")
            .arg("5")
            .env(TRIAL_RUN_ENV, mark)
            .process_group(0)
            .spawn()
            .unwrap();
        wait_for_sleep(child.id());
        child
    }

    /// Waits (up to 5 s) until process `pid` runs `sleep`.
    fn wait_for_sleep(pid: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|cmdline| !cmdline.starts_with(b"sleep"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn samplers_with_the_same_interval_wake_on_the_same_ticks() {
        let every = std::time::Duration::from_millis(1000);
        // The first call fixes the moment the ticks count from.
        next_sample_tick(tokio::time::Instant::now(), every);
        let now = tokio::time::Instant::now();
        let tick = next_sample_tick(now, every);
        assert!(tick > now && tick - now <= every, "{:?}", tick - now);
        // Anyone asking before that tick is given it; at it, the next one.
        let between = now + (tick - now) / 2;
        assert_eq!(next_sample_tick(between, every), tick);
        assert_eq!(next_sample_tick(tick, every), tick + every);
        // A shorter interval that divides it wakes on its ticks too.
        let fast = std::time::Duration::from_millis(200);
        assert_eq!(next_sample_tick(tick - fast / 2, fast), tick);
    }

    /// Trials sampled on one tick share one reading of `/proc`; each still finds only its own
    /// group's processes, and a reading older than a trial's spawn is not used for it.
    #[test]
    fn trials_sampled_together_share_one_reading_of_proc() {
        let before = BeforeSpawn::now();
        let mut children: Vec<_> = (0..4).map(|_| marked_sleep("m")).collect();
        let trees: Vec<_> = children
            .iter()
            .map(|child| TrialTree::new(Some(child.id()), "m", before))
            .collect();
        let reads = || LIVE_GROUPS_READS.load(std::sync::atomic::Ordering::Relaxed);
        // Other tests of this binary read it too: the count is compared within one short span,
        // repeated until no other reading fell into it.
        let mut shared = false;
        for _ in 0..20 {
            let first = reads();
            let found: Vec<Vec<u32>> = trees.iter().map(TrialTree::group_pids).collect();
            let used = reads() - first;
            for (child, pids) in children.iter().zip(&found) {
                assert_eq!(pids, &[child.id()]);
            }
            assert!(trees.iter().all(|tree| tree.resident_bytes() > 0));
            if used <= 1 {
                shared = true;
                break;
            }
        }
        let later = BeforeSpawn::now();
        let newer = marked_sleep("m");
        let newer_tree = TrialTree::new(Some(newer.id()), "m", later);
        assert_eq!(newer_tree.group_pids(), [newer.id()]);
        children.push(newer);
        for mut child in children {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert!(
            shared,
            "four trials sampled at once read /proc more than once"
        );
    }

    #[test]
    fn a_process_spawned_after_before_spawn_is_scanned_and_found() {
        let before = BeforeSpawn::now();
        let mark = new_trial_run_mark();
        let mut child = marked_sleep(&mark);
        let pid = child.id();
        let window = before.new_pids();
        let tree = TrialTree::new(Some(u32::MAX), &mark, before);
        let (marked, _) = block_on(tree.scan());
        let grouped = TrialTree::new(Some(pid), "other", before);
        let alive = block_on(grouped.alive());
        let _ = child.kill();
        let _ = child.wait();
        assert!(window.holds(pid), "pid {pid} outside {window:?}");
        assert_eq!(marked, vec![pid as i32]);
        assert!(alive);
    }

    /// What the loaded VM did slowly (a killed process read as gone while it exited, its
    /// environment gone first) shown without the load: a process that carried the mark when a
    /// scan found it and then dropped its environment (`exec env -i`) is still the trial's; one
    /// whose pid names another process now (another start time) or that was reaped is not.
    #[test]
    fn a_process_found_carrying_the_mark_stays_found_until_it_is_gone() {
        let before = BeforeSpawn::now();
        let mark = new_trial_run_mark();
        let mut child = {
            use std::os::unix::process::CommandExt;
            std::process::Command::new("sh")
                .args(["-c", "read go; exec env -i ANOTHER=1 sleep 5"])
                .env(TRIAL_RUN_ENV, &mark)
                .stdin(std::process::Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap()
        };
        let pid = child.id();
        let tree = TrialTree::new(Some(u32::MAX), &mark, before);
        let (first, _) = block_on(tree.scan());

        std::io::Write::write_all(child.stdin.as_mut().unwrap(), b"go\n").unwrap();
        let entry = format!("{TRIAL_RUN_ENV}={mark}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read_environ(pid).is_ok_and(|environ| {
            environ.is_empty() || environ.split(|&b| b == 0).any(|v| v == entry.as_bytes())
        }) && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (after_exec, _) = block_on(tree.scan());
        let (unseen_before, _) = block_on(TrialTree::new(Some(u32::MAX), &mark, before).scan());

        let impostor = TrialTree::new(Some(u32::MAX), &mark, before);
        impostor
            .found
            .lock()
            .unwrap()
            .insert(pid, Some(StartTicks(1)));
        let (other_start, _) = block_on(impostor.scan());

        let _ = child.kill();
        let _ = child.wait();
        let (reaped, _) = block_on(tree.scan());
        assert_eq!(first, vec![pid as i32]);
        assert_eq!(
            after_exec,
            vec![pid as i32],
            "lost once its environment changed"
        );
        assert!(
            unseen_before.is_empty(),
            "its environment still shows the mark"
        );
        assert!(other_start.is_empty(), "{other_start:?}");
        assert!(reaped.is_empty(), "{reaped:?}");
    }

    /// A process whose environment is really empty is told apart from one in the middle of
    /// an exec by the bounds `/proc/<pid>/stat` gives, so it costs a scan no patience.
    #[test]
    fn a_really_empty_environment_is_told_apart_from_one_not_written_yet() {
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        let (start, end) = environ_bounds(&me).unwrap();
        let environ_length = std::fs::read("/proc/self/environ").unwrap().len() as u64;
        assert_eq!(end - start, environ_length, "{me}");

        let mut empty = std::process::Command::new("env")
            .args(["-i", "sleep", "5"])
            .spawn()
            .unwrap();
        let pid = empty.id();
        wait_for_sleep(pid);
        let read = read_environ(pid).unwrap();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let why = why_no_environ(pid);
        let _ = empty.kill();
        let _ = empty.wait();
        assert!(read.is_empty());
        let (start, end) = environ_bounds(&stat).unwrap();
        assert!(end != 0 && start == end, "{stat}");
        assert!(matches!(why, Mark::Absent));
        assert!(matches!(why_no_environ(pid), Mark::Absent), "reaped");
    }

    #[test]
    fn the_fork_count_and_tasks_are_read_from_proc() {
        let stat = "cpu  1 2 3\nintr 5 0 1\nctxt 77\nbtime 1\nprocesses 2189949\nprocs_running 3\n";
        assert_eq!(parse_forks(stat), Some(2_189_949));
        assert_eq!(parse_forks("cpu 1 2 3\nprocs_running 3\n"), None);
        assert_eq!(parse_tasks("12.38 10.55 6.59 16/184 16983\n"), Some(184));
        assert_eq!(parse_tasks("12.38 10.55 6.59"), None);
        let now = ForkCount::now().expect("/proc/stat and /proc/loadavg read");
        assert!(now.forks > 0 && now.tasks > 0, "{now:?}");
    }

    #[test]
    fn a_window_of_only_known_leaders_is_told_apart_from_any_other() {
        let known: std::collections::BTreeSet<u32> = [101, 102, 104].into_iter().collect();
        let window = |above, up_to| PidWindow { above, up_to };
        assert!(window(100, 102).only(&known));
        // Nothing handed out since: nothing can be the run's.
        assert!(window(104, 104).only(&known));
        // 103 went to some other process: it may be the run's.
        assert!(!window(100, 104).only(&known));
        assert!(!window(101, 105).only(&known));
        // Every pid (no counter, or it may have gone round): never.
        assert!(!window(0, u32::MAX).only(&known));
        let wide: std::collections::BTreeSet<u32> = (1..=KNOWN_WINDOW + 1).collect();
        assert!(window(0, KNOWN_WINDOW).only(&wide));
        assert!(!window(0, KNOWN_WINDOW + 1).only(&wide));
    }

    #[test]
    fn a_leader_is_known_until_dropped() {
        let leader = Leader::new(Some(u32::MAX - 7));
        assert!(leaders().contains(&(u32::MAX - 7)));
        drop(leader);
        assert!(!leaders().contains(&(u32::MAX - 7)));
    }

    #[test]
    fn a_fork_count_kept_for_the_next_spawn_counts_that_spawn() {
        let before = forks_so_far().expect("/proc/stat read");
        let status = std::process::Command::new("/bin/true").status().unwrap();
        assert!(status.success());
        let after = read_forks().expect("/proc/stat read");
        assert!(
            after > before,
            "the spawn was not counted: {before} then {after}"
        );
        // Kept: what the next spawn takes as its count before is this read or a later one.
        let kept = forks_so_far().expect("/proc/stat read");
        assert!(kept >= after, "{kept} is older than {after}");
    }

    #[test]
    fn a_whole_turn_of_the_pid_counter_needs_more_forks_than_free_pids() {
        let before = ForkCount {
            forks: 1000,
            tasks: 200,
        };
        // 32 768 - 300 pids in a turn, 600 of them possibly in use: 31 868 forks make a turn.
        assert!(before.too_few_for_a_turn(1000, 32_768));
        assert!(before.too_few_for_a_turn(1000 + 31_867, 32_768));
        assert!(!before.too_few_for_a_turn(1000 + 31_868, 32_768));
        // A count that went back (another boot?) tells nothing.
        assert!(!before.too_few_for_a_turn(999, 32_768));
        // So many tasks that a turn needs no fork at all.
        let crowded = ForkCount {
            forks: 1000,
            tasks: 20_000,
        };
        assert!(!crowded.too_few_for_a_turn(1000, 32_768));
    }

    #[test]
    fn past_the_pid_window_the_fork_count_decides_until_its_horizon() {
        let mut before = BeforeSpawn::now();
        before.wrap_time = std::time::Duration::from_millis(33);
        before.pid_max = 32_768;
        before.forks = Some(ForkCount {
            forks: 1000,
            tasks: 200,
        });
        let ms = std::time::Duration::from_millis;
        // Within the window the fork count is not read.
        assert!(before.no_turn_since(ms(10), || panic!("read the fork count")));
        assert!(before.no_turn_since(ms(500), || Some(1100)));
        assert!(!before.no_turn_since(ms(500), || Some(1000 + 32_000)));
        assert!(!before.no_turn_since(ms(500), || None));
        assert!(!before.no_turn_since(FORK_COUNT_HORIZON, || Some(1100)));
        before.forks = None;
        assert!(!before.no_turn_since(ms(500), || Some(1100)));
    }

    #[test]
    fn a_process_spawned_before_a_scan_past_the_pid_window_is_found_by_its_mark() {
        // Tried again (at most twice) only if the pid counter wrapped meanwhile, which makes
        // any scan look at every process.
        for attempt in 1..=3 {
            let mut before = BeforeSpawn::now();
            // As on a machine whose pid_max gives a window of no time at all: only the fork
            // count can keep the scan to the pids handed out since.
            before.wrap_time = std::time::Duration::ZERO;
            before.forks = ForkCount::now();
            let mark = new_trial_run_mark();
            let mut child = marked_sleep(&mark);
            let pid = child.id();
            let window = before.new_pids();
            let (marked, _) = block_on(TrialTree::new(Some(u32::MAX), &mark, before).scan());
            let _ = child.kill();
            let _ = child.wait();
            let counter: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            if attempt < 3 && before.last_pid.is_some_and(|last| counter < last) {
                continue;
            }
            assert!(
                window.above > 0,
                "the fork count should keep the scan to new pids: {before:?}"
            );
            assert!(window.holds(pid), "pid {pid} outside {window:?}");
            // This process was started long before: not among the pids handed out since.
            assert!(!window.holds(std::process::id()), "{window:?}");
            assert_eq!(marked, vec![pid as i32]);
            return;
        }
    }

    #[test]
    fn stderr_tail_keeps_the_last_lines_within_the_byte_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr");
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let tail = stderr_tail(&path);
        assert_eq!(tail.lines().count(), STDERR_TAIL_LINES);
        assert!(
            tail.starts_with("line 80\n") && tail.ends_with("line 99"),
            "{tail}"
        );

        std::fs::write(&path, "x".repeat(10_000)).unwrap();
        assert_eq!(stderr_tail(&path).len(), STDERR_TAIL_BYTES as usize);
        assert_eq!(stderr_tail(&dir.path().join("missing")), "");
    }
}
