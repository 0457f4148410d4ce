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

use netlink_packet_core::{
    DecodeError, Emitable, NLA_F_NESTED, NLM_F_ACK, Nla, NlaBuffer, NlasIterator,
    ParseableParametrized,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::{Socket, protocols::NETLINK_GENERIC};

use super::netlink::{NetlinkError, open_socket, transact};

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

/// A netlink attribute tree, enough for ethtool requests.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attr {
    Str(u16, String),
    Flag(u16),
    Nest(u16, Vec<Attr>),
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match self {
            Attr::Str(_, s) => s.len() + 1,
            Attr::Flag(_) => 0,
            Attr::Nest(_, children) => children.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attr::Str(k, _) | Attr::Flag(k) => *k,
            Attr::Nest(k, _) => *k | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Attr::Str(_, s) => {
                buffer[..s.len()].copy_from_slice(s.as_bytes());
                buffer[s.len()] = 0;
            }
            Attr::Flag(_) => {}
            Attr::Nest(_, children) => children.as_slice().emit(buffer),
        }
    }
}

/// An ethtool generic-netlink message: a command and its attributes (requests), or
/// the raw attribute bytes (replies).
#[derive(Debug, Clone)]
struct EthtoolMsg {
    cmd: u8,
    attrs: Vec<Attr>,
    raw: Vec<u8>,
}

impl GenlFamily for EthtoolMsg {
    fn family_name() -> &'static str {
        "ethtool"
    }
    fn command(&self) -> u8 {
        self.cmd
    }
    fn version(&self) -> u8 {
        1
    }
}

impl Emitable for EthtoolMsg {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }
    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl ParseableParametrized<[u8], GenlHeader> for EthtoolMsg {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Self {
            cmd: header.cmd,
            attrs: Vec::new(),
            raw: buf.to_vec(),
        })
    }
}

/// An ethtool-netlink socket in the namespace it was opened in.
pub struct Ethtool {
    sock: Socket,
    family: u16,
    seq: u32,
}

impl fmt::Debug for Ethtool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ethtool")
            .field("family", &self.family)
            .finish()
    }
}

impl Ethtool {
    /// Opens a generic-netlink socket and resolves the "ethtool" family.
    pub fn open() -> Result<Self, NetlinkError> {
        let op = "resolve the ethtool generic-netlink family";
        let sock = open_socket(NETLINK_GENERIC).map_err(|e| NetlinkError::io(op, e))?;
        let req = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName("ethtool".into())],
        });
        let replies = transact(&sock, 1, op, req, NLM_F_ACK).map_err(|e| NetlinkError {
            message: e.message.or(Some(
                "the kernel has no ethtool netlink interface (needs Linux 5.6+)".into(),
            )),
            ..e
        })?;
        let family = replies
            .iter()
            .flat_map(|m| m.payload.nlas.iter())
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::io(op, io::Error::from_raw_os_error(libc::ENOENT)))?;
        Ok(Self {
            sock,
            family,
            seq: 1,
        })
    }

    fn call(&mut self, op: &str, cmd: u8, attrs: Vec<Attr>) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let mut msg = GenlMessage::from_payload(EthtoolMsg {
            cmd,
            attrs,
            raw: Vec::new(),
        });
        msg.set_resolved_family_id(self.family);
        self.seq = self.seq.wrapping_add(1);
        let replies = transact(&self.sock, self.seq, op, msg, NLM_F_ACK)?;
        Ok(replies.into_iter().map(|m| m.payload.raw).collect())
    }

    fn header(dev: &str) -> Attr {
        Attr::Nest(
            ETHTOOL_A_FEATURES_HEADER,
            vec![Attr::Str(ETHTOOL_A_HEADER_DEV_NAME, dev.to_string())],
        )
    }

    /// Requests features on or off by name. Only the named features change. Returns
    /// an error naming any feature that did not end up in the requested state (the
    /// device cannot change it, or it depends on another feature).
    pub fn set_features(
        &mut self,
        dev: &str,
        features: &[(&str, bool)],
    ) -> Result<(), NetlinkError> {
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
        let wanted = Attr::Nest(
            ETHTOOL_A_FEATURES_WANTED,
            vec![Attr::Nest(ETHTOOL_A_BITSET_BITS, bits)],
        );
        let list = features
            .iter()
            .map(|(n, on)| format!("{n} {}", if *on { "on" } else { "off" }))
            .collect::<Vec<_>>();
        let op = format!("ethtool -K {dev} {}", list.join(" "));
        self.call(
            &op,
            ETHTOOL_MSG_FEATURES_SET,
            vec![Self::header(dev), wanted],
        )?;
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
        for raw in replies {
            for nla in NlasIterator::new(raw.as_slice()).filter_map(Result::ok) {
                if nla.kind() & !NLA_F_NESTED == ETHTOOL_A_FEATURES_ACTIVE {
                    parse_bitset(nla.value(), &mut out);
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
    let nested = |v: &[u8]| -> Vec<(u16, Vec<u8>)> {
        NlasIterator::new(v)
            .filter_map(Result::ok)
            .map(|n: NlaBuffer<&[u8]>| (n.kind() & !NLA_F_NESTED, n.value().to_vec()))
            .collect()
    };
    let top = nested(value);
    let list_mode = top.iter().any(|(kind, _)| *kind == ETHTOOL_A_BITSET_NOMASK);
    for (kind, bits) in top {
        if kind != ETHTOOL_A_BITSET_BITS {
            continue;
        }
        for (kind, bit) in nested(&bits) {
            if kind != ETHTOOL_A_BITSET_BITS_BIT {
                continue;
            }
            let mut name = None;
            let mut on = list_mode;
            for (kind, v) in nested(&bit) {
                match kind {
                    ETHTOOL_A_BITSET_BIT_NAME => {
                        let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
                        name = Some(String::from_utf8_lossy(&v[..end]).into_owned());
                    }
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
        let err = e.active_features("no-such-dev-xyz").unwrap_err();
        assert_eq!(err.errno(), Some(libc::ENODEV));
    }
}
