//! Agent definitions: the built-in types, the agents directory's, and a tenant's own (stored over
//! the API), as the API shows them — with what each names that cannot be served here now.

use serde_json::{json, Value};

use super::{Error, Resources};
use crate::engine::agents::{AgentType, BUILTIN_NAMES};
use crate::engine::definitions::AgentDefinition;
use crate::store::agents;
use crate::store::tenants::Limits;
pub use crate::tasks::submit::agents::Described;
use crate::tasks::submit::agents::{described, resolve, tenant_definitions, unservable, Here, Resolved};
use crate::tasks::TaskError;
use crate::tools::ToolDef;

/// A built-in type as the API shows it; `on`: the built-in tools the tenant has (the type's
/// prompt and `builtin_tools` name only those of the type's that are on).
fn builtin_view(t: AgentType, name: &str, on: &[ToolDef]) -> Value {
    let builtins: Vec<&str> =
        t.builtin_tools().iter().map(|b| b.as_str()).filter(|b| on.iter().any(|d| d.name == *b)).collect();
    json!({"name": name, "source": "builtin", "description": format!("built-in {} agent", t.as_str()),
           "system_prompt": t.system_prompt(&builtins), "max_turns": t.default_max_turns(),
           "builtin_tools": builtins,
           "tools": if t.read_only() { json!("read-only (policy auto)") } else { json!("all the caller allows") }})
}

impl Resources {
    /// A custom definition as the API shows it: as written (Claude Code's own fields under
    /// `claude_code`), with `warnings` — what reading it noticed, and what it names that cannot
    /// be served here now (`unmatched_tools`: names of its `tools` that are no tool of the
    /// tenant's).
    fn custom_view(&self, d: &AgentDefinition, source: &str, (tools, limits): &(Vec<ToolDef>, Limits)) -> Value {
        let mut v = serde_json::to_value(d).unwrap_or(Value::Null);
        let here = Here { tools, builtins: &self.p.tool_caller.builtins, limits };
        let u = unservable(d, &self.p.providers, Some(&here), &self.p.file_agents.tool_aliases);
        if let Some(o) = v.as_object_mut() {
            o.remove("notices");
        }
        let mut warnings = d.notices.clone();
        warnings.extend(u.warnings);
        v["warnings"] = json!(warnings);
        if d.tools.is_some() {
            v["unmatched_tools"] = json!(u.unmatched_tools);
            v["tool_mapping"] = json!(u.tool_mapping);
        }
        v["source"] = json!(source);
        v
    }

    /// The tools a definition of the tenant's may name (its own, and the built-ins it has), and
    /// its limits.
    async fn tenant_tools(&self, tenant: &str) -> Result<(Vec<ToolDef>, Limits), Error> {
        let mut tools = crate::tools::catalog::available(&self.p.pool, &self.p.tools_cache, tenant).await?;
        tools.retain(|t| !crate::tools::builtin::is_reserved(&t.name));
        let limits = self.p.limits(tenant).await?;
        tools.extend(self.p.tool_caller.builtins.for_tenant(&limits));
        Ok((tools, limits))
    }

    /// Every agent the tenant may name, as the API shows each, and the agents directory's files
    /// that could not be read.
    pub async fn agents(&self, tenant: &str) -> Result<(Vec<Value>, Value), Error> {
        let mut out: Vec<Value> = vec![];
        let on = self.builtin_tools(tenant).await?;
        for name in BUILTIN_NAMES {
            if let Some(t) = AgentType::parse(name) {
                out.push(builtin_view(t, name, &on));
            }
        }
        let tools = self.tenant_tools(tenant).await?;
        let mine = tenant_definitions(&self.p.pool, tenant).await?;
        for d in &self.p.file_agents.valid {
            if !mine.iter().any(|m| m.name == d.name) {
                out.push(self.custom_view(d, "file", &tools));
            }
        }
        out.extend(mine.iter().map(|d| self.custom_view(d, "api", &tools)));
        Ok((out, json!(self.p.file_agents.invalid)))
    }

    /// The agent `name` of the tenant's, as the API shows it.
    pub async fn agent(&self, tenant: &str, name: &str) -> Result<Value, Error> {
        match resolve(&self.p.pool, &self.p.file_agents, tenant, name).await? {
            Some(Resolved::Builtin(t)) => Ok(builtin_view(t, name, &self.builtin_tools(tenant).await?)),
            Some(Resolved::Custom(d)) => {
                let source = if self.p.file_agents.get(name) == Some(&*d) { "file" } else { "api" };
                let tools = self.tenant_tools(tenant).await?;
                Ok(self.custom_view(&d, source, &tools))
            }
            None => Err(Error::NotFound("agent")),
        }
    }

    /// Store the tenant's definition (checked already); true when it is new, with the view. A
    /// model that cannot be served now, or tool names that are no tools here, do not make it
    /// invalid: it is stored, and the view lists them under `warnings`.
    pub async fn put_agent(&self, tenant: &str, def: &AgentDefinition) -> Result<(bool, Value), Error> {
        let stored = serde_json::to_value(def).map_err(|e| Error::Task(TaskError::Internal(e.to_string())))?;
        let created = agents::put(&self.p.pool, tenant, def.name.as_str(), &stored).await?;
        let tools = self.tenant_tools(tenant).await?;
        Ok((created, self.custom_view(def, "api", &tools)))
    }

    /// Delete the tenant's definition `name`; a built-in or a file's is read-only.
    pub async fn delete_agent(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if agents::delete(&self.p.pool, tenant, name).await? {
            return Ok(());
        }
        if AgentType::parse(name).is_some() || self.p.file_agents.get(name).is_some() {
            return Err(Error::ReadOnly(format!(
                "{name:?} is a built-in or comes from the agents directory; it cannot be deleted over the API"
            )));
        }
        Err(Error::NotFound("agent"))
    }

    /// The agent types the tenant may name (`None`: those every tenant may), each with its
    /// one-line description, as the doors list them.
    pub async fn described(&self, tenant: Option<&str>) -> Result<Vec<Described>, Error> {
        Ok(described(&self.p.pool, &self.p.file_agents, tenant).await?)
    }
}
