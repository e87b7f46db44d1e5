//! `GET /trials/{id}/logs/{stdout|stderr|trial.log}`: the tail of a trial's output files.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::reads::{number_param, params, QueryParams};
use super::{ApiError, ApiState};

const LOG_NAMES: [&str; 3] = ["stdout", "stderr", "trial.log"];
const DEFAULT_TAIL_BYTES: u64 = 1 << 20;
const MAX_TAIL_BYTES: u64 = 16 << 20;

pub(super) async fn trial_log(
    State(state): State<ApiState>,
    Path((trial_id, name)): Path<(String, String)>,
    query: QueryParams,
) -> Result<Response, ApiError> {
    let params = params(query)?;
    if !LOG_NAMES.contains(&name.as_str()) {
        return Err(ApiError::not_found(format!(
            "no log {name:?}: a trial has stdout, stderr and trial.log"
        )));
    }
    let tail = number_param(&params, "tail")?
        .unwrap_or(DEFAULT_TAIL_BYTES)
        .min(MAX_TAIL_BYTES);
    let id = trial_id.clone();
    // The id must be a trial of the store before it becomes part of a path.
    let row = state
        .read(move |reader| reader.trial(&id))
        .await?
        .ok_or_else(|| state.no_trial(&trial_id))?;
    let attempt = match number_param(&params, "attempt")? {
        Some(n) if n == 0 || n > u64::from(row.attempts.max(1)) => {
            return Err(super::reads::no_such_attempt(&trial_id, row.attempts))
        }
        Some(n) => n,
        None => u64::from(row.attempts.max(1)),
    };
    let mut path: PathBuf = state.config().dir.join("trials").join(&trial_id);
    if attempt >= 2 {
        path.push(format!("attempt-{attempt}"));
    }
    let attempt_dir = path.clone();
    path.push(&name);
    // A trial that ran on a machine that does not share this folder (an SSH host) has no folder
    // here at all: its files are there, which is said rather than "wrote no stdout" (this
    // machine's trials, and a cluster's over its shared filesystem, write into this folder).
    let elsewhere = row.environment_id.clone().filter(|_| !attempt_dir.exists());
    // "(yet)" only while the attempt can still write it: a finished trial that never wrote
    // trial.log (only NNI's trial library writes one) will not have one.
    let still_running = row.ended_ms.is_none() && attempt == u64::from(row.attempts.max(1));
    let text = tokio::task::spawn_blocking(move || read_tail(&path, tail))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound if elsewhere.is_some() => ApiError::not_found(format!(
                "trial {trial_id} ran on {}: its {name} is in its folder there (on an SSH host, under its agentRoot: experiments/<experiment id>/<environment>/trials/{trial_id}/), which knob does not copy here",
                elsewhere.as_deref().unwrap_or_default()
            )),
            std::io::ErrorKind::NotFound if still_running => {
                ApiError::not_found(format!("trial {trial_id} has written no {name} yet"))
            }
            std::io::ErrorKind::NotFound => ApiError::not_found(format!(
                "trial {trial_id} wrote no {name}{}",
                if name == "trial.log" {
                    " (only trials that use NNI's trial library write one)"
                } else {
                    ""
                }
            )),
            std::io::ErrorKind::InvalidInput => ApiError::conflict(format!(
                "trial {trial_id}'s {name} is not served: {e}"
            )),
            _ => ApiError::internal(format!("cannot read {name} of trial {trial_id}: {e}")),
        })?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// The last `tail` bytes of a file, as text (invalid UTF-8 replaced). Only a regular file: the
/// trial may have left anything at these paths, such as a FIFO (whose `open` waited for a
/// writer for ever, holding a thread of the blocking pool each time it was asked for) or a
/// link to `/dev/zero` (whose size reads as 0: it was read to the end, until memory ran out).
/// So the last component is not followed, the `open` does not wait, and anything else is an
/// `InvalidInput` error that says what was there.
fn read_tail(path: &std::path::Path, tail: u64) -> std::io::Result<String> {
    let refused = |what: &str| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("it is {what}; knob serves only a regular file there"),
        )
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused("a symbolic link"),
            _ => e,
        })?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        let kind = metadata.file_type();
        return Err(refused(if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() || kind.is_block_device() {
            "a device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        }));
    }
    let size = metadata.len();
    if size > tail {
        file.seek(SeekFrom::Start(size - tail))?;
    }
    // Bounded even so: the trial may still be appending.
    let mut bytes = Vec::with_capacity(size.min(tail) as usize);
    file.take(tail).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    /// `read_tail` off the test's thread: without the refusal, a FIFO blocked its `open` for
    /// ever and a link to /dev/zero read until memory ran out.
    fn read_tail_within(path: &std::path::Path, tail: u64) -> std::io::Result<String> {
        let (sender, receiver) = mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || sender.send(read_tail(&path, tail)));
        receiver
            .recv_timeout(Duration::from_secs(10))
            .expect("read_tail did not return")
    }

    #[test]
    fn read_tail_serves_the_end_of_a_regular_file_and_refuses_anything_else() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdout");
        std::fs::write(&log, "first\nlast\n").unwrap();
        assert_eq!(read_tail_within(&log, 5).unwrap(), "last\n");

        let fifo = dir.path().join("trial.log");
        mkfifo(&fifo);
        let zero = dir.path().join("stderr");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        for (path, what) in [(&fifo, "a FIFO"), (&zero, "a symbolic link")] {
            let error = read_tail_within(path, 10).unwrap_err();
            assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput);
            assert_eq!(
                error.to_string(),
                format!("it is {what}; knob serves only a regular file there")
            );
        }
    }

    fn mkfifo(path: &std::path::Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo {}: {made}", path.display());
    }
}
