//! Creating and deleting an experiment's folder: knob adopts no folder that holds files it did
//! not make, and deletes only what it made.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

use knob_core::config::{self, ExperimentConfig};
use knob_core::experiment::{self, CreateError, MARKER_FILE_NAME};
use knob_core::registry::Registry;

fn config_in(working_directory: &Path) -> ExperimentConfig {
    let yaml = format!(
        "trialCommand: 'true'\ntrialConcurrency: 1\nsearchSpace:\n  x: {{_type: choice, _value: [1]}}\n\
         tuner:\n  name: Random\ntrainingService:\n  platform: local\nexperimentWorkingDirectory: {}\n",
        working_directory.display()
    );
    config::load_str(&yaml, Path::new("config.yml"), &crate::BuiltInServices)
        .unwrap()
        .config
}

fn registry(home: &Path) -> Registry {
    Registry::open(&home.join("registry.db")).unwrap()
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_folder_with_files_knob_did_not_make_is_refused_and_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("work/mine");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("thesis.tex"), "years of work").unwrap();
    let registry = registry(root.path());
    let error = experiment::create(
        config_in(&root.path().join("work")),
        Some("mine"),
        &registry,
    )
    .err()
    .expect("a non-empty folder must be refused");
    assert!(
        matches!(error, CreateError::FolderNotEmpty { .. }),
        "{error}"
    );
    let line = error.to_string();
    assert!(line.contains(&dir.display().to_string()), "{line}");
    assert!(line.contains("move them away"), "{line}");
    assert_eq!(names(&dir), ["thesis.tex"]);
    assert!(registry.get("mine").is_err(), "nothing is registered");

    // An empty folder is taken, and marked.
    let empty = root.path().join("work/empty");
    std::fs::create_dir_all(&empty).unwrap();
    experiment::create(
        config_in(&root.path().join("work")),
        Some("empty"),
        &registry,
    )
    .unwrap();
    assert!(empty.join(MARKER_FILE_NAME).is_file());
}

#[test]
fn a_copied_experiment_folder_is_not_advised_to_be_resumed() {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let other_home = registry(&root.path().join("other"));
    drop(experiment::create(config_in(&work), Some("copied"), &other_home).unwrap());
    let registry = registry(root.path());
    let error = experiment::create(config_in(&work), Some("copied"), &registry)
        .err()
        .expect("a folder holding a store must be refused");
    let line = error.to_string();
    assert!(matches!(error, CreateError::Unregistered { .. }), "{line}");
    assert!(!line.contains("knob resume copied"), "{line}");
    assert!(line.contains("KNOB_HOME"), "{line}");
}

#[test]
fn of_two_creates_of_one_id_the_loser_makes_no_folder_and_names_the_winners() {
    let root = tempfile::tempdir().unwrap();
    // Each round races 6 threads (each with its own registry connection, as separate knob
    // processes have) for one id, each with its own working directory.
    for round in 0..5 {
        let id = format!("race{round}");
        let barrier = Arc::new(Barrier::new(6));
        let threads: Vec<_> = (0..6)
            .map(|n| {
                let barrier = barrier.clone();
                let home = root.path().to_path_buf();
                let work = root.path().join(format!("work{n}"));
                let id = id.clone();
                std::thread::spawn(move || {
                    // Opened concurrently too, as two knobs' first commands on a fresh home do;
                    // a failure is raised only past the barrier, so it cannot leave the others
                    // waiting there forever.
                    let registry = Registry::open(&home.join("registry.db"));
                    let config = config_in(&work);
                    barrier.wait();
                    let registry = registry.unwrap();
                    let result = experiment::create(config, Some(&id), &registry).map(|_| ());
                    (work.join(&id), result)
                })
            })
            .collect();
        let results: Vec<(PathBuf, Result<(), CreateError>)> =
            threads.into_iter().map(|t| t.join().unwrap()).collect();
        let winners: Vec<&PathBuf> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(dir, _)| dir)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}");
        for (dir, result) in &results {
            if let Err(error) = result {
                assert!(
                    !dir.exists(),
                    "round {round}: the loser made {}",
                    dir.display()
                );
                assert!(
                    error
                        .to_string()
                        .contains(&winners[0].display().to_string()),
                    "round {round}: {error}"
                );
            }
        }
    }
}

fn trial_created(trial_id: &str) -> knob_core::store::StoreEvent {
    knob_core::store::StoreEvent::TrialCreated {
        trial_id: trial_id.to_string(),
        sequence: 0,
        parameter_id: 0,
        parameter_label: None,
        parameters: serde_json::json!({"x": 1}),
        lineage: None,
    }
}

#[test]
fn delete_removes_what_knob_made_and_lists_the_rest() {
    let root = tempfile::tempdir().unwrap();
    let work = root.path().join("work");
    let registry = registry(root.path());
    let (experiment, store) = experiment::create(config_in(&work), Some("d"), &registry).unwrap();
    drop(store);
    let dir = experiment.dir;
    std::fs::create_dir_all(dir.join("trials/T1")).unwrap();
    std::fs::write(dir.join("trials/T1/stdout"), "out").unwrap();
    std::fs::write(dir.join(experiment::CONFIG_SOURCE_FILE), "/x/config.yml").unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    std::fs::create_dir_all(dir.join("results")).unwrap();
    std::fs::write(dir.join("results/best.csv"), "mine too").unwrap();
    // A link in knob's place is removed as a link: what it points to is not knob's.
    std::fs::remove_dir_all(dir.join("trials")).unwrap();
    std::fs::create_dir_all(root.path().join("elsewhere")).unwrap();
    std::fs::write(root.path().join("elsewhere/keep"), "kept").unwrap();
    std::os::unix::fs::symlink(root.path().join("elsewhere"), dir.join("trials")).unwrap();

    let left = experiment::remove_experiment_folder(&dir).unwrap();
    assert_eq!(left, [dir.join("notes.txt"), dir.join("results")]);
    assert_eq!(names(&dir), ["notes.txt", "results"]);
    assert_eq!(
        std::fs::read_to_string(dir.join("results/best.csv")).unwrap(),
        "mine too"
    );
    assert_eq!(names(&root.path().join("elsewhere")), ["keep"]);

    // In `trials/`, only the folders of the store's trials are knob's: anything else there is
    // left, and named with its place.
    let (experiment, store) = experiment::create(config_in(&work), Some("f"), &registry).unwrap();
    store.append(trial_created("T1")).wait().unwrap();
    drop(store);
    let trials = experiment.dir.join("trials");
    std::fs::create_dir_all(trials.join("T1")).unwrap();
    std::fs::write(trials.join("T1/stdout"), "out").unwrap();
    std::fs::write(trials.join("notes.txt"), "mine").unwrap();
    std::fs::create_dir_all(trials.join("T2")).unwrap();
    let left = experiment::remove_experiment_folder(&experiment.dir).unwrap();
    assert_eq!(left, [trials.join("T2"), trials.join("notes.txt")]);
    assert_eq!(names(&experiment.dir), ["trials"]);
    assert_eq!(names(&trials), ["T2", "notes.txt"]);

    // With nothing foreign, the folder itself goes.
    let (experiment, store) = experiment::create(config_in(&work), Some("e"), &registry).unwrap();
    store.append(trial_created("T1")).wait().unwrap();
    drop(store);
    std::fs::create_dir_all(experiment.dir.join("trials/T1")).unwrap();
    let python = experiment
        .dir
        .join(".knob-python/knob-nni-0123456789abcdef");
    std::fs::create_dir_all(&python).unwrap();
    std::fs::write(python.join("nni.py"), "").unwrap();
    assert!(experiment::remove_experiment_folder(&experiment.dir)
        .unwrap()
        .is_empty());
    assert!(!experiment.dir.exists());
    assert!(experiment::remove_experiment_folder(&experiment.dir)
        .unwrap()
        .is_empty());
}

/// The folder is held by its store's writer lock for as long as it is being removed: no removal
/// while a run holds the store (a `knob resume` holds it before the registry says it runs), no
/// run while the folder is held, and a run after it finds the store gone instead of making a
/// new one in a folder made again.
#[test]
fn removal_and_runs_exclude_each_other_by_the_writer_lock() {
    use knob_core::experiment::{FolderHold, RemoveError};
    use knob_core::store::{Store, StoreError};

    let root = tempfile::tempdir().unwrap();
    let registry = registry(root.path());
    let (experiment, store) =
        experiment::create(config_in(&root.path().join("work")), Some("r"), &registry).unwrap();
    let dir = experiment.dir;
    let error = experiment::remove_experiment_folder(&dir).unwrap_err();
    assert!(matches!(error, RemoveError::Running { .. }), "{error}");
    assert!(
        error.to_string().starts_with(&format!(
            "{}: a knob process holds the experiment's store",
            dir.display()
        )),
        "{error}"
    );
    assert!(dir.join("experiment.db").is_file());
    drop(store);

    let hold = FolderHold::take(&dir).unwrap();
    for opened in [Store::open_existing(&dir), Store::open(&dir)] {
        let error = opened.unwrap_err();
        assert!(matches!(error, StoreError::Locked { .. }), "{error}");
    }
    assert!(hold.remove().unwrap().is_empty());
    assert!(!dir.exists());
    let error = Store::open_existing(&dir).unwrap_err();
    assert!(
        error
            .to_string()
            .ends_with("experiment.db: cannot open the experiment store: no such file: the experiment was deleted, or its folder moved, meanwhile"),
        "{error}"
    );
    assert!(!dir.exists(), "the folder was made again");

    // Half removed (the store gone, the rest still there): still no new store.
    std::fs::create_dir_all(dir.join("trials")).unwrap();
    assert!(Store::open_existing(&dir).is_err());
    assert!(!dir.join("experiment.db").exists());
    // A missing folder is held by nothing and removed as nothing.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(FolderHold::take(&dir).unwrap().remove().unwrap().is_empty());
}
