//! Config errors: one line each, naming the file, the position, the field and what is allowed.

use std::fmt;

/// One problem found in a config file.
///
/// Displays as `FILE[:LINE[:COLUMN]]: [FIELD: ]MESSAGE`, e.g.
/// `exp.yml:7:19: trialConcurrency: expected a positive integer, got "two"`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The config file as the user named it.
    pub file: String,
    /// 1-based; `None` when the problem has no place in the file (a required field is missing).
    pub line: Option<usize>,
    /// 1-based, in characters.
    pub column: Option<usize>,
    /// Dotted path of the field in canonical camelCase, e.g. `trainingService[1].machineList[0].port`;
    /// empty for the document itself.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        f.write_str(": ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found in a config file, in file order where positions are known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// Each error as its one-line message.
    pub fn lines(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, error) in self.0.iter().enumerate() {
            if index > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}
