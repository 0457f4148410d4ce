//! Lanes: application device queues in software.
//!
//! A lane is one worker thread, one epoll instance, and the receive queues (NAPI
//! instances) it owns. A connection is served by the lane that owns the queue its
//! packets arrive on, so the thread that reads a socket is the one that polls (or is
//! woken by) that queue: one producer and one consumer per queue, no cross-CPU wake-ups,
//! and, with busy polling, no interrupts while the lane is busy.
//!
//! - [`map`]: which lane owns which NAPI id (sans-IO): the device's ids dealt out in
//!   queue order, a stable owner for an id first seen on a connection, NAPI id 0 to the
//!   least-loaded lane, lanes added and removed with only the ids that must move;
//! - [`queues`]: the device's receive queues, NAPI ids and their CPUs from netdev
//!   netlink, and per-NAPI settings (`napi-set`, else the sysfs knobs);
//! - [`reuseport`]: lanes without an acceptor: an `SO_REUSEPORT` group whose BPF
//!   selector gives each new flow to the socket of the lane owning its NAPI id;
//! - [`busy`]: a lane's busy-poll policy (`EPIOCSPARAMS` per epoll,
//!   `SO_PREFER_BUSY_POLL` per socket), each knob reported as applied or refused;
//! - [`apps`]: per-application priority and egress shaping: a cgroup whose socket
//!   program gives every socket of an application its priority and mark, and a class
//!   per application: mqprio channel mode offloaded to the device when it can be had,
//!   else htb classes fed by a TCX classifier;
//! - [`groups`]: an application's flows steered into its queue group (the stand-in for
//!   flower `hw_tc`: on a veth, a TCX program on the wire side picks the queue).
//!
//! # Minimum kernel version
//! NAPI ids 4.12; per-epoll busy polling 6.9; `queue-get`/`napi-get` 6.8; `napi-set`
//! 6.13 (IRQ suspension). Older kernels get every knob reported as refused, with the
//! kernel's reason, and lanes still work as plain workers.

pub mod apps;
pub mod busy;
pub mod groups;
pub mod map;
pub mod queues;
pub mod reuseport;
pub mod txq;

pub use apps::{AppCgroup, AppError, AppSpec, Shaper, ShapingPlan};
pub use busy::{BusyPoll, Knob, KnobStatus};
pub use groups::{GroupRule, QueueGroups};
pub use map::{LaneId, LaneMap, MapCounts, MapError, Move, Placement, Why};
pub use queues::{DeviceQueues, RxQueue};
pub use reuseport::ReuseportSteering;
pub use txq::RecordedRxQueues;
