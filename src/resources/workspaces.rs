//! Uploaded workspaces and write-only secrets. An upload is streamed to a temporary file under
//! its own cap (not the API's body limit), cleaned (`workspace::archive`: escapes, devices and
//! links leading out are dropped and named), and stored in PostgreSQL as the clean archive, so
//! that any replica can unpack it, within the tenant's quota. A secret's value is stored and
//! handed only to the worker that fetches with it: no answer, event or log carries it.

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use super::{Error, Resources};
use crate::store::workspaces::{self as store, NewWorkspace, SecretRow, WorkspaceRow};
use crate::workspace::archive::{self, ArchiveError};

/// The most a secret's value may hold.
const MAX_SECRET: usize = 8192;

fn check_name(name: &str) -> Result<(), Error> {
    crate::engine::definitions::check_name_chars(name).map_err(|m| Error::invalid("name", m))
}

impl Resources {
    /// Store the `tar.gz` in `body` as `tenant`'s workspace `name` (replacing one so named);
    /// true when new. `content_type` must be gzip.
    pub async fn put_workspace<S, E>(
        &self,
        tenant: &str,
        name: &str,
        content_type: Option<&str>,
        mut body: S,
    ) -> Result<(WorkspaceRow, bool), Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        check_name(name)?;
        let mime = content_type.unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        if !matches!(mime.as_str(), "application/gzip" | "application/x-gzip") {
            return Err(Error::MediaType(format!(
                "a workspace is a tar.gz sent as application/gzip; got {:?}",
                if mime.is_empty() { "no Content-Type" } else { mime.as_str() }
            )));
        }
        let cfg = &self.p.cfg;
        let max = cfg.workspace_upload_max_mb.max(1) << 20;
        let tmp = tempfile::NamedTempFile::new().map_err(|e| internal(format!("cannot buffer the upload: {e}")))?;
        let mut file = tokio::fs::File::from_std(tmp.reopen().map_err(|e| internal(e.to_string()))?);
        let mut read = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Error::invalid("body", format!("the upload was cut off: {e}")))?;
            read += chunk.len() as u64;
            if read > max {
                return Err(Error::TooLarge {
                    code: "workspace_too_large",
                    detail: format!(
                        "the archive is over {} MiB compressed (SUBAGENTD_WORKSPACE_UPLOAD_MAX_MB)",
                        max >> 20
                    ),
                });
            }
            file.write_all(&chunk).await.map_err(|e| internal(format!("cannot buffer the upload: {e}")))?;
        }
        file.flush().await.map_err(|e| internal(e.to_string()))?;
        drop(file);
        let limits = archive::Limits {
            max_bytes: cfg.workspace_max_mb.max(1) << 20,
            max_entries: cfg.workspace_max_files.max(1),
        };
        let cleaned = tokio::task::spawn_blocking(move || {
            let input = std::io::BufReader::new(tmp.reopen()?);
            let mut out = Vec::new();
            let c = archive::clean(input, &mut out, limits);
            Ok::<_, std::io::Error>(c.map(|c| (c, out)))
        })
        .await
        .map_err(|e| internal(e.to_string()))?
        .map_err(|e| internal(e.to_string()))?;
        let (c, out) = cleaned.map_err(|e| match e {
            ArchiveError::TooLarge(m) => Error::TooLarge {
                code: "workspace_too_large",
                detail: format!("{m} (SUBAGENTD_WORKSPACE_MAX_MB, SUBAGENTD_WORKSPACE_MAX_FILES)"),
            },
            ArchiveError::Invalid(m) => Error::invalid("body", m),
        })?;
        let new = NewWorkspace {
            content_hash: &c.content_hash,
            files: c.files as i64,
            size_bytes: c.bytes as i64,
            archive: &out,
            dropped: serde_json::to_value(&c.dropped).unwrap_or(Value::Null),
        };
        let quota = (cfg.workspace_quota_mb << 20) as i64;
        store::put(&self.p.pool, tenant, name, &new, quota).await?.ok_or_else(|| Error::TooLarge {
            code: "workspace_quota_exceeded",
            detail: format!(
                "the tenant's workspaces would hold over {} MiB compressed (SUBAGENTD_WORKSPACE_QUOTA_MB); delete one first",
                cfg.workspace_quota_mb
            ),
        })
    }

    pub async fn workspaces(&self, tenant: &str) -> Result<Vec<WorkspaceRow>, Error> {
        Ok(store::list(&self.p.pool, tenant).await?)
    }

    pub async fn workspace(&self, tenant: &str, name: &str) -> Result<WorkspaceRow, Error> {
        store::get(&self.p.pool, tenant, name).await?.ok_or(Error::NotFound("workspace"))
    }

    /// Delete the upload. A task that has read it already keeps its tree where it is cached; one
    /// whose run has not read it yet fails with `workspace_gone`.
    pub async fn delete_workspace(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if store::delete(&self.p.pool, tenant, name).await? {
            Ok(())
        } else {
            Err(Error::NotFound("workspace"))
        }
    }

    /// Set a secret's value and the only host it is sent to (write-only: the answer is its name,
    /// host and times).
    pub async fn put_secret(
        &self,
        tenant: &str,
        name: &str,
        value: &str,
        host: &str,
    ) -> Result<(SecretRow, bool), Error> {
        check_name(name)?;
        let raw = host.trim().to_ascii_lowercase();
        let plain = !raw.is_empty()
            && raw.len() <= 253
            && raw.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
        let parsed = url::Url::parse(&format!("https://{raw}/")).ok();
        // The host as a URL names it (a port is not part of it).
        let host = match parsed.as_ref().and_then(|u| u.host_str()) {
            Some(h) if plain => h.to_string(),
            _ => {
                return Err(Error::invalid(
                    "host",
                    "must be the repository's host name, as in its URL (e.g. github.com)",
                ))
            }
        };
        if value.is_empty() || value.len() > MAX_SECRET {
            return Err(Error::invalid("value", format!("must be 1-{MAX_SECRET} bytes")));
        }
        if value.contains('\0') || value.contains(['\r', '\n']) {
            return Err(Error::invalid("value", "must not hold NUL or line breaks"));
        }
        Ok(store::put_secret(&self.p.pool, tenant, name, value, &host).await?)
    }

    pub async fn secrets(&self, tenant: &str) -> Result<Vec<SecretRow>, Error> {
        Ok(store::secrets(&self.p.pool, tenant).await?)
    }

    pub async fn delete_secret(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if store::delete_secret(&self.p.pool, tenant, name).await? {
            Ok(())
        } else {
            Err(Error::NotFound("secret"))
        }
    }
}

fn internal(m: String) -> Error {
    Error::Task(crate::tasks::TaskError::Internal(m))
}
