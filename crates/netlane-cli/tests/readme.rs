//! The README's loopback recipes, run exactly as printed: each `sh` block under "Try it on
//! loopback", in a shell of its own (`bash -e`) whose PATH finds this netlane first, in a
//! directory of its own, bounded in time; what a recipe started in the background ends
//! with its process group.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{repo, temp_dir};

/// The `sh` blocks of the README's section `heading`.
fn recipes(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let start = readme.find(&format!("\n## {heading}\n")).unwrap_or_else(|| panic!("no section {heading}"));
    let section = &readme[start + 1..];
    let section = &section[..section[1..].find("\n## ").map_or(section.len(), |e| e + 1)];
    section.split("```sh\n").skip(1).map(|b| b[..b.find("```").unwrap()].to_string()).collect()
}

/// Runs `script` as printed; its standard output and error.
fn run(script: &str, dir: &Path) -> (String, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_netlane")).parent().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("bash")
        .args(["-e", "-o", "pipefail", "-c", script])
        .current_dir(dir)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // The group is the shell's PID: the recipe's servers, if one was left running.
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).stderr(Stdio::null()).status();
    let _ = child.wait();
    let (o, e) = (std::fs::read_to_string(&out).unwrap(), std::fs::read_to_string(&err).unwrap());
    match status {
        Some(s) if s.success() => (o, e),
        Some(s) => panic!("recipe failed ({s}):\n{script}\nstdout:\n{o}\nstderr:\n{e}"),
        None => panic!("recipe still ran after 90 s:\n{script}\nstdout:\n{o}\nstderr:\n{e}"),
    }
}

#[test]
fn the_readmes_loopback_recipes_run_as_printed() {
    let blocks = recipes("Try it on loopback");
    assert_eq!(blocks.len(), 5, "probe, bench and compare, kv, rr, nvme: {blocks:#?}");
    // What each recipe's output must say: it did what the README says it does.
    let wants: [&[&str]; 5] = [
        &["udp-gso", "af-xdp"],
        &["Verdict:", "| regressed [1] | udp-bulk.gso-cpu-vs-udp"],
        &["open loop: offered", "errors=0"],
        &["16 clients (open loop)", "lost=0"],
        &["randread", "IOPS"],
    ];
    let dir = temp_dir("readme");
    for (i, (script, want)) in blocks.iter().zip(wants).enumerate() {
        let d = dir.join(i.to_string());
        std::fs::create_dir_all(&d).unwrap();
        let (out, err) = run(script, &d);
        for w in want {
            assert!(out.contains(w), "recipe {i} did not say {w:?}:\n{script}\nstdout:\n{out}\nstderr:\n{err}");
        }
        assert!(!err.contains("error:"), "recipe {i}:\n{script}\nstderr:\n{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
