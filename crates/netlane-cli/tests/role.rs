//! `netlane role`, as the lab runs it over SSH and as a user runs it by hand.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Reaped;

/// `netlane role -- sh -c SCRIPT`, its input and output piped; returns once the script
/// said `up` (its traps are set by then).
fn start(script: &str) -> (Reaped, BufReader<std::process::ChildStdout>) {
    start_with(&[], script)
}

/// [`start`] with more of `netlane role`'s options.
fn start_with(options: &[&str], script: &str) -> (Reaped, BufReader<std::process::ChildStdout>) {
    let mut child = Reaped(
        Command::new(env!("CARGO_BIN_EXE_netlane"))
            .args(["role", "--grace", "300ms"])
            .args(options)
            .args(["--", "sh", "-c", script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "up\n");
    (child, out)
}

fn trailer(child: &mut Reaped) -> serde_json::Value {
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let last = err.lines().last().unwrap_or_default();
    let json = last.strip_prefix("netlane role ended: ").unwrap_or_else(|| panic!("no trailer: {err}"));
    serde_json::from_str(json).unwrap()
}

#[test]
fn an_order_on_its_input_stops_the_program_which_exits_as_it_did() {
    let (mut child, _out) = start("trap 'exit 5' INT; echo up; while :; do sleep 0.01; done");
    // Kept open: Child::wait would close it, and its end is an order too.
    let mut orders = child.stdin.take().unwrap();
    orders.write_all(b"INT\n").unwrap();
    let status = child.wait().unwrap();
    drop(orders);
    assert_eq!(status.code(), Some(5));
    assert_eq!(trailer(&mut child)["wait_status"], 5 << 8);
}

#[test]
fn the_end_of_its_input_ends_the_program_sigkill_after_the_grace() {
    let (mut child, _out) = start("trap '' TERM; echo up; while :; do sleep 0.01; done");
    drop(child.stdin.take());
    let started = std::time::Instant::now();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 9));
    assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
    assert_eq!(trailer(&mut child)["wait_status"], 9);
}

/// With --silence (as the lab starts it over SSH), input that stays open but says
/// nothing, as from a connection that died without closing, ends the program; empty
/// lines (the lab's heartbeat) keep it running.
#[test]
fn input_silent_past_its_limit_ends_the_program_and_heartbeats_keep_it() {
    let (mut child, _out) =
        start_with(&["--silence", "600ms"], "trap 'exit 3' TERM; echo up; while :; do sleep 0.01; done");
    let mut orders = child.stdin.take().unwrap();
    let started = std::time::Instant::now();
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(300));
        orders.write_all(b"\n").unwrap();
    }
    assert!(child.try_wait().unwrap().is_none(), "heartbeats keep it running");
    let status = child.wait().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1500 + 600), "{:?}", started.elapsed());
    assert_eq!(status.code(), Some(3), "stopped with SIGTERM");
    drop(orders);
    assert_eq!(trailer(&mut child)["wait_status"], 3 << 8);
}

#[test]
fn a_signal_to_the_supervisor_is_the_program_s() {
    let (mut child, _out) = start("trap 'echo bye; exit 0' INT; echo up; while :; do sleep 0.01; done");
    let orders = child.stdin.take();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGINT).unwrap();
    assert!(child.wait().unwrap().success());
    drop(orders);
    assert_eq!(trailer(&mut child)["wait_status"], 0);
}

#[test]
fn a_program_that_cannot_start_is_one_line() {
    let o = common::netlane(&["role", "--", "/nonexistent/program"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(common::stderr(&o), "error: start /nonexistent/program: No such file or directory (os error 2)\n");
}
