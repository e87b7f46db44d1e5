//! Reading the metric files trials append to (`metrics.knob`, `.nni/metrics`) as they grow.
//!
//! A [`FileWatcher`] (one inotify instance per service) wakes a trial's tail task whenever one
//! of its files changes; the task reads from where it stopped to the end. When the trial's
//! process has exited, the runner asks for one last read, so a metric written just before
//! exit is never lost. Where the OS watcher is unavailable, tails are read on a short timer.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{oneshot, Notify};

use crate::knob_protocol::{self, LineSource};
use crate::metrics::{LineScanner, ScannedLine, TrialRecorder, MAX_METRIC_BYTES};
use crate::nni_file::{decode_nni_metric, NniRecord, NniRecordDecoder};
use crate::process::open_trial_file;

/// How often tails are read when the OS cannot tell us about changes.
pub const POLL_INTERVAL: Duration = Duration::from_millis(200);

type Wakers = Arc<Mutex<HashMap<PathBuf, Arc<Notify>>>>;

/// Turns file-change notifications into wake-ups of the tasks tailing those files.
pub struct FileWatcher {
    watcher: Mutex<Option<RecommendedWatcher>>,
    wakers: Wakers,
    /// Why the OS watcher is unavailable, when it is.
    unavailable: Option<String>,
}

impl FileWatcher {
    pub fn new() -> FileWatcher {
        let wakers: Wakers = Arc::default();
        let for_events = wakers.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            // The tail's own reads open the file: waking on opens (and reads' closes) would
            // read again, open again, and spin a core for as long as the trial runs.
            if let EventKind::Access(access) = event.kind {
                if access != AccessKind::Close(AccessMode::Write) {
                    return;
                }
            }
            let wakers = for_events.lock().unwrap_or_else(|p| p.into_inner());
            for path in &event.paths {
                if let Some(wake) = wakers.get(path) {
                    wake.notify_one();
                }
            }
        });
        match watcher {
            Ok(watcher) => FileWatcher {
                watcher: Mutex::new(Some(watcher)),
                wakers,
                unavailable: None,
            },
            Err(e) => FileWatcher {
                watcher: Mutex::new(None),
                wakers,
                unavailable: Some(e.to_string()),
            },
        }
    }

    /// A watcher that watches nothing: every tail is read on a timer. For file systems where
    /// change notification is known not to work (some network mounts), and for tests.
    pub fn polling(why: &str) -> FileWatcher {
        FileWatcher {
            watcher: Mutex::new(None),
            wakers: Arc::default(),
            unavailable: Some(why.to_string()),
        }
    }

    /// Why files are polled instead of watched, if they are.
    pub fn unavailable(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Wakes `wake` when the existing file `path` changes. Err says why it cannot (the caller
    /// then polls).
    pub fn watch(&self, path: &Path, wake: Arc<Notify>) -> Result<(), String> {
        let mut watcher = self.watcher.lock().unwrap_or_else(|p| p.into_inner());
        let Some(watcher) = watcher.as_mut() else {
            return Err(self.unavailable.clone().unwrap_or_default());
        };
        self.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_path_buf(), wake);
        watcher
            .watch(path, RecursiveMode::NonRecursive)
            .map_err(|e| {
                self.forget(path);
                e.to_string()
            })
    }

    pub fn unwatch(&self, path: &Path) {
        if let Some(watcher) = self
            .watcher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            let _ = watcher.unwatch(path);
        }
        self.forget(path);
    }

    fn forget(&self, path: &Path) {
        self.wakers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path);
    }
}

impl Default for FileWatcher {
    fn default() -> Self {
        FileWatcher::new()
    }
}

/// How a tailed file is read.
#[derive(Debug)]
pub enum TailFormat {
    /// knob protocol lines (`metrics.knob`).
    KnobLines(LineScanner),
    /// NNI records (`.nni/metrics`).
    NniRecords(NniRecordDecoder),
    /// nni's `trial.log`, for the `KNOB_` lines a trial that imports real nni printed: nni
    /// sends its stdout there, and they were lost. `told`: the store has its warning.
    NniTrialLog { scanner: LineScanner, told: bool },
}

impl TailFormat {
    fn fresh(&self) -> TailFormat {
        match self {
            TailFormat::KnobLines(_) => {
                TailFormat::KnobLines(LineScanner::new(b"", MAX_METRIC_BYTES))
            }
            TailFormat::NniRecords(_) => TailFormat::NniRecords(NniRecordDecoder::new()),
            TailFormat::NniTrialLog { .. } => TailFormat::NniTrialLog {
                scanner: trial_log_scanner(),
                told: false,
            },
        }
    }
}

/// Every line of trial.log is looked at (its head is a time); the bound leaves room for it
/// beside a metric of the full size.
fn trial_log_scanner() -> LineScanner {
    LineScanner::new(b"", MAX_METRIC_BYTES + 64)
}

/// One metric file of one trial, read from where the last read stopped.
#[derive(Debug)]
pub struct FileTail {
    path: PathBuf,
    /// Device and inode of the file `offset` counts in: a trial that deletes its folder and
    /// makes it again writes to a new file at the same path, to be read from its start.
    identity: Option<(u64, u64)>,
    offset: u64,
    format: TailFormat,
    /// Created if missing and watched once the trial has run [`WATCH_AFTER`]; otherwise only
    /// read when the tail wakes for another file and at the end.
    watched: bool,
    /// The trial put something other than a regular file there, and the store was told.
    refused: bool,
}

impl FileTail {
    pub fn knob_lines(path: PathBuf) -> FileTail {
        FileTail {
            path,
            identity: None,
            offset: 0,
            format: TailFormat::KnobLines(LineScanner::new(b"", MAX_METRIC_BYTES)),
            watched: true,
            refused: false,
        }
    }

    /// nni's `trial.log`. Not created (only trials that import nni write one, and the API tells
    /// a trial without one apart) and so not watched: read at the end, and whenever the other
    /// files wake the tail.
    pub fn nni_trial_log(path: PathBuf) -> FileTail {
        FileTail {
            path,
            identity: None,
            offset: 0,
            format: TailFormat::NniTrialLog {
                scanner: trial_log_scanner(),
                told: false,
            },
            watched: false,
            refused: false,
        }
    }

    pub fn nni_records(path: PathBuf) -> FileTail {
        FileTail {
            path,
            identity: None,
            offset: 0,
            format: TailFormat::NniRecords(NniRecordDecoder::new()),
            watched: true,
            refused: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads what was appended since the last call and records it. Blocking file I/O: the
    /// tail task runs it off the async workers, every file of one wake-up at once.
    ///
    /// True when the file read before is gone or was replaced by another at its path: a watch
    /// added for it no longer tells of changes, so the caller polls instead.
    pub fn read_new(&mut self, recorder: &TrialRecorder) -> bool {
        let mut file = match open_trial_file(&self.path, OpenOptions::new().read(true)) {
            Ok(file) => file,
            // Not created, or removed (the trial cleaned its folder?): nothing to read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return self.identity.is_some(),
            Err(e) => {
                if !std::mem::replace(&mut self.refused, true) {
                    recorder.warn(format_args!("{} not read: {e}", self.path.display()));
                }
                return self.identity.is_some();
            }
        };
        let (length, identity) = match file.metadata() {
            Ok(metadata) => (metadata.len(), Some((metadata.dev(), metadata.ino()))),
            Err(_) => (0, self.identity),
        };
        let replaced = self.identity.is_some() && identity != self.identity;
        if replaced {
            // The old file is complete: its last line counts even without `\n`.
            self.finish(recorder);
            self.offset = 0;
            self.format = self.format.fresh();
        } else if length < self.offset {
            recorder.warn(format_args!(
                "{} shrank from {} to {length} bytes; metric files must only be appended to, reading it again from the start",
                self.path.display(),
                self.offset
            ));
            self.offset = 0;
            self.format = self.format.fresh();
        }
        self.identity = identity;
        if length == self.offset || file.seek(SeekFrom::Start(self.offset)).is_err() {
            return replaced;
        }
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let read = match file.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(e) => {
                    recorder.warn(format_args!("cannot read {}: {e}", self.path.display()));
                    break;
                }
            };
            self.offset += read as u64;
            self.consume(&buffer[..read], recorder);
        }
        replaced
    }

    fn consume(&mut self, bytes: &[u8], recorder: &TrialRecorder) {
        match &mut self.format {
            TailFormat::KnobLines(scanner) => {
                scanner.feed(bytes, &mut |line| on_knob_line(recorder, line));
            }
            TailFormat::NniRecords(decoder) => {
                decoder.feed(bytes, &mut |record| on_nni_record(recorder, record));
            }
            TailFormat::NniTrialLog { scanner, told } => {
                scanner.feed(bytes, &mut |line| on_trial_log_line(recorder, line, told));
            }
        }
    }

    /// The file is complete: a last line without `\n` counts, a partial record is reported.
    pub fn finish(&mut self, recorder: &TrialRecorder) {
        match &mut self.format {
            TailFormat::KnobLines(scanner) => {
                scanner.finish(&mut |line| on_knob_line(recorder, line));
            }
            TailFormat::NniRecords(decoder) => {
                decoder.finish(&mut |record| on_nni_record(recorder, record));
            }
            TailFormat::NniTrialLog { scanner, told } => {
                scanner.finish(&mut |line| on_trial_log_line(recorder, line, told));
            }
        }
    }
}

fn on_knob_line(recorder: &TrialRecorder, line: ScannedLine<'_>) {
    match line {
        ScannedLine::Line(line) => {
            knob_protocol::handle_line(recorder, LineSource::MetricsFile, line)
        }
        ScannedLine::TooLong => {
            knob_protocol::warn_too_long(recorder, LineSource::MetricsFile, MAX_METRIC_BYTES)
        }
    }
}

/// A `KNOB_` line the trial printed under real nni counts as on stdout. A line over the bound
/// is dropped without a word: most of trial.log is not metrics, and nothing says it was one.
fn on_trial_log_line(recorder: &TrialRecorder, line: ScannedLine<'_>, told: &mut bool) {
    let ScannedLine::Line(line) = line else {
        return;
    };
    let printed = knob_protocol::printed_under_nni(line);
    if !printed.starts_with(knob_protocol::LINE_PREFIX) {
        return;
    }
    if !std::mem::replace(told, true) {
        recorder.warn(
            "KNOB_ lines read from trial.log, where `import nni` sends stdout: they reach knob only when the trial ends (or its metric files change), so the assessor judges them late; report with nni.report_intermediate_result / report_final_result or knob_trial instead",
        );
    }
    knob_protocol::handle_line(recorder, LineSource::NniTrialLog, printed);
}

fn on_nni_record(recorder: &TrialRecorder, record: NniRecord<'_>) {
    let outcome = match record {
        NniRecord::Metric(json) => decode_nni_metric(json, recorder.trial_id()),
        NniRecord::Corrupt(why) => Err(why),
    };
    match outcome {
        Ok(metric) => {
            // Files are read before the trial is marked ended, so this cannot be refused.
            let _ = metric.record(recorder, ".nni/metrics");
        }
        Err(why) => recorder.warn(format_args!(".nni/metrics: {why}")),
    }
}

/// How long after a trial's start its metric files are first watched. Until then they are read
/// once at the start and once at the end: a trial that ends sooner (a short one, such as
/// `trial_overhead.sh`'s) never costs the four round trips to the watcher's thread that watching
/// and unwatching its two files take. A metric written within that time by a trial that runs
/// on is read when the watches are added, at most this much later.
pub const WATCH_AFTER: Duration = Duration::from_millis(50);

/// Tails `files` until `finish` fires, then reads them to the end one last time, and returns
/// the paths it watched (for the caller to [`FileWatcher::unwatch`] once the trial's end is
/// told: that need not delay it).
///
/// The files are read at once (a file not created yet reads as empty), then created if missing
/// and watched with `watcher` after [`WATCH_AFTER`] (and read again, for what was written before
/// the watch), then read on each change; a file that cannot be watched is read every
/// [`POLL_INTERVAL`] instead.
///
/// Each wake-up reads every file in one blocking task: one hand-over to tokio's blocking pool
/// rather than one for each open, `stat`, seek and read of each file (eight on a trial's
/// last read, which its end waits for).
pub async fn tail_files(
    files: Vec<FileTail>,
    recorder: Arc<TrialRecorder>,
    watcher: Arc<FileWatcher>,
    mut finish: oneshot::Receiver<()>,
) -> Vec<PathBuf> {
    let changed = Arc::new(Notify::new());
    let mut files = Some(files);
    let mut watched = Vec::new();
    let mut ticker = tokio::time::interval(POLL_INTERVAL);
    let watch_at = tokio::time::Instant::now() + WATCH_AFTER;
    // The first read comes at once; the watches are added at `watch_at` (`to_watch`).
    let mut first = true;
    let mut watching = false;
    let mut poll = false;
    let mut last = false;
    while !last {
        let mut to_watch = false;
        if !std::mem::take(&mut first) {
            tokio::select! {
                biased;
                _ = &mut finish => last = true,
                _ = changed.notified() => {}
                _ = tokio::time::sleep_until(watch_at), if !watching => to_watch = true,
                _ = ticker.tick(), if poll => {}
            }
        }
        watching |= to_watch;
        let Some(mut taken) = files.take() else {
            return watched;
        };
        let recorder = recorder.clone();
        let watcher = watcher.clone();
        let changed = changed.clone();
        let read = tokio::task::spawn_blocking(move || {
            let mut added = Vec::new();
            let mut unwatched = false;
            for file in taken.iter().filter(|file| file.watched) {
                if !to_watch {
                    break;
                }
                // Not created before the start (see `runner::prepare_directory`): created
                // empty now if the trial has not, to be watched. Appending, never truncating,
                // so that what the trial writes meanwhile stays.
                if let Err(e) =
                    open_trial_file(file.path(), OpenOptions::new().append(true).create(true))
                {
                    knob_plugin_api::log::debug(&format!(
                        "trial {}: cannot create {}: {e}",
                        recorder.trial_id(),
                        file.path().display()
                    ));
                }
                match watcher.watch(file.path(), changed.clone()) {
                    Ok(()) => added.push(file.path().to_path_buf()),
                    Err(why) => {
                        knob_plugin_api::log::debug(&format!(
                            "trial {}: polling {} ({why})",
                            recorder.trial_id(),
                            file.path().display()
                        ));
                        unwatched = true;
                    }
                }
            }
            for file in &mut taken {
                // A file replaced after its watch was added is watched no more (the watch
                // follows the old inode): read on the timer from then on.
                unwatched |= file.read_new(&recorder) && watching && file.watched;
                if last {
                    file.finish(&recorder);
                }
            }
            (taken, added, unwatched)
        });
        // Gone only when the runtime shuts down: nothing is left to tell then.
        let Ok((taken, added, unwatched)) = read.await else {
            return watched;
        };
        files = Some(taken);
        watched.extend(added);
        if unwatched && !std::mem::replace(&mut poll, true) {
            // The timer ran unread until now: without a reset it would fire every missed tick.
            ticker.reset();
        }
    }
    watched
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Reading a watched file must not wake its tail: the tail reads on every wake-up, so a
    /// wake-up per read kept a core busy for the whole life of every trial.
    #[test]
    fn a_watched_file_wakes_its_tail_when_written_not_when_read() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.knob");
        std::fs::write(&path, "KNOB_INTERMEDIATE 1\n").unwrap();
        let watcher = FileWatcher::new();
        if let Some(why) = watcher.unavailable() {
            panic!("inotify is unavailable here: {why}");
        }
        let wake = Arc::new(Notify::new());
        watcher.watch(&path, wake.clone()).unwrap();
        let woken = |within: Duration| {
            runtime.block_on(async { tokio::time::timeout(within, wake.notified()).await.is_ok() })
        };

        for _ in 0..5 {
            std::fs::read(&path).unwrap();
        }
        // Long enough for inotify to have delivered the reads' events, had they been kept.
        std::thread::sleep(Duration::from_millis(300));
        assert!(!woken(Duration::from_millis(50)), "reading woke the tail");

        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"KNOB_FINAL 2\n")
            .unwrap();
        assert!(
            woken(Duration::from_secs(10)),
            "an append did not wake the tail"
        );
    }
}
