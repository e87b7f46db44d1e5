//! The remote service's class args: NNI's `machineList` and knob's extension fields.
//!
//! Keys are matched ignoring case and underscores, as NNI does. Passwords and passphrases are
//! held as [`Secret`], whose `Debug` and `Display` never show them.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

/// The default for `hostLossTimeoutSecs`.
pub const DEFAULT_HOST_LOSS_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_HOST_LOSS_TIMEOUT_SECS: f64 = 24.0 * 3600.0;

/// A password or passphrase: only [`Secret::expose`] shows it.
#[derive(Clone, PartialEq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> String {
        self.0.clone()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<hidden>)")
    }
}

/// One entry of `machineList`.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<Secret>,
    pub ssh_key_file: Option<PathBuf>,
    pub ssh_passphrase: Option<Secret>,
    pub use_active_gpu: bool,
    pub max_trial_number_per_gpu: u32,
    pub gpu_indices: Option<Vec<u32>>,
    /// Put in front of `PATH` for the trials on this host.
    pub python_path: Option<String>,
    /// knob's extension: add an unknown host key to the known hosts file.
    pub accept_new_host_key: bool,
    /// The shared-machine limits of this host (see [`crate::limits`]); the other fields of
    /// `EnvironmentLimits` come from the fields above.
    pub limits: knob_gpu_sched::EnvironmentLimits,
}

impl Machine {
    /// `user@host:port`, how errors name the machine.
    pub fn target(&self) -> String {
        format!("{}@{}:{}", self.user, self.host, self.port)
    }
    /// The environment id the core sees.
    pub fn environment_id(&self) -> String {
        format!("remote:{}", self.target())
    }
    /// `host:port`.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Everything the class args say.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteArgs {
    pub experiment_id: String,
    /// A run of `knob create` (`ServiceContext::new_experiment`): a host's folder for this
    /// experiment id holds nothing of this experiment's, and is emptied at the first hello.
    pub new_experiment: bool,
    pub reuse_mode: bool,
    pub known_hosts_file: PathBuf,
    /// The agent's root directory on hosts; a leading `~/` is the remote user's home.
    pub agent_root: String,
    pub agent_binary: Option<PathBuf>,
    pub host_loss_timeout: Duration,
    pub machines: Vec<Machine>,
    /// knob's extension, set by the core: absolute paths of files that may hold secrets (the
    /// experiment's config file, SSH keys), never uploaded with the trial code.
    pub exclude_files: Vec<PathBuf>,
}

/// What is wrong with the class args, one line.
#[derive(Debug, thiserror::Error)]
#[error("classArgs of training service remote: {0}")]
pub struct ArgsError(pub String);

fn normalize(key: &str) -> String {
    key.chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

fn string_field(where_: &str, key: &str, value: &Value) -> Result<String, ArgsError> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ArgsError(format!("{where_}{key} must be a string, got {value}")))
}

fn bool_field(where_: &str, key: &str, value: &Value) -> Result<bool, ArgsError> {
    value
        .as_bool()
        .ok_or_else(|| ArgsError(format!("{where_}{key} must be true or false, got {value}")))
}

/// `gpuIndices` as NNI takes it: a list, a comma-separated string, or one integer.
fn gpu_indices(where_: &str, key: &str, value: &Value) -> Result<Option<Vec<u32>>, ArgsError> {
    let bad = || {
        ArgsError(format!(
            "{where_}{key} must be GPU indices (a list, \"0,1\" or 0), got {value}"
        ))
    };
    let one = |v: &Value| -> Result<u32, ArgsError> {
        match v {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(bad),
            Value::String(s) => s.trim().parse().map_err(|_| bad()),
            _ => Err(bad()),
        }
    };
    match value {
        Value::Null => Ok(None),
        Value::Array(items) => items.iter().map(one).collect::<Result<_, _>>().map(Some),
        Value::String(text) => text
            .split(',')
            .filter(|part| !part.trim().is_empty())
            .map(|part| one(&Value::String(part.to_string())))
            .collect::<Result<_, _>>()
            .map(Some),
        Value::Number(_) => Ok(Some(vec![one(value)?])),
        _ => Err(bad()),
    }
}

/// `excludeFiles`: a list of absolute paths (relative ones would depend on this process's working
/// directory, which the core does not promise).
fn absolute_paths(key: &str, value: &Value) -> Result<Vec<PathBuf>, ArgsError> {
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        other => {
            return Err(ArgsError(format!(
                "{key} must be a list of absolute paths, got {other}"
            )))
        }
    };
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item.as_str() {
            Some(path) if Path::new(path).is_absolute() => Ok(PathBuf::from(path)),
            _ => Err(ArgsError(format!(
                "{key}[{index}] must be an absolute path, got {item}"
            ))),
        })
        .collect()
}

fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), std::env::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

fn parse_machine(index: usize, value: &Value) -> Result<Machine, ArgsError> {
    let where_ = format!("machineList[{index}].");
    let fields = value.as_object().ok_or_else(|| {
        ArgsError(format!(
            "machineList[{index}] must be an object, got {value}"
        ))
    })?;
    let mut machine = Machine {
        host: String::new(),
        port: 22,
        user: String::new(),
        password: None,
        ssh_key_file: None,
        ssh_passphrase: None,
        use_active_gpu: false,
        max_trial_number_per_gpu: 1,
        gpu_indices: None,
        python_path: None,
        accept_new_host_key: false,
        limits: knob_gpu_sched::EnvironmentLimits::default(),
    };
    for (key, value) in fields {
        match normalize(key).as_str() {
            "host" | "ip" => machine.host = string_field(&where_, key, value)?,
            "port" => {
                machine.port = value
                    .as_u64()
                    .or_else(|| value.as_str().and_then(|s| s.parse().ok()))
                    .and_then(|p| u16::try_from(p).ok())
                    .filter(|p| *p > 0)
                    .ok_or_else(|| {
                        ArgsError(format!("{where_}{key} must be a port from 1 to 65535, got {value}"))
                    })?
            }
            "user" | "username" => machine.user = string_field(&where_, key, value)?,
            "password" | "passwd" => {
                if !value.is_null() {
                    // The value itself never goes into the message.
                    let text = value
                        .as_str()
                        .ok_or_else(|| ArgsError(format!("{where_}{key} must be a string")))?;
                    machine.password = Some(Secret(text.to_string()));
                }
            }
            "sshkeyfile" | "sshkeypath" => {
                if !value.is_null() {
                    machine.ssh_key_file = Some(expand_home(&string_field(&where_, key, value)?))
                }
            }
            "sshpassphrase" | "passphrase" => {
                if !value.is_null() {
                    let text = value
                        .as_str()
                        .ok_or_else(|| ArgsError(format!("{where_}{key} must be a string")))?;
                    machine.ssh_passphrase = Some(Secret(text.to_string()));
                }
            }
            "useactivegpu" => machine.use_active_gpu = bool_field(&where_, key, value)?,
            "maxtrialnumberpergpu" | "maxtrialnumpergpu" => {
                machine.max_trial_number_per_gpu = value
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        ArgsError(format!("{where_}{key} must be an integer of at least 1, got {value}"))
                    })?
            }
            "gpuindices" => machine.gpu_indices = gpu_indices(&where_, key, value)?,
            "pythonpath" => {
                if !value.is_null() {
                    machine.python_path = Some(string_field(&where_, key, value)?)
                }
            }
            "acceptnewhostkey" => machine.accept_new_host_key = bool_field(&where_, key, value)?,
            _ if crate::limits::set(&mut machine.limits, key, value)
                .map_err(|e| ArgsError(format!("{where_}{e}")))? => {}
            _ => {
                return Err(ArgsError(format!(
                    "{where_}{key} is not a machine field (host, port, user, password, sshKeyFile, sshPassphrase, useActiveGpu, maxTrialNumberPerGpu, gpuIndices, pythonPath, acceptNewHostKey, maxCpuUtilization, maxMemoryUtilization, memoryReserve, maxGpuMemoryUtilization, gpuMemoryReserve)"
                )))
            }
        }
    }
    if machine.host.trim().is_empty() {
        return Err(ArgsError(format!("{where_}host is missing")));
    }
    if machine.user.trim().is_empty() {
        return Err(ArgsError(format!(
            "{where_}user is missing (the account to log in as on {})",
            machine.host
        )));
    }
    if let Some(path) = &machine.ssh_key_file {
        if !path.is_file() {
            return Err(ArgsError(format!(
                "{where_}sshKeyFile {} of {} is not a readable file",
                path.display(),
                machine.target()
            )));
        }
    }
    Ok(machine)
}

impl RemoteArgs {
    pub fn parse(class_args: &Value) -> Result<RemoteArgs, ArgsError> {
        let empty = Map::new();
        let fields = match class_args {
            Value::Object(fields) => fields,
            Value::Null => &empty,
            other => return Err(ArgsError(format!("expected an object, got {other}"))),
        };
        let mut args = RemoteArgs {
            experiment_id: String::new(),
            new_experiment: false,
            reuse_mode: true,
            known_hosts_file: expand_home("~/.ssh/known_hosts"),
            agent_root: "~/.knob".to_string(),
            agent_binary: None,
            host_loss_timeout: DEFAULT_HOST_LOSS_TIMEOUT,
            machines: Vec::new(),
            exclude_files: Vec::new(),
        };
        let mut machine_list = None;
        for (key, value) in fields {
            match normalize(key).as_str() {
                "experimentid" => args.experiment_id = string_field("", key, value)?,
                "newexperiment" => args.new_experiment = bool_field("", key, value)?,
                "reusemode" => args.reuse_mode = bool_field("", key, value)?,
                "knownhostsfile" => {
                    args.known_hosts_file = expand_home(&string_field("", key, value)?)
                }
                "agentroot" => args.agent_root = string_field("", key, value)?,
                "agentbinary" => {
                    args.agent_binary = Some(expand_home(&string_field("", key, value)?))
                }
                "hostlosstimeoutsecs" => {
                    args.host_loss_timeout = value
                        .as_f64()
                        .filter(|secs| (0.0..=MAX_HOST_LOSS_TIMEOUT_SECS).contains(secs))
                        .map(Duration::from_secs_f64)
                        .ok_or_else(|| {
                            ArgsError(format!(
                                "{key} must be a number of seconds from 0 to {MAX_HOST_LOSS_TIMEOUT_SECS}, got {value}"
                            ))
                        })?
                }
                "machinelist" => machine_list = Some(value),
                "excludefiles" => args.exclude_files = absolute_paths(key, value)?,
                // The core's fields (platform, trialGpuNumber, ...) are not the service's.
                _ => {}
            }
        }
        if args.experiment_id.is_empty() {
            return Err(ArgsError("experimentId is missing".to_string()));
        }
        if args.agent_root.trim().is_empty() {
            return Err(ArgsError("agentRoot must not be empty".to_string()));
        }
        let machines = match machine_list {
            Some(Value::Array(items)) if !items.is_empty() => items,
            Some(Value::Array(_)) | None => {
                return Err(ArgsError(
                    "machineList is missing or empty: list at least one machine (host, user, and sshKeyFile or password)".to_string(),
                ))
            }
            Some(other) => {
                return Err(ArgsError(format!(
                    "machineList must be a list of machines, got {other}"
                )))
            }
        };
        for (index, value) in machines.iter().enumerate() {
            let machine = parse_machine(index, value)?;
            if let Some(earlier) = args
                .machines
                .iter()
                .find(|m| m.environment_id() == machine.environment_id())
            {
                return Err(ArgsError(format!(
                    "machineList[{index}] repeats {}",
                    earlier.target()
                )));
            }
            args.machines.push(machine);
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn machines_parse_and_secrets_stay_hidden() {
        let args = RemoteArgs::parse(&json!({
            "experimentId": "e1",
            "reuse_mode": false,
            "machineList": [
                {"host": "10.0.0.2", "port": 2202, "user": "me", "password": "hunter2",
                 "gpuIndices": "0,2", "max_trial_number_per_gpu": 2, "pythonPath": "/opt/py/bin"},
            ],
        }))
        .unwrap();
        assert!(!args.reuse_mode);
        let machine = &args.machines[0];
        assert_eq!(machine.environment_id(), "remote:me@10.0.0.2:2202");
        assert_eq!(machine.gpu_indices, Some(vec![0, 2]));
        assert_eq!(machine.max_trial_number_per_gpu, 2);
        assert!(!format!("{args:?}").contains("hunter2"));
    }

    #[test]
    fn bad_args_are_named() {
        let err = |v: Value| RemoteArgs::parse(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"experimentId": "e", "machineList": []})),
            "classArgs of training service remote: machineList is missing or empty: list at least one machine (host, user, and sshKeyFile or password)"
        );
        assert_eq!(
            err(json!({"experimentId": "e", "machineList": [{"host": "h"}]})),
            "classArgs of training service remote: machineList[0].user is missing (the account to log in as on h)"
        );
        assert_eq!(
            err(json!({"experimentId": "e", "machineList": [{"host": "h", "user": "u", "port": 70000}]})),
            "classArgs of training service remote: machineList[0].port must be a port from 1 to 65535, got 70000"
        );
        let message = err(
            json!({"experimentId": "e", "machineList": [{"host": "h", "user": "u", "password": 12345}]}),
        );
        assert!(!message.contains("12345"), "{message}");
        assert_eq!(
            err(
                json!({"experimentId": "e", "machineList": [{"host": "h", "user": "u"}, {"host": "h", "user": "u", "port": 22}]})
            ),
            "classArgs of training service remote: machineList[1] repeats u@h:22"
        );
    }

    #[test]
    fn exclude_files_are_absolute_paths() {
        let parse = |exclude: Value| {
            RemoteArgs::parse(&json!({
                "experimentId": "e",
                "machineList": [{"host": "h", "user": "u"}],
                "exclude_files": exclude,
            }))
        };
        let args = parse(json!(["/work/code/config.yml", "/home/me/.ssh/id_ed25519"])).unwrap();
        assert_eq!(
            args.exclude_files,
            [
                PathBuf::from("/work/code/config.yml"),
                PathBuf::from("/home/me/.ssh/id_ed25519")
            ]
        );
        assert!(parse(Value::Null).unwrap().exclude_files.is_empty());
        let absent = RemoteArgs::parse(&json!({
            "experimentId": "e",
            "machineList": [{"host": "h", "user": "u"}],
        }))
        .unwrap();
        assert!(absent.exclude_files.is_empty());

        let err = |exclude: Value| parse(exclude).unwrap_err().to_string();
        assert_eq!(
            err(json!("/work/code/config.yml")),
            "classArgs of training service remote: exclude_files must be a list of absolute paths, got \"/work/code/config.yml\""
        );
        assert_eq!(
            err(json!(["/a", "config.yml"])),
            "classArgs of training service remote: exclude_files[1] must be an absolute path, got \"config.yml\""
        );
        assert_eq!(
            err(json!([7])),
            "classArgs of training service remote: exclude_files[0] must be an absolute path, got 7"
        );
        for bad in [json!(["config.yml"]), json!({"a": 1}), json!(true)] {
            assert!(!err(bad).contains('\n'));
        }
    }
}
