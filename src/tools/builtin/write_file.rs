//! `write_file`: a whole file of the task's own copy of its workspace (`tools::edit`).

use serde_json::{json, Value};

use super::{text, Backends, Builtin, BuiltinTool, Cx, Reach};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;
use crate::tools::{edit, Policy, ToolOutput};

pub struct WriteFile;

#[async_trait::async_trait]
impl Builtin for WriteFile {
    fn name(&self) -> BuiltinTool {
        BuiltinTool::WriteFile
    }

    fn phrase(&self) -> &'static str {
        "writes a whole file of your copy of the workspace"
    }

    fn description(&self) -> &'static str {
        "Write a whole file of your copy of the workspace (created with its directories if new, replaced if not). \
         Paths are relative to the root. Prefer edit_file for a change to an existing file."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "minLength": 1},
                "content": {"type": "string"}
            },
            "required": ["path", "content"],
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
        Some("Write")
    }

    fn unavailable(&self, _: Backends) -> Option<&'static str> {
        None
    }

    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput {
        cx.on_tree(call, |root, args, _| edit::write_file(root, text(args, "path"), text(args, "content"))).await
    }
}
