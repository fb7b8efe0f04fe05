//! Sessions: the console's (a browser's, made by exchanging a key or the admin token once; only
//! the hash of its cookie's value is stored) and the MCP door's (whose they are, the protocol
//! version and what the client can do), both rows, so that any replica serves them.

use serde_json::Value;

use super::{Error, Resources};
pub use crate::store::mcp::{Found as McpFound, McpSession};
pub use crate::store::sessions::Session;
use crate::store::{mcp, sessions};

impl Resources {
    /// The console session a cookie's value names, if it is live.
    pub async fn console_session(&self, value: &str) -> Result<Option<Session>, Error> {
        Ok(sessions::get(&self.p.pool, value).await?)
    }

    /// A new console session for `tenant` (or the admin) lasting `ttl_secs`: the cookie's value
    /// and the session.
    pub async fn start_console_session(
        &self,
        tenant: Option<&str>,
        admin: bool,
        ttl_secs: f64,
    ) -> Result<(String, Session), Error> {
        Ok(sessions::create(&self.p.pool, tenant, admin, ttl_secs).await?)
    }

    pub async fn end_console_session(&self, value: &str) -> Result<(), Error> {
        Ok(sessions::delete(&self.p.pool, value).await?)
    }

    /// The MCP session `id` as `tenant` sees it (another tenant's is gone), noted as seen.
    pub async fn mcp_session(&self, tenant: &str, id: &str) -> Result<mcp::Found, Error> {
        Ok(mcp::get(&self.p.pool, tenant, id).await?)
    }

    /// Adopt an unknown session id as a fresh session of `tenant`; `None` if it was taken.
    pub async fn adopt_mcp_session(&self, tenant: &str, id: &str, version: &str) -> Result<Option<McpSession>, Error> {
        Ok(mcp::adopt(&self.p.pool, id, tenant, version).await?)
    }

    /// Note a call held open for its task (`key`: its idempotency key): false if its session
    /// has ended meanwhile.
    pub async fn mcp_call_started(&self, session: &McpSession, key: &str) -> Result<bool, Error> {
        Ok(mcp::call_started(&self.p.pool, &session.id, &session.tenant, key).await?)
    }

    /// A held call answered.
    pub async fn mcp_call_answered(&self, session: &McpSession, key: &str) -> Result<(), Error> {
        Ok(mcp::call_answered(&self.p.pool, &session.id, key).await?)
    }

    pub async fn start_mcp_session(
        &self,
        id: &str,
        tenant: &str,
        version: &str,
        capabilities: &Value,
        client_info: &Value,
    ) -> Result<(), Error> {
        Ok(mcp::create(&self.p.pool, id, tenant, version, capabilities, client_info).await?)
    }

    /// End an MCP session; `None` if there was no live one of `tenant`'s, else the idempotency
    /// keys of the tasks its calls in flight started.
    pub async fn end_mcp_session(&self, tenant: &str, id: &str) -> Result<Option<Vec<String>>, Error> {
        Ok(mcp::end(&self.p.pool, tenant, id).await?)
    }
}
