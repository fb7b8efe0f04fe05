//! A real OCI registry on loopback (Debian's `docker-registry`, the distribution registry) and
//! images built here from files on this machine: layers written with the `tar` crate (busybox
//! from Debian's `busybox-static`, or entries no tar tool would write), pushed with `oci-client`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;

pub struct Registry {
    child: std::process::Child,
    /// `127.0.0.1:port`.
    pub addr: String,
    /// Where it keeps its blobs (a second registry may serve the same).
    pub data: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The static busybox of `busybox-static`, if here.
pub fn busybox() -> Option<PathBuf> {
    // A dynamic one names its loader (`/lib64/ld-linux-x86-64.so.2`); the image has no libc.
    ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| std::fs::read(p).is_ok_and(|b| !b.windows(8).any(|w| w == b"/lib64/l" || w == b"/lib/ld-")))
}

impl Registry {
    /// A registry, or `None` (said; a failure under `.ci/run`) where `docker-registry` or a
    /// static busybox is missing.
    pub async fn start() -> Option<Registry> {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        Registry::serve(Some(dir), data, "").await
    }

    /// A second registry over this one's blobs that asks for a token (the distribution
    /// registry's `silly` access controller: any `Authorization` passes, none is a 401 naming
    /// `realm`, where a client gets its token).
    pub async fn with_auth(&self, realm: &str) -> Option<Registry> {
        let auth = format!("auth:\n  silly:\n    realm: {realm}\n    service: test-registry\n");
        Registry::serve(None, self.data.clone(), &auth).await
    }

    async fn serve(dir: Option<tempfile::TempDir>, data: PathBuf, auth: &str) -> Option<Registry> {
        let how = "apt-get install docker-registry busybox-static";
        if busybox().is_none() {
            crate::helpers::skipped("SUBAGENTD_REQUIRE_REGISTRY", "images", "no static busybox", how);
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = std::env::temp_dir().join(format!("subagentd-registry-{port}.yml"));
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth}",
                data.display()
            ),
        )
        .unwrap();
        let child = match std::process::Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                crate::helpers::skipped("SUBAGENTD_REQUIRE_REGISTRY", "images", &format!("docker-registry: {e}"), how);
                return None;
            }
        };
        let r = Registry { child, addr: format!("127.0.0.1:{port}"), data, _dir: dir };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Up: answering /v2/ (200, or 401 where it asks for a token).
        while !reqwest::get(format!("http://{}/v2/", r.addr))
            .await
            .is_ok_and(|r| r.status() == 200 || r.status() == 401)
        {
            assert!(std::time::Instant::now() < deadline, "the registry did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(r)
    }

    fn client(&self) -> oci_client::Client {
        oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::HttpsExcept(vec![self.addr.clone()]),
            ..Default::default()
        })
    }

    /// Push an image of `layers` (each a tar, gzip-compressed or not) with `env` in its config, as
    /// `repo:tag`; its manifest digest.
    pub async fn push(&self, repo_tag: &str, layers: Vec<Vec<u8>>, env: &[&str]) -> String {
        let r: Reference = format!("{}/{repo_tag}", self.addr).parse().unwrap();
        let layers: Vec<ImageLayer> = layers
            .into_iter()
            .map(|l| {
                if l.starts_with(&[0x1f, 0x8b]) {
                    ImageLayer::oci_v1_gzip(l, None)
                } else {
                    ImageLayer::oci_v1(l, None)
                }
            })
            .collect();
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": env, "Cmd": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.sha256_digest()).collect::<Vec<_>>()},
        });
        let client = self.client();
        client
            .push(
                &r,
                &layers,
                Config::oci_v1(serde_json::to_vec(&config).unwrap(), None),
                &RegistryAuth::Anonymous,
                None,
            )
            .await
            .unwrap();
        client.fetch_manifest_digest(&r, &RegistryAuth::Anonymous).await.unwrap()
    }

    /// `repo:tag` as a reference on this registry.
    pub fn image(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.addr)
    }
}

/// A gzip-compressed tar made by `f`.
pub fn tar_gz(f: impl FnOnce(&mut tar::Builder<&mut Vec<u8>>)) -> Vec<u8> {
    let mut raw = Vec::new();
    {
        let mut b = tar::Builder::new(&mut raw);
        f(&mut b);
        b.finish().unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

/// An entry written as given: its name and link bytes raw (no tool's checks), its kind and mode.
pub fn entry(b: &mut tar::Builder<&mut Vec<u8>>, name: &str, kind: tar::EntryType, link: &str, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_old();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(0);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// The base layer: busybox at `/bin/busybox`, `sh`, `ls`, `cat`, `env`, `id`… linked to it, and
/// `/etc/image-release`.
pub fn busybox_layer() -> Vec<u8> {
    let bb = std::fs::read(busybox().expect("busybox")).unwrap();
    tar_gz(|b| {
        use tar::EntryType as E;
        entry(b, "bin/", E::Directory, "", 0o755, b"");
        entry(b, "bin/busybox", E::Regular, "", 0o755, &bb);
        for tool in [
            "sh", "ls", "cat", "env", "id", "echo", "test", "touch", "pwd", "true", "wc", "head", "stat", "mkdir",
            "rm", "sleep", "wget", "nc",
        ] {
            entry(b, &format!("bin/{tool}"), E::Symlink, "busybox", 0o777, b"");
        }
        entry(b, "etc/", E::Directory, "", 0o755, b"");
        entry(b, "etc/image-release", E::Regular, "", 0o644, b"busybox test image\n");
    })
}
