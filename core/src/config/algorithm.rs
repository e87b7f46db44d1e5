//! Checking `tuner` (or `advisor`) and `assessor` by building them: the plugin that exports the
//! name is found, the component is constructed with its `classArgs` and, for a tuner, given the
//! search space; then it is dropped. Nothing runs (no trial, no service), but every refusal
//! `knob create` would meet later is found here, at the place in the file it is about:
//!
//! - an unknown name, at `name` (the message says where knob looked);
//! - `className`, and NNI names knob has no native version of, are built as NNI's dispatcher
//!   plugin (`crate::nni_dispatch`), which checks that its Python can import nni; its refusal
//!   goes at `className` (or `name`);
//! - a constructor's refusal, at the `classArgs` key its message names (`unknown field
//!   "stesp"`, `optimize_mode must be ...`), else at `classArgs`, else at `name`;
//! - a tuner's refusal of the search space, at `searchSpace` or `searchSpaceFile`.

use knob_plugin_api::ComponentKind;
use serde_json::Value as Json;

use super::reader::{map_entry, Reader};
use super::yaml::{Node, Pos, Value};

/// An algorithm read up to its plugin: checked once the plugins are known.
pub(crate) struct PendingAlgorithm {
    pub kind: ComponentKind,
    /// `tuner`, `advisor` or `assessor`.
    pub path: String,
    /// The algorithm's mapping as written, for positions.
    pub node: Node,
    pub name: Option<String>,
    pub class_name: Option<String>,
    pub class_args: serde_json::Map<String, Json>,
    /// The whole algorithm, for the choice of NNI's dispatcher.
    pub config: super::AlgorithmConfig,
}

/// Why building an algorithm failed, one line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlgorithmProblem {
    /// No plugin exports the name (or two do).
    Name(String),
    /// The constructor refused its classArgs (or failed otherwise).
    Constructor(String),
    /// The tuner refused the search space.
    SearchSpace(String),
}

/// Checks each pending algorithm with `build` (see `ServiceChecker::check_algorithm`);
/// `search_space` (the config's, once it was read without error) goes to tuners.
pub(crate) fn check_algorithms(
    reader: &mut Reader,
    checker: &dyn super::ServiceChecker,
    pending: &[PendingAlgorithm],
    search_space: Option<&Json>,
    document: Option<&Node>,
    objectives: &[super::ObjectiveConfig],
) {
    if !checker.checks_algorithms() {
        return;
    }
    for algorithm in pending {
        let field = |name: &str| map_entry(&algorithm.node, name);
        let space = match algorithm.kind {
            ComponentKind::Tuner => search_space,
            _ => None,
        };
        // Whether NNI's own class runs it (through the dispatcher): NNI's tuners optimise one
        // objective.
        let ran_through_nni = std::cell::Cell::new(false);
        let through_nni = || {
            ran_through_nni.set(true);
            let name = crate::nni_dispatch::dispatcher_name(algorithm.kind);
            let args =
                crate::nni_dispatch::class_args(&algorithm.config, super::LogLevel::Info, None);
            checker.check_algorithm(algorithm.kind, name, &args, space)
        };
        let nni_name = algorithm
            .name
            .as_deref()
            .and_then(|name| knob_plugin_api::host::nni_algorithm(algorithm.kind, name));
        // The dispatcher plugin runs an NNI algorithm the core hands it; named itself it has
        // none ("classArgs of NniDispatcher: missing field `algorithm`").
        if let Some(name) = algorithm
            .name
            .as_deref()
            .filter(|name| knob_plugin_api::host::is_nni_dispatcher(name))
            .filter(|_| algorithm.class_name.is_none())
        {
            let (pos, path) = located(&algorithm.path, field("name"), "name", None);
            reader.error(
                pos,
                &path,
                format!(
                    "{name} is knob's bridge to NNI's own Python algorithms, not one to name: give the NNI algorithm's name (name: SMAC, name: Metis, ...) or your own class (className: module.Class)"
                ),
            );
            continue;
        }
        let outcome = if algorithm.class_name.is_some()
            || (algorithm.config.use_nni_implementation && nni_name.is_some())
        {
            through_nni()
        } else {
            let Some(name) = &algorithm.name else {
                continue;
            };
            let args = Json::Object(algorithm.class_args.clone());
            match checker.check_algorithm(algorithm.kind, name, &args, space) {
                // No plugin exports an NNI name knob lacks natively: NNI's own runs it.
                Some(Err(AlgorithmProblem::Name(_)))
                    if nni_name.is_some_and(|nni| nni.native.is_none()) =>
                {
                    through_nni()
                }
                other => other,
            }
        };
        let Some(Err(problem)) = outcome else {
            let multi_objective_tuner = algorithm.kind == ComponentKind::Tuner
                && crate::objectives::is_multi_objective(objectives);
            if multi_objective_tuner && ran_through_nni.get() {
                let at = match algorithm.class_name {
                    Some(_) => "className",
                    None => "name",
                };
                let (pos, path) = located(&algorithm.path, field(at), at, None);
                let shown = match algorithm.class_name {
                    Some(_) => format!("{} (run by NNI)", algorithm.config.display_name()),
                    None => format!("{} (NNI's own)", algorithm.config.display_name()),
                };
                let mut message = crate::objectives::single_objective_refusal(&shown, objectives);
                if algorithm.config.use_nni_implementation
                    && nni_name.is_some_and(|nni| nni.native.is_some())
                {
                    message.push_str(" (leave out useNniImplementation to run knob's own)");
                }
                reader.error(pos, &path, message);
                continue;
            }
            if let Some(name) = algorithm.name.as_deref().filter(|_| multi_objective_tuner) {
                let args = Json::Object(algorithm.class_args.clone());
                if checker.tuner_takes_objectives(name, &args) == Some(false) {
                    let (pos, path) = located(&algorithm.path, field("name"), "name", None);
                    reader.error(
                        pos,
                        &path,
                        crate::objectives::single_objective_refusal(name, objectives),
                    );
                }
            }
            continue;
        };
        // The dispatcher's own messages name the NNI algorithm; the plugin's name adds nothing.
        let mut dispatcher_refused = false;
        let problem = match problem {
            AlgorithmProblem::Constructor(message) => {
                let prefix = format!(
                    "{} {}: constructor failed: ",
                    algorithm.kind,
                    crate::nni_dispatch::dispatcher_name(algorithm.kind)
                );
                AlgorithmProblem::Constructor(match message.strip_prefix(&prefix) {
                    Some(own) => {
                        dispatcher_refused = true;
                        own.to_owned()
                    }
                    None => message,
                })
            }
            other => other,
        };
        let name = algorithm.config.display_name().to_owned();
        if algorithm.class_name.is_some() {
            let (pos, path) = located(&algorithm.path, field("className"), "className", None);
            let message = match problem {
                AlgorithmProblem::Name(m)
                | AlgorithmProblem::Constructor(m)
                | AlgorithmProblem::SearchSpace(m) => m,
            };
            reader.error(pos, &path, message);
            continue;
        }
        match problem {
            AlgorithmProblem::Name(message) => {
                let (pos, path) = located(&algorithm.path, field("name"), "name", None);
                reader.error(pos, &path, message);
            }
            // Checked, the dispatcher reads its args and asks the Python which nni it has, no
            // more (NNI reads classArgs once it runs): its refusal is about that Python, at the
            // algorithm's name as with a className (it was put at a classArgs line that was fine).
            AlgorithmProblem::Constructor(message) if dispatcher_refused => {
                let at = match message.starts_with("dispatcherConnectTimeout") {
                    true => "dispatcherConnectTimeout",
                    false => "name",
                };
                let (pos, path) = located(&algorithm.path, field(at), at, None);
                reader.error(pos, &path, message);
            }
            AlgorithmProblem::Constructor(message) => {
                let class_args = field("classArgs");
                let named = class_args.and_then(|(_, node)| named_argument(node, &message));
                let (pos, path) = match (named, class_args) {
                    (Some((key, key_node)), _) => {
                        (key_node.pos, format!("{}.classArgs.{key}", algorithm.path))
                    }
                    (None, Some(_)) => located(&algorithm.path, class_args, "classArgs", None),
                    (None, None) => located(&algorithm.path, field("name"), "name", None),
                };
                reader.error(pos, &path, message);
            }
            AlgorithmProblem::SearchSpace(message) => {
                let written = document.and_then(|root| {
                    map_entry(root, "searchSpace").or_else(|| map_entry(root, "searchSpaceFile"))
                });
                let (pos, path) = match written {
                    Some((key, node)) => (node.pos.or(key.pos), key.key_text()),
                    None => (None, "searchSpace".to_owned()),
                };
                // The call's error names the tuner and the call; say the tuner once.
                let own = message
                    .strip_prefix(&format!("tuner {name} failed in update_search_space: "))
                    .or_else(|| {
                        message
                            .strip_prefix(name.as_str())
                            .and_then(|rest| rest.strip_prefix(": "))
                    })
                    .unwrap_or(&message);
                let message = format!("tuner {name} refuses this search space: {own}");
                reader.error(pos, &path, message);
            }
        }
    }
}

/// The position and field path of `field` (a child of the algorithm at `parent`), falling back
/// to the algorithm's own place.
fn located(
    parent: &str,
    field: Option<(&Node, &Node)>,
    name: &str,
    fallback: Option<Pos>,
) -> (Option<Pos>, String) {
    match field {
        Some((key, value)) => (
            value.pos.or(key.pos).or(fallback),
            format!("{parent}.{}", key.key_text()),
        ),
        None => (fallback, format!("{parent}.{name}")),
    }
}

/// The classArgs key a constructor's message is about, as a path, with the node to point at:
/// the first top-level key it quotes (`"stesp"`, `` `stesp` ``, `'stesp'`), else the first it
/// names as a whole word; then, where the message goes on from there with a path
/// (`tpe_args.n_startup_jobs`, `points[1]`, as `parse_class_args` writes one), what that path
/// leads to; and inside a mapping reached so, a key the message quotes (`tpe_args: unknown field
/// `n_start``). Plugin errors are free text; this is how `classArgs of Sweep: unknown field
/// `stesp`, expected `steps`` reaches the line of `stesp` (named first; `steps` is what is
/// allowed).
fn named_argument<'n>(class_args: &'n Node, message: &str) -> Option<(String, &'n Node)> {
    let first = |map: &'n Node, at: &dyn Fn(&str) -> Option<usize>| {
        let Value::Map(pairs) = &map.value else {
            return None;
        };
        pairs
            .iter()
            .filter_map(|(key, value)| {
                let text = key.key_text();
                at(&text).map(|index| (index, text, key, value))
            })
            .min_by_key(|(index, text, _, _)| (*index, std::cmp::Reverse(text.len())))
    };
    let quoted = |key: &str| {
        QUOTES
            .iter()
            .filter_map(|q| message.find(&format!("{q}{key}{q}")))
            .min()
    };
    let (index, mut path, mut node, mut value) = first(class_args, &quoted)
        .or_else(|| first(class_args, &|key: &str| word_at(message, key)))?;
    // The path on from the key, as written after it.
    let mut rest = message[index..].trim_start_matches(QUOTES);
    rest = rest.strip_prefix(path.as_str()).unwrap_or("");
    loop {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '-'))
                .unwrap_or(after.len());
            let Value::Map(pairs) = &value.value else {
                break;
            };
            let Some((key, next)) = pairs.iter().find(|(key, _)| key.key_text() == after[..end])
            else {
                break;
            };
            path.push_str(&format!(".{}", &after[..end]));
            (node, value, rest) = (key, next, &after[end..]);
        } else if let Some((index, after)) = rest
            .strip_prefix('[')
            .and_then(|after| after.split_once(']'))
        {
            let Value::Seq(items) = &value.value else {
                break;
            };
            let Some(item) = index.parse::<usize>().ok().and_then(|i| items.get(i)) else {
                break;
            };
            path.push_str(&format!("[{index}]"));
            (node, value, rest) = (item, item, after);
        } else {
            break;
        }
    }
    // `path: ...` about a mapping: a key it quotes inside (serde's unknown field).
    if rest.starts_with(':') {
        if let Some((_, key_text, key, _)) = first(value, &quoted) {
            path.push_str(&format!(".{key_text}"));
            node = key;
        }
    }
    Some((path, node))
}

const QUOTES: [char; 3] = ['"', '`', '\''];

/// Where `word` first occurs in `text` not as part of a longer identifier.
fn word_at(text: &str, word: &str) -> Option<usize> {
    if word.is_empty() {
        return None;
    }
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    text.match_indices(word).map(|(at, _)| at).find(|&at| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(keys: &[&str]) -> Node {
        let pairs = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let pos = Some(Pos {
                    line: i + 1,
                    column: 3,
                });
                (
                    Node {
                        value: Value::Str((*key).into()),
                        pos,
                    },
                    Node {
                        value: Value::Int(1),
                        pos,
                    },
                )
            })
            .collect();
        Node {
            value: Value::Map(pairs),
            pos: None,
        }
    }

    fn named(keys: &[&str], message: &str) -> Option<String> {
        named_argument(&args(keys), message).map(|(key, _)| key)
    }

    #[test]
    fn the_argument_a_message_names_is_found() {
        let keys = ["seed", "steps", "optimze_mode"];
        // serde's deny_unknown_fields, and the built-in tuners' own wording.
        assert_eq!(
            named(
                &keys,
                "classArgs of Sweep: unknown field `optimze_mode`, expected `steps`"
            ),
            Some("optimze_mode".into())
        );
        assert_eq!(
            named(&keys, "classArgs of TPE: unknown argument \"optimze_mode\"; TPE takes seed, optimize_mode"),
            Some("optimze_mode".into())
        );
        assert_eq!(
            named(&keys, "classArgs of Sweep: steps must be at least 2"),
            Some("steps".into())
        );
        // `seed` inside `seeds` is not the argument `seed`.
        assert_eq!(named(&["seed"], "seeds must differ"), None);
        assert_eq!(named(&keys, "something else broke"), None);
    }

    /// `parse_class_args` writes the path of a nested key; the error points at that key.
    #[test]
    fn a_path_in_the_message_leads_to_the_nested_key() {
        let class_args = crate::config::yaml::parse(
            "seed: 1\ntpe_args:\n  n_startup_jobs: -5\n  gamma: 0.2\npoints:\n  - {x: 1}\n  - {x: true}\n",
        )
        .unwrap()
        .unwrap();
        let at = |message: &str| {
            let (path, node) = named_argument(&class_args, message)?;
            let pos = node.pos.unwrap();
            Some(format!("{path} at {}:{}", pos.line, pos.column))
        };
        let cases = [
            "classArgs of TPE: tpe_args.n_startup_jobs: expected a whole number ≥ 0, got -5",
            "classArgs of TPE: tpe_args: unknown field `gamma`, expected `n_startup_jobs`",
            "classArgs of X: points[1].x: expected a whole number, got true",
            "classArgs of X: points[1]: expected a mapping, got 3",
            // A path the file does not hold stops at the last key it does.
            "classArgs of TPE: tpe_args.n_ei_candidates: expected a number",
            "classArgs of X: points[7].x: expected a number",
            // An unknown top-level key is not looked for inside.
            "classArgs of TPE: unknown field `tpe_args`, expected `seed`",
            "classArgs of TPE: seed must be a whole number",
        ];
        let found: Vec<String> = cases
            .iter()
            .map(|message| at(message).unwrap_or_else(|| "none".into()))
            .collect();
        expect_test::expect![[r#"
            [
                "tpe_args.n_startup_jobs at 3:3",
                "tpe_args.gamma at 4:3",
                "points[1].x at 7:6",
                "points[1] at 7:5",
                "tpe_args at 2:1",
                "points at 5:1",
                "tpe_args at 2:1",
                "seed at 1:1",
            ]
        "#]]
        .assert_debug_eq(&found);
    }
}
