//! `run_command`: a shell command in the sandbox (`tools::sandbox`), over the task's own copy of
//! its workspace.

use std::time::Duration;

use serde_json::{json, Value};

use super::{Backends, Builtin, BuiltinTool, Cx, Reach};
use crate::kinds::AgentType;
use crate::llm::ToolCall;
use crate::store::tenants::Limits;
use crate::tools::{sandbox, Policy, ToolOutput};

pub struct RunCommand;

#[async_trait::async_trait]
impl Builtin for RunCommand {
    fn name(&self) -> BuiltinTool {
        BuiltinTool::RunCommand
    }

    fn phrase(&self) -> &'static str {
        "runs a shell command in a sandbox over your copy (no network)"
    }

    fn description(&self) -> &'static str {
        "Run a shell command (`sh -c`) in a sandbox whose working directory /workspace is your copy of the workspace: \
         the programs of the task's environment (its image, else the system's), no network (unless the environment \
         allows some hosts, through HTTP_PROXY), no secrets, a /tmp of its own, limits on time, memory, processes and \
         written bytes. Answers the exit code and the output (capped). Default timeout 120 s."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1},
                "timeout_seconds": {"type": "integer", "minimum": 1, "description": "default 120; the service caps it"}
            },
            "required": ["command"],
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
        Some("Bash")
    }

    fn unavailable(&self, host: Backends) -> Option<&'static str> {
        (!host.sandbox).then_some("run_command needs the sandbox, which cannot start on this host (bubblewrap)")
    }

    async fn run(&self, cx: &Cx<'_>, call: &ToolCall) -> ToolOutput {
        let (Some(sb), Some(w)) = (&cx.task.caller.sandbox, cx.workspace) else {
            return ToolOutput::text("run_command is not available: the sandbox does not start on this host", true);
        };
        let Some(copy) = &w.copy else {
            return super::no_copy(call);
        };
        let command = call.arguments.get("command").and_then(Value::as_str).unwrap_or_default();
        let secs = call.arguments.get("timeout_seconds").and_then(Value::as_u64);
        let timeout =
            Duration::from_secs(secs.unwrap_or(sandbox::DEFAULT_TIMEOUT_SECONDS).max(1)).min(sb.max_timeout());
        let tenant = cx.task.web.as_ref().map_or("", |t| t.tenant.as_str());
        let (mut out, outcome) = {
            let env = cx.task.environment.as_ref();
            let place = sandbox::Place {
                copy: &w.path,
                max_copy: copy.max,
                image: env.map(|e| e.root.as_ref()),
                setup: false,
                net: env.and_then(|e| e.net.as_ref()),
            };
            sb.run(tenant, place, command, timeout, cx.max_result()).await
        };
        metrics::counter!("subagentd_sandbox_commands_total", "outcome" => outcome.as_str()).increment(1);
        let largest = out.detail.as_ref().and_then(|d| d.get("largest_file_bytes")).and_then(Value::as_u64);
        if largest.is_some_and(|l| l > copy.keep) {
            out.content.push_str(&format!(
                "\n[note: a file of your copy is larger than the {} MiB a checkpoint keeps \
                 (SUBAGENTD_SANDBOX_KEEP_MB): it stays while this run lasts, but is not kept with the \
                 task's changes, and the diff names it without its content]",
                copy.keep >> 20
            ));
        }
        out
    }
}
