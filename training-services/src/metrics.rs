//! What every trial protocol shares: the per-trial recorder that numbers metrics and keeps
//! events in order, a JSON reader that accepts Python's NaN/Infinity, and a bounded line
//! scanner.

use std::sync::{Arc, Mutex, MutexGuard};

use knob_plugin_api::service::{MetricKind, ServiceEvent};

/// The longest metric line or record read. A longer one is skipped with a warning, so that a
/// runaway print can neither exhaust memory nor stall the trial.
pub const MAX_METRIC_BYTES: usize = 1 << 20;

/// Warnings one trial may raise; past this they are only counted, so a trial printing garbage
/// in a loop cannot flood the core. The count is reported when the trial ends.
pub const MAX_WARNINGS_PER_TRIAL: u32 = 100;

/// Where a runner reports events: the plugin's `EventSink`, a test's collector, or (later) the
/// knob-agent's link back to the manager.
pub type Emit = Arc<dyn Fn(ServiceEvent) + Send + Sync>;

/// A metric arrived for a trial that has already ended; it was not recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trial {trial_id} is not running (it has ended); metric not recorded")]
pub struct TrialNotRunning {
    pub trial_id: String,
}

enum Phase {
    /// The process is being spawned; events wait here so that `TrialStarted` comes first.
    Starting(Vec<ServiceEvent>),
    Running,
    Ended,
}

struct RecorderState {
    phase: Phase,
    next_intermediate: u64,
    next_final: u64,
    warnings: u32,
    checkpoint_seen: bool,
}

/// One trial's event stream. Every protocol (stdout, metric files, HTTP) records through it.
///
/// Events are emitted while its lock is held, so the order the core sees is the order in which
/// they were recorded: `TrialStarted`, then metrics and warnings, then `TrialEnded`, after
/// which nothing more is accepted for the trial.
pub struct TrialRecorder {
    trial_id: String,
    emit: Emit,
    /// The trial's `KNOB_CHECKPOINT_DIR`, looked at with each intermediate result until it holds
    /// something (`ServiceEvent::CheckpointSaved`).
    checkpoint_dir: Option<std::path::PathBuf>,
    state: Mutex<RecorderState>,
}

impl TrialRecorder {
    pub fn new(trial_id: &str, emit: Emit) -> Arc<TrialRecorder> {
        Self::watching_checkpoints(trial_id, emit, None)
    }

    /// A recorder that also tells when `checkpoint_dir` first holds something.
    pub fn watching_checkpoints(
        trial_id: &str,
        emit: Emit,
        checkpoint_dir: Option<std::path::PathBuf>,
    ) -> Arc<TrialRecorder> {
        Arc::new(TrialRecorder {
            trial_id: trial_id.to_string(),
            emit,
            checkpoint_dir,
            state: Mutex::new(RecorderState {
                phase: Phase::Starting(Vec::new()),
                next_intermediate: 0,
                next_final: 0,
                warnings: 0,
                checkpoint_seen: false,
            }),
        })
    }

    pub fn trial_id(&self) -> &str {
        &self.trial_id
    }

    fn lock(&self) -> MutexGuard<'_, RecorderState> {
        // A panic while emitting leaves the counters valid; keep going rather than cascade.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn send(&self, state: &mut RecorderState, event: ServiceEvent) {
        match &mut state.phase {
            Phase::Starting(buffer) => buffer.push(event),
            Phase::Running | Phase::Ended => (self.emit)(event),
        }
    }

    /// The process runs: emits `TrialStarted`, then whatever arrived while it was starting.
    pub fn started(&self, pid: Option<u32>) {
        let mut state = self.lock();
        let Phase::Starting(buffer) = std::mem::replace(&mut state.phase, Phase::Running) else {
            return;
        };
        (self.emit)(ServiceEvent::TrialStarted {
            trial_id: self.trial_id.clone(),
            pid,
        });
        for event in buffer {
            (self.emit)(event);
        }
    }

    /// Whether the trial has reported a final result (readable or not) on any channel.
    pub fn has_final(&self) -> bool {
        self.lock().next_final > 0
    }

    pub fn is_running(&self) -> bool {
        !matches!(self.lock().phase, Phase::Ended)
    }

    /// Records one metric; `value` is its JSON text as the trial wrote it.
    pub fn record(&self, kind: MetricKind, value: String) -> Result<(), TrialNotRunning> {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Ended) {
            return Err(TrialNotRunning {
                trial_id: self.trial_id.clone(),
            });
        }
        let counter = match kind {
            MetricKind::Intermediate => &mut state.next_intermediate,
            MetricKind::Final => &mut state.next_final,
        };
        let sequence = *counter;
        *counter += 1;
        if kind == MetricKind::Intermediate && !state.checkpoint_seen {
            let saved = self.checkpoint_dir.as_deref().is_some_and(|dir| {
                std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
            });
            if saved {
                state.checkpoint_seen = true;
                let event = ServiceEvent::CheckpointSaved {
                    trial_id: self.trial_id.clone(),
                };
                self.send(&mut state, event);
            }
        }
        let event = ServiceEvent::Metric {
            trial_id: self.trial_id.clone(),
            kind,
            sequence,
            value,
        };
        self.send(&mut state, event);
        Ok(())
    }

    /// Records a final result the core will not be able to read, if it is the trial's first
    /// final (the one that counts); returns false, recording nothing, after another final.
    fn record_unusable_final(&self, value: String) -> bool {
        if self.lock().next_final > 0 {
            return false;
        }
        self.record(MetricKind::Final, value).is_ok()
    }

    /// Records a metric whose value the service cannot read (`warning` says what and why).
    /// Every protocol comes here (knob's lines, the NNI file and HTTP channels), so a bad value
    /// is handled the same whichever way the trial sent it. A trial's first final is its
    /// answer: one the core cannot read goes on as sent, so that it is stored, shown to the
    /// user and made the trial's end message, instead of the trial ending as if it had reported
    /// nothing. A bad intermediate, or a later bad final (the core would ignore it anyway), is
    /// a (bounded) warning.
    pub fn record_unreadable(
        &self,
        kind: MetricKind,
        value: &str,
        warning: impl std::fmt::Display,
    ) {
        let passed_on = kind == MetricKind::Final && self.record_unusable_final(value.to_string());
        if !passed_on {
            self.warn(warning);
        }
    }

    /// Reports something wrong with what the trial sent; `message` says what, and the trial
    /// is named in front of it.
    pub fn warn(&self, message: impl std::fmt::Display) {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Ended) {
            return;
        }
        state.warnings += 1;
        if state.warnings > MAX_WARNINGS_PER_TRIAL {
            return;
        }
        let event = ServiceEvent::Warning {
            trial_id: Some(self.trial_id.clone()),
            message: format!("trial {}: {message}", self.trial_id),
        };
        self.send(&mut state, event);
    }

    /// Emits the trial's `TrialEnded` (built by `ended`) and refuses everything after it.
    pub fn end(&self, ended: ServiceEvent) {
        let mut state = self.lock();
        if matches!(state.phase, Phase::Ended) {
            return;
        }
        if let Phase::Starting(buffer) = std::mem::replace(&mut state.phase, Phase::Running) {
            for event in buffer {
                (self.emit)(event);
            }
        }
        if state.warnings > MAX_WARNINGS_PER_TRIAL {
            (self.emit)(ServiceEvent::Warning {
                trial_id: Some(self.trial_id.clone()),
                message: format!(
                    "trial {}: {} more warnings were not shown",
                    self.trial_id,
                    state.warnings - MAX_WARNINGS_PER_TRIAL
                ),
            });
        }
        (self.emit)(ended);
        state.phase = Phase::Ended;
    }
}

/// The start of a line or record for a one-line message: at most 60 characters, control
/// characters escaped.
pub fn excerpt(bytes: &[u8]) -> String {
    const MAX_CHARS: usize = 60;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4 * MAX_CHARS)]);
    let mut out: String = text
        .chars()
        .take(MAX_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().count() > MAX_CHARS || bytes.len() > 4 * MAX_CHARS {
        out.push('…');
    }
    out
}

/// What a [`LineScanner`] finds.
#[derive(Debug, PartialEq, Eq)]
pub enum ScannedLine<'a> {
    /// A complete line that starts with the prefix, without its `\n`, `\r\n` or `\r`.
    Line(&'a [u8]),
    /// A line that starts with the prefix but grew past the bound; the rest of it is skipped.
    TooLong,
}

/// Splits a byte stream into lines and hands over those that start with `prefix` (all lines
/// when it is empty). Other lines are never buffered, and a kept line is bounded by `max_bytes`,
/// so memory stays small whatever the trial prints.
///
/// A carriage return ends a line too, as on a terminal, where what follows it is what shows: a
/// progress bar that rewrites its line (tqdm with `leave=False`) and then `print("KNOB_FINAL
/// 0.9")` leave `\r 50%|██  |\rKNOB_FINAL 0.9\n`, whose final was lost.
#[derive(Debug)]
pub struct LineScanner {
    prefix: &'static [u8],
    max_bytes: usize,
    line: Vec<u8>,
    skipping: bool,
}

impl LineScanner {
    pub fn new(prefix: &'static [u8], max_bytes: usize) -> LineScanner {
        LineScanner {
            prefix,
            max_bytes,
            line: Vec::new(),
            skipping: false,
        }
    }

    pub fn feed(&mut self, mut chunk: &[u8], on_line: &mut impl FnMut(ScannedLine<'_>)) {
        while !chunk.is_empty() {
            match memchr::memchr2(b'\n', b'\r', chunk) {
                Some(end) => {
                    self.absorb(&chunk[..end], on_line);
                    self.end_line(on_line);
                    chunk = &chunk[end + 1..];
                }
                None => {
                    self.absorb(chunk, on_line);
                    chunk = &[];
                }
            }
        }
    }

    /// The stream ended: a last line without `\n` still counts.
    pub fn finish(&mut self, on_line: &mut impl FnMut(ScannedLine<'_>)) {
        self.end_line(on_line);
    }

    fn absorb(&mut self, segment: &[u8], on_line: &mut impl FnMut(ScannedLine<'_>)) {
        if self.skipping || segment.is_empty() {
            return;
        }
        let have = self.line.len();
        if have < self.prefix.len() {
            let head = &segment[..segment.len().min(self.prefix.len() - have)];
            if head != &self.prefix[have..have + head.len()] {
                self.line.clear();
                self.skipping = true;
                return;
            }
        }
        if have + segment.len() > self.max_bytes {
            self.line = Vec::new();
            self.skipping = true;
            on_line(ScannedLine::TooLong);
            return;
        }
        self.line.extend_from_slice(segment);
    }

    fn end_line(&mut self, on_line: &mut impl FnMut(ScannedLine<'_>)) {
        if !self.skipping && !self.line.is_empty() && self.line.len() >= self.prefix.len() {
            on_line(ScannedLine::Line(&self.line));
        }
        self.line.clear();
        self.skipping = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(prefix: &'static [u8], max: usize, chunks: &[&[u8]]) -> Vec<String> {
        let mut scanner = LineScanner::new(prefix, max);
        let mut out = Vec::new();
        let mut on_line = |line: ScannedLine<'_>| {
            out.push(match line {
                ScannedLine::Line(l) => String::from_utf8_lossy(l).into_owned(),
                ScannedLine::TooLong => "<too long>".to_string(),
            })
        };
        for chunk in chunks {
            scanner.feed(chunk, &mut on_line);
        }
        scanner.finish(&mut on_line);
        out
    }

    #[test]
    fn scanner_keeps_prefixed_lines_across_chunks() {
        let lines = scan(
            b"KNOB_",
            100,
            &[
                b"noise\nKN",
                b"OB_FINAL 1\r\nKNOX\nK",
                b"NOB_INTERMEDIATE 2",
            ],
        );
        assert_eq!(lines, ["KNOB_FINAL 1", "KNOB_INTERMEDIATE 2"]);
    }

    #[test]
    fn a_carriage_return_ends_a_line_as_on_a_terminal() {
        let lines = scan(
            b"KNOB_",
            100,
            &[
                b"epoch 1 10%\repoch 1 100%\rKNOB_INTERMEDIATE 1\r",
                b"\r  \rKNOB_FI",
                b"NAL 2\r\nKNOB_INTERMEDIATE 3\n",
            ],
        );
        assert_eq!(
            lines,
            ["KNOB_INTERMEDIATE 1", "KNOB_FINAL 2", "KNOB_INTERMEDIATE 3"]
        );
    }

    #[test]
    fn scanner_bounds_long_lines_and_recovers() {
        let long = vec![b'x'; 50];
        let lines = scan(b"K", 20, &[b"K", &long, &long, b"\nK ok\n", &long, b"\n"]);
        assert_eq!(lines, ["<too long>", "K ok"]);
        let lines = scan(b"", 20, &[b"a\n\n", &long, b"\nb"]);
        assert_eq!(lines, ["a", "<too long>", "b"]);
    }

    #[test]
    fn excerpt_is_one_short_line() {
        assert_eq!(excerpt(b"a\nb"), "a\\nb");
        let long = excerpt(&[b'y'; 500]);
        assert!(long.ends_with('…') && long.chars().count() == 61, "{long}");
    }
}
