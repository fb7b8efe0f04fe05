//! `glob`: the workspace's files whose paths match a pattern (`tools::files`).

use serde_json::{json, Value};

use super::{text, Backends, Builtin, BuiltinTool, Cx, Reach};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;
use crate::tools::{files, Policy, ToolOutput};

pub struct Glob;

#[async_trait::async_trait]
impl Builtin for Glob {
    fn name(&self) -> BuiltinTool {
        BuiltinTool::Glob
    }

    fn phrase(&self) -> &'static str {
        "finds the workspace's files by a path pattern"
    }

    fn description(&self) -> &'static str {
        "Find the workspace's files whose paths match a glob pattern (`*` within a directory, `**` across \
         directories, e.g. `src/**/*.rs`), sorted by path."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"pattern": {"type": "string", "minLength": 1}},
            "required": ["pattern"],
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
        &[AgentType::General, AgentType::Research, AgentType::Explore, AgentType::Plan]
    }

    fn claude_code_name(&self) -> Option<&'static str> {
        Some("Glob")
    }

    fn unavailable(&self, _: Backends) -> Option<&'static str> {
        None
    }

    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput {
        cx.on_tree(call, |root, args, _| files::glob(root, text(args, "pattern"))).await
    }
}
