//! What a task asks for, validated: the part of a request the worker needs to run it.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::agents::{AgentType, MAX_TURNS, MIN_TURNS};
use super::definitions::AgentDefinition;

/// Stored in `tasks.options`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOptions {
    pub max_turns: u32,
    /// The request's override of the type's system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_context: Option<String>,
    /// Snapshot of the custom agent definition the task runs (later edits do not change it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentDefinition>,
    /// The terminal task whose conversation this one continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<Uuid>,
    /// Wall-clock limit of the run, from its first start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
    /// The whitelist: the tools this run is offered, resolved at submission.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::tools::ToolDef>,
}

/// Clamp a requested turn budget into `1..=50`, or take the type's default.
pub fn max_turns(agent: AgentType, requested: Option<u32>) -> u32 {
    requested.unwrap_or(agent.default_max_turns()).clamp(MIN_TURNS, MAX_TURNS)
}
