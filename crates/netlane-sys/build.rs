//! Compiles the BPF programs under `bpf/` (in this crate, so a packaged crate carries
//! them) with clang and generates their libbpf-rs skeletons (Rust types come from the
//! object's BTF, never hand-copied).

use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

/// (directory under bpf/, program name): bpf/<dir>/<name>.bpf.c
const PROGRAMS: &[(&str, &str)] = &[
    ("lb", "xdp_tx"),
    ("lb", "balancer"),
    ("lb", "balancer_bound"),
    ("lb", "decap"),
    ("lb", "flow_tagger"),
    ("lab", "pktgen"),
    ("rr", "xsk_redirect"),
    ("rr", "ring_select"),
    ("lanes", "reuseport_napi"),
    ("lanes", "app_sock"),
    ("lanes", "app_class"),
    ("lanes", "queue_steer"),
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let root =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("bpf");
    // clang -target bpf does not search the multiarch include directory where Debian
    // keeps <asm/types.h>.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("-I/usr/include/{arch}-linux-gnu");
    println!("cargo:rerun-if-changed={}", root.join("include").display());
    println!("cargo:rerun-if-changed={}", root.join("lb").display());
    println!("cargo:rerun-if-changed={}", root.join("lab").display());
    println!("cargo:rerun-if-changed={}", root.join("rr").display());
    println!("cargo:rerun-if-changed={}", root.join("lanes").display());
    for (dir, name) in PROGRAMS {
        let src = root.join(dir).join(format!("{name}.bpf.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                format!("-I{}", root.join("include").display()),
                multiarch.clone(),
                "-Wall".into(),
                "-Werror".into(),
                "-O2".into(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {}: {e:#}", src.display()));
    }
}
