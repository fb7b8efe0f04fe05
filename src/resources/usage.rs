//! Usage: a tenant's (or every tenant's) aggregates from the daily rollup, grouped as asked.

use chrono::NaiveDate;

use super::{Error, Resources};
use crate::store::tenants;
pub use crate::store::tenants::{usage_csv, UsageRow};

impl Resources {
    /// The rollup's rows from `from` to `to` (days, both included), grouped by `groups` (checked
    /// by the caller: `day`, `model`, `agent_type`, `api_key`, `tenant`), of `tenant` or of all.
    pub async fn usage(
        &self,
        tenant: Option<&str>,
        from: NaiveDate,
        to: NaiveDate,
        groups: &[&str],
    ) -> Result<Vec<UsageRow>, Error> {
        Ok(tenants::usage(&self.p.pool, tenant, from, to, groups).await?)
    }
}
