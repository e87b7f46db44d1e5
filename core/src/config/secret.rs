//! A string that must not leak: the value of a field a training service declared secret (an SSH
//! password, an API token).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What a [`Secret`] shows instead of its value.
pub const REDACTED: &str = "***";

/// The clear text of a secret field of a training service's config.
///
/// Decision: `Debug`, `Display` and `Serialize` all print [`REDACTED`], so a secret cannot reach a
/// log line, the canonical text of `knob config check`, the HTTP API or any other serde output by
/// accident. The clear text is reachable only through [`Secret::expose`], and a config with its
/// secrets in clear only through the explicitly named
/// [`ExperimentConfig::to_json_with_secrets`](super::ExperimentConfig::to_json_with_secrets) and
/// [`TrainingServiceConfig::config_with_secrets`](super::TrainingServiceConfig::config_with_secrets) — the
/// caller that persists that value owns keeping it out of plain sight (issue: "a password is never
/// stored in clear").
///
/// A stored config holds `***` where a secret was ([`REDACTED`]): the secret must then be
/// supplied again (from the original config file, or the variable its service named).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The clear text. Every call site is a place where the secret may leave the process.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when this is the placeholder written by `Serialize`, not a real secret.
    pub fn is_redacted(&self) -> bool {
        self.0 == REDACTED
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}
