//! Device offload features over ethtool netlink (Linux 5.6): the equivalent of
//! `ethtool -K dev rx-gro on rx-udp-gro-forwarding on`.
//!
//! The `ethtool` crate can read features but not set them, so this module speaks the
//! generic-netlink family directly with `netlink-packet-generic` framing. Features are
//! named by their ethtool strings (`rx-gro`, `rx-udp-gro-forwarding`, `rx-gro-list`,
//! `tx-tcp-segmentation`, ...), sent as a verbose bitset without a mask, which changes
//! only the listed bits (Documentation/networking/ethtool-netlink.rst, "Bit sets").

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use super::genl::{Attr, Family, GenlSocket, attr_str, attrs};
use super::netlink::NetlinkError;

// include/uapi/linux/ethtool_netlink.h
const ETHTOOL_MSG_FEATURES_GET: u8 = 11;
const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
const ETHTOOL_A_HEADER_DEV_NAME: u16 = 2;
const ETHTOOL_A_FEATURES_HEADER: u16 = 1;
const ETHTOOL_A_FEATURES_WANTED: u16 = 3;
const ETHTOOL_A_FEATURES_ACTIVE: u16 = 4;
const ETHTOOL_A_BITSET_NOMASK: u16 = 1;
const ETHTOOL_A_BITSET_BITS: u16 = 3;
const ETHTOOL_A_BITSET_BITS_BIT: u16 = 1;
const ETHTOOL_A_BITSET_BIT_NAME: u16 = 2;
const ETHTOOL_A_BITSET_BIT_VALUE: u16 = 3;

#[derive(Debug, Clone)]
struct EthtoolFamily;

impl Family for EthtoolFamily {
    const NAME: &'static str = "ethtool";
    const VERSION: u8 = 1;
}

/// An ethtool-netlink socket in the namespace it was opened in.
pub struct Ethtool {
    sock: GenlSocket<EthtoolFamily>,
}

impl fmt::Debug for Ethtool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ethtool").finish_non_exhaustive()
    }
}

impl Ethtool {
    /// Opens a generic-netlink socket and resolves the "ethtool" family.
    pub fn open() -> Result<Self, NetlinkError> {
        Ok(Self { sock: GenlSocket::open("the kernel has no ethtool netlink interface (needs Linux 5.6+)")? })
    }

    fn call(&mut self, op: &str, cmd: u8, attrs: Vec<Attr>) -> Result<Vec<Vec<u8>>, NetlinkError> {
        self.sock.call(op, cmd, attrs, false)
    }

    fn header(dev: &str) -> Attr {
        Attr::Nest(ETHTOOL_A_FEATURES_HEADER, vec![Attr::Str(ETHTOOL_A_HEADER_DEV_NAME, dev.to_string())])
    }

    /// Requests features on or off by name. Only the named features change. Returns
    /// an error naming any feature that did not end up in the requested state (the
    /// device cannot change it, or it depends on another feature).
    pub fn set_features(&mut self, dev: &str, features: &[(&str, bool)]) -> Result<(), NetlinkError> {
        let bits = features
            .iter()
            .map(|(name, on)| {
                let mut bit = vec![Attr::Str(ETHTOOL_A_BITSET_BIT_NAME, (*name).to_string())];
                if *on {
                    bit.push(Attr::Flag(ETHTOOL_A_BITSET_BIT_VALUE));
                }
                Attr::Nest(ETHTOOL_A_BITSET_BITS_BIT, bit)
            })
            .collect();
        let wanted = Attr::Nest(ETHTOOL_A_FEATURES_WANTED, vec![Attr::Nest(ETHTOOL_A_BITSET_BITS, bits)]);
        let list = features.iter().map(|(n, on)| format!("{n} {}", if *on { "on" } else { "off" })).collect::<Vec<_>>();
        let op = format!("ethtool -K {dev} {}", list.join(" "));
        self.call(&op, ETHTOOL_MSG_FEATURES_SET, vec![Self::header(dev), wanted])?;
        let active = self.active_features(dev)?;
        let wrong: Vec<String> = features
            .iter()
            .filter(|(name, on)| active.get(*name).copied().unwrap_or(false) != *on)
            .map(|(name, on)| {
                format!(
                    "{name} is {} after asking for {}",
                    if *on { "off" } else { "on" },
                    if *on { "on" } else { "off" }
                )
            })
            .collect();
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(NetlinkError {
                op,
                source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
                message: Some(wrong.join("; ")),
            })
        }
    }

    /// The device's active features, by name: only features that are on appear (a missing name means off).
    pub fn active_features(&mut self, dev: &str) -> Result<BTreeMap<String, bool>, NetlinkError> {
        let op = format!("ethtool -k {dev}");
        let replies = self.call(&op, ETHTOOL_MSG_FEATURES_GET, vec![Self::header(dev)])?;
        let mut out = BTreeMap::new();
        for raw in &replies {
            for (kind, value) in attrs(raw) {
                if kind == ETHTOOL_A_FEATURES_ACTIVE {
                    parse_bitset(value, &mut out);
                }
            }
        }
        Ok(out)
    }
}

/// Reads a verbose bitset (`ETHTOOL_A_BITSET_BITS` of named bits) into `out`.
///
/// Two encodings exist: with `ETHTOOL_A_BITSET_NOMASK` ("list" mode, what the kernel
/// sends for active features) only the set bits are listed and carry no VALUE flag;
/// without it, each listed bit is on exactly when it carries the VALUE flag.
fn parse_bitset(value: &[u8], out: &mut BTreeMap<String, bool>) {
    let top = attrs(value);
    let list_mode = top.iter().any(|(kind, _)| *kind == ETHTOOL_A_BITSET_NOMASK);
    for (_, bits) in top.iter().filter(|(kind, _)| *kind == ETHTOOL_A_BITSET_BITS) {
        for (_, bit) in attrs(bits).iter().filter(|(kind, _)| *kind == ETHTOOL_A_BITSET_BITS_BIT) {
            let mut name = None;
            let mut on = list_mode;
            for (kind, v) in attrs(bit) {
                match kind {
                    ETHTOOL_A_BITSET_BIT_NAME => name = Some(attr_str(v)),
                    ETHTOOL_A_BITSET_BIT_VALUE => on = true,
                    _ => {}
                }
            }
            if let Some(n) = name {
                out.insert(n, on);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netlink_packet_core::{Emitable, NlaBuffer};

    #[test]
    fn bitset_round_trip() {
        let set = Attr::Nest(
            ETHTOOL_A_FEATURES_ACTIVE,
            vec![Attr::Nest(
                ETHTOOL_A_BITSET_BITS,
                vec![
                    Attr::Nest(
                        ETHTOOL_A_BITSET_BITS_BIT,
                        vec![
                            Attr::Str(ETHTOOL_A_BITSET_BIT_NAME, "rx-gro".into()),
                            Attr::Flag(ETHTOOL_A_BITSET_BIT_VALUE),
                        ],
                    ),
                    Attr::Nest(
                        ETHTOOL_A_BITSET_BITS_BIT,
                        vec![Attr::Str(ETHTOOL_A_BITSET_BIT_NAME, "rx-gro-list".into())],
                    ),
                ],
            )],
        );
        let mut buf = vec![0u8; set.buffer_len()];
        set.emit(&mut buf);
        let nla = NlaBuffer::new_checked(&buf[..]).unwrap();
        let mut out = BTreeMap::new();
        parse_bitset(nla.value(), &mut out);
        assert_eq!(out.get("rx-gro"), Some(&true));
        assert_eq!(out.get("rx-gro-list"), Some(&false));

        // List mode: every listed bit is on, without VALUE flags.
        let list = Attr::Nest(
            ETHTOOL_A_FEATURES_ACTIVE,
            vec![
                Attr::Flag(ETHTOOL_A_BITSET_NOMASK),
                Attr::Nest(
                    ETHTOOL_A_BITSET_BITS,
                    vec![Attr::Nest(
                        ETHTOOL_A_BITSET_BITS_BIT,
                        vec![Attr::Str(ETHTOOL_A_BITSET_BIT_NAME, "rx-gro".into())],
                    )],
                ),
            ],
        );
        let mut buf = vec![0u8; list.buffer_len()];
        list.emit(&mut buf);
        let nla = NlaBuffer::new_checked(&buf[..]).unwrap();
        let mut out = BTreeMap::new();
        parse_bitset(nla.value(), &mut out);
        assert_eq!(out.get("rx-gro"), Some(&true));
    }

    #[test]
    fn reads_loopback_features() {
        let mut e = Ethtool::open().unwrap();
        let f = e.active_features("lo").unwrap();
        // Loopback always segments in software and checksums nothing.
        assert_eq!(f.get("tx-generic-segmentation"), Some(&true), "{f:?}");
        let err = e.active_features("nodev-xyz").unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV));
    }
}
