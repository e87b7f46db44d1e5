//! Trial processes: `/bin/bash -c <command>` as the leader of a new process group, signals to
//! the whole group, and the tail of its stderr.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
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

/// Starts `command` under `/bin/bash -c` in `code_dir`, in a process group of its own (so the
/// whole tree it starts can be signalled at once), with `env` added to knob's environment,
/// stdin closed, stdout piped to the caller, and stderr into `stderr`.
///
/// Must be called inside a tokio runtime.
pub fn spawn_in_own_group(
    command: &str,
    code_dir: &Path,
    env: &[(String, OsString)],
    stderr: File,
) -> std::io::Result<Child> {
    let mut bash = Command::new("/bin/bash");
    bash.arg("-c")
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
    bash.envs(env.iter().map(|(k, v)| (k, v)));
    bash.spawn()
}

/// Sends `signal` to every process of group `pgid`; false when the group is gone.
pub fn signal_group(pgid: u32, signal: Signal) -> bool {
    let Ok(pgid) = i32::try_from(pgid) else {
        return false;
    };
    killpg(Pid::from_raw(pgid), signal).is_ok()
}

/// Whether a process of group `pgid` still runs. Zombies do not count: an orphan that init
/// has not reaped yet (or never will, in a container without a real init) is finished.
pub fn group_has_live_members(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    if killpg(Pid::from_raw(raw), None).is_err() {
        return false;
    }
    match std::fs::read_dir("/proc") {
        Ok(entries) => entries.flatten().any(|entry| {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                return false;
            };
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parse_state_and_group(&stat))
                .is_some_and(|(state, group)| group == pgid && state != 'Z' && state != 'X')
        }),
        // Without /proc (not Linux), a group that answers signals is taken as alive.
        Err(_) => true,
    }
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

/// The last [`STDERR_TAIL_LINES`] lines of the file at `path`, read from at most its last
/// [`STDERR_TAIL_BYTES`] bytes; empty when it cannot be read.
pub fn stderr_tail(path: &Path) -> String {
    let Ok(mut file) = File::open(path) else {
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

    #[test]
    fn stat_lines_with_odd_names() {
        let stat = "4242 (a) b (c)) S 1 4200 4200 0 -1 4194560";
        assert_eq!(parse_state_and_group(stat), Some(('S', 4200)));
        assert_eq!(parse_state_and_group("1 (x) Z 0 7 7"), Some(('Z', 7)));
        assert_eq!(parse_state_and_group("garbage"), None);
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
