//! `notifications:` (knob extension): where knob tells people about an experiment — a webhook
//! (Slack-compatible JSON) and mail over SMTP — and what it tells them.
//!
//! ```yaml
//! notifications:
//!   newBest: true            # also when a trial's final result is the best so far
//!   failuresInARow: 3        # also when this many trials in a row failed (0: never)
//!   webhook:
//!     url: https://hooks.slack.com/services/T000/B000/XXXX
//!     secret: s3cr3t         # optional, sent as the header below; a secret
//!     secretHeader: X-Knob-Secret
//!   email:
//!     host: smtp.example.com
//!     port: 587              # default: 587 starttls, 465 tls, 25 none
//!     security: starttls     # starttls (default), tls or none
//!     user: me@example.com
//!     password: app-password # a secret
//!     from: knob <me@example.com>   # default: user, when it is an address
//!     to: [me@example.com, team@example.com]
//!     caFile: ca.pem         # optional: a private CA that signed the server's certificate
//! ```
//!
//! The password and the webhook secret are secrets as an SSH password is: [`Secret`], stored and
//! shown as `***`; `knob resume` reads them again from the config file the experiment was created
//! from, else from [`PASSWORD_VARIABLE`] / [`WEBHOOK_SECRET_VARIABLE`]
//! ([`NotificationsConfig::restore_secrets`]). The webhook's URL is kept the same way
//! ([`WebhookUrl`]: only `scheme://host/***` is stored or shown, since a Slack webhook's path is
//! its key), and comes back from the config file or [`WEBHOOK_URL_VARIABLE`].

use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::reader::{map_entry, one_or_list, plain_io, quoted, Field, Fields, Reader};
use super::secret::{Secret, REDACTED};
use super::yaml::{Node, Value};

/// Where `knob resume` finds the SMTP password when the config file no longer has it.
pub const PASSWORD_VARIABLE: &str = knob_plugin_api::secrets::SMTP_PASSWORD;
/// Where `knob resume` finds the webhook's secret when the config file no longer has it.
pub const WEBHOOK_SECRET_VARIABLE: &str = knob_plugin_api::secrets::WEBHOOK_SECRET;
/// Where `knob resume` finds the webhook's URL when the config file no longer has it.
pub const WEBHOOK_URL_VARIABLE: &str = knob_plugin_api::secrets::WEBHOOK_URL;
/// The header that carries the webhook's secret unless `secretHeader` names another.
pub const DEFAULT_SECRET_HEADER: &str = "X-Knob-Secret";

const FIELDS: [&str; 4] = ["webhook", "email", "newBest", "failuresInARow"];
const WEBHOOK_FIELDS: [&str; 3] = ["url", "secret", "secretHeader"];
const EMAIL_FIELDS: [&str; 8] = [
    "host", "port", "security", "user", "password", "from", "to", "caFile",
];

/// `notifications:` as read: at least one sink.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NotificationsConfig {
    pub webhook: Option<WebhookConfig>,
    pub email: Option<EmailConfig>,
    /// Also notify each time a trial's final result is the best so far.
    pub new_best: bool,
    /// Also notify when this many trials in a row ended FAILED (0: never). Once per run of
    /// failures: the count starts again after a trial that did not fail.
    pub failures_in_a_row: u32,
}

/// A URL that gets a Slack-compatible JSON body (`{"text": …}`, plus knob's own fields).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WebhookConfig {
    /// `http://` or `https://`.
    pub url: WebhookUrl,
    /// Sent as the value of [`Self::secret_header`], so the receiver can tell knob from others.
    pub secret: Option<Secret>,
    pub secret_header: String,
}

/// A webhook's URL, a credential in all but name: whoever knows a Slack (or Teams, Discord, …)
/// incoming webhook's path can post to its channel.
///
/// Decision: like a [`Secret`], `Debug`, `Display` and `Serialize` show only where it goes,
/// `scheme://host[:port]/***` (user info dropped), so the store, the API, `knob experiment
/// show`/`export` and the logs never hold the path or query; the whole URL only through
/// [`WebhookUrl::expose`]. A stored config's URL is that placeholder ([`WebhookUrl::is_redacted`])
/// until `knob resume` gets the URL again ([`NotificationsConfig::restore_secrets`]).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookUrl(String);

impl WebhookUrl {
    pub fn new(url: impl Into<String>) -> WebhookUrl {
        WebhookUrl(url.into())
    }

    /// The whole URL. Every call site is a place where it may leave the process.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `scheme://host[:port]/***`: what is stored and shown in place of the URL.
    pub fn shown(&self) -> String {
        if self.is_redacted() {
            return self.0.clone();
        }
        let Ok(uri) = self.0.parse::<axum::http::Uri>() else {
            return REDACTED.to_owned();
        };
        match (uri.scheme_str(), uri.authority()) {
            (Some(scheme), Some(authority)) => {
                let authority = authority.as_str();
                let host = authority.rsplit('@').next().unwrap_or(authority);
                format!("{scheme}://{host}/{REDACTED}")
            }
            _ => REDACTED.to_owned(),
        }
    }

    /// Refuses a port outside 1 to 65535 (`http://host:99999/`): `Uri` keeps such a port as
    /// text and ureq then quietly posts to the scheme's default port instead, secret header
    /// and all. Checked where the config is read and again where a sink is built, so that no
    /// path sends to another port than the one written. The error names only the port (the
    /// URL's path is a key).
    pub fn check_port(&self) -> Result<(), String> {
        let Some(port) = written_port(&self.0) else {
            return Ok(());
        };
        match port.parse::<u16>() {
            Ok(1..) => Ok(()),
            _ => Err(format!(
                "port {port} is not a port (1 to 65535); write the port the webhook listens on, or none for the scheme's default"
            )),
        }
    }

    /// True when this is the placeholder `Serialize` writes, not a URL to post to.
    pub fn is_redacted(&self) -> bool {
        self.0 == REDACTED || self.0.ends_with(&format!("/{REDACTED}"))
    }
}

impl std::fmt::Debug for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl std::fmt::Display for WebhookUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Serialize for WebhookUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.shown())
    }
}

impl<'de> Deserialize<'de> for WebhookUrl {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<WebhookUrl, D::Error> {
        String::deserialize(deserializer).map(WebhookUrl)
    }
}

/// Mail through an SMTP server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmailConfig {
    pub host: String,
    pub port: u16,
    pub security: SmtpSecurity,
    pub user: Option<String>,
    /// Set exactly when `user` is.
    pub password: Option<Secret>,
    pub from: String,
    /// At least one.
    pub to: Vec<String>,
    /// Absolute; PEM certificates trusted besides the public roots.
    pub ca_file: Option<PathBuf>,
}

/// How the SMTP connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SmtpSecurity {
    /// Plain connection upgraded with STARTTLS, which the server must offer (submission, 587).
    Starttls,
    /// TLS from the first byte (SMTPS, 465).
    Tls,
    /// No encryption: only for a relay on this machine or a trusted network.
    None,
}

impl SmtpSecurity {
    pub const NAMES: [(&'static str, SmtpSecurity); 3] = [
        ("starttls", SmtpSecurity::Starttls),
        ("tls", SmtpSecurity::Tls),
        ("none", SmtpSecurity::None),
    ];

    pub fn default_port(self) -> u16 {
        match self {
            SmtpSecurity::Starttls => 587,
            SmtpSecurity::Tls => 465,
            SmtpSecurity::None => 25,
        }
    }
}

impl NotificationsConfig {
    /// Fills the secrets a stored config lost (`***`): from `original` (the config the
    /// experiment was created from, read again) when it has the same sink around the secret,
    /// else from the secret's variable. Returns one line for each secret still unknown, naming
    /// its field and variable; the caller turns that sink off
    /// ([`Self::drop_sinks_without_secrets`]).
    pub fn restore_secrets(
        &mut self,
        original: Option<&NotificationsConfig>,
        variable: &dyn Fn(&str) -> Option<String>,
    ) -> Vec<String> {
        let mut unknown = Vec::new();
        if let Some(webhook) = &mut self.webhook {
            // The same sink: the same scheme, host and secret header (the stored URL keeps no
            // more of itself to compare).
            let theirs = original
                .and_then(|original| original.webhook.as_ref())
                .filter(|theirs| {
                    theirs.url.shown() == webhook.url.shown()
                        && theirs.secret_header == webhook.secret_header
                });
            restore_url(&mut webhook.url, theirs, variable, &mut unknown);
            let field = "notifications.webhook.secret";
            fill(
                &mut webhook.secret,
                theirs.and_then(|theirs| theirs.secret.as_ref()),
                field,
                WEBHOOK_SECRET_VARIABLE,
                variable,
                &mut unknown,
            );
        }
        if let Some(email) = &mut self.email {
            let strip = |email: &EmailConfig| EmailConfig {
                password: None,
                ..email.clone()
            };
            let theirs = original
                .and_then(|original| original.email.as_ref())
                .filter(|theirs| strip(theirs) == strip(email))
                .and_then(|theirs| theirs.password.as_ref());
            let field = "notifications.email.password";
            fill(
                &mut email.password,
                theirs,
                field,
                PASSWORD_VARIABLE,
                variable,
                &mut unknown,
            );
        }
        unknown
    }

    /// True when a stored config lost a secret or the webhook's URL that `knob resume` must get
    /// again ([`Self::restore_secrets`]).
    pub fn needs_secrets(&self) -> bool {
        let redacted = |secret: &Option<Secret>| secret.as_ref().is_some_and(Secret::is_redacted);
        self.webhook
            .as_ref()
            .is_some_and(|w| w.url.is_redacted() || redacted(&w.secret))
            || self.email.as_ref().is_some_and(|e| redacted(&e.password))
    }

    /// Turns off each sink whose secret (or the webhook's URL) is still `***` (see
    /// [`Self::restore_secrets`]).
    pub fn drop_sinks_without_secrets(&mut self) {
        if self.webhook.as_ref().is_some_and(|w| {
            w.url.is_redacted() || w.secret.as_ref().is_some_and(Secret::is_redacted)
        }) {
            self.webhook = None;
        }
        if self
            .email
            .as_ref()
            .is_some_and(|e| e.password.as_ref().is_some_and(Secret::is_redacted))
        {
            self.email = None;
        }
    }
}

/// The webhook's URL of [`NotificationsConfig::restore_secrets`]: kept if known, else the same
/// sink's in the original config, else [`WEBHOOK_URL_VARIABLE`]'s when it is a URL to the same
/// scheme and host (a variable left over from another experiment must not redirect this one's
/// messages).
fn restore_url(
    url: &mut WebhookUrl,
    theirs: Option<&WebhookConfig>,
    variable: &dyn Fn(&str) -> Option<String>,
    unknown: &mut Vec<String>,
) {
    if !url.is_redacted() {
        return;
    }
    let field = "notifications.webhook.url";
    if let Some(theirs) = theirs.filter(|theirs| !theirs.url.is_redacted()) {
        *url = theirs.url.clone();
        return;
    }
    let name = WEBHOOK_URL_VARIABLE;
    let Some(value) = variable(name).map(|value| value.trim().to_owned()) else {
        unknown.push(format!(
            "{field} is not stored (only {} is), and the config file the experiment was created from no longer has it; set {name}",
            url.shown()
        ));
        return;
    };
    let candidate = WebhookUrl::new(value);
    match check_url(candidate.expose()) {
        Ok(()) if candidate.shown() == url.shown() && !candidate.is_redacted() => *url = candidate,
        Ok(()) => unknown.push(format!(
            "{name} goes to {}, not to the experiment's webhook {}; set it to that webhook's URL",
            candidate.shown(),
            url.shown()
        )),
        Err(_) => unknown.push(format!(
            "{name} is not an http:// or https:// URL; set it to the webhook's URL ({})",
            url.shown()
        )),
    }
}

/// One secret of [`NotificationsConfig::restore_secrets`]: kept if known, else the same sink's
/// in the original config, else the variable's value.
fn fill(
    secret: &mut Option<Secret>,
    theirs: Option<&Secret>,
    field: &str,
    name: &str,
    variable: &dyn Fn(&str) -> Option<String>,
    unknown: &mut Vec<String>,
) {
    let Some(stored) = secret.as_mut().filter(|secret| secret.is_redacted()) else {
        return;
    };
    let found = theirs
        .filter(|theirs| !theirs.is_redacted())
        .cloned()
        .or_else(|| {
            variable(name)
                .filter(|value| !value.is_empty())
                .map(Secret::new)
        });
    match found {
        Some(found) => *stored = found,
        None => unknown.push(format!(
            "{field} is not stored, and the config file the experiment was created from no longer has it; set {name}"
        )),
    }
}

/// The nodes of a config document that hold the notifications' secrets (the webhook's `url` and
/// `secret`, the mail `password`): what `knob config check --v2` prints as `***`.
pub(crate) fn secret_nodes(document: &Node) -> Vec<&Node> {
    let child = |node, name| map_entry(node, name).map(|(_, value)| value);
    let Some(notifications) = child(document, "notifications") else {
        return Vec::new();
    };
    [
        ("webhook", "url"),
        ("webhook", "secret"),
        ("email", "password"),
    ]
    .into_iter()
    .filter_map(|(sink, secret)| child(child(notifications, sink)?, secret))
    .collect()
}

/// Reads `notifications:`; `None` after recording its errors.
pub(crate) fn read_notifications(
    reader: &mut Reader,
    field: &Field<'_>,
) -> Option<NotificationsConfig> {
    let errors_before = reader.errors.len();
    let mut fields = Fields::open(reader, field.node, &field.path)?;
    let webhook = fields
        .take("webhook")
        .and_then(|field| read_webhook(reader, &field));
    let email = fields
        .take("email")
        .and_then(|field| read_email(reader, &field));
    let new_best = fields
        .take("newBest")
        .and_then(|field| reader.boolean(&field))
        .unwrap_or(false);
    let failures_in_a_row = fields
        .take("failuresInARow")
        .and_then(|field| reader.integer::<u32>(&field, 0))
        .unwrap_or(0);
    let pos = fields.pos;
    fields.finish(reader, &FIELDS);
    if reader.errors.len() != errors_before {
        return None;
    }
    if webhook.is_none() && email.is_none() {
        reader.error(
            pos,
            &field.path,
            "says where to send nothing: add webhook: {url: ...} or email: {host: ..., to: [...]}, or remove notifications",
        );
        return None;
    }
    Some(NotificationsConfig {
        webhook,
        email,
        new_best,
        failures_in_a_row,
    })
}

fn read_webhook(reader: &mut Reader, field: &Field<'_>) -> Option<WebhookConfig> {
    let errors_before = reader.errors.len();
    let mut fields = Fields::open(reader, field.node, &field.path)?;
    let url_field = fields.take("url");
    let url = match &url_field {
        Some(url) => reader.parse(url, |node| match node.as_str() {
            Some(text) if WebhookUrl::new(text.trim()).is_redacted() => Err(format!(
                "{text:?} is the placeholder knob prints instead of a webhook's URL; write the real URL"
            )),
            Some(text) => check_url(text.trim()).map(|()| WebhookUrl::new(text.trim())),
            None => Err(format!(
                "expected an http:// or https:// URL, got {}",
                node.describe()
            )),
        }),
        None => {
            let path = fields.child_path("url");
            reader.error(
                fields.pos,
                &path,
                "required: the URL to POST to, e.g. https://hooks.slack.com/services/...",
            );
            None
        }
    };
    let secret = fields.take("secret").and_then(|field| {
        let secret = read_secret(reader, &field)?;
        // Sent as a header's value: a line break there failed every send ("failed to parse
        // header value"), after `config check` had passed it.
        if axum::http::HeaderValue::from_str(secret.expose()).is_err()
            || secret.expose().chars().any(char::is_control)
        {
            reader.error(
                field.node.pos,
                &field.path,
                "must not hold a line break or another control character: it is sent as an HTTP header's value",
            );
            return None;
        }
        Some(secret)
    });
    let secret_header = match fields.take("secretHeader") {
        Some(field) => reader.parse(&field, |node| {
            let name = node.as_str().unwrap_or_default().trim();
            match axum::http::HeaderName::from_str(name) {
                // The request's own headers: the secret would replace one (`Host: <secret>`
                // sent it to whatever server that name routes to) or break the request.
                Ok(header) if REQUEST_OWN_HEADERS.contains(&header.as_str()) => Err(format!(
                    "{name} is a header the request itself sets, which the secret would replace; name one of your own, like {DEFAULT_SECRET_HEADER:?}"
                )),
                Ok(_) if !name.is_empty() => Ok(name.to_owned()),
                _ => Err(format!(
                    "expected an HTTP header name like {DEFAULT_SECRET_HEADER:?}, got {}",
                    node.describe()
                )),
            }
        }),
        None => Some(DEFAULT_SECRET_HEADER.to_owned()),
    };
    fields.finish(reader, &WEBHOOK_FIELDS);
    if reader.errors.len() != errors_before {
        return None;
    }
    Some(WebhookConfig {
        url: url?,
        secret,
        secret_header: secret_header?,
    })
}

/// An absolute `http`/`https` URL with a host, and a port that is one if it names one. The
/// errors show the URL as [`url_shown_in_errors`] does: its path is a key.
fn check_url(text: &str) -> Result<(), String> {
    let shown = url_shown_in_errors(text);
    let uri = axum::http::Uri::from_str(text).map_err(|error| {
        format!("{shown:?} is not a URL ({error}); write http://... or https://...")
    })?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "{shown:?}: scheme {other:?} is not supported; write http://... or https://..."
            ))
        }
        None => {
            return Err(format!(
                "{shown:?} is not an absolute URL; write http://... or https://..."
            ))
        }
    }
    match uri.host() {
        Some(host) if !host.is_empty() => {}
        _ => return Err(format!("{shown:?} names no host")),
    }
    WebhookUrl::new(text).check_port()
}

/// A webhook URL as its errors show it, which need not parse: the scheme and host as written,
/// user info dropped, and `/***` for whatever follows the host (a Slack webhook's path is its
/// key), as [`WebhookUrl::shown`] shows a valid one.
fn url_shown_in_errors(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), text),
    };
    let end = rest.find(['/', '?', '#']);
    let authority = &rest[..end.unwrap_or(rest.len())];
    let host = authority.rsplit('@').next().unwrap_or(authority);
    let hidden = if end.is_some() {
        format!("/{REDACTED}")
    } else {
        String::new()
    };
    format!("{scheme}{host}{hidden}")
}

/// The port written in a URL's authority (`scheme://user@host:port/...`), as text; `None` when
/// none is written (`host:` with an empty port means the default, as `Uri` reads it).
fn written_port(url: &str) -> Option<&str> {
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme
        .split(['/', '?', '#'])
        .next()
        .unwrap_or(after_scheme);
    let host_and_port = authority.rsplit('@').next().unwrap_or(authority);
    // An IPv6 host (`[::1]:8080`) has colons of its own.
    let after_host = host_and_port
        .rfind(']')
        .map_or(host_and_port, |end| &host_and_port[end + 1..]);
    after_host
        .rsplit_once(':')
        .map(|(_, port)| port)
        .filter(|port| !port.is_empty())
}

/// A secret string: not empty, and not the `***` knob prints in its place.
/// Headers the webhook's request sets itself (lowercase, as `HeaderName` is).
const REQUEST_OWN_HEADERS: [&str; 10] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "keep-alive",
];

fn read_secret(reader: &mut Reader, field: &Field<'_>) -> Option<Secret> {
    let text = reader.parse(field, |node| match &node.value {
        Value::Str(text) if !text.trim().is_empty() => Ok(text.clone()),
        Value::Str(_) => Err(
            "is blank: give the value the other end expects (knob never shows a secret's value)"
                .to_string(),
        ),
        _ => Err(format!(
            "expected a non-empty string, got {} (quote it; knob never shows a secret's value)",
            node.kind()
        )),
    })?;
    if text == REDACTED {
        reader.error(
            field.node.pos,
            &field.path,
            format!("{REDACTED:?} is the placeholder knob prints instead of a secret; write the real value"),
        );
        return None;
    }
    Some(Secret::new(text))
}

fn read_email(reader: &mut Reader, field: &Field<'_>) -> Option<EmailConfig> {
    let errors_before = reader.errors.len();
    let mut fields = Fields::open(reader, field.node, &field.path)?;
    let host = match fields.take("host") {
        Some(field) => reader
            .non_empty_string(&field)
            .map(|h| h.trim().to_owned())
            .and_then(|host| match smtp_host_problem(&host) {
                Some(problem) => {
                    reader.error(field.node.pos, &field.path, problem);
                    None
                }
                None => Some(host),
            }),
        None => {
            let path = fields.child_path("host");
            reader.error(
                fields.pos,
                &path,
                "required: the SMTP server, e.g. smtp.example.com",
            );
            None
        }
    };
    let security = match fields.take("security") {
        Some(field) => reader.choice(&field, &SmtpSecurity::NAMES),
        None => Some(SmtpSecurity::Starttls),
    };
    let port = fields
        .take("port")
        .and_then(|field| reader.integer::<u16>(&field, 1));
    let user_field = fields.take("user");
    let user = user_field
        .as_ref()
        .and_then(|field| reader.non_empty_string(field));
    let password_field = fields.take("password");
    let password = password_field
        .as_ref()
        .and_then(|field| read_secret(reader, field));
    match (&user_field, &password_field) {
        (Some(user), None) => {
            reader.error(
                user.node.pos,
                &fields.child_path("password"),
                "required with user: the SMTP password (a secret: never stored or shown)",
            );
        }
        (None, Some(password)) => {
            reader.error(
                password.node.pos,
                &password.path,
                "a password without user; add user, or remove password",
            );
        }
        _ => {}
    }
    let from_field = fields.take("from");
    let from = match &from_field {
        Some(field) => reader.parse(field, |node| match node.as_str() {
            Some(text) => mailbox(text),
            None => Err(format!("expected a mail address, got {}", node.describe())),
        }),
        None => match &user {
            Some(user) if mailbox(user).is_ok() => Some(user.clone()),
            _ => {
                let path = fields.child_path("from");
                reader.error(
                    fields.pos,
                    &path,
                    "required (user is not a mail address): the sender, e.g. knob <me@example.com>",
                );
                None
            }
        },
    };
    let to = match fields.take("to") {
        Some(field) => read_recipients(reader, &field),
        None => {
            let path = fields.child_path("to");
            reader.error(
                fields.pos,
                &path,
                "required: the recipients, e.g. [me@example.com]",
            );
            None
        }
    };
    let ca_file = fields.take("caFile").and_then(|field| {
        let path = reader.path(&field)?;
        match std::fs::read(&path) {
            Ok(pem) => match pem_certificates(&pem) {
                Ok(0) => {
                    let message = format!(
                        "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----); give the private CA's certificates in PEM",
                        quoted(&path)
                    );
                    reader.error(field.node.pos, &field.path, message);
                    None
                }
                Ok(_) => Some(path),
                Err(error) => {
                    let message = format!(
                        "{} cannot be read as PEM certificates: {error}",
                        quoted(&path)
                    );
                    reader.error(field.node.pos, &field.path, message);
                    None
                }
            },
            Err(error) => {
                let message = format!("cannot read {}: {}", quoted(&path), plain_io(&error));
                reader.error(field.node.pos, &field.path, message);
                None
            }
        }
    });
    fields.finish(reader, &EMAIL_FIELDS);
    if reader.errors.len() != errors_before {
        return None;
    }
    let security = security?;
    if security == SmtpSecurity::None && password.is_some() && !is_loopback(host.as_deref()?) {
        reader.warn(
            password_field.as_ref().and_then(|field| field.node.pos),
            "notifications.email.security",
            "none: the password crosses the network in clear; use starttls or tls",
        );
    }
    Some(EmailConfig {
        port: port.unwrap_or(security.default_port()),
        host: host?,
        security,
        user,
        password,
        from: from?,
        to: to?,
        ca_file,
    })
}

/// How many PEM certificates `pem` holds, read as lettre reads a `caFile` (its
/// `Certificate::from_pem` uses this reader): a file with none (any text, an empty file) it takes
/// as an empty list without a word, and the mail then failed at the TLS handshake, for a reason
/// that did not name the file.
fn pem_certificates(pem: &[u8]) -> Result<usize, String> {
    use rustls_pki_types::pem::{Error, PemObject};
    use rustls_pki_types::CertificateDer;
    CertificateDer::pem_slice_iter(pem).try_fold(0, |count, certificate| match certificate {
        Ok(_) => Ok(count + 1),
        Err(Error::MissingSectionEnd { .. }) => Err("a block has no END line".to_string()),
        Err(Error::Base64Decode(_)) => Err("a block is not base64".to_string()),
        Err(error) => Err(error.to_string()),
    })
}

/// Why `host` cannot be the SMTP server's name, if it cannot: lettre connects to `(host, port)`,
/// so a URL, a `host:port` or a bracketed IPv6 address passed `config check` and every send then
/// failed with "failed to lookup address information", a line that named neither the field nor
/// what was wrong with it.
fn smtp_host_problem(host: &str) -> Option<String> {
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let fix = "write the server's name or address alone, e.g. smtp.example.com (the port goes under port, TLS under security)";
    if let Some((scheme, _)) = host.split_once("://") {
        return Some(format!("{host:?} is a URL ({scheme}://); {fix}"));
    }
    if let Some(inside) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        if inside.parse::<std::net::Ipv6Addr>().is_ok() {
            return Some(format!(
                "{host:?}: write an IPv6 address without brackets ({inside})"
            ));
        }
    }
    if let Some((_, port)) = host.rsplit_once(':') {
        if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
            return Some(format!("{host:?} holds a port ({port}); {fix}"));
        }
    }
    if host.contains(|c: char| c.is_whitespace() || "/@:[]?#".contains(c)) {
        return Some(format!("{host:?} is not a host name; {fix}"));
    }
    None
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A mailbox as lettre reads it (`me@example.com`, `Me <me@example.com>`), kept as written.
fn mailbox(text: &str) -> Result<String, String> {
    let text = text.trim();
    lettre::message::Mailbox::from_str(text)
        .map(|_| text.to_owned())
        .map_err(|error| format!("{text:?} is not a mail address ({error})"))
}

/// `to`: one address or a list of them, at least one.
fn read_recipients(reader: &mut Reader, field: &Field<'_>) -> Option<Vec<String>> {
    let items = match one_or_list(field) {
        Some(items) if !items.is_empty() => items,
        items => {
            let got = match items {
                Some(_) => "an empty list".to_owned(),
                None => field.node.describe(),
            };
            let message =
                format!("expected one or more mail addresses, e.g. [me@example.com], got {got}");
            reader.error(field.node.pos, &field.path, message);
            return None;
        }
    };
    let errors_before = reader.errors.len();
    let recipients: Vec<String> = items
        .iter()
        .filter_map(|item| {
            reader.parse(item, |node| match node.as_str() {
                Some(text) => mailbox(text),
                None => Err(format!("expected a mail address, got {}", node.describe())),
            })
        })
        .collect();
    (reader.errors.len() == errors_before).then_some(recipients)
}
