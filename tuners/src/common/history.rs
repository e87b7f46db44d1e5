//! The set of parameters objects a tuner has handed out or imported, for de-duplication.

use std::collections::HashSet;

use serde_json::Value;

/// Points already tried, keyed by a canonical text form (NNI keys by `nni.dump(params,
/// sort_keys=True)`; ours also ignores the spelling of numbers, see [`canonical`]).
#[derive(Debug, Default)]
pub(crate) struct History {
    seen: HashSet<String>,
}

impl History {
    /// Records `params`; `false` when it was already there.
    pub(crate) fn insert(&mut self, params: &Value) -> bool {
        self.seen.insert(canonical(params))
    }

    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

/// JSON text with object keys sorted and numbers written by value, so that `{"b": 2, "a": 1.0}`
/// and `{"a": 1, "b": 2.0}` are the same point: an imported trial may come from YAML, Python or
/// JavaScript, which disagree on which integers are floats.
pub(crate) fn canonical(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                let x = n.as_f64().unwrap_or(f64::NAN);
                // 2^63 is exact in f64: whole floats below it print as the integer they equal.
                const TWO_63: f64 = 9_223_372_036_854_775_808.0;
                if x.fract() == 0.0 && x.abs() < TWO_63 {
                    out.push_str(&(x as i64).to_string());
                } else {
                    // Debug prints the shortest text that reads back as the same f64.
                    out.push_str(&format!("{x:?}"));
                }
            }
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::canonical;
    use serde_json::json;

    #[test]
    fn key_order_and_number_spelling_do_not_matter() {
        let a = json!({"b": 2, "a": {"_name": "x", "lr": 0.5}, "c": -0.0});
        let b = json!({"a": {"lr": 0.5, "_name": "x"}, "c": 0, "b": 2.0});
        assert_eq!(canonical(&a), canonical(&b));
        assert_eq!(canonical(&a), r#"{"a":{"_name":"x","lr":0.5},"b":2,"c":0}"#);
        assert_ne!(
            canonical(&json!({"x": 0.1})),
            canonical(&json!({"x": 0.30000000000000004}))
        );
        assert_ne!(canonical(&json!({"x": "1"})), canonical(&json!({"x": 1})));
    }
}
