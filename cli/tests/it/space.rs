use crate::{knob, run};

fn space_file(dir: &tempfile::TempDir, json: &str) -> std::path::PathBuf {
    let path = dir.path().join("space.json");
    std::fs::write(&path, json).unwrap();
    path
}

#[test]
fn space_validate_lists_parameters_or_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let good = space_file(
        &dir,
        r#"{"lr": {"_type": "loguniform", "_value": [1e-4, 0.1]},
            "opt": {"_type": "choice", "_value": [{"_name": "sgd", "momentum": {"_type": "uniform", "_value": [0, 1]}}, {"_name": "adam"}]}}"#,
    );
    let (code, stdout, stderr) = run(knob().arg("space").arg("validate").arg(&good));
    assert_eq!(code, 0, "{stderr}");
    let stdout = stdout.replace(&good.display().to_string(), "space.json");
    expect_test::expect![[r#"
        space.json: valid search space with 3 parameters
          lr                       loguniform
          opt                      choice
          opt/sgd/momentum         uniform
    "#]]
    .assert_eq(&stdout);

    let bad = space_file(
        &dir,
        r#"{"lr": {"_type": "loguniform", "_value": [0, 0.1]}}"#,
    );
    let (code, _, stderr) = run(knob().arg("space").arg("validate").arg(&bad));
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // The parameter's line and column, as in a config's searchSpaceFile error.
    assert!(
        stderr.starts_with(&format!("error: {}:1:2: ", bad.display())),
        "{stderr}"
    );
}

/// A JSON space with a parameter named twice is refused at the second, as in a YAML space: the
/// second was kept in silence (H3 F2).
#[test]
fn space_validate_refuses_a_json_duplicate_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = space_file(
        &dir,
        "{\"x\": {\"_type\": \"uniform\", \"_value\": [0, 1]},\n \"x\": {\"_type\": \"choice\", \"_value\": [5]}}\n",
    );
    let (code, stdout, stderr) = run(knob().arg("space").arg("validate").arg(&file));
    assert_eq!((code, stdout.as_str()), (1, ""), "{stderr}");
    assert_eq!(
        stderr.replace(&file.display().to_string(), "space.json"),
        "error: space.json:2:2: malformed JSON: duplicate key \"x\" (first set on line 1)\n"
    );
}

#[test]
fn space_sample_prints_reproducible_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let file = space_file(
        &dir,
        r#"{"x": {"_type": "randint", "_value": [0, 1000]}, "y": {"_type": "choice", "_value": ["a", "b"]}}"#,
    );
    let sample = |seed: &str| {
        run(knob()
            .arg("space")
            .arg("sample")
            .arg(&file)
            .args(["-n", "5", "--seed", seed]))
    };
    let (code, first, stderr) = sample("7");
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<serde_json::Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    for line in &lines {
        let x = line["x"].as_i64().unwrap();
        assert!((0..1000).contains(&x), "{line}");
        assert!(["a", "b"].contains(&line["y"].as_str().unwrap()), "{line}");
    }
    assert_eq!(sample("7").1, first);
    assert_ne!(sample("8").1, first);
}

/// `knob space validate` reads what `searchSpaceFile` reads: a YAML space (it refused them), and
/// a problem in one names the file, line and column.
#[test]
fn space_validate_takes_the_yaml_spaces_a_config_takes() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("space.yml");
    std::fs::write(
        &yaml,
        "lr:\n  _type: loguniform\n  _value: [0.0001, 0.1]\nbatch:\n  _type: choice\n  _value: [16, 32]\n",
    )
    .unwrap();
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        "searchSpaceFile: space.yml\ntrialCommand: 'true'\ntrialConcurrency: 1\n\
         tuner:\n  name: Random\ntrainingService:\n  platform: local\n",
    )
    .unwrap();
    let (code, _, stderr) = run(knob().args(["config", "check"]).arg(&config));
    assert_eq!(code, 0, "the config takes the YAML space: {stderr}");

    let (code, stdout, stderr) = run(knob().arg("space").arg("validate").arg(&yaml));
    assert_eq!(code, 0, "{stderr}");
    let stdout = stdout.replace(&yaml.display().to_string(), "space.yml");
    expect_test::expect![[r#"
        space.yml: valid search space with 2 parameters
          lr                       loguniform
          batch                    choice
    "#]]
    .assert_eq(&stdout);
    let (code, stdout, stderr) = run(knob()
        .arg("space")
        .arg("sample")
        .arg(&yaml)
        .args(["-n", "2", "--seed", "1"]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "lr:\n  _type: loguniform\n  _value: [0.0001, 0.1]\nmomentum:\n  _type: uniform\n  _value: [1, 0]\n",
    )
    .unwrap();
    let (code, _, stderr) = run(knob().arg("space").arg("validate").arg(&bad));
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {}:4:1: ", bad.display())),
        "{stderr}"
    );
    assert!(stderr.contains("momentum"), "{stderr}");

    let malformed = dir.path().join("malformed.yml");
    std::fs::write(&malformed, "lr: [unclosed\n").unwrap();
    let (code, _, stderr) = run(knob().arg("space").arg("validate").arg(&malformed));
    assert_eq!(code, 1);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!("error: {}:", malformed.display()))
            && stderr.contains("malformed YAML"),
        "{stderr}"
    );
}
