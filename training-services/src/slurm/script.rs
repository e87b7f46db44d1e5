//! The batch script of a job: `#SBATCH` lines from the job options, the setup commands, then
//! `knob-agent serve` for the job's directory, whose exit status the script writes to the
//! exit-code file.
//!
//! The script, its directory, the agent binary and the trial code are read on the compute node
//! at the paths they have here: a filesystem shared by this machine and the nodes is assumed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::args::JobOptions;

/// What one job is.
pub struct JobSpec<'a> {
    pub options: &'a JobOptions,
    /// Slurm's job name: `<jobName>-<experiment>-<key>`.
    pub name: &'a str,
    /// `knob:<experiment>:<key>`, how a later knob finds the experiment's jobs.
    pub comment: &'a str,
    /// The agent's directory (socket, log, trials of an allocation).
    pub dir: &'a Path,
    pub agent: &'a Path,
    pub orphan_timeout: Duration,
}

/// The file the job script writes the agent's exit status to, named by the job id so that a
/// reused id never reads an earlier job's file.
pub fn exit_code_file(dir: &Path, job_id: u64) -> PathBuf {
    dir.join(format!("job-{job_id}.exit"))
}

/// What the job script records about its allocation (`SLURM_JOB_GPUS`, CPUs on the node).
pub fn job_env_file(dir: &Path, job_id: u64) -> PathBuf {
    dir.join(format!("job-{job_id}.env"))
}

/// Slurm's own log of job `job_id` (stdout and stderr of the script).
pub fn job_log(dir: &Path, job_id: u64) -> PathBuf {
    dir.join(format!("slurm-{job_id}.out"))
}

/// [`job_log`] as sbatch's `--output` filename pattern: Slurm replaces `%j` with the job id,
/// and would replace any `%` of the folder's own too (`%u`, `%j`, `%%`...), so each is written
/// `%%` (a literal `%`).
fn job_log_pattern(dir: &Path) -> String {
    let dir = dir.to_string_lossy().replace('%', "%%");
    format!("{}/slurm-%j.out", dir.trim_end_matches('/'))
}

/// What an experiment folder cannot hold for Slurm, and why: sbatch reads `#SBATCH` lines up
/// to the line's end, so a line break ends the option and the rest of the path becomes a
/// command of the job script (which also makes sbatch ignore every later `#SBATCH` line); a
/// backslash in `--output` makes Slurm take the pattern literally (no `%j`), and the job
/// fails to start.
pub fn unusable_in_sbatch_path(dir: &Path) -> Option<&'static str> {
    let text = dir.to_string_lossy();
    if text.contains(['\n', '\r']) {
        Some("a line break")
    } else if text.contains('\\') {
        Some("a backslash")
    } else {
        None
    }
}

/// A value as one argument of an `#SBATCH` line. sbatch splits these lines at whitespace and
/// takes an unquoted `#` as the start of a comment; it reads double quotes and backslash
/// escapes itself (a shell never sees these lines, so shell quoting would not do). Plain words
/// stay as they are.
fn sbatch_value(value: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.,:/=+@%[]".contains(c);
    if !value.is_empty() && value.chars().all(plain) {
        return value.to_string();
    }
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Single-quotes a word for bash.
pub fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// `--mem` in whole megabytes (Slurm's default unit), at least 1.
fn mem_megabytes(bytes: u64) -> u64 {
    bytes.div_ceil(1024 * 1024).max(1)
}

/// The options of the job that runs one trial (`reuseMode: false`): the job options with
/// `--mem` from the trial's request, which is `trialMemorySize` or, after the trial ran out of
/// memory, the raised request (`maxOomRetries`) that Slurm must grant too, or the retry would
/// hit the same limit.
pub fn trial_job_options(
    options: &JobOptions,
    resources: &knob_plugin_api::service::TrialResources,
) -> JobOptions {
    let mut options = options.clone();
    if let Some(mib) = resources.memory_mib.filter(|mib| *mib > 0) {
        options.memory = Some(knob_gpu_sched::ByteSize(mib.saturating_mul(1024 * 1024)));
    }
    options
}

pub fn batch_script(spec: &JobSpec<'_>) -> String {
    let o = spec.options;
    let mut lines = vec!["#!/bin/bash".to_string()];
    let mut sbatch = |flag: &str, value: &str| {
        lines.push(format!("#SBATCH --{flag}={}", sbatch_value(value)));
    };
    sbatch("job-name", spec.name);
    sbatch("comment", spec.comment);
    let log = job_log_pattern(spec.dir);
    sbatch("output", &log);
    sbatch("error", &log);
    sbatch("ntasks", "1");
    for (flag, value) in [
        ("partition", &o.partition),
        ("account", &o.account),
        ("qos", &o.qos),
        ("time", &o.time),
        ("constraint", &o.constraint),
        ("nodes", &o.nodes),
        ("exclude", &o.exclude),
    ] {
        if let Some(value) = value {
            sbatch(flag, value);
        }
    }
    if o.gpu_number > 0 {
        sbatch("gpus", &o.gpu_number.to_string());
    }
    if let Some(cpus) = o.cpu_number {
        sbatch("cpus-per-task", &cpus.to_string());
    }
    if let Some(memory) = o.memory {
        sbatch("mem", &format!("{}M", mem_megabytes(memory.0)));
    }
    // A requeued job comes back as a fresh agent with none of its trials: knob runs them
    // elsewhere and asks for a new allocation instead (`sbatchArgs: [--requeue]` overrides,
    // the later line wins).
    lines.push("#SBATCH --no-requeue".to_string());
    for extra in &o.sbatch_args {
        let extra = extra.trim();
        if extra.is_empty() {
            continue;
        }
        lines.push(if extra.starts_with("#SBATCH") {
            extra.to_string()
        } else {
            format!("#SBATCH {extra}")
        });
    }
    let dir = spec.dir.to_string_lossy();
    lines.push(format!("cd {}", quote(&dir)));
    // Written before the setup commands, which may change the directory.
    lines.push(format!(
        "printf 'SLURM_JOB_GPUS=%s\\nSLURM_CPUS_ON_NODE=%s\\nHOST=%s\\n' \"$SLURM_JOB_GPUS\" \"$SLURM_CPUS_ON_NODE\" \"$(hostname)\" > {}/\"job-$SLURM_JOB_ID.env\"",
        quote(&dir)
    ));
    // A setup command that fails ends the job, saying which: trials run on after a failed
    // `module load` or `source venv/bin/activate` only to fail in ways that hide why. Each runs
    // in this shell (`eval`, not a subshell), so what it sets stays set for the agent; as the
    // text of one `eval`, an empty or comment-only entry, an unclosed `if` or a trailing `\`
    // is that command's own failure (a syntax error is exit 2) instead of a script that does
    // not parse at all (written inside braces, `{ }` around nothing failed every job).
    for (index, command) in o.setup_commands.iter().enumerate() {
        lines.push(format!(
            "eval {} || {{ code=$?; echo \"knob: trainingService.setupCommands[{index}] failed (exit $code): \"{} >&2; echo \"$code\" > {}/\"job-$SLURM_JOB_ID.exit\"; exit \"$code\"; }}",
            quote(command),
            quote(command.lines().next().unwrap_or_default()),
            quote(&dir)
        ));
    }
    lines.push(format!(
        "{} serve --dir {} --orphan-timeout-secs={}",
        quote(&spec.agent.to_string_lossy()),
        quote(&dir),
        spec.orphan_timeout.as_secs_f64()
    ));
    lines.push("code=$?".to_string());
    lines.push(format!(
        "echo \"$code\" > {}/\"job-$SLURM_JOB_ID.exit\"",
        quote(&dir)
    ));
    lines.push("exit \"$code\"".to_string());
    lines.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use knob_gpu_sched::ByteSize;

    #[test]
    fn options_become_sbatch_lines() {
        let options = JobOptions {
            partition: Some("gpu".into()),
            time: Some("1:00:00".into()),
            sbatch_args: vec!["--exclusive".into(), "#SBATCH --signal=USR1@60".into()],
            setup_commands: vec!["module load cuda".into()],
            job_name: "knob".into(),
            gpu_number: 2,
            cpu_number: Some(4),
            memory: Some(ByteSize(1536 * 1024 * 1024)),
            ..JobOptions::default()
        };
        let script = batch_script(&JobSpec {
            options: &options,
            name: "knob-ab-env1",
            comment: "knob:ab:env1",
            dir: Path::new("/shared/exp/slurm/env1"),
            agent: Path::new("/shared/bin/knob-agent"),
            orphan_timeout: Duration::from_secs(600),
        });
        for line in [
            "#SBATCH --job-name=knob-ab-env1",
            "#SBATCH --comment=knob:ab:env1",
            "#SBATCH --partition=gpu",
            "#SBATCH --time=1:00:00",
            "#SBATCH --gpus=2",
            "#SBATCH --cpus-per-task=4",
            "#SBATCH --mem=1536M",
            "#SBATCH --no-requeue",
            "#SBATCH --exclusive",
            "#SBATCH --signal=USR1@60",
            "eval 'module load cuda' || { code=$?; echo \"knob: trainingService.setupCommands[0] failed (exit $code): \"'module load cuda' >&2; echo \"$code\" > '/shared/exp/slurm/env1'/\"job-$SLURM_JOB_ID.exit\"; exit \"$code\"; }",
            "'/shared/bin/knob-agent' serve --dir '/shared/exp/slurm/env1' --orphan-timeout-secs=600",
        ] {
            assert!(script.lines().any(|l| l == line), "{line} missing:\n{script}");
        }
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    /// Setup commands that are empty, only a comment, or end in a `\` run (as nothing) and the
    /// agent starts with what they set; one that does not parse fails the job naming it. Inside
    /// braces, `""` was `{ }`, a syntax error of the whole script: every job failed at once.
    #[test]
    fn odd_setup_commands_run_as_bash_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("agent");
        std::fs::write(&agent, "#!/bin/sh\necho \"K=$K\" > \"$3/agent-ran\"\n").unwrap();
        std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let run = |setup: &[&str]| {
            let options = JobOptions {
                setup_commands: setup.iter().map(|c| c.to_string()).collect(),
                ..JobOptions::default()
            };
            let script = batch_script(&JobSpec {
                options: &options,
                name: "knob-ab-env1",
                comment: "knob:ab:env1",
                dir: dir.path(),
                agent: &agent,
                orphan_timeout: Duration::from_secs(600),
            });
            let _ = std::fs::remove_file(dir.path().join("agent-ran"));
            let output = std::process::Command::new("bash")
                .arg("-c")
                .arg(&script)
                .env("SLURM_JOB_ID", "7")
                .output()
                .unwrap();
            let ran = std::fs::read_to_string(dir.path().join("agent-ran")).ok();
            (
                output.status.code(),
                ran,
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        };
        let (code, ran, stderr) = run(&["", "# a comment", "export K=1", "echo set up \\"]);
        assert_eq!((code, ran.as_deref()), (Some(0), Some("K=1\n")), "{stderr}");

        let (code, ran, stderr) = run(&["export K=1", "if true; then"]);
        assert_eq!((code, ran), (Some(2), None), "{stderr}");
        assert!(
            stderr
                .contains("knob: trainingService.setupCommands[1] failed (exit 2): if true; then"),
            "{stderr}"
        );
    }

    #[test]
    fn sbatch_lines_carry_a_folder_with_spaces_quotes_hashes_and_percent_signs() {
        let options = JobOptions {
            time: Some("5".into()),
            ..JobOptions::default()
        };
        let script = batch_script(&JobSpec {
            options: &options,
            name: "knob-ab-env1",
            comment: "knob:ab:env1",
            dir: Path::new("/shared/my exp#1\t100%j \"q\"/slurm/env1"),
            agent: Path::new("/shared/bin/knob-agent"),
            orphan_timeout: Duration::from_secs(600),
        });
        // sbatch reads these as the path itself (checked by hand against Slurm 22.05, and by
        // the Slurm test `a_folder_with_spaces_quotes_and_percent_signs_runs_trials`); %%
        // stands for a % in Slurm's filename patterns.
        let log = "\"/shared/my exp#1\t100%%j \\\"q\\\"/slurm/env1/slurm-%j.out\"";
        for line in [
            format!("#SBATCH --output={log}"),
            format!("#SBATCH --error={log}"),
            "#SBATCH --job-name=knob-ab-env1".to_string(),
            "#SBATCH --time=5".to_string(),
        ] {
            assert!(
                script.lines().any(|l| l == line),
                "{line} missing:\n{script}"
            );
        }
        assert_eq!(
            job_log(Path::new("/a b/100%j"), 7),
            Path::new("/a b/100%j/slurm-7.out")
        );
        assert_eq!(unusable_in_sbatch_path(Path::new("/a b/%#\"'")), None);
    }

    #[test]
    fn a_trial_job_asks_slurm_for_the_trials_memory_request() {
        use knob_plugin_api::service::TrialResources;
        let options = JobOptions {
            memory: Some(ByteSize(1024 * 1024 * 1024)),
            ..JobOptions::default()
        };
        let script = |resources: TrialResources| {
            batch_script(&JobSpec {
                options: &trial_job_options(&options, &resources),
                name: "knob-ab-t1",
                comment: "knob:ab:t1",
                dir: Path::new("/shared/exp/slurm/t1"),
                agent: Path::new("/shared/bin/knob-agent"),
                orphan_timeout: Duration::from_secs(600),
            })
        };
        let mem = |script: String| -> Vec<String> {
            script
                .lines()
                .filter(|l| l.starts_with("#SBATCH --mem="))
                .map(str::to_string)
                .collect()
        };
        // Raised after an out-of-memory end: Slurm is asked for the new request.
        let raised = TrialResources {
            memory_mib: Some(3000),
            ..TrialResources::default()
        };
        assert_eq!(mem(script(raised)), ["#SBATCH --mem=3000M"]);
        // No request (none configured, or a core that sends none): the job options' own.
        assert_eq!(
            mem(script(TrialResources::default())),
            ["#SBATCH --mem=1024M"]
        );
        // A request without a configured trialMemorySize still reaches Slurm.
        let bare = JobOptions::default();
        let resources = TrialResources {
            memory_mib: Some(512),
            ..TrialResources::default()
        };
        assert_eq!(
            trial_job_options(&bare, &resources).memory,
            Some(ByteSize(512 * 1024 * 1024))
        );
        assert_eq!(trial_job_options(&bare, &TrialResources::default()), bare);
    }
}
