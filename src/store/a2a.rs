//! The A2A door's rows: a task's context and its caller's messages (`a2a_tasks`), and a task's
//! push notification configs (`a2a_push_configs`), whose deliveries are `webhook_deliveries`
//! rows naming the config.

use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

/// A task's A2A context and the messages its caller sent it.
#[derive(Debug, Clone)]
pub struct A2aTask {
    pub task_id: Uuid,
    pub context_id: String,
    /// The caller's messages, in order, as received (A2A `Message` objects).
    pub messages: Value,
}

/// Record the context and first message of the task `task_id` (written in the task's own
/// transaction).
pub async fn insert(
    conn: &mut sqlx::PgConnection,
    task_id: Uuid,
    tenant: &str,
    context_id: &str,
    message: &Value,
) -> Result<(), StoreError> {
    sqlx::query!(
        "INSERT INTO a2a_tasks (task_id, tenant, context_id, messages) VALUES ($1, $2, $3, jsonb_build_array($4::jsonb))",
        task_id,
        tenant,
        context_id,
        message
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The rows of these tasks (a task started at another door has none).
pub async fn of(pool: &PgPool, ids: &[Uuid]) -> Result<Vec<A2aTask>, StoreError> {
    Ok(sqlx::query_as!(A2aTask, "SELECT task_id, context_id, messages FROM a2a_tasks WHERE task_id = ANY($1)", ids)
        .fetch_all(pool)
        .await?)
}

/// The newest task of the tenant's context, if any.
pub async fn latest_in_context(pool: &PgPool, tenant: &str, context_id: &str) -> Result<Option<Uuid>, StoreError> {
    Ok(sqlx::query_scalar!(
        "SELECT a.task_id FROM a2a_tasks a JOIN tasks t ON t.id = a.task_id
         WHERE a.tenant = $1 AND a.context_id = $2 ORDER BY a.task_id DESC LIMIT 1",
        tenant,
        context_id
    )
    .fetch_optional(pool)
    .await?)
}

/// Add a message of the caller's to the task's history (once: a retry of the same message id
/// adds nothing). A task started at another door gets its row here.
pub async fn append(pool: &PgPool, task_id: Uuid, tenant: &str, message: &Value) -> Result<(), StoreError> {
    sqlx::query!(
        "INSERT INTO a2a_tasks (task_id, tenant, context_id, messages)
         VALUES ($1::uuid, $2, $1::uuid::text, jsonb_build_array($3::jsonb))
         ON CONFLICT (task_id) DO UPDATE SET messages = a2a_tasks.messages || jsonb_build_array($3::jsonb)
         WHERE NOT a2a_tasks.messages @> jsonb_build_array(jsonb_build_object('messageId', $3::jsonb -> 'messageId'))",
        task_id,
        tenant,
        message
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// A push notification config of a task.
#[derive(Debug, Clone, PartialEq)]
pub struct PushConfig {
    pub task_id: Uuid,
    pub id: String,
    pub url: String,
    pub token: Option<String>,
    pub auth_scheme: Option<String>,
    pub auth_credentials: Option<String>,
}

/// Create (or replace) a config of the tenant's task, with its deliveries: the task's end, and
/// its current pause if it is paused now. `None`: no such task of the tenant's.
pub async fn put_push(pool: &PgPool, tenant: &str, c: &PushConfig) -> Result<Option<PushConfig>, StoreError> {
    Ok(sqlx::query_as!(
        PushConfig,
        r#"WITH t AS (SELECT id, status, pauses FROM tasks WHERE id = $1 AND tenant = $2),
         c AS (
            INSERT INTO a2a_push_configs (task_id, id, tenant, url, token, auth_scheme, auth_credentials)
            SELECT id, $3, $2, $4, $5, $6, $7 FROM t
            ON CONFLICT (task_id, id) DO UPDATE SET url = EXCLUDED.url, token = EXCLUDED.token,
                auth_scheme = EXCLUDED.auth_scheme, auth_credentials = EXCLUDED.auth_credentials
            RETURNING task_id, id, url, token, auth_scheme, auth_credentials
         ), d AS (
            INSERT INTO webhook_deliveries (task_id, event, seq, push_config)
            SELECT t.id, 'task.finished', 0, c.id FROM t, c
            UNION ALL
            SELECT t.id, 'task.requires_action', t.pauses, c.id FROM t, c WHERE t.status = 'requires_action'
            ON CONFLICT DO NOTHING
         )
         SELECT task_id AS "task_id!", id AS "id!", url AS "url!", token, auth_scheme, auth_credentials FROM c"#,
        c.task_id,
        tenant,
        c.id,
        c.url,
        c.token,
        c.auth_scheme,
        c.auth_credentials
    )
    .fetch_optional(pool)
    .await?)
}

/// A config of the tenant's task.
pub async fn get_push(pool: &PgPool, tenant: &str, task_id: Uuid, id: &str) -> Result<Option<PushConfig>, StoreError> {
    Ok(sqlx::query_as!(
        PushConfig,
        "SELECT task_id, id, url, token, auth_scheme, auth_credentials FROM a2a_push_configs
         WHERE task_id = $1 AND id = $2 AND tenant = $3",
        task_id,
        id,
        tenant
    )
    .fetch_optional(pool)
    .await?)
}

/// A config by its task and id, whoever's (for its deliveries).
pub async fn push_target(pool: &PgPool, task_id: Uuid, id: &str) -> Result<Option<PushConfig>, StoreError> {
    Ok(sqlx::query_as!(
        PushConfig,
        "SELECT task_id, id, url, token, auth_scheme, auth_credentials FROM a2a_push_configs WHERE task_id = $1 AND id = $2",
        task_id,
        id
    )
    .fetch_optional(pool)
    .await?)
}

/// A page of the task's configs, by id, after `after`.
pub async fn list_push(
    pool: &PgPool,
    tenant: &str,
    task_id: Uuid,
    after: &str,
    limit: i64,
) -> Result<Vec<PushConfig>, StoreError> {
    Ok(sqlx::query_as!(
        PushConfig,
        "SELECT task_id, id, url, token, auth_scheme, auth_credentials FROM a2a_push_configs
         WHERE task_id = $1 AND tenant = $2 AND id > $3 ORDER BY id LIMIT $4",
        task_id,
        tenant,
        after,
        limit
    )
    .fetch_all(pool)
    .await?)
}

/// Delete a config and its deliveries not yet made; whether there was one.
pub async fn delete_push(pool: &PgPool, tenant: &str, task_id: Uuid, id: &str) -> Result<bool, StoreError> {
    let n = sqlx::query_scalar!(
        r#"WITH c AS (DELETE FROM a2a_push_configs WHERE task_id = $1 AND id = $2 AND tenant = $3 RETURNING task_id, id),
         d AS (DELETE FROM webhook_deliveries w USING c
               WHERE w.task_id = c.task_id AND w.push_config = c.id AND w.status = 'pending')
         SELECT count(*) AS "n!" FROM c"#,
        task_id,
        id,
        tenant
    )
    .fetch_one(pool)
    .await?;
    Ok(n > 0)
}
