//! Roles on other hosts, reached only through OpenSSH: namespaces of this machine each
//! running Debian's sshd (`netlane_testkit::sshd`), the lab's `SshHost` opening a master
//! connection to each and running roles under `netlane role`. Needs root (namespaces)
//! and openssh-server (scripts/setup.sh installs it).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use netlane_lab::host::{Host, Program, RoleProcess, RoleSpec, SshHost, SshSpec};
use netlane_testkit::sshd::SshHosts;

fn spec(hosts: &SshHosts, alias: &str) -> SshSpec {
    SshSpec {
        destination: alias.into(),
        config: Some(hosts.config.clone()),
        netlane: env!("CARGO_BIN_EXE_netlane").into(),
        deploy: None,
    }
}

fn sh(name: &str, script: &str) -> RoleSpec {
    RoleSpec::program(name, Program::Other("sh".into()), ["-c", script])
}

#[test]
fn a_server_on_an_ssh_host_serves_stops_with_its_report_and_runs_on_its_cpus() {
    if !netlane_testkit::privileged("a_server_on_an_ssh_host_serves_stops_with_its_report_and_runs_on_its_cpus") {
        return;
    }
    let hosts = SshHosts::start(&["server"]).unwrap();
    let h = &hosts.hosts[0];
    let ssh = SshHost::connect(&spec(&hosts, "server")).unwrap();
    assert_eq!(ssh.name(), "host server");

    // netlane's own cache server, there, answering there.
    let args = ["kv", "serve", "--json", "-", "--listen", "127.0.0.1", "--port", "-1", "--threads", "1"];
    let serve = RoleSpec::netlane("netlane kv serve", args)
        .on_cpus(&[0])
        .ready_on_stderr("listening on", Duration::from_secs(20));
    let server = RoleProcess::start(&ssh, &serve, None).unwrap();
    let addr = server.listening_on().unwrap();
    let reply =
        h.ns.run(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(b"set k 0 0 2\r\nhi\r\nget k\r\n").unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while !got.ends_with(b"END\r\n") {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
                got.extend_from_slice(&buf[..n]);
            }
            String::from_utf8(got).unwrap()
        })
        .unwrap();
    assert_eq!(reply, "STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
    let done = server.stop(Duration::from_secs(10)).unwrap();
    assert!(done.status.success(), "{}", done.stderr);
    let report: serde_json::Value = done.json().unwrap();
    assert_eq!(report["stats"]["cmd_get"], 1, "{report}");
    // Its end and CPU are the server's, from the supervisor, which leaves no line behind.
    assert!(done.cpu.user_s + done.cpu.system_s > 0.0, "{:?}", done.cpu);
    assert!(!done.stderr.contains("netlane role ended"), "{}", done.stderr);

    // Pinned there: every thread the role starts inherits the CPUs.
    let pinned = sh("a pinned role", "grep Cpus_allowed_list /proc/self/status").on_cpus(&[1 % num_cpus()]);
    let out = RoleProcess::start(&ssh, &pinned, None).unwrap().wait(Duration::from_secs(20)).unwrap();
    assert_eq!(out.stdout.split_whitespace().nth(1), Some((1 % num_cpus()).to_string().as_str()));

    // A role's own failure is its exit status, not the session's.
    let failing = sh("a failing role", "echo no >&2; exit 3");
    let out = RoleProcess::start(&ssh, &failing, None).unwrap().wait(Duration::from_secs(20)).unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stderr, "no");
    h.wait_until_bare(true, Duration::from_secs(10)).unwrap();
    drop(ssh);
    h.wait_until_bare(false, Duration::from_secs(10)).unwrap();
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

#[test]
fn a_role_dies_with_its_session_when_the_lab_or_the_link_goes() {
    if !netlane_testkit::privileged("a_role_dies_with_its_session_when_the_lab_or_the_link_goes") {
        return;
    }
    let hosts = SshHosts::start(&["a"]).unwrap();
    let h = &hosts.hosts[0];
    let ssh = SshHost::connect(&spec(&hosts, "a")).unwrap();
    let sleeper = || sh("a sleeper", "echo up; exec sleep 600").ready_when("up", Duration::from_secs(20));

    // The lab's end of one session killed outright (SIGKILL: no order is sent).
    let role = RoleProcess::start(&ssh, &sleeper(), None).unwrap();
    h.wait_for_roles("sleep", 1, Duration::from_secs(5)).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(role.pid().unwrap() as i32), nix::sys::signal::SIGKILL).unwrap();
    h.wait_until_bare(true, Duration::from_secs(10)).unwrap();
    let e = format!("{:#}", role.wait(Duration::from_secs(5)).unwrap_err());
    assert!(e.contains("lost a sleeper"), "{e}");

    // The master connection gone (the lab ended): every role it carried ends.
    let roles: Vec<RoleProcess> = (0..3).map(|_| RoleProcess::start(&ssh, &sleeper(), None).unwrap()).collect();
    h.wait_for_roles("sleep", 3, Duration::from_secs(5)).unwrap();
    drop(ssh);
    h.wait_until_bare(false, Duration::from_secs(10)).unwrap();
    drop(roles);
}

#[test]
fn a_host_without_this_netlane_or_out_of_reach_is_refused_with_the_reason() {
    if !netlane_testkit::privileged("a_host_without_this_netlane_or_out_of_reach_is_refused_with_the_reason") {
        return;
    }
    let hosts = SshHosts::start(&["b"]).unwrap();
    let mut other = spec(&hosts, "b");
    other.netlane = "/bin/echo".into();
    let e = format!("{:#}", SshHost::connect(&other).unwrap_err());
    assert!(e.contains("b has \"echo (GNU coreutils)") && e.contains("and this is \"netlane "), "{e}");
    other.netlane = "/nonexistent/netlane".into();
    let e = format!("{:#}", SshHost::connect(&other).unwrap_err());
    assert!(e.contains("no netlane at \"/nonexistent/netlane\" on b"), "{e}");

    // Asked to, this netlane is copied there and used.
    let mut deploying = spec(&hosts, "b");
    deploying.netlane = "/nonexistent/netlane".into();
    deploying.deploy = Some(env!("CARGO_BIN_EXE_netlane").into());
    let deployed = SshHost::connect(&deploying).unwrap();
    let path = deployed.netlane().to_string();
    assert!(path.ends_with(&format!("/.cache/netlane/netlane-{}", netlane_report::provenance::GIT_COMMIT)), "{path}");
    let role = RoleSpec::netlane("netlane --version", ["--version"]);
    let out = RoleProcess::start(&deployed, &role, None).unwrap().wait(Duration::from_secs(20)).unwrap();
    assert_eq!(out.stdout.trim(), format!("netlane {}", netlane_report::provenance::VERSION_LINE));
    drop(deployed);
    // Connected again, the copy there is used as it is.
    let again = SshHost::connect(&deploying).unwrap();
    assert_eq!(again.netlane(), path);
    drop(again);
    let dir = std::path::Path::new(&path).parent().unwrap();
    assert!(std::fs::read_dir(dir).unwrap().flatten().all(|e| !e.file_name().to_string_lossy().contains(".part-")));
    std::fs::remove_file(&path).unwrap();

    // A host whose connection closes at once (its proxy fails), and one that refuses the key.
    let config = hosts.config.with_extension("broken");
    let text = std::fs::read_to_string(&hosts.config).unwrap();
    std::fs::write(
        &config,
        format!(
            "Host closed\n  ProxyCommand false\n{}",
            text.replace("Host b", "Host nokey").replace("IdentityFile ", "IdentityFile /nonexistent")
        ),
    )
    .unwrap();
    for (alias, says) in [("closed", "cannot reach closed over SSH"), ("nokey", "Permission denied")] {
        let s = SshSpec::new(alias);
        let s = SshSpec { config: Some(config.clone()), ..s };
        let started = Instant::now();
        let e = format!("{:#}", SshHost::connect(&s).unwrap_err());
        assert!(e.contains(says) && e.contains("ssh exited with"), "{alias}: {e}");
        assert!(started.elapsed() < Duration::from_secs(15), "{alias}: {:?}", started.elapsed());
    }
    // Nothing is left where the refusals ran.
    hosts.hosts[0].wait_until_bare(false, Duration::from_secs(10)).unwrap();
}
