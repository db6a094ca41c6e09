//! Compiles the BPF program with clang (CO-RE, against the kernel's BTF at load time, so no
//! kernel headers are needed at run time) and generates its Rust skeleton.

use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const SOURCE: &str = "src/bpf/profile.bpf.c";

fn main() {
    // The crate is empty off Linux (no eBPF there), so it has no program to build.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    if let Err(e) = SkeletonBuilder::new()
        .source(SOURCE)
        .clang_args(["-Wall", "-Wno-unused-function"])
        .build_and_generate(out.join("profile.skel.rs"))
    {
        panic!(
            "building the BPF program {SOURCE} failed (needs clang: run scripts/install-deps.sh): {e:#}"
        );
    }
    println!("cargo:rerun-if-changed=src/bpf");
}
