//! Claude Code's agent files as their authors wrote them: its own front-matter fields (kept, and
//! mapped where they mean something here), front matter that is YAML only in spirit, its tool
//! names (`Read`, `mcp__server__tool`) and how an operator maps them to tools here.

use std::collections::BTreeMap;

use serde_json::Value;

use super::agents::Approval;

/// Front-matter fields Claude Code defines that this service has no use for as such: kept as
/// written and shown (`claude_code` in `GET /agents/{name}`); `permissionMode` is also mapped.
pub const FIELDS: &[&str] = &[
    "color",
    "skills",
    "hooks",
    "mcpServers",
    "permissionMode",
    "memory",
    "background",
    "isolation",
    "effort",
    "initialPrompt",
    "disabled",
];

/// Claude Code's own tools: names that exist here only if a tenant registers a tool so named or
/// the config's `[tool_aliases]` maps them.
pub const BUILTIN_TOOLS: &[&str] = &[
    "Agent",
    "Bash",
    "BashOutput",
    "Edit",
    "ExitPlanMode",
    "Glob",
    "Grep",
    "KillShell",
    "LS",
    "MultiEdit",
    "NotebookEdit",
    "NotebookRead",
    "Read",
    "SlashCommand",
    "Task",
    "TodoWrite",
    "WebFetch",
    "WebSearch",
    "Write",
];

/// What Claude Code's `permissionMode` means here, when the definition sets no `approval`:
/// `default` and `acceptEdits` ask before side effects (`propose`: this service cannot tell an
/// edit from another write), `bypassPermissions` and `dontAsk` run what the agent is given
/// (`none`: its `tools` list is the pre-approval), `plan` is read-only (only `auto` tools).
pub fn permission_mode(mode: &str) -> Option<(Option<Approval>, bool)> {
    match mode {
        "default" | "acceptEdits" => Some((Some(Approval::Propose), false)),
        "bypassPermissions" | "dontAsk" => Some((Some(Approval::None), false)),
        "plan" => Some((None, true)),
        _ => None,
    }
}

/// Claude Code's tools that are built-in tools here: `WebFetch` is `web_fetch`, `WebSearch` is
/// `web_search`, and over a task's workspace `Read` is `read_file`, `Glob` is `glob`, `Grep` is
/// `grep`, `LS` is `list_directory`, and on the task's own copy `Write` is `write_file`, `Edit` is
/// `edit_file`, `Bash` is `run_command` (in the sandbox).
pub fn builtin(name: &str) -> Option<crate::kinds::BuiltinTool> {
    crate::tools::builtin::by_claude_code_name(name)
}

/// The tool a definition's tool name means here: the operator's alias (`[tool_aliases]` wins
/// over everything, so `WebFetch = "WebFetch"` reaches a tenant tool literally so named), else
/// the built-in Claude Code's name means (`WebFetch` → `web_fetch`), else Claude Code's MCP form
/// `mcp__<server>__<tool>` as `<source>__<tool>`, else the name itself.
pub fn tool_name(name: &str, aliases: &BTreeMap<String, String>) -> String {
    if let Some(to) = aliases.get(name) {
        return to.clone();
    }
    if let Some(b) = builtin(name) {
        return b.as_str().to_string();
    }
    match name.strip_prefix("mcp__") {
        Some(rest) if rest.contains("__") => rest.to_string(),
        _ => name.to_string(),
    }
}

/// `tool_name` of each of `names`, without repeats.
pub fn tool_names(names: &[String], aliases: &BTreeMap<String, String>) -> Vec<String> {
    let mut out: Vec<String> = vec![];
    for n in names {
        let t = tool_name(n, aliases);
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// Front matter that is not valid YAML, read as simple `key: value` lines: the first `: ` of a
/// line splits it (so a description may hold `: `), each value is read as YAML if it can be and
/// as text if it fails only for holding `: ` itself, and `- item` lines under an empty key make
/// a list. `None` when the text is not of that shape (then its YAML error stands).
pub fn lenient_front_matter(yaml: &str) -> Option<serde_yaml::Mapping> {
    let mut map = serde_yaml::Mapping::new();
    let mut last: Option<String> = None;
    for raw in yaml.lines() {
        let line = raw.trim_end();
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t', '-']) {
            // A list item or a continuation of the key above.
            let key = last.clone()?;
            let entry = map.get_mut(key.as_str())?;
            let item = line.trim_start();
            if let Some(v) = item.strip_prefix("- ").or_else(|| (item == "-").then_some("")) {
                match entry {
                    serde_yaml::Value::Null => *entry = serde_yaml::Value::Sequence(vec![scalar(v.trim())?]),
                    serde_yaml::Value::Sequence(s) => s.push(scalar(v.trim())?),
                    _ => return None,
                }
            } else {
                match entry {
                    serde_yaml::Value::String(s) => {
                        s.push(' ');
                        s.push_str(item);
                    }
                    _ => return None,
                }
            }
            continue;
        }
        let (key, value) = match line.split_once(": ") {
            Some((k, v)) => (k, v.trim()),
            None => (line.strip_suffix(':')?, ""),
        };
        let ok_key = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok_key || map.contains_key(key) {
            return None;
        }
        let v = if value.is_empty() { serde_yaml::Value::Null } else { scalar(value)? };
        map.insert(serde_yaml::Value::String(key.to_string()), v);
        last = Some(key.to_string());
    }
    Some(map)
}

/// A value as YAML when it reads as a scalar or a flow list, else as the text it is when what
/// stops it is a `: ` inside (`None` otherwise).
fn scalar(v: &str) -> Option<serde_yaml::Value> {
    match serde_yaml::from_str::<serde_yaml::Value>(v) {
        Ok(
            y @ (serde_yaml::Value::String(_)
            | serde_yaml::Value::Number(_)
            | serde_yaml::Value::Bool(_)
            | serde_yaml::Value::Sequence(_)),
        ) => Some(y),
        _ if v.contains(": ") => Some(serde_yaml::Value::String(v.to_string())),
        _ => None,
    }
}

/// A kept field's value as JSON (YAML's tags and non-string keys have no JSON form: as text).
pub fn to_json(v: &serde_yaml::Value) -> Value {
    serde_json::to_value(v).unwrap_or_else(|_| Value::String(serde_yaml::to_string(v).unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_with_a_colon_reads_leniently_and_values_keep_their_types() {
        let m = lenient_front_matter(
            "name: ts-pro\ndescription: Use this agent when: the code is TypeScript. Example: x\ntools: Read, Grep\nmaxTurns: 7\nskills:\n  - a\n  - b\n",
        )
        .unwrap();
        assert_eq!(m["description"], "Use this agent when: the code is TypeScript. Example: x");
        assert_eq!(m["tools"], "Read, Grep");
        assert_eq!(m["maxTurns"], 7);
        assert_eq!(m["skills"], serde_yaml::to_value(["a", "b"]).unwrap());
        assert!(lenient_front_matter("just words\n").is_none());
        assert!(lenient_front_matter("name: [unclosed\n").is_none(), "only a `: ` is forgiven");
        assert!(lenient_front_matter("name: a\nname: b\n").is_none(), "a repeated key is not guessed at");
    }

    #[test]
    fn tool_names_map_through_aliases_and_the_mcp_form() {
        let aliases = BTreeMap::from([("Read".to_string(), "docs__read".to_string())]);
        assert_eq!(tool_name("Read", &aliases), "docs__read");
        assert_eq!(tool_name("mcp__github__create_issue", &aliases), "github__create_issue");
        assert_eq!(tool_name("mcp__odd", &aliases), "mcp__odd");
        assert_eq!(tool_name("lookup", &aliases), "lookup");
        let names = ["Read".to_string(), "docs__read".to_string()];
        assert_eq!(tool_names(&names, &aliases), ["docs__read"]);
        assert_eq!(tool_name("WebFetch", &aliases), "web_fetch");
        assert_eq!(tool_name("WebSearch", &aliases), "web_search");
        let none = BTreeMap::new();
        assert_eq!(tool_name("Read", &none), "read_file");
        assert_eq!(tool_name("LS", &none), "list_directory");
        let own = BTreeMap::from([("WebFetch".to_string(), "WebFetch".to_string())]);
        assert_eq!(tool_name("WebFetch", &own), "WebFetch", "an operator's alias wins over the built-in");
    }

    #[test]
    fn permission_modes_map_to_approval_or_read_only() {
        assert_eq!(permission_mode("default"), Some((Some(Approval::Propose), false)));
        assert_eq!(permission_mode("bypassPermissions"), Some((Some(Approval::None), false)));
        assert_eq!(permission_mode("plan"), Some((None, true)));
        assert_eq!(permission_mode("yolo"), None);
    }
}
