//! A trial as the manager tracks it while the experiment runs.

use tokio::time::Instant;

use serde_json::Value;

use knob_plugin_api::text::{bounded, one_line, visible_text};

use crate::store::TrialStatus;

/// What the caller of [`super::run`] learns about each trial.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialSummary {
    pub id: String,
    pub sequence: u64,
    pub parameters: Value,
    pub status: TrialStatus,
    pub final_value: Option<f64>,
    /// Its final result breaks a constraint of `objectives`: it is never the best.
    pub infeasible: bool,
    /// It ranks (`objectives::Ranking`): it may be named the best.
    pub ranks: bool,
    pub reason: Option<String>,
}

#[derive(Debug)]
pub(super) struct Trial {
    pub id: String,
    pub sequence: u64,
    pub parameter_id: u64,
    /// The id the trial sees when the tuner labeled its parameters (NNI Hyperband's "0-4_0_3").
    pub parameter_label: Option<String>,
    pub parameters: Value,
    pub status: TrialStatus,
    /// 0 until the service reports the start, then 1 (retries will count on).
    pub attempt: u32,
    /// The process-group leader, once started.
    pub pid: Option<u32>,
    /// Placed and handed to the training service (its start may not be reported yet).
    pub launched: bool,
    /// Placed, and waiting for its parent's checkpoint to be brought here before it is handed
    /// to its service (`population::bring_parent_snapshot`): not placed again meanwhile.
    pub fetching: bool,
    /// The service asked to copy its parent's checkpoint where it is as it was created (a
    /// successor whose parent's folder is not on this machine), which brings the copy here
    /// before the successor starts under another service (`population::bring_parent_snapshot`).
    /// Not known after a resume.
    pub snapshot_holder: Option<usize>,
    /// The service (index into `Manager::services`), environment and GPUs of the attempt
    /// launched last.
    pub service: Option<usize>,
    pub environment: Option<String>,
    pub gpu_indices: Option<Vec<u32>>,
    /// How many attempts were lost with their host and run again (bounded by
    /// `MAX_HOST_LOSS_REQUEUES`).
    pub host_losses: u32,
    /// Started attempts lost with their host: they do not count against `maxTrialRetries`.
    pub lost_attempts: u32,
    /// Starts its service refused (no attempt ran): each is tried again, after 1 s, 2 s, …, up
    /// to `START_RETRIES` times, since a host whose connection just dropped refuses a start
    /// before the manager knows it is gone.
    pub start_failures: u32,
    /// Times the copy of its parent's checkpoint could not be brought here for its start
    /// (`population::on_parent_snapshot_fetched`): each waits longer, up to `FETCH_RETRIES`.
    pub fetch_failures: u32,
    /// A retry waits until then (backoff).
    pub not_before: Option<Instant>,
    /// When its last attempt ended or was given up (Unix ms), while it waits for the next: a
    /// trial ended before that one is handed to a service (a stop, a kill) keeps this end, as
    /// nothing ran since.
    pub last_attempt_end_ms: Option<i64>,
    /// Why it waits for resources, as last recorded.
    pub waiting_reason: Option<String>,
    /// When `waiting_reason` was last recorded (see `placement::WAITING_REASON_EVERY`).
    pub waiting_warned_at: Option<Instant>,
    /// How many reasons were recorded for this attempt: each waits longer for the next.
    pub waiting_reasons_recorded: u32,
    /// When `maxTrialDuration` runs out for the running attempt: set when it starts, so that
    /// time spent waiting for resources does not count.
    pub deadline: Option<Instant>,
    /// This attempt's intermediate results, for the assessor and a population tuner: kept only
    /// where one of them reads them (see `Manager::on_metrics`). Shared with the assessor's
    /// thread rather than copied for each result: a trial reporting 200 000 of them copied
    /// 160 GB on the way to the assessor.
    pub intermediate: std::sync::Arc<Vec<f64>>,
    pub final_value: Option<f64>,
    /// That final result breaks a constraint of `objectives`: it is never the best.
    pub infeasible: bool,
    /// That final result may rank once the trial succeeds (`objectives::outcome_ranks`).
    pub result_ranks: bool,
    /// Why the final result this attempt reported could not be read; the end message of a
    /// trial that otherwise succeeds.
    pub final_problem: Option<String>,
    /// In an experiment with `objectives`: the outcome of the final result, read when it was
    /// recorded and handed to the tuner with it.
    pub outcome: Option<knob_plugin_api::Outcome>,
    /// In an experiment with `objectives`: the final result lacked a listed metric (or one was
    /// not a number), so the trial ends FAILED with this message, without a retry (the script
    /// would report the same dict again).
    pub objective_problem: Option<String>,
    /// Set when the manager asked for the trial to be killed: how to record its end, and why.
    pub kill: Option<(TrialStatus, String)>,
    /// When that kill was decided (Unix ms): a trial its service reports ended before it (a
    /// host out of reach reports only once back what ended while it was unreachable) ended on its
    /// own, whatever the kill says.
    pub kill_decided_ms: Option<i64>,
    /// Set as its service is asked to kill it: when the service answered (set by whatever
    /// takes the answer in, which the loop does not wait for).
    pub kill_answered: Option<std::sync::Arc<std::sync::OnceLock<Instant>>>,
    /// When the manager records the end of the trial it asked to kill itself, unless its
    /// service reports it first (see `Manager::on_end_unreported`).
    pub end_due: Option<Instant>,
    pub reason: Option<String>,
    /// Host memory (MiB) its attempts ask for, once raised after it ran out of memory; `None`:
    /// `trialMemorySize`.
    pub memory_request_mib: Option<u64>,
    /// GPU memory (MiB, on each of its GPUs) its attempts ask for, once raised after it ran out
    /// of GPU memory; `None`: `trialGpuMemory`.
    pub gpu_memory_request_mib: Option<u64>,
    /// The peak resident memory (MiB) of its last attempt, as its service sampled it.
    pub peak_memory_mib: Option<u64>,
    /// The peak GPU memory (MiB, on its fullest GPU) of its last attempt, where its service
    /// could read NVML; shown in an out-of-memory requeue's reason.
    pub peak_gpu_memory_mib: Option<u64>,
    /// For a population member (population-based training): where it comes from.
    pub lineage: Option<crate::store::Lineage>,
    /// Whether its service reported that its checkpoint folder holds something (this run of
    /// the manager; a resumed member's next attempt reports it again).
    pub has_checkpoint: bool,
    /// Metrics its service reported for the attempt it was asked to start before it reported
    /// that start (a service whose output reader runs ahead of its start report): recorded
    /// once the start is, as the attempt's (see `Manager::on_metrics`).
    pub early_metrics: Vec<(knob_plugin_api::service::MetricKind, u64, String)>,
}

impl Trial {
    pub fn new(id: String, sequence: u64, parameter_id: u64, parameters: Value) -> Trial {
        Trial {
            id,
            sequence,
            parameter_id,
            parameter_label: None,
            parameters,
            status: TrialStatus::Waiting,
            attempt: 0,
            launched: false,
            fetching: false,
            snapshot_holder: None,
            service: None,
            environment: None,
            gpu_indices: None,
            host_losses: 0,
            lost_attempts: 0,
            start_failures: 0,
            pid: None,
            waiting_reason: None,
            waiting_warned_at: None,
            waiting_reasons_recorded: 0,
            not_before: None,
            fetch_failures: 0,
            last_attempt_end_ms: None,
            deadline: None,
            intermediate: Default::default(),
            final_value: None,
            infeasible: false,
            result_ranks: false,
            final_problem: None,
            outcome: None,
            objective_problem: None,
            kill: None,
            kill_decided_ms: None,
            kill_answered: None,
            end_due: None,
            reason: None,
            memory_request_mib: None,
            gpu_memory_request_mib: None,
            peak_memory_mib: None,
            peak_gpu_memory_mib: None,
            lineage: None,
            has_checkpoint: false,
            early_metrics: Vec::new(),
        }
    }

    pub fn summary(&self) -> TrialSummary {
        TrialSummary {
            id: self.id.clone(),
            sequence: self.sequence,
            parameters: self.parameters.clone(),
            status: self.status,
            final_value: self.final_value,
            infeasible: self.infeasible,
            ranks: self.status == TrialStatus::Succeeded && self.result_ranks,
            reason: self.reason.clone(),
        }
    }
}

/// The most of stderr's last line a trial's end message keeps: the message is one line of
/// `knob trial ls`, the export and the API, not the trial's log (`stderr` in its folder).
const MAX_REASON_LINE_CHARS: usize = 500;

/// One line saying why a trial failed: its exit code or signal and the last line of stderr
/// that has visible text, as [`visible_text`] shows it. A carriage return ends a line as a
/// newline does: a progress bar (tqdm) rewrites its line with `\r`, and the error printed after
/// it is the last line, not kilobytes of bar updates that garble a terminal when shown. The
/// stored `stderr_tail` keeps what the trial wrote (the API gives it JSON-escaped).
pub(super) fn failure_reason(
    exit_code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &str,
) -> String {
    let how = match (exit_code, signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended without an exit status".to_string(),
    };
    let how = if looks_like_oom(exit_code, signal, stderr_tail) {
        format!("out of memory? {how}")
    } else {
        how
    };
    match stderr_tail.split(['\n', '\r']).rev().find_map(visible_text) {
        Some(last) => format!("{how}: {}", bounded(&last, MAX_REASON_LINE_CHARS)),
        None => how,
    }
}

/// Why a trial is being stopped, as its end message keeps it: [`one_line`] cut to
/// [`MAX_REASON_LINE_CHARS`]. An assessor's verdict and a tuner's stop give the reason (plugin
/// text: it was stored and printed as given, newlines, terminal escapes and 30 MB alike), and it
/// is shown as one cell of `knob trial ls`.
pub(super) fn stop_reason(reason: &str) -> String {
    one_line(reason, MAX_REASON_LINE_CHARS)
}

/// The host memory (MiB) a trial that ran out of memory asks for next: twice the larger of
/// what it asked for and the peak its service sampled (a trial killed at its limit used at
/// least its request; one the kernel killed may have used more), so that a trial that needs
/// several times its request gets there in a few attempts within `maxOomRetries`. `None` when
/// neither is known: nothing to learn from.
pub(super) fn raised_memory_request(asked: Option<u64>, peak: Option<u64>) -> Option<u64> {
    let base = asked.unwrap_or(0).max(peak.unwrap_or(0));
    (base > 0).then(|| base.saturating_mul(2))
}

/// Headroom (MiB) a host memory request learned without `trialMemorySize` keeps above the
/// sampled peak.
const LEARNED_HEADROOM_MIB: u64 = 64;

/// What the environments could give one trial's host memory (MiB), as last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostMemoryRoom {
    /// The most any could ever promise one trial: a request above it is refused.
    pub capacity: u64,
    /// The most one had available when last measured (a host never has all of its total
    /// available, so a request at the capacity would wait for good).
    pub available: u64,
}

/// The host memory (MiB) a trial that ran out of memory asks for next, as
/// [`raised_memory_request`], except that a request learned without `trialMemorySize` stays at
/// least [`LEARNED_HEADROOM_MIB`] above the peak: the peak is then all there is, sampled every
/// 200 ms from a trial that may have been killed just after it started, and twice a shell's few
/// MiB is a limit its next attempt (enforced like `trialMemorySize`) could not keep.
///
/// A raise beyond every environment's `capacity` would be refused although the trial ran: it is
/// capped at the most a host had `available`, so that the raise alone never makes it
/// unplaceable, as long as that is more than it used. Where that is no more (an environment
/// sized by the request, a cluster allocation of `trialMemorySize`, or a trial that already asked
/// for that much), it is raised as usual and refused, saying what would hold it.
pub(super) fn raised_host_memory_request(
    asked: Option<u64>,
    peak: Option<u64>,
    room: Option<HostMemoryRoom>,
) -> Option<u64> {
    let raised = raised_memory_request(asked, peak)?;
    let raised = match (asked, peak) {
        (None, Some(peak)) => raised.max(peak.saturating_add(LEARNED_HEADROOM_MIB)),
        _ => raised,
    };
    let used = asked.unwrap_or(0).max(peak.unwrap_or(0));
    Some(match room {
        Some(room) if raised > room.capacity && room.available > used => raised.min(room.available),
        _ => raised,
    })
}

/// "; out of memory: the next attempt asks for 512 MiB of memory (asked 128 MiB, used at least
/// 250 MiB)", with ", GPU memory peak 900 MiB" where the service read it.
pub(super) fn raised_memory_note(
    asked: Option<u64>,
    peak: Option<u64>,
    peak_gpu: Option<u64>,
    raised: u64,
) -> String {
    let asked = asked.map_or("no trialMemorySize".to_string(), |mib| {
        format!("asked {mib} MiB")
    });
    let used = peak.map_or(String::new(), |mib| format!(", used at least {mib} MiB"));
    let gpu = peak_gpu.map_or(String::new(), |mib| format!(", GPU memory peak {mib} MiB"));
    format!(
        "; out of memory: the next attempt asks for {raised} MiB of memory ({asked}{used}{gpu})"
    )
}

/// The GPU memory (MiB per GPU) a trial that ran out of GPU memory asks for next: as
/// [`raised_memory_request`] from its GPU request and GPU peak, capped at `largest_gpu` (what
/// the largest GPU could ever give one trial), since a request above it could never be placed
/// while a trial at it gets a GPU to itself. `None` when there is nothing to learn from.
pub(super) fn raised_gpu_memory_request(
    asked: Option<u64>,
    peak: Option<u64>,
    largest_gpu: Option<u64>,
) -> Option<u64> {
    let raised = raised_memory_request(asked, peak)?;
    Some(largest_gpu.map_or(raised, |cap| raised.min(cap.max(asked.unwrap_or(0)))))
}

/// "; out of GPU memory: the next attempt asks for 3000 MiB of GPU memory (asked 1024 MiB,
/// GPU memory peak 1500 MiB)".
pub(super) fn raised_gpu_memory_note(asked: Option<u64>, peak: Option<u64>, raised: u64) -> String {
    let asked = asked.map_or("no trialGpuMemory".to_string(), |mib| {
        format!("asked {mib} MiB")
    });
    let used = peak.map_or(String::new(), |mib| format!(", GPU memory peak {mib} MiB"));
    format!(
        "; out of GPU memory: the next attempt asks for {raised} MiB of GPU memory ({asked}{used})"
    )
}

/// Which memory a failure ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OutOfMemory {
    /// Host memory: the kernel's OOM killer, knob's `trialMemorySize` kill, `MemoryError`…
    Host,
    /// GPU memory: CUDA's or a framework's out-of-memory error, or knob's `trialGpuMemory` kill.
    Gpu,
}

/// Words in a trial's last lines that mean it ran out of GPU memory: PyTorch (`torch.
/// OutOfMemoryError: CUDA out of memory`, older `RuntimeError: CUDA out of memory`), the CUDA
/// runtime and cuBLAS, TensorFlow and JAX/XLA, and the runner's own note for a trial over its
/// `trialGpuMemory`.
const GPU_OOM_WORDS: [&str; 7] = [
    "CUDA out of memory",
    "CUDA error: out of memory",
    "torch.OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "OOM when allocating tensor",
    "RESOURCE_EXHAUSTED: Out of memory",
    "(trialGpuMemory); killed as out of GPU memory",
];

/// Whether a failure looks like running out of memory, and of which: GPU memory when its last
/// words say so (checked first: a CUDA error ends the process normally), else host memory for
/// the kernel's OOM killer (SIGKILL, or bash reporting 137) or an out-of-memory error.
pub(super) fn out_of_memory(
    exit_code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &str,
) -> Option<OutOfMemory> {
    if GPU_OOM_WORDS
        .iter()
        .any(|words| stderr_tail.contains(words))
    {
        return Some(OutOfMemory::Gpu);
    }
    const SIGKILL: i32 = 9;
    let killed = exit_code == Some(128 + SIGKILL) || signal == Some(SIGKILL);
    let said_so = [
        "OutOfMemoryError",
        "MemoryError",
        "std::bad_alloc",
        "Killed",
    ]
    .iter()
    .any(|needle| stderr_tail.contains(needle));
    (killed || said_so).then_some(OutOfMemory::Host)
}

/// Whether a failure looks like running out of memory, host or GPU.
pub(super) fn looks_like_oom(
    exit_code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &str,
) -> bool {
    out_of_memory(exit_code, signal, stderr_tail).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_out_of_memory_is_told_from_host_out_of_memory_by_the_last_words() {
        let torch = "Traceback (most recent call last):\n  File \"t.py\", line 3\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79.10 GiB\n";
        assert_eq!(out_of_memory(Some(1), None, torch), Some(OutOfMemory::Gpu));
        let old_torch = "RuntimeError: CUDA error: out of memory\n";
        assert_eq!(
            out_of_memory(Some(1), None, old_torch),
            Some(OutOfMemory::Gpu)
        );
        let knob = "knob: the trial used 3000 MiB of GPU memory, more than its 1024 MiB request (trialGpuMemory); killed as out of GPU memory\n";
        assert_eq!(out_of_memory(None, Some(9), knob), Some(OutOfMemory::Gpu));
        let tensorflow = "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[8192,8192]\n";
        assert_eq!(
            out_of_memory(Some(1), None, tensorflow),
            Some(OutOfMemory::Gpu)
        );
        assert_eq!(out_of_memory(None, Some(9), ""), Some(OutOfMemory::Host));
        assert_eq!(out_of_memory(Some(137), None, ""), Some(OutOfMemory::Host));
        assert_eq!(
            out_of_memory(Some(1), None, "MemoryError\n"),
            Some(OutOfMemory::Host)
        );
        assert_eq!(out_of_memory(Some(1), None, "ValueError: x\n"), None);
    }

    #[test]
    fn a_failure_reason_is_the_last_line_of_a_progress_bar_rewritten_stderr() {
        // tqdm rewrites its bar with `\r`; the error after it is what the user needs.
        let bars: String = (0..100)
            .map(|i| format!("{i:3}%|{:<40}|\r", "#".repeat(i * 2 / 5)))
            .collect();
        let stderr = format!("{bars}Error: boom\r");
        assert_eq!(
            failure_reason(Some(1), None, &stderr),
            "exit code 1: Error: boom"
        );
        assert_eq!(
            failure_reason(Some(1), None, "Traceback\r\nValueError: x\r\n\r\n"),
            "exit code 1: ValueError: x"
        );
        assert_eq!(
            failure_reason(None, Some(15), "\r\n \r"),
            "killed by signal 15"
        );
    }

    #[test]
    fn a_failure_reason_shows_the_text_of_coloured_lines_and_no_control_character() {
        let reason = |stderr: &str| failure_reason(Some(1), None, stderr);
        // A coloured log line (CSI), with a 256-colour and a cursor-moving sequence.
        assert_eq!(
            reason("\x1b[1;31mERROR\x1b[0m \x1b[38;5;208mValueError: boom\x1b[K\x1b[0m\n"),
            "exit code 1: ERROR ValueError: boom"
        );
        // A line that only sets a colour or a window title (OSC, ended by BEL or by ST) does
        // not hide the error before it.
        for after in [
            "\x1b[0m",
            "\x1b]0;title\x07",
            "\x1b]2;title\x1b\\",
            "\x1b[?25h\x1b[0m\n",
        ] {
            assert_eq!(
                reason(&format!("Traceback\nValueError: boom\n{after}")),
                "exit code 1: ValueError: boom",
                "{after:?}"
            );
        }
        // Other control characters become `�`; a tab a space; a line of nothing else is skipped.
        assert_eq!(
            reason("ValueError: caf\u{fffd}\0 boom\x07\x08!\tend\n\0\x07\x7f\n"),
            "exit code 1: ValueError: caf\u{fffd}\u{fffd} boom\u{fffd}\u{fffd}! end"
        );
        // An OSC 52 clipboard write, an OSC 8 hyperlink around text, C1 forms, other escapes.
        assert_eq!(
            reason("\x1b]52;c;ZXZpbA==\x07x \x1b]8;;http://e\x1b\\link\x1b]8;;\x1b\\ \u{9b}31my\u{9b}0m \u{9d}0;t\u{9c}z \x1b(B\x1b7w\x1b8\x1bc"),
            "exit code 1: x link y z w"
        );
        // An unterminated title ends at the next escape, or at the end of its line.
        assert_eq!(
            reason("\x1b]0;title\x1b[31mValueError: boom\x1b[0m"),
            "exit code 1: ValueError: boom"
        );
        // An unterminated sequence ends at the end of its line, not further.
        assert_eq!(
            reason("ValueError: boom\n\x1b]0;no end"),
            "exit code 1: ValueError: boom"
        );
        assert_eq!(reason("Error: x \x1b["), "exit code 1: Error: x");
        assert_eq!(reason("\x1b[31m\x1b[0m\n\x1b]0;t\x07"), "exit code 1");
        // Nothing is left of a control character anywhere in the message.
        let all: String = (0u32..0x100).filter_map(char::from_u32).collect();
        assert!(
            !reason(&all).chars().any(char::is_control),
            "{:?}",
            reason(&all)
        );
    }

    #[test]
    fn a_stop_reason_is_one_bounded_line_of_visible_text() {
        assert_eq!(
            stop_reason("line one\nline two\x1b[31mred\r\n\x1b[0m"),
            "line one line twored"
        );
        assert_eq!(stop_reason("a\tb\x07c"), "a b\u{fffd}c");
        assert_eq!(stop_reason("\n\x1b[0m\n"), "");
        let kept = "x".repeat(MAX_REASON_LINE_CHARS);
        assert_eq!(stop_reason(&kept), kept);
        // A reason of megabytes keeps its first characters, cut on a character's boundary.
        let huge = "é".repeat(1 << 20);
        let reason = stop_reason(&huge);
        assert_eq!(reason.chars().count(), MAX_REASON_LINE_CHARS + 1);
        assert!(reason.ends_with("é…"), "{reason}");
        let many_lines = "word\n".repeat(1 << 20);
        assert_eq!(
            stop_reason(&many_lines).chars().count(),
            MAX_REASON_LINE_CHARS + 1
        );
    }

    #[test]
    fn a_failure_reason_keeps_a_bounded_part_of_a_long_last_line() {
        let long = format!("{}\n", "é".repeat(2_000));
        let reason = failure_reason(Some(2), None, &long);
        let quoted = reason.strip_prefix("exit code 2: ").unwrap();
        assert_eq!(
            quoted.chars().count(),
            MAX_REASON_LINE_CHARS + 1,
            "{reason}"
        );
        assert!(quoted.ends_with("é…"), "{reason}");
        let short = "x".repeat(MAX_REASON_LINE_CHARS);
        assert_eq!(
            failure_reason(Some(2), None, &short),
            format!("exit code 2: {short}")
        );
    }

    #[test]
    fn a_learned_host_request_keeps_headroom_above_a_small_peak() {
        // Killed just after it started: twice 4 MiB would be a limit a shell cannot keep.
        assert_eq!(raised_host_memory_request(None, Some(4), None), Some(68));
        assert_eq!(raised_host_memory_request(None, Some(151), None), Some(302));
        // With trialMemorySize the rule is twice the larger, as before.
        assert_eq!(
            raised_host_memory_request(Some(16), Some(4), None),
            Some(32)
        );
        assert_eq!(raised_host_memory_request(None, None, None), None);
    }

    #[test]
    fn a_raised_host_request_beyond_every_environment_is_capped_at_what_a_host_has_available() {
        // A 23.5 GiB machine with 22.6 GiB available: 12 GiB doubled is more than it has.
        let machine = Some(HostMemoryRoom {
            capacity: 24064,
            available: 23142,
        });
        assert_eq!(
            raised_host_memory_request(Some(12288), Some(14), machine),
            Some(23142)
        );
        // Within the capacity the raise is as before, even above what is available now.
        assert_eq!(
            raised_host_memory_request(Some(8192), Some(14), machine),
            Some(16384)
        );
        // Already at what it can have (or a cluster allocation of trialMemorySize, which has no
        // more): raised as usual, and refused.
        assert_eq!(
            raised_host_memory_request(Some(23142), None, machine),
            Some(46284)
        );
        let allocation = Some(HostMemoryRoom {
            capacity: 64,
            available: 64,
        });
        assert_eq!(
            raised_host_memory_request(Some(64), Some(151), allocation),
            Some(302)
        );
    }

    #[test]
    fn a_raised_gpu_request_is_twice_the_larger_of_request_and_peak_capped_at_the_largest_gpu() {
        assert_eq!(
            raised_gpu_memory_request(Some(1024), Some(1500), None),
            Some(3000)
        );
        assert_eq!(
            raised_gpu_memory_request(Some(1024), None, Some(81920)),
            Some(2048)
        );
        // Capped: a raise alone never makes a trial unplaceable.
        assert_eq!(
            raised_gpu_memory_request(Some(30000), Some(50000), Some(81920)),
            Some(81920)
        );
        // A request the user set above the cap (refused at placement anyway) is not lowered.
        assert_eq!(
            raised_gpu_memory_request(Some(90000), None, Some(81920)),
            Some(90000)
        );
        assert_eq!(raised_gpu_memory_request(None, None, Some(81920)), None);
        assert_eq!(
            raised_gpu_memory_note(Some(1024), Some(1500), 3000),
            "; out of GPU memory: the next attempt asks for 3000 MiB of GPU memory (asked 1024 MiB, GPU memory peak 1500 MiB)"
        );
    }

    #[test]
    fn the_requeue_note_names_the_gpu_peak_where_known() {
        assert_eq!(
            raised_memory_note(Some(64), Some(151), Some(900), 302),
            "; out of memory: the next attempt asks for 302 MiB of memory (asked 64 MiB, used at least 151 MiB, GPU memory peak 900 MiB)"
        );
        assert_eq!(
            raised_memory_note(None, Some(151), None, 302),
            "; out of memory: the next attempt asks for 302 MiB of memory (no trialMemorySize, used at least 151 MiB)"
        );
    }
}
