//! NNI v1 configs, converted to a v2 document as NNI 2.x and 3.0 do before they read it.
//!
//! NNI's `nnictl create` takes a config with `trainingServicePlatform` for a v1 one and runs
//! `nni/experiment/config/convert.py` `to_v2` on it; this module is that converter for the
//! platforms knob has (`local`, `remote`). It works on the YAML tree, before the v2 reader, so
//! every v2 rule (paths relative to the config, durations, secrets, the training service's own
//! checks) applies to a converted config unchanged, and each converted value keeps the line and
//! column it was written at. [`Converted::v1_field`] turns a v2 field path back into the v1 one
//! the user wrote, for messages.
//!
//! Where knob departs from `to_v2`, on purpose:
//! - what `to_v2` leaves behind with a logged "not fully converted" (and so ignores) is an
//!   error here: an unknown field, a field of another platform, a custom algorithm missing a
//!   part;
//! - v1's `maxTrialDuration` is kept (v2 has the same field; `to_v2` drops it);
//! - a machine's `passphrase` becomes `sshPassphrase` (`to_v2` writes `passphrase`, which NNI's
//!   own v2 schema then refuses);
//! - `advisor` becomes `tuner` (NNI's v2 reader does the same right after, with a deprecation);
//! - a tuner, assessor or advisor may have knob's own `pythonInterpreter`,
//!   `useNniImplementation` and `dispatcherConnectTimeout`, kept as they are: the errors of
//!   NNI's dispatcher, which runs a v1 custom algorithm too, tell the user to set them;
//! - `authorName` and `description` are dropped silently; the other fields v2 dropped
//!   (`multiThread`, `versionCheck`, `logCollection`, `includeIntermediateResults`) with a warning.

use super::experiment::{NNI_DISPATCH_FIELDS, TOP_FIELDS};
use super::reader::{normalize_key, Field, Fields, Reader};
use super::yaml::{Node, Pos, Value};

/// Every top-level field of NNI's v1 schema (`nni/tools/nnictl/config_schema.py`) that knob
/// reads, the platform blocks of other platforms included (they are refused by name).
const V1_TOP_FIELDS: [&str; 34] = [
    "authorName",
    "experimentName",
    "description",
    "trialConcurrency",
    "maxExecDuration",
    "maxTrialDuration",
    "maxTrialNum",
    "trainingServicePlatform",
    "searchSpacePath",
    "multiPhase",
    "multiThread",
    "nniManagerIp",
    "logDir",
    "debug",
    "versionCheck",
    "logLevel",
    "logCollection",
    "useAnnotation",
    "tuner",
    "advisor",
    "assessor",
    "localConfig",
    "remoteConfig",
    "machineList",
    "sharedStorage",
    "trial",
    "paiConfig",
    "kubeflowConfig",
    "frameworkcontrollerConfig",
    "amlConfig",
    "dltsConfig",
    "adlConfig",
    "hybridConfig",
    "paiYarnConfig",
];
/// Blocks that configure a platform knob has no v1 conversion for, and that platform.
const OTHER_PLATFORM_BLOCKS: [(&str, &str); 8] = [
    ("paiConfig", "pai"),
    ("kubeflowConfig", "kubeflow"),
    ("frameworkcontrollerConfig", "frameworkcontroller"),
    ("amlConfig", "aml"),
    ("dltsConfig", "dlts"),
    ("adlConfig", "adl"),
    ("hybridConfig", "hybrid"),
    ("paiYarnConfig", "paiYarn"),
];
const V1_TRIAL_FIELDS: [&str; 4] = ["command", "codeDir", "gpuNum", "nasMode"];
/// Fields of the `trial` of NNI v1's cluster platforms (pai, kubeflow, frameworkcontroller,
/// aml, dlts, adl), which a config copied from one of them carries: `to_v2` moves them only
/// for those platforms and drops them unsaid for local and remote. (v1 name, what knob has.)
const V1_CLUSTER_TRIAL_FIELDS: [(&str, &str); 12] = [
    ("cpuNum", "trialCpuNumber"),
    ("memoryMB", "trialMemorySize"),
    ("image", ""),
    ("virtualCluster", ""),
    ("shmMB", ""),
    ("nniManagerNFSMountPath", ""),
    ("containerNFSMountPath", ""),
    ("paiStorageConfigName", ""),
    ("paiConfigPath", ""),
    ("worker", ""),
    ("ps", ""),
    ("taskRoles", ""),
];
const V1_LOCAL_FIELDS: [&str; 3] = ["gpuIndices", "maxTrialNumPerGpu", "useActiveGpu"];
const V1_REMOTE_FIELDS: [&str; 1] = ["reuse"];
const V1_MACHINE_FIELDS: [&str; 10] = [
    "ip",
    "port",
    "username",
    "sshKeyPath",
    "passphrase",
    "passwd",
    "gpuIndices",
    "maxTrialNumPerGpu",
    "useActiveGpu",
    "pythonPath",
];
/// (v1 name, v2 name) of a machine's fields, `to_v2`'s table.
const MACHINE_RENAMES: [(&str, &str); 10] = [
    ("ip", "host"),
    ("port", "port"),
    ("username", "user"),
    ("sshKeyPath", "sshKeyFile"),
    ("passphrase", "sshPassphrase"),
    ("gpuIndices", "gpuIndices"),
    ("maxTrialNumPerGpu", "maxTrialNumberPerGpu"),
    ("useActiveGpu", "useActiveGpu"),
    ("pythonPath", "pythonPath"),
    ("passwd", "password"),
];
/// Where the v2 reader names a field the v1 config may leave out, the v1 name to say instead.
/// (A missing `searchSpacePath` and `machineList` the conversion reports itself, in v1 words;
/// these names let the v2 reader's own reports of them be dropped as said already.)
const MISSING_FIELD_RENAMES: [(&str, &str); 5] = [
    ("trialCommand", "trial.command"),
    ("trialCodeDirectory", "trial.codeDir"),
    ("searchSpace", "searchSpacePath"),
    ("trainingService", "trainingServicePlatform"),
    ("trainingService.machineList", "machineList"),
];

/// A v1 config as a v2 document.
pub(crate) struct Converted {
    pub root: Node,
    /// (v2 field path, v1 field path) of every field moved or renamed.
    renames: Vec<(String, String)>,
}

impl Converted {
    /// The v1 path for a v2 field path the v2 reader reported (`trainingService.machineList[0].host`
    /// is `machineList[0].ip`); unchanged where the field kept its name.
    pub fn v1_field(&self, v2_field: &str) -> String {
        let best = self
            .renames
            .iter()
            .filter(|(v2, _)| {
                v2_field == v2
                    || v2_field
                        .strip_prefix(v2.as_str())
                        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
            })
            .max_by_key(|(v2, _)| v2.len());
        match best {
            Some((v2, v1)) => format!("{v1}{}", &v2_field[v2.len()..]),
            None => v2_field.to_owned(),
        }
    }
}

/// True for a document NNI would convert: a mapping with `trainingServicePlatform`.
pub(crate) fn is_v1(root: &Node) -> bool {
    let Value::Map(entries) = &root.value else {
        return false;
    };
    entries
        .iter()
        .any(|(key, _)| normalize_key(&key.key_text()) == "trainingserviceplatform")
}

/// Converts a v1 document (see [`is_v1`]). Problems go to `reader` under their v1 names.
pub(crate) fn convert(reader: &mut Reader, root: &Node) -> Converted {
    let Some(mut fields) = Fields::open(reader, root, "") else {
        // Not a mapping, so not v1 (`is_v1`): the error is recorded.
        return Converted {
            root: root.clone(),
            renames: Vec::new(),
        };
    };
    let mut out = Builder::default();
    out.renames.extend(
        MISSING_FIELD_RENAMES
            .iter()
            .map(|(v2, v1)| ((*v2).to_owned(), (*v1).to_owned())),
    );

    // v2 fields mixed into a v1 config: NNI would not read them either.
    for v2_only in TOP_FIELDS
        .iter()
        .filter(|name| !V1_TOP_FIELDS.iter().any(|v1| same_key(v1, name)))
    {
        if let Some(field) = fields.take(v2_only) {
            let message = "an NNI v2 field in an NNI v1 config (trainingServicePlatform makes it \
                           v1); write the whole config in one format (NNI v2: trainingService: \
                           {platform: ...} instead of trainingServicePlatform)";
            reader.error(field.node.pos, &field.path, message);
        }
    }

    // Dropped by NNI without a trace in v2.
    fields.take("authorName");
    fields.take("description");
    out.move_field(fields.take("experimentName"), "experimentName");
    out.move_field(fields.take("trialConcurrency"), "trialConcurrency");
    out.move_field(fields.take("maxExecDuration"), "maxExperimentDuration");
    out.move_field(fields.take("maxTrialDuration"), "maxTrialDuration");
    out.move_field(fields.take("maxTrialNum"), "maxTrialNumber");
    match fields.take("searchSpacePath") {
        Some(field) => out.move_field(Some(field), "searchSpaceFile"),
        // The v2 reader would ask for v2's searchSpace or searchSpaceFile, which v1 refuses.
        None => reader.error(
            None,
            "searchSpacePath",
            "required: the search space file (JSON or YAML), e.g. searchSpacePath: \
             search_space.json; an empty space is a file holding {}",
        ),
    }
    if let Some(field) = fields.take("multiPhase") {
        if reader.boolean(&field) == Some(true) {
            let message = "NNI v1 multi-phase trials are not supported (NNI 2.0 dropped them); \
                           remove multiPhase and have each trial ask for its parameters once";
            reader.error(field.node.pos, &field.path, message);
        }
    }
    for dropped in ["multiThread", "versionCheck", "logCollection"] {
        drop_with_warning(reader, fields.take(dropped));
    }
    out.move_field(fields.take("nniManagerIp"), "nniManagerIp");
    out.move_field(fields.take("logDir"), "experimentWorkingDirectory");
    out.move_field(fields.take("debug"), "debug");
    out.move_field(fields.take("logLevel"), "logLevel");
    out.move_field(fields.take("useAnnotation"), "useAnnotation");

    if let Some(trial) = fields.take("trial") {
        if let Some(mut trial_fields) = Fields::open(reader, trial.node, &trial.path) {
            out.move_field(trial_fields.take("command"), "trialCommand");
            out.move_field(trial_fields.take("codeDir"), "trialCodeDirectory");
            out.move_field(trial_fields.take("gpuNum"), "trialGpuNumber");
            if let Some(field) = trial_fields.take("nasMode") {
                let message = "NNI v1 NAS modes are not supported (knob runs hyperparameter \
                               experiments); remove nasMode";
                reader.error(field.node.pos, &field.path, message);
            }
            for (name, v2_name) in V1_CLUSTER_TRIAL_FIELDS {
                if let Some(field) = trial_fields.take(name) {
                    let instead = if v2_name.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " (to limit what a trial gets, write {v2_name} in an NNI v2 config)"
                        )
                    };
                    let message = format!(
                        "a trial field of NNI v1's cluster platforms (pai, kubeflow, aml, ...), \
                         which NNI ignores on local and remote; remove it{instead}"
                    );
                    reader.error(field.node.pos, &field.path, message);
                }
            }
            trial_fields.finish(reader, &V1_TRIAL_FIELDS);
        }
    }

    let tuner = fields.take("tuner");
    let advisor = fields.take("advisor");
    match (tuner, advisor) {
        (Some(tuner), Some(advisor)) => {
            convert_algorithm(reader, &mut out, &tuner, "Tuner", "tuner");
            let message = "tuner is set too; an NNI v1 config sets one of tuner and advisor";
            reader.error(advisor.node.pos, &advisor.path, message);
        }
        (Some(tuner), None) => convert_algorithm(reader, &mut out, &tuner, "Tuner", "tuner"),
        (None, Some(advisor)) => {
            convert_algorithm(reader, &mut out, &advisor, "Advisor", "tuner");
        }
        // The v2 reader's "required" would show v2's {name: TPE}, which a v1 tuner refuses.
        (None, None) => reader.error(
            None,
            "tuner",
            "required: the tuning algorithm, e.g. tuner: {builtinTunerName: TPE, classArgs: \
             {optimize_mode: maximize}} (or advisor: {builtinAdvisorName: ...})",
        ),
    }
    if let Some(assessor) = fields.take("assessor") {
        convert_algorithm(reader, &mut out, &assessor, "Assessor", "assessor");
    }

    let platform_field = fields.take("trainingServicePlatform");
    let platform = platform_field
        .as_ref()
        .and_then(|field| reader.non_empty_string(field));
    let local_config = fields.take("localConfig");
    let remote_config = fields.take("remoteConfig");
    let machine_list = fields.take("machineList");
    let other_platform_blocks: Vec<(Field<'_>, &str)> = OTHER_PLATFORM_BLOCKS
        .iter()
        .filter_map(|(block, platform)| Some((fields.take(block)?, *platform)))
        .collect();
    // In any case, as the v2 reader takes a `platform`.
    let platform = platform.map(|name| name.to_ascii_lowercase());
    let mut service = Builder::under("trainingService");
    match (&platform_field, platform.as_deref()) {
        (Some(field), Some(platform @ ("local" | "remote"))) => {
            service.move_field(Some(field.clone_ref()), "platform");
            out.renames
                .push(("trainingService".to_owned(), field.path.clone()));
            let is_local = platform == "local";
            for (block, needs) in &other_platform_blocks {
                wrong_platform(reader, block, needs, platform);
            }
            if let Some(local) = local_config {
                if is_local {
                    convert_local(reader, &mut service, &local);
                } else {
                    wrong_platform(reader, &local, "local", platform);
                }
            }
            if let Some(remote) = remote_config {
                if is_local {
                    wrong_platform(reader, &remote, "remote", platform);
                } else {
                    convert_remote(reader, &mut service, &remote);
                }
            }
            match machine_list {
                Some(list) if !is_local => convert_machines(reader, &mut service, &list),
                Some(list) => wrong_platform(reader, &list, "remote", platform),
                None if !is_local => {
                    let message =
                        "required for trainingServicePlatform: remote: the machines, each with \
                         ip, username and passwd or sshKeyPath";
                    reader.error(field.node.pos, "machineList", message);
                }
                None => {}
            }
            let pos = field.node.pos;
            out.renames.append(&mut service.renames);
            out.push("trainingService", pos, map_node(service.entries, pos));
        }
        // Its block (paiConfig...) is not reported too: this says what to do.
        (Some(field), Some(other)) => {
            let message = format!(
                "NNI v1 platform {other:?} has no knob training service to convert to; knob \
                 converts v1 configs for local and remote (for another platform, write an NNI \
                 v2 trainingService for a plugin that provides it)"
            );
            reader.error(field.node.pos, &field.path, message);
        }
        // The error is already recorded.
        (Some(_), None) => {}
        (None, _) => {
            // `is_v1` found the key, so it is null here.
            reader.error(
                root.pos,
                "trainingServicePlatform",
                "is null; write local or remote",
            );
        }
    }
    out.move_field(fields.take("sharedStorage"), "sharedStorage");
    fields.finish(reader, &V1_TOP_FIELDS);

    Converted {
        root: map_node(out.entries, root.pos),
        renames: out.renames,
    }
}

fn same_key(a: &str, b: &str) -> bool {
    normalize_key(a) == normalize_key(b)
}

fn drop_with_warning(reader: &mut Reader, field: Option<Field<'_>>) {
    if let Some(field) = field {
        reader.warn(
            field.node.pos,
            &field.path,
            "NNI v1 field with no v2 equivalent; ignored, as NNI 2.x and 3.0 do",
        );
    }
}

fn wrong_platform(reader: &mut Reader, field: &Field<'_>, needs: &str, platform: &str) {
    let message = format!(
        "only used with trainingServicePlatform: {needs}, and this config says {platform}; \
         remove it or change the platform"
    );
    reader.error(field.node.pos, &field.path, message);
}

/// `tuner`, `advisor` (as `tuner`) or `assessor`: `builtin<Kind>Name`, or a custom class in
/// `codeDir` / `classFileName` / `className`; `classArgs`; the tuner's `gpuIndices`; knob's
/// own [`NNI_DISPATCH_FIELDS`], kept as they are.
fn convert_algorithm(
    reader: &mut Reader,
    out: &mut Builder,
    field: &Field<'_>,
    kind: &str,
    v2_key: &str,
) {
    let Some(mut fields) = Fields::open(reader, field.node, &field.path) else {
        return;
    };
    let builtin_key = format!("builtin{kind}Name");
    let mut algorithm = Builder::under(v2_key);
    let builtin = fields.take(&builtin_key);
    let code_dir = fields.take("codeDir");
    let class_file = fields.take("classFileName");
    let class_name = fields.take("className");
    let custom = [&code_dir, &class_file, &class_name];
    match builtin {
        Some(builtin) => {
            if let Some(extra) = custom.iter().find_map(|field| field.as_ref()) {
                let message = format!(
                    "{builtin_key} is set too: {builtin_key} picks a built-in algorithm, \
                     codeDir/classFileName/className a custom one; keep one"
                );
                reader.error(extra.node.pos, &extra.path, message);
            }
            algorithm.move_field(Some(builtin), "name");
        }
        None => convert_custom_class(reader, &mut algorithm, &fields, field, &builtin_key, custom),
    }
    algorithm.move_field(fields.take("classArgs"), "classArgs");
    for extension in NNI_DISPATCH_FIELDS {
        algorithm.move_field(fields.take(extension), extension);
    }
    let mut known = vec![
        builtin_key.as_str(),
        "codeDir",
        "classFileName",
        "className",
        "classArgs",
        "includeIntermediateResults",
        "gpuIndices",
    ];
    known.extend(NNI_DISPATCH_FIELDS);
    drop_with_warning(reader, fields.take("includeIntermediateResults"));
    out.renames.push((v2_key.to_owned(), field.path.clone()));
    out.renames.append(&mut algorithm.renames);
    out.push(
        v2_key,
        field.node.pos,
        map_node(algorithm.entries, field.node.pos),
    );
    // After the algorithm, where NNI's `to_v2` puts it.
    if let Some(gpu_indices) = fields.take("gpuIndices") {
        if out.has("tunerGpuIndices") {
            let message = "NNI v2 has one tunerGpuIndices for tuner and assessor, and an earlier \
                           gpuIndices set it; keep one";
            reader.error(gpu_indices.node.pos, &gpu_indices.path, message);
        } else {
            out.move_field(Some(gpu_indices), "tunerGpuIndices");
        }
    }
    fields.finish(reader, &known);
}

/// v1 `codeDir` + `classFileName: my_tuner.py` + `className: MyTuner` is v2 `className:
/// my_tuner.MyTuner` + `codeDirectory`.
fn convert_custom_class(
    reader: &mut Reader,
    algorithm: &mut Builder,
    fields: &Fields<'_>,
    field: &Field<'_>,
    builtin_key: &str,
    [code_dir, class_file, class_name]: [&Option<Field<'_>>; 3],
) {
    let (Some(code_dir), Some(class_file), Some(class_name)) = (code_dir, class_file, class_name)
    else {
        let missing: Vec<&str> = [
            ("codeDir", code_dir),
            ("classFileName", class_file),
            ("className", class_name),
        ]
        .iter()
        .filter(|(_, field)| field.is_none())
        .map(|(name, _)| *name)
        .collect();
        let message = if missing.len() == 3 {
            format!(
                "required: {builtin_key} (a built-in algorithm, e.g. TPE), or codeDir, \
                 classFileName and className for a custom one"
            )
        } else {
            format!(
                "a custom algorithm needs codeDir, classFileName and className; {} missing",
                missing.join(" and ")
            )
        };
        reader.error(fields.pos.or(field.node.pos), &field.path, message);
        return;
    };
    let (Some(file), Some(class)) = (
        reader.non_empty_string(class_file),
        reader.non_empty_string(class_name),
    ) else {
        return;
    };
    let Some(module) = file.strip_suffix(".py") else {
        let message = format!("{file:?} is not a .py file; name the Python file of the class");
        reader.error(class_file.node.pos, &class_file.path, message);
        // The class as written, so that the v2 reader does not also find no algorithm named.
        algorithm.move_field(Some(class_name.clone_ref()), "className");
        return;
    };
    let qualified = Node {
        value: Value::Str(format!("{module}.{class}")),
        pos: class_name.node.pos,
    };
    algorithm.push("className", class_name.node.pos, qualified);
    algorithm
        .renames
        .push((algorithm.child("className"), class_name.path.clone()));
    algorithm.move_field(Some(code_dir.clone_ref()), "codeDirectory");
}

fn convert_local(reader: &mut Reader, service: &mut Builder, local: &Field<'_>) {
    let Some(mut fields) = Fields::open(reader, local.node, &local.path) else {
        return;
    };
    service.move_field(fields.take("gpuIndices"), "gpuIndices");
    service.move_field(fields.take("maxTrialNumPerGpu"), "maxTrialNumberPerGpu");
    service.move_field(fields.take("useActiveGpu"), "useActiveGpu");
    fields.finish(reader, &V1_LOCAL_FIELDS);
}

fn convert_remote(reader: &mut Reader, service: &mut Builder, remote: &Field<'_>) {
    let Some(mut fields) = Fields::open(reader, remote.node, &remote.path) else {
        return;
    };
    service.move_field(fields.take("reuse"), "reuseMode");
    fields.finish(reader, &V1_REMOTE_FIELDS);
}

fn convert_machines(reader: &mut Reader, service: &mut Builder, list: &Field<'_>) {
    let list_path = service.child("machineList");
    service.renames.push((list_path.clone(), list.path.clone()));
    let Value::Seq(items) = &list.node.value else {
        let message = format!("expected a list of machines, got {}", list.node.describe());
        reader.error(list.node.pos, &list.path, message);
        return;
    };
    let mut machines = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let v1_path = format!("{}[{index}]", list.path);
        let Some(mut fields) = Fields::open(reader, item, &v1_path) else {
            // As it is, so that the next machines keep their index in messages.
            machines.push(item.clone());
            continue;
        };
        let mut machine = Builder::under(&format!("{list_path}[{index}]"));
        for (v1, v2) in MACHINE_RENAMES {
            machine.move_field(fields.take(v1), v2);
            // Also for a field left out, which the v2 reader may call required.
            machine
                .renames
                .push((machine.child(v2), format!("{v1_path}.{v1}")));
        }
        fields.finish(reader, &V1_MACHINE_FIELDS);
        service.renames.append(&mut machine.renames);
        machines.push(map_node(machine.entries, item.pos));
    }
    let sequence = Node {
        value: Value::Seq(machines),
        pos: list.node.pos,
    };
    service.push("machineList", list.node.pos, sequence);
}

/// A v2 mapping being built, at `path` in the v2 document, with the renames made in it.
#[derive(Default)]
struct Builder {
    path: String,
    entries: Vec<(Node, Node)>,
    renames: Vec<(String, String)>,
}

impl Builder {
    fn under(path: &str) -> Builder {
        Builder {
            path: path.to_owned(),
            ..Builder::default()
        }
    }

    fn child(&self, name: &str) -> String {
        if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}.{name}", self.path)
        }
    }

    fn has(&self, name: &str) -> bool {
        self.entries
            .iter()
            .any(|(key, _)| key.as_str().is_some_and(|key| same_key(key, name)))
    }

    fn push(&mut self, name: &str, pos: Option<Pos>, value: Node) {
        let key = Node {
            value: Value::Str(name.to_owned()),
            pos,
        };
        self.entries.push((key, value));
    }

    /// NNI's `_move_field`: the v1 value, as written and where written, under its v2 name.
    fn move_field(&mut self, field: Option<Field<'_>>, v2_name: &str) {
        let Some(field) = field else {
            return;
        };
        self.renames.push((self.child(v2_name), field.path.clone()));
        self.push(v2_name, field.node.pos, field.node.clone());
    }
}

fn map_node(entries: Vec<(Node, Node)>, pos: Option<Pos>) -> Node {
    Node {
        value: Value::Map(entries),
        pos,
    }
}

impl Field<'_> {
    fn clone_ref(&self) -> Field<'_> {
        Field {
            node: self.node,
            path: self.path.clone(),
        }
    }
}
