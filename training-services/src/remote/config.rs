//! The remote service's own config (`trainingService: {platform: remote, ...}`): checked here,
//! not in the core, which only keeps the positions and the secrets (see
//! `knob_plugin_api::config`).
//!
//! Canonical form: `machineList` (each machine with every field, defaults filled in and the
//! experiment's top-level shortcuts applied), `reuseMode` (default `true`, as in NNI),
//! `knownHostsFile` (absolute, `null` is `~/.ssh/known_hosts`), `hostLossTimeout` (whole seconds,
//! default 60) and `agentRoot` (a path on the hosts, `null` is `~/.knob`). `password` and
//! `sshPassphrase` are secrets.

use std::path::{Path, PathBuf};

use knob_plugin_api::config::{quoted, ConfigReader, Field, Fields, REDACTED};
use knob_plugin_api::service::{CheckedConfig, ConfigProblem, FieldPath, ServiceContext};
use serde_json::{json, Map, Value};

use super::args::DEFAULT_HOST_LOSS_TIMEOUT;

/// Where `knob resume` reads an SSH password from when the original config file is gone.
pub const PASSWORD_VARIABLE: &str = knob_plugin_api::secrets::SSH_PASSWORD;
/// Same, for an SSH key's passphrase.
pub const PASSPHRASE_VARIABLE: &str = knob_plugin_api::secrets::SSH_PASSPHRASE;

const REMOTE_FIELDS: [&str; 5] = [
    "machineList",
    "reuseMode",
    "knownHostsFile",
    "hostLossTimeout",
    "agentRoot",
];
const MACHINE_FIELDS: [&str; 16] = [
    "host",
    "port",
    "user",
    "password",
    "sshKeyFile",
    "sshPassphrase",
    "useActiveGpu",
    "maxTrialNumberPerGpu",
    "gpuIndices",
    "pythonPath",
    "acceptNewHostKey",
    crate::limits::LIMIT_FIELDS[0],
    crate::limits::LIMIT_FIELDS[1],
    crate::limits::LIMIT_FIELDS[2],
    crate::limits::LIMIT_FIELDS[3],
    crate::limits::LIMIT_FIELDS[4],
];

/// (NNI v1 name, v2 name) of the machine fields v2 renamed: a v2 config written with the old
/// names (copied from a v1 `machineList`) is told the new one, which edit distance does not
/// lead to (`ip` for `host`).
const MACHINE_V1_NAMES: [(&str, &str); 6] = [
    ("ip", "host"),
    ("username", "user"),
    ("passwd", "password"),
    ("sshKeyPath", "sshKeyFile"),
    ("passphrase", "sshPassphrase"),
    ("maxTrialNumPerGpu", "maxTrialNumberPerGpu"),
];

/// Checks a `remote` config and gives its canonical form.
pub fn check_config(
    config: &Value,
    context: &ServiceContext,
) -> Result<CheckedConfig, Vec<ConfigProblem>> {
    let mut reader = ConfigReader::new(context);
    let Some(mut fields) = reader.mapping(config, FieldPath::root()) else {
        return reader.finish(Map::new());
    };
    let shortcut = |name: &str| {
        context
            .shortcuts
            .get(name)
            .filter(|v| !v.is_null())
            .cloned()
    };
    let reuse_mode = fields
        .take("reuseMode")
        .and_then(|field| reader.boolean(&field))
        .map(Value::from)
        .or_else(|| shortcut("reuseMode"))
        .unwrap_or(json!(true));
    let known_hosts_file = fields
        .take("knownHostsFile")
        .and_then(|field| known_hosts_file(&mut reader, &field));
    let host_loss_timeout = fields
        .take("hostLossTimeout")
        .and_then(|field| reader.duration_seconds(&field))
        .unwrap_or(DEFAULT_HOST_LOSS_TIMEOUT.as_secs());
    // A path on the hosts, so it is not resolved against the config's folder here.
    let agent_root = fields
        .take("agentRoot")
        .and_then(|field| reader.non_empty_string(&field));
    let mut machines = Vec::new();
    if let Some(field) = fields.require(
        &mut reader,
        "machineList",
        "a list of machines, each with at least host and user",
    ) {
        match field.value {
            Value::Array(items) if !items.is_empty() => {
                // Where each login was first listed: one listed twice would be driven twice,
                // by two links to the one agent there (the service refused it only once the
                // experiment was being created).
                let mut listed: Vec<(String, usize)> = Vec::new();
                for (index, item) in items.iter().enumerate() {
                    let path = field.path.index(index);
                    let Some(machine) = read_machine(&mut reader, item, path.clone()) else {
                        continue;
                    };
                    // Host names are one whatever their case (`gpu1.lab` and `GPU1.lab` are
                    // the one machine, else driven twice, as two environments); user names
                    // are not.
                    let login = format!(
                        "{}@{}:{}",
                        machine["user"].as_str().unwrap_or_default(),
                        machine["host"]
                            .as_str()
                            .unwrap_or_default()
                            .to_ascii_lowercase(),
                        machine["port"]
                    );
                    match listed.iter().find(|(earlier, _)| *earlier == login) {
                        Some((_, first)) => reader.error(
                            &path,
                            format!("repeats machineList[{first}] ({login}); list each machine once"),
                        ),
                        None => {
                            listed.push((login, index));
                            machines.push(machine);
                        }
                    }
                }
            }
            other => reader.error(
                &field.path,
                format!(
                    "expected a non-empty list of machines like [{{host: 10.0.0.2, user: alice}}], got {}",
                    knob_plugin_api::config::describe(other)
                ),
            ),
        }
    }
    fields.finish(&mut reader, &REMOTE_FIELDS);
    let mut canonical = Map::new();
    canonical.insert("machineList".into(), Value::Array(machines));
    canonical.insert("reuseMode".into(), reuse_mode);
    canonical.insert("knownHostsFile".into(), json!(known_hosts_file));
    canonical.insert("hostLossTimeout".into(), json!(host_loss_timeout));
    canonical.insert("agentRoot".into(), json!(agent_root));
    if let Some(problem) = code_problem(&canonical, context) {
        reader.error(&FieldPath::root(), problem);
    }
    reader.finish(canonical)
}

/// Why the trial code directory cannot be sent to the hosts (over NNI's 2000 files or 300 MiB
/// after the ignore files, a link out of it), if it cannot: known from the config alone, so
/// said here, once, and not by every trial's start, each of which failed on it (40 trials
/// FAILED in 1.5 s, the tuner fed 40 failures, none left to `knob resume`). Only the walk:
/// nothing is read or compressed. A directory the core refuses (missing) is its error.
fn code_problem(canonical: &Map<String, Value>, context: &ServiceContext) -> Option<String> {
    let dir = &context.trial.trial_code_directory;
    if dir.as_os_str().is_empty() || !dir.is_dir() {
        return None;
    }
    let args = class_args(&Value::Object(canonical.clone()), context);
    let exclude: Vec<PathBuf> = args["excludeFiles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(PathBuf::from)
        .collect();
    match crate::code_archive::check(dir, &Default::default(), &exclude) {
        Ok(()) => None,
        Err(e) => Some(format!(
            "trialCodeDirectory cannot be sent to the hosts: {e}"
        )),
    }
}

/// `knownHostsFile`: a file, or a path in an existing folder where `acceptNewHostKey` may
/// create it.
fn known_hosts_file(reader: &mut ConfigReader<'_>, field: &Field<'_>) -> Option<PathBuf> {
    let path = reader.path(field)?;
    let problem = if path.is_dir() {
        Some(format!(
            "{} is a folder; name the known_hosts file itself",
            quoted(&path)
        ))
    } else if !path.exists() && !path.parent().is_some_and(Path::is_dir) {
        Some(format!(
            "the folder of {} does not exist; create it or fix the path",
            quoted(&path)
        ))
    } else {
        None
    };
    match problem {
        Some(message) => {
            reader.error(&field.path, message);
            None
        }
        None => Some(path),
    }
}

/// A host as `ssh` takes one in its own place: an IP address or a name, not `user@host` nor
/// `host:port`, which passed `config check` and failed at the address lookup naming neither.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err(String::new());
    }
    if let Some((user, name)) = host.split_once('@') {
        return Err(format!(
            "{host:?} holds a user: write host: {name:?} and user: {user:?}"
        ));
    }
    let unbracketed = host.trim_start_matches('[').trim_end_matches(']');
    if host.contains(':') && unbracketed.parse::<std::net::Ipv6Addr>().is_err() {
        if let Some((name, port)) = host.rsplit_once(':') {
            return Err(format!(
                "{host:?} holds a port: write host: {:?} and port: {port}",
                name.trim_start_matches('[').trim_end_matches(']')
            ));
        }
    }
    Ok(())
}

fn read_machine(reader: &mut ConfigReader<'_>, item: &Value, path: FieldPath) -> Option<Value> {
    let before = reader.problem_count();
    let mut fields: Fields<'_> = reader.mapping(item, path)?;
    let host = fields
        .require(reader, "host", "the machine's IP address or host name")
        .and_then(|field| {
            reader.parse(&field, |value| {
                let text = value.as_str().map(str::trim).unwrap_or_default();
                check_host(text)
                    .map(|()| text.to_string())
                    .map_err(|why| match text.is_empty() {
                        true => format!(
                            "expected a non-empty string, got {}",
                            knob_plugin_api::config::describe(value)
                        ),
                        false => why,
                    })
            })
        });
    let user = fields
        .require(reader, "user", "the login user name")
        .and_then(|field| reader.non_empty_string(&field));
    let port = fields.take("port").and_then(|field| {
        reader.parse(&field, |value| match value.as_u64() {
            Some(port) if (1..=65535).contains(&port) => Ok(port),
            _ => Err(format!(
                "expected a port number from 1 to 65535, got {}",
                knob_plugin_api::config::describe(value)
            )),
        })
    });
    let password = fields
        .take("password")
        .and_then(|field| reader.secret(&field, Some(PASSWORD_VARIABLE)));
    let ssh_passphrase = fields
        .take("sshPassphrase")
        .and_then(|field| reader.secret(&field, Some(PASSPHRASE_VARIABLE)));
    let ssh_key_file = fields.take("sshKeyFile").and_then(|field| {
        let key = reader.path(&field)?;
        match key_file_problem(&key) {
            None => Some((key, field.path.clone())),
            Some(problem) => {
                reader.error(&field.path, problem);
                None
            }
        }
    });
    // An encrypted key without its passphrase (or with a wrong one) was found only once the
    // experiment ran, and the host was then tried again for an hour while every trial waited.
    let ssh_key_file = ssh_key_file.map(|(key, key_path)| {
        let passphrase = ssh_passphrase.as_deref().filter(|p| *p != REDACTED);
        if ssh_passphrase.is_none() || passphrase.is_some() {
            if let Some(problem) = key_passphrase_problem(&key, passphrase) {
                let at = match passphrase {
                    Some(_) => fields.path().field("sshPassphrase"),
                    None => key_path,
                };
                reader.error(&at, problem);
            }
        }
        key
    });
    let shortcut = |name: &str| {
        reader
            .context
            .shortcuts
            .get(name)
            .filter(|v| !v.is_null())
            .cloned()
    };
    let use_active_gpu_shortcut = shortcut("useActiveGpu");
    let per_gpu_shortcut = shortcut("maxTrialNumberPerGpu");
    let gpu_indices_shortcut = shortcut("gpuIndices");
    let use_active_gpu = fields
        .take("useActiveGpu")
        .and_then(|field| reader.boolean(&field))
        .map(Value::from)
        .or(use_active_gpu_shortcut)
        .unwrap_or(json!(false));
    let max_trial_number_per_gpu = fields
        .take("maxTrialNumberPerGpu")
        .and_then(|field| reader.integer::<u32>(&field, 1))
        .map(Value::from)
        .or(per_gpu_shortcut)
        .unwrap_or(json!(1));
    let gpu_indices = fields
        .take("gpuIndices")
        .and_then(|field| reader.gpu_indices(&field))
        .map(|indices| json!(indices))
        .or(gpu_indices_shortcut)
        .unwrap_or(Value::Null);
    let python_path = fields
        .take("pythonPath")
        .and_then(|field| reader.non_empty_string(&field));
    let accept_new_host_key = fields
        .take("acceptNewHostKey")
        .and_then(|field| reader.boolean(&field))
        .unwrap_or(false);
    let mut limits = Map::new();
    crate::limits::read(reader, &mut fields, &mut limits);
    fields.finish_renamed(reader, &MACHINE_FIELDS, "NNI v1's name", &MACHINE_V1_NAMES);
    if reader.problem_count() != before {
        return None;
    }
    let mut machine = json!({
        "host": host?,
        "port": port.unwrap_or(22),
        "user": user?,
        "password": password,
        "sshKeyFile": ssh_key_file,
        "sshPassphrase": ssh_passphrase,
        "useActiveGpu": use_active_gpu,
        "maxTrialNumberPerGpu": max_trial_number_per_gpu,
        "gpuIndices": gpu_indices,
        "pythonPath": python_path,
        "acceptNewHostKey": accept_new_host_key,
    });
    machine
        .as_object_mut()
        .expect("a machine is an object")
        .extend(limits);
    Some(machine)
}

/// The service's class args (what [`super::args::RemoteArgs::parse`] reads) from its checked
/// config (secrets in clear) and the experiment's context.
///
/// `excludeFiles` names what is left out of the code uploaded to the hosts, none of which trials
/// need: the files that may hold a secret in clear (the experiment's config file, which NNI users
/// keep in the trial code directory, and every machine's `sshKeyFile`), and the experiment's own
/// folder and the `experimentWorkingDirectory` that holds it, for a config that keeps them
/// inside the trial code directory: else every trial's code carried the live store and every
/// earlier experiment's trials (the archive leaves out only paths strictly inside the code
/// directory, so a working directory that *is* the code directory leaves out only this
/// experiment's folder).
pub fn class_args(config: &Value, context: &ServiceContext) -> Value {
    let mut args = Map::new();
    args.insert("experimentId".into(), json!(context.experiment_id));
    let empty = Map::new();
    let fields = config.as_object().unwrap_or(&empty);
    for (key, value) in fields {
        match key.as_str() {
            "hostLossTimeout" => {
                args.insert("hostLossTimeoutSecs".into(), value.clone());
            }
            _ if value.is_null() => {}
            _ => {
                args.insert(key.clone(), value.clone());
            }
        }
    }
    let key_files = fields
        .get("machineList")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|machine| machine.get("sshKeyFile").and_then(Value::as_str))
        .map(PathBuf::from);
    let experiment_folders = context
        .experiment_dir
        .iter()
        .flat_map(|dir| [Some(dir.clone()), dir.parent().map(PathBuf::from)])
        .flatten()
        // Known while only checking too, when the code directory is checked (`code_problem`).
        .chain(context.working_directory.clone());
    let mut exclude: Vec<PathBuf> = context
        .config_file
        .clone()
        .into_iter()
        .chain(key_files)
        .chain(experiment_folders)
        // The service wants absolute paths; the config's are already, a relative command-line
        // path is made absolute here (it is this process's working directory that it means).
        .filter_map(|path| std::path::absolute(path).ok())
        .collect();
    exclude.sort();
    exclude.dedup();
    // JSON holds only UTF-8 paths; a config file whose own path is not UTF-8 is then left out
    // only by an ignore file.
    let exclude: Vec<&str> = exclude.iter().filter_map(|path| path.to_str()).collect();
    args.insert("excludeFiles".into(), json!(exclude));
    args.insert("newExperiment".into(), json!(context.new_experiment));
    Value::Object(args)
}

/// What is wrong with `key` as an `sshKeyFile`, found here where the config's line is known:
/// the file is local, and a public key, a folder or another file given by mistake was otherwise
/// found only once the experiment had started, as a "corrupt key" that blamed the passphrase.
fn key_file_problem(key: &Path) -> Option<String> {
    use std::io::Read;
    let shown = quoted(key);
    let metadata = match std::fs::metadata(key) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("SSH key file {shown} does not exist"))
        }
        Err(e) => return Some(format!("cannot read SSH key file {shown}: {e}")),
    };
    if metadata.is_dir() {
        return Some(format!(
            "SSH key file {shown} is a folder; give the private key file in it (such as {})",
            quoted(&key.join("id_ed25519"))
        ));
    }
    // A key file is a few KiB; the start tells a public key.
    let mut start = Vec::new();
    let read = std::fs::File::open(key).and_then(|file| file.take(4096).read_to_end(&mut start));
    if let Err(e) = read {
        return Some(format!("cannot read SSH key file {shown}: {e}"));
    }
    let start = String::from_utf8_lossy(&start);
    if is_public_key(&start) {
        let private = key.with_extension("");
        let instead = if key.extension().is_some_and(|e| e == "pub") && private.is_file() {
            quoted(&private)
        } else {
            "the private key file".to_string()
        };
        return Some(format!(
            "SSH key file {shown} is a public key; give its private key ({instead})"
        ));
    }
    // Every private key format russh reads: PEM blocks (OpenSSH, PKCS#1, PKCS#8, SEC1) and
    // PuTTY's. Anything else could only fail at login, blamed on the passphrase.
    let private = start.contains("PRIVATE KEY-----")
        || start.trim_start().starts_with("PuTTY-User-Key-File-");
    if !private {
        return Some(format!(
            "SSH key file {shown} is not an SSH private key (no \"-----BEGIN ... PRIVATE KEY-----\" line); give the private key file, such as ~/.ssh/id_ed25519"
        ));
    }
    None
}

/// Why `key` cannot be decrypted with `passphrase` (none given: whether it needs one), if it
/// cannot. Never shows the passphrase.
fn key_passphrase_problem(key: &Path, passphrase: Option<&str>) -> Option<String> {
    let shown = quoted(key);
    // Only a key that is encrypted can have a wrong passphrase: one russh cannot read at all
    // is said at login, as before, naming the key.
    let Err(russh::keys::Error::KeyIsEncrypted) = russh::keys::load_secret_key(key, None) else {
        return None;
    };
    match passphrase {
        None => Some(format!(
            "SSH key file {shown} is encrypted: give its passphrase as sshPassphrase"
        )),
        Some(passphrase) => russh::keys::load_secret_key(key, Some(passphrase))
            .err()
            .map(|_| {
                format!(
                    "cannot decrypt SSH key file {shown} with this passphrase; give the key's own passphrase"
                )
            }),
    }
}

/// Whether `text` begins as a public key file: OpenSSH's one line (`ssh-ed25519 AAAA… comment`)
/// or RFC 4716's block.
fn is_public_key(text: &str) -> bool {
    let text = text.trim_start();
    if text.starts_with("---- BEGIN SSH2 PUBLIC KEY ----") {
        return true;
    }
    let mut words = text.split_whitespace();
    let kind = words.next().unwrap_or_default();
    let kinds = ["ssh-", "ecdsa-sha2-", "sk-ssh-", "sk-ecdsa-"];
    kinds.iter().any(|prefix| kind.starts_with(prefix))
        && words.next().is_some_and(|blob| blob.starts_with("AAAA"))
}
