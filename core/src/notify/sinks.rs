//! Where notifications go: a webhook (an HTTP POST of Slack-compatible JSON) and mail (SMTP).
//! Each send is blocking and bounded by [`SEND_TIMEOUT`]; the caller runs them off the manager's
//! loop (see `super::Notifier`).

use std::time::Duration;

use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{Message, SmtpTransport, Transport};

use super::Notification;
use crate::config::{EmailConfig, NotificationsConfig, SmtpSecurity, WebhookConfig};

/// How long one attempt at one sink may take (connect, TLS, request, answer).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// One place a notification goes, ready to send.
pub enum Sink {
    Webhook {
        config: WebhookConfig,
        agent: ureq::Agent,
    },
    Email {
        config: EmailConfig,
        transport: Box<SmtpTransport>,
    },
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The sinks of a config, each built or refused with a line naming it.
pub fn sinks(config: &NotificationsConfig) -> Vec<Result<Sink, (String, String)>> {
    let mut sinks = Vec::new();
    if let Some(webhook) = &config.webhook {
        let name = webhook_name(webhook);
        sinks.push(Sink::webhook(webhook.clone()).map_err(|error| (name, error)));
    }
    if let Some(email) = &config.email {
        let name = email_name(email);
        sinks.push(Sink::email(email.clone()).map_err(|error| (name, error)));
    }
    sinks
}

impl Sink {
    fn webhook(config: WebhookConfig) -> Result<Sink, String> {
        // The config's reading refuses it already; this keeps any other way in (a config built
        // in code) from posting to the default port instead of the one written.
        config.url.check_port()?;
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(SEND_TIMEOUT))
            // A 4xx/5xx is read as an answer, so its status can be reported.
            .http_status_as_error(false)
            // Nor is a redirect followed: ureq would turn the POST into a GET without the
            // message and send the secret header on to whatever host it names.
            .max_redirects(0)
            .build()
            .into();
        Ok(Sink::Webhook { config, agent })
    }

    fn email(config: EmailConfig) -> Result<Sink, String> {
        let tls_parameters = || -> Result<TlsParameters, String> {
            let mut builder = TlsParameters::builder(config.host.clone());
            if let Some(ca_file) = &config.ca_file {
                let pem = std::fs::read(ca_file).map_err(|error| {
                    format!("cannot read caFile {}: {error}", ca_file.display())
                })?;
                let certificate = Certificate::from_pem(&pem).map_err(|error| {
                    format!("caFile {}: no PEM certificate ({error})", ca_file.display())
                })?;
                builder = builder.add_root_certificate(certificate);
            }
            builder
                .build_rustls()
                .map_err(|error| format!("TLS set-up failed: {error}"))
        };
        let tls = match config.security {
            SmtpSecurity::Starttls => Tls::Required(tls_parameters()?),
            SmtpSecurity::Tls => Tls::Wrapper(tls_parameters()?),
            SmtpSecurity::None => Tls::None,
        };
        let mut builder = SmtpTransport::builder_dangerous(config.host.clone())
            .port(config.port)
            .tls(tls)
            .timeout(Some(SEND_TIMEOUT));
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            builder =
                builder.credentials(Credentials::new(user.clone(), password.expose().to_owned()));
        }
        Ok(Sink::Email {
            transport: Box::new(builder.build()),
            config,
        })
    }

    /// How the sink is named in messages: a webhook by its scheme and host only (a Slack
    /// webhook's path is its key), mail by its server and recipients.
    pub fn name(&self) -> String {
        match self {
            Sink::Webhook { config, .. } => webhook_name(config),
            Sink::Email { config, .. } => email_name(config),
        }
    }

    /// One attempt; the error is one line.
    pub fn send(&self, notification: &Notification) -> Result<(), String> {
        match self {
            Sink::Webhook { config, agent } => send_webhook(config, agent, notification),
            Sink::Email { config, transport } => send_email(config, transport, notification),
        }
    }
}

fn webhook_name(config: &WebhookConfig) -> String {
    // Where it goes, not its path (a Slack webhook's key) nor user info: `WebhookUrl::shown`.
    let shown = config.url.shown();
    match shown.strip_suffix(crate::config::REDACTED) {
        Some(base) if base.ends_with('/') => format!("webhook {base}…"),
        _ => "webhook (URL)".to_owned(),
    }
}

fn email_name(config: &EmailConfig) -> String {
    format!(
        "email to {} via {}:{}",
        config.to.join(", "),
        config.host,
        config.port
    )
}

fn send_webhook(
    config: &WebhookConfig,
    agent: &ureq::Agent,
    notification: &Notification,
) -> Result<(), String> {
    let body = notification.webhook_body();
    let mut request = agent.post(config.url.expose());
    if let Some(secret) = &config.secret {
        request = request.header(config.secret_header.as_str(), secret.expose());
    }
    let response = request.send_json(&body).map_err(|error| match error {
        ureq::Error::Timeout(_) => no_answer(),
        error => {
            let text = one_line(&error.to_string());
            match webhook_advice(config, &text) {
                Some(advice) => format!("{text}; {advice}"),
                None => text,
            }
        }
    })?;
    let status = response.status();
    if status.is_success() {
        Ok(())
    } else if status.is_redirection() {
        Err(format!(
            "the server answered {status}, a redirect, which knob does not follow (the secret would go along): give the URL it redirects to"
        ))
    } else {
        Err(format!("the server answered {status}"))
    }
}

/// What to change when the error says an `https://` URL reached a server that answered in plain
/// HTTP: rustls's own words ("received corrupt message of type InvalidContentType") named
/// neither TLS nor the URL's scheme, as lettre's did for mail (`smtp_advice`).
fn webhook_advice(config: &WebhookConfig, error: &str) -> Option<&'static str> {
    let https = config
        .url
        .expose()
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"));
    (https && (error.contains("InvalidContentType") || error.contains("corrupt message"))).then_some(
        "the server on that port does not speak TLS: write http:// for a plain HTTP server (only on a trusted network), or give the port it serves HTTPS on",
    )
}

fn send_email(
    config: &EmailConfig,
    transport: &SmtpTransport,
    notification: &Notification,
) -> Result<(), String> {
    let parse = |text: &str| {
        text.parse::<Mailbox>()
            .map_err(|error| format!("{text:?} is not a mail address ({error})"))
    };
    let mut message = Message::builder()
        .from(parse(&config.from)?)
        .subject(notification.subject.clone())
        .header(ContentType::TEXT_PLAIN);
    for recipient in &config.to {
        message = message.to(parse(recipient)?);
    }
    // lettre picks the transfer encoding: 7bit while every line is short, else
    // quoted-printable.
    let message = message
        .body(notification.body.clone())
        .map_err(|error| format!("cannot build the message: {error}"))?;
    transport.send(&message).map(|_| ()).map_err(|error| {
        let text = one_line(&smtp_error(&error));
        match smtp_advice(config, &text) {
            Some(advice) => format!("{text}; {advice}"),
            None => text,
        }
    })
}

/// What to change when lettre's error says the server and `security` do not go together: its
/// own words ("internal client error", "corrupt message of type InvalidContentType") named
/// neither the setting nor the port.
fn smtp_advice(config: &EmailConfig, error: &str) -> Option<String> {
    let port = config.port;
    if error.contains("STARTTLS is not supported") {
        return Some(format!(
            "the server on port {port} does not offer STARTTLS: set notifications.email.security to tls (a port such as 465 that speaks TLS at once) or none (a plain server, only on a trusted network)"
        ));
    }
    if config.security == SmtpSecurity::Tls
        && (error.contains("InvalidContentType") || error.contains("corrupt message"))
    {
        return Some(format!(
            "the server on port {port} does not speak TLS at once: set notifications.email.security to starttls (a port such as 587) or none"
        ));
    }
    // rustls's "invalid peer certificate: UnknownIssuer" alone: a private CA's server, which
    // `caFile` is for, named neither the setting nor what to give it.
    if error.contains("UnknownIssuer") {
        return Some(match &config.ca_file {
            None => "the server's certificate is not signed by a CA knob trusts (Mozilla's roots): give its CA's certificate (PEM) as notifications.email.caFile".to_string(),
            Some(ca_file) => format!(
                "the server's certificate is signed neither by a CA of Mozilla's roots nor by one in caFile {}: give the CA that signed it",
                ca_file.display()
            ),
        });
    }
    // rustls's "certificate not valid for name ..." alone named neither `host` nor the fix.
    if error.contains("NotValidForName") || error.contains("not valid for name") {
        return Some(format!(
            "the server's certificate is not for {}, the host knob connects to: set notifications.email.host to a name the certificate holds (its subject alternative names)",
            config.host
        ));
    }
    if error.contains("No compatible authentication mechanism") {
        return Some(match config.security {
            SmtpSecurity::None => "the server offers no login method knob knows without TLS: set notifications.email.security to starttls or tls, or drop user and password".to_string(),
            _ => "the server offers no login method knob knows (PLAIN, LOGIN): drop user and password if it needs none".to_string(),
        });
    }
    None
}

/// lettre's error with its source chain (its own text alone says "Connection error" without the
/// reason).
fn smtp_error(error: &lettre::transport::smtp::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        // A socket's read timeout surfaces as EAGAIN ("Resource temporarily unavailable"),
        // which reads as a problem here rather than a server that did not answer.
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) {
                return no_answer();
            }
        }
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    text
}

fn no_answer() -> String {
    format!("no answer within {} s", SEND_TIMEOUT.as_secs())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
