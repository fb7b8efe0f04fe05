//! `edit_file`: one exact, unique string replaced in a file of the task's own copy (`tools::edit`).

use serde_json::{json, Value};

use super::{text, Backends, Builtin, BuiltinTool, Cx, Reach};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;
use crate::tools::{edit, Policy, ToolOutput};

pub struct EditFile;

#[async_trait::async_trait]
impl Builtin for EditFile {
    fn name(&self) -> BuiltinTool {
        BuiltinTool::EditFile
    }

    fn phrase(&self) -> &'static str {
        "replaces one exact, unique string in a file of your copy"
    }

    fn description(&self) -> &'static str {
        "Replace `old_string` by `new_string` in a file of your copy: `old_string` must occur exactly once (give \
         more surrounding lines to make it unique), or set `replace_all` to replace every occurrence."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "old_string": {"type": "string", "minLength": 1},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        })
    }

    fn reach(&self) -> Reach {
        Reach::WritesWorkspace
    }

    fn policy(&self, _: &Limits) -> Policy {
        Policy::Propose
    }

    fn types(&self) -> &'static [AgentType] {
        &[AgentType::General]
    }

    fn claude_code_name(&self) -> Option<&'static str> {
        Some("Edit")
    }

    fn unavailable(&self, _: Backends) -> Option<&'static str> {
        None
    }

    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput {
        cx.on_tree(call, |root, args, _| {
            let all = args.get("replace_all").and_then(Value::as_bool).unwrap_or(false);
            edit::edit_file(root, text(args, "path"), text(args, "old_string"), text(args, "new_string"), all)
        })
        .await
    }
}
