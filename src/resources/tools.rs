//! The tenant's tools: its catalog (HTTP tools, and tools its caller runs), its MCP tool sources
//! (each discovered when put or refreshed) and its signing secret. Every change is seen by the
//! room at once on this replica (its cache of the tenant's tools is dropped), within seconds on
//! the others.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Error, Resources};
use crate::store::tools as store;
pub use crate::store::tools::SourceRow;
use crate::tools::catalog::{self, ToolInput};
use crate::tools::{check_tool_name, mcp, ToolDef};

impl Resources {
    /// The tenant's catalog tools, and the tools of its MCP sources.
    pub async fn tools(&self, tenant: &str) -> Result<(Vec<ToolDef>, Vec<ToolDef>), Error> {
        let catalog: Vec<ToolDef> = store::list(&self.p.pool, tenant).await?.iter().map(catalog::from_row).collect();
        let mut sourced = vec![];
        for s in store::sources(&self.p.pool, tenant).await? {
            sourced.extend(catalog::source_tools(&s));
        }
        Ok((catalog, sourced))
    }

    /// The built-in tools the tenant may be offered (on for the service and for it), with its
    /// policy for them. Which agent types get them is the room's (`AgentType::builtin_tools`).
    pub async fn builtin_tools(&self, tenant: &str) -> Result<Vec<ToolDef>, Error> {
        let limits = self.p.limits(tenant).await?;
        Ok(self.p.tool_caller.builtins.for_tenant(&limits))
    }

    /// The tenant's catalog tool `name`.
    pub async fn tool(&self, tenant: &str, name: &str) -> Result<ToolDef, Error> {
        let row = store::get(&self.p.pool, tenant, name).await?.ok_or(Error::NotFound("tool"))?;
        Ok(catalog::from_row(&row))
    }

    /// Check and store a catalog tool; true when it is new, with the tool.
    pub async fn put_tool(&self, tenant: &str, name: &str, input: &ToolInput) -> Result<(bool, ToolDef), Error> {
        let def = catalog::validate(&self.p.tool_caller, self.p.cfg.tool_timeout_ms, "", name, input)?;
        let row = catalog::to_row(&def)
            .ok_or_else(|| Error::Task(crate::tasks::TaskError::Internal("a catalog tool has no row".into())))?;
        let created = store::put(&self.p.pool, tenant, &row).await?;
        self.p.tools_cache.remove(tenant);
        Ok((created, def))
    }

    pub async fn delete_tool(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if !store::delete(&self.p.pool, tenant, name).await? {
            return Err(Error::NotFound("tool"));
        }
        self.p.tools_cache.remove(tenant);
        Ok(())
    }

    pub async fn sources(&self, tenant: &str) -> Result<Vec<SourceRow>, Error> {
        Ok(store::sources(&self.p.pool, tenant).await?)
    }

    pub async fn source(&self, tenant: &str, name: &str) -> Result<SourceRow, Error> {
        store::source(&self.p.pool, tenant, name).await?.ok_or(Error::NotFound("tool source"))
    }

    fn discovery_timeout(&self) -> Duration {
        Duration::from_millis(self.p.cfg.tool_timeout_ms)
    }

    /// Check, discover (a source that cannot be reached now is stored with its error) and store
    /// an MCP tool source; true when it is new, with the source as stored.
    pub async fn put_source(
        &self,
        tenant: &str,
        name: &str,
        url: &str,
        headers: &BTreeMap<String, String>,
    ) -> Result<(bool, SourceRow), Error> {
        check_tool_name(name).map_err(|m| Error::invalid("name", m))?;
        if name.contains("__") {
            return Err(Error::invalid("name", "must not contain `__` (it separates source and tool names)"));
        }
        self.p.tool_caller.allow.check_url(url).map_err(|e| Error::invalid("url", e.0))?;
        for (k, v) in headers {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v).is_err()
            {
                return Err(Error::invalid("headers", format!("{k:?} is not a valid header")));
            }
        }
        let pairs: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let found = mcp::discover(&self.p.tool_caller, name, url, &pairs, self.discovery_timeout()).await;
        let found = catalog::stored_tools(&found);
        let created = store::put_source(&self.p.pool, tenant, name, url, headers, &found).await?;
        self.p.tools_cache.remove(tenant);
        Ok((created, self.source(tenant, name).await?))
    }

    /// Discover a source's tools again.
    pub async fn refresh_source(&self, tenant: &str, name: &str) -> Result<SourceRow, Error> {
        let s = self.source(tenant, name).await?;
        let headers: Vec<(String, String)> = s.headers.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let found = mcp::discover(&self.p.tool_caller, name, &s.url, &headers, self.discovery_timeout()).await;
        store::refreshed(&self.p.pool, tenant, name, &catalog::stored_tools(&found)).await?;
        self.p.tools_cache.remove(tenant);
        self.source(tenant, name).await
    }

    pub async fn delete_source(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if !store::delete_source(&self.p.pool, tenant, name).await? {
            return Err(Error::NotFound("tool source"));
        }
        self.p.tools_cache.remove(tenant);
        Ok(())
    }

    /// A new signing secret for the tenant's outbound tool calls and webhooks (shown this once).
    pub async fn rotate_signing_secret(&self, tenant: &str) -> Result<String, Error> {
        Ok(store::rotate_signing_secret(&self.p.pool, tenant).await?)
    }

    /// Whether an outbound URL passes the tools' allow-list and address guard (a door's push
    /// notification target, say): why not, if not.
    pub fn check_outbound_url(&self, url: &str) -> Result<(), String> {
        self.p.tool_caller.allow.check_url(url).map(|_| ()).map_err(|e| e.0)
    }
}
