//! `notifications:`: the canonical form (defaults filled, secrets `***`), and the secrets a stored
//! config lost coming back on resume from the original config or their variables.

use expect_test::expect;
use knob_core::config::{ExperimentConfig, NotificationsConfig, Secret};

use crate::config::{only_fields, Project};

const BASE: &str = "trialCommand: python3 t.py
trialConcurrency: 1
searchSpace: {}
tuner: {name: Random}
trainingService: {platform: local}
";

const NOTIFICATIONS: &str = "notifications:
  failuresInARow: 3
  webhook: {url: 'https://hooks.example.com/services/T/B/X', secret: hook-secret}
  email: {host: smtp.example.com, user: me@example.com, password: mail-secret, to: me@example.com}
";

#[test]
fn defaults_are_filled_and_secrets_shown_as_stars() {
    let project = Project::new(&[]);
    let text = format!("{BASE}{NOTIFICATIONS}");
    expect![[r#"
        notifications:
          webhook:
            url: "https://hooks.example.com/***"
            secret: "***"
            secretHeader: X-Knob-Secret
          email:
            host: smtp.example.com
            port: 587
            security: starttls
            user: me@example.com
            password: "***"
            from: me@example.com
            to:
              - me@example.com
            caFile: null
          newBest: false
          failuresInARow: 3
    "#]]
    .assert_eq(&only_fields(
        &project.check("exp.yml", &text),
        &["notifications"],
    ));
    let tls = text.replace("smtp.example.com,", "smtp.example.com, security: TLS,");
    let config = project.load("tls.yml", &tls);
    let email = config.notifications.unwrap().email.unwrap();
    assert_eq!(
        (email.port, email.password.unwrap().expose()),
        (465, "mail-secret")
    );
}

/// The config as the store keeps it and reads it back: every secret `***`, the webhook's URL
/// only its scheme and host.
fn stored(config: &ExperimentConfig) -> NotificationsConfig {
    let json = serde_json::to_value(config).unwrap();
    let text = json.to_string();
    assert!(
        !text.contains("secret\":\"hook") && !text.contains("mail-secret"),
        "{text}"
    );
    assert!(
        !text.contains("T/B/X") && text.contains("\"https://hooks.example.com/***\""),
        "{text}"
    );
    assert!(!format!("{config:?}").contains("T/B/X"));
    let back: ExperimentConfig = serde_json::from_value(json).unwrap();
    back.notifications.unwrap()
}

#[test]
fn resume_restores_secrets_from_the_same_sink_or_the_variables() {
    let project = Project::new(&[]);
    let original = project.load("exp.yml", &format!("{BASE}{NOTIFICATIONS}"));
    let theirs = original.notifications.as_ref();
    let no_variables = |_: &str| None;

    // The same sinks in the original config: both secrets from there.
    let mut restored = stored(&original);
    assert!(restored.restore_secrets(theirs, &no_variables).is_empty());
    assert_eq!(Some(&restored), theirs);

    // The mail server changed in the file: its password is not taken for the stored one; the
    // variable gives it, and nothing gives it without the variable.
    let moved = project.load(
        "moved.yml",
        &format!(
            "{BASE}{}",
            NOTIFICATIONS.replace("smtp.example.com", "smtp.elsewhere.org")
        ),
    );
    let mut from_variable = stored(&original);
    let variables = |name: &str| (name == "KNOB_SMTP_PASSWORD").then(|| "from-variable".to_owned());
    assert!(from_variable
        .restore_secrets(moved.notifications.as_ref(), &variables)
        .is_empty());
    let password = from_variable.email.as_ref().unwrap().password.as_ref();
    assert_eq!(password.map(Secret::expose), Some("from-variable"));
    assert_eq!(from_variable.webhook, theirs.unwrap().webhook);

    let mut unknown = stored(&original);
    let lines = unknown.restore_secrets(moved.notifications.as_ref(), &no_variables);
    expect![[r#"
        [
            "notifications.email.password is not stored, and the config file the experiment was created from no longer has it; set KNOB_SMTP_PASSWORD",
        ]
    "#]]
    .assert_debug_eq(&lines);
    unknown.drop_sinks_without_secrets();
    assert!(unknown.email.is_none() && unknown.webhook.is_some());

    let mut nothing = stored(&original);
    assert_eq!(nothing.restore_secrets(None, &no_variables).len(), 3);
    nothing.drop_sinks_without_secrets();
    assert!(nothing.email.is_none() && nothing.webhook.is_none());
}

#[test]
fn resume_restores_the_webhooks_url_from_the_same_host_or_its_variable() {
    let project = Project::new(&[]);
    let original = project.load("exp.yml", &format!("{BASE}{NOTIFICATIONS}"));
    let url = |n: &NotificationsConfig| n.webhook.as_ref().unwrap().url.expose().to_owned();
    let secret_variable = |name: &str| (name == "KNOB_WEBHOOK_SECRET").then(|| "s".to_owned());

    // Another path on the same host in the file (the channel moved): the file's URL and secret.
    let moved = project.load(
        "moved.yml",
        &format!("{BASE}{}", NOTIFICATIONS.replace("T/B/X", "T/B/Y")),
    );
    let mut restored = stored(&original);
    assert!(restored
        .restore_secrets(moved.notifications.as_ref(), &|_| None)
        .is_empty());
    assert_eq!(url(&restored), "https://hooks.example.com/services/T/B/Y");

    // Another host in the file: not that sink. The variable gives the URL when it goes to the
    // stored host, and is refused, naming both, when it does not.
    let elsewhere = project.load(
        "elsewhere.yml",
        &format!(
            "{BASE}{}",
            NOTIFICATIONS.replace("hooks.example.com", "hooks.other.org")
        ),
    );
    let variables = |value: &'static str| {
        move |name: &str| match name {
            "KNOB_WEBHOOK_URL" => Some(value.to_owned()),
            "KNOB_SMTP_PASSWORD" | "KNOB_WEBHOOK_SECRET" => Some("s".to_owned()),
            _ => None,
        }
    };
    let mut from_variable = stored(&original);
    let lines = from_variable.restore_secrets(
        elsewhere.notifications.as_ref(),
        &variables("https://hooks.example.com/services/T/B/Z"),
    );
    assert!(lines.is_empty(), "{lines:?}");
    assert_eq!(
        url(&from_variable),
        "https://hooks.example.com/services/T/B/Z"
    );

    for (value, expected) in [
        (
            "https://hooks.other.org/services/T/B/Z",
            "KNOB_WEBHOOK_URL goes to https://hooks.other.org/***, not to the experiment's webhook https://hooks.example.com/***; set it to that webhook's URL",
        ),
        (
            "not a url",
            "KNOB_WEBHOOK_URL is not an http:// or https:// URL; set it to the webhook's URL (https://hooks.example.com/***)",
        ),
    ] {
        let mut refused = stored(&original);
        let lines = refused.restore_secrets(None, &variables(value));
        assert_eq!(lines, [expected]);
        refused.drop_sinks_without_secrets();
        assert!(refused.webhook.is_none() && refused.email.is_some());
    }

    // Nothing gives it: one line naming the field and the variable; the sink is turned off.
    let mut unknown = stored(&original);
    let lines = unknown.restore_secrets(None, &secret_variable);
    expect![[r#"
        [
            "notifications.webhook.url is not stored (only https://hooks.example.com/*** is), and the config file the experiment was created from no longer has it; set KNOB_WEBHOOK_URL",
            "notifications.email.password is not stored, and the config file the experiment was created from no longer has it; set KNOB_SMTP_PASSWORD",
        ]
    "#]]
    .assert_debug_eq(&lines);
    assert!(unknown.needs_secrets());
    unknown.drop_sinks_without_secrets();
    assert!(unknown.webhook.is_none());
}

#[test]
fn an_unquoted_number_as_a_secret_is_refused_without_showing_it() {
    let project = Project::new(&[]);
    let text = format!(
        "{BASE}{}",
        NOTIFICATIONS
            .replace("password: mail-secret", "password: 98765432123")
            .replace("secret: hook-secret", "secret: 31415926")
    );
    let out = project.check("exp.yml", &text);
    for field in ["webhook.secret", "email.password"] {
        assert!(
            out.contains(&format!("notifications.{field}: expected a non-empty string, got a number (quote it; knob never shows a secret's value)")),
            "{out}"
        );
    }
    assert!(
        !out.contains("98765432123") && !out.contains("31415926"),
        "{out}"
    );
}

#[test]
fn the_placeholder_is_refused_as_a_webhook_url() {
    let project = Project::new(&[]);
    let text = format!(
        "{BASE}{}",
        NOTIFICATIONS.replace(
            "https://hooks.example.com/services/T/B/X",
            "https://hooks.example.com/***"
        )
    );
    let out = project.check("exp.yml", &text);
    assert!(
        out.contains("notifications.webhook.url: \"https://hooks.example.com/***\" is the placeholder knob prints instead of a webhook's URL; write the real URL"),
        "{out}"
    );
}

/// A port past 65535 was kept as text by the URL parser and ureq posted to port 80 instead,
/// secret header and all; the error then named the port written.
#[test]
fn a_webhook_port_that_is_not_a_port_is_refused_where_it_is_written() {
    let project = Project::new(&[]);
    for port in ["99999", "0"] {
        let text = format!(
            "{BASE}notifications:\n  webhook: {{url: 'http://127.0.0.1:{port}/hooks/KEY', secret: s}}\n"
        );
        let out = project.check("exp.yml", &text);
        assert_eq!(
            out,
            format!("$DIR/exp.yml:7:18: notifications.webhook.url: port {port} is not a port (1 to 65535); write the port the webhook listens on, or none for the scheme's default\n"),
        );
        assert!(!out.contains("KEY"), "{out}");
    }
    for fine in [
        "http://127.0.0.1:65535/h",
        "https://[::1]/h",
        "https://[::1]:8443/h",
        "http://u:pw@host:1/h?a=b:c",
        "https://host/path:99999",
    ] {
        let text = format!("{BASE}notifications:\n  webhook: {{url: '{fine}'}}\n");
        let out = project.check("exp.yml", &text);
        assert!(out.contains("notifications:\n"), "{fine}: {out}");
    }
}

/// A URL refused for its scheme or its syntax was quoted whole in the error, key and all (in
/// `knob config check`, `knob create`, CI logs); only its scheme and host are shown.
#[test]
fn a_refused_webhook_url_is_shown_without_its_path() {
    let project = Project::new(&[]);
    let out = |url: &str| {
        let text = format!("{BASE}notifications:\n  webhook: {{url: '{url}'}}\n");
        project.check("exp.yml", &text)
    };
    expect![[r#"
        $DIR/exp.yml:7:18: notifications.webhook.url: "ftp://hooks.slack.com/***": scheme "ftp" is not supported; write http://... or https://...
        $DIR/exp.yml:7:18: notifications.webhook.url: "https://hooks.slack.com/***" is not a URL (invalid uri character); write http://... or https://...
        $DIR/exp.yml:7:18: notifications.webhook.url: "http:///***" is not a URL (invalid format); write http://... or https://...
        $DIR/exp.yml:7:18: notifications.webhook.url: "hooks.slack.com/***" is not a URL (invalid format); write http://... or https://...
    "#]]
    .assert_eq(
        &[
            "ftp://hooks.slack.com/services/T000/B000/SECRETKEY",
            "https://u:pw@hooks.slack.com/services/T000/B000/SECRET KEY",
            "http:///SECRETKEY",
            "hooks.slack.com/services/T000/B000/SECRETKEY",
        ]
        .map(out)
        .concat(),
    );
}

/// The notifier and `knob notify test` refuse such a URL too, when a config reaches them by
/// another way than its reading: nothing posts to another port than the one written.
#[test]
fn a_sink_with_a_port_that_is_not_a_port_sends_nothing() {
    let config = NotificationsConfig {
        webhook: Some(knob_core::config::WebhookConfig {
            url: knob_core::config::WebhookUrl::new("http://127.0.0.1:99999/hooks/KEY"),
            secret: Some(Secret::new("s".to_owned())),
            secret_header: "X-Knob-Secret".to_owned(),
        }),
        email: None,
        new_best: false,
        failures_in_a_row: 0,
    };
    let results = knob_core::notify::send_test(&config, "code");
    assert_eq!(
        results,
        vec![(
            "webhook http://127.0.0.1:99999/…".to_owned(),
            Err("port 99999 is not a port (1 to 65535); write the port the webhook listens on, or none for the scheme's default".to_owned())
        )]
    );
}
