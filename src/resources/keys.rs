//! API keys and tenants: keys made, listed and revoked (the admin's); a key's tenant (every
//! request's); the tenants and their limits.

use serde::Serialize;

use super::{Error, Resources};
use crate::budget::{self, Limits};
pub use crate::store::tenants::{constant_time_eq, KeyRow};
use crate::store::{budget as spend, tenants};

/// A tenant as the admin reads it: its own limits, what it uses now, and the configured defaults.
#[derive(Debug, Serialize)]
pub struct TenantView {
    pub name: String,
    pub limits: Limits,
    #[serde(rename = "use")]
    pub used: spend::Use,
    pub defaults: serde_json::Value,
    /// What its kept changes and diffs hold, against its quota.
    pub storage: Storage,
}

/// A tenant's kept changes and diffs (`tenant_storage`) and its quota, in bytes.
#[derive(Debug, Clone, Serialize)]
pub struct Storage {
    pub kept_bytes: i64,
    pub quota_bytes: u64,
}

impl Resources {
    /// A new key of `tenant`: its row, and the key itself (shown this once).
    pub async fn create_key(&self, tenant: &str, name: Option<&str>) -> Result<(KeyRow, String), Error> {
        budget::check_tenant_name(tenant)?;
        Ok(tenants::create_key(&self.p.pool, tenant, name).await?)
    }

    /// The keys of `tenant`, or of every tenant.
    pub async fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRow>, Error> {
        Ok(tenants::list_keys(&self.p.pool, tenant).await?)
    }

    /// Revoke a key by its id or prefix.
    pub async fn revoke_key(&self, id_or_prefix: &str) -> Result<KeyRow, Error> {
        tenants::revoke_key(&self.p.pool, id_or_prefix).await?.ok_or(Error::NotFound("key"))
    }

    /// The tenant a key belongs to, if it is a key and not revoked.
    pub async fn tenant_of_key(&self, key: &str) -> Result<Option<String>, Error> {
        Ok(tenants::tenant_of_key(&self.p.pool, key).await?)
    }

    /// Whether any key is active (single-user mode ends with the first).
    pub async fn any_active_key(&self) -> Result<bool, Error> {
        Ok(tenants::any_active_key(&self.p.pool).await?)
    }

    pub async fn tenants(&self) -> Result<Vec<String>, Error> {
        Ok(tenants::names(&self.p.pool).await?)
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantView, Error> {
        let mut conn = self.p.pool.acquire().await.map_err(crate::store::StoreError::from)?;
        let limits = tenants::limits(&mut conn, name, false).await?.ok_or(Error::NotFound("tenant"))?;
        let used = spend::usage_now(&mut conn, name).await?;
        let d = budget::Defaults::from_config(&self.p.cfg);
        let defaults = serde_json::json!({"usd_per_day": d.usd_per_day, "usd_per_month": d.usd_per_month,
            "tokens_per_day": d.tokens_per_day, "max_running": d.max_running, "max_queued": d.max_queued,
            "requests_per_second": d.requests_per_second, "request_burst": d.request_burst,
            "max_streams": d.max_streams, "max_waits": d.max_waits, "max_scheduled": d.max_scheduled,
            "web_fetches_per_minute": d.web_fetches_per_minute});
        let storage = Storage {
            kept_bytes: crate::store::diffs::kept_bytes(&self.p.pool, name).await?,
            quota_bytes: self.p.cfg.tenant_storage_mb.saturating_mul(1 << 20),
        };
        Ok(TenantView { name: name.to_string(), limits, used, defaults, storage })
    }

    /// Set a tenant's limits (creating it); true when it was created. The room sees them at once
    /// on this replica, within the cache's few seconds on the others.
    pub async fn set_limits(&self, name: &str, limits: &Limits) -> Result<bool, Error> {
        let created = budget::set_limits(&self.p.pool, name, limits).await?;
        self.p.limits_cache.remove(name);
        Ok(created)
    }
}
