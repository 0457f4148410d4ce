//! Connecting to an NVMe/TCP target: queue connections, the admin bring-up a Linux host
//! performs, and keep-alive.
//!
//! [`Controller::connect`] does: ICReq/ICResp, Connect (admin, dynamic CNTLID, KATO),
//! Property Get CAP, Property Set CC.EN, Property Get CSTS until RDY, Identify Controller
//! (checking the same gates the Linux host checks), Set Features number of queues and
//! async event configuration, the active namespace list and each namespace, one held
//! Async Event Request, and a keep-alive thread sending Keep Alive every KATO/2.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::proto::cmd::{Sqe, Status, admin};
use crate::proto::fabrics::{self, Connect, Property, reg};
use crate::proto::host::{Completion, HostQueue, HostQueueConfig, QueueError};
use crate::proto::identify::{self, ControllerInfo, NamespaceInfo};

use crate::wire::{RxBuf, send_all};

/// Errors from the host side.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A socket operation failed.
    #[error(transparent)]
    Io(#[from] netlane::error::IoError),
    /// The queue's protocol state machine failed.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// A command completed with an error status.
    #[error("{what} failed: {status}")]
    Status {
        /// The command.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller answered something a host cannot use.
    #[error("controller not usable: {0}")]
    Unusable(String),
    /// No answer in time.
    #[error("timed out waiting for {0}")]
    Timeout(&'static str),
    /// The target closed the connection.
    #[error("the target closed the connection")]
    Closed,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HostError {
    let what = what.into();
    move |source| HostError::Io(netlane::error::IoError::new(what, source))
}

/// How to reach and identify to a target.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Target address.
    pub addr: SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Our host NQN.
    pub hostnqn: String,
    /// Our host identifier.
    pub hostid: [u8; 16],
    /// Header digests.
    pub hdgst: bool,
    /// Data digests.
    pub ddgst: bool,
    /// Keep-alive timeout in ms (0 disables keep-alive).
    pub kato_ms: u32,
    /// Timeout for connecting and for each bring-up command.
    pub timeout: Duration,
    /// Disable SQ flow control (lets the target complete reads with C2HData SUCCESS).
    pub disable_sqflow: bool,
}

/// The UUID form of a host NQN (NVMe Base 2.0, 4.5: `nqn.2014-08.org.nvmexpress:uuid:`
/// followed by a UUID in its 36-character text form).
pub fn uuid_hostnqn(id: &uuid::Uuid) -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{}", id.hyphenated())
}

/// This host's identity: the machine's `/etc/nvme/hostnqn` and `/etc/nvme/hostid` when
/// they exist (what nvme-cli and the kernel host present), else a random UUID for both.
/// The host ID is the UUID of a UUID host NQN when only the NQN is configured.
pub fn host_identity() -> (String, [u8; 16]) {
    let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let nqn = read("/etc/nvme/hostnqn");
    let id = read("/etc/nvme/hostid")
        .and_then(|s| uuid::Uuid::parse_str(&s).ok())
        .or_else(|| nqn.as_deref()?.rsplit_once(":uuid:").and_then(|(_, u)| uuid::Uuid::parse_str(u).ok()));
    match (nqn, id) {
        (Some(nqn), Some(id)) => (nqn, *id.as_bytes()),
        (nqn, id) => {
            let id = id.unwrap_or_else(uuid::Uuid::new_v4);
            (nqn.unwrap_or_else(|| uuid_hostnqn(&id)), *id.as_bytes())
        }
    }
}

impl ConnectOptions {
    /// Options with this host's identity ([`host_identity`]).
    pub fn new(addr: SocketAddr, subnqn: &str) -> ConnectOptions {
        let (hostnqn, hostid) = host_identity();
        ConnectOptions {
            addr,
            subnqn: subnqn.to_string(),
            hostnqn,
            hostid,
            hdgst: false,
            ddgst: false,
            kato_ms: 5000,
            timeout: Duration::from_secs(5),
            disable_sqflow: true,
        }
    }
}

/// One queue connection driven synchronously: submit, then read until the answer.
#[derive(Debug)]
pub struct QueueConn {
    /// The socket (blocking).
    pub sock: TcpStream,
    /// The queue state machine.
    pub q: HostQueue,
    rx: RxBuf,
    next_token: u64,
}

impl QueueConn {
    /// Opens a TCP connection and completes ICReq/ICResp.
    pub fn open(opts: &ConnectOptions, cfg: HostQueueConfig) -> Result<QueueConn, HostError> {
        let sock = TcpStream::connect_timeout(&opts.addr, opts.timeout)
            .map_err(io_err(format!("connect to {}", opts.addr)))?;
        sock.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
        let mut c = QueueConn { sock, q: HostQueue::new(cfg), rx: RxBuf::new(256 << 10), next_token: 1 };
        c.flush()?;
        let deadline = Instant::now() + opts.timeout;
        while !c.q.is_ready() {
            c.read_some(deadline, "ICResp")?;
        }
        Ok(c)
    }

    /// Consumes the connection into its parts (socket, state machine, and any bytes
    /// already received).
    pub fn into_parts(self) -> (TcpStream, HostQueue, Vec<u8>) {
        let rest = self.rx.data().to_vec();
        (self.sock, self.q, rest)
    }

    fn flush(&mut self) -> Result<(), HostError> {
        let out = self.q.poll_output();
        if !out.is_empty() {
            send_all(&self.sock, out).map_err(io_err("send"))?;
            let n = out.len();
            self.q.handle_written(n);
        }
        Ok(())
    }

    fn read_some(&mut self, deadline: Instant, what: &'static str) -> Result<(), HostError> {
        let left = deadline.checked_duration_since(Instant::now()).ok_or(HostError::Timeout(what))?;
        self.sock.set_read_timeout(Some(left.max(Duration::from_millis(1)))).map_err(io_err("SO_RCVTIMEO"))?;
        match self.rx.read_from(&self.sock, 0) {
            Ok(0) => return Err(HostError::Closed),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(HostError::Timeout(what));
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("receive")(e)),
        }
        let used = self.q.handle_input(self.rx.data());
        // A violation queues a termination request: try to send it before failing.
        let _ = self.flush();
        self.rx.consume(used?);
        Ok(())
    }

    /// Runs one command to completion. A completion of another command that arrives
    /// meanwhile (the held Async Event Request) is logged and dropped.
    pub fn run(
        &mut self,
        sqe: Sqe,
        data: Vec<u8>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Completion, HostError> {
        let token = self.send_command(sqe, data, what)?;
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(c) = self.q.pop_completion() {
                if c.token == token {
                    return Ok(c);
                }
                // Only the held Async Event Request completes out of turn; netlane
                // acts on no event, so it is noted and dropped.
                tracing::info!(cid = c.cqe.cid, status = %c.cqe.status, "asynchronous event or stray completion");
            }
            self.read_some(deadline, what)?;
        }
    }

    /// Runs a command and requires success.
    pub fn run_ok(
        &mut self,
        sqe: Sqe,
        data: Vec<u8>,
        timeout: Duration,
        what: &'static str,
    ) -> Result<Completion, HostError> {
        let c = self.run(sqe, data, timeout, what)?;
        if !c.cqe.status.is_success() {
            return Err(HostError::Status { what, status: c.cqe.status });
        }
        Ok(c)
    }

    /// Submits a command without waiting (an Async Event Request).
    pub fn submit_nowait(&mut self, sqe: Sqe) -> Result<(), HostError> {
        self.send_command(sqe, Vec::new(), "submit").map(|_| ())
    }

    /// Submits and sends a command; returns its token.
    fn send_command(&mut self, sqe: Sqe, data: Vec<u8>, what: &'static str) -> Result<u64, HostError> {
        let token = self.next_token;
        self.next_token += 1;
        self.q.submit(sqe, data, token).map_err(|(e, _)| HostError::Unusable(format!("{what}: {e}")))?;
        self.flush()?;
        Ok(token)
    }

    /// Fabrics Connect on this queue; returns the CNTLID.
    pub fn fabrics_connect(
        &mut self,
        opts: &ConnectOptions,
        qid: u16,
        cntlid: u16,
        sqsize: u16,
    ) -> Result<u16, HostError> {
        let c = Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr: if opts.disable_sqflow { fabrics::CATTR_DISABLE_SQFLOW } else { 0 },
            kato_ms: if qid == 0 { opts.kato_ms } else { 0 },
            hostid: opts.hostid,
            cntlid,
            subnqn: opts.subnqn.clone(),
            hostnqn: opts.hostnqn.clone(),
        };
        let (sqe, data) = c.encode(0);
        let done = self.run(sqe, data, opts.timeout, "Connect")?;
        if !done.cqe.status.is_success() {
            let st = done.cqe.status;
            let detail = if st == Status::CONNECT_INVALID_PARAM {
                let p = done.cqe.dw0;
                format!(" (invalid {} at byte {})", if p & (1 << 16) != 0 { "data" } else { "SQE field" }, p & 0xffff)
            } else {
                String::new()
            };
            return Err(HostError::Unusable(format!("Connect queue {qid} refused: {st}{detail}")));
        }
        Ok(done.cqe.dw0 as u16)
    }
}

fn cmd(op: u8, nsid: u32, cdw10: u32, cdw11: u32) -> Sqe {
    let mut s = Sqe::default();
    s.set_opcode(op);
    s.set_nsid(nsid);
    s.set_cdw(10, cdw10);
    s.set_cdw(11, cdw11);
    s
}

/// A namespace as the host sees it.
#[derive(Debug, Clone, Copy)]
pub struct HostNamespace {
    /// NSID.
    pub nsid: u32,
    /// Identify Namespace data.
    pub info: NamespaceInfo,
}

/// The keep-alive thread and its stop flag.
type KeepAlive = (Arc<(Mutex<bool>, Condvar)>, JoinHandle<()>);

/// A connected, enabled controller with its admin queue and keep-alive.
#[derive(Debug)]
pub struct Controller {
    opts: ConnectOptions,
    admin: Arc<Mutex<QueueConn>>,
    /// CNTLID the target assigned.
    pub cntlid: u16,
    /// Identify Controller.
    pub info: ControllerInfo,
    /// Active namespaces.
    pub namespaces: Vec<HostNamespace>,
    /// I/O queues granted by Set Features.
    pub io_queues: u16,
    /// CAP.MQES + 1: the largest queue.
    pub max_queue_entries: u32,
    ka: Option<KeepAlive>,
}

impl Controller {
    /// Connects the admin queue and brings the controller up, asking for `want_io_queues`.
    pub fn connect(opts: &ConnectOptions, want_io_queues: u16) -> Result<Controller, HostError> {
        let t = opts.timeout;
        let mut a = QueueConn::open(opts, HostQueueConfig::admin(opts.hdgst, opts.ddgst))?;
        let cntlid = a.fabrics_connect(opts, 0, fabrics::CNTLID_DYNAMIC, 31)?;
        let cap = a.run_ok(Property::get(0, reg::CAP, true), vec![], t, "Property Get CAP")?.cqe;
        let cap = u64::from(cap.dw0) | (u64::from(cap.dw1) << 32);
        let mqes = (cap & 0xffff) as u32 + 1;
        let to = Duration::from_millis(500 * ((cap >> 24) & 0xff).max(1));
        a.run_ok(Property::set(0, reg::CC, u64::from(fabrics::CC_ENABLE), false), vec![], t, "Property Set CC")?;
        let ready_by = Instant::now() + to;
        loop {
            let csts = a.run_ok(Property::get(0, reg::CSTS, false), vec![], t, "Property Get CSTS")?.cqe.dw0;
            if csts & 2 != 0 {
                return Err(HostError::Unusable("controller fatal status after enable".into()));
            }
            if csts & fabrics::CSTS_RDY != 0 {
                break;
            }
            if Instant::now() > ready_by {
                return Err(HostError::Timeout("CSTS.RDY"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let idc = a.run_ok(cmd(admin::IDENTIFY, 0, 1, 0), vec![0; 4096], t, "Identify Controller")?;
        let info = ControllerInfo::parse(&idc.data).ok_or_else(|| HostError::Unusable("Identify Controller".into()))?;
        // The gates the Linux host applies (drivers/nvme/host/core.c, fabrics.c).
        if info.cntlid != cntlid {
            return Err(HostError::Unusable(format!("Identify CNTLID {} != Connect's {cntlid}", info.cntlid)));
        }
        if opts.kato_ms != 0 && info.kas == 0 {
            return Err(HostError::Unusable("KAS is 0".into()));
        }
        if info.ioccsz < 4 || info.iorcsz < 1 {
            return Err(HostError::Unusable(format!("IOCCSZ {} / IORCSZ {}", info.ioccsz, info.iorcsz)));
        }
        let want = want_io_queues.max(1) - 1;
        let nq = a.run_ok(
            cmd(
                admin::SET_FEATURES,
                0,
                u32::from(identify::fid::NUM_QUEUES),
                u32::from(want) | (u32::from(want) << 16),
            ),
            vec![],
            t,
            "Set Features (number of queues)",
        )?;
        let io_queues = ((nq.cqe.dw0 & 0xffff).min(nq.cqe.dw0 >> 16) + 1) as u16;
        // Only the notices the controller advertises in OAES, as the Linux host does
        // (drivers/nvme/host/core.c, nvme_enable_aen); none advertised, no command. A
        // controller answers Invalid Field to a request for unadvertised ones (nvmet).
        let aec = info.oaes & identify::oaes::HOST_WANTS;
        if aec != 0 {
            a.run_ok(
                cmd(admin::SET_FEATURES, 0, u32::from(identify::fid::ASYNC_EVENT_CONFIG), aec),
                vec![],
                t,
                "Set Features (async event config)",
            )?;
        }
        let list = a.run_ok(cmd(admin::IDENTIFY, 0, 2, 0), vec![0; 4096], t, "Identify active namespaces")?;
        let mut namespaces = Vec::new();
        for nsid in identify::parse_ns_list(&list.data) {
            let d = a.run_ok(cmd(admin::IDENTIFY, nsid, 0, 0), vec![0; 4096], t, "Identify Namespace")?;
            let info = NamespaceInfo::parse(&d.data).ok_or_else(|| HostError::Unusable(format!("namespace {nsid}")))?;
            namespaces.push(HostNamespace { nsid, info });
        }
        a.submit_nowait(cmd(admin::ASYNC_EVENT, 0, 0, 0))?;
        let admin = Arc::new(Mutex::new(a));
        let ka = (opts.kato_ms != 0).then(|| spawn_keepalive(admin.clone(), opts.kato_ms, t));
        Ok(Controller { opts: opts.clone(), admin, cntlid, info, namespaces, io_queues, max_queue_entries: mqes, ka })
    }

    /// Runs an admin command.
    pub fn admin_run(&self, sqe: Sqe, data: Vec<u8>, what: &'static str) -> Result<Completion, HostError> {
        let mut a = self.admin.lock().map_err(|_| HostError::Unusable("admin queue lock poisoned".into()))?;
        a.run(sqe, data, self.opts.timeout, what)
    }

    /// Connects I/O queue `qid` with `depth` entries (its own TCP connection).
    pub fn connect_io_queue(&self, qid: u16, depth: u16) -> Result<QueueConn, HostError> {
        if qid == 0 || qid > self.io_queues {
            return Err(HostError::Unusable(format!("queue {qid} outside the {} granted", self.io_queues)));
        }
        let depth = depth.clamp(1, self.max_queue_entries.min(65535) as u16);
        let cfg = HostQueueConfig {
            qid,
            hdgst: self.opts.hdgst,
            ddgst: self.opts.ddgst,
            hpda: 0,
            maxr2t: 0,
            depth,
            in_capsule: self.info.in_capsule_bytes(),
            max_c2h: 16 << 20,
        };
        let mut q = QueueConn::open(&self.opts, cfg)?;
        q.fabrics_connect(&self.opts, qid, self.cntlid, depth - 1)?;
        Ok(q)
    }

    /// Stops keep-alive (so the target's timer expires) without shutting down: for
    /// testing expiry.
    pub fn stop_keepalive(&mut self) {
        if let Some((stop, t)) = self.ka.take() {
            if let Ok(mut s) = stop.0.lock() {
                *s = true;
            }
            stop.1.notify_all();
            let _ = t.join();
        }
    }

    /// Shuts the controller down (CC.SHN normal) and closes the admin queue.
    pub fn shutdown(mut self) -> Result<(), HostError> {
        self.stop_keepalive();
        let cc = fabrics::CC_ENABLE | (1 << 14);
        self.admin_run(Property::set(0, reg::CC, u64::from(cc), false), vec![], "Property Set CC.SHN").map(|_| ())
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop_keepalive();
    }
}

fn spawn_keepalive(admin: Arc<Mutex<QueueConn>>, kato_ms: u32, timeout: Duration) -> KeepAlive {
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let s2 = stop.clone();
    let period = Duration::from_millis(u64::from(kato_ms / 2).max(1));
    let t = std::thread::spawn(move || {
        let (lock, cv) = &*s2;
        loop {
            let Ok(guard) = lock.lock() else { return };
            let Ok((guard, _)) = cv.wait_timeout_while(guard, period, |stopped| !*stopped) else { return };
            if *guard {
                return;
            }
            drop(guard);
            let Ok(mut a) = admin.lock() else { return };
            if let Err(e) = a.run_ok(cmd(admin::KEEP_ALIVE, 0, 0, 0), vec![], timeout, "Keep Alive") {
                tracing::warn!(error = %netlane::error::chain(&e), "keep-alive failed");
                return;
            }
        }
    });
    (stop, t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_nqn_is_a_valid_uuid_nqn_matching_the_host_id() {
        let (nqn, id) = host_identity();
        if std::path::Path::new("/etc/nvme/hostnqn").exists() {
            return; // the machine's own identity, whatever its form
        }
        let u = nqn.strip_prefix("nqn.2014-08.org.nvmexpress:uuid:").expect(&nqn);
        assert_eq!(u.len(), 36, "{nqn}");
        assert_eq!(uuid::Uuid::parse_str(u).unwrap().as_bytes(), &id);
        assert_eq!(uuid_hostnqn(&uuid::Uuid::from_bytes(id)), nqn);
    }
}
