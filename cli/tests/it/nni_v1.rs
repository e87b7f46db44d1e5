//! NNI v1 configs through the real `knob` (issue 20 item 16): one runs end to end on the local
//! service, and `knob config check --v2` gives what NNI's own converter gives (the real
//! `nni.experiment.config.convert.to_v2` of nni 3.0, when `KNOB_TEST_NNI3_PYTHON` names a
//! python that has it; without it that test skips visibly, and fails under
//! `KNOB_TEST_REQUIRE_ALL=1`).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::create::Sandbox;
use crate::prerequisite;
use crate::run;

const TRIAL: &str = r#"import json, os
params = json.loads(os.environ["KNOB_PARAMETERS"])
print("KNOB_FINAL", (params["lr"] - 0.01) ** 2 + params["batch"])
"#;

const SPACE: &str = r#"{"lr": {"_type": "choice", "_value": [0.1, 0.01, 0.001]},
 "batch": {"_type": "randint", "_value": [1, 4]}}"#;

/// v1 as NNI 1.x's examples wrote it; the experiment folder is set by the test.
const LOCAL_V1: &str = "\
authorName: default
experimentName: v1_local
trialConcurrency: 2
maxExecDuration: 10m
maxTrialNum: 4
trainingServicePlatform: local
searchSpacePath: search_space.json
useAnnotation: false
tuner:
  builtinTunerName: TPE
  classArgs:
    optimize_mode: minimize
trial:
  command: python3 trial.py
  codeDir: .
  gpuNum: 0
localConfig:
  maxTrialNumPerGpu: 1
  useActiveGpu: false
";

#[test]
fn a_converted_v1_config_runs_end_to_end_on_local() {
    let sandbox = Sandbox::new();
    // The config in its own folder, knob run from elsewhere: searchSpacePath and codeDir are
    // relative to the config file.
    let code = sandbox.path().join("mnist");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("search_space.json"), SPACE).unwrap();
    std::fs::write(code.join("trial.py"), TRIAL).unwrap();
    let config = code.join("config.yml");
    let text = format!(
        "{LOCAL_V1}logDir: {}\n",
        sandbox.path().join("experiments").display()
    );
    std::fs::write(&config, text).unwrap();

    let (code_, stdout, stderr) = run(sandbox
        .knob()
        .current_dir(sandbox.path())
        .arg("create")
        .arg("--config")
        .arg(&config)
        .args(["--id", "v1"]));
    assert_eq!(code_, 0, "{stdout}\n{stderr}");
    let note = format!(
        "warning: {}: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; `knob config \
         check --v2 {}` prints the v2 config",
        config.display(),
        config.display()
    );
    assert_eq!(
        stderr.lines().filter(|line| *line == note).count(),
        1,
        "{stderr}"
    );
    assert!(
        stdout.starts_with("experiment v1 DONE: 4 trials (4 succeeded, 0 failed)"),
        "{stdout}"
    );
    let export = sandbox.export("v1");
    let trials = export["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{export:#}");
    for trial in trials {
        let lr = trial["parameters"]["lr"].as_f64().unwrap();
        let batch = trial["parameters"]["batch"].as_f64().unwrap();
        assert_eq!(trial["status"], "SUCCEEDED", "{trial:#}");
        let expected = (lr - 0.01).powi(2) + batch;
        let final_value = trial["final"].as_f64().unwrap();
        assert!((final_value - expected).abs() < 1e-9, "{trial:#}");
    }
    // The experiment went where logDir said, and is the v2 experiment NNI would have made.
    assert!(sandbox.path().join("experiments/v1").is_dir());
    let (status, shown, stderr) = run(sandbox.knob().args(["experiment", "show", "v1"]));
    assert_eq!(status, 0, "{stderr}");
    assert!(shown.contains(r#""maxExperimentDuration":600"#), "{shown}");
    assert!(shown.contains(r#""maxTrialNumber":4"#), "{shown}");
}

/// Machines of a remote v1 config; keys and passwords as NNI 1.x documented them.
const REMOTE_V1: &str = "\
authorName: default
experimentName: v1_remote
trialConcurrency: 2
maxExecDuration: 2h
maxTrialNum: 8
trainingServicePlatform: remote
searchSpacePath: search_space.json
useAnnotation: false
nniManagerIp: 10.10.10.10
tuner:
  builtinTunerName: GP
  classArgs:
    optimize_mode: maximize
  gpuIndices: 0
assessor:
  builtinAssessorName: Medianstop
  classArgs:
    optimize_mode: maximize
trial:
  command: python3 mnist.py
  codeDir: .
  gpuNum: 1
remoteConfig:
  reuse: false
machineList:
  - ip: 10.1.1.1
    port: 22
    username: bob
    passwd: bob123
    gpuIndices: 0,1
    maxTrialNumPerGpu: 2
    useActiveGpu: false
  - ip: 10.1.1.2
    username: alice
    sshKeyPath: id_rsa
    pythonPath: /opt/conda/bin
";

const ADVISOR_V1: &str = "\
authorName: default
experimentName: example_mnist_hyperband
trialConcurrency: 2
maxExecDuration: 100h
maxTrialNum: 10000
trainingServicePlatform: local
searchSpacePath: search_space.json
useAnnotation: false
advisor:
  builtinAdvisorName: Hyperband
  classArgs:
    optimize_mode: maximize
    R: 60
    eta: 3
trial:
  command: python3 mnist.py
  codeDir: .
  gpuNum: 0
";

/// What NNI's converter makes of `config`, made comparable with knob's `--v2` output: the only
/// departures are knob's documented ones (`advisor` is `tuner`, a password is `***`).
const COMPARE: &str = r#"
import json, sys, yaml
from nni.experiment.config import convert
v1 = yaml.safe_load(open(sys.argv[1]))
nni = convert.to_v2(v1)
nni = {('tuner' if key == 'advisor' else key): value for key, value in nni.items()}
for machine in nni.get('trainingService', {}).get('machineList', []):
    if 'password' in machine:
        machine['password'] = '***'
knob = yaml.safe_load(open(sys.argv[2]))
print('COMPARED', json.dumps({'nni': nni, 'knob': knob}))
"#;

/// A v1 config asking for a GPU on a machine without one is refused naming its v1 field at its
/// line (`trialGpuNumber`, a field a v1 config does not have, was named, with no line).
#[test]
fn a_v1_gpu_request_that_cannot_be_placed_names_trial_gpu_num() {
    let sandbox = Sandbox::new();
    let code = sandbox.path().join("mnist");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("search_space.json"), SPACE).unwrap();
    std::fs::write(code.join("trial.py"), TRIAL).unwrap();
    let config = code.join("config.yml");
    std::fs::write(&config, LOCAL_V1.replace("gpuNum: 0", "gpuNum: 1")).unwrap();
    let (code, stdout, stderr) = run(sandbox.knob().arg("create").arg("--config").arg(&config));
    assert_ne!(code, 0, "{stdout}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(
        error.starts_with(&format!(
            "error: {}:16:11: trial.gpuNum: cannot place trials: ",
            config.display()
        )) && error.contains("set trial.gpuNum to 0")
            && !error.contains("trialGpuNumber"),
        "{stderr}"
    );
}

/// A v1 custom tuner (or advisor) run by a Python without nni is told to set
/// `pythonInterpreter`, and a v1 config can: the algorithm block takes knob's extensions for
/// NNI's dispatcher. It refused them as unknown fields, so the advice could not be followed
/// without converting the config to v2.
#[test]
fn a_v1_custom_algorithm_takes_the_python_interpreter_its_error_names() {
    let sandbox = Sandbox::new();
    let code = sandbox.path().join("v1");
    std::fs::create_dir_all(code.join("mytuner")).unwrap();
    std::fs::write(code.join("search_space.json"), SPACE).unwrap();
    std::fs::write(
        code.join("mytuner/my_tuner.py"),
        "from nni.tuner import Tuner\nclass MyTuner(Tuner):\n    pass\n",
    )
    .unwrap();
    // A Python without nni whatever the machine's python3 has: it fails the import as one does.
    let python = code.join("python-without-nni");
    std::fs::write(
        &python,
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'nni'\" >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&python, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let config = code.join("config.yml");
    for block in ["tuner", "advisor"] {
        let text = format!(
            "trainingServicePlatform: local\ntrialConcurrency: 1\nsearchSpacePath: search_space.json\n\
             trial: {{command: python3 trial.py, codeDir: .}}\n\
             {block}:\n  codeDir: mytuner\n  classFileName: my_tuner.py\n  className: MyTuner\n  \
             pythonInterpreter: ./python-without-nni\n"
        );
        std::fs::write(&config, &text).unwrap();
        let (status, stdout, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
        assert_ne!(status, 0, "{stdout}");
        assert!(
            stderr.starts_with(&format!(
                "error: {}:8:14: {block}.className: NNI tuner my_tuner.MyTuner runs through NNI's Python dispatcher, but {} cannot import nni",
                config.display(),
                code.join("./python-without-nni").display()
            )),
            "{stderr}"
        );

        // Its value is checked as a v2 one is, and named as written.
        std::fs::write(
            &config,
            text.replace(
                "./python-without-nni",
                "\"\"\n  dispatcherConnectTimeout: -3",
            ),
        )
        .unwrap();
        let (_, _, stderr) = run(sandbox.knob().args(["config", "check"]).arg(&config));
        let config = config.display();
        assert_eq!(
            stderr,
            format!(
                "error: {config}:9:22: {block}.pythonInterpreter: expected a non-empty string, got \"\"\n\
                 error: {config}:10:29: {block}.dispatcherConnectTimeout: must be positive, got -3\n"
            )
        );
    }
}

#[test]
fn knob_config_check_v2_gives_what_nni_s_own_converter_gives() {
    let Some(python) = nni3_python() else {
        return;
    };
    let sandbox = Sandbox::new();
    let code = sandbox.path().join("code");
    std::fs::create_dir_all(&code).unwrap();
    std::fs::write(code.join("search_space.json"), SPACE).unwrap();
    std::fs::write(code.join("id_rsa"), "-----BEGIN OPENSSH PRIVATE KEY-----\nnot really a key\n-----END OPENSSH PRIVATE KEY-----\n").unwrap();
    let script = sandbox.path().join("compare.py");
    std::fs::write(&script, COMPARE).unwrap();
    let local_with_gpus = LOCAL_V1.replace(
        "  maxTrialNumPerGpu: 1\n",
        "  maxTrialNumPerGpu: 1\n  gpuIndices: 0,2\n",
    );
    for (name, v1) in [
        ("local", local_with_gpus.as_str()),
        ("remote", REMOTE_V1),
        ("advisor", ADVISOR_V1),
    ] {
        let config = code.join(format!("{name}.yml"));
        std::fs::write(&config, v1).unwrap();
        let (status, stdout, stderr) = run(sandbox
            .knob()
            .args(["config", "check", "--v2"])
            .arg(&config));
        assert_eq!(status, 0, "{name}: {stderr}");
        assert!(!stdout.contains("bob123"), "{name}: {stdout}");
        let converted = code.join(format!("{name}.v2.yml"));
        std::fs::write(&converted, &stdout).unwrap();

        let output = compare(&python, &script, &config, &converted);
        assert_eq!(output["knob"], output["nni"], "{name}:\n{stdout}");
        // Same order of fields as NNI's, so the printed config reads like NNI's.
        let keys = |side: &str| -> Vec<String> {
            output[side].as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(keys("knob"), keys("nni"), "{name}");
    }
}

fn compare(python: &Path, script: &Path, v1: &Path, v2: &Path) -> Value {
    let output = Command::new(python)
        .arg(script)
        .arg(v1)
        .arg(v2)
        .env_remove("NNI_PLATFORM")
        .output()
        .expect("cannot run the nni 3.0 python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // nni logs its own warnings on stdout too.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix("COMPARED "))
        .unwrap_or_else(|| panic!("{stdout}"));
    serde_json::from_str(line).unwrap()
}

fn nni3_python() -> Option<PathBuf> {
    prerequisite::NNI3_PYTHON.path()
}
