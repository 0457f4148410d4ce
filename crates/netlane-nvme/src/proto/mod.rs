//! The sans-IO NVMe/TCP protocol core: no sockets, no threads, no clocks, no files.
//!
//! - [`pdu`]: PDU framing, header validation in the specification's order (every
//!   violation maps to a termination request's FES/FEI), header and data digests
//!   ([`digest`]), emission with padding to the negotiated alignment;
//! - [`cmd`]: submission/completion queue entries, SGL descriptors, status codes;
//! - [`fabrics`]: Connect, Property Get/Set, Disconnect, controller registers;
//! - [`identify`]: Identify structures and log pages;
//! - [`target`]: the controller side (a [`target::Subsystem`] shared by every
//!   connection, one [`target::TargetQueue`] per connection) over [`namespace`] storage;
//! - [`host`]: the host side of one queue ([`host::HostQueue`]).
//!
//! Both state machines take bytes in and put bytes out; the drivers beside this module
//! ([`crate::target`], [`crate::host`], [`crate::perf`]) own the sockets. Wire facts come from the NVMe/TCP transport specification
//! (revision 1.0) and NVMe Base 2.0; where real peers (Linux, SPDK) constrain a choice,
//! the code says so.

pub mod cmd;
pub mod digest;
pub mod fabrics;
pub mod fuzzing;
pub mod host;
pub mod identify;
pub mod namespace;
pub mod pdu;
pub mod target;
