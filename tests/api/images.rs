//! Images for the sandbox (issue 63), against a real registry on loopback (`registry.rs`): the
//! pull and its guard, the cache, hostile layers, and commands in an image's root.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagentd::tools::image::{Access, ImageError, Images, Settings};
use subagentd::tools::sandbox::Place;
use subagentd::tools::ssrf::AllowList;
use tar::EntryType as E;

use crate::registry::{busybox_layer, entry, tar_gz, Registry};

fn settings(reg: &Registry, dir: &std::path::Path, allow: &str) -> Settings {
    Settings {
        dir: dir.to_path_buf(),
        allow: Arc::new(AllowList::parse(allow).unwrap().named("SUBAGENTD_REGISTRY_ALLOW")),
        insecure: vec![reg.addr.clone()],
        max_bytes: 64 << 20,
        max_entries: 10_000,
        cache_bytes: 1 << 30,
        pull_timeout: Duration::from_secs(30),
        egress: Arc::new(AllowList::parse("*").unwrap()),
        egress_ports: None,
    }
}

/// A directory the sandbox's uid can reach (0755 all the way), for the cache.
fn cache_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new().prefix("subagentd-test-images-").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[tokio::test]
async fn an_image_is_pulled_once_by_digest_and_then_served_from_the_cache() {
    let Some(reg) = Registry::start().await else { return };
    let digest = reg.push("test/bb:1", vec![busybox_layer()], &["PATH=/bin", "LANG=image-lang"]).await;
    let dir = cache_dir();
    let images = Arc::new(Images::open(settings(&reg, dir.path(), "127.0.0.1/32")).await.unwrap());
    let reference = reg.image("test/bb:1");
    assert_eq!(images.resolve(&reference, &Access::Anonymous).await.unwrap(), digest);

    // Two first users at once: one pull, the other waits for it.
    let (a, b) = tokio::join!(
        images.root(&reference, &digest, &Access::Anonymous),
        images.root(&reference, &digest, &Access::Anonymous)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.1.is_some() as u8 + b.1.is_some() as u8, 1, "one pull for two first users");
    let stats = a.1.clone().or(b.1.clone()).unwrap();
    assert!(stats.fetched_bytes > 500_000 && stats.unpacked.bytes > 1_000_000, "{stats:?}");
    assert_eq!(a.0.rootfs, b.0.rootfs);
    assert!(a.0.rootfs.join("bin/busybox").is_file() && a.0.rootfs.join("workspace").is_dir());
    assert_eq!(a.0.env, vec!["PATH=/bin".to_string(), "LANG=image-lang".to_string()]);

    // Another process opening the same cache finds it whole, with no network at all.
    drop((a, b));
    drop(images);
    let offline = settings(&reg, dir.path(), "");
    let again = Images::open(offline).await.unwrap();
    let (root, stats) = again.root(&reference, &digest, &Access::Anonymous).await.unwrap();
    assert!(stats.is_none(), "served from the cache");
    assert_eq!(root.env[1], "LANG=image-lang");
}

#[tokio::test]
async fn unknown_tags_and_registries_off_the_allow_list_fail_clearly_and_soon() {
    let Some(reg) = Registry::start().await else { return };
    reg.push("test/bb:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let dir = cache_dir();
    let images = Images::open(settings(&reg, dir.path(), "127.0.0.1/32")).await.unwrap();

    let started = Instant::now();
    let e = images.resolve(&reg.image("test/bb:nope"), &Access::Anonymous).await.unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
    assert_eq!(e.code().as_str(), "environment_not_found");
    let e = images.resolve(&reg.image("test/none:1"), &Access::Anonymous).await.unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    // A registry the list does not name: refused before any connection.
    let e = images.check("10.1.2.3:5000/team/app:1").unwrap_err();
    assert_eq!(e.code().as_str(), "environment_refused");
    assert!(e.to_string().contains("SUBAGENTD_REGISTRY_ALLOW"), "{e}");
    assert!(images.check("not a reference").is_err());
    let named = settings(&reg, dir.path(), "localhost");
    let by_name = Images::open(named).await.unwrap();
    let e = by_name.check("registry.example.com/team/app:1").unwrap_err();
    assert!(e.to_string().contains("registry.example.com") && e.to_string().contains("not on the allow-list"), "{e}");

    // A name the list allows that resolves to loopback, which it does not: refused by the guard
    // where the connection is made (the egress proxy), not by the name.
    let port = reg.addr.rsplit_once(':').unwrap().1;
    let e = by_name.resolve(&format!("localhost:{port}/test/bb:1"), &Access::Anonymous).await.unwrap_err();
    assert!(e.to_string().contains("loopback"), "{e:?}");
}

#[tokio::test]
async fn a_hostile_layer_is_unpacked_safely() {
    let Some(reg) = Registry::start().await else { return };
    let dir = cache_dir();
    let outside = dir.path().join("outside");
    let lower = tar_gz(|b| {
        entry(b, "a/", E::Directory, "", 0o755, b"");
        entry(b, "a/keep", E::Regular, "", 0o644, b"kept");
        entry(b, "a/gone", E::Regular, "", 0o644, b"whited out");
        entry(b, "opq/", E::Directory, "", 0o755, b"");
        entry(b, "opq/lower", E::Regular, "", 0o644, b"lower");
        entry(b, "data", E::Regular, "", 0o644, b"inside");
    });
    let escape = format!("../../../../../../../..{}/escaped", outside.display());
    let upper = tar_gz(|b| {
        entry(b, &escape, E::Regular, "", 0o644, b"escaped");
        entry(b, "evil", E::Symlink, &outside.to_string_lossy(), 0o777, b"");
        entry(b, "evil/through-link", E::Regular, "", 0o644, b"through a link");
        entry(b, "abs", E::Symlink, "/etc/image-release", 0o777, b"");
        entry(b, "null", E::Char, "", 0o666, b"");
        entry(b, "disk", E::Block, "", 0o666, b"");
        entry(b, "suid", E::Regular, "", 0o4755, b"#!/bin/sh\n");
        entry(b, "sgid-dir/", E::Directory, "", 0o2775, b"");
        entry(b, "hard-out", E::Link, "../../etc/passwd", 0o644, b"");
        entry(b, "hard-abs", E::Link, "/etc/passwd", 0o644, b"");
        entry(b, "hard-link-dir", E::Link, "evil/x", 0o644, b"");
        entry(b, "hard-in", E::Link, "data", 0o644, b"");
        entry(b, "a/.wh.gone", E::Regular, "", 0o644, b"");
        entry(b, "opq/new", E::Regular, "", 0o644, b"new");
        entry(b, "opq/.wh..wh..opq", E::Regular, "", 0o644, b"");
        // Whiteouts are of lower layers only: what this layer made (a directory it made its way
        // through too) stays; and one that names the directory or its parent names nothing.
        entry(b, "fresh/deep/own", E::Regular, "", 0o644, b"own");
        entry(b, "fresh/.wh..wh..opq", E::Regular, "", 0o644, b"");
        entry(b, "twice", E::Regular, "", 0o644, b"twice");
        entry(b, ".wh.twice", E::Regular, "", 0o644, b"");
        entry(b, ".wh...", E::Regular, "", 0o644, b"");
        entry(b, "opq/.wh..", E::Regular, "", 0o644, b"");
        entry(b, "world", E::Regular, "", 0o666, b"w");
        // gVisor's library's mount point, a link out: the service makes its own file there, and
        // neither empties nor changes the mode of the file the link names.
        entry(b, "dev/", E::Directory, "", 0o755, b"");
        entry(b, "dev/.subagentd-statx.so", E::Symlink, &outside.join("victim").to_string_lossy(), 0o777, b"");
    });
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), "untouched").unwrap();
    std::fs::set_permissions(outside.join("victim"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let digest = reg.push("test/hostile:1", vec![busybox_layer(), lower, upper], &["PATH=/bin"]).await;
    let images = Images::open(settings(&reg, dir.path(), "127.0.0.1/32")).await.unwrap();
    let (root, stats) = images.root(&reg.image("test/hostile:1"), &digest, &Access::Anonymous).await.unwrap();
    let stats = stats.unwrap();
    let r = &root.rootfs;

    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1, "nothing written outside the root");
    assert_eq!(std::fs::read_to_string(outside.join("victim")).unwrap(), "untouched");
    let victim = std::fs::metadata(outside.join("victim")).unwrap().permissions().mode();
    assert_eq!(victim & 0o777, 0o600, "nor its mode changed");
    let mp = std::fs::symlink_metadata(r.join("dev/.subagentd-statx.so")).unwrap();
    assert!(mp.is_file() && mp.len() == 0, "the mount point is a file of the service's own");
    assert!(std::fs::symlink_metadata(r.join("evil")).unwrap().file_type().is_symlink(), "links are kept as links");
    assert_eq!(std::fs::read_link(r.join("abs")).unwrap().to_string_lossy(), "/etc/image-release");
    assert!(!r.join("null").exists() && !r.join("disk").exists(), "no device nodes");
    let suid = std::fs::metadata(r.join("suid")).unwrap().permissions().mode();
    assert_eq!(suid & 0o7777, 0o755, "setuid cleared");
    let sgid = std::fs::metadata(r.join("sgid-dir")).unwrap().permissions().mode();
    assert_eq!(sgid & 0o7000, 0, "setgid cleared");
    assert!(!r.join("hard-out").exists() && !r.join("hard-abs").exists() && !r.join("hard-link-dir").exists());
    assert_eq!(std::fs::read_to_string(r.join("hard-in")).unwrap(), "inside", "a hard link inside is kept");
    assert_eq!(std::fs::read_to_string(r.join("a/keep")).unwrap(), "kept");
    assert!(!r.join("a/gone").exists(), "a whiteout removes a lower layer's file");
    assert!(!r.join("opq/lower").exists(), "an opaque directory drops what lower layers put in it");
    assert_eq!(std::fs::read_to_string(r.join("opq/new")).unwrap(), "new", "and keeps its own layer's");
    assert!(std::fs::symlink_metadata(r.join("a/.wh.gone")).is_err() && !r.join("opq/.wh..wh..opq").exists());
    assert_eq!(std::fs::read_to_string(r.join("fresh/deep/own")).unwrap(), "own", "this layer's own stays");
    assert_eq!(std::fs::read_to_string(r.join("twice")).unwrap(), "twice");
    assert!(r.join("opq").is_dir() && r.join("bin/busybox").is_file(), "`.wh..` removed nothing");
    let world = std::fs::metadata(r.join("world")).unwrap().permissions().mode();
    assert_eq!(world & 0o777, 0o644, "no write bits for the group or others");
    let reasons: Vec<(&str, &str)> = stats.unpacked.dropped.iter().map(|d| (d.path.as_str(), d.reason)).collect();
    for (path, why) in [
        (escape.as_str(), "a path that leads outside (..)"),
        ("evil/through-link", "a parent is a link or a file"),
        ("null", "a device node"),
        ("disk", "a device node"),
        ("hard-out", "a hard link that leads outside"),
        ("hard-link-dir", "a hard link to no regular file of the image"),
        (".wh...", "a whiteout of no entry"),
        ("opq/.wh..", "a whiteout of no entry"),
    ] {
        assert!(reasons.contains(&(path, why)), "{path}: {why} in {reasons:?}");
    }
    assert_eq!(stats.unpacked.bits_cleared, 1, "{stats:?}");
    // Nothing of the root outside its own directory of the cache.
    for e in walkdir::WalkDir::new(dir.path()).follow_links(false).into_iter().flatten() {
        let m = e.path().symlink_metadata().unwrap();
        assert!(!m.file_type().is_block_device() && !m.file_type().is_char_device(), "{}", e.path().display());
    }
}

#[tokio::test]
async fn caps_stop_a_pull_and_leave_no_root() {
    let Some(reg) = Registry::start().await else { return };
    let dir = cache_dir();
    // 10 MiB of zeros compress to ~10 KiB: the unpacked cap holds as the entries come.
    let bomb = tar_gz(|b| entry(b, "zeros", E::Regular, "", 0o644, &vec![0u8; 10 << 20]));
    let many = tar_gz(|b| {
        for i in 0..200 {
            entry(b, &format!("f{i}"), E::Regular, "", 0o644, b"x");
        }
    });
    let bomb_digest = reg.push("test/bomb:1", vec![bomb], &[]).await;
    let many_digest = reg.push("test/many:1", vec![many], &[]).await;
    let mut s = settings(&reg, dir.path(), "127.0.0.1/32");
    s.max_bytes = 4 << 20;
    s.max_entries = 100;
    let images = Images::open(s).await.unwrap();
    let e = images.root(&reg.image("test/bomb:1"), &bomb_digest, &Access::Anonymous).await.unwrap_err();
    assert_eq!(e.code().as_str(), "environment_too_large", "{e}");
    let e = images.root(&reg.image("test/many:1"), &many_digest, &Access::Anonymous).await.unwrap_err();
    assert_eq!(e.code().as_str(), "environment_too_large", "{e}");
    assert!(e.to_string().contains("100 entries"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path().join("roots")).unwrap().count(), 0, "no root made");
    let left: Vec<_> = walkdir::WalkDir::new(dir.path().join("tmp"))
        .into_iter()
        .flatten()
        .filter(|e| e.file_type().is_file())
        .collect();
    assert!(left.is_empty(), "nothing left half-made: {left:?}");
}

#[tokio::test]
async fn what_a_killed_process_left_is_removed_and_the_cache_keeps_to_its_bound() {
    let Some(reg) = Registry::start().await else { return };
    let dir = cache_dir();
    let one = reg.push("test/one:1", vec![busybox_layer()], &[]).await;
    let two = reg
        .push("test/two:1", vec![busybox_layer(), tar_gz(|b| entry(b, "two", E::Regular, "", 0o644, b"2"))], &[])
        .await;
    // A half-built root of a process that is gone (pid 2^22 + 1 is past pid_max's default), and a
    // root with no record beside it.
    let half = dir.path().join("tmp/4194305/pull-x/rootfs/bin");
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("sh"), "half").unwrap();
    let unrecorded = dir.path().join("roots").join(one.trim_start_matches("sha256:")).join("rootfs");
    std::fs::create_dir_all(&unrecorded).unwrap();
    let mut s = settings(&reg, dir.path(), "127.0.0.1/32");
    // Room for one busybox root, not two.
    s.cache_bytes = 3 << 20;
    let images = Images::open(s).await.unwrap();
    assert!(!dir.path().join("tmp/4194305").exists(), "a gone process's half pull is removed");
    assert!(images.cached_digests().is_empty(), "a root with no record is not used");
    let (held, stats) = images.root(&reg.image("test/one:1"), &one, &Access::Anonymous).await.unwrap();
    assert!(stats.is_some(), "pulled anew, not taken from what was half there");
    // While `one` is in use, a second image goes past the bound, and `one` stays.
    let (second, _) = images.root(&reg.image("test/two:1"), &two, &Access::Anonymous).await.unwrap();
    assert!(held.rootfs.join("bin/busybox").is_file(), "a root in use is never removed");
    drop(second);
    drop(held);
    // Neither in use now: the next pull past the bound removes the roots used longest ago.
    let three = reg.push("test/three:1", vec![busybox_layer()], &["X=3"]).await;
    let (_third, _) = images.root(&reg.image("test/three:1"), &three, &Access::Anonymous).await.unwrap();
    let cached = images.cached_digests();
    assert!(cached.len() < 3, "the cache kept to its bound: {cached:?}");
    assert!(cached.contains(&three), "the root just pulled stays");
}

#[tokio::test]
async fn a_command_sees_the_images_files_and_env_and_not_the_hosts_usr() {
    let Some(reg) = Registry::start().await else { return };
    if !crate::sandbox::has_bwrap() {
        return;
    }
    let digest =
        reg.push("test/bb:1", vec![busybox_layer()], &["PATH=/bin", "LANG=image-lang", "HOME=/home/img"]).await;
    let dir = cache_dir();
    let images = Images::open(settings(&reg, dir.path(), "127.0.0.1/32")).await.unwrap();
    let (root, _) = images.root(&reg.image("test/bb:1"), &digest, &Access::Anonymous).await.unwrap();
    let limits = subagentd::tools::sandbox::Limits {
        max_timeout: Duration::from_secs(10),
        memory_bytes: 256 << 20,
        processes: 64,
        write_bytes: 8 << 20,
        write_entries: 1000,
        tmp_bytes: 4 << 20,
    };
    let copies = cache_dir();
    let cfg = subagentd::config::Config::defaults();
    let (runtime, program) = subagentd::tools::sandbox::Runtime::of(&cfg);
    let sb = subagentd::tools::sandbox::Sandbox::probe(runtime, program, limits, 2, 0, copies.path()).unwrap();
    let copy = copies.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    subagentd::tools::sandbox::hand_over(&copy, sb.uid()).unwrap();
    std::env::set_var("SUBAGENTD_TEST_SECRET", "service-env-secret");
    let max = subagentd::tools::files::Usage { bytes: 1 << 20, entries: 100 };
    let cmd = "cat /etc/image-release; env; ls /usr/bin/python3 /usr/lib 2>&1; pwd; id -u; echo made > out; touch /bin/x 2>&1; \
               cat /proc/self/mountinfo; true";
    let (out, outcome) = sb
        .run(
            "t",
            Place { copy: &copy, max_copy: max, image: Some(&root), setup: false, net: None },
            cmd,
            Duration::from_secs(10),
            64 * 1024,
        )
        .await;
    let text = out.content;
    assert_eq!(outcome, subagentd::tools::sandbox::Outcome::Ok, "{text}");
    assert!(text.contains("busybox test image"), "the image's files: {text}");
    assert!(
        text.contains("LANG=image-lang") && text.contains("PATH=/bin") && text.contains("HOME=/home/img"),
        "{text}"
    );
    assert!(!text.contains("service-env-secret") && !text.contains("DATABASE_URL"), "{text}");
    assert!(text.contains("/usr/bin/python3: No such file"), "not the host's /usr: {text}");
    // Under gVisor: uid 0 of its own kernel (the copy's owner there), with no capability, and the
    // image's files are another uid's there.
    let gvisor = sb.runtime() == subagentd::tools::sandbox::Runtime::Gvisor;
    assert!(text.contains(if gvisor { "/workspace\n0\n" } else { "/workspace\n1000\n" }), "{text}");
    assert!(
        text.contains("Read-only file system") || (gvisor && text.contains("Permission denied")),
        "the image's root is read-only: {text}"
    );
    // gVisor's mounts say so too.
    assert!(!gvisor || text.lines().any(|l| l.contains(" / / ro ")), "{text}");
    assert_eq!(std::fs::read_to_string(copy.join("out")).unwrap(), "made\n", "the copy is written");
}

/// What a task in an environment needs here: a registry on loopback, a git server for its
/// workspace, and the sandbox; `None` (each says why) where one is missing.
async fn sandboxed() -> Option<(Registry, crate::workspaces::GitServer)> {
    let reg = Registry::start().await?;
    let srv = crate::workspaces::git_server().await?;
    crate::sandbox::has_bwrap().then_some((reg, srv))
}

/// The sandbox's settings with a registry on loopback, and the image cache in `dir`.
fn app_config(reg: &Registry, dir: &std::path::Path) -> impl FnOnce(&mut subagentd::config::Config) {
    let (addr, dir) = (reg.addr.clone(), dir.to_path_buf());
    move |c| {
        c.builtin_tools_off = "web_fetch,web_search".into();
        c.workspace_git_allow = Some("127.0.0.1/32".into());
        c.default_model = Some("mock/m".into());
        c.registry_allow = Some("127.0.0.1/32".into());
        c.insecure_registries = addr;
        c.image_dir = Some(dir);
    }
}

/// The prompt whose mock makes these calls, one a turn.
fn script(commands: &[&str]) -> String {
    let list: Vec<Value> = commands.iter().map(|c| json!({"tool": "run_command", "args": {"command": c}})).collect();
    format!("run it [mock:calls={}]", Value::Array(list))
}

/// An app over `reg` (its image cache in `dir`) with an admin token, and keys of two tenants:
/// `acme` and `other`.
async fn two_tenants(reg: &Registry, dir: &std::path::Path) -> (crate::helpers::TestApp, String, String) {
    let tweak = app_config(reg, dir);
    let app = crate::helpers::spawn_app_with(
        |c| {
            tweak(c);
            c.admin_token = Some(crate::mcp::ADMIN.into());
        },
        true,
    )
    .await;
    let (acme, other) = (crate::mcp::key(&app.base, "acme").await, crate::mcp::key(&app.base, "other").await);
    (app, acme, other)
}

/// Approve the first action the paused task `t` waits on.
async fn approve_first(app: &crate::helpers::TestApp, t: &Value) {
    let (id, acts) = (t["id"].as_str().unwrap(), t["pending_actions"].as_array().unwrap());
    let r = app
        .client
        .post(app.url(&format!("/tasks/{id}/actions")))
        .json(&json!([{"id": acts[0]["id"], "decision": "approve"}]))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
}

async fn submit(app: &crate::helpers::TestApp, body: Value) -> reqwest::Response {
    app.client.post(app.url("/tasks?wait=true&timeout=120")).json(&body).send().await.unwrap()
}

async fn events(app: &crate::helpers::TestApp, id: &str) -> Vec<Value> {
    events_as(app, id, None).await
}

async fn events_as(app: &crate::helpers::TestApp, id: &str, key: Option<&str>) -> Vec<Value> {
    let mut r = app.client.get(app.url(&format!("/tasks/{id}/events")));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    let ev: Value = r.send().await.unwrap().json().await.unwrap();
    ev["events"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_tasks_commands_run_in_its_image_pinned_to_the_digest_its_first_run_resolved() {
    let Some((reg, srv)) = sandboxed().await else { return };
    let first = reg.push("test/bb:1", vec![busybox_layer()], &["PATH=/bin", "LANG=image-lang"]).await;
    let dir = cache_dir();
    let app = crate::helpers::spawn_app_with(app_config(&reg, dir.path()), true).await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/bb:1");

    // Paused before its command (approval), after its first start resolved the tag.
    let body = json!({"workspace": {"git": repo}, "environment": {"image": image}, "approval": "propose",
        "prompt": script(&["cat /etc/image-release; echo lang=$LANG; ls /usr/bin/git; ls"])});
    let r = submit(&app, body).await;
    assert_eq!(r.status(), 200);
    let t: Value = r.json().await.unwrap();
    assert_eq!(t["status"], "requires_action", "{t}");
    assert_eq!(t["environment"], json!({"image": image, "digest": first}), "{t}");
    let id = t["id"].as_str().unwrap().to_string();

    // The tag moves; the paused task's next attempt runs in the digest it recorded.
    let moved = reg
        .push(
            "test/bb:1",
            vec![
                busybox_layer(),
                tar_gz(|b| {
                    entry(b, "etc/image-release", E::Regular, "", 0o644, b"the moved tag\n");
                }),
            ],
            &["PATH=/bin", "LANG=moved"],
        )
        .await;
    assert_ne!(moved, first);
    approve_first(&app, &t).await;
    let t = app.poll_until_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["environment"]["digest"], first.as_str());
    let out = crate::tools::tool_results(&app, &id).await;
    let out = out[0]["content"].as_str().unwrap();
    assert!(out.contains("busybox test image") && out.contains("lang=image-lang"), "the recorded digest: {out}");
    assert!(out.contains("/usr/bin/git: No such file"), "not the host's /usr: {out}");
    assert!(out.contains("check.sh"), "the task's copy at /workspace: {out}");
    let ready: Vec<Value> = events(&app, &id).await.into_iter().filter(|e| e["kind"] == "environment_ready").collect();
    assert_eq!(ready.len(), 2, "one a start: {ready:?}");
    assert_eq!(ready[0]["data"]["cached"], false);
    assert!(ready[0]["data"]["fetched_bytes"].as_u64().unwrap() > 500_000, "{ready:?}");
    assert_eq!(
        (ready[1]["data"]["cached"].as_bool(), ready[1]["data"]["digest"].as_str()),
        (Some(true), Some(first.as_str()))
    );

    // A new task resolves the tag anew.
    let t: Value = submit(
        &app,
        json!({"workspace": {"git": repo}, "environment": {"image": image},
        "prompt": script(&["cat /etc/image-release"])}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(t["environment"]["digest"], moved.as_str(), "{t}");
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    assert!(out[0]["content"].as_str().unwrap().contains("the moved tag"), "{out:?}");

    // An unknown tag: the task fails soon, naming it.
    let started = Instant::now();
    let t: Value = submit(
        &app,
        json!({"workspace": {"git": repo}, "environment": {"image": reg.image("test/bb:nope")},
        "prompt": script(&["true"])}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(
        (t["status"].as_str(), t["error"]["code"].as_str()),
        (Some("failed"), Some("environment_not_found")),
        "{t}"
    );
    assert!(t["error"]["message"].as_str().unwrap().contains("test/bb:nope"), "{t}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("subagentd_image_pulls_total{outcome=\"ok\"}"), "{metrics}");
    assert!(metrics.contains("subagentd_image_cache_hits_total"), "{metrics}");
    app.stop().await;
}

#[tokio::test]
async fn the_services_default_image_shows_on_its_tasks_and_bad_environments_are_refused_at_submission() {
    let Some((reg, srv)) = sandboxed().await else { return };
    let digest = reg.push("test/default:1", vec![busybox_layer()], &["PATH=/bin", "WHICH=default"]).await;
    let dir = cache_dir();
    let default = reg.image("test/default:1");
    let tweak = app_config(&reg, dir.path());
    let d = default.clone();
    let app = crate::helpers::spawn_app_with(
        move |c| {
            tweak(c);
            c.sandbox_image = Some(d);
        },
        true,
    )
    .await;
    let repo = format!("{}/repo.git", srv.base);
    let t: Value = submit(&app, json!({"workspace": {"git": repo}, "prompt": script(&["echo which=$WHICH"])}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["environment"], json!({"image": default, "digest": digest}), "{t}");
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    assert!(out[0]["content"].as_str().unwrap().contains("which=default"), "{out:?}");
    // A task without run_command has no environment.
    let t: Value = submit(&app, json!({"subagent_type": "explore", "workspace": {"git": repo}, "prompt": "look"}))
        .await
        .json()
        .await
        .unwrap();
    assert!(t.get("environment").is_none(), "{t}");

    let tasks_before: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    for (body, field, says) in [
        (
            json!({"workspace": {"git": repo}, "environment": {"image": "10.1.2.3:5000/team/app:1"}, "prompt": "x"}),
            "environment.image",
            "SUBAGENTD_REGISTRY_ALLOW",
        ),
        (
            json!({"workspace": {"git": repo}, "environment": {"image": "Not A Reference"}, "prompt": "x"}),
            "environment.image",
            "not an image reference",
        ),
        (
            json!({"workspace": {"git": repo}, "environment": {"name": "py"}, "prompt": "x"}),
            "environment.name",
            "no environment named",
        ),
        (json!({"workspace": {"git": repo}, "environment": {}, "prompt": "x"}), "environment", "give `image`"),
        (
            json!({"workspace": {"git": repo}, "environment": {"image": default, "extra": 1}, "prompt": "x"}),
            "",
            "extra",
        ),
        (
            json!({"subagent_type": "explore", "workspace": {"git": repo}, "environment": {"image": default}, "prompt": "x"}),
            "environment",
            "not given run_command",
        ),
    ] {
        let r = submit(&app, body.clone()).await;
        assert_eq!(r.status(), 422, "{body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let p: Value = r.json().await.unwrap();
        assert!(p.to_string().contains(says) && p.to_string().contains(field), "{body}: {p}");
    }
    let tasks_after: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(tasks_before, tasks_after, "a refusal changes nothing");
    app.stop().await;
}

#[tokio::test]
async fn a_kill_dash_nine_during_a_pull_leaves_nothing_a_later_task_uses() {
    let Some((reg, srv)) = sandboxed().await else { return };
    // 16 MiB that do not compress: a pull long enough to be killed in (and light enough beside
    // the other tests).
    let mut noise = vec![0u8; 16 << 20];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut noise);
    let big = {
        let mut raw = Vec::new();
        let mut b = tar::Builder::new(&mut raw);
        entry(&mut b, "noise", E::Regular, "", 0o644, &noise);
        b.finish().unwrap();
        drop(b);
        raw
    };
    let digest = reg.push("test/big:1", vec![busybox_layer(), big], &["PATH=/bin"]).await;
    let images = cache_dir();
    let api_cache = cache_dir();
    let app = crate::helpers::spawn_app_with(app_config(&reg, api_cache.path()), false).await;
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let env = |d: &tempfile::TempDir| -> Vec<(String, String)> {
        vec![
            ("SUBAGENTD_DATA_DIR".into(), d.path().display().to_string()),
            ("SUBAGENTD_IMAGE_DIR".into(), images.path().display().to_string()),
            ("SUBAGENTD_REGISTRY_ALLOW".into(), "127.0.0.1/32".into()),
            ("SUBAGENTD_INSECURE_REGISTRIES".into(), reg.addr.clone()),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW".into(), "127.0.0.1/32".into()),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF".into(), "web_fetch,web_search".into()),
            ("SUBAGENTD_LEASE_SECONDS".into(), "2".into()),
            ("SUBAGENTD_HEARTBEAT_SECONDS".into(), "1".into()),
        ]
    };
    let spawn = |d: &tempfile::TempDir| {
        let e = env(d);
        let refs: Vec<(&str, &str)> = e.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        crate::helpers::spawn_binary(&["worker"], &app.db.url, &refs)
    };
    let mut a = spawn(&da);
    crate::helpers::workers_up(&app.db.pool, 1, Duration::from_secs(30)).await;
    let repo = format!("{}/repo.git", srv.base);
    let t = app
        .submit(json!({"workspace": {"git": repo}, "environment": {"image": reg.image("test/big:1")},
            "prompt": script(&["wc -c /noise"])}))
        .await;
    let id = t["id"].as_str().unwrap().to_string();
    // Killed once its pull has begun writing (a layer in its build directory).
    let building = images.path().join("tmp").join(a.child.id().to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !walkdir::WalkDir::new(&building)
        .into_iter()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("layer-"))
    {
        assert!(Instant::now() < deadline, "the pull never began");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();
    assert_eq!(std::fs::read_dir(images.path().join("roots")).unwrap().count(), 0, "no root was made whole");
    assert!(building.exists(), "the killed pull left its build directory");

    let _b = spawn(&db);
    let done = app.poll_until_terminal(&id, Duration::from_secs(90)).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["environment"]["digest"], digest.as_str());
    assert!(!building.exists(), "the next start removed what the killed process left");
    let out = crate::tools::tool_results(&app, &id).await;
    assert!(out[0]["content"].as_str().unwrap().contains(&format!("{} /noise", 16 << 20)), "{out:?}");
    let ready: Vec<Value> = events(&app, &id).await.into_iter().filter(|e| e["kind"] == "environment_ready").collect();
    assert_eq!(ready.len(), 1, "the killed attempt never said it was ready: {ready:?}");
    assert_eq!(ready[0]["data"]["cached"], false, "pulled anew, whole");
    app.stop().await;
}

#[tokio::test]
async fn the_mcp_and_a2a_doors_take_an_environment_with_the_same_rules() {
    let Some((reg, srv)) = sandboxed().await else { return };
    let digest = reg.push("test/doors:1", vec![busybox_layer()], &["PATH=/bin", "DOOR=image"]).await;
    let dir = cache_dir();
    let app = crate::helpers::spawn_app_with(app_config(&reg, dir.path()), true).await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/doors:1");
    let mcp = crate::mcp::RawMcp::open(&app).await;
    let list = mcp.call(2, "tools/list", json!({})).await;
    assert!(list.text().await.unwrap().contains("\"environment\""), "the task tool's schema names environment");
    let args = json!({"subagent_type": "general", "description": "run", "workspace": {"git": repo},
                      "environment": {"image": image}, "prompt": script(&["echo door=$DOOR"])});
    let text = mcp.task(3, args).await.text().await.unwrap();
    assert!(text.contains("\"completed\""), "{text}");
    // A registry off the list is refused at this door too, and starts nothing.
    let bad = json!({"subagent_type": "general", "description": "x", "prompt": "x", "workspace": {"git": repo},
                     "environment": {"image": "10.1.2.3:5000/a/b:1"}});
    let text = mcp.task(4, bad).await.text().await.unwrap();
    assert!(text.contains("environment.image") && text.contains("isError"), "{text}");

    let send = json!({"jsonrpc": "2.0", "id": 5, "method": "SendMessage",
                      "params": {"message": {"messageId": "m-1", "role": "ROLE_USER",
                                             "parts": [{"text": script(&["echo door=$DOOR"])}],
                                             "metadata": {"workspace": {"git": repo}, "environment": {"image": image}}}}});
    let r = crate::a2a::raw(&app, "general", send).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let _ = r.text().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let ids: Vec<uuid::Uuid> = loop {
        let ids: Vec<uuid::Uuid> =
            sqlx::query_scalar("SELECT id FROM tasks WHERE finished_at IS NOT NULL ORDER BY created_at")
                .fetch_all(&app.db.pool)
                .await
                .unwrap();
        if ids.len() == 2 {
            break ids;
        }
        assert!(Instant::now() < deadline, "the tasks did not finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for id in ids {
        let t = app.get_task(&id.to_string()).await;
        assert_eq!(
            (t["status"].as_str(), t["environment"]["digest"].as_str()),
            (Some("completed"), Some(digest.as_str())),
            "{t}"
        );
        let out = crate::tools::tool_results(&app, &id.to_string()).await;
        assert!(out[0]["content"].as_str().unwrap().contains("door=image"), "{out:?}");
    }
    app.stop().await;
}

/// The build id a command printed (a UUID's line).
/// Whether the tests' sandbox is gVisor (`SUBAGENTD_SANDBOX_RUNTIME=gvisor`, the second pass of
/// `scripts/test`).
fn gvisor() -> bool {
    let cfg = subagentd::config::Config::defaults();
    subagentd::tools::sandbox::Runtime::of(&cfg).0 == subagentd::tools::sandbox::Runtime::Gvisor
}

fn build_id(out: &str) -> String {
    out.lines().find(|l| l.len() == 36 && l.matches('-').count() == 4).unwrap_or_default().to_string()
}

/// `GET /environments/{name}` until its status is no longer `building`.
async fn built(app: &crate::helpers::TestApp, key: &str, name: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut r = app.client.get(app.url(&format!("/environments/{name}")));
        if !key.is_empty() {
            r = r.bearer_auth(key);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status(), 200);
        let e: Value = r.json().await.unwrap();
        if e["status"] != "building" {
            return e;
        }
        assert!(Instant::now() < deadline, "still building: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_named_environments_setup_runs_once_for_two_tasks_then_again_after_a_change_and_a_failure_is_told() {
    let Some((reg, srv)) = sandboxed().await else { return };
    reg.push("test/base:1", vec![busybox_layer()], &["PATH=/bin", "LANG=base"]).await;
    let dir = cache_dir();
    let (app, acme, other) = two_tenants(&reg, dir.path()).await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/base:1");
    let put = |key: &str, name: &str, body: Value| {
        app.client.put(app.url(&format!("/environments/{name}"))).bearer_auth(key.to_string()).json(&body).send()
    };
    // The setup writes into the image's root (as uid 0 of its own namespace): a marker, and an
    // id of this build.
    // (gVisor has no /proc/sys/kernel/random/uuid: one made of /dev/urandom there.)
    let setup = r#"mkdir -p /opt/tool && { cat /proc/sys/kernel/random/uuid 2>/dev/null || { od -An -tx1 -N16 /dev/urandom | tr -d ' \n' | sed 's/^\(.\{8\}\)\(.\{4\}\)\(.\{4\}\)\(.\{4\}\)/\1-\2-\3-\4-/'; echo; }; } > /opt/tool/build-id && echo setup ran as $(id -u)"#;
    let r = put(&acme, "ci", json!({"image": image, "setup": setup})).await.unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let e = built(&app, &acme, "ci").await;
    assert_eq!(e["status"], "ready", "{e}");
    assert_eq!(e["exit_code"], 0, "{e}");
    assert!(e["output_tail"].as_str().unwrap().contains("setup ran as 0"), "{e}");
    assert!(
        e["digest"].as_str().unwrap().starts_with("sha256:") && e["size_bytes"].as_i64().unwrap() > 1_000_000,
        "{e}"
    );

    let task = |key: &str, env: Value| {
        let body = json!({"workspace": {"git": repo}, "environment": env,
            "prompt": script(&["cat /opt/tool/build-id; echo lang=$LANG; id -u; touch /opt/tool/x 2>&1; true"])});
        app.client.post(app.url("/tasks?wait=true&timeout=120")).bearer_auth(key.to_string()).json(&body).send()
    };
    let mut ids = vec![];
    for _ in 0..2 {
        let t: Value = task(&acme, json!({"name": "ci"})).await.unwrap().json().await.unwrap();
        assert_eq!(t["status"], "completed", "{t}");
        assert_eq!(t["environment"]["name"], "ci", "{t}");
        assert_eq!(t["environment"]["digest"], e["digest"], "{t}");
        let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
        let out = out[0]["content"].as_str().unwrap().to_string();
        // Under gVisor, uid 0 of its own kernel with no capability (as in the first test here).
        let uid = if gvisor() { "\n0\n" } else { "\n1000\n" };
        assert!(out.contains("lang=base") && out.contains(uid), "the image's Env, a non-root uid: {out}");
        assert!(
            out.contains("Read-only file system") || (gvisor() && out.contains("Permission denied")),
            "the built root is read-only in runs: {out}"
        );
        ids.push(build_id(&out));
        let ready: Vec<Value> = events_as(&app, t["id"].as_str().unwrap(), Some(&acme))
            .await
            .into_iter()
            .filter(|e| e["kind"] == "environment_ready")
            .collect();
        assert!(ready[0]["data"].get("setup_ms").is_none(), "the setup ran once, at the PUT: {ready:?}");
    }
    assert_eq!(ids[0], ids[1], "one build for both tasks");
    assert_eq!(ids[0].len(), 36, "{ids:?}");

    // A changed definition is built anew.
    let r = put(&acme, "ci", json!({"image": image, "setup": format!("{setup}; echo v2")})).await.unwrap();
    assert_eq!(r.status(), 200);
    let v2 = built(&app, &acme, "ci").await;
    assert_eq!(v2["status"], "ready", "{v2}");
    assert!(v2["output_tail"].as_str().unwrap().contains("v2"), "{v2}");
    let t: Value = task(&acme, json!({"name": "ci"})).await.unwrap().json().await.unwrap();
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    let id2 = build_id(out[0]["content"].as_str().unwrap());
    assert!(id2.len() == 36 && id2 != ids[0], "a new build: {id2} after {}", ids[0]);

    // A failing setup: `failed`, with its exit code and output; a task naming it fails, naming it.
    let r = put(&acme, "broken", json!({"image": image, "setup": "echo about to fail; exit 3"})).await.unwrap();
    assert_eq!(r.status(), 201);
    let b = built(&app, &acme, "broken").await;
    assert_eq!((b["status"].as_str(), b["exit_code"].as_i64()), (Some("failed"), Some(3)), "{b}");
    assert!(b["output_tail"].as_str().unwrap().contains("about to fail"), "{b}");
    let t: Value = task(&acme, json!({"name": "broken"})).await.unwrap().json().await.unwrap();
    assert_eq!(
        (t["status"].as_str(), t["error"]["code"].as_str()),
        (Some("failed"), Some("environment_failed")),
        "{t}"
    );
    let m = t["error"]["message"].as_str().unwrap();
    assert!(m.contains("\"broken\"") && m.contains("exit code 3"), "{m}");

    // Another tenant sees none of it, and cannot name it.
    let r = app.client.get(app.url("/environments/ci")).bearer_auth(&other).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let list: Value =
        app.client.get(app.url("/environments")).bearer_auth(&other).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["environments"], json!([]));
    let r = task(&other, json!({"name": "ci"})).await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("no environment named"));
    let list: Value =
        app.client.get(app.url("/environments")).bearer_auth(&acme).send().await.unwrap().json().await.unwrap();
    let names: Vec<&str> =
        list["environments"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["broken", "ci"]);

    // Bad definitions are refused and change nothing.
    for (body, says) in [
        (json!({"image": "10.1.2.3:5000/a/b:1"}), "SUBAGENTD_REGISTRY_ALLOW"),
        (json!({"image": image, "network": {"in_runs": true}}), "needs `network.allow`"),
        (json!({"image": image, "setup": "x".repeat(70_000)}), "64 KiB"),
        (json!({"image": image, "extra": true}), "extra"),
        (json!({"setup": "true"}), "image"),
    ] {
        let r = put(&acme, "bad", body.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{body}");
        assert!(r.text().await.unwrap().contains(says), "{body}");
    }
    assert_eq!(app.client.get(app.url("/environments/bad")).bearer_auth(&acme).send().await.unwrap().status(), 404);
    let r = app.client.delete(app.url("/environments/broken")).bearer_auth(&acme).send().await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(app.client.get(app.url("/environments/broken")).bearer_auth(&acme).send().await.unwrap().status(), 404);
    app.stop().await;
}

/// A task on a named environment keeps the definition its first start used: paused, then the
/// environment changed, its next attempt runs in the first definition's build, and the environment
/// (and a new task) in the new one.
#[tokio::test]
async fn a_paused_task_keeps_its_named_environments_definition_when_it_changes() {
    let Some((reg, srv)) = sandboxed().await else { return };
    reg.push("test/pin:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let dir = cache_dir();
    let app = crate::helpers::spawn_app_with(app_config(&reg, dir.path()), true).await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/pin:1");
    let put = |setup: &str| {
        app.client.put(app.url("/environments/pin")).json(&json!({"image": image, "setup": setup})).send()
    };
    assert_eq!(put("echo v1 > /opt-version").await.unwrap().status(), 201);
    assert_eq!(built(&app, "", "pin").await["status"], "ready");
    let body = json!({"workspace": {"git": repo}, "environment": {"name": "pin"}, "approval": "propose",
        "prompt": script(&["cat /opt-version"])});
    let t: Value = submit(&app, body).await.json().await.unwrap();
    assert_eq!(t["status"], "requires_action", "{t}");
    let id = t["id"].as_str().unwrap().to_string();

    assert_eq!(put("echo v2 > /opt-version").await.unwrap().status(), 200);
    let v2 = built(&app, "", "pin").await;
    assert_eq!(v2["status"], "ready", "{v2}");
    approve_first(&app, &t).await;
    let t = app.poll_until_terminal(&id, Duration::from_secs(60)).await;
    assert_eq!(t["status"], "completed", "{t}");
    let out = crate::tools::tool_results(&app, &id).await;
    assert!(out[0]["content"].as_str().unwrap().contains("v1"), "the first start's definition: {out:?}");
    // The environment still says what its new definition's build did.
    let now: Value = app.client.get(app.url("/environments/pin")).send().await.unwrap().json().await.unwrap();
    assert_eq!(
        (now["status"].as_str(), now["definition_hash"].as_str()),
        (Some("ready"), v2["definition_hash"].as_str())
    );
    let t: Value = submit(
        &app,
        json!({"workspace": {"git": repo}, "environment": {"name": "pin"}, "prompt": script(&["cat /opt-version"])}),
    )
    .await
    .json()
    .await
    .unwrap();
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    assert!(out[0]["content"].as_str().unwrap().contains("v2"), "a new task, the new definition: {out:?}");
    app.stop().await;
}

/// A setup runs once for every replica: the one that built it keeps its layer in PostgreSQL, and
/// another (a worker with a cache of its own) applies that layer instead of running the setup.
#[tokio::test]
async fn a_setup_built_on_one_replica_is_not_run_again_on_another() {
    let Some((reg, srv)) = sandboxed().await else { return };
    reg.push("test/shared:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let (dir_a, dir_b, data_b) = (cache_dir(), cache_dir(), tempfile::tempdir().unwrap());
    // The API's replica: it builds at the PUT (it runs the sandbox), and runs no task.
    let app = crate::helpers::spawn_app_with(app_config(&reg, dir_a.path()), false).await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/shared:1");
    // A build id, and a file removed from the image (a whiteout in the layer).
    let setup = "mkdir -p /opt && od -An -tx1 -N8 /dev/urandom | tr -d ' \\n' > /opt/build-id && \
                 rm /etc/image-release && echo built $(cat /opt/build-id)";
    let r = app.client.put(app.url("/environments/shared")).json(&json!({"image": image, "setup": setup})).send();
    assert_eq!(r.await.unwrap().status(), 201);
    let e = built(&app, "", "shared").await;
    assert_eq!(e["status"], "ready", "{e}");
    let id = e["output_tail"].as_str().unwrap().split("built ").nth(1).unwrap().trim().to_string();
    assert_eq!(id.len(), 16, "{e}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM environment_layers WHERE name = 'shared'")
        .fetch_one(&app.db.pool)
        .await
        .unwrap()
        == 0
    {
        assert!(Instant::now() < deadline, "the layer was never kept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (cache_b, data) = (dir_b.path().display().to_string(), data_b.path().display().to_string());
    let _worker = crate::helpers::spawn_binary(
        &["worker"],
        &app.db.url,
        &[
            ("SUBAGENTD_DATA_DIR", &data),
            ("SUBAGENTD_IMAGE_DIR", &cache_b),
            ("SUBAGENTD_REGISTRY_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_INSECURE_REGISTRIES", &reg.addr),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
            ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
        ],
    );
    crate::helpers::workers_up(&app.db.pool, 1, Duration::from_secs(30)).await;
    let t: Value = submit(
        &app,
        json!({"workspace": {"git": repo}, "environment": {"name": "shared"},
               "prompt": script(&["cat /opt/build-id; echo; cat /etc/image-release 2>&1; true"])}),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let tid = t["id"].as_str().unwrap();
    let out = crate::tools::tool_results(&app, tid).await;
    let out = out[0]["content"].as_str().unwrap();
    assert!(out.contains(&id), "the first replica's build, not a second run of the setup: {id} in {out}");
    assert!(out.contains("No such file"), "the whiteout applied: {out}");
    let ready: Vec<Value> = events(&app, tid).await.into_iter().filter(|e| e["kind"] == "environment_ready").collect();
    assert!(ready[0]["data"].get("setup_ms").is_none(), "no setup ran on the worker: {ready:?}");
    assert!(
        std::fs::read_dir(dir_b.path().join("roots")).unwrap().count() >= 2,
        "the worker's own cache holds the image and the environment"
    );
    // Removed with the environment.
    app.client.delete(app.url("/environments/shared")).send().await.unwrap();
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM environment_layers").fetch_one(&app.db.pool).await.unwrap();
    assert_eq!(left, 0);
    app.stop().await;
}

/// The MCP and A2A doors take a task's environment from the protocols' official SDKs (the MCP
/// Python SDK's `call_tool`, a2a-sdk's client with the message's metadata), against the real
/// binary with the Host and Origin a deployed client sends: both tasks run their command in the
/// image, and a registry off the allow-list is refused at both doors.
#[tokio::test]
async fn the_official_mcp_and_a2a_sdks_run_a_task_in_an_environment() {
    let Some(python) = crate::mcp::python() else { return };
    let Some((reg, srv)) = sandboxed().await else { return };
    reg.push("test/sdk:1", vec![busybox_layer()], &["PATH=/bin", "DOOR=image"]).await;
    let (db, cache, data) = (crate::helpers::test_db().await, cache_dir(), tempfile::tempdir().unwrap());
    let (cache, data_dir) = (cache.path().display().to_string(), data.path().display().to_string());
    let r = crate::mcp::replica(
        &db,
        &[
            ("SUBAGENTD_DATA_DIR", &data_dir),
            ("SUBAGENTD_IMAGE_DIR", &cache),
            ("SUBAGENTD_REGISTRY_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_INSECURE_REGISTRIES", &reg.addr),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
            ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
            ("SUBAGENTD_PUBLIC_URL", "http://agents.example.com"),
        ],
    )
    .await;
    let key = crate::mcp::key(&r.base, "sdk").await;
    let (repo, image, prompt) =
        (format!("{}/repo.git", srv.base), reg.image("test/sdk:1"), script(&["echo door=$DOOR"]));
    let more = ["--image", image.as_str(), "--repo", repo.as_str(), "--prompt", prompt.as_str()];
    let mcp = crate::mcp::py("environment", &format!("{}/mcp", r.base), &key, &more).await.unwrap();
    let mut args: Vec<String> =
        ["environment", "--base", "http://agents.example.com", "--connect"].iter().map(|s| s.to_string()).collect();
    args.extend([r.base.trim_start_matches("http://").to_string(), "--key".into(), key.clone()]);
    args.extend(more.iter().map(|s| s.to_string()));
    let a2a = crate::mcp::run_script(python, "a2a_client.py", args, vec![]).await;
    assert!(a2a["refused"].as_str().unwrap().contains("environment.image"), "{a2a}");
    for id in [mcp["task_id"].as_str().unwrap(), a2a["task_id"].as_str().unwrap()] {
        let out: Vec<Value> = sqlx::query_scalar(
            "SELECT message FROM task_message_log WHERE task_id = $1::uuid AND message->>'role' = 'tool'",
        )
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        assert!(out.iter().any(|m| m.to_string().contains("door=image")), "the command ran in the image: {out:?}");
    }
    let tasks: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks").fetch_one(&db.pool).await.unwrap();
    assert_eq!(tasks, 2, "the refused ones started nothing");
}

/// A listener on `ip` answering every request with `hello from {ip}`.
async fn hello(ip: &str) -> u16 {
    let l = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let ip = ip.to_string();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut c, _)) = l.accept().await {
            let mut b = [0u8; 1024];
            let _ = c.read(&mut b).await;
            let body = format!("hello from {ip}\n");
            let msg = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = c.write_all(msg.as_bytes()).await;
        }
    });
    port
}

#[tokio::test]
async fn with_the_proxy_an_allowed_host_is_reached_and_another_is_not_and_without_it_nothing_is() {
    let Some((reg, srv)) = sandboxed().await else { return };
    let (allowed, other) = (hello("127.0.0.2").await, hello("127.0.0.3").await);
    reg.push("test/net:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let dir = cache_dir();
    let tweak = app_config(&reg, dir.path());
    let app = crate::helpers::spawn_app_with(
        |c| {
            tweak(c);
            // The operator's guard lets private addresses through only where a CIDR allows them:
            // 127.0.0.2 and 127.0.0.3 here, so that the environment's own list decides.
            c.sandbox_egress_allow = "127.0.0.2/32,127.0.0.3/32".into();
            // The test's servers listen on ports of their own (80 and 443 by default).
            c.sandbox_egress_ports = "*".into();
        },
        true,
    )
    .await;
    let repo = format!("{}/repo.git", srv.base);
    let image = reg.image("test/net:1");
    // (Debian's static busybox wget crashes with `-T`: no timeout given.)
    // Under gVisor, busybox's nc through $HTTP_PROXY, printing as wget does: the network of Debian's
    // runsc (20221219, the host's through `--network=host`) answers a blocking read(2) of a socket
    // with EAGAIN when no data is there yet, which busybox's wget does (curl, Python, Go and Node
    // poll or use recv, and work). docs/operations.md says so.
    let gv = gvisor();
    let fetch = |ip: &str, port: u16| {
        if gv {
            format!(
                "p=${{HTTP_PROXY#http://}}; r=$(printf 'GET http://{ip}:{port}/ HTTP/1.0\r\nHost: {ip}\r\n\r\n' | \
                 nc ${{p%:*}} ${{p##*:}} 2>&1 | tr -d '\r'); if echo \"$r\" | grep -q '^HTTP/1.. 200'; then \
                 echo \"$r\" | sed '1,/^$/d'; echo rc=0; else echo \"$r\" | head -1; echo rc=1; fi"
            )
        } else {
            format!("wget -q -O - http://{ip}:{port}/ 2>&1; echo rc=$?")
        }
    };
    let setup = if gv {
        // The body alone in the file (its last line, the rc, left out), as wget's -O.
        format!(
            "{} | sed '$d' > /opt-fetched; cat /opt-fetched; echo rc=$?; {}",
            fetch("127.0.0.2", allowed),
            fetch("127.0.0.3", other)
        )
    } else {
        format!(
            "wget -q -O /opt-fetched http://127.0.0.2:{allowed}/; cat /opt-fetched; echo rc=$?; {}",
            fetch("127.0.0.3", other)
        )
    };
    let put = |name: &str, body: Value| app.client.put(app.url(&format!("/environments/{name}"))).json(&body).send();
    let r =
        put("net", json!({"image": image, "setup": setup, "network": {"allow": ["127.0.0.2/32"], "in_runs": true}}))
            .await
            .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let e = built(&app, "", "net").await;
    assert_eq!(e["status"], "ready", "{e}");
    let tail = e["output_tail"].as_str().unwrap();
    assert!(tail.contains("hello from 127.0.0.2\nrc=0"), "the allowed host, through the proxy: {tail}");
    assert!(tail.contains("403 Forbidden") && tail.ends_with("rc=1\n"), "another host is refused: {tail}");
    let metrics = app.client.get(app.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("subagentd_egress_refused_total{purpose=\"environment\",tenant=\"default\"}"),
        "{metrics}"
    );

    // In runs (in_runs: true, a public repository): the same.
    let cmd =
        format!("cat /opt-fetched; {}; {}; echo $HTTP_PROXY", fetch("127.0.0.2", allowed), fetch("127.0.0.3", other));
    let t: Value =
        submit(&app, json!({"workspace": {"git": repo}, "environment": {"name": "net"}, "prompt": script(&[&cmd])}))
            .await
            .json()
            .await
            .unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    let out = out[0]["content"].as_str().unwrap();
    assert!(out.contains("hello from 127.0.0.2\nhello from 127.0.0.2\nrc=0"), "{out}");
    assert!(out.contains("403 Forbidden") && out.contains("rc=1\nhttp://127.0.0.1:3128"), "{out}");

    // Without network (no allow-list, or none in runs): nothing is reached, not even the host's
    // loopback, and there is no proxy.
    let r = put("closed", json!({"image": image, "setup": fetch("127.0.0.2", allowed)})).await.unwrap();
    assert_eq!(r.status(), 201);
    let e = built(&app, "", "closed").await;
    let tail = e["output_tail"].as_str().unwrap();
    assert!(!tail.contains("hello") && tail.contains("rc=1"), "{tail}");
    let r = put("setup-only", json!({"image": image, "network": {"allow": ["127.0.0.2/32"]}})).await.unwrap();
    assert_eq!(r.status(), 201);
    built(&app, "", "setup-only").await;
    for name in ["closed", "setup-only"] {
        let cmd = format!("{}; echo proxy=$HTTP_PROXY", fetch("127.0.0.2", allowed));
        let t: Value =
            submit(&app, json!({"workspace": {"git": repo}, "environment": {"name": name}, "prompt": script(&[&cmd])}))
                .await
                .json()
                .await
                .unwrap();
        let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
        let out = out[0]["content"].as_str().unwrap();
        assert!(!out.contains("hello") && out.contains("rc=1\nproxy=\n"), "{name}: {out}");
    }
    // A tenant's list cannot open what the operator's guard refuses (a loopback address it has
    // no CIDR for), nor name every host.
    for (allow, says) in
        [(json!(["*"]), "not `*`"), (json!(["10.0.0.0/99"]), "prefix"), (json!(["0.0.0.0/0"]), "at most /16")]
    {
        let r = put("bad", json!({"image": image, "network": {"allow": allow}})).await.unwrap();
        assert_eq!(r.status(), 422);
        assert!(r.text().await.unwrap().contains(says));
    }
    app.stop().await;
}

#[tokio::test]
async fn the_console_shows_a_tasks_environment_with_its_digest_and_the_environments_with_their_status() {
    let Some(reg) = Registry::start().await else { return };
    if !crate::sandbox::has_bwrap() {
        return;
    }
    let Some(b) = crate::browser::browser(1280, 800).await else { return };
    let digest = reg.push("test/console:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let dir = cache_dir();
    let db = crate::helpers::test_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (listen, cache) = (format!("127.0.0.1:{port}"), dir.path().display().to_string());
    let env = [
        ("SUBAGENTD_LISTEN", listen.as_str()),
        ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
        ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
        ("SUBAGENTD_REGISTRY_ALLOW", "127.0.0.1/32"),
        ("SUBAGENTD_INSECURE_REGISTRIES", reg.addr.as_str()),
        ("SUBAGENTD_IMAGE_DIR", cache.as_str()),
    ];
    let _proc = crate::helpers::spawn_binary(&["serve"], &db.url, &env);
    let base = format!("http://{listen}");
    let c = reqwest::Client::new();
    crate::helpers::wait_until_ok(&c, &format!("{base}/healthz"), Duration::from_secs(30)).await;
    let upload = tar_gz(|b| entry(b, "README", E::Regular, "", 0o644, b"hello\n"));
    let r = c
        .put(format!("{base}/workspaces/app"))
        .header("content-type", "application/gzip")
        .body(upload)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let body = json!({"workspace": {"name": "app"}, "environment": {"image": reg.image("test/console:1")},
        "prompt": script(&["cat README"])});
    let t: Value =
        c.post(format!("{base}/tasks?wait=true&timeout=60")).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let id = t["id"].as_str().unwrap();
    b.client.goto(&format!("{base}/console#/tasks/{id}")).await.unwrap();
    let field = |name: &str| {
        format!(
            "const d = Array.from(document.querySelectorAll('#task-fields dt')).find(e => e.textContent === '{name}'); \
             return d ? d.nextElementSibling.textContent : null;"
        )
    };
    let has =
        "return Array.from(document.querySelectorAll('#task-fields dt')).some(e => e.textContent === 'Environment');";
    b.wait_until("the environment's row", has).await;
    let shown = b.js(&field("Environment")).await;
    assert_eq!(shown.as_str(), Some(format!("{} @ {digest}", reg.image("test/console:1")).as_str()), "{shown}");
    let ws = b.js(&field("Workspace")).await;
    assert!(ws.as_str().unwrap_or_default().starts_with("upload app (sha256:"), "{ws}");
    b.screenshot("console-task-environment").await;
    assert_eq!(b.severe_logs().await, Vec::<String>::new());

    // The catalog lists the tenant's named environments with their builds' status.
    let image = reg.image("test/console:1");
    for (name, setup) in [("ci", "echo set up"), ("broken", "echo cannot install; exit 2")] {
        let r = c
            .put(format!("{base}/environments/{name}"))
            .json(&json!({"image": image, "setup": setup}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for name in ["ci", "broken"] {
        loop {
            let e: Value = c.get(format!("{base}/environments/{name}")).send().await.unwrap().json().await.unwrap();
            if e["status"] != "building" {
                break;
            }
            assert!(Instant::now() < deadline, "{e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    b.client.goto(&format!("{base}/console#/catalog")).await.unwrap();
    let rows = "return document.querySelectorAll('#environments-table tbody tr[data-environment]').length === 2;";
    b.wait_until("the environments' rows", rows).await;
    let cells = b
        .js("return Array.from(document.querySelectorAll('#environments-table tbody tr')).map(r => \
             Array.from(r.querySelectorAll('td')).map(c => c.textContent));")
        .await;
    let rows = cells.as_array().unwrap();
    let (broken, ci) = (&rows[0], &rows[1]);
    assert_eq!(
        (broken[0].as_str(), broken[2].as_str(), broken[5].as_str()),
        (Some("broken"), Some("failed"), Some("2")),
        "{cells}"
    );
    assert!(broken[7].as_str().unwrap().contains("cannot install"), "{cells}");
    assert_eq!((ci[0].as_str(), ci[2].as_str(), ci[5].as_str()), (Some("ci"), Some("ready"), Some("0")), "{cells}");
    assert!(ci[3].as_str().unwrap().starts_with("sha256:"), "{cells}");
    b.js("document.querySelector('#environments-table').scrollIntoView(); return true;").await;
    b.screenshot("console-environments").await;
    assert_eq!(b.severe_logs().await, Vec::<String>::new());
    b.close().await;
}

/// A token service for a registry that asks for one: a token for `user:password` only.
async fn token_service(user: &str, password: &str) -> String {
    use base64::Engine as _;
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let want = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")));
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut c, _)) = l.accept().await {
            let mut b = vec![0u8; 8192];
            let n = c.read(&mut b).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&b[..n]).to_string();
            let ok =
                head.lines().any(|l| l.to_ascii_lowercase().starts_with("authorization:") && l[14..].trim() == want);
            let (status, body) =
                if ok { ("200 OK", r#"{"token": "granted", "expires_in": 300}"#) } else { ("401 Unauthorized", "{}") };
            let msg = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            let _ = c.write_all(msg.as_bytes()).await;
        }
    });
    format!("http://{addr}/token")
}

#[tokio::test]
async fn a_private_image_is_pulled_with_its_tenants_secret_and_never_served_to_another_tenant() {
    let Some(open) = Registry::start().await else { return };
    let Some(srv) = crate::workspaces::git_server().await else { return };
    if !crate::sandbox::has_bwrap() {
        return;
    }
    let digest = open.push("team/private:1", vec![busybox_layer()], &["PATH=/bin", "WHO=private"]).await;
    let realm = token_service("alice", "s3cret").await;
    let Some(private) = open.with_auth(&realm).await else { return };
    let dir = cache_dir();
    let (app, acme, other) = two_tenants(&private, dir.path()).await;
    // acme's secret for the registry's host (write-only, as a repository's token).
    let r = app
        .client
        .put(app.url("/secrets/registry"))
        .bearer_auth(&acme)
        .json(&json!({"value": "alice:s3cret", "host": "127.0.0.1"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let repo = format!("{}/repo.git", srv.base);
    let task = |key: &str, image: String| {
        let body =
            json!({"workspace": {"git": repo}, "environment": {"image": image}, "prompt": script(&["echo who=$WHO"])});
        app.client.post(app.url("/tasks?wait=true&timeout=60")).bearer_auth(key.to_string()).json(&body).send()
    };
    let image = private.image("team/private:1");
    let t: Value = task(&acme, image.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    assert_eq!(t["environment"]["digest"], digest.as_str());
    let out = crate::tools::tool_results(&app, t["id"].as_str().unwrap()).await;
    assert!(out[0]["content"].as_str().unwrap().contains("who=private"), "{out:?}");

    // Another tenant, without a secret: neither by tag nor by the digest acme's root is cached
    // under.
    let by_digest = format!("{}/team/private@{digest}", private.addr);
    for image in [image, by_digest] {
        let t: Value = task(&other, image.clone()).await.unwrap().json().await.unwrap();
        assert_eq!(t["status"], "failed", "{image}: {t}");
        let code = t["error"]["code"].as_str().unwrap();
        assert!(code.starts_with("environment_"), "{t}");
        let m = t["error"]["message"].as_str().unwrap().to_ascii_lowercase();
        assert!(m.contains("401") || m.contains("unauthorized") || m.contains("auth"), "{t}");
    }
    // acme again, by digest: its own cached root.
    let t: Value = task(&acme, format!("{}/team/private@{digest}", private.addr)).await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    app.stop().await;
}

#[tokio::test]
async fn a_kill_dash_nine_during_a_setup_leaves_nothing_a_later_task_uses() {
    let Some((reg, srv)) = sandboxed().await else { return };
    reg.push("test/setup:1", vec![busybox_layer()], &["PATH=/bin"]).await;
    let db = crate::helpers::test_db().await;
    let images = cache_dir();
    let spawn = |data: &tempfile::TempDir| {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let listen = format!("127.0.0.1:{port}");
        let (d, i) = (data.path().display().to_string(), images.path().display().to_string());
        let env = [
            ("SUBAGENTD_LISTEN", listen.as_str()),
            ("SUBAGENTD_DATA_DIR", d.as_str()),
            ("SUBAGENTD_IMAGE_DIR", i.as_str()),
            ("SUBAGENTD_DEFAULT_MODEL", "mock/m"),
            ("SUBAGENTD_BUILTIN_TOOLS_OFF", "web_fetch,web_search"),
            ("SUBAGENTD_WORKSPACE_GIT_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_REGISTRY_ALLOW", "127.0.0.1/32"),
            ("SUBAGENTD_INSECURE_REGISTRIES", reg.addr.as_str()),
            ("SUBAGENTD_LEASE_SECONDS", "2"),
        ];
        (crate::helpers::spawn_binary(&["serve"], &db.url, &env), format!("http://{listen}"))
    };
    let (da, dbb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, base) = spawn(&da);
    let c = reqwest::Client::new();
    crate::helpers::wait_until_ok(&c, &format!("{base}/healthz"), Duration::from_secs(30)).await;
    // The setup writes, then takes its time: killed while it runs.
    let setup = "mkdir -p /opt/tool && echo built > /opt/tool/marker && sleep 5 && echo done >> /opt/tool/marker";
    let r = c
        .put(format!("{base}/environments/slow"))
        .json(&json!({"image": reg.image("test/setup:1"), "setup": setup}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let building = images.path().join("tmp").join(a.child.id().to_string());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !walkdir::WalkDir::new(&building).into_iter().flatten().any(|e| e.file_name() == "marker") {
        assert!(Instant::now() < deadline, "the setup never began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(a.child.id() as i32, libc::SIGKILL) };
    let _ = a.child.wait();
    let roots: Vec<String> = std::fs::read_dir(images.path().join("roots"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(roots.iter().all(|r| !r.starts_with("env-")), "no environment's root was made whole: {roots:?}");

    // The next process removes the half-built root at its start; a task naming the environment
    // builds it whole, and runs in it.
    let (_b, base) = spawn(&dbb);
    crate::helpers::wait_until_ok(&c, &format!("{base}/healthz"), Duration::from_secs(30)).await;
    assert!(!building.exists(), "the killed process's build directory is removed");
    let e: Value = c.get(format!("{base}/environments/slow")).send().await.unwrap().json().await.unwrap();
    assert_eq!(e["status"], "building", "its build never ended: {e}");
    let repo = format!("{}/repo.git", srv.base);
    let body = json!({"workspace": {"git": repo}, "environment": {"name": "slow"}, "prompt": script(&["cat /opt/tool/marker"])});
    let t: Value =
        c.post(format!("{base}/tasks?wait=true&timeout=60")).json(&body).send().await.unwrap().json().await.unwrap();
    assert_eq!(t["status"], "completed", "{t}");
    let out = crate::tools::tool_results_in(&db.pool, t["id"].as_str().unwrap()).await;
    assert!(out[0]["content"].as_str().unwrap().contains("built\ndone"), "the whole setup's root: {out:?}");
    let e: Value = c.get(format!("{base}/environments/slow")).send().await.unwrap().json().await.unwrap();
    assert_eq!((e["status"].as_str(), e["exit_code"].as_i64()), (Some("ready"), Some(0)), "{e}");
}
