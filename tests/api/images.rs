//! Images for the sandbox (issue 63), against a real registry on loopback (`registry.rs`): the
//! pull and its guard, the cache, hostile layers, and commands in an image's root.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::sync::Arc;
use std::time::{Duration, Instant};

use subagentd::tools::image::{ImageError, Images, Settings};
use subagentd::tools::sandbox::Place;
use subagentd::tools::ssrf::AllowList;
use tar::EntryType as E;

use crate::registry::{busybox_layer, entry, tar_gz, Registry};

fn settings(reg: &Registry, dir: &std::path::Path, allow: &str) -> Settings {
    Settings {
        dir: dir.to_path_buf(),
        allow: Arc::new(AllowList::parse(allow).unwrap()),
        insecure: vec![reg.addr.clone()],
        max_bytes: 64 << 20,
        max_entries: 10_000,
        cache_bytes: 1 << 30,
        pull_timeout: Duration::from_secs(30),
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
    assert_eq!(images.resolve(&reference).await.unwrap(), digest);

    // Two first users at once: one pull, the other waits for it.
    let (a, b) = tokio::join!(images.root(&reference, &digest), images.root(&reference, &digest));
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
    let (root, stats) = again.root(&reference, &digest).await.unwrap();
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
    let e = images.resolve(&reg.image("test/bb:nope")).await.unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
    assert_eq!(e.code(), "environment_not_found");
    let e = images.resolve(&reg.image("test/none:1")).await.unwrap_err();
    assert!(matches!(e, ImageError::NotFound(_)), "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());

    // A registry the list does not name: refused before any connection.
    let e = images.check("10.1.2.3:5000/team/app:1").unwrap_err();
    assert_eq!(e.code(), "environment_refused");
    assert!(e.to_string().contains("SUBAGENTD_REGISTRY_ALLOW"), "{e}");
    assert!(images.check("not a reference").is_err());
    let named = settings(&reg, dir.path(), "localhost");
    let by_name = Images::open(named).await.unwrap();
    let e = by_name.check("registry.example.com/team/app:1").unwrap_err();
    assert!(e.to_string().contains("registry.example.com") && e.to_string().contains("not on the allow-list"), "{e}");

    // A name the list allows that resolves to loopback, which it does not: refused by the guard
    // where the connection is made (the egress proxy), not by the name.
    let port = reg.addr.rsplit_once(':').unwrap().1;
    let e = by_name.resolve(&format!("localhost:{port}/test/bb:1")).await.unwrap_err();
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
    });
    std::fs::create_dir(&outside).unwrap();
    let digest = reg.push("test/hostile:1", vec![busybox_layer(), lower, upper], &["PATH=/bin"]).await;
    let images = Images::open(settings(&reg, dir.path(), "127.0.0.1/32")).await.unwrap();
    let (root, stats) = images.root(&reg.image("test/hostile:1"), &digest).await.unwrap();
    let stats = stats.unwrap();
    let r = &root.rootfs;

    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside the root");
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
    let reasons: Vec<(&str, &str)> = stats.unpacked.dropped.iter().map(|d| (d.path.as_str(), d.reason)).collect();
    for (path, why) in [
        (escape.as_str(), "a path that leads outside (..)"),
        ("evil/through-link", "a parent is a link or a file"),
        ("null", "a device node"),
        ("disk", "a device node"),
        ("hard-out", "a hard link that leads outside"),
        ("hard-link-dir", "a hard link to no regular file of the image"),
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
    let e = images.root(&reg.image("test/bomb:1"), &bomb_digest).await.unwrap_err();
    assert_eq!(e.code(), "environment_too_large", "{e}");
    let e = images.root(&reg.image("test/many:1"), &many_digest).await.unwrap_err();
    assert_eq!(e.code(), "environment_too_large", "{e}");
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
    let (held, stats) = images.root(&reg.image("test/one:1"), &one).await.unwrap();
    assert!(stats.is_some(), "pulled anew, not taken from what was half there");
    // While `one` is in use, a second image goes past the bound, and `one` stays.
    let (second, _) = images.root(&reg.image("test/two:1"), &two).await.unwrap();
    assert!(held.rootfs.join("bin/busybox").is_file(), "a root in use is never removed");
    drop(second);
    drop(held);
    // Neither in use now: the next pull past the bound removes the roots used longest ago.
    let three = reg.push("test/three:1", vec![busybox_layer()], &["X=3"]).await;
    let (_third, _) = images.root(&reg.image("test/three:1"), &three).await.unwrap();
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
    let (root, _) = images.root(&reg.image("test/bb:1"), &digest).await.unwrap();
    let limits = subagentd::tools::sandbox::Limits {
        max_timeout: Duration::from_secs(10),
        memory_bytes: 256 << 20,
        processes: 64,
        write_bytes: 8 << 20,
        write_entries: 1000,
        tmp_bytes: 4 << 20,
    };
    let copies = cache_dir();
    let sb = subagentd::tools::sandbox::Sandbox::probe("bwrap", limits, 2, 0, copies.path()).unwrap();
    let copy = copies.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    subagentd::tools::sandbox::hand_over(&copy, sb.uid()).unwrap();
    std::env::set_var("SUBAGENTD_TEST_SECRET", "service-env-secret");
    let max = subagentd::tools::files::Usage { bytes: 1 << 20, entries: 100 };
    let cmd = "cat /etc/image-release; env; ls /usr/bin/python3 /usr/lib 2>&1; pwd; id -u; echo made > out; touch /bin/x 2>&1; true";
    let (out, outcome) = sb
        .run("t", Place { copy: &copy, max_copy: max, image: Some(&root) }, cmd, Duration::from_secs(10), 64 * 1024)
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
    assert!(text.contains("/workspace\n1000"), "{text}");
    assert!(text.contains("Read-only file system"), "the image's root is read-only: {text}");
    assert_eq!(std::fs::read_to_string(copy.join("out")).unwrap(), "made\n", "the copy is written");
}
