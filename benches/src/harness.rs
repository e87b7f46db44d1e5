//! What the benches and quality harnesses (`harness/*.rs`) share: the tuner plugin's path,
//! quartiles as numpy computes them, and the driver of an Optuna script that asks for points and
//! is told their results over pipes.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// `libknob_tuners.so` beside the bench executable (`target/<profile>/deps/`) or one folder up
/// (`target/<profile>/`); panics with the command that builds it when neither has it.
pub fn plugin_path() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the bench executable");
    let deps = exe.parent().expect("bench executable has a folder");
    let file = format!(
        "{}knob_tuners{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    [deps.to_path_buf(), deps.join("..")]
        .iter()
        .map(|dir| dir.join(&file))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{file} not found in {} or its parent; run `cargo build --release -p knob-tuners` first",
                deps.display()
            )
        })
}

/// `(median, q25, q75)` of `values` (at least one) with linear interpolation, numpy's default.
pub fn quartiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let pos = q * (v.len() - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
    };
    (at(0.5), at(0.25), at(0.75))
}

/// One Python process running an Optuna script of `harness/` (`tuner_quality.py`,
/// `multi_objective.py`): it reads a study's spec as one JSON line, then for each trial writes
/// the point as one JSON line and reads the result back as one line. The objectives are
/// computed here, by the same Rust code for Optuna and knob.
pub struct OptunaDriver {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl OptunaDriver {
    /// Starts `python harness/<script>`; panics when it cannot run.
    pub fn spawn(python: &Path, script: &str) -> OptunaDriver {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("harness")
            .join(script);
        let mut child = Command::new(python)
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        OptunaDriver {
            child,
            stdin: Some(stdin),
            stdout,
        }
    }

    /// Runs one study of `trials` sequential trials: sends `spec`, then for each point Optuna
    /// asks for, sends back the line `evaluate` makes of it (its trial index and parameters).
    pub fn study(
        &mut self,
        spec: &Value,
        trials: usize,
        mut evaluate: impl FnMut(usize, &Value) -> String,
    ) {
        let stdin = self.stdin.as_mut().expect("the driver's stdin is open");
        writeln!(stdin, "{spec}").expect("write to the Optuna driver");
        for trial in 0..trials {
            let mut line = String::new();
            self.stdout
                .read_line(&mut line)
                .expect("read from the Optuna driver");
            let params: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("the Optuna driver wrote {line:?}: {e}"));
            let result = evaluate(trial, &params);
            writeln!(stdin, "{result}").expect("write to the Optuna driver");
        }
    }
}

impl Drop for OptunaDriver {
    /// Closes the script's stdin, which ends it, and waits for it.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::quartiles;

    #[test]
    fn quartiles_interpolate_as_numpy() {
        // numpy.percentile([4, 1, 3, 2], [50, 25, 75]) = [2.5, 1.75, 3.25]
        assert_eq!(quartiles(&[4.0, 1.0, 3.0, 2.0]), (2.5, 1.75, 3.25));
        assert_eq!(quartiles(&[7.0]), (7.0, 7.0, 7.0));
    }
}
