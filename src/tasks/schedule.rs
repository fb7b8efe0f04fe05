//! Schedules: a cron expression in a time zone, and the task body (as `POST /tasks` takes it)
//! that each tick submits. A tick makes exactly one task across every replica: its idempotency
//! key is the schedule's name and the tick's time, and its metadata names both. A tick refused
//! at admission (a budget, a full queue) is the schedule's `last_error`, not retried. Ticks
//! missed for more than `MISSED_AFTER` (every replica down) are not replayed: at most the latest
//! runs.
//!
//! Time zones: a tick is a wall-clock time in the schedule's zone. One that falls in a skipped
//! hour (the clocks go forward) does not run; one in a repeated hour (the clocks go back) runs
//! once, the first time that wall-clock time comes.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::submit::{Submission, Submitted, TaskRequest};
use super::{Lifecycle, TaskError};
use crate::store::schedules::{self as store, ScheduleRow};

/// A tick later than this is one missed while no replica ran: skipped, and only the latest of
/// those missed runs.
pub const MISSED_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// A cron expression in a time zone: when its ticks fall.
#[derive(Debug, Clone)]
pub struct CronSpec {
    cron: croner::Cron,
    tz: chrono_tz::Tz,
}

impl CronSpec {
    /// `cron`: 5 fields, or 6 with seconds first, or an `@hourly`-style name; `timezone`: an IANA
    /// name. Each wrong one is named.
    pub fn parse(cron: &str, timezone: &str) -> Result<CronSpec, TaskError> {
        let parser = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .year(croner::parser::Year::Disallowed)
            .build();
        let fields = cron.split_whitespace().count();
        if !cron.trim().starts_with('@') && !(5..=6).contains(&fields) {
            return Err(TaskError::invalid(
                "cron",
                format!(
                    "{cron:?} has {fields} fields: give 5 (minute hour day month weekday), or 6 with seconds first"
                ),
            ));
        }
        let cron = parser.parse(cron).map_err(|e| TaskError::invalid("cron", format!("{cron:?}: {e}")))?;
        let tz = chrono_tz::Tz::from_str(timezone.trim()).map_err(|_| {
            TaskError::invalid("timezone", format!("{timezone:?} is not an IANA time zone (Europe/Paris, UTC)"))
        })?;
        Ok(CronSpec { cron, tz })
    }

    /// The first tick strictly after `after`, by the wall clock of the zone (see the module's
    /// note on skipped and repeated hours). `None` when there is none (within ten years).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        use chrono::offset::LocalResult;
        // The cron is matched on the zone's wall clock (as if it were UTC); each match is then
        // placed in the zone.
        let mut wall = after.with_timezone(&self.tz).naive_local().and_utc();
        let horizon = after + chrono::TimeDelta::days(3660);
        for _ in 0..100_000 {
            wall = self.cron.find_next_occurrence(&wall, false).ok()?;
            if wall > horizon {
                return None;
            }
            let at = match self.tz.from_local_datetime(&wall.naive_utc()) {
                LocalResult::None => continue,
                LocalResult::Single(t) => t,
                LocalResult::Ambiguous(first, _) => first,
            };
            let at = at.with_timezone(&Utc);
            if at > after {
                return Some(at);
            }
        }
        None
    }

    /// The latest tick at or before `now`, from `due` (a due tick) on. Looked for in windows
    /// ending at `now` that grow eightfold, not by walking from `due`: after days without a
    /// replica, a cron of every second is a few dozen steps, not millions.
    pub fn latest_until(&self, due: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
        let mut window = chrono::Duration::minutes(1);
        loop {
            // Whole seconds: a cron's ticks are, and croner counts on from the time it is given.
            let from = chrono::SubsecRound::trunc_subsecs(now - window, 0).max(due);
            let mut latest = (from == due).then_some(due);
            let mut at = from;
            while let Some(t) = self.next_after(at).filter(|t| *t <= now) {
                latest = Some(t);
                at = t;
            }
            if let Some(l) = latest {
                return l;
            }
            window = window * 8;
        }
    }
}

use chrono::TimeZone as _;

/// A schedule as `PUT /schedules/{name}` takes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    pub cron: String,
    #[serde(default)]
    pub timezone: Option<String>,
    /// The task each tick submits, as `POST /tasks` takes it (no `run_at` or `delay_seconds`).
    pub task: Value,
    #[serde(default)]
    pub paused: Option<bool>,
}

/// A schedule's name: what a path segment and an idempotency key hold.
pub fn check_name(name: &str) -> Result<(), TaskError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        // `.` and `..` are path segments a URL resolves away: such a schedule could not be read.
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(TaskError::invalid("name", "must be 1-64 characters of a-z, A-Z, 0-9, '-', '_' and '.', not . or .."))
    }
}

/// A field of the task body, named as the schedule's (`task.model`).
fn in_task(e: TaskError) -> TaskError {
    match e {
        TaskError::Invalid { field, message } => TaskError::Invalid { field: format!("task.{field}"), message },
        TaskError::ModelRequired => TaskError::invalid("task.model", "no model given, and no default is configured"),
        TaskError::UnknownModel { detail, .. } => TaskError::invalid("task.model", detail),
        TaskError::UnknownAgent { name, .. } => {
            TaskError::invalid("task.subagent_type", format!("{name:?} is not a known agent type"))
        }
        TaskError::UnpricedModel { model, .. } => {
            TaskError::invalid("task.model", format!("model {model} has no price, and the tenant's limits are in USD"))
        }
        e => e,
    }
}

/// The task body of a schedule, read as `POST /tasks` reads one.
fn task_request(task: &Value) -> Result<TaskRequest, TaskError> {
    let r: TaskRequest = serde_json::from_value(task.clone()).map_err(|e| {
        let msg = e.to_string();
        let field = ["unknown field `", "missing field `"]
            .iter()
            .find_map(|pre| msg.split_once(pre).and_then(|(_, r)| r.split_once('`')).map(|(f, _)| f.to_string()));
        TaskError::invalid(&field.map_or("task".to_string(), |f| format!("task.{f}")), msg)
    })?;
    if r.run_at.is_some() || r.delay_seconds.is_some() {
        return Err(TaskError::invalid("task.run_at", "a schedule's ticks start their tasks at the tick"));
    }
    Ok(r)
}

impl Lifecycle {
    pub async fn schedules(&self, tenant: &str) -> Result<Vec<ScheduleRow>, TaskError> {
        Ok(store::list(&self.p.pool, tenant).await?)
    }

    pub async fn schedule(&self, tenant: &str, name: &str) -> Result<ScheduleRow, TaskError> {
        store::get(&self.p.pool, tenant, name).await?.ok_or(TaskError::ScheduleNotFound)
    }

    /// Create or replace a schedule: its cron, zone and task body checked as a submission
    /// would be (nothing is submitted); it ticks next at its next tick from now. True when
    /// created.
    pub async fn put_schedule(
        &self,
        tenant: &str,
        name: &str,
        req: ScheduleRequest,
        depth: Option<&str>,
    ) -> Result<(ScheduleRow, bool), TaskError> {
        // Its ticks would start tasks at depth 0: a sub-agent's tool may not set one going.
        super::submit::check_depth(depth)?;
        check_name(name)?;
        let timezone = req.timezone.unwrap_or_else(|| "UTC".into());
        let spec = CronSpec::parse(&req.cron, &timezone)?;
        let body = task_request(&req.task)?;
        let limits = self.limits(tenant).await?;
        self.prepare(&Submission::new(tenant, body), &limits).await.map_err(in_task)?;
        let paused = req.paused.unwrap_or(false);
        let next = spec.next_after(Utc::now());
        let put = store::SchedulePut {
            tenant,
            name,
            cron: req.cron.trim(),
            timezone: timezone.trim(),
            task: &req.task,
            paused,
            next_run_at: next,
        };
        let r = store::put(&self.p.pool, &put).await?;
        self.p.hub.publish(crate::store::CH_TIMER, String::new());
        Ok(r)
    }

    pub async fn delete_schedule(&self, tenant: &str, name: &str) -> Result<(), TaskError> {
        match store::delete(&self.p.pool, tenant, name).await? {
            true => Ok(()),
            false => Err(TaskError::ScheduleNotFound),
        }
    }

    /// Pause a schedule, or resume it from its next tick after now (the ticks it missed while
    /// paused are not made).
    pub async fn pause_schedule(
        &self,
        tenant: &str,
        name: &str,
        paused: bool,
        depth: Option<&str>,
    ) -> Result<ScheduleRow, TaskError> {
        if !paused {
            super::submit::check_depth(depth)?;
        }
        let s = self.schedule(tenant, name).await?;
        let next = match paused {
            true => s.next_run_at,
            false => CronSpec::parse(&s.cron, &s.timezone)?.next_after(Utc::now()),
        };
        let row =
            store::set_paused(&self.p.pool, tenant, name, paused, next).await?.ok_or(TaskError::ScheduleNotFound)?;
        self.p.hub.publish(crate::store::CH_TIMER, String::new());
        Ok(row)
    }

    /// Make the tick `s` is due for (`next_run_at`) — or, when it is long past, the latest tick
    /// since — and move the schedule on to its next tick after now. Once across replicas: the
    /// task's idempotency key is the schedule's and the tick's; the move is written only if the
    /// schedule still waits for that tick.
    pub async fn tick(&self, s: &ScheduleRow, now: DateTime<Utc>) -> Result<(), TaskError> {
        let Some(due) = s.next_run_at else { return Ok(()) };
        let spec = match CronSpec::parse(&s.cron, &s.timezone) {
            Ok(spec) => spec,
            Err(e) => {
                store::ticked(&self.p.pool, &s.tenant, &s.name, due, None, due, None, Some(&e.to_string())).await?;
                return Ok(());
            }
        };
        // A tick a little late is made, and those after it in turn; long missed, only the latest.
        let tick = if now - due > MISSED_AFTER { spec.latest_until(due, now) } else { due };
        let next = spec.next_after(tick);
        let made = match task_request(&s.task) {
            Ok(mut request) => {
                let mut metadata = match request.metadata.take() {
                    Some(Value::Object(m)) => m,
                    _ => serde_json::Map::new(),
                };
                metadata.insert("schedule".into(), json!(s.name));
                metadata.insert("tick".into(), json!(tick));
                request.metadata = Some(Value::Object(metadata));
                let key = format!("schedule:{}:{}", s.name, tick.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
                let sub = Submission { idempotency_key: Some(key), ..Submission::new(s.tenant.clone(), request) };
                self.submit(sub).await
            }
            Err(e) => Err(e),
        };
        let (task, error) = match made {
            Ok(Submitted::Created(r) | Submitted::Existing(r)) => (Some(r.id), None),
            Err(e) if e.is_client_error() => (None, Some(format!("{}: {e}", e.code()))),
            // The database, or the service: the tick is taken again (its hold runs out).
            Err(e) => return Err(e),
        };
        store::ticked(&self.p.pool, &s.tenant, &s.name, due, next, tick, task, error.as_deref()).await?;
        Ok(())
    }

    /// Queue (at most `batch` of) the scheduled tasks whose time has come, once across replicas
    /// (`SKIP LOCKED`), and wake the claim loops and the tasks' waiters: how many.
    pub async fn queue_due(&self, batch: i64) -> Result<usize, TaskError> {
        let ids = crate::store::tasks::queue_due(&self.p.pool, batch).await?;
        if !ids.is_empty() {
            self.p.hub.publish(crate::store::CH_QUEUED, String::new());
            for id in &ids {
                self.p.hub.publish(crate::store::CH_EVENT, id.to_string());
            }
        }
        Ok(ids.len())
    }

    /// Take (at most `n` of) the schedules whose tick is due, each held for `hold_secs` from the
    /// other replicas, and make their ticks (`tick`): how many were taken.
    pub async fn tick_due(&self, n: i64, hold_secs: f64, now: DateTime<Utc>) -> Result<usize, TaskError> {
        let due = store::take_due(&self.p.pool, n, hold_secs).await?;
        for s in &due {
            if let Err(e) = self.tick(s, now).await {
                tracing::warn!(error = %e, schedule = %s.name, tenant = %s.tenant, "schedule tick not made; retried");
            }
        }
        Ok(due.len())
    }

    /// The soonest time due: a scheduled task's, or a schedule's tick.
    pub async fn next_due(&self) -> Option<DateTime<Utc>> {
        let a = crate::store::tasks::next_run_at(&self.p.pool).await.ok().flatten();
        let b = store::next_due(&self.p.pool).await.ok().flatten();
        [a, b].into_iter().flatten().min()
    }

    /// Woken when a task with a start time, or a schedule, is made (`CH_TIMER`).
    pub async fn timer_woken(&self) {
        self.p.hub.timer.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn ticks_follow_the_cron_in_its_zone() {
        let s = CronSpec::parse("30 9 * * 1-5", "Europe/Paris").unwrap();
        // Friday 2026-11-27 09:30 in Paris is 08:30 UTC; the next is Monday's.
        assert_eq!(s.next_after(at("2026-11-26T09:00:00Z")), Some(at("2026-11-27T08:30:00Z")));
        assert_eq!(s.next_after(at("2026-11-27T08:30:00Z")), Some(at("2026-11-30T08:30:00Z")));
        let every = CronSpec::parse("*/10 * * * * *", "UTC").unwrap();
        assert_eq!(every.next_after(at("2026-11-26T09:00:01Z")), Some(at("2026-11-26T09:00:10Z")));
        let hourly = CronSpec::parse("@hourly", "UTC").unwrap();
        assert_eq!(hourly.next_after(at("2026-11-26T09:00:00Z")), Some(at("2026-11-26T10:00:00Z")));
    }

    #[test]
    fn a_skipped_hour_does_not_run_and_a_repeated_hour_runs_once() {
        // New York: 2026-03-08 02:00 does not happen (01:59:59 EST, then 03:00 EDT).
        let s = CronSpec::parse("30 2 * * *", "America/New_York").unwrap();
        let before = at("2026-03-08T05:00:00Z"); // 00:00 EST
        assert_eq!(s.next_after(before), Some(at("2026-03-09T06:30:00Z")), "02:30 the next day, in EDT");
        // 2026-11-01 01:00-02:00 happens twice (EDT, then EST): 01:30 runs once, the first time.
        let s = CronSpec::parse("30 1 * * *", "America/New_York").unwrap();
        let first = s.next_after(at("2026-11-01T04:00:00Z")).unwrap(); // from 00:00 EDT
        assert_eq!(first, at("2026-11-01T05:30:00Z"), "01:30 EDT");
        assert_eq!(s.next_after(first), Some(at("2026-11-02T06:30:00Z")), "not 01:30 EST again: the next day's");
        // From inside the repeated hour's second pass (01:10 EST), the first 01:30 has passed.
        assert_eq!(s.next_after(at("2026-11-01T06:10:00Z")), Some(at("2026-11-02T06:30:00Z")));
        // Every 30 minutes through the repeated hour: 01:00 and 01:30 once each.
        let s = CronSpec::parse("*/30 * * * *", "America/New_York").unwrap();
        let mut t = at("2026-11-01T04:45:00Z"); // 00:45 EDT
        let mut ticks = vec![];
        for _ in 0..4 {
            t = s.next_after(t).unwrap();
            ticks.push(t);
        }
        assert_eq!(
            ticks,
            vec![
                at("2026-11-01T05:00:00Z"),
                at("2026-11-01T05:30:00Z"),
                at("2026-11-01T07:00:00Z"),
                at("2026-11-01T07:30:00Z")
            ]
        );
    }

    #[test]
    fn missed_ticks_come_down_to_the_latest() {
        let s = CronSpec::parse("* * * * *", "UTC").unwrap();
        assert_eq!(s.latest_until(at("2026-11-26T09:00:00Z"), at("2026-11-26T09:42:30Z")), at("2026-11-26T09:42:00Z"));
        // Weeks without a replica, a tick every second (2.2 million of them): the latest.
        let every_second = CronSpec::parse("* * * * * *", "UTC").unwrap();
        let now = at("2026-11-26T09:42:30.5Z");
        assert_eq!(every_second.latest_until(at("2026-11-01T00:00:00Z"), now), at("2026-11-26T09:42:30Z"));
        // A yearly tick far back, none since: the due one itself.
        let yearly = CronSpec::parse("@yearly", "UTC").unwrap();
        assert_eq!(yearly.latest_until(at("2026-01-01T00:00:00Z"), now), at("2026-01-01T00:00:00Z"));
        // A monthly one missed three times: the latest.
        let monthly = CronSpec::parse("@monthly", "UTC").unwrap();
        assert_eq!(monthly.latest_until(at("2026-08-01T00:00:00Z"), now), at("2026-11-01T00:00:00Z"));
    }

    #[test]
    fn a_schedule_name_is_a_url_segment_that_stays() {
        for ok in ["nightly", "eu.weekly-2", "a", ".hidden", "..x"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_bad_cron_or_zone_is_named() {
        for (cron, tz, field) in [
            ("61 * * * *", "UTC", "cron"),
            ("* * *", "UTC", "cron"),
            ("* * * * * * *", "UTC", "cron"),
            ("@sometimes", "UTC", "cron"),
            ("* * * * *", "Mars/Olympus", "timezone"),
        ] {
            match CronSpec::parse(cron, tz) {
                Err(TaskError::Invalid { field: f, .. }) => assert_eq!(f, field, "{cron} {tz}"),
                other => panic!("{cron} {tz}: {other:?}"),
            }
        }
    }
}
