//! Test helpers: an event collector with bounded waits, a service in a temporary directory,
//! trial requests, and a raw HTTP/1.1 client that talks like nni's `requests` calls.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use knob_plugin_api::service::{MetricKind, ServiceEvent, TrialRequest};
use knob_training_services::{Emit, LocalService};
use serde_json::{json, Value};

/// Every wait in these tests ends by this bound; trials themselves are much quicker.
pub const WAIT: Duration = Duration::from_secs(30);

/// Collects events from any thread; tests wait on it with a bound.
#[derive(Clone, Default)]
pub struct Events(Arc<(Mutex<Vec<ServiceEvent>>, Condvar)>);

impl Events {
    pub fn push(&self, event: ServiceEvent) {
        let (events, changed) = &*self.0;
        events.lock().unwrap().push(event);
        changed.notify_all();
    }

    pub fn emitter(&self) -> Emit {
        let events = self.clone();
        Arc::new(move |event| events.push(event))
    }

    pub fn all(&self) -> Vec<ServiceEvent> {
        self.0 .0.lock().unwrap().clone()
    }

    /// Waits (at most [`WAIT`]) until `done` holds for the events so far; panics with them all
    /// if it never does.
    pub fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&[ServiceEvent]) -> bool,
    ) -> Vec<ServiceEvent> {
        let (events, changed) = &*self.0;
        let deadline = Instant::now() + WAIT;
        let mut guard = events.lock().unwrap();
        while !done(&guard) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what}; events: {:#?}",
                *guard
            );
            guard = changed.wait_timeout(guard, left).unwrap().0;
        }
        guard.clone()
    }

    /// The events of one trial once it has ended, in order.
    pub fn wait_ended(&self, trial_id: &str) -> Vec<ServiceEvent> {
        let all = self.wait_until(&format!("trial {trial_id} to end"), |events| {
            events.iter().any(|e| is_end_of(e, trial_id))
        });
        of_trial(&all, trial_id)
    }
}

pub fn trial_of(event: &ServiceEvent) -> Option<&str> {
    match event {
        ServiceEvent::TrialStarted { trial_id, .. }
        | ServiceEvent::Metric { trial_id, .. }
        | ServiceEvent::TrialEnded { trial_id, .. }
        | ServiceEvent::StartFailed { trial_id, .. }
        | ServiceEvent::PlaceAgain { trial_id, .. } => Some(trial_id),
        ServiceEvent::Warning { trial_id, .. } => trial_id.as_deref(),
        // Resource use, not the trial's protocol: the sequences the tests compare leave it out
        // (`usage_of` finds it).
        ServiceEvent::TrialUsage { .. }
        | ServiceEvent::CheckpointSaved { .. }
        | ServiceEvent::Environment { .. } => None,
    }
}

/// Whether trial `trial_id`'s `TrialStarted` arrives within `limit` (polled every 50 ms).
pub fn started_within(events: &Events, trial_id: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let started = events.all().iter().any(
            |e| matches!(e, ServiceEvent::TrialStarted { trial_id: id, .. } if id == trial_id),
        );
        if started || Instant::now() > deadline {
            return started;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The peak memory (MiB) reported for a trial, once it has ended.
pub fn usage_of(events: &[ServiceEvent], trial_id: &str) -> Option<Option<u64>> {
    events.iter().find_map(|event| match event {
        ServiceEvent::TrialUsage {
            trial_id: t,
            peak_memory_mib,
            ..
        } if t == trial_id => Some(*peak_memory_mib),
        _ => None,
    })
}

pub fn is_end_of(event: &ServiceEvent, trial_id: &str) -> bool {
    matches!(event, ServiceEvent::TrialEnded { trial_id: t, .. } if t == trial_id)
}

pub fn of_trial(events: &[ServiceEvent], trial_id: &str) -> Vec<ServiceEvent> {
    events
        .iter()
        .filter(|e| trial_of(e) == Some(trial_id))
        .cloned()
        .collect()
}

/// The metrics among `events` as `(kind, sequence, value)`.
pub fn metrics(events: &[ServiceEvent]) -> Vec<(MetricKind, u64, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Metric {
                kind,
                sequence,
                value,
                ..
            } => Some((*kind, *sequence, value.clone())),
            _ => None,
        })
        .collect()
}

pub fn warnings(events: &[ServiceEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            ServiceEvent::Warning { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// `(exit_code, signal, killed_reason, stderr_tail)` of the trial's `TrialEnded`, which must
/// be its last event.
pub fn ending(events: &[ServiceEvent]) -> (Option<i32>, Option<i32>, Option<String>, String) {
    match events.last() {
        Some(ServiceEvent::TrialEnded {
            exit_code,
            signal,
            killed_reason,
            stderr_tail,
            ..
        }) => (
            *exit_code,
            *signal,
            killed_reason.clone(),
            stderr_tail.clone(),
        ),
        other => panic!("the last event is not TrialEnded but {other:?}; all: {events:#?}"),
    }
}

/// A local service in a temporary directory, with its events collected.
pub struct Harness {
    pub service: LocalService,
    pub events: Events,
    pub dir: tempfile::TempDir,
}

impl Harness {
    pub fn new() -> Harness {
        Harness::with_args(json!({"gracePeriodSecs": 0.5}))
    }

    pub fn with_args(args: Value) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        Harness::in_dir(args, dir, "home")
    }

    /// A service whose lease ledger is `dir/<ledger>` (several harnesses may share one).
    pub fn in_dir(mut args: Value, dir: tempfile::TempDir, ledger: &str) -> Harness {
        let ledger_dir = dir.path().join(ledger);
        if let Value::Object(fields) = &mut args {
            fields
                .entry("ledgerDir")
                .or_insert_with(|| json!(ledger_dir));
        }
        let events = Events::default();
        let service = LocalService::with_emitter(&args, events.emitter()).unwrap();
        std::fs::create_dir(dir.path().join("code")).unwrap();
        Harness {
            service,
            events,
            dir,
        }
    }

    pub fn code_dir(&self) -> PathBuf {
        self.dir.path().join("code")
    }

    pub fn trial_dir(&self, trial_id: &str) -> PathBuf {
        self.dir.path().join("trials").join(trial_id)
    }

    pub fn request(&self, trial_id: &str, command: &str) -> TrialRequest {
        request(
            &self.code_dir(),
            &self.trial_dir(trial_id),
            trial_id,
            command,
        )
    }

    /// Starts the trial and waits for its end; its events, in order.
    pub fn run(&mut self, request: TrialRequest) -> Vec<ServiceEvent> {
        let trial_id = request.trial_id.clone();
        self.service.start(&request).unwrap();
        self.events.wait_ended(&trial_id)
    }
}

pub fn request(code_dir: &Path, trial_dir: &Path, trial_id: &str, command: &str) -> TrialRequest {
    TrialRequest {
        experiment_id: "exp1".into(),
        trial_id: trial_id.into(),
        sequence: 7,
        parameter_id: 42,
        parameter_label: None,
        parameters: json!({"lr": 0.01, "layers": 3, "act": "relu"}),
        environment_id: "local".into(),
        command: command.into(),
        code_dir: code_dir.to_path_buf(),
        trial_dir: trial_dir.to_path_buf(),
        gpu_indices: None,
        env: BTreeMap::new(),
        resources: Default::default(),
    }
}

/// Waits (bounded) until `path` exists, e.g. a file a trial writes once it is ready.
/// A lease of `holder`'s trial `trial` for GPU 0 of the ledger's machine `machine`, alone on it
/// (`maxTrialNumberPerGpu: 1`) and asking nothing else: what another experiment's trial holds
/// in the ledger tests.
pub fn gpu_0_lease(
    holder: &knob_gpu_sched::ledger::Holder,
    trial: &str,
    machine: &str,
) -> knob_gpu_sched::ledger::Lease {
    use knob_gpu_sched::ByteSize;
    knob_gpu_sched::ledger::Lease {
        holder: holder.clone(),
        trial: trial.into(),
        machine: machine.into(),
        gpus: vec![0],
        max_per_gpu: 1,
        gpu_memory: ByteSize::ZERO,
        host_memory: ByteSize::ZERO,
        cpu_cores: 0,
        ticket: 0,
        granted_ms: 0,
        gpu_memory_totals: Vec::new(),
        cpu_total: 0,
        host_memory_total: ByteSize::ZERO,
        process_group: None,
    }
}

pub fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) until `path` holds a whole line and returns it, trimmed. A file a shell
/// writes with `echo X > file` exists, empty, before X is in it: reading as soon as it exists
/// reads nothing one run in a few hundred on a loaded machine.
pub fn wait_for_line(path: &Path) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.ends_with('\n') {
                return text.trim().to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} never held a whole line",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` still runs (a zombie does not).
pub fn process_runs(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 2..].chars().next();
            !matches!(state, Some('Z' | 'X'))
        }
        Err(_) => false,
    }
}

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub body: String,
}

/// One request on a fresh connection, as Python's `requests.get/put` without a session sends
/// it (JSON body, `Content-Type: application/json`).
pub fn http(method: &str, url: &str, json_body: Option<&Value>) -> HttpReply {
    let rest = url.strip_prefix("http://").expect("http url");
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let address: SocketAddr = authority.parse().unwrap();
    let mut stream = TcpStream::connect_timeout(&address, WAIT).unwrap();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let body = json_body.map(Value::to_string).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: python-requests/2.31.0\r\nAccept: */*\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if json_body.is_some() {
        head.push_str("Content-Type: application/json\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    HttpReply {
        status,
        body: body.to_string(),
    }
}

/// NNI's metric command, exactly as `nni.runtime.trial_command_channel.v3` builds it (with
/// `nni.dump`'s separators).
pub fn nni_metric_command(trial_id: &str, kind: &str, sequence: u64, value: &str) -> Value {
    let metric = format!(
        r#"{{"parameter_id": 42, "trial_job_id": "{trial_id}", "type": "{kind}", "sequence": {sequence}, "value": {}}}"#,
        Value::String(value.to_string())
    );
    json!({"type": "metric", "metric": metric})
}

#[test]
fn wait_for_line_returns_what_is_written_after_the_file_appears() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("child.pid");
    let mut file = std::fs::File::create(&path).unwrap();
    // The file exists and is empty, then partly written, as a shell leaves it in between.
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        file.write_all(b"12").unwrap();
        wait.recv().unwrap();
        file.write_all(b"34\n").unwrap();
    });
    let reader = {
        let path = path.clone();
        std::thread::spawn(move || wait_for_line(&path))
    };
    // Let the reader see the partial content before the rest arrives (bounded).
    let deadline = Instant::now() + WAIT;
    while std::fs::read_to_string(&path).unwrap() != "12" {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    go.send(()).unwrap();
    writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), "1234");
}

/// A trial command that leaves its process group in two ways and writes each pid to a file in
/// the trial directory: `setsid.pid`, a `setsid` child of the trial's shell; `daemon.pid`, a
/// double-forked daemon (a subshell starts it in a session of its own and exits, so it is
/// re-parented away from the trial). Both hold no pipe of the trial. `then` runs after.
pub fn leaves_its_group_then(then: &str) -> String {
    format!(
        r#"setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$KNOB_TRIAL_DIR/setsid.pid"
( setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! > "$KNOB_TRIAL_DIR/daemon.pid" )
{then}"#
    )
}

/// The pids [`leaves_its_group_then`] wrote, once both files hold them.
pub fn escaped_pids(trial_dir: &Path) -> [i32; 2] {
    ["setsid.pid", "daemon.pid"].map(|name| wait_for_line(&trial_dir.join(name)).parse().unwrap())
}

/// Process group and parent of a live process, from `/proc/<pid>/stat`.
pub fn group_and_parent(pid: i32) -> (i32, i32) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    (fields[2].parse().unwrap(), fields[1].parse().unwrap())
}

/// Asserts that the processes of [`leaves_its_group_then`] did leave the trial's group (led by
/// `leader`), and the daemon its parent: the test is about those shapes.
pub fn assert_left_the_group(leader: i32, [setsid, daemon]: [i32; 2]) {
    for pid in [setsid, daemon] {
        assert!(process_runs(pid), "{pid} does not run");
        // `$!` is written as soon as the shell forks: the child may not have called setsid(2)
        // yet, so its leaving the group is waited for (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_and_parent(pid).0 == leader && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_ne!(
            group_and_parent(pid).0,
            leader,
            "{pid} is still in the group"
        );
    }
    assert_ne!(
        group_and_parent(daemon).1,
        leader,
        "the daemon was not re-parented"
    );
}

/// Set in the child process that [`in_child_process`] runs a test in.
const IN_CHILD_PROCESS: &str = "KNOB_TEST_IN_CHILD_PROCESS";

/// For a test that changes what is process-wide (its descriptor limit): runs the test `name`
/// (`module::test`) again, alone, in a child process with `env` added, checks that it passed
/// and returns its output. Returns `None` in that child, which goes on with the test.
pub fn in_child_process(name: &str, env: &[(&str, &str)]) -> Option<String> {
    if std::env::var_os(IN_CHILD_PROCESS).is_some() {
        return None;
    }
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture"])
        .env(IN_CHILD_PROCESS, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && text.contains("1 passed"),
        "{text}"
    );
    Some(text)
}

/// Lowers this process's descriptor limit to 256 and takes every descriptor but one, which the
/// caller's next socket takes; they are free again once the files returned are dropped.
pub fn use_up_descriptors_but_one() -> Vec<std::fs::File> {
    use nix::sys::resource::{setrlimit, Resource};
    setrlimit(Resource::RLIMIT_NOFILE, 256, 256).unwrap();
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(e) if e.raw_os_error() == Some(nix::libc::EMFILE) => break,
            Err(e) => panic!("cannot open /dev/null: {e}"),
        }
    }
    held.pop();
    held
}

/// The CPU time (user and system) this process used while the calling thread slept `period`.
pub fn cpu_used_over(period: Duration) -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let cpu = || {
        let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
        let time = |t: nix::sys::time::TimeVal| {
            Duration::new(t.tv_sec() as u64, 0) + Duration::from_micros(t.tv_usec() as u64)
        };
        time(usage.user_time()) + time(usage.system_time())
    };
    let before = cpu();
    std::thread::sleep(period);
    cpu() - before
}
