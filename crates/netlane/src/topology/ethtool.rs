//! Device offload features over ethtool netlink (Linux 5.6): the equivalent of
//! `ethtool -K dev rx-gro on rx-udp-gro-forwarding on`; and a device's channels, ring
//! sizes and interrupt coalescing (`ethtool -l/-L`, `-g/-G`, `-c/-C`), read and set by
//! name ([`Group`]).
//!
//! The `ethtool` crate can read features but not set them, so this module speaks the
//! generic-netlink family directly with `netlink-packet-generic` framing. Features are
//! named by their ethtool strings (`rx-gro`, `rx-udp-gro-forwarding`, `rx-gro-list`,
//! `tx-tcp-segmentation`, ...), sent as a verbose bitset without a mask, which changes
//! only the listed bits (Documentation/networking/ethtool-netlink.rst, "Bit sets").

use std::collections::BTreeMap;
use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

use super::genl::{Attr, Family, GenlSocket, attr_str, attrs};
use super::netlink::NetlinkError;

// include/uapi/linux/ethtool_netlink.h
const ETHTOOL_MSG_FEATURES_GET: u8 = 11;
const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
const ETHTOOL_MSG_RINGS_GET: u8 = 15;
const ETHTOOL_MSG_RINGS_SET: u8 = 16;
const ETHTOOL_MSG_CHANNELS_GET: u8 = 17;
const ETHTOOL_MSG_CHANNELS_SET: u8 = 18;
const ETHTOOL_MSG_COALESCE_GET: u8 = 19;
const ETHTOOL_MSG_COALESCE_SET: u8 = 20;
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

    /// Every setting of `group` the device reports, by name (a flag as 0 or 1). A
    /// device without the group's operations is an error whose cause is the kernel's
    /// (EOPNOTSUPP).
    pub fn settings(&mut self, dev: &str, group: Group) -> Result<Values, NetlinkError> {
        let op = format!("ethtool {} {dev}", group.get_flag());
        let (get, _) = group.commands();
        let replies = self.call(&op, get, vec![Self::header(dev)])?;
        let mut out = Values::new();
        for raw in &replies {
            for (kind, value) in attrs(raw) {
                if let Some(s) = group.table().iter().find(|s| s.attr == kind) {
                    let v = match s.width {
                        Width::U8 => value.first().map(|b| u32::from(*b)),
                        Width::U32 => super::genl::attr_u32(value),
                    };
                    if let Some(v) = v {
                        out.insert(s.name.to_string(), v);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Sets the settings of `group` named in `values` (the others stay as they are). A
    /// name the group does not have, or one that only reports (a maximum), is refused
    /// before anything is sent.
    pub fn set_settings(&mut self, dev: &str, group: Group, values: &Values) -> Result<(), NetlinkError> {
        let words: Vec<String> = values.iter().map(|(n, v)| format!("{n} {v}")).collect();
        let op = format!("ethtool {} {dev} {}", group.set_flag(), words.join(" "));
        let mut attrs = vec![Self::header(dev)];
        for (name, v) in values {
            let Some(s) = group.table().iter().find(|s| s.name == name && s.settable) else {
                return Err(NetlinkError {
                    op,
                    source: io::Error::from_raw_os_error(libc::EINVAL),
                    message: Some(format!("{name} is not a setting of {} (it has {})", group.name(), group.settable())),
                });
            };
            attrs.push(match s.width {
                Width::U8 => Attr::U8(s.attr, u8::from(*v != 0)),
                Width::U32 => Attr::U32(s.attr, *v),
            });
        }
        let (_, set) = group.commands();
        self.call(&op, set, attrs).map(|_| ())
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

/// Settings by name, as numbers (a flag: 0 or 1).
pub type Values = BTreeMap<String, u32>;

/// A group of a device's settings that one ethtool message reads and another sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Group {
    /// Queue counts: `rx`, `tx`, `other`, `combined` (and their `-max`).
    Channels,
    /// Ring sizes: `rx`, `rx-mini`, `rx-jumbo`, `tx` (and their `-max`).
    Rings,
    /// Interrupt coalescing: `rx-usecs`, `rx-frames`, `tx-usecs`, `tx-frames`,
    /// `adaptive-rx`, `adaptive-tx`.
    Coalesce,
}

#[derive(Debug, Clone, Copy)]
enum Width {
    U8,
    U32,
}

/// One setting: its name, attribute, width, and whether it can be set.
#[derive(Debug, Clone, Copy)]
struct Setting {
    name: &'static str,
    attr: u16,
    width: Width,
    settable: bool,
}

const fn ro(name: &'static str, attr: u16) -> Setting {
    Setting { name, attr, width: Width::U32, settable: false }
}

const fn rw(name: &'static str, attr: u16) -> Setting {
    Setting { name, attr, width: Width::U32, settable: true }
}

const fn flag(name: &'static str, attr: u16) -> Setting {
    Setting { name, attr, width: Width::U8, settable: true }
}

// include/uapi/linux/ethtool_netlink.h: ETHTOOL_A_CHANNELS_*, _RINGS_*, _COALESCE_*.
const CHANNELS: [Setting; 8] = [
    ro("rx-max", 2),
    ro("tx-max", 3),
    ro("other-max", 4),
    ro("combined-max", 5),
    rw("rx", 6),
    rw("tx", 7),
    rw("other", 8),
    rw("combined", 9),
];
const RINGS: [Setting; 8] = [
    ro("rx-max", 2),
    ro("rx-mini-max", 3),
    ro("rx-jumbo-max", 4),
    ro("tx-max", 5),
    rw("rx", 6),
    rw("rx-mini", 7),
    rw("rx-jumbo", 8),
    rw("tx", 9),
];
const COALESCE: [Setting; 6] = [
    rw("rx-usecs", 2),
    rw("rx-frames", 3),
    rw("tx-usecs", 6),
    rw("tx-frames", 7),
    flag("adaptive-rx", 12),
    flag("adaptive-tx", 13),
];

impl Group {
    /// A setting as `GROUP.NAME=VALUE` (`channels.combined=4`, `coalesce.adaptive-rx=off`):
    /// its group, name and value, or why it is not one.
    pub fn parse_setting(s: &str) -> Result<(Group, String, u32), String> {
        let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected GROUP.NAME=VALUE"))?;
        let (group, name) = key.split_once('.').ok_or_else(|| format!("{key:?}: expected GROUP.NAME"))?;
        let group = Group::ALL
            .into_iter()
            .find(|g| g.name() == group)
            .ok_or_else(|| format!("{group:?}: not a group (channels, rings or coalesce)"))?;
        if !group.can_set(name) {
            return Err(format!("{name:?} is not a setting of {group} (it has {})", group.settable()));
        }
        let value = match value {
            "on" => 1,
            "off" => 0,
            v => v.parse::<u32>().map_err(|_| format!("{v:?}: a number (or on, off)"))?,
        };
        if name.starts_with("adaptive-") && value > 1 {
            return Err(format!("{name} {value}: on or off (1 or 0)"));
        }
        Ok((group, name.to_string(), value))
    }

    /// Every group.
    pub const ALL: [Group; 3] = [Group::Channels, Group::Rings, Group::Coalesce];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Group::Channels => "channels",
            Group::Rings => "rings",
            Group::Coalesce => "coalesce",
        }
    }

    fn table(self) -> &'static [Setting] {
        match self {
            Group::Channels => &CHANNELS,
            Group::Rings => &RINGS,
            Group::Coalesce => &COALESCE,
        }
    }

    fn commands(self) -> (u8, u8) {
        match self {
            Group::Channels => (ETHTOOL_MSG_CHANNELS_GET, ETHTOOL_MSG_CHANNELS_SET),
            Group::Rings => (ETHTOOL_MSG_RINGS_GET, ETHTOOL_MSG_RINGS_SET),
            Group::Coalesce => (ETHTOOL_MSG_COALESCE_GET, ETHTOOL_MSG_COALESCE_SET),
        }
    }

    fn get_flag(self) -> &'static str {
        match self {
            Group::Channels => "-l",
            Group::Rings => "-g",
            Group::Coalesce => "-c",
        }
    }

    fn set_flag(self) -> &'static str {
        match self {
            Group::Channels => "-L",
            Group::Rings => "-G",
            Group::Coalesce => "-C",
        }
    }

    /// The names it can set, comma separated.
    pub fn settable(self) -> String {
        self.table().iter().filter(|s| s.settable).map(|s| s.name).collect::<Vec<_>>().join(", ")
    }

    /// Whether `name` is one of its settings that can be set.
    pub fn can_set(self, name: &str) -> bool {
        self.table().iter().any(|s| s.settable && s.name == name)
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    fn every_group_names_its_settings_once_and_refuses_others_before_sending() {
        for g in Group::ALL {
            let mut names: Vec<&str> = g.table().iter().map(|s| s.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), g.table().len(), "{g}");
            assert!(!g.settable().is_empty());
        }
        assert!(Group::Channels.can_set("combined") && !Group::Channels.can_set("combined-max"));
        let mut e = Ethtool::open().unwrap();
        let err = e.set_settings("lo", Group::Channels, &Values::from([("combined-max".into(), 4)])).unwrap_err();
        assert_eq!(err.errno(), Some(libc::EINVAL));
        assert!(err.to_string().contains("ethtool -L lo combined-max 4"), "{err}");
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
