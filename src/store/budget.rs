//! The SQL side of budgets: a tenant's use against its limits; the reservation of a provider
//! call (`budget_reserve_call`, migration 0008), which locks the tenant's row while it checks and
//! may grant, lower, ask to wait, or refuse; the waking of waiters (`budget_wake`). Settlement is
//! part of the turn's checkpoint (`runs::commit_turns`), which tells waiters' workers (NOTIFY
//! `subagentd_budget`). The rules that decide what these figures mean live in `crate::budget`.

use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{Fence, StoreError};
use crate::kinds::Event;

/// The configured spend limits of a tenant that sets none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpendDefaults {
    pub usd_per_day: Option<Decimal>,
    pub usd_per_month: Option<Decimal>,
    pub tokens_per_day: Option<i64>,
}

/// One provider call to reserve: its prompt (estimated) and the output it may produce.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CallAsk {
    /// The prompt's estimated cost and tokens.
    pub prompt_usd: Decimal,
    pub prompt_tokens: i64,
    /// The cost of one output token.
    pub out_usd: Decimal,
    /// The output tokens it asks for (`max_tokens`), and the fewest it can do with.
    pub max_out: i32,
    pub floor: i32,
}

/// What `budget_reserve_call` answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Reserve {
    /// Reserved, with `max_tokens` output tokens (lowered when the budget affords no more):
    /// `usd` and `tokens` are what is held until the call settles.
    Granted { max_tokens: u32, usd: Decimal, tokens: i64 },
    /// It fits what is settled but not while others' reservations are held (`limit`): wait for
    /// them. `need`: its smallest call; `want`: the call it would make.
    Wait { limit: String, need_usd: Decimal, need_tokens: i64, want_usd: Decimal, want_tokens: i64 },
    /// Not even the smallest call fits under `limit` after the settled spend.
    Refused(String),
    /// The lease is no longer held: nothing was written.
    LeaseLost,
}

/// `budget_reserve_call`'s answer; `i`: its place in a batch (`reserve_many`).
struct ReserveRow {
    i: i64,
    result: String,
    lim: Option<String>,
    granted: Option<i32>,
    need_usd: Option<Decimal>,
    need_tokens: Option<i64>,
    want_usd: Option<Decimal>,
    want_tokens: Option<i64>,
    r_usd: Option<Decimal>,
    r_tok: Option<i64>,
}

/// Reserve a call against the task's and the tenant's budgets. `event`, if given, is the call's
/// `llm_call_started` event, appended in the same statement with what was granted.
pub async fn reserve(
    db: impl sqlx::PgExecutor<'_>,
    f: Fence,
    ask: CallAsk,
    d: SpendDefaults,
    event: Option<&Event>,
) -> Result<Reserve, StoreError> {
    let r = sqlx::query_as!(
        ReserveRow,
        r#"SELECT 1::int8 AS "i!", result AS "result!", lim, granted, need_usd, need_tokens, want_usd, want_tokens, r_usd, r_tok
         FROM budget_reserve_call($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::json)"#,
        f.id,
        f.lease,
        ask.prompt_usd,
        ask.out_usd,
        ask.prompt_tokens,
        ask.max_out,
        ask.floor,
        d.usd_per_day,
        d.usd_per_month,
        d.tokens_per_day,
        event.map(compact) as _
    )
    .fetch_one(db)
    .await?;
    Ok(r.answer())
}

/// What `budget_reserve_call` adds to a call's `llm_call_started`: what it granted.
const GRANT: [&str; 3] = ["reserved_usd", "reserved_tokens", "max_tokens"];

/// A call's `llm_call_started` as the compact JSON text `budget_reserve_call` adds the grant to
/// (migration 0037): without the grant's fields, which it writes.
fn compact(e: &Event) -> String {
    let mut v = serde_json::to_value(e).expect("events serialise as JSON");
    if let Some(o) = v.as_object_mut() {
        for k in GRANT {
            o.remove(k);
        }
    }
    v.to_string()
}

impl ReserveRow {
    fn answer(self) -> Reserve {
        let lim = || self.lim.clone().unwrap_or_else(|| "budget".into());
        match self.result.as_str() {
            "granted" => Reserve::Granted {
                max_tokens: self.granted.unwrap_or(0).max(0) as u32,
                usd: self.r_usd.unwrap_or_default(),
                tokens: self.r_tok.unwrap_or_default(),
            },
            "wait" => Reserve::Wait {
                limit: lim(),
                need_usd: self.need_usd.unwrap_or_default(),
                need_tokens: self.need_tokens.unwrap_or_default(),
                want_usd: self.want_usd.unwrap_or_default(),
                want_tokens: self.want_tokens.unwrap_or_default(),
            },
            "refused" => Reserve::Refused(lim()),
            _ => Reserve::LeaseLost,
        }
    }
}

/// One run's reservation, owned, for `reserve_many` (the arguments of `reserve`).
#[derive(Debug, Clone)]
pub struct ReserveWrite {
    pub fence: Fence,
    /// The task's tenant: reservations are made in tenant order, the order their locks are
    /// taken in.
    pub tenant: String,
    pub ask: CallAsk,
    pub defaults: SpendDefaults,
    pub event: Option<Event>,
}

/// Reserve several runs' calls in one statement: each as `reserve` would, in turn, in (tenant,
/// task) order, each seeing those before it. Each one's answer, in the order given.
pub async fn reserve_many(pool: &PgPool, items: &[&ReserveWrite]) -> Result<Vec<Reserve>, StoreError> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by(|&a, &b| (&items[a].tenant, items[a].fence.id).cmp(&(&items[b].tenant, items[b].fence.id)));
    let col = |f: &dyn Fn(&ReserveWrite) -> Option<Decimal>| order.iter().map(|&i| f(items[i])).collect::<Vec<_>>();
    let (day, month) = (col(&|w| w.defaults.usd_per_day), col(&|w| w.defaults.usd_per_month));
    let (prompt_usd, out_usd) = (col(&|w| Some(w.ask.prompt_usd)), col(&|w| Some(w.ask.out_usd)));
    let column = |f: &dyn Fn(&ReserveWrite) -> i64| order.iter().map(|&i| f(items[i])).collect::<Vec<_>>();
    let ints = |f: &dyn Fn(&ReserveWrite) -> i32| order.iter().map(|&i| f(items[i])).collect::<Vec<_>>();
    let rows = sqlx::query_as!(
        ReserveRow,
        r#"SELECT b.i AS "i!", r.result AS "result!", r.lim, r.granted, r.need_usd, r.need_tokens, r.want_usd,
                r.want_tokens, r.r_usd, r.r_tok
         FROM unnest($1::uuid[], $2::uuid[], $3::numeric[], $4::numeric[], $5::int8[], $6::int[],
                $7::int[], $8::numeric[], $9::numeric[], $10::int8[], $11::json[])
            WITH ORDINALITY AS b(task, lease, pu, ou, pt, mo, fl, dd, dm, dt, ev, i),
         LATERAL budget_reserve_call(b.task, b.lease, b.pu, b.ou, b.pt, b.mo, b.fl, b.dd, b.dm, b.dt, b.ev) r"#,
        &order.iter().map(|&i| items[i].fence.id).collect::<Vec<_>>(),
        &order.iter().map(|&i| items[i].fence.lease).collect::<Vec<_>>(),
        &prompt_usd as _,
        &out_usd as _,
        &column(&|w| w.ask.prompt_tokens),
        &ints(&|w| w.ask.max_out),
        &ints(&|w| w.ask.floor),
        &day as _,
        &month as _,
        &order.iter().map(|&i| items[i].defaults.tokens_per_day).collect::<Vec<_>>() as _,
        &order.iter().map(|&i| items[i].event.as_ref().map(compact)).collect::<Vec<_>>() as _
    )
    .fetch_all(pool)
    .await?;
    let mut out: Vec<Reserve> = vec![Reserve::LeaseLost; items.len()];
    for row in rows {
        if let Some(&i) = usize::try_from(row.i - 1).ok().and_then(|k| order.get(k)) {
            out[i] = row.answer();
        }
    }
    Ok(out)
}

/// Wake `tenant`'s budget waiters that fit (`budget_wake`); each woken task with how long it
/// waited, in seconds.
pub async fn wake(pool: &PgPool, tenant: &str, d: SpendDefaults) -> Result<Vec<(Uuid, f64)>, StoreError> {
    Ok(sqlx::query!(
        r#"SELECT task_id AS "task_id!", coalesce(waited_seconds, 0) AS "waited!" FROM budget_wake($1, $2, $3, $4)"#,
        tenant,
        d.usd_per_day,
        d.usd_per_month,
        d.tokens_per_day
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.task_id, r.waited))
    .collect())
}

/// Tenants with tasks waiting for budget, and how many wait.
pub async fn waiting(pool: &PgPool) -> Result<Vec<(String, i64)>, StoreError> {
    Ok(sqlx::query!(
        r#"SELECT tenant, count(*) AS "n!" FROM task_queue WHERE waiting_for IS NOT NULL AND status = 'queued' GROUP BY tenant"#
    )
    .fetch_all(pool)
    .await?
    .into_iter()
    .map(|r| (r.tenant, r.n))
    .collect())
}

/// End the budget waits that ran past their task's time limit (`incomplete` / `timeout`); its
/// caller (`tasks::end`) wakes their waiters.
pub async fn end_expired_waits(pool: &PgPool) -> Result<Vec<Uuid>, StoreError> {
    super::on_move(pool, || end_expired_waits_once(pool)).await
}

async fn end_expired_waits_once(pool: &PgPool) -> Result<Vec<Uuid>, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"WITH u AS (
            UPDATE tasks SET status = 'incomplete', stop_reason = 'timeout', finished_at = now(), history_at = now(), waiting_for = NULL,
                summary = '(sub-agent ' || subagent_type || ' stopped: its time limit was reached while it waited for budget)',
                last_event_seq = last_event_seq + 1
            WHERE status = 'queued' AND waiting_for IS NOT NULL AND wait_deadline < now() AND history_at = 'infinity'
            RETURNING id, last_event_seq
         ), e AS (
            INSERT INTO task_events (task_id, seq, kind, data)
            SELECT id, last_event_seq, 'finished', '{"status": "incomplete", "stop_reason": "timeout"}' FROM u
         )
         SELECT id AS "id!" FROM u"#
    )
    .fetch_all(pool)
    .await?)
}

/// What a tenant uses now, against its limits.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Use {
    pub usd_today: Decimal,
    pub usd_this_month: Decimal,
    pub tokens_today: i64,
    /// Worst-case cost reserved by provider calls in flight.
    pub reserved_usd: Decimal,
    pub reserved_tokens: i64,
    pub running: i64,
    pub queued: i64,
}

/// How many of the tenant's tasks wait for their time.
/// The tenant's scheduled tasks, counted up to `upto` (its limit: beyond it the number does not
/// matter, and the count runs under the tenant's row lock).
pub async fn scheduled(conn: &mut PgConnection, tenant: &str, upto: i64) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar!(
        r#"SELECT count(*) AS "n!" FROM (SELECT 1 FROM task_queue WHERE tenant = $1 AND status = 'scheduled' LIMIT $2) s"#,
        tenant,
        upto
    )
    .fetch_one(conn)
    .await?)
}

pub async fn usage_now(conn: &mut PgConnection, tenant: &str) -> Result<Use, StoreError> {
    Ok(sqlx::query_as!(
        Use,
        r#"WITH d AS (SELECT (now() AT TIME ZONE 'UTC')::date AS today)
         SELECT
           coalesce((SELECT sum(cost_usd) FROM usage_daily, d WHERE tenant = $1 AND day = d.today), 0) AS "usd_today!",
           coalesce((SELECT sum(cost_usd) FROM usage_daily, d WHERE tenant = $1 AND day >= date_trunc('month', d.today)::date), 0) AS "usd_this_month!",
           coalesce((SELECT sum(input_tokens + output_tokens) FROM usage_daily, d WHERE tenant = $1 AND day = d.today), 0)::bigint AS "tokens_today!",
           coalesce((SELECT sum(reserved_usd) FROM task_queue WHERE tenant = $1 AND status = 'running'), 0) AS "reserved_usd!",
           coalesce((SELECT sum(reserved_tokens) FROM task_queue WHERE tenant = $1 AND status = 'running'), 0)::bigint AS "reserved_tokens!",
           (SELECT count(*) FROM task_queue WHERE tenant = $1 AND status = 'running') AS "running!",
           (SELECT count(*) FROM task_queue WHERE tenant = $1 AND status = 'queued') AS "queued!""#,
        tenant
    )
    .fetch_one(conn)
    .await?)
}
