//! Named environments (issue 63): a tenant's images with a setup script (`PUT /environments/
//! {name}`), each built once per (definition, image digest), its layer kept for every replica. A
//! `PUT` starts the build at once where this process runs the sandbox; otherwise the first task
//! that names it builds it. Tasks name one with `environment: {"name": …}`.

use serde::Deserialize;

use super::{Error, Resources};
use crate::store::environments::{self as store, EnvironmentRow};
use crate::tools::image::named;

/// The most a setup script may hold.
const MAX_SETUP: usize = 64 * 1024;

/// A definition as `PUT /environments/{name}` takes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentDef {
    pub image: String,
    #[serde(default)]
    pub setup: Option<String>,
    #[serde(default)]
    pub network: Option<Network>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub in_runs: bool,
}

impl Resources {
    /// Store `tenant`'s environment `name` (replacing one so named); true when new. A changed
    /// definition (or a failed one put again) is built anew.
    pub async fn put_environment(
        &self,
        tenant: &str,
        name: &str,
        def: EnvironmentDef,
    ) -> Result<(EnvironmentRow, bool), Error> {
        crate::engine::definitions::check_name_chars(name).map_err(|m| Error::invalid("name", m))?;
        let Some(images) = self.p.tool_caller.images.clone() else {
            return Err(Error::invalid(
                "image",
                "an environment is where run_command runs, and the sandbox does not start on this host",
            ));
        };
        images.check(&def.image).map_err(|e| Error::invalid("image", e.to_string()))?;
        let setup = def.setup.unwrap_or_default();
        if setup.len() > MAX_SETUP || setup.contains('\0') {
            return Err(Error::invalid("setup", "a shell script of at most 64 KiB, with no NUL"));
        }
        let (allow, in_runs) = def.network.map(|n| (n.allow, n.in_runs)).unwrap_or_default();
        let allow: Vec<String> =
            allow.iter().map(|a| a.trim().to_ascii_lowercase()).filter(|a| !a.is_empty()).collect();
        if allow.len() > 100 || allow.iter().any(|a| a.len() > 253) {
            return Err(Error::invalid("network.allow", "at most 100 entries of at most 253 characters"));
        }
        if allow.iter().any(|a| a == "*") {
            return Err(Error::invalid("network.allow", "name the hosts (`*.domain` for a domain), not `*`"));
        }
        // A CIDR as wide as the internet is `*` by another name.
        let wide = |a: &String| {
            a.split_once('/').is_some_and(|(ip, bits)| {
                let bits: u8 = bits.parse().unwrap_or(0);
                if ip.contains(':') {
                    bits < 32
                } else {
                    bits < 16
                }
            })
        };
        if let Some(a) = allow.iter().find(|a| wide(a)) {
            return Err(Error::invalid("network.allow", format!("{a:?}: a CIDR at most /16 wide (/32 for IPv6)")));
        }
        crate::tools::ssrf::AllowList::parse(&allow.join(",")).map_err(|e| Error::invalid("network.allow", e))?;
        if in_runs && allow.is_empty() {
            return Err(Error::invalid("network.in_runs", "network in runs needs `network.allow`"));
        }
        let hash = named::definition_hash(&def.image, &setup, &allow, in_runs);
        let d = store::Definition {
            image: &def.image,
            setup: &setup,
            network_allow: &allow,
            network_in_runs: in_runs,
            hash: &hash,
        };
        let (row, created) = store::put(&self.p.pool, tenant, name, &d).await?;
        if row.status == "building" {
            self.start_build(tenant, row.clone());
        }
        Ok((row, created))
    }

    /// Build `row` in the background where this process runs commands (else a task will).
    fn start_build(&self, tenant: &str, row: EnvironmentRow) {
        let (Some(images), Some(sandbox)) = (self.p.tool_caller.images.clone(), self.p.tool_caller.sandbox.clone())
        else {
            return;
        };
        let (pool, tenant) = (self.p.pool.clone(), tenant.to_string());
        tokio::spawn(async move {
            let resolved = match crate::tools::image::access(&pool, &tenant, &row.image).await {
                Ok(access) => images.resolve(&row.image, &access).await.map(|d| (d, access)),
                Err(e) => Err(e),
            };
            let (digest, access) = match resolved {
                Ok(d) => d,
                Err(e) => {
                    let text = e.to_string();
                    let b = store::Built {
                        status: "failed",
                        digest: None,
                        exit_code: None,
                        output_tail: Some(&text),
                        size_bytes: None,
                    };
                    let _ = store::record_build(&pool, &tenant, &row.name, &row.definition_hash, &b).await;
                    return;
                }
            };
            if let Err(e) = named::build(&pool, &images, &sandbox, &tenant, &row, &digest, &access).await {
                tracing::info!(environment = %row.name, error = %e, "an environment's build failed");
            }
        });
    }

    pub async fn environment(&self, tenant: &str, name: &str) -> Result<EnvironmentRow, Error> {
        store::get(&self.p.pool, tenant, name).await?.ok_or(Error::NotFound("environment"))
    }

    pub async fn environments(&self, tenant: &str) -> Result<Vec<EnvironmentRow>, Error> {
        Ok(store::list(&self.p.pool, tenant).await?)
    }

    /// Delete the definition. A task that has started in it keeps its root where it is cached;
    /// one that has not fails with `environment_failed`.
    pub async fn delete_environment(&self, tenant: &str, name: &str) -> Result<(), Error> {
        if store::delete(&self.p.pool, tenant, name).await? {
            Ok(())
        } else {
            Err(Error::NotFound("environment"))
        }
    }
}
