//! Tool calls written as text. Small and local models, and servers whose chat template has no
//! tool support, often answer a tool call as plain content: `{"name": "lookup", "arguments":
//! {...}}`, perhaps in a code fence or `<tool_call>` tags (Hermes / Qwen). When the whole answer
//! is such a call (or several) to offered tools, it is read as those calls; any other text is
//! left alone.

use serde_json::{Map, Value};

use super::ToolCall;

/// The calls `text` consists of, when it is nothing but calls to tools named in `offered`.
/// `turn` numbers the ids given to them.
pub fn parse(text: &str, offered: &[&str], turn: u32) -> Option<Vec<ToolCall>> {
    let bodies = split(text.trim())?;
    let mut calls = vec![];
    for body in bodies {
        let v: Value = serde_json::from_str(body).ok()?;
        let items = match v {
            Value::Array(a) if !a.is_empty() => a,
            one @ Value::Object(_) => vec![one],
            _ => return None,
        };
        for item in items {
            let (name, arguments) = call_of(item.as_object()?)?;
            if !offered.contains(&name.as_str()) {
                return None;
            }
            let id = format!("text_call_{turn}_{}", calls.len() + 1);
            calls.push(ToolCall { id, name, arguments });
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// The JSON bodies the text is made of: one `<tool_call>` block each, or one (optionally
/// fenced) JSON value. `None` when anything else is in the text.
fn split(text: &str) -> Option<Vec<&str>> {
    if text.starts_with("<tool_call>") {
        let mut out = vec![];
        let mut rest = text;
        while !rest.is_empty() {
            let inner = rest.strip_prefix("<tool_call>")?;
            let (body, after) = inner.split_once("</tool_call>")?;
            out.push(body.trim());
            rest = after.trim_start();
        }
        return Some(out);
    }
    let unfenced = match text.strip_prefix("```") {
        Some(f) => {
            let f = f.strip_prefix("json").or_else(|| f.strip_prefix("JSON")).unwrap_or(f);
            f.trim_start().strip_suffix("```")?.trim()
        }
        None => text,
    };
    (unfenced.starts_with('{') || unfenced.starts_with('[')).then_some(vec![unfenced])
}

/// `{"name", "arguments" | "parameters" | "input"}`, or `{"function": {"name", "arguments"}}`;
/// arguments may be an object or a JSON string of one.
fn call_of(o: &Map<String, Value>) -> Option<(String, Value)> {
    let o = match o.get("function").and_then(Value::as_object) {
        Some(f) if !o.contains_key("name") => f,
        _ => o,
    };
    let allowed = ["name", "arguments", "parameters", "input", "type", "id"];
    if o.keys().any(|k| !allowed.contains(&k.as_str())) {
        return None;
    }
    let name = o.get("name")?.as_str()?.to_string();
    let args = o.get("arguments").or_else(|| o.get("parameters")).or_else(|| o.get("input"));
    let arguments = match args {
        None => Value::Object(Map::new()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => return None,
    };
    Some((name, arguments))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OFFERED: &[&str] = &["lookup", "search"];

    #[test]
    fn the_forms_small_models_use_are_read_as_calls() {
        for text in [
            r#"{"name": "lookup", "arguments": {"q": "moons"}}"#,
            "```json\n{\"name\": \"lookup\", \"parameters\": {\"q\": \"moons\"}}\n```",
            "<tool_call>\n{\"name\": \"lookup\", \"arguments\": \"{\\\"q\\\": \\\"moons\\\"}\"}\n</tool_call>",
            r#"{"type": "function", "function": {"name": "lookup", "arguments": {"q": "moons"}}}"#,
        ] {
            let calls = parse(text, OFFERED, 2).unwrap_or_else(|| panic!("not read: {text}"));
            assert_eq!(
                calls,
                vec![ToolCall { id: "text_call_2_1".into(), name: "lookup".into(), arguments: json!({"q": "moons"}) }]
            );
        }
        let two = "<tool_call>{\"name\": \"lookup\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": 1}}</tool_call>";
        assert_eq!(parse(two, OFFERED, 1).unwrap().len(), 2);
    }

    #[test]
    fn anything_else_is_left_as_text() {
        for text in [
            r#"{"name": "delete_all", "arguments": {}}"#,
            r#"Here you go: {"name": "lookup", "arguments": {}}"#,
            r#"{"answer": 42}"#,
            r#"{"name": "lookup", "arguments": {"q": 1}, "note": "extra"}"#,
            r#"{"name": "lookup", "arguments": "{not json"}"#,
            "The moons of Jupiter number 95.",
            "",
        ] {
            assert!(parse(text, OFFERED, 1).is_none(), "read as a call: {text}");
        }
    }
}
