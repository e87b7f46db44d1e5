//! Reading `trainingService`: one mapping, or a list of them (NNI's hybrid mode).

use super::model::{LocalConfig, MachineConfig, RemoteConfig, TrainingServiceConfig};
use super::reader::{quoted, Field, Fields, Reader};
use super::secret::{Secret, REDACTED};
use super::units;
use super::yaml::{Node, Pos, Value};

/// Training-service fields that may be written at the top level and are copied into every
/// training service (and, for remote, every machine) that does not set them itself.
///
/// NNI's own shortcuts go the other way (`trialCommand` & co. written at top level); these are
/// knob's: a one-machine config can say `useActiveGpu: true` without a `trainingService` block of
/// its own.
#[derive(Debug, Default, Clone)]
pub(crate) struct Shortcuts {
    pub use_active_gpu: Option<bool>,
    pub max_trial_number_per_gpu: Option<u32>,
    pub gpu_indices: Option<Vec<u32>>,
    pub reuse_mode: Option<bool>,
}

/// A value with the place it was written, to compare per-service settings with top-level ones.
pub(crate) struct Located<T> {
    pub value: T,
    pub pos: Option<Pos>,
    pub path: String,
}

/// NNI lets each training service carry its own `trialCommand`, `trialCodeDirectory` and
/// `trialGpuNumber`; knob runs one of each per experiment, so these must agree with the top level
/// (or stand in for it when it is not set).
#[derive(Default)]
pub(crate) struct ServiceTrialSettings {
    pub trial_command: Option<Located<String>>,
    pub trial_code_directory: Option<Located<std::path::PathBuf>>,
    pub trial_gpu_number: Option<Located<u32>>,
}

const SUPPORTED: &str = r#""local", "remote""#;
/// NNI platforms knob recognises but does not run.
const NNI_ONLY_PLATFORMS: [&str; 8] = [
    "openpai",
    "aml",
    "dlc",
    "kubeflow",
    "frameworkcontroller",
    "adl",
    "dlts",
    "hybrid",
];
const COMMON_FIELDS: [&str; 5] = [
    "platform",
    "trialCommand",
    "trialCodeDirectory",
    "trialGpuNumber",
    "nniManagerIp",
];
const LOCAL_FIELDS: [&str; 4] = [
    "useActiveGpu",
    "maxTrialNumberPerGpu",
    "gpuIndices",
    "reuseMode",
];
const REMOTE_FIELDS: [&str; 5] = [
    "machineList",
    "reuseMode",
    "knownHostsFile",
    "hostLossTimeout",
    "agentRoot",
];
const MACHINE_FIELDS: [&str; 11] = [
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
];

/// Reads the `trainingService` field: each service, and the trial settings each one carries.
pub(crate) fn read_training_services(
    reader: &mut Reader,
    field: &Field<'_>,
    shortcuts: &Shortcuts,
) -> Option<(Vec<TrainingServiceConfig>, Vec<ServiceTrialSettings>)> {
    let items: Vec<(&Node, String)> = match &field.node.value {
        Value::Map(_) => vec![(field.node, field.path.clone())],
        Value::Seq(items) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(index, item)| (item, format!("{}[{index}]", field.path)))
            .collect(),
        Value::Seq(_) => {
            reader.error(
                field.node.pos,
                &field.path,
                "expected at least one training service",
            );
            return None;
        }
        _ => {
            let message = format!(
                "expected a mapping like {{platform: local}} or a list of them, got {}",
                field.node.describe()
            );
            reader.error(field.node.pos, &field.path, message);
            return None;
        }
    };
    let errors_before = reader.errors.len();
    let mut services: Vec<TrainingServiceConfig> = Vec::new();
    let mut settings = Vec::new();
    for (node, path) in items {
        let Some((service, service_settings)) = read_service(reader, node, &path, shortcuts) else {
            continue;
        };
        if services
            .iter()
            .any(|other| other.platform() == service.platform())
        {
            let message = format!(
                "platform {:?} is listed twice; list each platform once (put every remote host in one machineList)",
                service.platform()
            );
            reader.error(node.pos, &path, message);
            continue;
        }
        services.push(service);
        settings.push(service_settings);
    }
    (reader.errors.len() == errors_before).then_some((services, settings))
}

fn read_service(
    reader: &mut Reader,
    node: &Node,
    path: &str,
    shortcuts: &Shortcuts,
) -> Option<(TrainingServiceConfig, ServiceTrialSettings)> {
    let mut fields = Fields::open(reader, node, path)?;
    let platform = match fields.take("platform") {
        Some(field) => reader
            .non_empty_string(&field)
            .map(|name| (name.to_ascii_lowercase(), field)),
        None => {
            let platform_path = fields.child_path("platform");
            reader.error(
                fields.pos,
                &platform_path,
                format!("required: one of {SUPPORTED}"),
            );
            None
        }
    };
    let settings = read_trial_settings(reader, &mut fields);
    let (platform, platform_field) = platform?;
    let service = match platform.as_str() {
        "local" => {
            let local = read_local(reader, &mut fields, shortcuts);
            fields.finish(reader, &[&COMMON_FIELDS[..], &LOCAL_FIELDS[..]].concat());
            TrainingServiceConfig::Local(local?)
        }
        "remote" => {
            let remote = read_remote(reader, &mut fields, shortcuts);
            fields.finish(reader, &[&COMMON_FIELDS[..], &REMOTE_FIELDS[..]].concat());
            TrainingServiceConfig::Remote(remote?)
        }
        other => {
            // The remaining fields belong to a platform we do not read: no point reporting them.
            let message = if NNI_ONLY_PLATFORMS.contains(&other) {
                format!("NNI's {other:?} platform is not supported by knob; supported: {SUPPORTED}")
            } else {
                let hint = ["local", "remote"]
                    .into_iter()
                    .find(|known| strsim::damerau_levenshtein(known, other) <= 2)
                    .map(|known| format!(" (did you mean {known:?}?)"))
                    .unwrap_or_default();
                format!("unknown platform {other:?}{hint}; supported: {SUPPORTED}")
            };
            reader.error(platform_field.node.pos, &platform_field.path, message);
            return None;
        }
    };
    Some((service, settings))
}

fn read_trial_settings(reader: &mut Reader, fields: &mut Fields<'_>) -> ServiceTrialSettings {
    let mut settings = ServiceTrialSettings::default();
    if let Some(field) = fields.take("trialCommand") {
        settings.trial_command = reader.non_empty_string(&field).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("trialCodeDirectory") {
        settings.trial_code_directory = reader.directory(&field).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("trialGpuNumber") {
        settings.trial_gpu_number = reader.integer(&field, 0).map(|value| Located {
            value,
            pos: field.node.pos,
            path: field.path.clone(),
        });
    }
    if let Some(field) = fields.take("nniManagerIp") {
        reader.string(&field);
        reader.warn(field.node.pos, &field.path, NNI_MANAGER_IP_IGNORED);
    }
    settings
}

pub(crate) const NNI_MANAGER_IP_IGNORED: &str =
    "ignored: knob reaches training machines over SSH and needs no route back to the manager";

fn read_local(
    reader: &mut Reader,
    fields: &mut Fields<'_>,
    shortcuts: &Shortcuts,
) -> Option<LocalConfig> {
    let errors_before = reader.errors.len();
    let use_active_gpu = fields
        .take("useActiveGpu")
        .and_then(|field| reader.boolean(&field));
    let max_trial_number_per_gpu = fields
        .take("maxTrialNumberPerGpu")
        .and_then(|field| reader.integer(&field, 1));
    let gpu_indices = fields
        .take("gpuIndices")
        .and_then(|field| reader.parse(&field, units::gpu_indices));
    let reuse_mode = fields
        .take("reuseMode")
        .and_then(|field| reader.boolean(&field));
    (reader.errors.len() == errors_before).then(|| LocalConfig {
        use_active_gpu: use_active_gpu.or(shortcuts.use_active_gpu).unwrap_or(false),
        max_trial_number_per_gpu: max_trial_number_per_gpu
            .or(shortcuts.max_trial_number_per_gpu)
            .unwrap_or(1),
        gpu_indices: gpu_indices.or_else(|| shortcuts.gpu_indices.clone()),
        reuse_mode: reuse_mode.or(shortcuts.reuse_mode).unwrap_or(false),
    })
}

fn read_remote(
    reader: &mut Reader,
    fields: &mut Fields<'_>,
    shortcuts: &Shortcuts,
) -> Option<RemoteConfig> {
    let errors_before = reader.errors.len();
    let reuse_mode = fields
        .take("reuseMode")
        .and_then(|field| reader.boolean(&field));
    let known_hosts_file = fields
        .take("knownHostsFile")
        .and_then(|field| known_hosts_file(reader, &field));
    let host_loss_timeout = fields.take("hostLossTimeout").and_then(|field| {
        let seconds = reader.parse(&field, units::duration_seconds)?;
        if seconds == 0 {
            let message =
                "must be at least 1 second (a host whose connection drops needs time to come back)";
            reader.error(field.node.pos, &field.path, message);
            return None;
        }
        Some(std::time::Duration::from_secs(seconds))
    });
    // A path on the hosts, so it is not resolved against the config's folder here.
    let agent_root = fields
        .take("agentRoot")
        .and_then(|field| reader.non_empty_string(&field));
    let mut machine_list = Vec::new();
    match fields.take("machineList") {
        None => {
            let path = fields.child_path("machineList");
            reader.error(
                fields.pos,
                &path,
                "required: a list of machines, each with at least host and user",
            );
        }
        Some(field) => match &field.node.value {
            Value::Seq(items) if !items.is_empty() => {
                for (index, item) in items.iter().enumerate() {
                    let path = format!("{}[{index}]", field.path);
                    machine_list.extend(read_machine(reader, item, &path, shortcuts));
                }
            }
            _ => {
                let message = format!(
                    "expected a non-empty list of machines like [{{host: 10.0.0.2, user: alice}}], got {}",
                    field.node.describe()
                );
                reader.error(field.node.pos, &field.path, message);
            }
        },
    }
    (reader.errors.len() == errors_before).then(|| RemoteConfig {
        machine_list,
        reuse_mode: reuse_mode.or(shortcuts.reuse_mode).unwrap_or(true),
        known_hosts_file,
        host_loss_timeout: host_loss_timeout.unwrap_or(super::model::DEFAULT_HOST_LOSS_TIMEOUT),
        agent_root,
    })
}

/// `knownHostsFile`: a file, or a path in an existing folder where `acceptNewHostKey` may
/// create it.
fn known_hosts_file(reader: &mut Reader, field: &Field<'_>) -> Option<std::path::PathBuf> {
    let path = reader.path(field)?;
    let problem = if path.is_dir() {
        Some(format!(
            "{} is a folder; name the known_hosts file itself",
            quoted(&path)
        ))
    } else if !path.exists() && !path.parent().is_some_and(std::path::Path::is_dir) {
        Some(format!(
            "the folder of {} does not exist; create it or fix the path",
            quoted(&path)
        ))
    } else {
        None
    };
    match problem {
        Some(message) => {
            reader.error(field.node.pos, &field.path, message);
            None
        }
        None => Some(path),
    }
}

fn read_machine(
    reader: &mut Reader,
    node: &Node,
    path: &str,
    shortcuts: &Shortcuts,
) -> Option<MachineConfig> {
    let errors_before = reader.errors.len();
    let mut fields = Fields::open(reader, node, path)?;
    let host = required_string(
        reader,
        &mut fields,
        "host",
        "the machine's IP address or host name",
    );
    let user = required_string(reader, &mut fields, "user", "the login user name");
    let port = fields.take("port").and_then(|field| {
        reader.parse(&field, |node| match node.value {
            Value::Int(port) if (1..=65535).contains(&port) => Ok(port as u16),
            _ => Err(format!(
                "expected a port number from 1 to 65535, got {}",
                node.describe()
            )),
        })
    });
    let password = fields
        .take("password")
        .and_then(|field| secret(reader, &field));
    let ssh_passphrase = fields
        .take("sshPassphrase")
        .and_then(|field| secret(reader, &field));
    let ssh_key_file = fields.take("sshKeyFile").and_then(|field| {
        let path = reader.path(&field)?;
        if path.is_file() {
            Some(path)
        } else {
            reader.error(
                field.node.pos,
                &field.path,
                format!("SSH key file {} does not exist", quoted(&path)),
            );
            None
        }
    });
    let use_active_gpu = fields
        .take("useActiveGpu")
        .and_then(|field| reader.boolean(&field));
    let max_trial_number_per_gpu = fields
        .take("maxTrialNumberPerGpu")
        .and_then(|field| reader.integer(&field, 1));
    let gpu_indices = fields
        .take("gpuIndices")
        .and_then(|field| reader.parse(&field, units::gpu_indices));
    let python_path = fields
        .take("pythonPath")
        .and_then(|field| reader.non_empty_string(&field));
    let accept_new_host_key = fields
        .take("acceptNewHostKey")
        .and_then(|field| reader.boolean(&field));
    fields.finish(reader, &MACHINE_FIELDS);
    if reader.errors.len() != errors_before {
        return None;
    }
    Some(MachineConfig {
        host: host?,
        port: port.unwrap_or(22),
        user: user?,
        password,
        ssh_key_file,
        ssh_passphrase,
        use_active_gpu: use_active_gpu.or(shortcuts.use_active_gpu).unwrap_or(false),
        max_trial_number_per_gpu: max_trial_number_per_gpu
            .or(shortcuts.max_trial_number_per_gpu)
            .unwrap_or(1),
        gpu_indices: gpu_indices.or_else(|| shortcuts.gpu_indices.clone()),
        python_path,
        accept_new_host_key: accept_new_host_key.unwrap_or(false),
    })
}

/// A required string field; a missing or null one is reported at its mapping.
pub(crate) fn required_string(
    reader: &mut Reader,
    fields: &mut Fields<'_>,
    name: &str,
    what: &str,
) -> Option<String> {
    match fields.take(name) {
        Some(field) => reader.non_empty_string(&field),
        None => {
            let path = fields.child_path(name);
            reader.error(fields.pos, &path, format!("required: {what}"));
            None
        }
    }
}

fn secret(reader: &mut Reader, field: &Field<'_>) -> Option<Secret> {
    let value = reader.string(field)?;
    if value == REDACTED {
        let message = format!(
            "{REDACTED:?} is the placeholder knob prints instead of a secret; write the real value (or use sshKeyFile)"
        );
        reader.error(field.node.pos, &field.path, message);
        return None;
    }
    Some(Secret::new(value))
}
