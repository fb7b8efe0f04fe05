//! What a task asks of a run, typed: parsed once at submission (`submit`), stored as
//! `tasks.options`, read once where a run starts (`jobs::run`) and where the task is shown
//! (`view`). The newtypes hold their rules, so a value that exists is a valid one.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::agents::{AgentType, Approval, MAX_TURNS, MIN_TURNS};
use super::definitions::AgentDefinition;
pub use crate::kinds::FallbackWhen;
use crate::tools::ToolDef;

/// A turn budget, always within `1..=50` (a larger request is clamped, as the seeds do).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "u32", into = "u32")]
pub struct MaxTurns(u32);

impl MaxTurns {
    /// `n` clamped into `1..=50`.
    pub fn clamped(n: u32) -> MaxTurns {
        MaxTurns(n.clamp(MIN_TURNS, MAX_TURNS))
    }

    /// The request's budget, else the type's default.
    pub fn for_agent(agent: AgentType, requested: Option<u32>) -> MaxTurns {
        MaxTurns::clamped(requested.unwrap_or(agent.default_max_turns()))
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl From<u32> for MaxTurns {
    fn from(n: u32) -> Self {
        MaxTurns::clamped(n)
    }
}

impl From<MaxTurns> for u32 {
    fn from(m: MaxTurns) -> u32 {
        m.0
    }
}

/// An amount of US dollars that is finite and not negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "Decimal", into = "Decimal")]
pub struct Usd(Decimal);

impl Usd {
    pub const ZERO: Usd = Usd(Decimal::ZERO);

    pub fn new(d: Decimal) -> Result<Usd, String> {
        if d.is_sign_negative() && !d.is_zero() {
            return Err("must not be negative".into());
        }
        Ok(Usd(d))
    }

    /// From a JSON number: finite, `0 ..< 1e9`.
    pub fn from_f64(v: f64) -> Result<Usd, String> {
        if !v.is_finite() || !(0.0..1e9).contains(&v) {
            return Err("must be a number from 0 to 1e9".into());
        }
        Decimal::try_from(v).map(Usd).map_err(|_| "is out of range".into())
    }

    pub fn get(self) -> Decimal {
        self.0
    }
}

impl TryFrom<Decimal> for Usd {
    type Error = String;
    fn try_from(d: Decimal) -> Result<Usd, String> {
        Usd::new(d)
    }
}

impl From<Usd> for Decimal {
    fn from(u: Usd) -> Decimal {
        u.0
    }
}

/// What a task asks of its run; stored in `tasks.options`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOptions {
    pub max_turns: MaxTurns,
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
    pub tools: Vec<ToolDef>,
    /// Which calls wait for a decision (the request's, else the definition's, else the tenant's).
    #[serde(default, skip_serializing_if = "is_none_approval")]
    pub approval: Approval,
    /// How long a pause waits for its answers, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_timeout_seconds: Option<f64>,
    /// The JSON Schema the final answer must satisfy (the request's, else the definition's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<serde_json::Value>,
    /// The models a call moves to, in order, when its own cannot serve it: the request's, else
    /// the definition's, else the tenant's (`provider/model`, resolved at submission).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// Which failures move a call to the next model; `None`: `unavailable` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_on: Option<Vec<FallbackWhen>>,
    /// The tree the workspace tools read (a git ref, or an upload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<crate::kinds::WorkspaceSpec>,
    /// The image its commands run in (the request's, else the service's default image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<crate::kinds::EnvironmentSpec>,
}

fn is_none_approval(a: &Approval) -> bool {
    *a == Approval::None
}

impl TaskOptions {
    /// What each gated tool's calls wait for: a caller tool its output; with approval, a
    /// `propose` tool (or, with `all`, any tool) a decision.
    pub fn gates(&self) -> Vec<(String, super::Gate)> {
        use crate::tools::{Policy, Target};
        self.tools
            .iter()
            .filter_map(|t| {
                let gate = match (&t.target, self.approval, t.policy) {
                    (Target::Caller, _, _) => super::Gate::Output,
                    (_, Approval::All, _) | (_, Approval::Propose, Policy::Propose) => super::Gate::Approval,
                    _ => return None,
                };
                Some((t.name.clone(), gate))
            })
            .collect()
    }

    /// A fresh task's conversation: `[system, user]`, the system prompt being the request's
    /// override, else the definition's, else the type's, with the parent's context under it.
    pub fn fresh_conversation(&self, prompt: &str, agent: AgentType) -> Vec<crate::llm::Message> {
        let base =
            self.system_prompt.clone().or_else(|| self.agent.as_ref().map(|d| d.system_prompt.clone())).unwrap_or_else(
                || {
                    let names: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
                    agent.system_prompt(&names)
                },
            );
        let mut system = super::agents::compose_system_prompt(&base, self.parent_context.as_deref());
        if let Some(schema) = &self.output_schema {
            system.push_str("\n\n");
            system.push_str(&super::output::instructions(schema));
        }
        super::fresh_conversation(system, prompt.to_string())
    }

    /// Which failures move a call to the next model.
    pub fn fallback_on(&self) -> super::FallbackOn {
        match &self.fallback_on {
            None => super::FallbackOn::default(),
            Some(w) => super::FallbackOn {
                unavailable: w.contains(&FallbackWhen::Unavailable),
                context_length: w.contains(&FallbackWhen::ContextLength),
            },
        }
    }

    /// Read the stored options (once per run, once per view).
    pub fn from_stored(v: &serde_json::Value) -> Result<TaskOptions, String> {
        TaskOptions::deserialize(v).map_err(|e| format!("task options are not readable: {e}"))
    }

    pub fn to_stored(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_else(|_| serde_json::json!({}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_budgets_clamp_and_default_per_type() {
        assert_eq!(MaxTurns::for_agent(AgentType::Plan, None).get(), 3);
        assert_eq!(MaxTurns::for_agent(AgentType::General, Some(99)).get(), 50);
        assert_eq!(MaxTurns::clamped(0).get(), 1);
        let stored: MaxTurns = serde_json::from_value(serde_json::json!(80)).unwrap();
        assert_eq!(stored.get(), 50);
    }

    #[test]
    fn dollars_are_never_negative() {
        assert!(Usd::from_f64(-1.0).is_err());
        assert!(Usd::from_f64(f64::NAN).is_err());
        assert_eq!(Usd::from_f64(0.5).unwrap().get(), Decimal::new(5, 1));
        assert!(serde_json::from_value::<Usd>(serde_json::json!("-2")).is_err());
    }
}
