//! The one error type of the search-space module.

use super::parse::shorten_name;

/// Why a search space, a parameters object or an encoded vector was rejected.
///
/// Every message is one line (names are quoted with Rust's escapes, so even a name holding a
/// newline cannot break it) that names the parameter path (`optimizer/adam/lr`) where there is
/// one, says what was found and what is allowed, so it can be shown to a user as is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    /// The text is not JSON at all.
    #[error("search space is not valid JSON: {0}")]
    Json(String),
    /// The JSON is not an object of parameters (e.g. a list or a number).
    #[error(
        "search space must be a JSON object like {{\"name\": {{\"_type\": ..., \"_value\": [...]}}}}, got {0}"
    )]
    NotAnObject(String),
    /// One parameter's definition is invalid.
    #[error("search space parameter {path:?}: {message}")]
    Parameter {
        /// `/`-separated path: the parameter's name, prefixed by `choice/option/` inside a
        /// nested choice.
        path: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A parameters object (e.g. a trial added by hand) does not belong to the space.
    #[error("trial parameters: {0}")]
    Parameters(String),
    /// One value of a parameters object does not belong to the space.
    #[error("trial parameter {path:?}: {message}")]
    Value {
        /// Path of the offending value, in the same form as [`SpaceError::Parameter`].
        path: String,
        /// What is wrong and what is allowed.
        message: String,
    },
    /// A numeric vector cannot be decoded (wrong length, NaN in an active dimension).
    #[error("encoded vector: {0}")]
    Encoding(String),
}

// The path is a name from outside (a tuner's key can be megabytes): both cut it as values are,
// so the one line stays short wherever it is printed or stored.
impl SpaceError {
    pub(crate) fn param(path: &str, message: impl Into<String>) -> Self {
        SpaceError::Parameter {
            path: shorten_name(path),
            message: message.into(),
        }
    }

    pub(crate) fn value(path: &str, message: impl Into<String>) -> Self {
        SpaceError::Value {
            path: shorten_name(path),
            message: message.into(),
        }
    }
}
