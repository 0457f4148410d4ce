//! Compiles the BPF programs under `bpf/` (in this crate, so a packaged crate carries
//! them) with clang and generates their libbpf-rs skeletons (Rust types come from the
//! object's BTF, never hand-copied).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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
    ("lanes", "rxq_record"),
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
    global_stats(&root.join("lb").join("lb_consts.h"), &out.join("global_stats.rs"));
    defines(
        &root.join("lb").join("lb_consts.h"),
        &[
            "HINT_OFF",
            "HINT_RX_HASH",
            "HINT_FLOW_TAG",
            "HINT_DEST_TAG",
            "TAG_VALUE_BITS",
            "TAG_VALUES",
            "TAG_KIND_FLOW",
            "TAG_KIND_DEST",
            "FAM_V4",
            "FAM_V6",
        ],
        &out.join("lb_defines.rs"),
    );
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

/// Generates the Rust `GlobalStat` (variants, order, names, docs) from
/// `enum lb_global_stat` in `lb_consts.h`: one `ST_<NAME>,  /* doc */` per line, up to
/// `ST_NUM`. The C enum is the one source of truth for the counters' order.
fn global_stats(header: &Path, out: &Path) {
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(header).unwrap_or_else(|e| panic!("read {}: {e}", header.display()));
    let body = text
        .split_once("enum lb_global_stat {")
        .and_then(|(_, rest)| rest.split_once("ST_NUM"))
        .map(|(body, _)| body)
        .unwrap_or_else(|| panic!("{}: no enum lb_global_stat ending in ST_NUM", header.display()));
    let mut stats: Vec<(String, String)> = Vec::new();
    for line in body.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let name = line
            .strip_prefix("ST_")
            .and_then(|l| l.split([',', ' ', '\t', '=']).next())
            .unwrap_or_else(|| panic!("{}: {line:?} is not an ST_ entry", header.display()));
        let doc = line
            .split_once("/*")
            .and_then(|(_, c)| c.split_once("*/"))
            .map(|(c, _)| c.trim().to_string())
            .unwrap_or_else(|| panic!("{}: ST_{name} needs its doc comment on its line", header.display()));
        stats.push((name.to_ascii_lowercase(), doc));
    }
    let camel = |n: &str| n.split('_').map(|w| w[..1].to_ascii_uppercase() + &w[1..]).collect::<String>();
    let mut rs = String::from(
        "/// The data plane's global counters, in the order of `enum lb_global_stat`\n\
         /// (`bpf/lb/lb_consts.h`, from which the build script generates this).\n\
         #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\npub enum GlobalStat {\n",
    );
    for (name, doc) in &stats {
        let _ = writeln!(rs, "    #[doc = {doc:?}]\n    {},", camel(name));
    }
    rs.push_str("}\n\nimpl GlobalStat {\n    /// All, in map order.\n");
    let _ = writeln!(rs, "    pub const ALL: [GlobalStat; {}] = [", stats.len());
    for (name, _) in &stats {
        let _ = writeln!(rs, "        GlobalStat::{},", camel(name));
    }
    rs.push_str("    ];\n\n    /// Its snake_case name for reports and metrics.\n    pub fn name(self) -> &'static str {\n        match self {\n");
    for (name, _) in &stats {
        let _ = writeln!(rs, "            GlobalStat::{} => {name:?},", camel(name));
    }
    rs.push_str("        }\n    }\n}\n");
    std::fs::write(out, rs).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}

/// Generates a `pub const NAME: u32` for each of `names` from its `#define NAME VALUE
/// /* doc */` line in `header` (a decimal or hex literal, optionally with a `u`
/// suffix), so that codes shared with the BPF programs are written once, in C.
fn defines(header: &Path, names: &[&str], out: &Path) {
    println!("cargo:rerun-if-changed={}", header.display());
    let text = std::fs::read_to_string(header).unwrap_or_else(|e| panic!("read {}: {e}", header.display()));
    let mut rs = String::from("// Generated by build.rs from bpf/lb/lb_consts.h.\n");
    for name in names {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| l.strip_prefix("#define ").and_then(|r| r.split_whitespace().next()) == Some(name))
            .unwrap_or_else(|| panic!("{}: no #define {name}", header.display()));
        let value = line.split_whitespace().nth(2).unwrap_or_default().trim_end_matches(['u', 'U']);
        let parsed = match value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => value.parse(),
        }
        .unwrap_or_else(|_| panic!("{}: #define {name}: {value:?} is not an integer literal", header.display()));
        let doc = line
            .split_once("/*")
            .and_then(|(_, c)| c.split_once("*/"))
            .map_or_else(|| format!("`{name}` in lb_consts.h."), |(c, _)| c.trim().to_string());
        let _ = writeln!(rs, "#[doc = {doc:?}]\npub const {name}: u32 = {parsed:#x};");
    }
    std::fs::write(out, rs).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}
