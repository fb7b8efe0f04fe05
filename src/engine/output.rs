//! Structured results: a task's (or its agent's) `output_schema`, the final answer read as one
//! JSON value and validated against it, and what the model is told when it does not match.

use serde_json::Value;

/// The largest schema accepted, serialized (a schema is sent with every call of the run).
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;

/// Errors listed back to the model (and in `invalid_output`), at most.
const MAX_ERRORS: usize = 10;

/// Is `schema` usable as an `output_schema`: a JSON Schema object describing an object (what
/// providers' structured outputs return), valid, and at most `MAX_SCHEMA_BYTES`?
pub fn check_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("must be a JSON Schema object".into());
    }
    let size = schema.to_string().len();
    if size > MAX_SCHEMA_BYTES {
        return Err(format!("is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted"));
    }
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(
            "must describe an object (`\"type\": \"object\"`): that is what providers' structured outputs return"
                .into(),
        );
    }
    jsonschema::validator_for(schema).map(|_| ()).map_err(|e| format!("is not a valid JSON Schema: {e}"))
}

/// A compiled `output_schema`.
pub struct OutputCheck {
    validator: jsonschema::Validator,
}

impl OutputCheck {
    /// `None` when the schema does not compile (it was checked at submission: not expected).
    pub fn new(schema: &Value) -> Option<OutputCheck> {
        jsonschema::validator_for(schema).ok().map(|validator| OutputCheck { validator })
    }

    /// The answer as the value it must be, or what is wrong with it (one line each).
    pub fn read(&self, answer: &str) -> Result<Value, Vec<String>> {
        let value = parse_json(answer).ok_or_else(|| {
            vec!["the answer is not a JSON value (give only the JSON, with no other text around it)".to_string()]
        })?;
        let errors: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(MAX_ERRORS)
            .map(|e| {
                let at = e.instance_path.to_string();
                format!("{}: {e}", if at.is_empty() { "(root)".to_string() } else { at })
            })
            .collect();
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(errors)
        }
    }
}

/// The JSON value of an answer: the whole text, else inside a Markdown code fence, else from
/// its first `{` to its last `}`.
fn parse_json(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(v) = serde_json::from_str(t) {
        return Some(v);
    }
    if let Some(start) = t.find("```") {
        let inner = &t[start + 3..];
        let inner = inner.split_once('\n').map_or(inner, |(first, rest)| {
            if first.trim().is_empty() || first.trim().eq_ignore_ascii_case("json") {
                rest
            } else {
                inner
            }
        });
        if let Some(end) = inner.find("```") {
            if let Ok(v) = serde_json::from_str(inner[..end].trim()) {
                return Some(v);
            }
        }
    }
    let (a, b) = (t.find('{')?, t.rfind('}')?);
    (a < b).then(|| serde_json::from_str(&t[a..=b]).ok()).flatten()
}

/// The system prompt's section about the final answer.
pub fn instructions(schema: &Value) -> String {
    format!(
        "## Final answer\nYour final answer must be one JSON value that validates against this JSON Schema, \
         given as your whole final message with no other text:\n{schema}"
    )
}

/// What the model is told when its final answer does not match.
pub fn repair_message(errors: &[String]) -> String {
    format!(
        "Your final answer does not match the required output schema:\n- {}\nGive your complete final answer again, \
         as one JSON value that matches the schema.",
        errors.join("\n- ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false})
    }

    #[test]
    fn answers_are_read_whole_fenced_or_embedded_and_errors_name_the_path() {
        let c = OutputCheck::new(&schema()).unwrap();
        assert_eq!(c.read(r#"{"n": 3}"#), Ok(json!({"n": 3})));
        assert_eq!(c.read("```json\n{\"n\": 4}\n```"), Ok(json!({"n": 4})));
        assert_eq!(c.read("Here it is: {\"n\": 5} — done."), Ok(json!({"n": 5})));
        let e = c.read(r#"{"n": "x"}"#).unwrap_err();
        assert!(e[0].starts_with("/n: "), "{e:?}");
        let e = c.read(r#"{}"#).unwrap_err();
        assert!(e[0].starts_with("(root): ") && e[0].contains("\"n\""), "{e:?}");
        assert!(c.read("no json here").unwrap_err()[0].contains("not a JSON value"));
    }

    #[test]
    fn a_schema_must_be_a_valid_object_schema_of_bounded_size() {
        assert!(check_schema(&schema()).is_ok());
        assert!(check_schema(&json!(true)).unwrap_err().contains("object"));
        assert!(check_schema(&json!({"type": "array"})).unwrap_err().contains("describe an object"));
        assert!(check_schema(&json!({"type": "object", "properties": {"a": {"type": "nope"}}}))
            .unwrap_err()
            .contains("not a valid JSON Schema"));
        let big = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(check_schema(&big).unwrap_err().contains("at most"));
    }
}
