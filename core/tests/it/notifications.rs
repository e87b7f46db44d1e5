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
            url: "https://hooks.example.com/services/T/B/X"
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

/// The config as the store keeps it and reads it back: every secret `***`.
fn stored(config: &ExperimentConfig) -> NotificationsConfig {
    let json = serde_json::to_value(config).unwrap();
    assert!(
        !json.to_string().contains("secret\":\"hook") && !json.to_string().contains("mail-secret")
    );
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
    assert_eq!(nothing.restore_secrets(None, &no_variables).len(), 2);
    nothing.drop_sinks_without_secrets();
    assert!(nothing.email.is_none() && nothing.webhook.is_none());
}
