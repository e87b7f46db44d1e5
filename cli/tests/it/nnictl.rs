//! nnictl's habits that cost nothing: `knob experiment list --all`, `knob trial ls --head N` /
//! `--tail N`, shell completions and the man page.

use crate::create::Sandbox;
use crate::{knob, run};

/// Five trials whose finals are known: GridSearch over x in 0..5, each trial reporting
/// (x - 2)², and x = 4 reporting NaN (no result, so never ranked).
fn graded_experiment(sandbox: &Sandbox, mode: &str) {
    let script = r#"x=$(python3 -c 'import json, os; print(json.loads(os.environ["KNOB_PARAMETERS"])["x"])')
if [ "$x" = 4 ]; then echo "KNOB_FINAL NaN"; else echo "KNOB_FINAL $(( (x - 2) * (x - 2) ))"; fi
"#;
    let yaml = format!(
        "trialCommand: bash trial.sh\ntrialConcurrency: 2\nsearchSpace:\n  x: {{_type: choice, _value: [0, 1, 2, 3, 4]}}\ntuner:\n  name: GridSearch\n  classArgs: {{optimize_mode: {mode}}}\ntrainingService:\n  platform: local"
    );
    let config = sandbox.config(&yaml, &[("trial.sh", script)]);
    let (code, stdout, stderr) = sandbox.create(&config, "graded");
    assert_eq!(code, 0, "{stdout}\n{stderr}");
}

/// The `x` of each trial `knob trial ls graded ARGS` lists, in its order.
fn listed_xs(sandbox: &Sandbox, args: &[&str]) -> Vec<i64> {
    let (code, stdout, stderr) = run(sandbox.knob().args(["trial", "ls", "graded"]).args(args));
    assert_eq!(code, 0, "{stderr}");
    stdout
        .lines()
        .skip(1)
        .map(|line| {
            let start = line.find("{\"x\":").unwrap_or_else(|| panic!("{stdout}")) + 5;
            let end = start + line[start..].find('}').unwrap();
            line[start..end].parse().unwrap()
        })
        .collect()
}

#[test]
fn trial_ls_head_and_tail_rank_by_the_optimize_mode() {
    let sandbox = Sandbox::new();
    graded_experiment(&sandbox, "minimize");
    // finals: x=0: 4, x=1: 1, x=2: 0, x=3: 1, x=4: NaN (never ranked).
    assert_eq!(listed_xs(&sandbox, &["--head", "2"]), [2, 1]);
    assert_eq!(listed_xs(&sandbox, &["--head", "9"]), [2, 1, 3, 0]);
    assert_eq!(listed_xs(&sandbox, &["--tail", "1"]), [0]);
    assert_eq!(listed_xs(&sandbox, &["--head", "0"]), Vec::<i64>::new());
    assert_eq!(listed_xs(&sandbox, &[]).len(), 5);

    let (code, _, stderr) = run(sandbox
        .knob()
        .args(["trial", "ls", "graded", "--head", "1", "--tail", "1"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

#[test]
fn trial_ls_head_is_the_highest_when_maximizing() {
    let sandbox = Sandbox::new();
    graded_experiment(&sandbox, "maximize");
    assert_eq!(listed_xs(&sandbox, &["--head", "1"]), [0]);
    assert_eq!(listed_xs(&sandbox, &["--tail", "1"]), [2]);
}

#[test]
fn experiment_list_all_is_experiment_list() {
    let sandbox = Sandbox::new();
    graded_experiment(&sandbox, "minimize");
    let plain = run(sandbox.knob().args(["experiment", "list"]));
    let all = run(sandbox.knob().args(["experiment", "list", "--all"]));
    assert_eq!(plain.0, 0, "{}", plain.2);
    assert_eq!(all, plain);
    assert!(all.1.contains("graded"), "{}", all.1);
}

#[test]
fn completions_are_scripts_each_shell_accepts() {
    for (shell, first_line_has) in [
        ("bash", "_knob()"),
        ("zsh", "#compdef knob"),
        ("fish", "complete -c knob"),
    ] {
        let (code, script, stderr) = run(knob().args(["completions", shell]));
        assert_eq!(code, 0, "{shell}: {stderr}");
        assert!(script.contains(first_line_has), "{shell}:\n{script}");
        for subcommand in ["create", "resume", "experiment", "completions", "man"] {
            assert!(script.contains(subcommand), "{shell} lacks {subcommand}");
        }
    }
    // bash parses its script (zsh and fish are checked where installed).
    let (code, script, _) = run(knob().args(["completions", "bash"]));
    assert_eq!(code, 0);
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let (code, _, stderr) = run(std::process::Command::new("bash")
        .arg("-n")
        .arg(file.path()));
    assert_eq!(code, 0, "{stderr}");

    let (code, _, stderr) = run(knob().args(["completions", "tcsh"]));
    assert_eq!(code, 2);
    assert!(stderr.contains("possible values: bash"), "{stderr}");
}

/// The page `man knob` shows documents every subcommand, its synopsis and options, on the page
/// itself: clap_mangen's own page pointed at knob-create(1) and the like, which nothing installs,
/// and documented no subcommand's option (H3 F3).
#[test]
fn the_man_page_is_roff_documenting_every_command_and_its_options() {
    let (code, page, stderr) = run(knob().arg("man"));
    assert_eq!(code, 0, "{stderr}");
    assert!(page.contains(".TH knob 1"), "{page}");
    for subcommand in [
        "create",
        "resume",
        "stop",
        "experiment",
        "experiment export",
        "experiment pareto",
        "trial",
        "trial ls",
        "update",
        "update searchspace",
        "view",
        "top",
        "config",
        "gpu",
        "plugin",
        "plugin try",
        "space",
        "space sample",
        "completions",
        "man",
    ] {
        assert!(
            page.contains(&format!(".SS \"knob {subcommand}\"\n")),
            "the man page lacks {subcommand}:\n{page}"
        );
    }
    // Options of subcommands (create, experiment export, trial ls, plugin try), roff-escaped.
    for option in [
        "\\-\\-detach",
        "\\-\\-format",
        "\\-\\-head",
        "\\-\\-results\\-expr",
    ] {
        assert!(
            page.contains(option),
            "the man page lacks {option}:\n{page}"
        );
    }
    // No reference to another page: only this one is made.
    assert!(!page.contains("(1)"), "{page}");
    assert_eq!(page.matches(".ds Aq").count(), 2, "{page}");
}

/// The README's Commands table has a row for every command `knob` has (the man page lists
/// them); `knob experiment pareto` was missing (H3 F9).
#[test]
fn the_readme_commands_table_lists_every_command() {
    let (code, page, stderr) = run(knob().arg("man"));
    assert_eq!(code, 0, "{stderr}");
    let commands: Vec<Vec<&str>> = page
        .lines()
        .filter_map(|line| line.strip_prefix(".SS \"knob ")?.strip_suffix('"'))
        .map(|name| name.split(' ').collect())
        .collect();
    assert!(commands.len() > 20, "{page}");
    let readme = std::fs::read_to_string(crate::repo_root().join("README.md")).unwrap();
    // The code spans of the first column of the table under "## Commands", as words:
    // `knob update concurrency\|trialnum ID VALUE` is [knob, update, concurrency\|trialnum, …].
    let spans: Vec<Vec<&str>> = readme
        .split_once("\n## Commands\n")
        .expect("README.md has no ## Commands section")
        .1
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .filter_map(|row| row.split(" | ").next())
        .flat_map(|cell| cell.split('`').skip(1).step_by(2))
        .map(|span| span.split_whitespace().collect())
        .collect();
    for command in &commands {
        // A group ("knob experiment") is covered by its subcommands' rows.
        if commands
            .iter()
            .any(|other| other.len() > command.len() && other.starts_with(command))
        {
            continue;
        }
        let listed = spans.iter().any(|span| {
            span.first() == Some(&"knob")
                && span.len() > command.len()
                && command
                    .iter()
                    .zip(&span[1..])
                    .all(|(word, written)| written.split("\\|").any(|w| w == *word))
        });
        assert!(
            listed,
            "README.md's Commands table has no row for `knob {}`",
            command.join(" ")
        );
    }
}
