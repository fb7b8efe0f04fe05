//! Builds the library gVisor's sandboxes preload (src/tools/gvisor_compat/statx.c: Debian's
//! runsc refuses a flag coreutils gives). Where no C compiler builds it, the file is empty and
//! the service runs gVisor's commands without it (`tools::gvisor` says so at start).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "src/tools/gvisor_compat/statx.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CC");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("gvisor-statx.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let target = std::env::var("TARGET").unwrap_or_default();
    let host = std::env::var("HOST").unwrap_or_default();
    let supported = target.starts_with("x86_64-") || target.starts_with("aarch64-");
    let built = supported
        && target == host
        && Command::new(&cc)
            .args(["-shared", "-fPIC", "-nostdlib", "-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(src)
            .status()
            .is_ok_and(|s| s.success());
    if !built {
        println!("cargo:warning=gVisor's statx library was not built ({cc}, {target}): gVisor's ls and stat may fail");
        std::fs::write(&out, b"").expect("write the empty library");
    }
}
