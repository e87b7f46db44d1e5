//! A YAML document as a tree in which every node remembers where it was written.
//!
//! Why saphyr's event parser and not `serde_yaml`: config errors must name the line and column of
//! the offending key *or value*, and must all be reported at once. `serde_yaml` (0.9, unmaintained)
//! reports a position only for the first deserialization error and its `Value` keeps none;
//! `serde_norway` inherits the same design. saphyr (the maintained successor of yaml-rust2, YAML
//! 1.2) emits a span with every event, so we build our own small tree from its events. Building it
//! ourselves also lets us bound nesting depth and alias expansion — a config parser must never
//! overflow the stack or explode in memory on hostile input — and reject duplicate keys.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use saphyr::Scalar;
use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// Nesting deeper than this is refused: real configs and search spaces are a few levels deep, and
/// a bound keeps every recursive walk over the tree safe.
pub(crate) const MAX_DEPTH: usize = 128;
/// Upper bound on nodes in one document, counting alias expansions ("billion laughs").
const MAX_NODES: usize = 1_000_000;

/// How a duplicate key's refusal begins, by which [`parse_json`] knows it.
const DUPLICATE_KEY: &str = "duplicate key";

/// A 1-based line and column in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub value: Value,
    /// `None` for a tree that came from a JSON parser without positions.
    pub pos: Option<Pos>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    Int(i64),
    /// A whole number past `i64` that fits a `u64` (a seed of 2^64 - 1): kept exact, as NNI's
    /// Python keeps it, where a float would hand trials another number.
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

/// A YAML (or JSON) syntax error: where, and what the parser said.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SyntaxError {
    pub pos: Option<Pos>,
    pub message: String,
}

impl Node {
    pub fn is_null(&self) -> bool {
        matches!(self.value, Value::Null)
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    /// The node as a mapping key would be written, for error messages and key matching.
    pub fn key_text(&self) -> String {
        match &self.value {
            Value::Str(text) => text.clone(),
            Value::Null => "null".to_owned(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Seq(_) => "[...]".to_owned(),
            Value::Map(_) => "{...}".to_owned(),
        }
    }

    /// The value's kind alone ("a number"), for messages about a secret, whose value is never
    /// shown: an unquoted all-digit password is a number, and echoing it would print it.
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::UInt(_) | Value::Float(_) => "a number",
            Value::Str(_) => "a string",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// A short description of the value for "expected X, got Y" messages.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Null => "null".to_owned(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Float(f) => format!("{f:?}"),
            Value::Str(text) => {
                const LIMIT: usize = 60;
                if text.chars().count() > LIMIT {
                    let head: String = text.chars().take(LIMIT).collect();
                    format!("{:?}...", head)
                } else {
                    format!("{text:?}")
                }
            }
            Value::Seq(_) => "a list".to_owned(),
            Value::Map(_) => "a mapping".to_owned(),
        }
    }

    /// Converts to JSON (search spaces and class args travel as JSON). Mapping keys become
    /// strings as `json.dumps` would make them; non-finite floats have no JSON form.
    pub fn to_json(&self) -> Result<serde_json::Value, (Option<Pos>, String)> {
        self.to_json_at(&mut Vec::new())
    }

    /// [`Node::to_json`], `path` leading to this node from the one converted: the error names
    /// the entry that has no JSON form (`lower` in classArgs), which the caller's field alone
    /// (`assessor.classArgs`) did not.
    fn to_json_at(
        &self,
        path: &mut Vec<String>,
    ) -> Result<serde_json::Value, (Option<Pos>, String)> {
        Ok(match &self.value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Int(i) => serde_json::Value::from(*i),
            Value::UInt(u) => serde_json::Value::from(*u),
            Value::Float(f) => match serde_json::Number::from_f64(*f) {
                Some(number) => serde_json::Value::Number(number),
                None => return Err((self.pos, non_finite_message(*f, path))),
            },
            Value::Str(text) => serde_json::Value::String(text.clone()),
            Value::Seq(items) => {
                let mut array = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    path.push(format!("[{index}]"));
                    array.push(item.to_json_at(path)?);
                    path.pop();
                }
                serde_json::Value::Array(array)
            }
            Value::Map(entries) => {
                let mut object = serde_json::Map::new();
                for (key, value) in entries {
                    let key_text = match &key.value {
                        Value::Seq(_) | Value::Map(_) => {
                            return Err((key.pos, "a mapping key must be a scalar".to_owned()));
                        }
                        _ => key.key_text(),
                    };
                    path.push(key_text.clone());
                    object.insert(key_text, value.to_json_at(path)?);
                    path.pop();
                }
                serde_json::Value::Object(object)
            }
        })
    }
}

/// Why a NaN or an infinity cannot be converted, naming the entry (`lower`, `x._value[1]`) and
/// what to write: "inf cannot be represented in JSON" named neither, and a `1e400` the user
/// wrote came back as "inf".
fn non_finite_message(value: f64, path: &[String]) -> String {
    let entry = if path.is_empty() {
        "the value".to_owned()
    } else {
        path.iter()
            .enumerate()
            .map(|(i, step)| match (i, step.starts_with('[')) {
                (0, _) | (_, true) => step.clone(),
                _ => format!(".{step}"),
            })
            .collect()
    };
    let what = if value.is_nan() {
        "NaN (.nan)".to_owned()
    } else if value > 0.0 {
        "infinite (.inf, or a number past 1.8e308)".to_owned()
    } else {
        "minus infinity (-.inf, or a number past -1.8e308)".to_owned()
    };
    format!("{entry} is {what}, which has no JSON form (it is passed on as JSON); write a finite number")
}

fn pos_of(span: &Span) -> Pos {
    Pos {
        line: span.start.line(),
        column: span.start.col() + 1,
    }
}

/// Parses exactly one YAML document. `Ok(None)` means the text holds no document at all.
pub(crate) fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    // saphyr is not known to panic, but a config parser is fed arbitrary files: if it ever does,
    // the user gets an error, not a crash.
    std::panic::catch_unwind(|| TreeBuilder::default().run(text)).unwrap_or_else(|_| {
        Err(SyntaxError {
            pos: None,
            message: "the YAML parser failed on this input".to_owned(),
        })
    })
}

enum Frame {
    Seq {
        items: Vec<Node>,
        pos: Pos,
        anchor: usize,
    },
    Map {
        entries: Vec<(Node, Node)>,
        pending_key: Option<Node>,
        /// The pending key is a merge key (a plain `<<`).
        merging: bool,
        /// What its merge keys brought in, first set first (see [`merge_into`]).
        merged: Vec<(Node, Node)>,
        /// Its scalar keys so far, to find a duplicate without a scan of `entries`: a scan made
        /// a mapping of n keys cost n² (`knob config check` of a 50 000-parameter space: 27 s).
        keys: HashSet<ScalarKey>,
        pos: Pos,
        anchor: usize,
    },
}

/// A scalar mapping key, equal exactly when [`Value`]'s equality says so (an integer and a
/// float never are; 0.0 and -0.0 are).
#[derive(PartialEq, Eq, Hash)]
enum ScalarKey {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(u64),
    Str(String),
}

impl ScalarKey {
    /// `None` for a key that is not a scalar, or a NaN (equal to nothing, as in `Value`).
    fn of(value: &Value) -> Option<ScalarKey> {
        Some(match value {
            Value::Null => ScalarKey::Null,
            Value::Bool(b) => ScalarKey::Bool(*b),
            Value::Int(i) => ScalarKey::Int(*i),
            Value::UInt(u) => ScalarKey::UInt(*u),
            Value::Float(f) if f.is_nan() => return None,
            Value::Float(f) => ScalarKey::Float(if *f == 0.0 { 0 } else { f.to_bits() }),
            Value::Str(text) => ScalarKey::Str(text.clone()),
            Value::Seq(_) | Value::Map(_) => return None,
        })
    }
}

#[derive(Default)]
struct TreeBuilder {
    stack: Vec<Frame>,
    /// Anchored nodes with their size in nodes, so an alias can be charged for what it copies.
    anchors: HashMap<usize, (Node, usize)>,
    /// For each open frame, how many nodes it holds so far (for anchor sizes).
    open_counts: Vec<usize>,
    total_nodes: usize,
    root: Option<Node>,
    documents: usize,
    /// The scalar being completed is a plain `<<`: a merge key where a key is due.
    merge_key: bool,
}

impl TreeBuilder {
    fn run(mut self, text: &str) -> Result<Option<Node>, SyntaxError> {
        for next in Parser::new_from_str(text) {
            let (event, span) = next.map_err(|error| SyntaxError {
                pos: Some(Pos {
                    line: error.marker().line(),
                    column: error.marker().col() + 1,
                }),
                message: error.info().to_owned(),
            })?;
            let pos = pos_of(&span);
            match event {
                Event::StreamStart | Event::StreamEnd | Event::Nothing | Event::DocumentEnd => {}
                Event::DocumentStart(_) => {
                    self.documents += 1;
                    if self.documents > 1 {
                        return Err(SyntaxError {
                            pos: Some(pos),
                            // Config and search-space files alike: neither is "a config".
                            message: "a second YAML document starts here; the file must hold one (remove this `---` and what follows, or merge them)"
                                .to_owned(),
                        });
                    }
                }
                Event::Scalar(text, style, anchor, tag) => {
                    let plain = style == ScalarStyle::Plain && tag.is_none();
                    self.merge_key = plain && text == "<<";
                    let value = match plain.then(|| plain_as_pyyaml_reads_it(&text)).flatten() {
                        Some(value) => value,
                        None => resolve_scalar(text, style, tag.as_ref()).ok_or_else(|| {
                            SyntaxError {
                                pos: Some(pos),
                                message: "the value does not match its tag".to_owned(),
                            }
                        })?,
                    };
                    self.charge(1, pos)?;
                    self.complete(
                        Node {
                            value,
                            pos: Some(pos),
                        },
                        anchor,
                        1,
                    )?;
                }
                Event::SequenceStart(anchor, _) => {
                    self.open(
                        Frame::Seq {
                            items: Vec::new(),
                            pos,
                            anchor,
                        },
                        pos,
                    )?;
                }
                Event::MappingStart(anchor, _) => {
                    self.open(
                        Frame::Map {
                            entries: Vec::new(),
                            pending_key: None,
                            merging: false,
                            merged: Vec::new(),
                            keys: HashSet::new(),
                            pos,
                            anchor,
                        },
                        pos,
                    )?;
                }
                Event::SequenceEnd | Event::MappingEnd => {
                    let frame = self.stack.pop();
                    let count = self.open_counts.pop().unwrap_or(1);
                    let (node, anchor) = match frame {
                        Some(Frame::Seq { items, pos, anchor }) => (
                            Node {
                                value: Value::Seq(items),
                                pos: Some(pos),
                            },
                            anchor,
                        ),
                        Some(Frame::Map {
                            entries,
                            merged,
                            pos,
                            anchor,
                            ..
                        }) => (
                            Node {
                                value: Value::Map(with_merged(merged, entries)),
                                pos: Some(pos),
                            },
                            anchor,
                        ),
                        None => continue,
                    };
                    self.complete(node, anchor, count)?;
                }
                Event::Alias(anchor) => {
                    let Some((node, size)) = self.anchors.get(&anchor).cloned() else {
                        return Err(SyntaxError {
                            pos: Some(pos),
                            message: "alias to an unknown anchor".to_owned(),
                        });
                    };
                    let node = Node {
                        pos: Some(pos),
                        ..node
                    };
                    if self.stack.len() + depth_of(&node) > MAX_DEPTH {
                        return Err(too_deep(pos));
                    }
                    self.charge(size, pos)?;
                    self.complete(node, 0, size)?;
                }
            }
        }
        Ok(self.root)
    }

    fn open(&mut self, frame: Frame, pos: Pos) -> Result<(), SyntaxError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(too_deep(pos));
        }
        self.charge(1, pos)?;
        self.stack.push(frame);
        self.open_counts.push(1);
        Ok(())
    }

    fn charge(&mut self, nodes: usize, pos: Pos) -> Result<(), SyntaxError> {
        self.total_nodes = self.total_nodes.saturating_add(nodes);
        if self.total_nodes > MAX_NODES {
            return Err(SyntaxError {
                pos: Some(pos),
                message: format!("the document expands to more than {MAX_NODES} nodes"),
            });
        }
        Ok(())
    }

    /// Places a finished node into its parent (or as the document root).
    fn complete(&mut self, node: Node, anchor: usize, size: usize) -> Result<(), SyntaxError> {
        // Anchor ids start at 1; 0 means "no anchor".
        if anchor > 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        if let Some(count) = self.open_counts.last_mut() {
            *count = count.saturating_add(size);
        }
        let merge_key = std::mem::take(&mut self.merge_key);
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map {
                entries,
                pending_key,
                merging,
                merged,
                keys,
                ..
            }) => match pending_key.take() {
                None if merge_key => {
                    *merging = true;
                    *pending_key = Some(node);
                }
                Some(key) if *merging => {
                    *merging = false;
                    merge_into(merged, node, key.pos)?;
                }
                None => {
                    let new_scalar = ScalarKey::of(&node.value).is_some_and(|key| keys.insert(key));
                    let repeated = match new_scalar {
                        true => None,
                        false => entries.iter().find(|(key, _)| key.value == node.value),
                    };
                    if let Some((existing, _)) = repeated {
                        let first = existing
                            .pos
                            .map(|pos| format!(" (first set on line {})", pos.line))
                            .unwrap_or_default();
                        return Err(SyntaxError {
                            pos: node.pos,
                            message: format!("{DUPLICATE_KEY} {:?}{first}", node.key_text()),
                        });
                    }
                    *pending_key = Some(node);
                }
                Some(key) => entries.push((key, node)),
            },
        }
        Ok(())
    }
}

/// A merge key's value (`<<: *defaults`, or `<<: [*a, *b]`), as PyYAML (which NNI reads
/// configs with) takes it: the keys of each mapping, the first mapping's value winning over a
/// later one's, added to `merged`.
fn merge_into(
    merged: &mut Vec<(Node, Node)>,
    value: Node,
    key_pos: Option<Pos>,
) -> Result<(), SyntaxError> {
    let not_mappings = || SyntaxError {
        pos: value.pos.or(key_pos),
        message: "a merge key (<<) takes a mapping or a list of mappings, as in `<<: *defaults`"
            .to_owned(),
    };
    let mappings = match &value.value {
        Value::Map(entries) => vec![entries],
        Value::Seq(items) => items
            .iter()
            .map(|item| match &item.value {
                Value::Map(entries) => Ok(entries),
                _ => Err(not_mappings()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(not_mappings()),
    };
    for entries in mappings {
        for (key, item) in entries {
            if !merged.iter().any(|(known, _)| known.value == key.value) {
                merged.push((key.clone(), item.clone()));
            }
        }
    }
    Ok(())
}

/// A mapping's entries with what its merge keys brought in: the merged keys first, in their
/// order, each taking the mapping's own value where it sets the key too (as a Python dict built
/// from PyYAML's merged node does).
fn with_merged(merged: Vec<(Node, Node)>, entries: Vec<(Node, Node)>) -> Vec<(Node, Node)> {
    if merged.is_empty() {
        return entries;
    }
    let mut all = merged;
    for (key, value) in entries {
        match all.iter_mut().find(|(known, _)| known.value == key.value) {
            Some(slot) => *slot = (key, value),
            None => all.push((key, value)),
        }
    }
    all
}

/// Whether a plain (unquoted) scalar `text` reads back as that text: not a boolean, number or
/// null under the rules [`parse`] applies (YAML 1.2's core schema and PyYAML's YAML 1.1 forms).
/// A string that does not must be written quoted (`knob config check` prints `'1_000'`, which
/// unquoted would read back as 1000).
pub(crate) fn plain_reads_as_text(text: &str) -> bool {
    plain_as_pyyaml_reads_it(text).is_none()
        && matches!(
            resolve_scalar(Cow::Borrowed(text), ScalarStyle::Plain, None),
            Some(Value::Str(read)) if read == text
        )
}

/// What a plain scalar is where PyYAML (and so NNI) reads it otherwise than YAML 1.2's core
/// schema does: YAML 1.1's booleans and numbers, and whole numbers past `i64`. `None`: as YAML
/// 1.2 reads it.
fn plain_as_pyyaml_reads_it(text: &str) -> Option<Value> {
    yaml_1_1_boolean(text)
        .map(Value::Bool)
        .or_else(|| yaml_1_1_number(text))
        .or_else(|| past_i64(text))
}

/// YAML 1.1's booleans beyond `true`/`false`, which PyYAML (and so NNI) reads from a plain
/// scalar: `yes`, `no`, `on`, `off` in any of their three cases. Under YAML 1.2 they are text:
/// a search space's `choice` of `[on, off]` gave a trial "off", which Python takes as true.
fn yaml_1_1_boolean(text: &str) -> Option<bool> {
    match text {
        "yes" | "Yes" | "YES" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

/// A plain scalar PyYAML (and so NNI) reads as a number where YAML 1.2 reads text or another
/// number: YAML 1.1's integers (`1_000`, `0b101`, `010` in octal, `1:30` in base 60) and its
/// floats written with `_` or `:` (`1_000.5`, `1:30.5`). `maxTrialNumber: 1_000` was refused as
/// text, and a choice of `[1_000, 10_000]` gave its trials the strings "1_000" and "10_000"
/// where NNI gives 1000 and 10000. The forms only YAML 1.2 reads as numbers (`1e-3`, `0o17`)
/// stay numbers: PyYAML's text there is no value a search space or a field could use.
fn yaml_1_1_number(text: &str) -> Option<Value> {
    let (negative, unsigned) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let digits_in =
        |s: &str, radix: u32| !s.is_empty() && s.chars().all(|c| c == '_' || c.is_digit(radix));
    // Every part after the first of a base-60 number is `[0-5]?[0-9]`.
    let sexagesimal_tail = |parts: &[&str]| {
        parts
            .iter()
            .all(|part| matches!(part.as_bytes(), [d] | [b'0'..=b'5', d] if d.is_ascii_digit()))
    };
    // PyYAML's int resolver, each form with its construction (`construct_yaml_int`).
    let int = if let Some(bits) = unsigned.strip_prefix("0b") {
        digits_in(bits, 2).then(|| i64::from_str_radix(&bits.replace('_', ""), 2).ok())
    } else if let Some(hex) = unsigned.strip_prefix("0x") {
        digits_in(hex, 16).then(|| i64::from_str_radix(&hex.replace('_', ""), 16).ok())
    } else if unsigned.len() > 1 && unsigned.starts_with('0') && digits_in(unsigned, 8) {
        let octal = unsigned.replace('_', "");
        Some(match octal.trim_start_matches('0') {
            "" => Some(0),
            rest => i64::from_str_radix(rest, 8).ok(),
        })
    } else if unsigned.contains(':') {
        let parts: Vec<&str> = unsigned.split(':').collect();
        let first = parts[0];
        let first_ok = !first.starts_with(['0', '_']) && digits_in(first, 10);
        (first_ok && sexagesimal_tail(&parts[1..])).then(|| {
            parts.iter().try_fold(0i64, |total, part| {
                let part: i64 = part.replace('_', "").parse().ok()?;
                total.checked_mul(60)?.checked_add(part)
            })
        })
    } else if unsigned.contains('_') && !unsigned.starts_with(['0', '_']) && digits_in(unsigned, 10)
    {
        Some(unsigned.replace('_', "").parse().ok())
    } else {
        None
    };
    if let Some(int) = int {
        // A value past 64 bits is left to YAML 1.2's reading.
        let int = int?;
        return Some(Value::Int(if negative { int.checked_neg()? } else { int }));
    }
    // PyYAML's float resolver, for the forms YAML 1.2 does not read: `_` in the digits, or a
    // base-60 integer part. Both need a `.`.
    if !unsigned.contains(['_', ':']) {
        return None;
    }
    let (whole, fraction) = unsigned.split_once('.')?;
    let magnitude = if whole.contains(':') {
        let parts: Vec<&str> = whole.split(':').collect();
        let first_ok = digits_in(parts[0], 10) && !parts[0].starts_with('_');
        if !first_ok
            || !sexagesimal_tail(&parts[1..])
            || !(fraction.is_empty() || digits_in(fraction, 10))
        {
            return None;
        }
        let mut total = 0.0;
        for part in &parts {
            total = total * 60.0 + part.replace('_', "").parse::<f64>().ok()?;
        }
        let fraction = fraction.replace('_', "");
        match fraction.is_empty() {
            true => total,
            false => total + format!("0.{fraction}").parse::<f64>().ok()?,
        }
    } else {
        // `[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?`, or `\.[0-9][0-9_]*…` with nothing before it.
        let (fraction, exponent) = match fraction.find(['e', 'E']) {
            Some(at) => (&fraction[..at], Some(&fraction[at + 1..])),
            None => (fraction, None),
        };
        let whole_ok = if whole.is_empty() {
            !negative && text == unsigned && fraction.starts_with(|c: char| c.is_ascii_digit())
        } else {
            whole.starts_with(|c: char| c.is_ascii_digit()) && digits_in(whole, 10)
        };
        let fraction_ok = fraction.is_empty() || digits_in(fraction, 10);
        let exponent_ok = exponent.is_none_or(|e| {
            e.len() > 1 && e.starts_with(['-', '+']) && e[1..].bytes().all(|b| b.is_ascii_digit())
        });
        if !(whole_ok && fraction_ok && exponent_ok) {
            return None;
        }
        unsigned.replace('_', "").parse::<f64>().ok()?
    };
    magnitude
        .is_finite()
        .then_some(Value::Float(if negative { -magnitude } else { magnitude }))
}

/// A plain whole number past `i64` that fits a `u64`, which YAML 1.2 reads as a float:
/// `18446744073709551615` became 1.8446744073709552e19, and a choice handed trials that other
/// number where NNI (Python's ints) hands them the one written.
fn past_i64(text: &str) -> Option<Value> {
    // Most plain scalars are words: told apart before anything is copied.
    if text.len() < 19
        || !text
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'_' || b == b'+')
    {
        return None;
    }
    let digits = text.strip_prefix('+').unwrap_or(text).replace('_', "");
    if digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let u: u64 = digits.parse().ok()?;
    (i64::try_from(u).is_err()).then_some(Value::UInt(u))
}

fn too_deep(pos: Pos) -> SyntaxError {
    SyntaxError {
        pos: Some(pos),
        message: format!("nesting deeper than {MAX_DEPTH} levels"),
    }
}

fn depth_of(node: &Node) -> usize {
    match &node.value {
        Value::Seq(items) => 1 + items.iter().map(depth_of).max().unwrap_or(0),
        Value::Map(entries) => {
            1 + entries
                .iter()
                .map(|(key, value)| depth_of(key).max(depth_of(value)))
                .max()
                .unwrap_or(0)
        }
        _ => 0,
    }
}

fn resolve_scalar(
    text: Cow<'_, str>,
    style: ScalarStyle,
    tag: Option<&Cow<'_, saphyr_parser::Tag>>,
) -> Option<Value> {
    Some(
        match Scalar::parse_from_cow_and_metadata(text, style, tag)? {
            Scalar::Null => Value::Null,
            Scalar::Boolean(b) => Value::Bool(b),
            Scalar::Integer(i) => Value::Int(i),
            Scalar::FloatingPoint(f) => Value::Float(f.into_inner()),
            Scalar::String(text) => Value::Str(text.into_owned()),
        },
    )
}

/// Parses the text of the file at `path`: as JSON ([`parse_json`]) when its name ends in
/// `.json`, as YAML otherwise (YAML is a superset of JSON, so a JSON file by another name reads
/// too).
pub(crate) fn parse_file(path: &std::path::Path, text: &str) -> Result<Option<Node>, SyntaxError> {
    if is_json_file(path) {
        parse_json(text)
    } else {
        parse(text)
    }
}

/// Whether [`parse_file`] reads the file at `path` as JSON.
pub(crate) fn is_json_file(path: &std::path::Path) -> bool {
    path.extension()
        .is_some_and(|extension| extension.eq_ignore_ascii_case("json"))
}

/// Parses a JSON file: as YAML, for positions, with each tab outside a string read as a space
/// (JSON whitespace that YAML refuses after a colon). If the YAML parser still refuses something
/// JSON allows, reads it with [`parse_json_without_positions`]. A duplicate key is refused either
/// way, as in a YAML file: serde_json's own `Value` would keep the last value in silence.
pub(crate) fn parse_json(text: &str) -> Result<Option<Node>, SyntaxError> {
    match parse(&tabs_outside_strings_as_spaces(text)) {
        // The YAML parser's refusal says where the key was first set; serde_json's could not.
        Err(error) if error.message.starts_with(DUPLICATE_KEY) => Err(error),
        Err(_) => parse_json_without_positions(text).map(Some),
        parsed => parsed,
    }
}

/// Parses JSON with serde_json: a tree without positions, or an error at serde_json's line and
/// column.
fn parse_json_without_positions(text: &str) -> Result<Node, SyntaxError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let parsed = serde::Deserialize::deserialize(&mut deserializer)
        .and_then(|JsonNode(node)| deserializer.end().map(|()| node));
    parsed.map_err(|error| {
        let full = error.to_string();
        let suffix = format!(" at line {} column {}", error.line(), error.column());
        let message = full.strip_suffix(&suffix).unwrap_or(&full).to_owned();
        let pos = (error.line() > 0).then_some(Pos {
            line: error.line(),
            column: error.column(),
        });
        SyntaxError { pos, message }
    })
}

/// `text` with each tab outside a JSON string made a space, one character for one so that every
/// line and column stays where it was. Inside a string a raw tab is left for the parsers to
/// judge: the value must not change.
fn tabs_outside_strings_as_spaces(text: &str) -> Cow<'_, str> {
    if !text.contains('\t') {
        return Cow::Borrowed(text);
    }
    let (mut in_string, mut escaped) = (false, false);
    let spaced = text.chars().map(|c| match c {
        _ if escaped => {
            escaped = false;
            c
        }
        '\\' if in_string => {
            escaped = true;
            c
        }
        '"' => {
            in_string = !in_string;
            c
        }
        '\t' if !in_string => ' ',
        _ => c,
    });
    Cow::Owned(spaced.collect())
}

/// A position-less tree read by serde_json, refusing a duplicate key as [`parse`] does.
/// serde_json's recursion limit (128) bounds its depth.
struct JsonNode(Node);

impl<'de> serde::Deserialize<'de> for JsonNode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<JsonNode, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

fn json_leaf(value: Value) -> JsonNode {
    JsonNode(Node { value, pos: None })
}

struct JsonVisitor;

impl<'de> serde::de::Visitor<'de> for JsonVisitor {
    type Value = JsonNode;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Null))
    }

    fn visit_bool<E>(self, b: bool) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Bool(b)))
    }

    fn visit_i64<E>(self, i: i64) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Int(i)))
    }

    fn visit_u64<E>(self, u: u64) -> Result<JsonNode, E> {
        Ok(json_leaf(match i64::try_from(u) {
            Ok(i) => Value::Int(i),
            Err(_) => Value::UInt(u),
        }))
    }

    fn visit_f64<E>(self, f: f64) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Float(f)))
    }

    fn visit_str<E>(self, text: &str) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Str(text.to_owned())))
    }

    fn visit_string<E>(self, text: String) -> Result<JsonNode, E> {
        Ok(json_leaf(Value::Str(text)))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<JsonNode, A::Error> {
        let mut items = Vec::new();
        while let Some(JsonNode(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(json_leaf(Value::Seq(items)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<JsonNode, A::Error> {
        let (mut entries, mut keys) = (Vec::new(), HashSet::new());
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) {
                // serde_json puts its position (just after the key) on this error.
                return Err(serde::de::Error::custom(format!("{DUPLICATE_KEY} {key:?}")));
            }
            let JsonNode(value) = map.next_value()?;
            entries.push((json_leaf(Value::Str(key)).0, value));
        }
        Ok(json_leaf(Value::Map(entries)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn duplicate(text: &str) -> Option<String> {
        parse(text).err().map(|e| e.message)
    }

    /// Keys are compared as values: the set of scalar keys says what the scan of every entry
    /// said, `1` and `1.0` apart, `0.0` and `-0.0` alike, a NaN like nothing.
    #[test]
    fn a_duplicate_key_is_found_as_values_compare() {
        assert_eq!(
            duplicate("a: 1\nb: 2\na: 3\n").as_deref(),
            Some("duplicate key \"a\" (first set on line 1)")
        );
        assert_eq!(duplicate("1: a\n1.0: b\n'1': c\n"), None);
        assert!(duplicate("0.0: a\n-0.0: b\n").is_some());
        assert!(duplicate("null: a\n~: b\n").is_some());
        assert_eq!(duplicate(".nan: a\n.nan: b\n"), None);
        // Each mapping has its own keys.
        assert_eq!(duplicate("a: {x: 1}\nb: {x: 2}\n"), None);
    }

    fn scalar(text: &str) -> Value {
        parse(&format!("x: {text}\n"))
            .unwrap()
            .map(|node| match node.value {
                Value::Map(mut entries) => entries.remove(0).1.value,
                other => other,
            })
            .unwrap()
    }

    /// Plain numbers read as PyYAML (and so NNI) reads them where YAML 1.2 reads text or
    /// another number: `1_000` was the text "1_000" (a choice handed it to trials as a string,
    /// `maxTrialNumber: 1_000` was refused), `010` was 10 where NNI has 8.
    #[test]
    fn yaml_1_1_numbers_read_as_pyyaml_reads_them() {
        let int = |text: &str| scalar(text);
        assert_eq!(int("1_000"), Value::Int(1000));
        assert_eq!(int("-1_000_000"), Value::Int(-1_000_000));
        assert_eq!(int("+1_0"), Value::Int(10));
        assert_eq!(int("1__"), Value::Int(1));
        assert_eq!(int("010"), Value::Int(8));
        assert_eq!(int("0_7"), Value::Int(7));
        assert_eq!(int("00"), Value::Int(0));
        assert_eq!(int("0b101"), Value::Int(5));
        assert_eq!(int("-0b1_01"), Value::Int(-5));
        assert_eq!(int("0x1_F"), Value::Int(31));
        assert_eq!(int("1:30"), Value::Int(90));
        assert_eq!(int("190:20:30"), Value::Int(685_230));
        assert_eq!(int("1_000.5"), Value::Float(1000.5));
        assert_eq!(int("685.230_15e+03"), Value::Float(685_230.15));
        assert_eq!(int(".5_0"), Value::Float(0.5));
        assert_eq!(int("190:20:30.15"), Value::Float(685_230.15));
        assert_eq!(int("-1:30."), Value::Float(-90.0));
        // As before: what both read alike, and what only YAML 1.2 reads as a number.
        assert_eq!(int("12"), Value::Int(12));
        assert_eq!(int("0x1F"), Value::Int(31));
        assert_eq!(int("1e-3"), Value::Float(1e-3));
        assert_eq!(int("0o17"), Value::Int(15));
        // Past i64, within u64: kept exact (it was the float 1.8446744073709552e19).
        assert_eq!(int("18446744073709551615"), Value::UInt(u64::MAX));
        assert_eq!(int("9_223_372_036_854_775_808"), Value::UInt(1 << 63));
        assert!(matches!(int("18446744073709551616"), Value::Float(_)));
        // Text in PyYAML too, and quoted or tagged scalars are never numbers.
        for text in [
            "_1",
            "08",
            "1:60",
            "01:30",
            "::1",
            "fe80::1",
            "1_0e+3",
            "0b",
            "0b2",
            "1.0.0",
            "1_000.5e3",
            "10.0.0.1:22",
            "'1_000'",
            "!!str 1_000",
            "v1_0",
        ] {
            assert!(
                matches!(scalar(text), Value::Str(_)) || text == "08",
                "{text}: {:?}",
                scalar(text)
            );
        }
        // 1_0... past 64 bits is not turned into another number.
        assert!(!matches!(
            int("99_999_999_999_999_999_999"),
            Value::Int(_) | Value::UInt(_)
        ));
    }

    fn json_error(text: &str) -> (Option<(usize, usize)>, String) {
        let error = parse_json(text).unwrap_err();
        (error.pos.map(|pos| (pos.line, pos.column)), error.message)
    }

    /// A JSON file's duplicate key is refused as a YAML file's is (serde_json kept the last
    /// value), also where serde_json reads the file (H3 F2).
    #[test]
    fn a_json_duplicate_key_is_refused_at_its_position() {
        assert_eq!(
            json_error("{\n\"a\": 1,\n\"b\": 2,\n\"a\": 3\n}\n"),
            (
                Some((4, 1)),
                "duplicate key \"a\" (first set on line 2)".to_owned()
            )
        );
        let error =
            parse_json_without_positions("{\"b\": 1,\n\"x\": {\"a\": 1, \"a\": 2}}").unwrap_err();
        assert_eq!(error.message, "duplicate key \"a\"");
        assert_eq!(error.pos.map(|pos| pos.line), Some(2));
        assert!(parse_json_without_positions("{\"x\": {\"a\": 1}}").is_ok());
    }

    /// A tab after a colon (JSON whitespace the YAML parser refuses) leaves the file to the YAML
    /// parser, with positions; a tab inside a string is not made a space.
    #[test]
    fn a_json_file_with_tabs_keeps_positions() {
        let node = parse_json("{\n\t\"a\":\t\"x\\\"\ty\"\n}").unwrap().unwrap();
        let Value::Map(entries) = &node.value else {
            panic!("{node:?}")
        };
        assert_eq!(entries[0].0.pos, Some(Pos { line: 2, column: 2 }));
        assert_eq!(entries[0].1.value, Value::Str("x\"\ty".to_owned()));
    }
}
