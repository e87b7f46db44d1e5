//! One SSH connection to one host: connect, check the host key against a known_hosts file,
//! authenticate, and run commands (with stdin, bounded in time and output).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use russh::client::{self, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKeyOrCertificate};
use russh::ChannelMsg;

use super::args::Machine;
use super::known_hosts;

/// How long one TCP connect, key exchange and authentication may take together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);
/// The most output a helper command may print before it is cut off.
const MAX_COMMAND_OUTPUT: usize = 1024 * 1024;

/// The line every command knob runs on a host prints first. A login shell's start-up files
/// may print (a `.bashrc` that greets, a quota notice) before the command runs, into the same
/// output: what comes before this line is theirs and dropped, or `uname` read "Welcome to the
/// lab cluster!" as the host's platform and the agent's frames began with text.
const OUTPUT_MARK: &str = "knob-output-begins-5d1c";

/// `command`, printing [`OUTPUT_MARK`] on a line of its own first.
fn marked(command: &str) -> String {
    format!("printf '%s\\n' {OUTPUT_MARK}; {command}")
}

/// The command's own output: what follows the first [`OUTPUT_MARK`] and its newline (the mark
/// may end a line the login shell began).
fn after_mark(stdout: Vec<u8>) -> Vec<u8> {
    let mark = format!("{OUTPUT_MARK}\n");
    match memchr::memmem::find(&stdout, mark.as_bytes()) {
        Some(at) => stdout[at + mark.len()..].to_vec(),
        None => stdout,
    }
}

/// Reads `stream` up to the end of the first line that ends with [`OUTPUT_MARK`], within [`MAX_COMMAND_OUTPUT`]
/// bytes; what follows stays in the reader's buffer.
async fn skip_to_mark<R: tokio::io::AsyncBufRead + Unpin>(stream: &mut R) -> Result<(), String> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut before = Vec::new();
    loop {
        let mut line = Vec::new();
        let read = (&mut *stream)
            .take(MAX_COMMAND_OUTPUT as u64)
            .read_until(b'\n', &mut line)
            .await
            .map_err(|e| e.to_string())?;
        // The mark may end a line that the login shell began: a `.bashrc` that sets the
        // terminal's title or greets without a final newline glues its text to the mark, and
        // `after_mark` accepts it there too.
        if line
            .strip_suffix(b"\n")
            .is_some_and(|text| text.ends_with(OUTPUT_MARK.as_bytes()))
        {
            return Ok(());
        }
        before.extend_from_slice(&line);
        if read == 0 || before.len() > MAX_COMMAND_OUTPUT {
            let said = String::from_utf8_lossy(&before);
            return Err(format!(
                "the command's output never began (the login shell printed {:?})",
                said.trim().chars().take(200).collect::<String>()
            ));
        }
    }
}

/// Why a connection could not be made, one line naming the host (never a password).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SshError {
    #[error("{target}: cannot connect: {why}")]
    Connect { target: String, why: String },
    #[error("{target}: {message}")]
    HostKey { target: String, message: String },
    #[error("{target}: authentication rejected ({tried}); check the user, the key or the password in machineList")]
    AuthRejected { target: String, tried: String },
    #[error("{target}: {what}")]
    Session { target: String, what: String },
    /// The host cannot run knob's agent as it is (architecture, version, no binary).
    #[error("{target}: {what}")]
    Setup { target: String, what: String },
    /// The machine's `sshKeyFile` cannot be loaded (encrypted without its passphrase, a wrong
    /// one, no key): trying the host again reads the same file with the same passphrase.
    #[error("{target}: {what}")]
    Key { target: String, what: String },
}

impl SshError {
    /// Host-key, key-file and authentication failures do not heal by retrying.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            SshError::HostKey { .. }
                | SshError::AuthRejected { .. }
                | SshError::Setup { .. }
                | SshError::Key { .. }
        )
    }
}

/// What a host-key check concluded, carried out of the russh handler.
#[derive(Debug)]
enum HandlerError {
    HostKey(String),
    Russh(russh::Error),
}

impl From<russh::Error> for HandlerError {
    fn from(e: russh::Error) -> Self {
        HandlerError::Russh(e)
    }
}

/// Checks the server's key against the known_hosts file.
struct HostKeyCheck {
    host: String,
    port: u16,
    known_hosts: PathBuf,
    accept_new: bool,
}

impl HostKeyCheck {
    fn check(&self, key: &russh::keys::PublicKey) -> Result<(), String> {
        let fingerprint = key.fingerprint(HashAlg::Sha256);
        let file = self.known_hosts.display();
        let known_hosts::Recorded {
            keys: recorded,
            skipped,
        } = known_hosts::recorded_keys(&self.known_hosts, &self.host, self.port)?;
        for line in skipped {
            knob_plugin_api::log::warn(&format!(
                "training service remote: {file} line {line}: its key cannot be read; skipped, as ssh skips it (fix or remove the line)"
            ));
        }
        let text = std::fs::read_to_string(&self.known_hosts).unwrap_or_default();
        // Before any match: a key both recorded and revoked is refused, as ssh refuses it.
        if let Some((line, _)) = known_hosts::revoked_keys(&text)
            .iter()
            .find(|(_, revoked)| revoked == key)
        {
            return Err(format!(
                "host key revoked: the server offers {} key {fingerprint}, which {file} line {line} marks @revoked; knob does not connect to a host with a revoked key (nor does ssh): have the host's keys replaced, and its new key recorded",
                key.algorithm()
            ));
        }
        if recorded.iter().any(|(_, known)| known == key) {
            return Ok(());
        }
        let algorithm = key.algorithm();
        if let Some((line, _)) = recorded
            .iter()
            .find(|(_, known)| known_hosts::same_kind(&known.algorithm(), &algorithm))
        {
            // A host with a recorded key of this kind that does not match has a changed key:
            // refused, whatever acceptNewHostKey says (it only accepts hosts never seen before).
            return Err(format!(
                "host key changed: the server offers {algorithm} key {fingerprint}, but {file} line {line} records another {algorithm} key for this host; if the change is expected, remove that line and connect again"
            ));
        }
        if let Some((line, known)) = recorded.first() {
            // The server was asked for the recorded kinds first and has none of them: not a
            // changed key, but not one to take on trust either (acceptNewHostKey is for hosts
            // never seen), since the pin the file holds would then protect nothing.
            return Err(format!(
                "the server offers a {algorithm} key ({fingerprint}) and no {} key, which {file} line {} records for this host; if the host's keys were replaced, check the new one and add it (`ssh-keyscan -p {} {} >> {file}`)",
                known.algorithm(),
                line,
                self.port,
                self.host
            ));
        }
        if self.accept_new {
            // A missing `~/.ssh` is made as ssh makes it, for its user only (russh would make
            // it readable by all).
            if let Some(folder) = self.known_hosts.parent().filter(|f| !f.exists()) {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(folder)
                    .map_err(|e| format!("cannot add the host key to {file}: {e}"))?;
            }
            // Lowercased, as OpenSSH writes names (and as they are looked up).
            russh::keys::known_hosts::learn_known_hosts_path(
                &self.host.to_ascii_lowercase(),
                self.port,
                key,
                &self.known_hosts,
            )
            .map_err(|e| format!("cannot add the host key to {file}: {e}"))?;
            knob_plugin_api::log::info(&format!(
                "training service remote: added {} host key {fingerprint} of [{}]:{} to {file} (acceptNewHostKey)",
                key.algorithm(),
                self.host,
                self.port
            ));
            return Ok(());
        }
        // knob reads no host certificates (russh is not asked for them): a certificate
        // authority the file trusts for this host vouches for nothing here, which the user who
        // relies on it needs to hear.
        let authority = known_hosts::cert_authority_line(&text, &self.host, self.port)
            .map(|line| format!(" ({file} line {line} trusts a @cert-authority for this host, but knob checks host keys only, not host certificates)"))
            .unwrap_or_default();
        // A fresh user's `~/.ssh` may not exist yet, and the `>>` alone would then fail.
        let make_folder = match self.known_hosts.parent() {
            Some(folder) if !folder.as_os_str().is_empty() && !folder.is_dir() => {
                format!("mkdir -p -m 700 {} && ", folder.display())
            }
            _ => String::new(),
        };
        Err(format!(
            "unknown host key {} {fingerprint}, not in {file}{authority}; if it is this host's key, run `{make_folder}ssh-keyscan -p {} {} >> {file}` or set acceptNewHostKey: true for this machine",
            key.algorithm(),
            self.port,
            self.host
        ))
    }
}

impl client::Handler for HostKeyCheck {
    type Error = HandlerError;

    async fn check_server_key(
        &mut self,
        server_public_key: &PublicKeyOrCertificate,
    ) -> Result<bool, HandlerError> {
        let key = match server_public_key {
            PublicKeyOrCertificate::PublicKey { key, .. } => key,
            PublicKeyOrCertificate::Certificate(_) => {
                return Err(HandlerError::HostKey(
                    "the server offers a host certificate; knob checks plain host keys against known_hosts only".to_string(),
                ))
            }
        };
        self.check(key)
            .map(|()| true)
            .map_err(HandlerError::HostKey)
    }
}

/// An authenticated SSH connection.
pub struct Connection {
    handle: Handle<HostKeyCheck>,
    pub target: String,
    /// Held by each command [`Connection::run`] runs (see [`COMMANDS_AT_ONCE`]).
    commands: tokio::sync::Semaphore,
}

/// How many commands [`Connection::run`] runs at once on one connection, each on a session
/// channel of its own. sshd refuses sessions past its `MaxSessions` (10 by default: "no more
/// sessions" in its log, "Failed to open channel (ConnectFailed)" here): a resume asking a host
/// to delete a dozen checkpoint folders at once, beside the agent's stream, saw a third of
/// the deletions refused. The rest wait for a place; streams (the agent's, copies) open beside.
pub const COMMANDS_AT_ONCE: usize = 6;

/// The output of a finished command.
#[derive(Debug)]
pub struct CommandOutput {
    pub status: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl CommandOutput {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    /// The last line of stderr, or the exit status, for an error message.
    pub fn failure_summary(&self) -> String {
        let stderr = String::from_utf8_lossy(&self.stderr);
        match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => line.trim().to_string(),
            None => match self.status {
                Some(code) => format!("exit status {code}"),
                None => "no exit status".to_string(),
            },
        }
    }
}

/// Connects and authenticates, all within [`CONNECT_TIMEOUT`].
pub async fn connect(
    machine: &Machine,
    known_hosts: &Path,
    keepalive: Duration,
) -> Result<Connection, SshError> {
    let target = machine.target();
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        connect_unbounded(machine, known_hosts, keepalive),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(SshError::Connect {
            target,
            why: format!(
                "no answer within {} s (is the host up and sshd listening on port {}?)",
                CONNECT_TIMEOUT.as_secs(),
                machine.port
            ),
        }),
    }
}

async fn connect_unbounded(
    machine: &Machine,
    known_hosts: &Path,
    keepalive: Duration,
) -> Result<Connection, SshError> {
    let target = machine.target();
    // What known_hosts records for the host decides which of its keys to ask for (unreadable,
    // nothing: the check then says why).
    let recorded: Vec<_> = known_hosts::recorded_keys(known_hosts, &machine.host, machine.port)
        .map(|recorded| recorded.keys)
        .unwrap_or_default()
        .iter()
        .map(|(_, key)| key.algorithm())
        .collect();
    let config = Arc::new(client::Config {
        preferred: russh::Preferred {
            key: known_hosts::preferred_algorithms(&recorded).into(),
            ..russh::Preferred::DEFAULT
        },
        keepalive_interval: Some(keepalive),
        keepalive_max: 3,
        nodelay: true,
        ..Default::default()
    });
    let check = HostKeyCheck {
        host: machine.host.clone(),
        port: machine.port,
        known_hosts: known_hosts.to_path_buf(),
        accept_new: machine.accept_new_host_key,
    };
    let mut handle = client::connect(config, (machine.host.as_str(), machine.port), check)
        .await
        .map_err(|e| match e {
            HandlerError::HostKey(message) => SshError::HostKey {
                target: target.clone(),
                message,
            },
            // Closed before the handshake was done: said as russh's bare "Disconnected", which
            // named neither cause (not an SSH server on that port; sshd dropping connections
            // beyond its `MaxStartups`).
            HandlerError::Russh(russh::Error::Disconnect) => SshError::Connect {
                target: target.clone(),
                why: format!(
                    "the server on port {} closed the connection before the SSH handshake was done (is it sshd? a busy sshd also drops new connections beyond its MaxStartups)",
                    machine.port
                ),
            },
            HandlerError::Russh(e) => SshError::Connect {
                target: target.clone(),
                why: describe_russh(&e),
            },
        })?;
    authenticate(&mut handle, machine).await?;
    Ok(Connection {
        handle,
        target,
        commands: tokio::sync::Semaphore::new(COMMANDS_AT_ONCE),
    })
}

/// Keyboard-interactive login answering the server's prompts with the password. Only prompts
/// that do not echo are password prompts; one that echoes asks for something else, which knob
/// cannot give, so the login is given up rather than the password shown there.
async fn keyboard_interactive(
    handle: &mut Handle<HostKeyCheck>,
    user: &str,
    password: &str,
) -> Result<bool, russh::Error> {
    use russh::client::KeyboardInteractiveAuthResponse as Response;
    let mut response = handle
        .authenticate_keyboard_interactive_start(user.to_string(), None)
        .await?;
    // PAM may send a few rounds (an empty one first, or a notice); a server that keeps asking
    // is not given the password forever.
    for _ in 0..8 {
        let prompts = match response {
            Response::Success => return Ok(true),
            Response::Failure { .. } => return Ok(false),
            Response::InfoRequest { prompts, .. } => prompts,
        };
        if prompts.iter().any(|p| p.echo) {
            return Ok(false);
        }
        let answers = prompts.iter().map(|_| password.to_string()).collect();
        response = handle
            .authenticate_keyboard_interactive_respond(answers)
            .await?;
    }
    Ok(false)
}

fn describe_russh(e: &russh::Error) -> String {
    match e {
        russh::Error::IO(io) => match io.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused (is sshd running on that port?)".to_string()
            }
            _ => io.to_string(),
        },
        other => other.to_string(),
    }
}

async fn authenticate(
    handle: &mut Handle<HostKeyCheck>,
    machine: &Machine,
) -> Result<(), SshError> {
    let target = machine.target();
    let session_error = |e: russh::Error| SshError::Session {
        target: target.clone(),
        what: format!("authentication failed: {}", describe_russh(&e)),
    };
    let mut tried: Vec<String> = Vec::new();

    if let Some(key_file) = &machine.ssh_key_file {
        let passphrase = machine.ssh_passphrase.as_ref().map(|p| p.expose());
        let key = russh::keys::load_secret_key(key_file, passphrase.as_deref())
            .map_err(|e| SshError::Key {
                target: target.clone(),
                what: match e {
                    russh::keys::Error::KeyIsEncrypted => format!(
                        "sshKeyFile {} is encrypted: give its sshPassphrase",
                        key_file.display()
                    ),
                    // Only a passphrase that was given can be the wrong one.
                    other if passphrase.is_some() => format!(
                        "cannot load sshKeyFile {}: {other} (a wrong sshPassphrase reads as a corrupt key)",
                        key_file.display()
                    ),
                    other => format!(
                        "cannot load sshKeyFile {}: {other}; give an SSH private key file (such as ~/.ssh/id_ed25519)",
                        key_file.display()
                    ),
                },
            })?;
        if try_key(handle, &machine.user, key)
            .await
            .map_err(session_error)?
        {
            return Ok(());
        }
        tried.push(format!("key {}", key_file.display()));
        // An explicit key that is rejected is the answer: no password or default key is tried
        // behind the user's back.
        return Err(SshError::AuthRejected {
            target,
            tried: tried.join(", "),
        });
    }

    if let Some(password) = &machine.password {
        let result = handle
            .authenticate_password(machine.user.clone(), password.expose())
            .await
            .map_err(session_error)?;
        if result.success() {
            return Ok(());
        }
        // Many servers (PAM set-ups) take passwords only through keyboard-interactive; NNI
        // answers its prompts with the password (ssh2's `tryKeyboard`), and so does knob.
        let offers_keyboard = matches!(
            &result,
            russh::client::AuthResult::Failure { remaining_methods, .. }
                if remaining_methods.contains(&russh::MethodKind::KeyboardInteractive)
        );
        if offers_keyboard
            && keyboard_interactive(handle, &machine.user, &password.expose())
                .await
                .map_err(session_error)?
        {
            return Ok(());
        }
        return Err(SshError::AuthRejected {
            target,
            tried: if offers_keyboard {
                "password, and password through keyboard-interactive".to_string()
            } else {
                "password".to_string()
            },
        });
    }

    // The default keys are read with the machine's sshPassphrase, as NNI reads its default
    // `~/.ssh/id_rsa` with `ssh_passphrase`: `{host, user, sshPassphrase}` is a working NNI
    // machine. One that cannot be read is named in the refusal, not only logged.
    let mut skipped: Vec<String> = Vec::new();
    if let Some(home) = std::env::home_dir() {
        let passphrase = machine.ssh_passphrase.as_ref().map(|p| p.expose());
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            let path = home.join(".ssh").join(name);
            if !path.is_file() {
                continue;
            }
            match russh::keys::load_secret_key(&path, passphrase.as_deref()) {
                Ok(key) => {
                    if try_key(handle, &machine.user, key)
                        .await
                        .map_err(session_error)?
                    {
                        return Ok(());
                    }
                    tried.push(format!("key {}", path.display()));
                }
                Err(e) => {
                    knob_plugin_api::log::debug(&format!(
                        "training service remote: default key {} skipped: {e}",
                        path.display()
                    ));
                    skipped.push(match (e, &passphrase) {
                        (russh::keys::Error::KeyIsEncrypted, _) => format!(
                            "{} skipped: it is encrypted and the machine gives no sshPassphrase",
                            path.display()
                        ),
                        (_, Some(_)) => format!(
                            "{} skipped: it cannot be read with the machine's sshPassphrase",
                            path.display()
                        ),
                        (other, None) => format!("{} skipped: {other}", path.display()),
                    });
                }
            }
        }
    }

    if std::env::var_os("SSH_AUTH_SOCK").is_some() {
        match russh::keys::agent::client::AgentClient::connect_env().await {
            Ok(mut agent) => {
                let identities = agent.request_identities().await.unwrap_or_default();
                for identity in identities {
                    let russh::keys::agent::AgentIdentity::PublicKey { key, .. } = identity else {
                        continue;
                    };
                    let hash = handle
                        .best_supported_rsa_hash()
                        .await
                        .ok()
                        .flatten()
                        .flatten();
                    if let Ok(result) = handle
                        .authenticate_publickey_with(machine.user.clone(), key, hash, &mut agent)
                        .await
                    {
                        if result.success() {
                            return Ok(());
                        }
                    }
                    tried.push("an ssh-agent key".to_string());
                }
            }
            Err(e) => knob_plugin_api::log::debug(&format!(
                "training service remote: SSH_AUTH_SOCK set but the agent is unusable: {e}"
            )),
        }
    }

    if tried.is_empty() {
        tried.push("no credentials: give sshKeyFile or password in machineList, or have ~/.ssh/id_ed25519, id_ecdsa or id_rsa or an ssh-agent".to_string());
    }
    let mut tried = tried.join(", ");
    for note in skipped {
        tried.push_str("; ");
        tried.push_str(&note);
    }
    Err(SshError::AuthRejected { target, tried })
}

async fn try_key(
    handle: &mut Handle<HostKeyCheck>,
    user: &str,
    key: russh::keys::PrivateKey,
) -> Result<bool, russh::Error> {
    let hash = if key.algorithm().is_rsa() {
        handle.best_supported_rsa_hash().await?.flatten()
    } else {
        None
    };
    let key = PrivateKeyWithHashAlg::new(Arc::new(key), hash);
    Ok(handle
        .authenticate_publickey(user.to_string(), key)
        .await?
        .success())
}

impl Connection {
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }

    /// Runs `command` through the remote user's shell, writes `stdin` to it, and collects its
    /// output, all within `limit`.
    pub async fn run(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        limit: Duration,
    ) -> Result<CommandOutput, SshError> {
        let target = self.target.clone();
        let short: String = command.chars().take(80).collect();
        // Waiting for a place is not the command's time: each holding one runs within its own
        // limit. Never closed.
        let _place = self.commands.acquire().await;
        // Where the command got to, for the message if it does not finish in time.
        let progress = std::sync::Mutex::new("opening a channel");
        match tokio::time::timeout(limit, self.run_unbounded(command, stdin, &progress)).await {
            Ok(result) => result.map_err(|e| SshError::Session {
                target,
                what: format!("running `{short}`: {e}"),
            }),
            Err(_) => Err(SshError::Session {
                target,
                what: format!(
                    "`{short}` did not finish within {} s (stuck {})",
                    limit.as_secs(),
                    progress.lock().map(|p| *p).unwrap_or("somewhere")
                ),
            }),
        }
    }

    async fn run_unbounded(
        &self,
        command: &str,
        stdin: Option<&[u8]>,
        progress: &std::sync::Mutex<&'static str>,
    ) -> Result<CommandOutput, String> {
        let step = |what: &'static str| {
            if let Ok(mut progress) = progress.lock() {
                *progress = what;
            }
        };
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| describe_russh(&e))?;
        step("starting the command");
        channel
            .exec(true, marked(command))
            .await
            .map_err(|e| describe_russh(&e))?;
        // Input is sent while the output is read: a command that stops reading its input and
        // exits (a full disk under `cat > file`) leaves the rest unsent for want of window,
        // and the send would wait for the limit, hiding the command's own error.
        let (mut reader, writer) = channel.split();
        let send = async {
            if let Some(bytes) = stdin {
                step("sending its input");
                writer
                    .data_bytes(bytes.to_vec())
                    .await
                    .map_err(|e| describe_russh(&e))?;
            }
            writer.eof().await.map_err(|e| describe_russh(&e))?;
            step("waiting for its output");
            Ok::<(), String>(())
        };
        let receive = async {
            let mut output = CommandOutput {
                status: None,
                stdout: Vec::new(),
                stderr: Vec::new(),
            };
            while let Some(message) = reader.wait().await {
                match message {
                    ChannelMsg::Data { data } => append_bounded(&mut output.stdout, &data),
                    ChannelMsg::ExtendedData { data, .. } => {
                        append_bounded(&mut output.stderr, &data)
                    }
                    ChannelMsg::ExitStatus { exit_status } => {
                        step("waiting for the channel to close after the exit status");
                        output.status = Some(exit_status)
                    }
                    ChannelMsg::Failure => return Err("the server refused to run it".to_string()),
                    ChannelMsg::Close => break,
                    _ => {}
                }
            }
            output.stdout = after_mark(output.stdout);
            Ok(output)
        };
        tokio::pin!(send, receive);
        let (mut sent, mut send_failure) = (false, None);
        loop {
            tokio::select! {
                result = &mut send, if !sent => {
                    sent = true;
                    // A send cut short by the command's end: its exit says why.
                    send_failure = result.err();
                }
                output = &mut receive => {
                    return match (output, send_failure) {
                        (Ok(output), Some(e)) if output.status.is_none() => Err(e),
                        (output, _) => output,
                    };
                }
            }
        }
    }

    /// A new channel running `command` after the output mark ([`marked`]).
    async fn exec_marked(&self, command: &str) -> Result<russh::Channel<client::Msg>, String> {
        let channel = self
            .handle
            .channel_open_session()
            .await
            .map_err(|e| describe_russh(&e))?;
        channel
            .exec(true, marked(command))
            .await
            .map_err(|e| describe_russh(&e))?;
        Ok(channel)
    }

    /// Opens a channel running `command` and returns it as a byte stream (its stdin and stdout),
    /// from the command's own first byte.
    pub async fn open_stream(
        &self,
        command: &str,
    ) -> Result<tokio::io::BufReader<russh::ChannelStream<client::Msg>>, SshError> {
        let target = self.target.clone();
        let open = async {
            let channel = self.exec_marked(command).await?;
            let mut stream = tokio::io::BufReader::new(channel.into_stream());
            skip_to_mark(&mut stream).await?;
            Ok::<_, String>(stream)
        };
        started_within(target, command, open).await
    }

    /// [`Connection::open_stream`] that also keeps the end of the command's stderr, which a
    /// channel stream drops: why `knob-agent attach` gave up (its daemon did not start, the
    /// disk is full) is said there, before its stdout closes.
    pub async fn open_stream_keeping_stderr(
        &self,
        command: &str,
    ) -> Result<(CommandStream, StderrTail), SshError> {
        use tokio::io::AsyncWriteExt;
        let target = self.target.clone();
        let open = async {
            let channel = self.exec_marked(command).await?;
            let (mut read_half, write_half) = channel.split();
            // Dropping the stream closes the channel, as a channel stream does (the command
            // then sees its stdin end); the reading task learns of it through `dropped`.
            let (alive, mut dropped) = tokio::sync::oneshot::channel::<()>();
            let writer: Box<dyn tokio::io::AsyncWrite + Send + Unpin> = Box::new(KeptAlive {
                inner: write_half.make_writer(),
                _alive: alive,
            });
            let (mut to_reader, from_channel) = tokio::io::duplex(64 * 1024);
            let stderr = StderrTail::default();
            let tail = stderr.clone();
            tokio::spawn(async move {
                loop {
                    let message = tokio::select! {
                        message = read_half.wait() => message,
                        _ = &mut dropped => break,
                    };
                    let Some(message) = message else { break };
                    match message {
                        russh::ChannelMsg::Data { data }
                            if to_reader.write_all(&data).await.is_err() =>
                        {
                            break
                        }
                        // Recorded before the reader can see the end of stdout (below).
                        russh::ChannelMsg::ExtendedData { data, ext: 1 } => {
                            let mut kept = tail.lock().unwrap_or_else(|e| e.into_inner());
                            kept.extend_from_slice(&data);
                            let excess = kept.len().saturating_sub(STDERR_TAIL_BYTES);
                            kept.drain(..excess);
                        }
                        russh::ChannelMsg::Eof | russh::ChannelMsg::Close => break,
                        _ => {}
                    }
                }
                drop(to_reader);
                let _ = write_half.close().await;
            });
            let mut stream = tokio::io::BufReader::new(tokio::io::join(from_channel, writer));
            skip_to_mark(&mut stream).await?;
            Ok::<_, String>((stream, stderr))
        };
        started_within(target, command, open).await
    }

    pub async fn close(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "knob is done", "en")
            .await;
    }
}

/// `open`, the start of `command` on a channel, given [`CONNECT_TIMEOUT`]; its failure or
/// timeout as one error naming the command's start.
async fn started_within<T>(
    target: String,
    command: &str,
    open: impl std::future::Future<Output = Result<T, String>>,
) -> Result<T, SshError> {
    let short: String = command.chars().take(80).collect();
    match tokio::time::timeout(CONNECT_TIMEOUT, open).await {
        Ok(Ok(opened)) => Ok(opened),
        Ok(Err(e)) => Err(SshError::Session {
            target,
            what: format!("cannot start `{short}`: {e}"),
        }),
        Err(_) => Err(SshError::Session {
            target,
            what: format!(
                "`{short}` did not start within {} s",
                CONNECT_TIMEOUT.as_secs()
            ),
        }),
    }
}

/// How much of a command's stderr [`Connection::open_stream_keeping_stderr`] keeps.
const STDERR_TAIL_BYTES: usize = 4096;

/// A command's stdout and stdin, from [`Connection::open_stream_keeping_stderr`].
pub type CommandStream = tokio::io::BufReader<
    tokio::io::Join<tokio::io::DuplexStream, Box<dyn tokio::io::AsyncWrite + Send + Unpin>>,
>;

/// A writer that holds `_alive` until it is dropped.
struct KeptAlive<W> {
    inner: W,
    _alive: tokio::sync::oneshot::Sender<()>,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for KeptAlive<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The end of a command's stderr so far.
#[derive(Clone, Default)]
pub struct StderrTail(Arc<std::sync::Mutex<Vec<u8>>>);

impl StderrTail {
    fn lock(&self) -> std::sync::LockResult<std::sync::MutexGuard<'_, Vec<u8>>> {
        self.0.lock()
    }

    /// The last line that is not blank, if any.
    pub fn last_line(&self) -> Option<String> {
        let kept = self.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&kept)
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map(|l| l.trim().to_string())
    }
}

fn append_bounded(buffer: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_COMMAND_OUTPUT.saturating_sub(buffer.len());
    buffer.extend_from_slice(&data[..data.len().min(room)]);
}

/// Quotes `text` for a POSIX shell.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
