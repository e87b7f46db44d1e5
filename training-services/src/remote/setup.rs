//! Getting a host ready for its agent: where things go, whether this knob's agent binary can
//! run there, and uploading it once (named by its content hash).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::args::{Machine, RemoteArgs};
use super::ssh::{shell_quote, Connection, SshError};
use crate::agent_protocol::HostLayout;

/// The agent binary's name, on the host's PATH and beside the `knob` executable.
pub const AGENT_NAME: &str = "knob-agent";
/// Set to the agent binary to upload when it is not beside the running executable.
pub const AGENT_BINARY_VARIABLE: &str = "KNOB_AGENT_BINARY";
const SETUP_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
const AGENT_UPLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// This machine's agent binary, to upload to hosts of the same platform.
pub struct AgentBinary {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    /// Hex sha256 of `bytes`.
    pub hash: String,
}

impl AgentBinary {
    pub fn load(path: &Path) -> Result<AgentBinary, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read the agent binary {}: {e}", path.display()))?;
        let hash = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(AgentBinary {
            path: path.to_path_buf(),
            bytes,
            hash,
        })
    }

    /// `agentBinary` if given (it must exist); else `knob-agent` beside the running executable;
    /// else `$KNOB_AGENT_BINARY`; else none (hosts must have knob-agent on their PATH).
    pub fn locate(configured: Option<&Path>) -> Result<Option<AgentBinary>, String> {
        if let Some(path) = configured {
            return AgentBinary::load(path)
                .map(Some)
                .map_err(|e| format!("agentBinary: {e}"));
        }
        let beside = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|dir| dir.join(AGENT_NAME)))
            .filter(|path| path.is_file());
        let from_variable = std::env::var_os(AGENT_BINARY_VARIABLE)
            .map(PathBuf::from)
            .filter(|path| path.is_file());
        match beside.or(from_variable) {
            Some(path) => AgentBinary::load(&path).map(Some),
            None => Ok(None),
        }
    }
}

/// Where things are on one host, as absolute paths there.
#[derive(Debug, Clone)]
pub struct HostPaths {
    pub root: String,
    pub agent: String,
    pub environment_dir: String,
    /// `PATH` of a command run over SSH there, for `pythonPath` to go in front of.
    pub path_variable: String,
    /// The login user's home there, for a `pythonPath` written with `~`.
    pub home: String,
}

/// `python_path` (one folder, or several joined by `:`) with each folder's leading `~` made the
/// host's `home`, as the shell does in NNI's unquoted `export PATH=<pythonPath>:$PATH`. Kept
/// as `~`, `PATH` held a folder no `execvp` finds: bash's own lookup expands it, but
/// `#!/usr/bin/env python3` scripts, `env python3` and a trial's `subprocess` ran the system's
/// Python instead.
pub fn expand_python_path(python_path: &str, home: &str) -> String {
    python_path
        .split(':')
        .map(|folder| match folder {
            "~" => home.to_string(),
            _ => match folder.strip_prefix("~/") {
                Some(rest) => format!("{}/{rest}", home.trim_end_matches('/')),
                None => folder.to_string(),
            },
        })
        .collect::<Vec<_>>()
        .join(":")
}

/// "Linux x86_64", as `uname -sm` prints it, for this machine.
pub fn local_platform() -> String {
    let os = match std::env::consts::OS {
        "linux" => "Linux",
        "macos" => "Darwin",
        "freebsd" => "FreeBSD",
        other => other,
    };
    format!("{os} {}", std::env::consts::ARCH)
}

/// `uname -sm` output in a form comparable with [`local_platform`].
fn normalize_platform(uname: &str) -> String {
    let mut parts = uname.split_whitespace();
    let os = parts.next().unwrap_or("");
    let arch = match parts.next().unwrap_or("") {
        "arm64" => "aarch64",
        "amd64" => "x86_64",
        other => other,
    };
    format!("{os} {arch}")
}

fn resolve_root(agent_root: &str, home: &str) -> String {
    if agent_root == "~" {
        home.to_string()
    } else if let Some(rest) = agent_root.strip_prefix("~/") {
        format!("{}/{rest}", home.trim_end_matches('/'))
    } else if agent_root.starts_with('/') {
        agent_root.to_string()
    } else {
        format!("{}/{agent_root}", home.trim_end_matches('/'))
    }
}

/// Finds out the host's platform and home, and makes sure a compatible agent is there.
pub async fn prepare_host(
    connection: &Connection,
    machine: &Machine,
    args: &RemoteArgs,
    binary: Option<&AgentBinary>,
) -> Result<HostPaths, SshError> {
    let target = machine.target();
    let setup_error = |what: String| SshError::Setup {
        target: target.clone(),
        what,
    };
    let probe = connection
        .run(
            r#"uname -sm; printf '%s\n' "$HOME"; printf '%s\n' "$PATH""#,
            None,
            SETUP_COMMAND_TIMEOUT,
        )
        .await?;
    let text = probe.stdout_text();
    let mut lines = text.lines();
    let (Some(uname), Some(home), path_variable) = (lines.next(), lines.next(), lines.next())
    else {
        // What the login printed instead of running the probe (a nologin shell's "This account
        // is currently not available.", a forced command of authorized_keys) is the answer:
        // only stderr was said, such as "Could not chdir to home directory", or "exit status 0".
        let said = text.trim();
        let what = if said.is_empty() {
            format!("`uname -sm` failed there: {}", probe.failure_summary())
        } else {
            format!(
                "knob's commands did not run there: the login printed {:?} ({}); is {} an account with a login shell, and its key free of a forced command in authorized_keys?",
                said.chars().take(200).collect::<String>(),
                probe.failure_summary(),
                machine.user
            )
        };
        return Err(SshError::Session { target, what });
    };
    let root = resolve_root(&args.agent_root, home.trim());
    let layout = HostLayout {
        root: PathBuf::from(&root),
    };
    let environment_dir = layout
        .environment_dir(&args.experiment_id, &machine.environment_id())
        .to_string_lossy()
        .into_owned();
    let remote_platform = normalize_platform(uname);
    let here = local_platform();
    let version = env!("CARGO_PKG_VERSION");

    let agent = match binary {
        Some(binary) if remote_platform == here => {
            let agent = upload_agent(connection, &layout, binary).await?;
            // An agent that cannot run (its folder on a `noexec` mount) was found out only by
            // its stream closing before the hello, which said nothing of why.
            let ran = connection
                .run(
                    &format!("{} --version", shell_quote(&agent)),
                    None,
                    SETUP_COMMAND_TIMEOUT,
                )
                .await?;
            if ran.status != Some(0) {
                return Err(setup_error(format!(
                    "cannot run the uploaded {agent}: {}; if agentRoot {root} is on a filesystem mounted noexec, set agentRoot to a folder where programs may run",
                    ran.failure_summary()
                )));
            }
            agent
        }
        _ => match agent_on_path(connection, version).await? {
            Some(path) => path,
            None if remote_platform != here => {
                return Err(setup_error(format!(
                    "host {} is {}, this knob is {here}: put {AGENT_NAME} {version} for it on the host's PATH",
                    machine.host_port(),
                    uname.trim()
                )))
            }
            None => {
                return Err(setup_error(format!(
                    "no {AGENT_NAME} binary to upload (not beside this executable, agentBinary and ${AGENT_BINARY_VARIABLE} unset) and none of version {version} on the host's PATH; build it with `cargo build -p knob-training-services --bin {AGENT_NAME}` or set agentBinary"
                )))
            }
        },
    };
    Ok(HostPaths {
        root,
        agent,
        environment_dir,
        path_variable: path_variable
            .unwrap_or("/usr/local/bin:/usr/bin:/bin")
            .to_string(),
        home: home.trim().to_string(),
    })
}

/// Uploads the agent to `bin/knob-agent-<hash>` unless it is there; returns its path.
async fn upload_agent(
    connection: &Connection,
    layout: &HostLayout,
    binary: &AgentBinary,
) -> Result<String, SshError> {
    let destination = layout.agent_binary(&binary.hash);
    let destination_text = destination.to_string_lossy().into_owned();
    let quoted = shell_quote(&destination_text);
    let size = binary.bytes.len();
    // Not only there but whole: an older knob killed while it uploaded published the part that
    // had arrived, and `test -x` alone took it for the agent on every later run.
    let present = connection
        .run(
            &format!("{} && echo present", is_whole(&quoted, size)),
            None,
            SETUP_COMMAND_TIMEOUT,
        )
        .await?;
    if present.stdout_text().trim() == "present" {
        return Ok(destination_text);
    }
    let directory = destination
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    let command = upload_command(&destination_text, &directory, size);
    let output = connection
        .run(&command, Some(&binary.bytes), AGENT_UPLOAD_TIMEOUT)
        .await?;
    if output.status != Some(0) || output.stdout_text().trim() != "uploaded" {
        return Err(SshError::Session {
            target: connection.target.clone(),
            what: format!(
                "uploading {} to {destination_text} failed: {}",
                binary.path.display(),
                output.failure_summary()
            ),
        });
    }
    knob_plugin_api::log::info(&format!(
        "training service remote: {}: uploaded {} ({} bytes) to {destination_text}",
        connection.target,
        binary.path.display(),
        binary.bytes.len()
    ));
    Ok(destination_text)
}

/// A shell test that `quoted` (a path, quoted) is an executable file of `size` bytes.
fn is_whole(quoted: &str, size: usize) -> String {
    // `$n` unquoted: `wc -c` pads its count with blanks on some systems.
    format!("test -x {quoted} && n=$(wc -c < {quoted}) && test $n -eq {size}")
}

/// The shell command that writes its input, the agent of `size` bytes, to `destination` (in
/// `directory`) and prints `uploaded`.
///
/// Written to a temporary name and published only once all `size` bytes arrived: when knob
/// dies (or its experiment ends) while it uploads, the SSH channel closes, `cat` reads that as
/// the end of its input and succeeds, and the part that had arrived was published as the
/// agent, which could never run. Then linked under its final name only if no other upload got
/// there first: hosts that share a home folder (NFS) upload at the same time, and replacing the
/// binary under an agent already started from it leaves that agent's own path "(deleted)",
/// which it needs to start its daemon. One there that is not whole (left by an older knob) is
/// replaced: no agent can run from it. `mv` also where the folder takes no hard links. The
/// temporary file goes however the upload ends (a full disk left one that kept the disk full
/// for every later try), and those of uploads killed outright go after 10 minutes.
fn upload_command(destination: &str, directory: &str, size: usize) -> String {
    let quoted = shell_quote(destination);
    format!(
        "tmp={quoted}.part.$$; trap 'rm -f \"$tmp\"' EXIT; trap 'exit 1' HUP INT TERM; \
         mkdir -p {dir} && {{ find {dir} -maxdepth 1 -name '*.part.*' -mmin +10 -exec rm -f {{}} + 2>/dev/null; true; }} && \
         cat > \"$tmp\" && got=$(wc -c < \"$tmp\") && \
         {{ test $got -eq {size} || {{ echo \"only $got of {size} bytes arrived\" >&2; exit 1; }}; }} && \
         chmod 755 \"$tmp\" && {{ ln \"$tmp\" {quoted} 2>/dev/null || {whole} || mv -f \"$tmp\" {quoted}; }} && echo uploaded",
        dir = shell_quote(directory),
        whole = is_whole(&quoted, size),
    )
}

/// `knob-agent` on the host's PATH if its `--version` names this knob's version.
async fn agent_on_path(connection: &Connection, version: &str) -> Result<Option<String>, SshError> {
    let output = connection
        .run(
            &format!("path=$(command -v {AGENT_NAME}) && printf '%s\\n' \"$path\" && \"$path\" --version"),
            None,
            SETUP_COMMAND_TIMEOUT,
        )
        .await?;
    let text = output.stdout_text();
    let mut lines = text.lines();
    let (Some(path), Some(reported)) = (lines.next(), lines.next()) else {
        return Ok(None);
    };
    let compatible = reported
        .split_whitespace()
        .any(|word| word.trim_start_matches('v') == version);
    Ok(compatible.then(|| path.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_and_platforms() {
        assert_eq!(resolve_root("~/.knob", "/home/me"), "/home/me/.knob");
        assert_eq!(resolve_root("/srv/knob", "/home/me"), "/srv/knob");
        assert_eq!(resolve_root("knob", "/home/me/"), "/home/me/knob");
        assert_eq!(normalize_platform("Darwin arm64\n"), "Darwin aarch64");
        assert_eq!(normalize_platform("Linux x86_64"), "Linux x86_64");
    }

    #[test]
    fn a_python_path_under_home_is_made_absolute_folder_by_folder() {
        let expand = |path| expand_python_path(path, "/home/me/");
        assert_eq!(expand("~/venv/bin"), "/home/me/venv/bin");
        assert_eq!(expand("~"), "/home/me/");
        assert_eq!(expand("/opt/py/bin:~/bin"), "/opt/py/bin:/home/me/bin");
        // Another user's home is not known here; a relative folder is the trial's.
        assert_eq!(expand("~bob/bin:venv/bin"), "~bob/bin:venv/bin");
    }

    /// Runs the upload command with `input` as what arrived, as the host's shell does.
    fn upload(destination: &Path, input: &[u8], size: usize) -> std::process::Output {
        use std::io::Write;
        let command = upload_command(
            destination.to_str().unwrap(),
            destination.parent().unwrap().to_str().unwrap(),
            size,
        );
        let mut shell = std::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        shell.stdin.take().unwrap().write_all(input).unwrap();
        shell.wait_with_output().unwrap()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// An upload cut short (knob killed, its channel closed: `cat` sees the end of its input
    /// and succeeds) publishes nothing and leaves nothing; it published the part that arrived
    /// as the agent, which no later run could use.
    #[test]
    fn an_upload_cut_short_publishes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let destination = dir.path().join("bin").join("knob-agent-abc");
        let agent = vec![7u8; 100_000];
        let output = upload(&destination, &agent[..65_536], agent.len());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains("only 65536 of 100000 bytes arrived"),
            "{stderr}"
        );
        assert_eq!(names_in(&dir.path().join("bin")), Vec::<String>::new());
    }

    /// A part of the agent published by an older knob is replaced by the whole one; a whole one
    /// there is kept as it is (an agent may be running from it).
    #[test]
    fn a_part_published_before_is_replaced_and_a_whole_one_kept() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let destination = dir.path().join("bin").join("knob-agent-abc");
        let agent = vec![7u8; 100_000];
        std::fs::write(&destination, &agent[..4096]).unwrap();
        std::fs::set_permissions(&destination, std::fs::Permissions::from_mode(0o755)).unwrap();

        let output = upload(&destination, &agent, agent.len());
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            "uploaded",
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(std::fs::read(&destination).unwrap(), agent);
        assert_eq!(names_in(&dir.path().join("bin")), ["knob-agent-abc"]);

        let inode = std::fs::metadata(&destination).unwrap().ino();
        let output = upload(&destination, &agent, agent.len());
        assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "uploaded");
        assert_eq!(std::fs::metadata(&destination).unwrap().ino(), inode);
        assert_eq!(names_in(&dir.path().join("bin")), ["knob-agent-abc"]);
    }
}
