//! `list_directory`: a directory of the task's workspace (`tools::files`).

use serde_json::{json, Value};

use super::{text, Backends, Builtin, BuiltinTool, Cx, Reach};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;
use crate::tools::{files, Policy, ToolOutput};

pub struct ListDirectory;

#[async_trait::async_trait]
impl Builtin for ListDirectory {
    fn name(&self) -> BuiltinTool {
        BuiltinTool::ListDirectory
    }

    fn phrase(&self) -> &'static str {
        "lists a directory of the workspace"
    }

    fn description(&self) -> &'static str {
        "List a directory of the task's workspace: its entries, directories ending in `/`. Paths are relative to \
         the workspace root (\"\" or \".\" is the root)."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "a directory, relative to the root"}},
            "required": ["path"],
            "additionalProperties": false
        })
    }

    fn reach(&self) -> Reach {
        Reach::ReadsWorkspace
    }

    fn policy(&self, _: &Limits) -> Policy {
        Policy::Auto
    }

    fn types(&self) -> &'static [AgentType] {
        &[AgentType::General, AgentType::Explore, AgentType::Plan]
    }

    fn claude_code_name(&self) -> Option<&'static str> {
        Some("LS")
    }

    fn unavailable(&self, _: Backends) -> Option<&'static str> {
        None
    }

    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput {
        cx.on_tree(call, |root, args, _| files::list_directory(root, text(args, "path"))).await
    }
}
