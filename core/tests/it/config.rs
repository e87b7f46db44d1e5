//! Config loading: canonical output for every accepted form, and the one-line errors for bad input.

use std::path::{Path, PathBuf};

use expect_test::{expect, Expect};
use knob_core::config::{self, ExperimentConfig};

use crate::BuiltInServices;

/// A temporary folder holding a config and the files it names.
pub(crate) struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    /// `files`: a name ending in `/` is a folder, anything else a file with that content.
    pub(crate) fn new(files: &[(&str, &str)]) -> Project {
        let project = Project {
            dir: tempfile::tempdir().unwrap(),
        };
        for (name, content) in files {
            let path = project.path(name);
            if name.ends_with('/') {
                std::fs::create_dir_all(&path).unwrap();
            } else {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::fs::write(&path, content).unwrap();
            }
        }
        project
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Replaces the temp folder by `$DIR` and the home folder by `~`, so output is stable.
    pub(crate) fn redact(&self, text: &str) -> String {
        let root = std::fs::canonicalize(self.dir.path()).unwrap();
        let mut text = text.replace(&root.display().to_string(), "$DIR");
        text = text.replace(&self.dir.path().display().to_string(), "$DIR");
        if let Some(home) = std::env::var_os("HOME") {
            let home = format!("{}/", Path::new(&home).display());
            if home.len() > 1 {
                text = text.replace(&home, "~/");
            }
        }
        text
    }

    /// `knob config check` on `name` with `text`: the canonical YAML or the error lines.
    pub(crate) fn check(&self, name: &str, text: &str) -> String {
        let path = self.path(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        let rendered = match config::check_file(&path, &BuiltInServices) {
            Ok(canonical) => canonical,
            Err(errors) => errors.join("\n") + "\n",
        };
        self.redact(&rendered)
    }

    pub(crate) fn load(&self, name: &str, text: &str) -> ExperimentConfig {
        let path = self.path(name);
        std::fs::write(&path, text).unwrap();
        match config::load_file(&path, &BuiltInServices) {
            Ok(loaded) => loaded.config,
            Err(errors) => panic!("config did not load:\n{errors}"),
        }
    }
}

/// Loads `text` as `exp.yml` in an otherwise empty folder.
fn check(text: &str, expect: Expect) {
    let project = Project::new(&[]);
    expect.assert_eq(&project.check("exp.yml", text));
}

/// Like [`check`], showing only the canonical YAML of the top-level `fields` named.
fn check_fields(text: &str, fields: &[&str], expect: Expect) {
    let project = Project::new(&[]);
    expect.assert_eq(&only_fields(&project.check("exp.yml", text), fields));
}

/// The warnings and the top-level `fields` of a canonical text; errors are kept whole.
pub(crate) fn only_fields(rendered: &str, fields: &[&str]) -> String {
    if !rendered
        .lines()
        .any(|line| line.starts_with("trialCommand:"))
    {
        return rendered.to_owned();
    }
    let mut shown = String::new();
    let mut showing = false;
    for line in rendered.lines() {
        if !line.starts_with(' ') {
            showing = line.starts_with("# warning")
                || fields
                    .iter()
                    .any(|field| line.starts_with(&format!("{field}:")));
        }
        if showing {
            shown.push_str(line);
            shown.push('\n');
        }
    }
    shown
}

/// The smallest valid config, for tests that vary one field.
const MINIMAL: &str = "\
searchSpace: {x: {_type: choice, _value: [1, 2]}}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: Random}
trainingService: {platform: local}
";

fn minimal_with(extra: &str) -> String {
    format!("{MINIMAL}{extra}")
}

#[test]
fn nni_documentation_example_in_canonical_form() {
    let project = Project::new(&[
        (
            "search_space.json",
            r#"{"lr": {"_type": "loguniform", "_value": [0.0001, 0.1]}}"#,
        ),
        ("mnist.py", ""),
    ]);
    let text = "\
experimentName: MNIST
searchSpaceFile: search_space.json
trialCommand: python mnist.py
trialCodeDirectory: .
trialGpuNumber: 1
trialConcurrency: 2
maxExperimentDuration: 24h
maxTrialNumber: 100
tuner:
  name: TPE
  classArgs:
    optimize_mode: maximize
trainingService:
  platform: local
  useActiveGpu: True
";
    expect![[r#"
        experimentName: MNIST
        trialCommand: python mnist.py
        trialCodeDirectory: $DIR
        trialConcurrency: 2
        trialGpuNumber: 1
        trialGpuMemory: null
        trialMemorySize: null
        trialCpuNumber: null
        maxExperimentDuration: 86400
        maxTrialNumber: 100
        maxTrialDuration: null
        maxTrialRetries: 0
        maxOomRetries: 0
        debug: false
        logLevel: info
        experimentWorkingDirectory: ~/knob-experiments
        tunerGpuIndices: null
        tuner:
          name: TPE
          className: null
          codeDirectory: null
          classArgs:
            optimize_mode: maximize
        assessor: null
        trainingService:
          - platform: local
            useActiveGpu: true
            maxTrialNumberPerGpu: 1
            gpuIndices: null
            reuseMode: false
        placementPolicy: recently-idle
        tunerErrorPolicy: error
        pluginPaths: []
        searchSpace:
          lr:
            _type: loguniform
            _value:
              - 0.0001
              - 0.1
    "#]]
    .assert_eq(&project.check("exp.yml", text));
}

#[test]
fn keys_are_case_and_underscore_insensitive() {
    check_fields(
        "\
search_space: {x: {_type: choice, _value: [1, 2]}}
TrialCommand: python3 trial.py
trialconcurrency: 3
MAX_TRIAL_NUMBER: 5
Tuner: {Name: Random, class_args: {seed: 1}}
training_service: {PLATFORM: local, use_active_gpu: yes, Max_Trial_Number_Per_Gpu: 2}
",
        &[
            "trialCommand",
            "trialConcurrency",
            "maxTrialNumber",
            "tuner",
            "trainingService",
            "searchSpace",
        ],
        expect![[r#"
            trialCommand: python3 trial.py
            trialConcurrency: 3
            maxTrialNumber: 5
            tuner:
              name: Random
              className: null
              codeDirectory: null
              classArgs:
                seed: 1
            trainingService:
              - platform: local
                useActiveGpu: true
                maxTrialNumberPerGpu: 2
                gpuIndices: null
                reuseMode: false
            searchSpace:
              x:
                _type: choice
                _value:
                  - 1
                  - 2
        "#]],
    );
}

const PATH_FIELDS: &[&str] = &[
    "trialCodeDirectory",
    "experimentWorkingDirectory",
    "tuner",
    "assessor",
    "pluginPaths",
    "searchSpace",
];

#[test]
fn relative_paths_resolve_against_the_config_folder() {
    let project = Project::new(&[
        ("code/", ""),
        (
            "conf/space.yaml",
            "lr: {_type: uniform, _value: [0.1, 1]}\n",
        ),
        ("conf/plugins/", ""),
        ("tuners/", ""),
    ]);
    let text = "\
searchSpaceFile: space.yaml
trialCommand: python3 trial.py
trialCodeDirectory: ../code
trialConcurrency: 1
experimentWorkingDirectory: ./runs/../experiments
pluginPaths: [plugins]
tuner: {className: my_tuner.MyTuner, codeDirectory: ../tuners}
assessor: {className: my_assessor.Stopper}
trainingService: {platform: local}
";
    expect![[r#"
        trialCodeDirectory: $DIR/code
        experimentWorkingDirectory: $DIR/conf/experiments
        tuner:
          name: null
          className: my_tuner.MyTuner
          codeDirectory: $DIR/tuners
          classArgs: {}
        assessor:
          name: null
          className: my_assessor.Stopper
          codeDirectory: $DIR/conf
          classArgs: {}
        pluginPaths:
          - $DIR/conf/plugins
        searchSpace:
          lr:
            _type: uniform
            _value:
              - 0.1
              - 1
    "#]]
    .assert_eq(&only_fields(
        &project.check("conf/exp.yml", text),
        PATH_FIELDS,
    ));
}

#[test]
fn durations_in_every_form() {
    let mut rendered = String::new();
    for written in [
        "30s", "30m", "2h", "1d", "0.5h", "1.5m", "90", "2.5", "\"45 S\"",
    ] {
        let project = Project::new(&[]);
        let text = minimal_with(&format!(
            "maxTrialDuration: {written}\nmaxExperimentDuration: {written}\n"
        ));
        let config = project.load("exp.yml", &text);
        assert_eq!(config.max_trial_duration, config.max_experiment_duration);
        rendered.push_str(&format!(
            "{written} -> {:?}\n",
            config.max_trial_duration.unwrap()
        ));
    }
    expect![[r#"
        30s -> 30s
        30m -> 1800s
        2h -> 7200s
        1d -> 86400s
        0.5h -> 1800s
        1.5m -> 90s
        90 -> 90s
        2.5 -> 3s
        "45 S" -> 45s
    "#]]
    .assert_eq(&rendered);
}

#[test]
fn sizes_in_every_form() {
    let mut rendered = String::new();
    for written in [
        "10GiB",
        "10GB",
        "500MB",
        "500mib",
        "1.5gb",
        "1TB",
        "100KiB",
        "2048",
        "\"1 GiB\"",
    ] {
        let project = Project::new(&[]);
        let config = project.load(
            "exp.yml",
            &minimal_with(&format!("trialGpuMemory: {written}\n")),
        );
        rendered.push_str(&format!(
            "{written} -> {} MiB\n",
            config.trial_gpu_memory_mib.unwrap()
        ));
    }
    expect![[r#"
        10GiB -> 10240 MiB
        10GB -> 10240 MiB
        500MB -> 500 MiB
        500mib -> 500 MiB
        1.5gb -> 1536 MiB
        1TB -> 1048576 MiB
        100KiB -> 1 MiB
        2048 -> 2048 MiB
        "1 GiB" -> 1024 MiB
    "#]]
    .assert_eq(&rendered);
}

#[test]
fn gpu_indices_in_every_form() {
    let mut rendered = String::new();
    for written in ["[0, 1]", "\"0,1\"", "\"2, 3\"", "3", "[]"] {
        let project = Project::new(&[]);
        let config = project.load(
            "exp.yml",
            &minimal_with(&format!(
                "gpuIndices: {written}\ntunerGpuIndices: {written}\n"
            )),
        );
        let gpu_indices = &config.training_service[0].config["gpuIndices"];
        assert_eq!(
            *gpu_indices,
            serde_json::to_value(&config.tuner_gpu_indices).unwrap()
        );
        rendered.push_str(&format!("{written} -> {gpu_indices}\n"));
    }
    expect![[r#"
        [0, 1] -> [0,1]
        "0,1" -> [0,1]
        "2, 3" -> [2,3]
        3 -> [3]
        [] -> []
    "#]]
    .assert_eq(&rendered);
}

#[test]
fn bad_gpu_indices() {
    check(
        &minimal_with("gpuIndices: [0, 0]\ntunerGpuIndices: -1\n"),
        expect![[r#"
            $DIR/exp.yml:6:13: gpuIndices: GPU index 0 is listed twice
            $DIR/exp.yml:7:18: tunerGpuIndices: GPU index -1 is negative or too large
        "#]],
    );
    check(
        &minimal_with("gpuIndices: \"a,b\"\ntunerGpuIndices: [0, x]\n"),
        expect![[r#"
        $DIR/exp.yml:6:13: gpuIndices: expected GPU indices as a list ([0, 1]), a string ("0,1") or an integer, got "a,b"
        $DIR/exp.yml:7:18: tunerGpuIndices: expected GPU indices as a list ([0, 1]), a string ("0,1") or an integer, got "x" in the list
    "#]],
    );
}

#[test]
fn top_level_shortcuts_are_copied_into_training_services() {
    let text = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 4
tuner: {name: Random}
useActiveGpu: true
maxTrialNumberPerGpu: 2
gpuIndices: 0,1
reuseMode: true
trainingService:
  - platform: local
  - platform: remote
    machineList:
      - {host: a.example, user: alice}
      - {host: b.example, user: bob, useActiveGpu: false, gpuIndices: 3}
";
    check_fields(
        text,
        &["trainingService"],
        expect![[r#"
            trainingService:
              - platform: local
                useActiveGpu: true
                maxTrialNumberPerGpu: 2
                gpuIndices:
                  - 0
                  - 1
                reuseMode: true
              - platform: remote
                machineList:
                  - host: a.example
                    port: 22
                    user: alice
                    password: null
                    sshKeyFile: null
                    sshPassphrase: null
                    useActiveGpu: true
                    maxTrialNumberPerGpu: 2
                    gpuIndices:
                      - 0
                      - 1
                    pythonPath: null
                    acceptNewHostKey: false
                  - host: b.example
                    port: 22
                    user: bob
                    password: null
                    sshKeyFile: null
                    sshPassphrase: null
                    useActiveGpu: false
                    maxTrialNumberPerGpu: 2
                    gpuIndices:
                      - 3
                    pythonPath: null
                    acceptNewHostKey: false
                reuseMode: true
                knownHostsFile: null
                hostLossTimeout: 60
                agentRoot: null
        "#]],
    );
}

#[test]
fn shared_machine_limits_at_top_level_reach_every_environment_unless_it_sets_its_own() {
    let text = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 4
tuner: {name: Random}
maxCpuUtilization: 90%
maxMemoryUtilization: 85
memoryReserve: 4GiB
maxGpuMemoryUtilization: 80
gpuMemoryReserve: 512MB
trainingService:
  - platform: local
    maxCpuUtilization: 70
  - platform: remote
    machineList:
      - {host: a.example, user: alice, gpuMemoryReserve: 2GiB}
";
    check_fields(
        text,
        &["trainingService"],
        expect![[r#"
            trainingService:
              - platform: local
                useActiveGpu: false
                maxTrialNumberPerGpu: 1
                gpuIndices: null
                reuseMode: false
                maxCpuUtilization: 70.0
                maxMemoryUtilization: 85.0
                memoryReserve: 4096
                maxGpuMemoryUtilization: 80.0
                gpuMemoryReserve: 512
              - platform: remote
                machineList:
                  - host: a.example
                    port: 22
                    user: alice
                    password: null
                    sshKeyFile: null
                    sshPassphrase: null
                    useActiveGpu: false
                    maxTrialNumberPerGpu: 1
                    gpuIndices: null
                    pythonPath: null
                    acceptNewHostKey: false
                    maxCpuUtilization: 90.0
                    maxMemoryUtilization: 85.0
                    memoryReserve: 4096
                    maxGpuMemoryUtilization: 80.0
                    gpuMemoryReserve: 2048
                reuseMode: true
                knownHostsFile: null
                hostLossTimeout: 60
                agentRoot: null
        "#]],
    );
    check(
        &minimal_with("maxCpuUtilization: 0\nmemoryReserve: lots\nmaxGpuMemoryUtilization: 101%\n"),
        expect![[r#"
            $DIR/exp.yml:6:20: maxCpuUtilization: expected a percentage above 0 and at most 100, like 90 or "90%", got 0
            $DIR/exp.yml:7:16: memoryReserve: expected a size like "10GiB", "500MB" or a number of MiB, got "lots"
            $DIR/exp.yml:8:26: maxGpuMemoryUtilization: expected a percentage above 0 and at most 100, like 90 or "90%", got "101%"
        "#]],
    );
}

#[test]
fn inline_search_space_and_search_space_file_give_the_same_config() {
    let space = r#"{"optimizer": {"_type": "choice", "_value": ["sgd", "adam"]}, "lr": {"_type": "uniform", "_value": [0.01, 0.1]}}"#;
    let project = Project::new(&[("space.json", space)]);
    let from_file = project.load(
        "exp.yml",
        &MINIMAL.replace(
            "searchSpace: {x: {_type: choice, _value: [1, 2]}}",
            "searchSpaceFile: space.json",
        ),
    );
    let inline = project.load(
        "exp.yml",
        &MINIMAL.replace("{x: {_type: choice, _value: [1, 2]}}", space),
    );
    assert_eq!(from_file, inline);
    expect![[r#"{"optimizer":{"_type":"choice","_value":["sgd","adam"]},"lr":{"_type":"uniform","_value":[0.01,0.1]}}"#]].assert_eq(&serde_json::to_string(&inline.search_space).unwrap());
}

/// A search space's values are the numbers NNI (PyYAML, Python's ints) hands trials: YAML 1.1's
/// `1_000` and `010` (H3 F1: the text "1_000", and 10), and a whole number past i64 within
/// u64, in a YAML or JSON file (H3 F3: the float 1.8446744073709552e19).
#[test]
fn search_space_numbers_are_the_ones_nni_hands_trials() {
    let json =
        r#"{"seed": {"_type": "choice", "_value": [18446744073709551615, 9223372036854775808]}}"#;
    let project = Project::new(&[("space.json", json)]);
    let from_file = project.load(
        "exp.yml",
        &MINIMAL.replace(
            "searchSpace: {x: {_type: choice, _value: [1, 2]}}",
            "searchSpaceFile: space.json",
        ),
    );
    expect![[r#"{"seed":{"_type":"choice","_value":[18446744073709551615,9223372036854775808]}}"#]]
        .assert_eq(&serde_json::to_string(&from_file.search_space).unwrap());
    let inline = project.load(
        "exp.yml",
        &MINIMAL.replace(
            "_value: [1, 2]",
            "_value: [1_000, 010, 0b11, 1:30, 18446744073709551615]",
        ),
    );
    expect![[r#"{"x":{"_type":"choice","_value":[1000,8,3,90,18446744073709551615]}}"#]]
        .assert_eq(&serde_json::to_string(&inline.search_space).unwrap());
    let trials = project.load(
        "exp.yml",
        &MINIMAL.replace(
            "trialConcurrency: 1",
            "trialConcurrency: 1\nmaxTrialNumber: 1_000",
        ),
    );
    assert_eq!(trials.max_trial_number, Some(1000));
}

#[test]
fn json_config() {
    let project = Project::new(&[]);
    let text = r#"{
	"searchSpace": {"x": {"_type": "randint", "_value": [0, 10]}},
	"trialCommand": "python3 trial.py",
	"trial_concurrency": 2,
	"maxTrialDuration": "10m",
	"tuner": {"name": "Anneal", "classArgs": {"optimize_mode": "minimize"}},
	"trainingService": {"platform": "local"}
}"#;
    expect![[r#"
        experimentName: null
        trialCommand: python3 trial.py
        trialCodeDirectory: $DIR
        trialConcurrency: 2
        trialGpuNumber: null
        trialGpuMemory: null
        trialMemorySize: null
        trialCpuNumber: null
        maxExperimentDuration: null
        maxTrialNumber: null
        maxTrialDuration: 600
        maxTrialRetries: 0
        maxOomRetries: 0
        debug: false
        logLevel: info
        experimentWorkingDirectory: ~/knob-experiments
        tunerGpuIndices: null
        tuner:
          name: Anneal
          className: null
          codeDirectory: null
          classArgs:
            optimize_mode: minimize
        assessor: null
        trainingService:
          - platform: local
            useActiveGpu: false
            maxTrialNumberPerGpu: 1
            gpuIndices: null
            reuseMode: false
        placementPolicy: recently-idle
        tunerErrorPolicy: error
        pluginPaths: []
        searchSpace:
          x:
            _type: randint
            _value:
              - 0
              - 10
    "#]]
    .assert_eq(&project.check("exp.json", text));
}

#[test]
fn malformed_json_names_line_and_column() {
    let project = Project::new(&[]);
    let text = "{\n  \"trialCommand\": \"python3 trial.py\",\n  \"trialConcurrency\": 2,,\n}\n";
    expect![[r#"
        $DIR/exp.json:3:25: malformed JSON: key must be a string
    "#]]
    .assert_eq(&project.check("exp.json", text));
}

/// A duplicate key in a JSON config or search space is refused as in YAML, at its line and
/// column; it was taken with its last value, and the file's other errors lost their positions
/// (H3 F2).
#[test]
fn json_duplicate_keys_are_refused_as_in_yaml() {
    let text = "{\n\"searchSpaceFile\": \"space.json\",\n\"trialCommand\": \"python3 trial.py\",\n\
                \"trialConcurrency\": 2,\n\"trialConcurrency\": 3,\n\"tuner\": {\"name\": \"Random\"},\n\
                \"trainingService\": {\"platform\": \"local\"}\n}\n";
    let project = Project::new(&[(
        "space.json",
        "{\"x\": {\"_type\": \"uniform\", \"_value\": [0, 1]},\n \"x\": {\"_type\": \"choice\", \"_value\": [5]}}",
    )]);
    expect![[r#"
        $DIR/exp.json:5:1: malformed JSON: duplicate key "trialConcurrency" (first set on line 4)
    "#]]
    .assert_eq(&project.check("exp.json", text));
    expect![[r#"
        $DIR/exp.yml:5:1: malformed YAML: duplicate key "trialConcurrency" (first set on line 4)
    "#]]
    .assert_eq(&project.check("exp.yml", text));
    let text = text.replace("\"trialConcurrency\": 3", "\"maxTrialNumbr\":\t3");
    expect![[r#"
        $DIR/space.json:2:2: searchSpaceFile: malformed JSON: duplicate key "x" (first set on line 1)
        $DIR/exp.json:5:1: unknown field "maxTrialNumbr" (did you mean "maxTrialNumber"?)
    "#]]
    .assert_eq(&project.check("exp.json", &text));
}

#[test]
fn remote_machine_list_hides_secrets() {
    let project = Project::new(&[("keys/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n")]);
    let text = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 2
trialGpuNumber: 1
tuner: {name: Random}
trainingService:
  platform: remote
  machineList:
    - host: 10.0.0.2
      user: alice
      password: hunter2
    - host: gpu.example.org
      port: 2222
      user: bob
      sshKeyFile: keys/id_ed25519
      sshPassphrase: open sesame
      maxTrialNumberPerGpu: 2
      pythonPath: /opt/py/bin
";
    let canonical = only_fields(&project.check("exp.yml", text), &["trainingService"]);
    expect![[r#"
        trainingService:
          - platform: remote
            machineList:
              - host: 10.0.0.2
                port: 22
                user: alice
                password: "***"
                sshKeyFile: null
                sshPassphrase: null
                useActiveGpu: false
                maxTrialNumberPerGpu: 1
                gpuIndices: null
                pythonPath: null
                acceptNewHostKey: false
              - host: gpu.example.org
                port: 2222
                user: bob
                password: null
                sshKeyFile: $DIR/keys/id_ed25519
                sshPassphrase: "***"
                useActiveGpu: false
                maxTrialNumberPerGpu: 2
                gpuIndices: null
                pythonPath: /opt/py/bin
                acceptNewHostKey: false
            reuseMode: true
            knownHostsFile: null
            hostLossTimeout: 60
            agentRoot: null
    "#]]
    .assert_eq(&canonical);

    let config = project.load("exp.yml", text);
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("hunter2") && !debug.contains("open sesame"),
        "{debug}"
    );
    let stored = config.to_json_with_secrets();
    let machines = &stored["trainingService"][0]["machineList"];
    assert_eq!(machines[0]["password"], "hunter2");
    assert_eq!(machines[1]["sshPassphrase"], "open sesame");
    // Read back, the secrets are plain fields until the service declares them again.
    let restored: ExperimentConfig = serde_json::from_value(stored).unwrap();
    assert_eq!(
        serde_json::Value::Object(restored.training_service[0].config.clone()),
        config.training_service[0].config_with_secrets()
    );
}

#[test]
fn hybrid_training_service_list() {
    let text = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 2
tuner: {name: Random}
trainingService:
  - platform: local
    useActiveGpu: true
  - platform: remote
    reuseMode: false
    machineList: [{host: h1, user: u}]
";
    check_fields(
        text,
        &["trainingService"],
        expect![[r#"
            trainingService:
              - platform: local
                useActiveGpu: true
                maxTrialNumberPerGpu: 1
                gpuIndices: null
                reuseMode: false
              - platform: remote
                machineList:
                  - host: h1
                    port: 22
                    user: u
                    password: null
                    sshKeyFile: null
                    sshPassphrase: null
                    useActiveGpu: false
                    maxTrialNumberPerGpu: 1
                    gpuIndices: null
                    pythonPath: null
                    acceptNewHostKey: false
                reuseMode: false
                knownHostsFile: null
                hostLossTimeout: 60
                agentRoot: null
        "#]],
    );
}

#[test]
fn canonical_form_reads_back_to_the_same_config() {
    let project = Project::new(&[(
        "space.json",
        r#"{"lr": {"_type": "qloguniform", "_value": [0.001, 1, 0.001]}}"#,
    )]);
    let text = "\
searchSpaceFile: space.json
trialCommand: |
  python3 trial.py \\
    --epochs 3
trialConcurrency: 2
trialGpuNumber: 0
maxExperimentDuration: 1.5h
trialGpuMemory: 10GiB
placementPolicy: round_robin
debug: true
tuner: {name: TPE, classArgs: {optimize_mode: maximize, seed: 7}}
assessor: {name: Medianstop}
trainingService: {platform: local, gpuIndices: 0}
";
    let config = project.load("exp.yml", text);
    let canonical = config.to_canonical_yaml();
    assert_eq!(project.load("canonical.yml", &canonical), config);
    let stored: ExperimentConfig =
        serde_json::from_str(&serde_json::to_string(&config).unwrap()).unwrap();
    assert_eq!(stored, config);
}

/// Strings that look like YAML 1.1 numbers or booleans, whole numbers past i64 and small
/// floats read back from the canonical form (`knob config check`'s output) as they were: the
/// emitter wrote `'1_000'` and `'on'` bare (read back as 1000 and true) and
/// 18446744073709551615 as 18446744073709552000.0.
#[test]
fn canonical_form_keeps_strings_that_look_like_numbers_and_large_numbers() {
    let project = Project::new(&[]);
    let text = r#"
searchSpace:
  x: {_type: choice, _value: ['1_000', '0b101', '1:30', 'on', 'null', '010', 18446744073709551615, 1.0e-7, 3.0, -0.0, null, 'a "quoted" \ text']}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: Random}
trainingService: {platform: local}
"#;
    let config = project.load("exp.yml", text);
    let canonical = config.to_canonical_yaml();
    assert_eq!(
        project.load("canonical.yml", &canonical),
        config,
        "{canonical}"
    );
    assert!(
        canonical.contains("18446744073709551615") && !canonical.contains(": ~"),
        "{canonical}"
    );
}

#[test]
fn warnings_for_accepted_but_ignored_fields() {
    check_fields(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
nniManagerIp: 10.0.0.1
advisor: {name: Hyperband, classArgs: {R: 60}}
trainingService: {platform: local}
",
        &["tuner"],
        expect![[r#"
            # warning: $DIR/exp.yml:4:15: nniManagerIp: ignored: knob reaches training machines over SSH and needs no route back to the manager
            # warning: $DIR/exp.yml:5:10: advisor: deprecated in NNI; read as tuner
            tuner:
              name: Hyperband
              className: null
              codeDirectory: null
              classArgs:
                R: 60
        "#]],
    );
}

/// PYTHONPATH splits at ':', so knob's Python folder in such an experiment folder is two
/// folders that do not exist: every `import knob_trial` trial failed with no word at create.
#[test]
fn an_experiment_folder_holding_a_colon_is_warned() {
    check_fields(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
experimentWorkingDirectory: runs 2024-01-01 12:30
tuner: {name: Random}
trainingService: {platform: local}
",
        &["experimentWorkingDirectory"],
        expect![[r##"
            # warning: $DIR/exp.yml:4:29: experimentWorkingDirectory: $DIR/runs 2024-01-01 12:30 holds ':', at which PYTHONPATH splits, so trials cannot `import knob_trial` nor knob's nni shim (a real nni still works); choose a folder without ':'
            experimentWorkingDirectory: "$DIR/runs 2024-01-01 12:30"
        "##]],
    );
}

// ---- bad input: every error, one line each ----

#[test]
fn malformed_yaml_names_line_and_column() {
    check(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner:
  name: TPE
   classArgs: {optimize_mode: maximize}
",
        expect![[r#"
            $DIR/exp.yml:6:13: malformed YAML: mapping values are not allowed in this context
        "#]],
    );
    check(
        "trialCommand: [python3, trial.py\ntrialConcurrency: 1\n",
        expect![[r#"
        $DIR/exp.yml:2:17: malformed YAML: illegal placement of ':' indicator
    "#]],
    );
}

#[test]
fn unknown_fields_suggest_the_closest_name() {
    check(
        &minimal_with(
            "trialComand: python3 other.py\nmaxTrialNum: 10\nexperimentWorkingDir: /tmp/x\nname: MNIST\n",
        ),
        expect![[r#"
            $DIR/exp.yml:6:1: unknown field "trialComand" (did you mean "trialCommand"?)
            $DIR/exp.yml:7:1: unknown field "maxTrialNum" (NNI v1; write maxTrialNumber)
            $DIR/exp.yml:8:1: unknown field "experimentWorkingDir" (did you mean "experimentWorkingDirectory"?)
            $DIR/exp.yml:9:1: unknown field "name" (did you mean "experimentName"?)
        "#]],
    );
    check(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: TPE, clasArgs: {}}
trainingService: {platform: local, useActiveGPUs: true}
",
        expect![[r#"
            $DIR/exp.yml:4:20: tuner: unknown field "clasArgs" (did you mean "classArgs"?)
            $DIR/exp.yml:5:51: trainingService.useActiveGPUs: unknown field "useActiveGPUs" (did you mean "useActiveGpu"?)
        "#]],
    );
}

/// NNI imports a className as `module.Class`: a bare class name is refused at its field (NNI's
/// dispatcher died with "not enough values to unpack").
#[test]
fn a_class_name_without_its_module_is_refused() {
    check(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {className: GoodTuner, codeDirectory: .}
assessor: {className: .Stop, codeDirectory: .}
trainingService: {platform: local}
",
        expect![[r#"
            $DIR/exp.yml:4:20: tuner.className: expected module.Class, the module a Python file in codeDirectory (my_tuner.MyTuner for my_tuner.py), not "GoodTuner"
            $DIR/exp.yml:5:23: assessor.className: expected module.Class, the module a Python file in codeDirectory (my_tuner.MyTuner for my_tuner.py), not ".Stop"
        "#]],
    );
}

/// Without `trainingServicePlatform` a config is not v1 (as in NNI), so it is not converted
/// (`config_v1.rs`); its v1 fields get hints.
#[test]
fn nni_v1_fields_in_a_v2_config_get_hints() {
    check(
        "\
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxExecDuration: 1h
searchSpacePath: search_space.json
tuner:
  builtinTunerName: TPE
trial:
  command: python3 mnist.py
  codeDir: .
",
        expect![[r#"
            $DIR/exp.yml:1:1: unknown field "authorName" (an NNI v1 field; drop it)
            $DIR/exp.yml:4:1: unknown field "maxExecDuration" (NNI v1; write maxExperimentDuration)
            $DIR/exp.yml:5:1: unknown field "searchSpacePath" (NNI v1; write searchSpaceFile)
            $DIR/exp.yml:7:3: tuner.name: required: the algorithm's name, e.g. TPE (or className and codeDirectory for a custom one)
            $DIR/exp.yml:7:3: tuner: unknown field "builtinTunerName" (NNI v1; write name)
            $DIR/exp.yml:8:1: unknown field "trial" (NNI v1; write trialCommand and trialCodeDirectory at top level)
            $DIR/exp.yml: searchSpace: required: searchSpace (the space inline) or searchSpaceFile (a JSON or YAML file); an empty space is written {}
            $DIR/exp.yml: trainingService: required: where trials run, e.g. {platform: local}
            $DIR/exp.yml: trialCommand: required: the command that runs one trial, e.g. "python3 train.py"
        "#]],
    );
}

#[test]
fn missing_required_fields() {
    check(
        "experimentName: nothing else\n",
        expect![[r#"
        $DIR/exp.yml: searchSpace: required: searchSpace (the space inline) or searchSpaceFile (a JSON or YAML file); an empty space is written {}
        $DIR/exp.yml: tuner: required: the tuning algorithm, e.g. {name: TPE, classArgs: {optimize_mode: maximize}}
        $DIR/exp.yml: trainingService: required: where trials run, e.g. {platform: local}
        $DIR/exp.yml: trialCommand: required: the command that runs one trial, e.g. "python3 train.py"
        $DIR/exp.yml: trialConcurrency: required: how many trials run at once, a positive integer
    "#]],
    );
    check(
        &MINIMAL.replace("trialCommand: python3 trial.py\n", ""),
        expect![[r#"
        $DIR/exp.yml: trialCommand: required: the command that runs one trial, e.g. "python3 train.py"
    "#]],
    );
    check(
        &MINIMAL.replace("trialCommand: python3 trial.py", "trialCommand: \"  \""),
        expect![[r#"
        $DIR/exp.yml:2:15: trialCommand: expected a non-empty string, got "  "
    "#]],
    );
}

/// Every error of a search space is reported, each at its own parameter's line, one nested in
/// a choice's option at that entry (not at the choice's key).
#[test]
fn every_search_space_error_at_its_own_line() {
    check(
        "\
searchSpace:
  lr: {_type: loguniform, _value: [0, 1]}
  model:
    _type: choice
    _value:
      - {_name: cnn, k: {_type: randint, _value: [1, 4]}}
      - _name: mlp
        h: {_type: qloguniform, _value: [0, 512, 8]}
  bs: {_type: randint, _value: [5, 5]}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: TPE}
trainingService: {platform: local}
",
        expect![[r#"
            $DIR/exp.yml:2:3: searchSpace: search space parameter "lr": loguniform needs 0 < low < high, got [0, 1]
            $DIR/exp.yml:8:9: searchSpace: search space parameter "model/mlp/h": qloguniform needs 0 < low < high, got [0, 512, 8]
            $DIR/exp.yml:9:3: searchSpace: search space parameter "bs": randint needs low < high (it draws from [low, high)), got [5, 5]
        "#]],
    );
    let project = Project::new(&[(
        "space.json",
        "{\n  \"a\": {\"_type\": \"choice\", \"_value\": [\n    {\"_name\": \"x\", \"q\": {\"_type\": \"uniform\", \"_value\": [2, 1]}}]},\n  \"b\": {\"_type\": \"gaussian\"}\n}\n",
    )]);
    let config = MINIMAL.replace(
        "searchSpace: {x: {_type: choice, _value: [1, 2]}}",
        "searchSpaceFile: space.json",
    );
    expect![[r#"
        $DIR/space.json:3:20: searchSpaceFile: search space parameter "a/x/q": uniform needs low < high, got [2, 1]
        $DIR/space.json:4:3: searchSpaceFile: search space parameter "b": unknown _type "gaussian"; expected one of choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal
    "#]]
    .assert_eq(&project.check("exp.yml", &config));
}

#[test]
fn invalid_search_space() {
    check(
        "\
searchSpace:
  lr: {_type: uniform, _value: [0.1, 0.01]}
  batch: {_type: choice, _value: [16, 32]}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: TPE}
trainingService: {platform: local}
",
        expect![[r#"
            $DIR/exp.yml:2:3: searchSpace: search space parameter "lr": uniform needs low < high, got [0.1, 0.01]
        "#]],
    );
    let project = Project::new(&[
        (
            "bad.json",
            "{\n  \"lr\": {\"_type\": \"uniform\", \"_value\": [0.1,\n}\n",
        ),
        (
            "wrong.json",
            "{\"lr\": {\"_type\": \"gaussian\", \"_value\": [0, 1]}}",
        ),
    ]);
    let with_file = |file: &str| {
        MINIMAL.replace(
            "searchSpace: {x: {_type: choice, _value: [1, 2]}}",
            &format!("searchSpaceFile: {file}"),
        )
    };
    expect![[r#"
        $DIR/bad.json:3:1: searchSpaceFile: malformed JSON: expected value
    "#]]
    .assert_eq(&project.check("exp.yml", &with_file("bad.json")));
    expect![[r#"
        $DIR/wrong.json:1:2: searchSpaceFile: search space parameter "lr": unknown _type "gaussian"; expected one of choice, randint, uniform, quniform, loguniform, qloguniform, normal, qnormal, lognormal, qlognormal
    "#]].assert_eq(&project.check("exp.yml", &with_file("wrong.json")));
    expect![[r#"
        $DIR/exp.yml:1:18: searchSpaceFile: cannot read search space file "$DIR/missing.json": No such file or directory
    "#]].assert_eq(&project.check("exp.yml", &with_file("missing.json")));
    // Found by fuzzing: reading /dev/zero never ended. Not a regular file, or too big, is an
    // error before anything is read.
    expect![[r#"
        $DIR/exp.yml:1:18: searchSpaceFile: cannot read search space file "/dev/zero": it is not a regular file
    "#]].assert_eq(&project.check("exp.yml", &with_file("/dev/zero")));
    let huge = std::fs::File::create(project.path("huge.json")).unwrap();
    huge.set_len(16 * 1024 * 1024 + 1).unwrap();
    expect![[r#"
        $DIR/exp.yml:1:18: searchSpaceFile: cannot read search space file "$DIR/huge.json": it is over 16 MiB
    "#]].assert_eq(&project.check("exp.yml", &with_file("huge.json")));
}

#[test]
fn both_search_space_and_search_space_file() {
    let project = Project::new(&[("space.json", "{}")]);
    expect![[r#"
        $DIR/exp.yml:6:18: searchSpaceFile: searchSpace is set too; keep one of searchSpace (inline) and searchSpaceFile
    "#]].assert_eq(&project.check("exp.yml", &minimal_with("searchSpaceFile: space.json\n")));
}

#[test]
fn trial_code_directory_must_exist() {
    let project = Project::new(&[("file.txt", "")]);
    expect![[r#"
        $DIR/exp.yml:6:21: trialCodeDirectory: directory "$DIR/nowhere" does not exist (No such file or directory)
    "#]].assert_eq(&project.check("exp.yml", &minimal_with("trialCodeDirectory: ./nowhere\n")));
    expect![[r#"
        $DIR/exp.yml:6:21: trialCodeDirectory: "$DIR/file.txt" is not a directory
    "#]]
    .assert_eq(&project.check("exp.yml", &minimal_with("trialCodeDirectory: file.txt\n")));
}

/// The working directory may be missing (create makes it) but not a file: create used to fail
/// with an OS error about a generated folder inside it, naming no field.
#[test]
fn experiment_working_directory_must_not_be_a_file() {
    let project = Project::new(&[("afile", ""), ("runs/", "")]);
    expect![[r#"
        $DIR/exp.yml:6:29: experimentWorkingDirectory: "$DIR/afile" is not a directory; name a folder (knob creates it if it is missing)
    "#]].assert_eq(&project.check(
        "exp.yml",
        &minimal_with("experimentWorkingDirectory: afile\n"),
    ));
    expect![[r#"
        $DIR/exp.yml:6:29: experimentWorkingDirectory: "$DIR/afile/sub/experiments" cannot be made: "$DIR/afile" is not a directory; name a folder (knob creates it if it is missing)
    "#]].assert_eq(&project.check(
        "exp.yml",
        &minimal_with("experimentWorkingDirectory: afile/sub/experiments\n"),
    ));
    // A folder, or one still to be made in one, is fine.
    for dir in ["runs", "runs/new/experiments"] {
        let config = project.load(
            "exp.yml",
            &minimal_with(&format!("experimentWorkingDirectory: {dir}\n")),
        );
        assert_eq!(config.experiment_working_directory, project.path(dir));
    }
}

#[test]
fn wrong_types_are_all_reported_at_once() {
    check(
        "\
searchSpace: {}
trialCommand: [python3, trial.py]
trialConcurrency: two
trialGpuNumber: 0.5
maxTrialNumber: \"10\"
maxExperimentDuration: 30x
trialGpuMemory: lots
debug: maybe
logLevel: verbose
placementPolicy: random
tuner: TPE
trainingService: local
",
        expect![[r#"
            $DIR/exp.yml:2:15: trialCommand: expected a non-empty string, got a list
            $DIR/exp.yml:3:19: trialConcurrency: expected a positive integer, got "two"
            $DIR/exp.yml:4:17: trialGpuNumber: expected a non-negative integer, got 0.5
            $DIR/exp.yml:5:17: maxTrialNumber: expected a positive integer, got "10"
            $DIR/exp.yml:6:24: maxExperimentDuration: expected a duration like "30s", "30m", "2h", "1d" or a number of seconds, got "30x"
            $DIR/exp.yml:7:17: trialGpuMemory: expected a size like "10GiB", "500MB" or a number of MiB, got "lots"
            $DIR/exp.yml:8:8: debug: expected true or false, got "maybe"
            $DIR/exp.yml:9:11: logLevel: expected one of "fatal", "error", "warning", "info", "debug", "trace", got "verbose"
            $DIR/exp.yml:10:18: placementPolicy: expected one of "recently-idle", "pack", "spread", "round-robin", got "random"
            $DIR/exp.yml:11:8: tuner: expected a mapping, got "TPE"
            $DIR/exp.yml:12:18: trainingService: expected a mapping like {platform: local} or a list of them, got "local"
        "#]],
    );
}

#[test]
fn negative_and_zero_numbers() {
    check(
        &(MINIMAL.replace("trialConcurrency: 1", "trialConcurrency: -2")
            + "trialGpuNumber: -1\nmaxTrialNumber: 0\nmaxTrialDuration: -5m\nmaxTrialRetries: -1\n"),
        expect![[r#"
            $DIR/exp.yml:3:19: trialConcurrency: expected a positive integer, got -2
            $DIR/exp.yml:6:17: trialGpuNumber: expected a non-negative integer, got -1
            $DIR/exp.yml:7:17: maxTrialNumber: expected a positive integer, got 0
            $DIR/exp.yml:8:19: maxTrialDuration: must be positive, got "-5m"
            $DIR/exp.yml:9:18: maxTrialRetries: expected a non-negative integer, got -1
        "#]],
    );
}

#[test]
fn training_service_errors() {
    check(
        "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: TPE}
trainingService:
  - platform: openpai
    host: pai.example
  - platform: lcoal
  - platform: remote
    machineList:
      - {host: h, port: 70000, password: \"***\"}
      - {user: u, sshKeyFile: nokey}
  - {useActiveGpu: true}
  - platform: remote
    machineList: []
",
        expect![[r#"
            $DIR/exp.yml:6:15: trainingService[0].platform: unknown platform "openpai"; installed: "local", "remote", "slurm" (a third-party training service is a plugin: name its file or folder in pluginPaths)
            $DIR/exp.yml:8:15: trainingService[1].platform: unknown platform "lcoal" (did you mean "local"?); installed: "local", "remote", "slurm" (a third-party training service is a plugin: name its file or folder in pluginPaths)
            $DIR/exp.yml:11:9: trainingService[2].machineList[0].user: required: the login user name
            $DIR/exp.yml:11:25: trainingService[2].machineList[0].port: expected a port number from 1 to 65535, got 70000
            $DIR/exp.yml:11:42: trainingService[2].machineList[0].password: "***" is the placeholder knob prints instead of a secret; write the real value
            $DIR/exp.yml:12:9: trainingService[2].machineList[1].host: required: the machine's IP address or host name
            $DIR/exp.yml:12:31: trainingService[2].machineList[1].sshKeyFile: SSH key file "$DIR/nokey" does not exist
            $DIR/exp.yml:13:5: trainingService[3].platform: required: the training service that runs the trials, e.g. local
            $DIR/exp.yml:15:18: trainingService[4].machineList: expected a non-empty list of machines like [{host: 10.0.0.2, user: alice}], got a list
        "#]],
    );
}

#[test]
fn trial_settings_inside_a_training_service_must_agree() {
    let project = Project::new(&[("code/", "")]);
    let text = "\
searchSpace: {}
trialConcurrency: 1
tuner: {name: TPE}
trainingService:
  - platform: local
    trialCommand: python3 trial.py
    trialCodeDirectory: code
  - platform: remote
    trialCommand: python3 other.py
    machineList: [{host: h, user: u}]
";
    expect![[r#"
        $DIR/exp.yml:9:19: trainingService[1].trialCommand: "python3 other.py" differs from trainingService[0].trialCommand ("python3 trial.py"); knob runs one trialCommand per experiment, set it once at top level
    "#]].assert_eq(&project.check("exp.yml", text));
    let accepted = text.replace("python3 other.py", "python3 trial.py");
    let config = project.load("exp.yml", &accepted);
    assert_eq!(config.trial_command, "python3 trial.py");
    assert!(config.trial_code_directory.ends_with("code"));
}

#[test]
fn refused_nni_features() {
    check(
        &minimal_with(
            "useAnnotation: true\nexperimentType: nas\nsharedStorage: {storageType: NFS}\n",
        ),
        expect![[r#"
            $DIR/exp.yml:6:16: useAnnotation: NNI annotations are not supported by knob; write a searchSpace and call nni.get_next_parameter() in the trial
            $DIR/exp.yml:7:17: experimentType: only "hpo" experiments are supported (NAS is not), got "nas"
            $DIR/exp.yml:8:16: sharedStorage: NNI's shared storage is not supported by knob
        "#]],
    );
}

#[test]
fn duplicate_keys() {
    check(
        &minimal_with("trialConcurrency: 2\n"),
        expect![[r#"
        $DIR/exp.yml:6:1: malformed YAML: duplicate key "trialConcurrency" (first set on line 3)
    "#]],
    );
    check(
        &minimal_with("trial_concurrency: 2\n"),
        expect![[r#"
        $DIR/exp.yml:6:1: "trial_concurrency" and "trialConcurrency" (line 3) name the same field; keep one
    "#]],
    );
}

/// NNI reads configs with PyYAML (YAML 1.1): merge keys and `yes`/`no`/`on`/`off` read as
/// there, so an NNI config that uses them means the same here.
#[test]
fn yaml_1_1_merge_keys_and_booleans_read_as_nni_reads_them() {
    check_fields(
        "searchSpace:
  x: {_type: choice, _value: [on, Off, \"on\", yes, NO, 'no']}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: &tuner
  name: TPE
  classArgs: {optimize_mode: maximize, seed: 1}
assessor:
  <<: *tuner
  name: Medianstop
trainingService: {platform: local}
",
        &["tuner", "assessor", "searchSpace"],
        expect![[r#"
            tuner:
              name: TPE
              className: null
              codeDirectory: null
              classArgs:
                optimize_mode: maximize
                seed: 1
            assessor:
              name: Medianstop
              className: null
              codeDirectory: null
              classArgs:
                optimize_mode: maximize
                seed: 1
            searchSpace:
              x:
                _type: choice
                _value:
                  - true
                  - false
                  - "on"
                  - true
                  - false
                  - "no"
        "#]],
    );
    // Several mappings: the first one's value wins; the mapping's own keys win over all.
    check_fields(
        "searchSpace: {x: {_type: choice, _value: [1, 2]}}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner:
  name: TPE
  classArgs:
    <<: [{optimize_mode: maximize, seed: 5}, {seed: 7, x: 1}]
    x: 2
trainingService: {platform: local}
",
        &["tuner"],
        expect![[r#"
            tuner:
              name: TPE
              className: null
              codeDirectory: null
              classArgs:
                optimize_mode: maximize
                seed: 5
                x: 2
        "#]],
    );
    check(
        &minimal_with("<<: 3\n"),
        expect![[r#"
            $DIR/exp.yml:6:5: malformed YAML: a merge key (<<) takes a mapping or a list of mappings, as in `<<: *defaults`
        "#]],
    );
}

#[test]
fn documents_that_are_not_configs() {
    check(
        "",
        expect![[r#"
        $DIR/exp.yml: the config file is empty
    "#]],
    );
    check(
        "- a\n- b\n",
        expect![[r#"
        $DIR/exp.yml:1:1: a config is a mapping of fields (trialCommand: ..., tuner: ...), got a list
    "#]],
    );
    check(
        &format!("{MINIMAL}---\n{MINIMAL}"),
        expect![[r#"
        $DIR/exp.yml:6:1: malformed YAML: a second YAML document starts here; the file must hold one (remove this `---` and what follows, or merge them)
    "#]],
    );
    let project = Project::new(&[]);
    let missing = config::check_file(&project.path("nope.yml"), &BuiltInServices).unwrap_err();
    expect!["$DIR/nope.yml: cannot read config file: No such file or directory"]
        .assert_eq(&project.redact(&missing.join("\n")));
}

#[test]
fn hostile_input_gives_an_error_not_a_crash() {
    let deep = format!(
        "searchSpace: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let deep_block = format!("searchSpace:\n{}x\n", "- ".repeat(100_000));
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for level in 1..12 {
        let previous = (b'a' + level - 1) as char;
        let name = (b'a' + level) as char;
        bomb.push_str(&format!("{name}: &{name} [*{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}, *{previous}]\n"));
    }
    let mut rendered = String::new();
    for text in [
        deep,
        deep_block,
        bomb,
        "\u{feff}\0\u{1}: [".to_owned(),
        "x: !!int abc\n".to_owned(),
    ] {
        let project = Project::new(&[]);
        let output = project.check("exp.yml", &text);
        rendered.push_str(output.lines().next().unwrap_or(""));
        rendered.push('\n');
    }
    expect![[r#"
        $DIR/exp.yml:1:269: malformed YAML: recursion limit exceeded
        $DIR/exp.yml:2:255: malformed YAML: nesting deeper than 128 levels
        $DIR/exp.yml:6:36: malformed YAML: the document expands to more than 1000000 nodes
        $DIR/exp.yml:1:1: malformed YAML: found unprintable character
        $DIR/exp.yml:1:4: malformed YAML: the value does not match its tag
    "#]]
    .assert_eq(&rendered);
}

#[test]
fn example_configs_load() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config/examples");
    let mut rendered = String::new();
    for name in ["reference.yml", "hybrid.yml"] {
        let loaded = config::load_file(&examples.join(name), &BuiltInServices)
            .unwrap_or_else(|errors| panic!("{errors}"));
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let platforms: Vec<_> = loaded
            .config
            .training_service
            .iter()
            .map(|service| service.platform())
            .collect();
        rendered.push_str(&format!(
            "{name}: tuner {}, {platforms:?}\n",
            loaded.config.tuner.display_name()
        ));
    }
    expect![[r#"
        reference.yml: tuner TPE, ["local"]
        hybrid.yml: tuner TPE, ["local", "remote"]
    "#]]
    .assert_eq(&rendered);
}

#[test]
fn out_of_range_numbers() {
    check(
        &minimal_with("maxTrialNumber: 99999999999999999999\nmaxTrialDuration: 1e300\ntrialGpuMemory: 1e300TB\ntrialCpuNumber: 4294967296\nmaxExperimentDuration: .nan\n"),
        expect![[r#"
            $DIR/exp.yml:6:17: maxTrialNumber: too large (at most 9223372036854775807)
            $DIR/exp.yml:7:19: maxTrialDuration: must be at most 100 years, got 1e300
            $DIR/exp.yml:8:17: trialGpuMemory: too large, got "1e300TB"
            $DIR/exp.yml:9:17: trialCpuNumber: 4294967296 is too large (at most 4294967295)
            $DIR/exp.yml:10:24: maxExperimentDuration: must be positive, got NaN
        "#]],
    );
    // Integers past i64 are read as floats by YAML; they are still "too large", not "not an
    // integer" (it said "expected a positive integer, got 1e20").
    check(
        &format!(
            "{}maxTrialNumber: 18446744073709551615\nmaxTrialRetries: 4294967296\n",
            MINIMAL.replace(
                "trialConcurrency: 1",
                "trialConcurrency: 99999999999999999999"
            )
        ),
        expect![[r#"
            $DIR/exp.yml:3:19: trialConcurrency: too large (at most 4294967295)
            $DIR/exp.yml:6:17: maxTrialNumber: too large (at most 9223372036854775807)
            $DIR/exp.yml:7:18: maxTrialRetries: 4294967296 is too large (at most 4294967295)
        "#]],
    );
}

/// Every prefix of a real config, as YAML and as JSON: each gives a config or errors, never a
/// panic (the parser's own guard is not involved: it would turn a panic into an error line).
#[test]
fn truncated_configs_never_panic() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config/examples");
    let text = std::fs::read_to_string(examples.join("reference.yml")).unwrap();
    let json = serde_json::to_string_pretty(
        &config::load_file(&examples.join("reference.yml"), &BuiltInServices)
            .unwrap()
            .config,
    )
    .unwrap();
    let mut outcomes = [0usize; 2];
    for (source, name) in [(&text, "exp.yml"), (&json, "exp.json")] {
        for end in (0..=source.len()).filter(|end| source.is_char_boundary(*end)) {
            let result = config::load_str(&source[..end], &examples.join(name), &BuiltInServices);
            if let Err(errors) = &result {
                assert!(!errors.0.is_empty());
                assert!(
                    errors
                        .lines()
                        .iter()
                        .all(|line| !line.contains("parser failed")),
                    "{errors}"
                );
            }
            outcomes[usize::from(result.is_ok())] += 1;
        }
    }
    assert!(outcomes[0] > 100, "{outcomes:?}");
}

#[test]
fn remote_knob_extensions_and_their_bad_values() {
    let project = Project::new(&[("ssh/known_hosts", ""), ("ssh-folder/", "")]);
    let good = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 2
tuner: {name: Random}
trainingService:
  platform: remote
  knownHostsFile: ssh/known_hosts
  hostLossTimeout: 2m
  agentRoot: /scratch/knob
  machineList:
    - {host: h1, user: u, acceptNewHostKey: true}
";
    expect![[r#"
        trainingService:
          - platform: remote
            machineList:
              - host: h1
                port: 22
                user: u
                password: null
                sshKeyFile: null
                sshPassphrase: null
                useActiveGpu: false
                maxTrialNumberPerGpu: 1
                gpuIndices: null
                pythonPath: null
                acceptNewHostKey: true
            reuseMode: true
            knownHostsFile: $DIR/ssh/known_hosts
            hostLossTimeout: 120
            agentRoot: /scratch/knob
    "#]]
    .assert_eq(&only_fields(
        &project.check("exp.yml", good),
        &["trainingService"],
    ));
    // A known_hosts file that does not exist yet is fine when its folder does (acceptNewHostKey
    // may create it).
    let new_file = good.replace("ssh/known_hosts", "ssh/new_known_hosts");
    assert!(project
        .check("exp.yml", &new_file)
        .contains("knownHostsFile: $DIR/ssh/new_known_hosts"));

    let bad = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 2
tuner: {name: Random}
trainingService:
  - platform: remote
    knownHostsFile: ssh-folder
    hostLossTimeout: 0
    agentRoot: ''
    machineList:
      - {host: h1, user: u, acceptNewHostKey: maybe}
  - platform: local
";
    let bad_folder = bad.replace("ssh-folder", "missing/known_hosts");
    expect![[r#"
        $DIR/exp.yml:7:21: trainingService[0].knownHostsFile: "$DIR/ssh-folder" is a folder; name the known_hosts file itself
        $DIR/exp.yml:8:22: trainingService[0].hostLossTimeout: must be positive, got 0
        $DIR/exp.yml:9:16: trainingService[0].agentRoot: expected a non-empty string, got ""
        $DIR/exp.yml:11:47: trainingService[0].machineList[0].acceptNewHostKey: expected true or false, got "maybe"
    "#]]
    .assert_eq(&project.check("exp.yml", bad));
    expect![[r#"
        $DIR/exp.yml:7:21: trainingService[0].knownHostsFile: the folder of "$DIR/missing/known_hosts" does not exist; create it or fix the path
        $DIR/exp.yml:8:22: trainingService[0].hostLossTimeout: must be positive, got 0
        $DIR/exp.yml:9:16: trainingService[0].agentRoot: expected a non-empty string, got ""
        $DIR/exp.yml:11:47: trainingService[0].machineList[0].acceptNewHostKey: expected true or false, got "maybe"
    "#]]
    .assert_eq(&project.check("exp.yml", &bad_folder));
}

#[test]
fn secrets_stay_in_memory_and_resume_restores_them() {
    use knob_core::config::recheck_services;
    use knob_core::manager::restore_secrets;
    use knob_plugin_api::service::ServiceContext;
    let project = Project::new(&[("keys/id_ed25519", "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n")]);
    let text = "\
searchSpace: {}
trialCommand: python3 trial.py
trialConcurrency: 2
tuner: {name: Random}
trainingService:
  platform: remote
  reuseMode: false
  hostLossTimeout: 5s
  machineList:
    - {host: 10.0.0.2, user: alice, password: hunter2, gpuIndices: 1, pythonPath: /opt/py/bin}
    - {host: gpu.example.org, port: 2222, user: bob, sshKeyFile: keys/id_ed25519, sshPassphrase: open sesame}
    - {host: plain.example.org, user: carol, sshKeyFile: keys/id_ed25519}
";
    let config = project.load("exp.yml", text);
    let service = &config.training_service[0];
    // The service declared its secrets; the model keeps them only in memory.
    assert_eq!(service.config["machineList"][0]["password"], "***");
    let clear = service.config_with_secrets();
    assert_eq!(clear["machineList"][0]["password"], "hunter2");
    assert_eq!(clear["machineList"][1]["sshPassphrase"], "open sesame");
    assert!(clear["machineList"][2]["password"].is_null());
    let missing = |config: &ExperimentConfig| -> Vec<String> {
        config.training_service[0]
            .missing_secrets()
            .iter()
            .map(|secret| secret.path.to_string())
            .collect()
    };
    assert!(missing(&config).is_empty());

    // What the store keeps, read back and checked again by its service: the secrets are
    // placeholders, and known missing until they are supplied again.
    let mut stored: ExperimentConfig =
        serde_json::from_value(serde_json::to_value(&config).unwrap()).unwrap();
    let stored_text = serde_json::to_string(&stored).unwrap();
    assert!(!stored_text.contains("hunter2") && !stored_text.contains("open sesame"));
    recheck_services(&mut stored, &BuiltInServices, &ServiceContext::default()).unwrap();
    assert_eq!(
        missing(&stored),
        ["machineList[0].password", "machineList[1].sshPassphrase"]
    );

    // From the original file: every secret comes back.
    let mut from_file = stored.clone();
    restore_secrets(&mut from_file, Some(&config), &|_| None);
    assert_eq!(from_file, config);

    // From the environment variables the service named, when the file is gone.
    let mut from_variables = stored.clone();
    restore_secrets(&mut from_variables, None, &|name| match name {
        "KNOB_SSH_PASSWORD" => Some("pw".into()),
        "KNOB_SSH_PASSPHRASE" => Some("phrase".into()),
        _ => None,
    });
    let clear = from_variables.training_service[0].config_with_secrets();
    assert_eq!(clear["machineList"][0]["password"], "pw");
    assert_eq!(clear["machineList"][1]["sshPassphrase"], "phrase");
    assert!(clear["machineList"][2]["password"].is_null());

    // A file that no longer has the same machine around a secret gives nothing for it.
    let other = project.load("other.yml", &text.replace("10.0.0.2", "10.0.0.9"));
    let mut partial = stored.clone();
    restore_secrets(&mut partial, Some(&other), &|_| None);
    assert_eq!(missing(&partial), ["machineList[0].password"]);
}

/// `tuner.classArgs.optimize_mode` is knob's too (which trials are best): a value NNI's tuners
/// refuse is refused at load, naming the field; the loaded config and its stored JSON form read
/// the same direction (the manager reads the one, the API and `knob top` the other).
#[test]
fn optimize_mode_is_read_one_way() {
    use knob_core::store::Direction;
    let with_mode = |mode: &str| {
        MINIMAL.replace(
            "tuner: {name: Random}",
            &format!("tuner: {{name: TPE, classArgs: {{optimize_mode: {mode}}}}}"),
        )
    };
    check(
        &format!(
            "{}{}",
            with_mode("max"),
            "assessor: {name: Medianstop, classArgs: {optimize_mode: whatever}}\n"
        ),
        expect![[r#"
            $DIR/exp.yml:4:32: tuner.classArgs.optimize_mode: must be "maximize" or "minimize", got "max"
        "#]],
    );
    check(
        &with_mode("Minimize"),
        expect![[r#"
            $DIR/exp.yml:4:32: tuner.classArgs.optimize_mode: must be "maximize" or "minimize", got "Minimize"
        "#]],
    );
    check(
        &with_mode("1"),
        expect![[r#"
            $DIR/exp.yml:4:32: tuner.classArgs.optimize_mode: must be "maximize" or "minimize", got 1
        "#]],
    );
    let project = Project::new(&[]);
    let tuner = |tuner: &str| MINIMAL.replace("tuner: {name: Random}", &format!("tuner: {tuner}"));
    for (text, direction) in [
        (MINIMAL.to_string(), Direction::Maximize),
        // Absent, the tuner's own default: NNI's TPE and Anneal minimise (and knob's follow).
        (with_mode("null"), Direction::Minimize),
        (tuner("{name: TPE}"), Direction::Minimize),
        (
            tuner("{name: anneal, classArgs: {seed: 1}}"),
            Direction::Minimize,
        ),
        (tuner("{name: GP}"), Direction::Maximize),
        (tuner("{name: Evolution}"), Direction::Maximize),
        (tuner("{name: CMAES}"), Direction::Maximize),
        (with_mode("maximize"), Direction::Maximize),
        (with_mode("minimize"), Direction::Minimize),
    ] {
        let config = project.load("exp.yml", &text);
        assert_eq!(config.direction(), direction, "{text}");
        let stored = serde_json::to_value(&config).unwrap();
        assert_eq!(Direction::of_config(&stored), direction, "{text}");
    }
    // A store written before the check may hold anything: read as the tuner's default.
    let stored =
        serde_json::json!({"tuner": {"name": "TPE", "classArgs": {"optimize_mode": "max"}}});
    assert_eq!(Direction::of_config(&stored), Direction::Minimize);
    let stored =
        serde_json::json!({"tuner": {"name": "GPTuner", "classArgs": {"optimize_mode": "max"}}});
    assert_eq!(Direction::of_config(&stored), Direction::Maximize);
}

#[test]
fn a_tuner_optimize_mode_against_the_objectives_is_refused() {
    let with = |mode: &str, objectives: &str| {
        MINIMAL.replace(
            "tuner: {name: Random}",
            &format!("tuner: {{name: TPE, classArgs: {{optimize_mode: {mode}}}}}\nobjectives: {objectives}"),
        )
    };
    check(
        &with("maximize", "[{metric: loss, mode: minimize}]"),
        expect![[r#"
            $DIR/exp.yml:4:32: tuner.classArgs.optimize_mode: maximize contradicts objectives, whose first objective (loss, minimize) decides which trials are best; remove optimize_mode or make the two agree
        "#]],
    );
    // Agreeing, or said by the objectives alone, is fine.
    let project = Project::new(&[]);
    for text in [
        with("minimize", "[{metric: loss, mode: minimize}]"),
        with(
            "minimize",
            "[{metric: ok, constraint: '<= 0'}, {metric: loss, mode: minimize}]",
        ),
    ] {
        let config = project.load("exp.yml", &text);
        assert_eq!(config.direction(), knob_core::store::Direction::Minimize);
    }
}

#[test]
fn infinite_and_nan_numbers_in_a_service_mapping_are_refused_at_their_line() {
    // JSON has no form for them: they reached the service as null, read as "not set" and
    // silently replaced by the default.
    check(
        "\
searchSpace: {x: {_type: choice, _value: [1, 2]}}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: Random}
trainingService:
  platform: local
  maxCpuUtilization: .nan
  gpuIndices: [.inf]
",
        expect![[r#"
            $DIR/exp.yml:7:22: trainingService.maxCpuUtilization: expected a finite number, got NaN
            $DIR/exp.yml:8:16: trainingService.gpuIndices[0]: expected a finite number, got inf
        "#]],
    );
}

/// classArgs and search spaces are passed on as JSON, which has no NaN or infinity: the error
/// said "inf cannot be represented in JSON" against the whole `classArgs`, naming neither the
/// entry nor what to write (and a `1e400` the user wrote came back as "inf").
#[test]
fn a_nan_or_an_infinity_in_class_args_or_the_space_names_its_entry() {
    check(
        "\
searchSpace: {x: {_type: uniform, _value: [0, 1e400]}}
trialCommand: python3 trial.py
trialConcurrency: 1
tuner: {name: Random, classArgs: {seed: 1, limits: {lower: -.inf}}}
assessor: {name: Threshold, classArgs: {lower: .nan}}
trainingService: {platform: local}
",
        expect![[r#"
            $DIR/exp.yml:1:47: searchSpace: x._value[1] is infinite (.inf, or a number past 1.8e308), which has no JSON form (it is passed on as JSON); write a finite number
            $DIR/exp.yml:4:60: tuner.classArgs: limits.lower is minus infinity (-.inf, or a number past -1.8e308), which has no JSON form (it is passed on as JSON); write a finite number
            $DIR/exp.yml:5:48: assessor.classArgs: lower is NaN (.nan), which has no JSON form (it is passed on as JSON); write a finite number
        "#]],
    );
}
