//! Slurm's command-line tools, called and parsed: `sbatch --parsable` (rate-limited, retried on
//! transient errors), one `squeue` call for every job of the service, `scancel`, and
//! `scontrol show job` for a job that has left `squeue`'s list.
//!
//! Why not `sacct`: without accounting storage (`AccountingStorageType=accounting_storage/none`,
//! as on the CI cluster and many small clusters) it has no data. Job state comes from `squeue`
//! while slurmctld remembers the job (`MinJobAge`, 300 s by default, after its end), then from
//! the exit-code file the job script writes, then from `scontrol show job`.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::process::Command;

/// How long one Slurm command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// `sbatch` attempts on a transient error, with a doubling pause from [`RETRY_PAUSE`].
const SBATCH_ATTEMPTS: u32 = 5;
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// `squeue --format` of [`squeue`]: fields separated by `|`, the comment last (it may hold `|`).
const SQUEUE_FORMAT: &str = "%i|%j|%T|%r|%e|%k";
/// squeue's times (`%e`, the end time) as seconds since the epoch (`strftime`'s `%s`): the
/// default format is the node's local time, with neither zone nor offset.
const TIME_FORMAT: (&str, &str) = ("SLURM_TIME_FORMAT", "%s");

/// A job's state as Slurm names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    Pending,
    /// RUNNING, CONFIGURING, COMPLETING, SUSPENDED...: the allocation exists.
    Running(String),
    Completed,
    Failed,
    Cancelled,
    Timeout,
    Preempted,
    NodeFail,
    OutOfMemory,
    /// BOOT_FAIL, DEADLINE, SPECIAL_EXIT, REVOKED, ...: ended, and not by the job itself.
    OtherEnd(String),
}

impl JobState {
    pub fn parse(text: &str) -> JobState {
        // `scontrol` may add flags ("CANCELLED by 0").
        let word = text.split_whitespace().next().unwrap_or("");
        match word {
            "PENDING" | "REQUEUED" | "REQUEUE_FED" | "REQUEUE_HOLD" | "RESV_DEL_HOLD" => {
                JobState::Pending
            }
            "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "STOPPED" | "SIGNALING"
            | "STAGE_OUT" | "RESIZING" => JobState::Running(word.to_string()),
            "COMPLETED" => JobState::Completed,
            "FAILED" => JobState::Failed,
            "CANCELLED" => JobState::Cancelled,
            "TIMEOUT" => JobState::Timeout,
            "PREEMPTED" => JobState::Preempted,
            "NODE_FAIL" => JobState::NodeFail,
            "OUT_OF_MEMORY" => JobState::OutOfMemory,
            other => JobState::OtherEnd(other.to_string()),
        }
    }

    pub fn has_ended(&self) -> bool {
        !matches!(self, JobState::Pending | JobState::Running(_))
    }

    pub fn name(&self) -> &str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running(word) | JobState::OtherEnd(word) => word,
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::Preempted => "PREEMPTED",
            JobState::NodeFail => "NODE_FAIL",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
        }
    }
}

/// One line of `squeue`.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub id: u64,
    pub name: String,
    pub state: JobState,
    /// Why it is pending (`Resources`, `Priority`, `ReqNodeNotAvail, ...`), `None` if none.
    pub reason: Option<String>,
    /// When the job ends, as Slurm has it now (`EndTime`: its start plus its time limit, for a
    /// running job; moved by `scontrol update TimeLimit=`). `None`: unlimited or not known.
    /// The time left is taken from it at each use: a time left read at a poll was stale by up
    /// to a poll's interval when a trial was placed, and an allocation about to end took it.
    pub ends_at: Option<std::time::SystemTime>,
    pub comment: String,
}

/// Parses `squeue --noheader --format=` [`SQUEUE_FORMAT`] output; lines that do not parse
/// (a warning squeue printed) are skipped.
pub fn parse_squeue(text: &str) -> Vec<JobRow> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.splitn(6, '|');
            let id = fields.next()?.trim().parse().ok()?;
            let name = fields.next()?.to_string();
            let state = JobState::parse(fields.next()?);
            let reason = fields.next()?.trim();
            let reason = (!reason.is_empty() && reason != "None").then(|| reason.to_string());
            let ends_at = parse_epoch_seconds(fields.next()?);
            let comment = fields.next().unwrap_or("").to_string();
            Some(JobRow {
                id,
                name,
                state,
                reason,
                ends_at,
                comment,
            })
        })
        .collect()
}

/// A time squeue printed with [`TIME_FORMAT`]; `None` for `Unknown`, `N/A`, `NONE` (no end:
/// an unlimited job, or one not started).
fn parse_epoch_seconds(text: &str) -> Option<std::time::SystemTime> {
    let seconds: u64 = text.trim().parse().ok()?;
    std::time::SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// Slurm's `[days-]hours:minutes:seconds`, `minutes:seconds` or `minutes`; `None` for
/// `UNLIMITED`, `INVALID`, `NOT_SET`, a time too long for a [`Duration`] or anything else.
pub fn parse_slurm_time(text: &str) -> Option<Duration> {
    slurm_seconds(text)
        .and_then(|seconds| u64::try_from(seconds).ok())
        .map(Duration::from_secs)
}

/// The seconds a Slurm time means, in `u128` so that no number of digits a u64 holds can
/// overflow it (squeue's output and the config are read by the same code; an overflow would
/// panic in a debug build and wrap into a wrong time in a release build).
pub fn slurm_seconds(text: &str) -> Option<u128> {
    let text = text.trim();
    let (days, rest) = match text.split_once('-') {
        Some((days, rest)) => (u128::from(days.parse::<u64>().ok()?), rest),
        None => (0, text),
    };
    let parts: Vec<u128> = rest
        .split(':')
        .map(|p| p.parse::<u64>().ok().map(u128::from))
        .collect::<Option<_>>()?;
    let seconds = match parts.as_slice() {
        [m] if days == 0 => m * 60,
        [h] => h * 3600,
        [m, s] if days == 0 => m * 60 + s,
        [h, m] => h * 3600 + m * 60,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return None,
    };
    Some(days * 86400 + seconds)
}

/// Parses `scontrol show job` output into its `Key=Value` fields (values without spaces; a
/// few, like `Reason`, are cut at the first space).
pub fn parse_scontrol(text: &str) -> HashMap<String, String> {
    text.split_whitespace()
        .filter_map(|token| token.split_once('='))
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

/// Runs one Slurm command, bounded; `Err` holds one line with what it printed. Without knob's
/// secret variables: `sbatch` copies its environment into the job (`--export=ALL`), where the
/// setup commands run and slurmctld keeps it.
async fn run(program: &str, args: &[String]) -> Result<String, String> {
    run_with(program, args, &[]).await
}

/// [`run`] with `env` set for the command.
async fn run_with(program: &str, args: &[String], env: &[(&str, &str)]) -> Result<String, String> {
    let mut command = Command::new(program);
    command.args(args).kill_on_drop(true);
    command.envs(env.iter().copied());
    crate::process::remove_secret_variables(&mut command);
    let output = match tokio::time::timeout(COMMAND_TIMEOUT, command.output()).await {
        Err(_) => {
            return Err(format!(
                "{program} did not answer within {} s",
                COMMAND_TIMEOUT.as_secs()
            ))
        }
        Ok(Err(e)) => {
            return Err(format!(
                "cannot run {program}: {e} (is Slurm installed and on PATH?)"
            ))
        }
        Ok(Ok(output)) => output,
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let said: Vec<&str> = stderr
            .lines()
            .chain(stdout.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        Err(if said.is_empty() {
            format!("{program} exited with {}", output.status)
        } else {
            said.join(" | ")
        })
    }
}

/// Whether an `sbatch` failure is worth retrying: slurmctld busy or briefly unreachable.
fn is_transient(message: &str) -> bool {
    [
        "Socket timed out",
        "Resource temporarily unavailable",
        "Unable to contact slurm controller",
        "Zero Bytes were transmitted",
        "slurm_persist_conn",
        "Connection refused",
        "did not answer within",
        "try again",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// Submits a job script; spaced at least `min_interval` after the previous submission.
pub struct Submitter {
    min_interval: Duration,
    last: tokio::sync::Mutex<Option<Instant>>,
}

impl Submitter {
    pub fn new(min_interval: Duration) -> Submitter {
        Submitter {
            min_interval,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// `sbatch --parsable SCRIPT`: the job id, or sbatch's own words (quoted) on failure.
    pub async fn submit(&self, script: &Path) -> Result<u64, String> {
        let mut last = self.last.lock().await;
        let mut pause = RETRY_PAUSE;
        let mut attempt = 1;
        loop {
            if let Some(at) = *last {
                let since = at.elapsed();
                if since < self.min_interval {
                    tokio::time::sleep(self.min_interval - since).await;
                }
            }
            *last = Some(Instant::now());
            let args = vec![
                "--parsable".to_string(),
                script.to_string_lossy().into_owned(),
            ];
            match run("sbatch", &args).await {
                Ok(out) => {
                    // `--parsable` prints "id" or "id;cluster".
                    let id = out.trim().split(';').next().unwrap_or("").trim();
                    return id
                        .parse()
                        .map_err(|_| format!("sbatch printed {:?}, not a job id", out.trim()));
                }
                Err(why) if is_transient(&why) && attempt < SBATCH_ATTEMPTS => {
                    knob_plugin_api::log::warn(&format!(
                        "training service slurm: sbatch failed ({why}); retrying in {} ms (attempt {attempt} of {SBATCH_ATTEMPTS})",
                        pause.as_millis()
                    ));
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                Err(why) => return Err(why),
            }
        }
    }
}

/// Every job of this user that slurmctld still knows, in one call.
pub async fn squeue() -> Result<Vec<JobRow>, String> {
    let args = vec![
        "--me".to_string(),
        "--noheader".to_string(),
        "--states=all".to_string(),
        format!("--format={SQUEUE_FORMAT}"),
    ];
    run_with("squeue", &args, &[TIME_FORMAT])
        .await
        .map(|out| parse_squeue(&out))
}

/// Cancels jobs, all in one call; jobs already gone are not an error.
pub async fn scancel(ids: &[u64]) -> Result<(), String> {
    if ids.is_empty() {
        return Ok(());
    }
    let mut args = vec!["--quiet".to_string()];
    args.extend(ids.iter().map(u64::to_string));
    run("scancel", &args).await.map(|_| ())
}

/// `scontrol show job ID`'s fields, `None` when slurmctld no longer knows the job.
pub async fn show_job(id: u64) -> Option<HashMap<String, String>> {
    let args = vec![
        "show".to_string(),
        "job".to_string(),
        "--oneliner".to_string(),
        id.to_string(),
    ];
    run("scontrol", &args)
        .await
        .ok()
        .map(|out| parse_scontrol(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeue_lines_parse() {
        let rows = parse_squeue(
            "12|knob-ab-env1|PENDING|Resources|N/A|knob:ab:env1\n\
             13|knob-ab-env2|RUNNING|None|1796176755|knob:ab:env2|x\n\
             14|knob-ab-env3|RUNNING|None|Unknown|knob:ab:env3\n\
             squeue: warning: something\n",
        );
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].state, JobState::Pending);
        assert_eq!(rows[0].reason.as_deref(), Some("Resources"));
        assert_eq!(rows[0].ends_at, None);
        assert_eq!(rows[1].reason, None);
        assert_eq!(
            rows[1].ends_at,
            Some(std::time::UNIX_EPOCH + Duration::from_secs(1796176755))
        );
        assert_eq!(rows[2].ends_at, None);
        assert_eq!(rows[1].comment, "knob:ab:env2|x");
    }

    #[test]
    fn slurm_times_parse() {
        assert_eq!(parse_slurm_time("5"), Some(Duration::from_secs(300)));
        assert_eq!(parse_slurm_time("1:05"), Some(Duration::from_secs(65)));
        assert_eq!(parse_slurm_time("2:00:01"), Some(Duration::from_secs(7201)));
        assert_eq!(
            parse_slurm_time("1-02:00:00"),
            Some(Duration::from_secs(93600))
        );
        assert_eq!(parse_slurm_time("UNLIMITED"), None);
        assert_eq!(parse_slurm_time("INVALID"), None);
        // Too long for a Duration's seconds: none (it overflowed: a panic, or a wrong time).
        assert_eq!(parse_slurm_time("307445734561825861"), None);
        assert_eq!(parse_slurm_time("213503982334602-0"), None);
        assert_eq!(parse_slurm_time("5124095576030432:0:0"), None);
    }

    #[test]
    fn states_read_as_knob_needs() {
        assert!(JobState::parse("CANCELLED by 0").has_ended());
        assert_eq!(JobState::parse("CANCELLED by 0"), JobState::Cancelled);
        assert!(!JobState::parse("COMPLETING").has_ended());
        assert!(JobState::parse("BOOT_FAIL").has_ended());
    }
}
