//! `console_sessions`: a browser's session, made by exchanging an API key or the admin token
//! once. Only the hash of the cookie's value is stored.

use sha2::{Digest, Sha256};
use sqlx::PgPool;

use super::StoreError;

/// Who a session acts as, and the token its writes must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// `None` for the admin.
    pub tenant: Option<String>,
    pub admin: bool,
    pub csrf: String,
}

fn hash(value: &str) -> String {
    hex::encode(Sha256::digest(value.as_bytes()))
}

fn random_hex(bytes: usize) -> String {
    use rand::RngCore;
    let mut b = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut b);
    hex::encode(b)
}

/// A new session for `tenant` (or the admin) that lasts `ttl_secs`: the cookie's value, and
/// the session.
pub async fn create(
    pool: &PgPool,
    tenant: Option<&str>,
    admin: bool,
    ttl_secs: f64,
) -> Result<(String, Session), StoreError> {
    let value = random_hex(32);
    let csrf = random_hex(16);
    sqlx::query!(
        "INSERT INTO console_sessions (id_hash, tenant, admin, csrf, expires_at)
         VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))",
        hash(&value),
        tenant,
        admin,
        csrf,
        ttl_secs
    )
    .execute(pool)
    .await?;
    // Expired sessions go with each new one.
    sqlx::query!("DELETE FROM console_sessions WHERE expires_at < now()").execute(pool).await?;
    Ok((value, Session { tenant: tenant.map(Into::into), admin, csrf }))
}

/// The live session a cookie's value names.
pub async fn get(pool: &PgPool, value: &str) -> Result<Option<Session>, StoreError> {
    Ok(sqlx::query_as!(
        Session,
        "SELECT tenant, admin, csrf FROM console_sessions WHERE id_hash = $1 AND expires_at > now()",
        hash(value)
    )
    .fetch_optional(pool)
    .await?)
}

pub async fn delete(pool: &PgPool, value: &str) -> Result<(), StoreError> {
    sqlx::query!("DELETE FROM console_sessions WHERE id_hash = $1", hash(value)).execute(pool).await?;
    Ok(())
}
