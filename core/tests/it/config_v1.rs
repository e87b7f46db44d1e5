//! NNI v1 configs (issue 20 item 16): converted to v2 as NNI 2.x and 3.0 do, with a note;
//! `knob config check --v2` prints the conversion; errors keep their place in the file and the
//! v1 name of the field. `cli/tests/it/nni_v1.rs` compares the conversion with NNI's own.

use expect_test::{expect, Expect};
use knob_core::config;

use crate::BuiltInServices;

use crate::config::{only_fields, Project};

/// An NNI v1 example config of the mnist kind, as NNI 1.x shipped them (comments included).
const MNIST_V1: &str = "\
authorName: default
experimentName: example_mnist
trialConcurrency: 1
maxExecDuration: 1h
maxTrialNum: 10
#choice: local, remote, pai
trainingServicePlatform: local
searchSpacePath: search_space.json
#choice: true, false
useAnnotation: false
tuner:
  #choice: TPE, Random, Anneal, Evolution, BatchTuner, MetisTuner, GPTuner
  builtinTunerName: TPE
  classArgs:
    #choice: maximize, minimize
    optimize_mode: maximize
trial:
  command: python3 mnist.py
  codeDir: .
  gpuNum: 0
";

const SPACE: &str = r#"{"lr": {"_type": "choice", "_value": [0.0001, 0.001, 0.01]}}"#;

/// `knob config check --v2` on `exp/config.yml` holding `text`, next to a search space.
fn check_v2(text: &str, expect: Expect) {
    let project = Project::new(&[("exp/search_space.json", SPACE)]);
    let path = project.path("exp/config.yml");
    std::fs::write(&path, text).unwrap();
    let rendered = match config::check_file_v2(&path, &BuiltInServices) {
        Ok(document) => document,
        Err(errors) => errors.join("\n") + "\n",
    };
    expect.assert_eq(&project.redact(&rendered));
}

/// `knob config check` (canonical form, or the errors) on `exp/config.yml` holding `text`.
fn check_v1(text: &str, fields: &[&str], expect: Expect) {
    let project = Project::new(&[("exp/search_space.json", SPACE)]);
    let rendered = project.check("exp/config.yml", text);
    expect.assert_eq(&only_fields(&rendered, fields));
}

#[test]
fn a_local_mnist_v1_config_converts_as_nni_does() {
    // NNI's `to_v2` gives these fields in this order (see cli/tests/it/nni_v1.rs).
    check_v2(
        MNIST_V1,
        expect![[r#"
            # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
            experimentName: example_mnist
            trialConcurrency: 1
            maxExperimentDuration: 1h
            maxTrialNumber: 10
            searchSpaceFile: search_space.json
            useAnnotation: false
            trialCommand: python3 mnist.py
            trialCodeDirectory: "."
            trialGpuNumber: 0
            tuner:
              name: TPE
              classArgs:
                optimize_mode: maximize
            trainingService:
              platform: local
        "#]],
    );
    // Read as v2 reads it: paths relative to the config file's folder, durations in seconds.
    check_v1(
        MNIST_V1,
        &[
            "trialCommand",
            "trialCodeDirectory",
            "maxExperimentDuration",
            "maxTrialNumber",
            "tuner",
            "trainingService",
            "searchSpace",
        ],
        expect![[r#"
            # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
            trialCommand: python3 mnist.py
            trialCodeDirectory: $DIR/exp
            maxExperimentDuration: 3600
            maxTrialNumber: 10
            tuner:
              name: TPE
              className: null
              codeDirectory: null
              classArgs:
                optimize_mode: maximize
            trainingService:
              - platform: local
                useActiveGpu: false
                maxTrialNumberPerGpu: 1
                gpuIndices: null
                reuseMode: false
            searchSpace:
              lr:
                _type: choice
                _value:
                  - 0.0001
                  - 0.001
                  - 0.01
        "#]],
    );
}

#[test]
fn max_exec_duration_units_are_nni_s() {
    let project = Project::new(&[("exp/search_space.json", SPACE)]);
    for (written, seconds) in [
        ("45s", 45),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("999d", 999 * 86400),
        ("600", 600),
    ] {
        let text = MNIST_V1.replace(
            "maxExecDuration: 1h",
            &format!("maxExecDuration: {written}"),
        );
        let loaded = project.load("exp/config.yml", &text);
        assert_eq!(
            loaded.max_experiment_duration,
            Some(std::time::Duration::from_secs(seconds)),
            "{written}"
        );
    }
    check_v1(
        &MNIST_V1.replace("maxExecDuration: 1h", "maxExecDuration: 1w"),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:4:18: maxExecDuration: expected a duration like "30s", "30m", "2h", "1d" or a number of seconds, got "1w"
        "#]],
    );
}

#[test]
fn local_config_and_the_tuner_s_gpus_move_into_the_v2_places() {
    let text = MNIST_V1.replace(
        "trial:\n",
        "localConfig:\n  gpuIndices: 0,1\n  maxTrialNumPerGpu: 2\n  useActiveGpu: true\ntrial:\n",
    ) + "logDir: ../experiments\nnniManagerIp: 10.0.0.1\n";
    let text = text.replace(
        "  builtinTunerName: TPE\n",
        "  builtinTunerName: TPE\n  gpuIndices: 3\n",
    );
    check_v2(
        &text,
        expect![[r##"
            # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
            # warning: $DIR/exp/config.yml:27:15: nniManagerIp: ignored: knob reaches training machines over SSH and needs no route back to the manager
            experimentName: example_mnist
            trialConcurrency: 1
            maxExperimentDuration: 1h
            maxTrialNumber: 10
            searchSpaceFile: search_space.json
            nniManagerIp: 10.0.0.1
            experimentWorkingDirectory: "../experiments"
            useAnnotation: false
            trialCommand: python3 mnist.py
            trialCodeDirectory: "."
            trialGpuNumber: 0
            tuner:
              name: TPE
              classArgs:
                optimize_mode: maximize
            tunerGpuIndices: 3
            trainingService:
              platform: local
              gpuIndices: "0,1"
              maxTrialNumberPerGpu: 2
              useActiveGpu: true
        "##]],
    );
}

const REMOTE_V1: &str = "\
authorName: default
experimentName: example_mnist_remote
trialConcurrency: 2
maxExecDuration: 3h
maxTrialNum: 20
trainingServicePlatform: remote
searchSpacePath: search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: maximize
trial:
  command: python3 mnist.py
  codeDir: .
  gpuNum: 1
remoteConfig:
  reuse: true
machineList:
  - ip: 10.1.1.1
    username: bob
    passwd: bob-secret-123
    gpuIndices: 0,1
    maxTrialNumPerGpu: 2
  - ip: 10.1.1.2
    port: 2222
    username: alice
    sshKeyPath: keys/id_rsa
    passphrase: alice-passphrase-456
    useActiveGpu: true
    pythonPath: /opt/conda/bin
";

#[test]
fn a_remote_machine_list_converts_and_its_password_stays_secret() {
    let project = Project::new(&[
        ("exp/search_space.json", SPACE),
        ("exp/keys/id_rsa", "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n"),
    ]);
    let path = project.path("exp/config.yml");
    std::fs::write(&path, REMOTE_V1).unwrap();
    let v2 = config::check_file_v2(&path, &BuiltInServices).unwrap();
    expect![[r#"
        # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
        experimentName: example_mnist_remote
        trialConcurrency: 2
        maxExperimentDuration: 3h
        maxTrialNumber: 20
        searchSpaceFile: search_space.json
        useAnnotation: false
        trialCommand: python3 mnist.py
        trialCodeDirectory: "."
        trialGpuNumber: 1
        tuner:
          name: TPE
          classArgs:
            optimize_mode: maximize
        trainingService:
          platform: remote
          reuseMode: true
          machineList:
            - host: 10.1.1.1
              user: bob
              gpuIndices: "0,1"
              maxTrialNumberPerGpu: 2
              password: "***"
            - host: 10.1.1.2
              port: 2222
              user: alice
              sshKeyFile: keys/id_rsa
              sshPassphrase: "***"
              useActiveGpu: true
              pythonPath: /opt/conda/bin
    "#]]
    .assert_eq(&project.redact(&v2));

    let canonical = config::check_file(&path, &BuiltInServices).unwrap();
    for secret in ["bob-secret-123", "alice-passphrase-456"] {
        assert!(
            !v2.contains(secret) && !canonical.contains(secret),
            "{secret}"
        );
    }
    // In memory, for the SSH connection, the secrets are whole; the key file is found relative
    // to the config file.
    let loaded = config::load_file(&path, &BuiltInServices).unwrap().config;
    // The service's config with its secrets in clear, as the service is built with it.
    let remote = loaded.training_service[0].config_with_secrets();
    assert_eq!(remote["reuseMode"], true);
    let machines = remote["machineList"].as_array().unwrap();
    let [bob, alice] = &machines[..] else {
        panic!("{remote}");
    };
    assert_eq!(bob["password"], "bob-secret-123");
    assert_eq!(bob["gpuIndices"], serde_json::json!([0, 1]));
    assert_eq!(bob["maxTrialNumberPerGpu"], 2);
    assert_eq!(
        (&alice["port"], &alice["user"]),
        (&serde_json::json!(2222), &serde_json::json!("alice"))
    );
    assert_eq!(alice["sshPassphrase"], "alice-passphrase-456");
    assert_eq!(
        alice["sshKeyFile"].as_str().map(std::path::PathBuf::from),
        Some(
            std::fs::canonicalize(project.path("exp"))
                .unwrap()
                .join("keys/id_rsa")
        )
    );
    assert_eq!(alice["pythonPath"], "/opt/conda/bin");
}

#[test]
fn errors_in_a_v1_config_have_their_place_and_v1_name() {
    let text = REMOTE_V1
        .replace("trialConcurrency: 2", "trialConcurrency: two")
        .replace(
            "  command: python3 mnist.py\n",
            "  commnd: python3 mnist.py\n",
        )
        .replace("    port: 2222", "    port: twenty-two")
        .replace("    username: bob\n", "")
        .replace("  reuse: true", "  reuse: maybe");
    check_v1(
        &text,
        &[],
        expect![[r#"
            $DIR/exp/config.yml:3:19: trialConcurrency: expected a positive integer, got "two"
            $DIR/exp/config.yml:14:3: trial: unknown field "commnd" (did you mean "command"?)
            $DIR/exp/config.yml:18:10: remoteConfig.reuse: expected true or false, got "maybe"
            $DIR/exp/config.yml:20:5: machineList[0].username: required: the login user name
            $DIR/exp/config.yml:25:11: machineList[1].port: expected a port number from 1 to 65535, got "twenty-two"
            $DIR/exp/config.yml:27:17: machineList[1].sshKeyPath: SSH key file "$DIR/exp/keys/id_rsa" does not exist
        "#]],
    );
}

#[test]
fn a_bad_machine_list_is_one_error_and_keeps_the_machines_indexes() {
    let remote = MNIST_V1.replace(
        "trainingServicePlatform: local",
        "trainingServicePlatform: remote",
    );
    // Missing: one error, in v1 words (the v2 reader's "trainingServicePlatform.machineList:
    // ... host and user" came too).
    check_v1(
        &remote,
        &[],
        expect![[r#"
        $DIR/exp/config.yml:7:26: machineList: required for trainingServicePlatform: remote: the machines, each with ip, username and passwd or sshKeyPath
    "#]],
    );
    check_v1(
        &(remote.clone() + "machineList: {ip: 10.0.0.1}\n"),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:21:14: machineList: expected a list of machines, got a mapping
        "#]],
    );
    check_v1(
        &(remote + "machineList: [5, {ip: 10.0.0.1, username: u, port: 0}]\n"),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:21:15: machineList[0]: expected a mapping, got 5
            $DIR/exp/config.yml:21:52: machineList[1].port: expected a port number from 1 to 65535, got 0
        "#]],
    );
}

/// A v1 config gives its search space as `searchSpacePath` (it refuses v2's `searchSpace`), so
/// that is what a missing one asks for; a missing tuner is asked for as v1 writes one (the
/// example was v2's `{name: TPE}`, which a v1 tuner refuses).
#[test]
fn a_missing_search_space_path_is_asked_for_in_v1_words() {
    check_v1(
        &MNIST_V1.replace("searchSpacePath: search_space.json\n", ""),
        &[],
        expect![[r#"
            $DIR/exp/config.yml: searchSpacePath: required: the search space file (JSON or YAML), e.g. searchSpacePath: search_space.json; an empty space is a file holding {}
        "#]],
    );
    let tuner = "tuner:\n  #choice: TPE, Random, Anneal, Evolution, BatchTuner, MetisTuner, GPTuner\n  builtinTunerName: TPE\n  classArgs:\n    #choice: maximize, minimize\n    optimize_mode: maximize\n";
    assert!(MNIST_V1.contains(tuner));
    check_v1(
        &MNIST_V1.replace(tuner, ""),
        &[],
        expect![[r#"
            $DIR/exp/config.yml: tuner: required: the tuning algorithm, e.g. tuner: {builtinTunerName: TPE, classArgs: {optimize_mode: maximize}} (or advisor: {builtinAdvisorName: ...})
        "#]],
    );
}

#[test]
fn v1_fields_without_a_v2_equivalent_are_named_with_what_to_do() {
    let text = MNIST_V1
        .replace("useAnnotation: false", "useAnnotation: true")
        .replace("  gpuNum: 0\n", "  gpuNum: 0\n  nasMode: classic_mode\n")
        + "multiPhase: true\nmultiThread: true\nmachineList: []\nhybridConfig: {}\n";
    check_v1(
        &text,
        &[],
        expect![[r#"
            $DIR/exp/config.yml:10:16: useAnnotation: NNI annotations are not supported by knob; write a searchSpace and call nni.get_next_parameter() in the trial
            $DIR/exp/config.yml:21:12: trial.nasMode: NNI v1 NAS modes are not supported (knob runs hyperparameter experiments); remove nasMode
            $DIR/exp/config.yml:22:13: multiPhase: NNI v1 multi-phase trials are not supported (NNI 2.0 dropped them); remove multiPhase and have each trial ask for its parameters once
            $DIR/exp/config.yml:24:14: machineList: only used with trainingServicePlatform: remote, and this config says local; remove it or change the platform
            $DIR/exp/config.yml:25:15: hybridConfig: only used with trainingServicePlatform: hybrid, and this config says local; remove it or change the platform
        "#]],
    );
    // The trial of a config copied from a cluster platform's: named as such, not "unknown
    // field cpuNum (did you mean gpuNum?)".
    check_v1(
        &MNIST_V1.replace(
            "  gpuNum: 0\n",
            "  gpuNum: 0\n  cpuNum: 1\n  memoryMB: 8192\n  image: msranni/nni:latest\n",
        ),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:21:11: trial.cpuNum: a trial field of NNI v1's cluster platforms (pai, kubeflow, aml, ...), which NNI ignores on local and remote; remove it (to limit what a trial gets, write trialCpuNumber in an NNI v2 config)
            $DIR/exp/config.yml:22:13: trial.memoryMB: a trial field of NNI v1's cluster platforms (pai, kubeflow, aml, ...), which NNI ignores on local and remote; remove it (to limit what a trial gets, write trialMemorySize in an NNI v2 config)
            $DIR/exp/config.yml:23:10: trial.image: a trial field of NNI v1's cluster platforms (pai, kubeflow, aml, ...), which NNI ignores on local and remote; remove it
        "#]],
    );
    for (platform, column) in [("pai", 26), ("kubeflow", 26), ("hybrid", 26)] {
        let text = MNIST_V1.replace(
            "trainingServicePlatform: local",
            &format!("trainingServicePlatform: {platform}"),
        ) + &format!("{platform}Config: {{host: 10.0.0.1}}\n");
        let project = Project::new(&[("exp/search_space.json", SPACE)]);
        let rendered = project.check("exp/config.yml", &text);
        assert_eq!(
            rendered,
            format!(
                "$DIR/exp/config.yml:7:{column}: trainingServicePlatform: NNI v1 platform \
                 {platform:?} has no knob training service to convert to; knob converts v1 \
                 configs for local and remote (for another platform, write an NNI v2 \
                 trainingService for a plugin that provides it)\n"
            )
        );
    }
}

/// The platform is read in any case, as v2's `platform` is: `Local` was refused as a platform
/// knob has no conversion for.
#[test]
fn the_platform_is_read_in_any_case_as_v2_reads_it() {
    let project = Project::new(&[("exp/search_space.json", SPACE)]);
    for written in ["Local", "LOCAL"] {
        let text = MNIST_V1.replace(
            "trainingServicePlatform: local",
            &format!("trainingServicePlatform: {written}"),
        );
        let loaded = project.load("exp/config.yml", &text);
        assert_eq!(loaded.training_service[0].platform(), "local", "{written}");
    }
    // Remote too: its machine list is asked for, not the platform refused.
    check_v1(
        &MNIST_V1.replace(
            "trainingServicePlatform: local",
            "trainingServicePlatform: Remote",
        ),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:7:26: machineList: required for trainingServicePlatform: remote: the machines, each with ip, username and passwd or sshKeyPath
        "#]],
    );
}

#[test]
fn dropped_v1_fields_warn_and_unknown_ones_are_errors() {
    let text = MNIST_V1.replace(
        "  builtinTunerName: TPE\n",
        "  builtinTunerName: TPE\n  includeIntermediateResults: true\n",
    )
        + "multiThread: true\nversionCheck: false\nlogCollection: http\ndescription: a test\n";
    check_v1(
        &text,
        &["maxTrialNumber"],
        expect![[r#"
            # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
            # warning: $DIR/exp/config.yml:22:14: multiThread: NNI v1 field with no v2 equivalent; ignored, as NNI 2.x and 3.0 do
            # warning: $DIR/exp/config.yml:23:15: versionCheck: NNI v1 field with no v2 equivalent; ignored, as NNI 2.x and 3.0 do
            # warning: $DIR/exp/config.yml:24:16: logCollection: NNI v1 field with no v2 equivalent; ignored, as NNI 2.x and 3.0 do
            # warning: $DIR/exp/config.yml:14:31: tuner.includeIntermediateResults: NNI v1 field with no v2 equivalent; ignored, as NNI 2.x and 3.0 do
            maxTrialNumber: 10
        "#]],
    );
    check_v1(
        &(MNIST_V1.to_owned() + "maxTrialNumber: 5\nexperimentNam: typo\n"),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:21:17: maxTrialNumber: an NNI v2 field in an NNI v1 config (trainingServicePlatform makes it v1); write the whole config in one format (NNI v2: trainingService: {platform: ...} instead of trainingServicePlatform)
            $DIR/exp/config.yml:22:1: unknown field "experimentNam" (did you mean "experimentName"?)
        "#]],
    );
}

#[test]
fn an_advisor_becomes_the_tuner_and_a_custom_class_its_v2_name() {
    let text = MNIST_V1.replace(
        "tuner:\n  #choice: TPE, Random, Anneal, Evolution, BatchTuner, MetisTuner, GPTuner\n  builtinTunerName: TPE\n  classArgs:\n    #choice: maximize, minimize\n    optimize_mode: maximize\n",
        "advisor:\n  builtinAdvisorName: BOHB\n  classArgs:\n    optimize_mode: maximize\n    min_budget: 1\n    max_budget: 27\n    eta: 3\nassessor:\n  codeDir: .\n  classFileName: my_assessor.py\n  className: MyAssessor\n  classArgs: {patience: 3}\n",
    );
    check_v2(
        &text,
        expect![[r#"
            # warning: $DIR/exp/config.yml: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config check --v2 $DIR/exp/config.yml` prints the v2 config
            experimentName: example_mnist
            trialConcurrency: 1
            maxExperimentDuration: 1h
            maxTrialNumber: 10
            searchSpaceFile: search_space.json
            useAnnotation: false
            trialCommand: python3 mnist.py
            trialCodeDirectory: "."
            trialGpuNumber: 0
            tuner:
              name: BOHB
              classArgs:
                optimize_mode: maximize
                min_budget: 1
                max_budget: 27
                eta: 3
            assessor:
              className: my_assessor.MyAssessor
              codeDirectory: "."
              classArgs:
                patience: 3
            trainingService:
              platform: local
        "#]],
    );
    check_v1(
        &text.replace(
            "classFileName: my_assessor.py",
            "classFileName: my_assessor",
        ),
        &[],
        expect![[r#"
            $DIR/exp/config.yml:20:18: assessor.classFileName: "my_assessor" is not a .py file; name the Python file of the class
        "#]],
    );
}

#[test]
fn check_v2_of_a_v2_config_is_the_document_as_written_with_secrets_hidden() {
    check_v2(
        "\
searchSpaceFile: search_space.json
trialCommand: python3 mnist.py
trialConcurrency: 1
tuner: {name: GP}
trainingService:
  platform: remote
  machineList:
    - {host: 10.0.0.1, user: bob, password: hunter2-secret}
",
        expect![[r#"
            searchSpaceFile: search_space.json
            trialCommand: python3 mnist.py
            trialConcurrency: 1
            tuner:
              name: GP
            trainingService:
              platform: remote
              machineList:
                - host: 10.0.0.1
                  user: bob
                  password: "***"
        "#]],
    );
}

#[test]
fn a_v1_json_config_is_converted_too() {
    let project = Project::new(&[("exp/search_space.json", SPACE)]);
    let path = project.path("exp/config.json");
    let json = r#"{"authorName": "default", "trainingServicePlatform": "local",
        "trialConcurrency": 1, "searchSpacePath": "search_space.json",
        "tuner": {"builtinTunerName": "BatchTuner"},
        "trial": {"command": "python3 mnist.py", "codeDir": "."}}"#;
    std::fs::write(&path, json).unwrap();
    let loaded = config::load_file(&path, &BuiltInServices).unwrap();
    assert_eq!(loaded.config.tuner.name.as_deref(), Some("BatchTuner"));
    assert_eq!(loaded.config.trial_command, "python3 mnist.py");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
}
