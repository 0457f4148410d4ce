//! Raw generic-netlink messages: a family resolved by name, a command, and a tree of
//! attributes. Enough for the few ethtool and netdev requests netlane makes, for which
//! no crate offers write support.

use std::fmt;
use std::io;
use std::marker::PhantomData;

use netlink_packet_core::{
    DecodeError, Emitable, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, Nla, NlaBuffer, NlasIterator, ParseableParametrized,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::{Socket, protocols::NETLINK_GENERIC};

use super::netlink::{NetlinkError, open_socket, transact};

/// A netlink attribute tree, for requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attr {
    Str(u16, String),
    U8(u16, u8),
    U32(u16, u32),
    U64(u16, u64),
    Flag(u16),
    Nest(u16, Vec<Attr>),
}

impl Nla for Attr {
    fn value_len(&self) -> usize {
        match self {
            Attr::Str(_, s) => s.len() + 1,
            Attr::U8(..) => 1,
            Attr::U32(..) => 4,
            Attr::U64(..) => 8,
            Attr::Flag(_) => 0,
            Attr::Nest(_, children) => children.as_slice().buffer_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Attr::Str(k, _) | Attr::U8(k, _) | Attr::U32(k, _) | Attr::U64(k, _) | Attr::Flag(k) => *k,
            Attr::Nest(k, _) => *k | NLA_F_NESTED,
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Attr::Str(_, s) => {
                buffer[..s.len()].copy_from_slice(s.as_bytes());
                buffer[s.len()] = 0;
            }
            Attr::U8(_, v) => buffer[0] = *v,
            Attr::U32(_, v) => buffer[..4].copy_from_slice(&v.to_ne_bytes()),
            Attr::U64(_, v) => buffer[..8].copy_from_slice(&v.to_ne_bytes()),
            Attr::Flag(_) => {}
            Attr::Nest(_, children) => children.as_slice().emit(buffer),
        }
    }
}

/// Attributes of a reply as `(kind without flags, value)` pairs.
pub(crate) fn attrs(raw: &[u8]) -> Vec<(u16, &[u8])> {
    NlasIterator::new(raw)
        .filter_map(Result::ok)
        .filter_map(|n: NlaBuffer<&[u8]>| {
            // NlasIterator checked the length against the buffer; the value follows the
            // 4-byte header.
            let kind = n.kind() & !NLA_F_NESTED;
            let len = usize::from(n.length());
            n.into_inner().get(4..len).map(|v| (kind, v))
        })
        .collect()
}

/// A string attribute value without its NUL.
pub(crate) fn attr_str(v: &[u8]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8_lossy(&v[..end]).into_owned()
}

/// A u32 attribute value.
pub(crate) fn attr_u32(v: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

/// A variable-width unsigned attribute value (the kernel's `NLA_UINT`: 4 or 8 bytes).
pub(crate) fn attr_uint(v: &[u8]) -> Option<u64> {
    match v.len() {
        4 => attr_u32(v).map(u64::from),
        8 => Some(u64::from_ne_bytes(v.try_into().ok()?)),
        _ => None,
    }
}

/// A generic-netlink family, by name and version.
pub(crate) trait Family: fmt::Debug + Clone + Send + 'static {
    const NAME: &'static str;
    const VERSION: u8;
}

/// A message of family `F`: a command and attributes (requests) or raw attribute
/// bytes (replies).
#[derive(Debug, Clone)]
pub(crate) struct RawMsg<F> {
    cmd: u8,
    attrs: Vec<Attr>,
    raw: Vec<u8>,
    family: PhantomData<F>,
}

impl<F: Family> GenlFamily for RawMsg<F> {
    fn family_name() -> &'static str {
        F::NAME
    }
    fn command(&self) -> u8 {
        self.cmd
    }
    fn version(&self) -> u8 {
        F::VERSION
    }
}

impl<F> Emitable for RawMsg<F> {
    fn buffer_len(&self) -> usize {
        self.attrs.as_slice().buffer_len()
    }
    fn emit(&self, buffer: &mut [u8]) {
        self.attrs.as_slice().emit(buffer)
    }
}

impl<F: fmt::Debug> ParseableParametrized<[u8], GenlHeader> for RawMsg<F> {
    fn parse_with_param(buf: &[u8], header: GenlHeader) -> Result<Self, DecodeError> {
        Ok(Self { cmd: header.cmd, attrs: Vec::new(), raw: buf.to_vec(), family: PhantomData })
    }
}

/// A generic-netlink socket bound to family `F`, in the namespace it was opened in.
pub(crate) struct GenlSocket<F> {
    sock: Socket,
    family_id: u16,
    seq: u32,
    family: PhantomData<F>,
}

impl<F> fmt::Debug for GenlSocket<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenlSocket").field("family_id", &self.family_id).finish()
    }
}

impl<F: Family> GenlSocket<F> {
    /// Opens a socket and resolves the family's id; `missing` explains a kernel
    /// without the family.
    pub(crate) fn open(missing: &str) -> Result<Self, NetlinkError> {
        let op = format!("resolve the {} generic-netlink family", F::NAME);
        let sock = open_socket(NETLINK_GENERIC).map_err(|e| NetlinkError::io(&op, e))?;
        let req = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(F::NAME.into())],
        });
        let replies = transact(&sock, 1, &op, req, NLM_F_ACK)
            .map_err(|e| NetlinkError { message: e.message.or(Some(missing.to_string())), ..e })?;
        let family_id = replies
            .iter()
            .flat_map(|m| m.payload.nlas.iter())
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| NetlinkError::io(&op, io::Error::from_raw_os_error(libc::ENOENT)))?;
        Ok(Self { sock, family_id, seq: 1, family: PhantomData })
    }

    /// Sends a request (a dump if `dump`) and returns the raw attributes of each reply.
    pub(crate) fn call(
        &mut self,
        op: &str,
        cmd: u8,
        attrs: Vec<Attr>,
        dump: bool,
    ) -> Result<Vec<Vec<u8>>, NetlinkError> {
        let mut msg = GenlMessage::from_payload(RawMsg::<F> { cmd, attrs, raw: Vec::new(), family: PhantomData });
        msg.set_resolved_family_id(self.family_id);
        self.seq = self.seq.wrapping_add(1);
        let flags = if dump { NLM_F_DUMP } else { NLM_F_ACK };
        let replies = transact(&self.sock, self.seq, op, msg, flags)?;
        Ok(replies.into_iter().map(|m| m.payload.raw).collect())
    }
}
