//! A named environment's setup layer, kept once for every replica (issue 63). The replica that
//! runs a setup packs what it changed in the image's root (`pack`: a gzip tar of what it made or
//! changed, and a whiteout for what it removed, as an OCI layer) and keeps it in PostgreSQL
//! (`publish`: a row and its chunks in one transaction). A replica without that build in its
//! cache fetches the layer (`fetch`) and applies it over the image's root with the same safe
//! unpacker as every image layer (`layer::apply`), rather than running the setup again.

use std::io::{Read, Write};
use std::path::Path;

use sqlx::PgPool;

use crate::store::environments::{self as store, Layer};

/// The bytes of one chunk in PostgreSQL.
const CHUNK: usize = 4 << 20;

/// Are the entries at `a` and `b` the same: type, mode, and a link's target or a file's bytes?
fn same(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    let (ma, mb) = match (std::fs::symlink_metadata(a), std::fs::symlink_metadata(b)) {
        (Ok(ma), Ok(mb)) => (ma, mb),
        (Err(e), _) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        (Err(e), _) | (_, Err(e)) => return Err(e),
    };
    let (ta, tb) = (ma.file_type(), mb.file_type());
    if (ta.is_dir(), ta.is_file(), ta.is_symlink()) != (tb.is_dir(), tb.is_file(), tb.is_symlink()) {
        return Ok(false);
    }
    if ta.is_symlink() {
        return Ok(std::fs::read_link(a)? == std::fs::read_link(b)?);
    }
    if ma.permissions().mode() != mb.permissions().mode() {
        return Ok(false);
    }
    if ta.is_dir() {
        return Ok(true);
    }
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Write at `out` the layer that makes `built` of `base`: what `built` has that `base` has not,
/// or has otherwise (directories, files, links), and a whiteout (`.wh.NAME`) for each entry of
/// `base` that `built` has not (not for those below a removed directory).
pub fn pack(base: &Path, built: &Path, out: &Path) -> std::io::Result<()> {
    let gz = flate2::write::GzEncoder::new(
        std::io::BufWriter::new(std::fs::File::create(out)?),
        flate2::Compression::fast(),
    );
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    let rel = |root: &Path, p: &Path| p.strip_prefix(root).map(Path::to_path_buf).map_err(std::io::Error::other);
    // A path is looked up in the other tree only through real directories there: never through a
    // link (an image's `lib -> usr/lib`, or one to a host path), nor below a file.
    let through_directories = |root: &Path, r: &Path| super::layer::parents_are_directories(root, r, false);
    for e in walkdir::WalkDir::new(built).min_depth(1).follow_links(false) {
        let e = e.map_err(std::io::Error::other)?;
        let r = rel(built, e.path())?;
        if !through_directories(base, &r)? || !same(&base.join(&r), e.path())? {
            tar.append_path_with_name(e.path(), &r)?;
        }
    }
    let mut walk = walkdir::WalkDir::new(base).min_depth(1).follow_links(false).into_iter();
    while let Some(e) = walk.next() {
        let e = e.map_err(std::io::Error::other)?;
        let r = rel(base, e.path())?;
        // Below what the setup replaced (a directory become a file or a link): the replacement,
        // in the layer, removes it whole.
        if !through_directories(built, &r)? {
            if e.file_type().is_dir() {
                walk.skip_current_dir();
            }
            continue;
        }
        match std::fs::symlink_metadata(built.join(&r)) {
            Ok(m) => {
                if e.file_type().is_dir() && !m.is_dir() {
                    walk.skip_current_dir();
                }
                continue;
            }
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => return Err(err),
            Err(_) => {}
        }
        let name = r.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let wh = r.with_file_name(format!(".wh.{name}"));
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(0);
        h.set_mode(0o644);
        tar.append_data(&mut h, wh, std::io::empty())?;
        if e.file_type().is_dir() {
            walk.skip_current_dir();
        }
    }
    tar.into_inner()?.finish()?.flush()
}

/// Keep the layer at `file` under `layer.key` (nothing when one is kept there already).
pub async fn publish(pool: &PgPool, layer: &Layer<'_>, file: &Path) -> Result<(), String> {
    let io = |e: std::io::Error| format!("{}: {e}", file.display());
    let bytes = std::fs::metadata(file).map_err(io)?.len() as i64;
    let mut f = std::fs::File::open(file).map_err(io)?;
    let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
    if !store::insert_layer(&mut tx, layer, bytes).await.map_err(|e| e.to_string())? {
        return Ok(());
    }
    let mut buf = vec![0u8; CHUNK];
    for n in 0.. {
        let mut got = 0;
        while got < CHUNK {
            match f.read(&mut buf[got..]).map_err(io)? {
                0 => break,
                k => got += k,
            }
        }
        if got == 0 {
            break;
        }
        store::insert_layer_chunk(&mut tx, layer.key, n, &buf[..got]).await.map_err(|e| e.to_string())?;
    }
    tx.commit().await.map_err(|e| e.to_string())
}

/// The layer kept under `key`, written to `file`; whether there is one (whole).
pub async fn fetch(pool: &PgPool, key: &str, file: &Path) -> Result<bool, String> {
    let mut tx = store::read_layers(pool).await.map_err(|e| e.to_string())?;
    let Some(bytes) = store::layer_bytes(&mut tx, key).await.map_err(|e| e.to_string())? else {
        return Ok(false);
    };
    let io = |e: std::io::Error| format!("{}: {e}", file.display());
    let mut f = std::io::BufWriter::new(std::fs::File::create(file).map_err(io)?);
    let (mut n, mut written) = (0, 0i64);
    while written < bytes {
        let Some(data) = store::layer_chunk(&mut tx, key, n).await.map_err(|e| e.to_string())? else {
            return Ok(false);
        };
        f.write_all(&data).map_err(io)?;
        written += data.len() as i64;
        n += 1;
    }
    f.flush().map_err(io)?;
    Ok(written == bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root changed (a file made, one changed, one removed, a directory removed, a link made)
    /// packs to a layer that, applied over the first root, makes the second.
    #[test]
    fn a_packed_layer_applied_over_the_base_makes_the_built_root() {
        let d = tempfile::tempdir().unwrap();
        let (base, built, again) = (d.path().join("base"), d.path().join("built"), d.path().join("again"));
        for r in [&base, &built, &again] {
            std::fs::create_dir_all(r.join("etc/gone")).unwrap();
            std::fs::write(r.join("etc/keep"), "same").unwrap();
            std::fs::write(r.join("etc/edit"), "one").unwrap();
            std::fs::write(r.join("etc/remove"), "x").unwrap();
            std::fs::write(r.join("etc/gone/f"), "y").unwrap();
        }
        // Type changes: a directory become a file, one become a link, a link become a directory
        // (the image's `lib -> usr/lib`; what the setup puts there is compared with nothing
        // through the link), and a link out of the root in the image, replaced by a directory
        // holding a file named as one outside.
        for r in [&base, &again] {
            std::fs::create_dir_all(r.join("usr/lib")).unwrap();
            std::fs::write(r.join("usr/lib/libc"), "libc").unwrap();
            std::os::unix::fs::symlink("usr/lib", r.join("lib")).unwrap();
            std::fs::create_dir_all(r.join("d2f/sub")).unwrap();
            std::fs::write(r.join("d2f/sub/x"), "x").unwrap();
            std::fs::create_dir_all(r.join("d2l")).unwrap();
            std::fs::write(r.join("d2l/x"), "x").unwrap();
            std::os::unix::fs::symlink(d.path().join("outside"), r.join("out")).unwrap();
        }
        std::fs::create_dir_all(d.path().join("outside")).unwrap();
        std::fs::write(d.path().join("outside/secret"), "host").unwrap();
        std::fs::create_dir_all(built.join("usr/lib")).unwrap();
        std::fs::write(built.join("usr/lib/libc"), "libc").unwrap();
        std::fs::create_dir(built.join("lib")).unwrap();
        std::fs::write(built.join("lib/libc"), "libc").unwrap();
        std::fs::write(built.join("d2f"), "now a file").unwrap();
        std::os::unix::fs::symlink("etc", built.join("d2l")).unwrap();
        std::fs::create_dir(built.join("out")).unwrap();
        std::fs::write(built.join("out/secret"), "host").unwrap();
        std::fs::write(built.join("etc/edit"), "two").unwrap();
        std::fs::remove_file(built.join("etc/remove")).unwrap();
        std::fs::remove_dir_all(built.join("etc/gone")).unwrap();
        std::fs::create_dir_all(built.join("opt/tool")).unwrap();
        std::fs::write(built.join("opt/tool/bin"), "new").unwrap();
        std::os::unix::fs::symlink("tool/bin", built.join("opt/run")).unwrap();
        let layer = d.path().join("layer.tar.gz");
        pack(&base, &built, &layer).unwrap();
        let mut names = vec![];
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(&layer).unwrap()));
        for e in a.entries().unwrap() {
            names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
        }
        assert!(!names.iter().any(|n| n.contains("keep")), "what did not change is not in it: {names:?}");
        assert!(!names.iter().any(|n| n.contains("gone/")), "nothing below a removed directory: {names:?}");
        let caps = super::super::layer::Caps { max_bytes: 1 << 20, max_entries: 100 };
        let mut done = super::super::layer::Unpacked::default();
        super::super::layer::apply(std::fs::File::open(&layer).unwrap(), &again, caps, &mut done).unwrap();
        let read = |r: &Path, p: &str| std::fs::read_to_string(r.join(p)).ok();
        assert_eq!(read(&again, "etc/keep").as_deref(), Some("same"));
        assert_eq!(read(&again, "etc/edit").as_deref(), Some("two"));
        assert_eq!(read(&again, "etc/remove"), None);
        assert!(!again.join("etc/gone").exists());
        assert_eq!(read(&again, "opt/run").as_deref(), Some("new"), "the link made, to the file made");
        assert_eq!(read(&again, "lib/libc").as_deref(), Some("libc"), "not left out as the image's usr/lib/libc");
        assert!(again.join("lib").symlink_metadata().unwrap().is_dir());
        assert_eq!(read(&again, "d2f").as_deref(), Some("now a file"));
        assert_eq!(std::fs::read_link(again.join("d2l")).unwrap(), Path::new("etc"));
        assert_eq!(read(&again, "out/secret").as_deref(), Some("host"), "compared with nothing outside the root");
        assert!(again.join("out").symlink_metadata().unwrap().is_dir());
        assert!(!names.iter().any(|n| n.starts_with("d2f/") || n.starts_with("d2l/")), "{names:?}");
    }
}
