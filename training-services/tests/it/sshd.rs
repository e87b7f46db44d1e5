//! A real OpenSSH server on 127.0.0.1 for tests: its own port, host key, authorized keys and
//! config, run in the foreground (`sshd -D -e`) by the test itself.
//!
//! Self-contained (std only, and `prerequisite.rs` beside it) so that other crates' tests can
//! include it with `#[path = "../../../training-services/tests/it/sshd.rs"] mod sshd;`.
//!
//! Password login as root without touching the real `/etc/shadow`: sshd runs inside
//! `unshare --mount`, with a generated shadow file (root's password hashed by
//! `openssl passwd -6`) bind-mounted over `/etc/shadow` in that mount namespace only, and
//! `UsePAM no` so that sshd checks the shadow file itself.
//!
//! Every session started through a fixture's sshd carries `KNOB_TEST_SSHD_MARK=<its dir>` in
//! its environment (sshd's `SetEnv`); processes that outlive their session (knob-agent
//! daemons, their trials) keep it, which is how [`Sshd::kill_host`] finds them.
#![allow(dead_code)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MARK_VARIABLE: &str = "KNOB_TEST_SSHD_MARK";
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// The sshd binary ([`crate::prerequisite::SSHD`]), or `None` after the test said it skips:
/// the test returns.
pub fn sshd_binary() -> Option<PathBuf> {
    crate::prerequisite::SSHD.path()
}

/// Whether password login can be set up here (root, `unshare` and `openssl`); when it cannot,
/// the test was reported skipped (or failed under `KNOB_TEST_REQUIRE_ALL=1`) and returns.
pub fn password_login() -> bool {
    match password_login_unavailable() {
        Some(why) => {
            crate::prerequisite::missing(&why);
            false
        }
        None => true,
    }
}

/// Whether a host with a small disk of its own ([`SshdOptions::disk_bytes`]) can be set up here
/// (root and `unshare`); when it cannot, the test was reported skipped (or failed under
/// `KNOB_TEST_REQUIRE_ALL=1`) and returns.
pub fn small_disk() -> bool {
    match namespace_unavailable("a host's small disk", "a tmpfs is mounted", &["unshare"]) {
        Some(why) => {
            crate::prerequisite::missing(&why);
            false
        }
        None => true,
    }
}

/// Why password login cannot be set up here (it needs root, `unshare` and `openssl`), if so.
fn password_login_unavailable() -> Option<String> {
    namespace_unavailable(
        "password login",
        "a shadow file is bind-mounted",
        &["unshare", "openssl"],
    )
}

/// Why `what`, which sshd gets by `how` in a private mount namespace, cannot be set up here: it
/// needs root and `tools`.
fn namespace_unavailable(what: &str, how: &str, tools: &[&str]) -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some(format!(
            "{what} needs root ({how} in a private mount namespace)"
        ));
    }
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            return Some(format!("{what} needs {tool} on the PATH"));
        }
    }
    None
}

/// How a fixture's sshd lets users in.
#[derive(Debug, Clone, Default)]
pub struct SshdOptions {
    /// Accept the fixture's client key.
    pub key_auth: bool,
    /// Accept this password for root (needs `unshare` and root).
    pub password: Option<String>,
    /// Take that password only through keyboard-interactive, answered by PAM (`UsePAM yes`,
    /// `PasswordAuthentication no`), as many PAM set-ups do.
    pub keyboard_interactive_only: bool,
    /// Variables every session gets (sshd's `SetEnv`), e.g. `KNOB_SIMULATE_GPUS`.
    pub env: Vec<(String, String)>,
    /// A disk of this many bytes (a tmpfs) at [`Sshd::disk`], seen only by sshd and what is
    /// started through it (a private mount namespace; needs root and `unshare`, see
    /// [`small_disk`]): a host whose disk fills.
    pub disk_bytes: Option<u64>,
    /// That disk is mounted `noexec`: no program on it may run.
    pub disk_noexec: bool,
    /// An RSA host key besides the ed25519 one ([`Sshd::rsa_known_hosts_line`]).
    pub rsa_host_key: bool,
    /// sshd's `MaxSessions` (session channels at once on one connection) when set; else 50,
    /// above what the tests open.
    pub max_sessions: Option<u32>,
}

/// A running sshd; stopped (with everything started through it) on drop.
pub struct Sshd {
    dir: PathBuf,
    port: u16,
    listener: Option<Child>,
    host_public_key: String,
    rsa_host_public_key: Option<String>,
    client_key: PathBuf,
    password: Option<String>,
}

fn run(command: &mut Command) -> Result<String, String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn free_port() -> Result<u16, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port on 127.0.0.1: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

/// Generates an ed25519 key pair at `path` (and `path.pub`); returns the public key line.
pub fn generate_key(path: &Path, passphrase: &str) -> Result<String, String> {
    generate_key_of_type(path, "ed25519", passphrase)
}

/// Generates a key pair of `kind` (`ssh-keygen -t`) at `path` (and `path.pub`); returns the
/// public key line.
pub fn generate_key_of_type(path: &Path, kind: &str, passphrase: &str) -> Result<String, String> {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", kind, "-N", passphrase, "-C", "knob-test", "-f"])
        .arg(path))?;
    std::fs::read_to_string(path.with_extension("pub"))
        .map(|line| line.trim().to_string())
        .map_err(|e| format!("cannot read {}.pub: {e}", path.display()))
}

/// A fresh directory under the system temp dir, unique to this process and call.
fn fresh_dir() -> Result<PathBuf, String> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "knob-sshd-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir)
}

impl Sshd {
    pub fn start(sshd: &Path, options: SshdOptions) -> Result<Sshd, String> {
        let dir = fresh_dir()?;
        // sshd refuses to start without its privilege separation directory.
        std::fs::create_dir_all("/run/sshd")
            .map_err(|e| format!("cannot create /run/sshd (sshd needs it): {e}"))?;

        let host_key = dir.join("host_key");
        let host_public_key = generate_key(&host_key, "")?;
        let rsa_host_key = dir.join("host_key_rsa");
        let rsa_host_public_key = if options.rsa_host_key {
            Some(generate_key_of_type(&rsa_host_key, "rsa", "")?)
        } else {
            None
        };
        let client_key = dir.join("client_key");
        let client_public_key = generate_key(&client_key, "")?;
        let authorized_keys = dir.join("authorized_keys");
        let authorized = if options.key_auth {
            client_public_key + "\n"
        } else {
            String::new()
        };
        std::fs::write(&authorized_keys, authorized).map_err(|e| e.to_string())?;

        let port = free_port()?;
        // HOME is the fixture's own folder: login shells then skip the real user's start-up
        // files (root's .bashrc may run `pyenv rehash`, whose lock, left behind by a session
        // killed mid-start, stalls every later login), and `~` on the "host" is per fixture.
        let mut set_env = format!("{MARK_VARIABLE}={} HOME={}", dir.display(), dir.display());
        for (name, value) in &options.env {
            set_env.push_str(&format!(" {name}={value}"));
        }
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n{rsa}AuthorizedKeysFile {authorized_keys}\n\
             StrictModes no\nUsePAM {pam}\nPermitRootLogin yes\nPubkeyAuthentication {pubkey}\n\
             PasswordAuthentication {password}\nKbdInteractiveAuthentication {pam}\n\
             PidFile {pid_file}\nSetEnv {set_env}\nMaxStartups 50\nMaxSessions {max_sessions}\nLogLevel INFO\n",
            max_sessions = options.max_sessions.unwrap_or(50),
            host_key = host_key.display(),
            rsa = if options.rsa_host_key {
                format!("HostKey {}\n", rsa_host_key.display())
            } else {
                String::new()
            },
            authorized_keys = authorized_keys.display(),
            pubkey = if options.key_auth { "yes" } else { "no" },
            password = if options.password.is_some() && !options.keyboard_interactive_only {
                "yes"
            } else {
                "no"
            },
            // Without PAM, OpenSSH on Linux has no keyboard-interactive device to check a password.
            pam = if options.keyboard_interactive_only { "yes" } else { "no" },
            pid_file = dir.join("sshd.pid").display(),
        );
        let config_path = dir.join("sshd_config");
        std::fs::write(&config_path, config).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("sshd.log")).map_err(|e| e.to_string())?;

        // Set up in sshd's own mount namespace, before it starts.
        let mut in_namespace = Vec::new();
        if let Some(password) = &options.password {
            let hash = run(Command::new("openssl").args(["passwd", "-6", password]))?;
            let current = std::fs::read_to_string("/etc/shadow")
                .map_err(|e| format!("cannot read /etc/shadow (password tests need root): {e}"))?;
            let mut shadow: String = current
                .lines()
                .filter(|line| !line.starts_with("root:"))
                .map(|line| format!("{line}\n"))
                .collect();
            shadow.push_str(&format!("root:{}:19000:0:99999:7:::\n", hash.trim()));
            let shadow_path = dir.join("shadow");
            std::fs::write(&shadow_path, shadow).map_err(|e| e.to_string())?;
            in_namespace.push(format!(
                "mount --bind '{}' /etc/shadow",
                shadow_path.display()
            ));
        }
        if let Some(bytes) = options.disk_bytes {
            let disk = dir.join("disk");
            std::fs::create_dir_all(&disk).map_err(|e| e.to_string())?;
            let noexec = if options.disk_noexec { ",noexec" } else { "" };
            in_namespace.push(format!(
                "mount -t tmpfs -o size={bytes}{noexec} tmpfs '{}'",
                disk.display()
            ));
        }
        let mut command = if in_namespace.is_empty() {
            let mut command = Command::new(sshd);
            command.arg("-D").arg("-e").arg("-f").arg(&config_path);
            command
        } else {
            let script = format!(
                "{} && exec '{}' -D -e -f '{}'",
                in_namespace.join(" && "),
                sshd.display(),
                config_path.display()
            );
            let mut command = Command::new("unshare");
            command.args(["--mount", "sh", "-c", &script]);
            command
        };
        let listener = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", sshd.display()))?;
        let mut fixture = Sshd {
            dir,
            port,
            listener: Some(listener),
            host_public_key,
            rsa_host_public_key,
            client_key,
            password: options.password,
        };
        fixture.wait_listening()?;
        Ok(fixture)
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let address = SocketAddr::from(([127, 0, 0, 1], self.port));
        while Instant::now() < deadline {
            if let Some(child) = self.listener.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("sshd exited at start ({status}): {}", self.log()));
                }
            }
            if TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "sshd did not listen on {address} within {} s: {}",
            START_TIMEOUT.as_secs(),
            self.log()
        ))
    }

    /// sshd's log so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.dir.join("sshd.log")) {
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// `path` on the disk of [`SshdOptions::disk_bytes`], as sshd sees it (`<dir>/disk/...`).
    pub fn disk(&self, path: &str) -> PathBuf {
        self.dir.join("disk").join(path)
    }

    /// Where this process reads `path`, a path as sshd sees it: through sshd's own mount
    /// namespace (`/proc/<pid>/root`), where its disk is mounted.
    pub fn seen_from_here(&self, path: &Path) -> PathBuf {
        match self.listener_pid() {
            Some(pid) => {
                Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path))
            }
            None => path.to_path_buf(),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The fixture's own directory (a good `agentRoot`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The user to log in as: the one running the tests.
    pub fn user(&self) -> String {
        std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".to_string())
    }

    /// A known_hosts line for this server.
    pub fn known_hosts_line(&self) -> String {
        known_hosts_line(&self.host_public_key, self.port)
    }

    /// A known_hosts line for this server's RSA key ([`SshdOptions::rsa_host_key`]).
    pub fn rsa_known_hosts_line(&self) -> String {
        let key = self
            .rsa_host_public_key
            .as_deref()
            .expect("the sshd was started with rsa_host_key");
        known_hosts_line(key, self.port)
    }

    pub fn client_key_path(&self) -> &Path {
        &self.client_key
    }

    /// Encrypts the client key file with `passphrase` (the key itself stays the same).
    pub fn encrypt_client_key(&self, passphrase: &str) -> Result<(), String> {
        run(Command::new("ssh-keygen")
            .args(["-q", "-p", "-P", "", "-N", passphrase, "-f"])
            .arg(&self.client_key))
        .map(|_| ())
    }

    /// Lets the key of `public_key` (a `.pub` line) in too.
    pub fn authorize(&self, public_key: &str) -> Result<(), String> {
        let path = self.dir.join("authorized_keys");
        let mut keys = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        keys.push_str(public_key.trim());
        keys.push('\n');
        std::fs::write(&path, keys).map_err(|e| e.to_string())
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    fn listener_pid(&self) -> Option<u32> {
        self.listener.as_ref().map(|c| c.id())
    }

    /// Kills the per-connection sshd processes only: every SSH connection drops, while the
    /// listener and the agent daemons stay (a dropped and restorable connection).
    pub fn drop_connections(&self) {
        let Some(listener) = self.listener_pid() else {
            return;
        };
        for pid in descendants(listener) {
            if process_name(pid).as_deref() == Some("sshd") {
                kill(pid);
            }
        }
    }

    /// The network to the host is gone, the host itself stays: the listener and every
    /// per-connection sshd are killed, so no connection holds and none can be made, while the
    /// agent daemons and their trials run on. [`Sshd::restart`] brings the link back.
    pub fn cut_link(&mut self) {
        let session_processes = self.listener_pid().map(descendants).unwrap_or_default();
        if let Some(mut child) = self.listener.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in session_processes {
            if process_name(pid).as_deref() == Some("sshd") {
                kill(pid);
            }
        }
    }

    /// Stops (`true`) or continues (`false`) every process started through this sshd (agent
    /// daemons, their links, trials): a host that stalls, its connection up but nothing
    /// answering.
    pub fn pause_processes(&self, paused: bool) {
        let mark = format!("{MARK_VARIABLE}={}", self.dir.display());
        let signal = if paused { "-STOP" } else { "-CONT" };
        for pid in processes_with_environment(&mark) {
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    /// The host is gone: the listener, its sessions, and every process started through it
    /// (agent daemons and their trials) are killed.
    pub fn kill_host(&mut self) {
        let session_processes = self.listener_pid().map(descendants).unwrap_or_default();
        if let Some(mut child) = self.listener.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        for pid in session_processes {
            kill(pid);
        }
        let mark = format!("{MARK_VARIABLE}={}", self.dir.display());
        // Two passes: a daemon may fork a trial while the first pass runs.
        for _ in 0..2 {
            for pid in processes_with_environment(&mark) {
                kill(pid);
            }
        }
    }
}

impl Sshd {
    /// The host is back after [`Sshd::kill_host`], as after a reboot: sshd listens again on
    /// the same port with the same keys (its agent daemons and trials are gone). Not for a
    /// fixture with a password or a disk of its own, which need sshd's own mount namespace.
    pub fn restart(&mut self) -> Result<(), String> {
        let sshd = sshd_binary().ok_or("no sshd to start again")?;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("sshd.log"))
            .map_err(|e| e.to_string())?;
        let listener = Command::new(sshd)
            .arg("-D")
            .arg("-e")
            .arg("-f")
            .arg(self.dir.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start sshd again: {e}"))?;
        self.listener = Some(listener);
        self.wait_listening()
    }

    /// The agent daemons started through this sshd are killed (SIGKILL, as the OOM killer
    /// does), and nothing else: the host, its connections and the trials stay. Returns how
    /// many were killed.
    pub fn kill_agent_daemons(&self) -> usize {
        let mark = format!("{MARK_VARIABLE}={}", self.dir.display());
        let daemons: Vec<u32> = processes_with_environment(&mark)
            .into_iter()
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                    let words: Vec<&[u8]> = line.split(|b| *b == 0).collect();
                    words
                        .first()
                        .is_some_and(|w| w.windows(10).any(|x| x == b"knob-agent"))
                        && words.get(1) == Some(&&b"serve"[..])
                })
            })
            .collect();
        for &pid in &daemons {
            kill(pid);
        }
        daemons.len()
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill_host();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The known_hosts line of a public key line for 127.0.0.1 at `port`.
fn known_hosts_line(public_key: &str, port: u16) -> String {
    let mut fields = public_key.split_whitespace();
    let algorithm = fields.next().unwrap_or_default();
    let key = fields.next().unwrap_or_default();
    format!("[127.0.0.1]:{port} {algorithm} {key}")
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name in parentheses may hold spaces: the fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn process_name(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|name| name.trim().to_string())
}

fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let mut found = vec![root];
    let mut index = 0;
    while index < found.len() && found.len() < 10_000 {
        let parent = found[index];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(pid, _)| *pid),
        );
        index += 1;
    }
    found.remove(0);
    found
}

fn processes_with_environment(entry: &str) -> Vec<u32> {
    let own = std::process::id();
    all_pids()
        .into_iter()
        .filter(|pid| *pid != own)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|environ| environ.split(|b| *b == 0).any(|v| v == entry.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

fn kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}
