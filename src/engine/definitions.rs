//! Custom agent definitions: Markdown with YAML front matter, compatible with
//! `.claude/agents/*.md` — `name`, `description`, `tools`, `disallowed_tools`, `model`,
//! `max_turns`, `approval`, `output_schema`, `fallback_models`, `fallback_on`; the body is the system prompt. Claude Code's own
//! fields are kept as written (`claude_code`), see `claude_code`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use serde::{Deserialize, Serialize};

use super::agents::{Approval, BUILTIN_NAMES, MAX_TURNS};

/// A custom agent's name: URL-safe, and not a built-in type's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AgentName(String);

impl AgentName {
    pub fn parse(name: &str) -> Result<AgentName, String> {
        check_name(name)?;
        Ok(AgentName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AgentName {
    type Error = String;
    fn try_from(s: String) -> Result<AgentName, String> {
        check_name(&s)?;
        Ok(AgentName(s))
    }
}

impl From<AgentName> for String {
    fn from(n: AgentName) -> String {
        n.0
    }
}

impl std::fmt::Display for AgentName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for AgentName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDefinition {
    pub name: AgentName,
    #[serde(default)]
    pub description: String,
    pub system_prompt: String,
    /// Allow-list of tool names; `None`: every tool the caller allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disallowed_tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// `max_tokens` of this agent's provider calls (wins over the model's and provider's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Which of its tool calls wait for a decision (wins over the tenant's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<Approval>,
    /// Only `auto` tools are offered (Claude Code's `permissionMode: plan`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The JSON Schema its final answer must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// The models its calls move to, in order, when their own cannot serve them (wins over the
    /// tenant's; a task's own wins over it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// Which failures move a call to the next model (default `unavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_on: Option<Vec<crate::kinds::FallbackWhen>>,
    /// Its tasks' priority among their tenant's queued tasks (wins over the tenant's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<crate::kinds::Priority>,
    /// Claude Code's own front-matter fields, kept as written.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claude_code: BTreeMap<String, Value>,
    /// What reading it noticed and did about it (front matter read leniently, a field mapped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notices: Vec<String>,
}

/// What is wrong with a definition, and where.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DefinitionError {
    /// The file, or `request`.
    pub source: String,
    pub field: Option<String>,
    pub message: String,
}

impl std::fmt::Display for DefinitionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.field {
            Some(field) => write!(f, "{}: {field}: {}", self.source, self.message),
            None => write!(f, "{}: {}", self.source, self.message),
        }
    }
}

/// `tools: Read, Grep` (Claude's comma string) or a YAML list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ToolList {
    Csv(String),
    List(Vec<String>),
}

impl ToolList {
    fn names(self) -> Vec<String> {
        match self {
            ToolList::Csv(s) => s.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect(),
            ToolList::List(v) => v.into_iter().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontMatter {
    name: Option<String>,
    description: Option<String>,
    tools: Option<ToolList>,
    #[serde(alias = "disallowedTools")]
    disallowed_tools: Option<ToolList>,
    model: Option<String>,
    #[serde(alias = "maxTurns")]
    max_turns: Option<i64>,
    #[serde(alias = "maxOutputTokens")]
    max_output_tokens: Option<i64>,
    approval: Option<String>,
    #[serde(alias = "readOnly")]
    read_only: Option<bool>,
    #[serde(alias = "outputSchema")]
    output_schema: Option<serde_yaml::Value>,
    #[serde(alias = "fallbackModels")]
    fallback_models: Option<ToolList>,
    #[serde(alias = "fallbackOn")]
    fallback_on: Option<ToolList>,
    priority: Option<String>,
}

/// Is `name` usable for a custom agent?
pub fn check_name(name: &str) -> Result<(), String> {
    check_name_chars(name)?;
    if BUILTIN_NAMES.contains(&name) {
        return Err(format!("{name:?} is a built-in agent type and cannot be redefined"));
    }
    Ok(())
}

/// The naming rule agents share with workspaces and secrets: 1-64 of a-z, 0-9, `-`, `_`, `.`,
/// starting with a letter or digit.
pub fn check_name_chars(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err("must be 1-64 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit".into());
    }
    Ok(())
}

/// Is `model` a model name at all (`provider/model` or an alias)? Whether it can be served is
/// another matter, checked when a task uses it: a definition may name a model that is not
/// configured yet.
pub fn check_model(model: &str) -> Result<(), String> {
    crate::llm::check_model_name(model)
}

/// A definition's fields as its author wrote them (front matter or JSON), its name and system
/// prompt already read: `Written::check` makes the definition, by one set of rules whichever way
/// it came.
#[derive(Debug, Default)]
pub struct Written {
    pub description: String,
    pub tools: Option<Vec<String>>,
    pub disallowed_tools: Vec<String>,
    pub model: Option<String>,
    pub max_turns: Option<i64>,
    pub max_output_tokens: Option<i64>,
    pub approval: Option<String>,
    pub read_only: Option<bool>,
    pub output_schema: Option<Value>,
    pub fallback_models: Vec<String>,
    pub fallback_on: Option<Vec<String>>,
    pub priority: Option<String>,
    /// Claude Code's own front-matter fields, as written.
    pub claude_code: BTreeMap<String, Value>,
    pub notices: Vec<String>,
}

pub use crate::llm::check_fallback_models;

/// `fallback_on` as written: `unavailable`, `context_length`.
pub fn check_fallback_on(when: &[String]) -> Result<Vec<crate::kinds::FallbackWhen>, String> {
    when.iter()
        .map(|w| {
            crate::kinds::FallbackWhen::parse(w.trim())
                .ok_or_else(|| format!("{w:?} is not one of unavailable, context_length"))
        })
        .collect()
}

/// A field at fault (`None`: the definition as a whole), and what is wrong with it.
pub type FieldError = (Option<&'static str>, String);

impl Written {
    /// The definition named `name` with `system_prompt` (not empty), or the first field at fault.
    pub fn check(self, name: AgentName, system_prompt: String) -> Result<AgentDefinition, FieldError> {
        let max_turns = match self.max_turns {
            Some(n) if n < 1 => return Err((Some("max_turns"), "must be at least 1".into())),
            Some(n) => Some(n.min(MAX_TURNS as i64) as u32),
            None => None,
        };
        let max_output_tokens = match self.max_output_tokens {
            Some(n) if !(1..=u32::MAX as i64).contains(&n) => {
                return Err((Some("max_output_tokens"), "must be a positive number of tokens".into()))
            }
            n => n.map(|n| n as u32),
        };
        let model = self.model.map(|m| m.trim().to_string()).filter(|m| !m.is_empty() && m != "inherit");
        if let Some(m) = &model {
            check_model(m).map_err(|e| (Some("model"), e))?;
        }
        let approval = match self.approval.as_deref() {
            None => None,
            Some(a) => Some(
                Approval::parse(a.trim()).ok_or((Some("approval"), "must be one of none, propose, all".to_string()))?,
            ),
        };
        let mut notices = self.notices;
        let (approval, read_only) = permission_mode(&self.claude_code, approval, self.read_only, &mut notices);
        let output_schema = match self.output_schema {
            None => None,
            Some(v) => {
                super::output::check_schema(&v).map_err(|m| (Some("output_schema"), m))?;
                Some(v)
            }
        };
        let fallback_models = check_fallback_models(&self.fallback_models).map_err(|e| (Some("fallback_models"), e))?;
        let fallback_on = match self.fallback_on {
            None => None,
            Some(w) => Some(check_fallback_on(&w).map_err(|e| (Some("fallback_on"), e))?),
        };
        let priority = match self.priority.as_deref().map(str::trim) {
            None => None,
            Some(p) => Some(
                crate::kinds::Priority::parse(p)
                    .ok_or((Some("priority"), "must be one of high, normal, low".to_string()))?,
            ),
        };
        Ok(AgentDefinition {
            name,
            description: self.description,
            system_prompt,
            tools: self.tools,
            disallowed_tools: self.disallowed_tools,
            model,
            max_turns,
            max_output_tokens,
            approval,
            read_only,
            output_schema,
            fallback_models,
            fallback_on,
            priority,
            claude_code: self.claude_code,
            notices,
        })
    }
}

/// Claude Code's `permissionMode`, where the definition sets no `approval` (or `read_only`) of
/// its own: what it is taken as, said in a notice.
fn permission_mode(
    claude_code: &BTreeMap<String, Value>,
    approval: Option<Approval>,
    read_only: Option<bool>,
    notices: &mut Vec<String>,
) -> (Option<Approval>, bool) {
    let (mut approval, mut ro) = (approval, read_only.unwrap_or(false));
    let Some(mode) = claude_code.get("permissionMode") else { return (approval, ro) };
    let mode = mode.as_str().unwrap_or_default();
    match super::claude_code::permission_mode(mode) {
        Some((mapped, plan)) => {
            let mut did = vec![];
            if let (None, Some(a)) = (approval, mapped) {
                approval = Some(a);
                did.push(format!("approval: {}", a.as_str()));
            }
            if plan && read_only.is_none() {
                ro = true;
                did.push("read_only: true (only `auto` tools)".into());
            }
            if !did.is_empty() {
                notices.push(format!("permissionMode: {mode} is taken as {}", did.join(", ")));
            }
        }
        None => notices.push(format!("permissionMode: {mode:?} has no meaning here; it is kept, not applied")),
    }
    (approval, ro)
}

/// A Markdown definition's front matter and body.
fn split(text: &str) -> Result<(&str, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
        .ok_or("must start with YAML front matter between `---` lines")?;
    match rest.find("\n---") {
        Some(i) => {
            let after = &rest[i + 4..];
            Ok((&rest[..i], after.split_once('\n').map(|(_, b)| b).unwrap_or("")))
        }
        None => Err("front matter has no closing `---` line".into()),
    }
}

/// The front matter as `key: value`s (leniently, as Claude Code reads it, when it is not YAML),
/// with Claude Code's own fields set apart.
fn front_matter(
    yaml: &str,
    notices: &mut Vec<String>,
) -> Result<(serde_yaml::Mapping, BTreeMap<String, Value>), String> {
    let map = match serde_yaml::from_str::<serde_yaml::Value>(yaml) {
        Ok(serde_yaml::Value::Mapping(m)) => m,
        Ok(serde_yaml::Value::Null) => serde_yaml::Mapping::new(),
        Ok(_) => return Err("invalid front matter: must be `key: value` lines".into()),
        Err(e) => match super::claude_code::lenient_front_matter(yaml) {
            Some(m) => {
                let why = e.to_string();
                let why = why.split(" at line").next().unwrap_or(&why);
                notices.push(format!(
                    "the front matter is not valid YAML ({why}); it was read as plain `key: value` lines, \
                     the first `: ` of each splitting it (quote values that hold `: ` to silence this)"
                ));
                m
            }
            None => return Err(format!("invalid front matter: {e}")),
        },
    };
    // Claude Code's own fields are kept as written; the rest must be ours.
    let mut claude_code = BTreeMap::new();
    let mut ours = serde_yaml::Mapping::new();
    for (k, v) in map {
        match k.as_str() {
            Some(key) if super::claude_code::FIELDS.contains(&key) => {
                claude_code.insert(key.to_string(), super::claude_code::to_json(&v));
            }
            _ => {
                ours.insert(k, v);
            }
        }
    }
    Ok((ours, claude_code))
}

/// Parse one Markdown definition. `source` names it in errors.
pub fn parse_markdown(source: &str, text: &str) -> Result<AgentDefinition, DefinitionError> {
    let err = |field: Option<&str>, message: String| DefinitionError {
        source: source.to_string(),
        field: field.map(str::to_string),
        message,
    };
    let (yaml, body) = split(text).map_err(|m| err(None, m))?;
    let mut notices = vec![];
    let (ours, claude_code) = front_matter(yaml, &mut notices).map_err(|m| err(None, m))?;
    let fm: FrontMatter = serde_yaml::from_value(serde_yaml::Value::Mapping(ours)).map_err(|e| {
        let msg = e.to_string();
        // serde names unknown fields as "unknown field `x`, expected ...".
        let field = msg.split_once("unknown field `").and_then(|(_, r)| r.split_once('`')).map(|(f, _)| f.to_string());
        err(field.as_deref(), format!("invalid front matter: {msg}"))
    })?;
    let name = fm.name.map(|n| n.trim().to_string()).ok_or_else(|| err(Some("name"), "is required".into()))?;
    let name = AgentName::parse(&name).map_err(|m| err(Some("name"), m))?;
    let system_prompt = body.trim().to_string();
    if system_prompt.is_empty() {
        return Err(err(None, "the body (the system prompt) is empty".into()));
    }
    let written = Written {
        description: fm.description.unwrap_or_default().trim().to_string(),
        tools: fm.tools.map(ToolList::names),
        disallowed_tools: fm.disallowed_tools.map(ToolList::names).unwrap_or_default(),
        model: fm.model,
        max_turns: fm.max_turns,
        max_output_tokens: fm.max_output_tokens,
        approval: fm.approval,
        read_only: fm.read_only,
        output_schema: fm.output_schema.map(|v| super::claude_code::to_json(&v)),
        fallback_models: fm.fallback_models.map(ToolList::names).unwrap_or_default(),
        fallback_on: fm.fallback_on.map(ToolList::names),
        priority: fm.priority,
        claude_code,
        notices,
    };
    written.check(name, system_prompt).map_err(|(field, m)| err(field, m))
}

/// A file that did not load, with why.
#[derive(Debug, Clone, Serialize)]
pub struct InvalidDefinition {
    pub source: String,
    pub error: String,
}

/// Every `*.md` in `dir`. A bad file is reported and skipped; it never stops the service.
pub fn load_dir(dir: &Path) -> (Vec<AgentDefinition>, Vec<InvalidDefinition>) {
    let mut ok: Vec<AgentDefinition> = vec![];
    let mut bad = vec![];
    let mut files: Vec<_> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")).collect(),
        Err(e) => {
            bad.push(InvalidDefinition {
                source: dir.display().to_string(),
                error: format!("cannot read directory: {e}"),
            });
            return (ok, bad);
        }
    };
    files.sort();
    for path in files {
        let source = path.display().to_string();
        let parsed = std::fs::read_to_string(&path)
            .map_err(|e| DefinitionError { source: source.clone(), field: None, message: e.to_string() })
            .and_then(|t| parse_markdown(&source, &t));
        match parsed {
            Ok(d) if ok.iter().any(|o| o.name == d.name) => bad.push(InvalidDefinition {
                error: format!("{source}: name: {:?} is already defined by another file", d.name.as_str()),
                source,
            }),
            Ok(d) => ok.push(d),
            Err(e) => bad.push(InvalidDefinition { error: e.to_string(), source }),
        }
    }
    for b in &bad {
        tracing::warn!(file = %b.source, error = %b.error, "agent definition skipped");
    }
    (ok, bad)
}

/// The definitions loaded from the agents directory at start, and how any definition's tool
/// names map to tools here (the config's `[tool_aliases]`).
#[derive(Debug, Clone, Default)]
pub struct FileAgents {
    pub valid: Vec<AgentDefinition>,
    pub invalid: Vec<InvalidDefinition>,
    /// A name as definitions write it (Claude Code's `Read`, say) → the tool it means here.
    pub tool_aliases: BTreeMap<String, String>,
}

impl FileAgents {
    pub fn load(dir: Option<&Path>) -> FileAgents {
        match dir {
            Some(d) => {
                let (valid, invalid) = load_dir(d);
                FileAgents { valid, invalid, tool_aliases: BTreeMap::new() }
            }
            None => FileAgents::default(),
        }
    }

    /// The same, with the config's `[tool_aliases]`.
    pub fn with_aliases(mut self, aliases: BTreeMap<String, String>) -> FileAgents {
        self.tool_aliases = aliases;
        self
    }

    pub fn get(&self, name: &str) -> Option<&AgentDefinition> {
        self.valid.iter().find(|d| d.name == *name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAUDE_STYLE: &str = "---\nname: code-reviewer\ndescription: Reviews diffs\ntools: Read, Grep, Glob\nmodel: sonnet\ncolor: blue\n---\n\nYou review code.\nBe terse.\n";

    #[test]
    fn a_claude_code_agent_file_loads() {
        let d = parse_markdown("a.md", CLAUDE_STYLE).unwrap();
        assert_eq!(d.name.as_str(), "code-reviewer");
        assert_eq!(d.description, "Reviews diffs");
        assert_eq!(d.tools, Some(vec!["Read".into(), "Grep".into(), "Glob".into()]));
        assert_eq!(d.model.as_deref(), Some("sonnet"));
        assert_eq!(d.system_prompt, "You review code.\nBe terse.");
    }

    #[test]
    fn lists_turn_limits_and_inherit() {
        let d = parse_markdown(
            "b.md",
            "---\nname: triage\ntools: [search, fetch]\ndisallowed_tools: [delete]\nmodel: inherit\nmax_turns: 99\n---\nTriage.\n",
        )
        .unwrap();
        assert_eq!(d.tools, Some(vec!["search".into(), "fetch".into()]));
        assert_eq!(d.disallowed_tools, vec!["delete".to_string()]);
        assert_eq!(d.model, None);
        assert_eq!(d.max_turns, Some(50));
    }

    #[test]
    fn invalid_yaml_is_reported_with_the_file() {
        let e = parse_markdown("bad.md", "---\nname: [unclosed\n---\nx\n").unwrap_err();
        assert_eq!(e.source, "bad.md");
        assert!(e.message.contains("invalid front matter"), "{e}");
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = parse_markdown("u.md", "---\nname: x\ntemperature: 0.2\n---\nbody\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("temperature"));
    }

    #[test]
    fn a_missing_name_is_named() {
        let e = parse_markdown("n.md", "---\ndescription: no name\n---\nbody\n").unwrap_err();
        assert_eq!(e.field.as_deref(), Some("name"));
        assert_eq!(e.to_string(), "n.md: name: is required");
    }

    #[test]
    fn bad_names_empty_bodies_and_missing_front_matter_are_rejected() {
        assert_eq!(parse_markdown("x.md", "---\nname: Bad Name\n---\nb\n").unwrap_err().field.as_deref(), Some("name"));
        assert_eq!(parse_markdown("x.md", "---\nname: research\n---\nb\n").unwrap_err().field.as_deref(), Some("name"));
        assert!(parse_markdown("x.md", "---\nname: ok\n---\n  \n").unwrap_err().message.contains("empty"));
        assert!(parse_markdown("x.md", "just text").unwrap_err().message.contains("front matter"));
        assert_eq!(
            parse_markdown("x.md", "---\nname: ok\nmax_turns: 0\n---\nb\n").unwrap_err().field.as_deref(),
            Some("max_turns")
        );
    }

    #[test]
    fn a_directory_loads_good_files_and_lists_bad_ones() {
        let dir = std::env::temp_dir().join(format!("subagentd-defs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.md"), CLAUDE_STYLE).unwrap();
        std::fs::write(dir.join("b.md"), "---\nname: [\n---\nx\n").unwrap();
        std::fs::write(dir.join("c.md"), CLAUDE_STYLE).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        let (ok, bad) = load_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(bad.len(), 2);
        assert!(bad[0].source.ends_with("b.md"));
        assert!(bad[1].error.contains("already defined"), "{:?}", bad[1]);
    }
}
