//! The console's landing page: what is open now, what finished in the last hour, the models and
//! the spend of today, the replicas, the latest tasks and what this replica holds open — for a
//! tenant, or for every tenant (the admin).

use rust_decimal::prelude::ToPrimitive;
use serde_json::{json, Value};

use super::{Error, Resources};
use crate::store::overview;
use crate::store::tasks::{self, ListFilter};
use crate::tasks::TaskView;

impl Resources {
    /// The overview of `tenant` (`None`: every tenant), this replica's own part (its open
    /// connections and their cap, which the door knows) to be added by the caller.
    pub async fn overview(&self, tenant: Option<&str>) -> Result<Value, Error> {
        let defaults = crate::budget::Defaults::from_config(&self.p.cfg).spend();
        let newest = ListFilter { limit: 10, ..ListFilter::default() };
        let (now, finished, models, spend, replicas, latest) = tokio::try_join!(
            overview::now(&self.p.pool, tenant),
            overview::finished_last_hour(&self.p.pool, tenant),
            overview::models_today(&self.p.pool, tenant),
            overview::spend(&self.p.pool, tenant, defaults),
            overview::replicas(&self.p.pool, tenant),
            tasks::list(&self.p.pool, tenant, &newest),
        )?;
        // One entry per minute with finishes, its outcomes as fields.
        let mut per_minute: Vec<Value> = vec![];
        for f in finished {
            let minute = json!(f.minute);
            if per_minute.last().is_none_or(|m| m["minute"] != minute) {
                per_minute
                    .push(json!({"minute": minute, "completed": 0, "incomplete": 0, "failed": 0, "cancelled": 0}));
            }
            if let Some(m) = per_minute.last_mut() {
                m[f.status.as_str()] = json!(f.tasks);
            }
        }
        let models: Vec<Value> = models
            .into_iter()
            .map(|m| {
                let rate = if m.calls > 0 { m.failed as f64 / m.calls as f64 } else { 0.0 };
                json!({"model": m.model, "calls": m.calls, "failed": m.failed, "error_rate": rate,
                       "cost_usd": m.cost_usd.to_f64().unwrap_or(0.0)})
            })
            .collect();
        let latest: Vec<TaskView> = TaskView::of(&self.p.pool, latest).await?;
        // What this replica holds open, per tenant (the caller's tenant only, but for the admin).
        let mut holds = vec![];
        for (t, open) in self.p.guard.open() {
            if tenant.is_some_and(|mine| mine != t) {
                continue;
            }
            let l = self.p.limits(&t).await?;
            holds.push(json!({"tenant": t, "streams": open.streams, "waits": open.waits,
                              "max_streams": l.max_streams, "max_waits": l.max_waits}));
        }
        let storage_quota_bytes = self.p.cfg.tenant_storage_mb.saturating_mul(1 << 20);
        Ok(json!({"now": now, "finished_per_minute": per_minute, "models": models, "spend": spend,
            "storage_quota_bytes": storage_quota_bytes,
                  "replicas": replicas, "latest": latest, "this_replica": {"holds": holds}}))
    }
}
