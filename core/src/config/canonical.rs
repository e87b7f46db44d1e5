//! The canonical text of a config, and the one serialization that keeps secrets.

use saphyr::{Scalar, Yaml, YamlEmitter, YamlLoader};
use saphyr_parser::{Parser, ScalarStyle};

use super::model::ExperimentConfig;
use super::yaml::{Node, Value};
use super::REDACTED;

impl ExperimentConfig {
    /// The canonical form as YAML: camelCase names, absolute paths, durations in seconds, sizes
    /// in MiB, every default filled in, secrets shown as `***`. It is itself a valid config.
    pub fn to_canonical_yaml(&self) -> String {
        // serde_json keeps struct field order (serde_json::Value would sort it), JSON is YAML,
        // and saphyr keeps mapping order: so the YAML lists fields in declaration order.
        let rendered = serde_json::to_string(self)
            .map_err(|error| error.to_string())
            .and_then(|json| json_to_yaml(&json));
        match rendered {
            Ok(yaml) => yaml,
            // Only a path that is not UTF-8 gets here; say so rather than print half a config.
            Err(error) => format!("# knob could not render this config: {error}\n"),
        }
    }

    /// The config as JSON *with* every secret the training services declared in clear: the only
    /// way to get them out of the model besides
    /// [`TrainingServiceConfig::config_with_secrets`](super::TrainingServiceConfig::config_with_secrets). Whoever stores this value owns keeping it
    /// out of plain sight; everything else should use serde, which writes `***`.
    pub fn to_json_with_secrets(&self) -> serde_json::Value {
        let mut json = serde_json::to_value(self).unwrap_or(serde_json::Value::Null);
        if let Some(serde_json::Value::Array(stored)) = json.get_mut("trainingService") {
            for (stored, service) in stored.iter_mut().zip(&self.training_service) {
                let mut clear = serde_json::Map::new();
                clear.insert("platform".into(), service.platform.clone().into());
                if let serde_json::Value::Object(fields) = service.config_with_secrets() {
                    clear.extend(fields);
                }
                *stored = serde_json::Value::Object(clear);
            }
        }
        json
    }
}

/// A config document as YAML, keys in the order written, the values of `secrets` (nodes of
/// `document`: the fields its training services declared secret) as `***`: what
/// `knob config check --v2` prints.
pub(super) fn document_yaml(document: &Node, secrets: &[&Node]) -> String {
    let mut json = String::new();
    match write_json(document, secrets, &mut json).and_then(|()| json_to_yaml(&json)) {
        Ok(yaml) => yaml,
        Err(error) => format!("# knob could not render this config: {error}\n"),
    }
}

/// JSON text of `node`, mapping order kept (a `serde_json::Value` would sort the keys).
fn write_json(node: &Node, secrets: &[&Node], out: &mut String) -> Result<(), String> {
    let secret = secrets.iter().any(|secret| std::ptr::eq(*secret, node));
    if secret && !node.is_null() {
        out.push_str(&format!("{REDACTED:?}"));
        return Ok(());
    }
    match &node.value {
        Value::Seq(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_json(item, secrets, out)?;
            }
            out.push(']');
        }
        Value::Map(entries) => {
            out.push('{');
            for (index, (key, value)) in entries.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                let key_text = key.key_text();
                out.push_str(&serde_json::Value::String(key_text.clone()).to_string());
                out.push(':');
                write_json(value, secrets, out)?;
            }
            out.push('}');
        }
        _ => {
            let scalar = node.to_json().map_err(|(_, message)| message)?;
            out.push_str(&scalar.to_string());
        }
    }
    Ok(())
}

fn json_to_yaml(json: &str) -> Result<String, String> {
    // Loaded without resolving scalars: a number keeps the digits serde_json wrote (a whole
    // number past i64 read as a float printed 18446744073709551615 as 18446744073709552000.0),
    // and each string is told apart from a number by its quotes (`as_written`).
    let mut loader: YamlLoader<'_, Yaml<'_>> = YamlLoader::default();
    loader.early_parse(false);
    Parser::new_from_str(json)
        .load(&mut loader, false)
        .map_err(|error| error.to_string())?;
    let document = loader
        .into_documents()
        .into_iter()
        .next()
        .ok_or("empty document")?;
    let mut text = String::new();
    YamlEmitter::new(&mut text)
        .dump(&as_written(document))
        .map_err(|error| error.to_string())?;
    let body = text.strip_prefix("---\n").unwrap_or(&text);
    Ok(format!("{}\n", body.trim_end_matches('\n')))
}

/// A JSON document loaded unresolved ([`json_to_yaml`]) as YAML that reads back as the same
/// values: numbers, booleans and null as serde_json wrote them (`null`, not the emitter's `~`,
/// which reads like a home folder next to our paths), each string as a string, quoted where the
/// config reader would otherwise read a number or a boolean (`'1_000'`, `'0b101'`, `'on'`: YAML
/// 1.1's forms, which the emitter writes bare).
fn as_written(node: Yaml<'_>) -> Yaml<'_> {
    match node {
        Yaml::Representation(text, ScalarStyle::DoubleQuoted | ScalarStyle::SingleQuoted, _) => {
            // Such a string is made of digits, signs, letters, `_`, `.` and `:` only, so it
            // can be written between double quotes as it is.
            let verbatim = !text.contains(|c: char| c == '"' || c == '\\' || c.is_control());
            if !super::yaml::plain_reads_as_text(&text) && verbatim {
                Yaml::Representation(text, ScalarStyle::DoubleQuoted, None)
            } else {
                Yaml::Value(Scalar::String(text))
            }
        }
        Yaml::Sequence(items) => Yaml::Sequence(items.into_iter().map(as_written).collect()),
        Yaml::Mapping(entries) => Yaml::Mapping(
            entries
                .into_iter()
                .map(|(key, value)| (as_written(key), as_written(value)))
                .collect(),
        ),
        other => other,
    }
}
