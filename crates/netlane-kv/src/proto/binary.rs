//! memcached's binary protocol (deprecated by memcached 1.6, still served, and spoken
//! by libmemcached's binary mode, spymemcached, xmemcached and Enyim): the 24-byte
//! packet header, and each opcode carried out as memcached 1.6.18 does it
//! (`proto_bin.c`).
//!
//! A packet is a header, then `extlen` bytes of extras, the key, and the value: the rest
//! of `bodylen`. All numbers are big-endian. The quiet opcodes (`*Q`) send nothing on
//! success (a quiet get: nothing on a miss); errors are always sent.
//!
//! Parsing cannot panic; what a packet asks for is checked against memcached's rules
//! before anything is read past its header ([`Check`]).

use super::exec::{self, After, Arith, Ctx, Outcome, arith_slot, count_gone, store_in};
use super::out::Out;
use super::parse::{StatsKind, StoreMode};
use crate::store::{KEY_MAX, StoreError};

/// A request's first byte.
pub const REQUEST: u8 = 0x80;
/// A response's first byte.
pub const RESPONSE: u8 = 0x81;
/// Header length.
pub const HEADER: usize = 24;

/// Response statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Status {
    /// Done.
    Success = 0x00,
    /// No such key.
    KeyNotFound = 0x01,
    /// The key exists (add), or its CAS value differs.
    KeyExists = 0x02,
    /// The value is over the item size limit.
    TooLarge = 0x03,
    /// Malformed request.
    InvalidArguments = 0x04,
    /// Not stored (append/prepend to a missing key).
    NotStored = 0x05,
    /// incr/decr of a value that is not a number.
    NonNumeric = 0x06,
    /// Not allowed (flush with flush disabled; memcached reuses SASL's status).
    AuthError = 0x20,
    /// Not an opcode served here.
    UnknownCommand = 0x81,
    /// No memory.
    OutOfMemory = 0x82,
}

impl Status {
    /// memcached's text for an error status.
    fn text(self) -> &'static [u8] {
        match self {
            Status::Success => b"",
            Status::KeyNotFound => b"Not found",
            Status::KeyExists => b"Data exists for key.",
            Status::TooLarge => b"Too large.",
            Status::InvalidArguments => b"Invalid arguments",
            Status::NotStored => b"Not stored.",
            Status::NonNumeric => b"Non-numeric server-side value for incr or decr",
            Status::AuthError => b"Auth failure.",
            Status::UnknownCommand => b"Unknown command",
            Status::OutOfMemory => b"Out of memory",
        }
    }
}

/// Opcodes memcached 1.6 serves.
pub mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

/// A request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// [`REQUEST`] for a request.
    pub magic: u8,
    /// The command.
    pub opcode: u8,
    /// Key length.
    pub keylen: u16,
    /// Extras length.
    pub extlen: u8,
    /// Extras, key and value length.
    pub bodylen: u32,
    /// Echoed in the response.
    pub opaque: u32,
    /// A CAS value to compare (0: none).
    pub cas: u64,
}

impl Header {
    /// The header at the start of `b`, if 24 bytes are there.
    pub fn parse(b: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER] = b.get(..HEADER)?.try_into().ok()?;
        let u16_at = |i: usize| u16::from_be_bytes([h[i], h[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
        Some(Header {
            magic: h[0],
            opcode: h[1],
            keylen: u16_at(2),
            extlen: h[4],
            bodylen: u32_at(8),
            opaque: u32_at(12),
            cas: u64::from_be_bytes([h[16], h[17], h[18], h[19], h[20], h[21], h[22], h[23]]),
        })
    }

    /// The value's length: the body less extras and key (0 when they exceed it, which
    /// [`check`] refuses).
    pub fn value_len(&self) -> usize {
        (self.bodylen as usize).saturating_sub(usize::from(self.extlen) + usize::from(self.keylen))
    }

    /// A storage command: its value is buffered whole before it runs.
    pub fn is_storage(&self) -> bool {
        matches!(self.base().0, op::SET | op::ADD | op::REPLACE | op::APPEND | op::PREPEND)
    }

    /// The opcode a quiet opcode stands for, and whether it is quiet.
    fn base(&self) -> (u8, bool) {
        match self.opcode {
            op::SETQ => (op::SET, true),
            op::ADDQ => (op::ADD, true),
            op::REPLACEQ => (op::REPLACE, true),
            op::DELETEQ => (op::DELETE, true),
            op::INCREMENTQ => (op::INCREMENT, true),
            op::DECREMENTQ => (op::DECREMENT, true),
            op::QUITQ => (op::QUIT, true),
            op::FLUSHQ => (op::FLUSH, true),
            op::APPENDQ => (op::APPEND, true),
            op::PREPENDQ => (op::PREPEND, true),
            op::GETQ => (op::GET, true),
            op::GETKQ => (op::GETK, true),
            op::GATQ => (op::GAT, true),
            op::GATKQ => (op::GATK, true),
            o => (o, false),
        }
    }
}

/// What to do with a packet, decided from its header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Not a request: close without a reply (memcached's "invalid magic").
    Close,
    /// Reply with this error and close (a malformed packet).
    Fatal(Status),
    /// Reply with this error, skip the rest of the body, go on.
    Refuse(Status),
    /// A storage command whose value is over the item size limit: E2BIG, skip the value
    /// (and for a set, drop the key's present value).
    TooLarge,
    /// A storage command whose value cannot get memory: ENOMEM, skip the value (and for
    /// a set, drop the key's present value).
    NoMemory,
    /// Run it once the whole body has arrived.
    Run,
}

/// memcached's checks of a request header (`dispatch_bin_command`).
pub fn check(h: &Header, item_max: usize) -> Check {
    if h.magic != REQUEST {
        return Check::Close;
    }
    let (ext, key, body) = (u32::from(h.extlen), u32::from(h.keylen), h.bodylen);
    if key > body || key + ext > body {
        return Check::Fatal(Status::UnknownCommand);
    }
    if usize::from(h.keylen) > KEY_MAX {
        return Check::Fatal(Status::InvalidArguments);
    }
    let (opcode, _) = h.base();
    let ok = match opcode {
        op::VERSION | op::NOOP | op::QUIT => ext == 0 && key == 0 && body == 0,
        op::FLUSH => key == 0 && body == ext && (ext == 0 || ext == 4),
        op::SET | op::ADD | op::REPLACE => ext == 8 && key != 0 && body >= key + 8,
        op::GET | op::GETK => ext == 0 && body == key && key > 0,
        op::DELETE => key > 0 && ext == 0 && body == key,
        op::INCREMENT | op::DECREMENT => key > 0 && ext == 20 && body == key + ext,
        op::APPEND | op::PREPEND => key > 0 && ext == 0,
        op::STAT => ext == 0,
        op::TOUCH | op::GAT | op::GATK => ext == 4 && key != 0,
        _ => return Check::Refuse(Status::UnknownCommand),
    };
    if !ok {
        return Check::Fatal(Status::InvalidArguments);
    }
    if h.is_storage() && h.value_len() > item_max {
        return Check::TooLarge;
    }
    Check::Run
}

/// Appends a response header for a body of these lengths.
#[allow(clippy::too_many_arguments)]
fn header(
    out: &mut Vec<u8>,
    opcode: u8,
    status: Status,
    opaque: u32,
    cas: u64,
    extlen: usize,
    keylen: usize,
    vlen: usize,
) {
    out.reserve(HEADER);
    out.push(RESPONSE);
    out.push(opcode);
    out.extend_from_slice(&(keylen as u16).to_be_bytes());
    out.push(extlen as u8);
    out.push(0);
    out.extend_from_slice(&(status as u16).to_be_bytes());
    out.extend_from_slice(&((extlen + keylen + vlen) as u32).to_be_bytes());
    out.extend_from_slice(&opaque.to_be_bytes());
    out.extend_from_slice(&cas.to_be_bytes());
}

/// Appends a response packet.
#[allow(clippy::too_many_arguments)]
pub fn response(
    out: &mut Vec<u8>,
    opcode: u8,
    status: Status,
    opaque: u32,
    cas: u64,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
) {
    header(out, opcode, status, opaque, cas, extras.len(), key.len(), value.len());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// An error response with memcached's text for it.
pub fn error(out: &mut Vec<u8>, h: &Header, status: Status) {
    response(out, h.opcode, status, h.opaque, 0, &[], &[], status.text());
}

/// The response to a packet refused before its body was read (see [`Check`]): counts
/// it, and for a set that was too large drops the key's present value (no stale read).
pub fn refuse(ctx: &mut Ctx<'_>, h: &Header, key: Option<&[u8]>, c: Check, out: &mut Out) {
    match c {
        Check::Fatal(s) | Check::Refuse(s) => error(out, h, s),
        Check::TooLarge | Check::NoMemory => {
            let (opcode, _) = h.base();
            let unlink = opcode == op::SET;
            let e = if c == Check::TooLarge { StoreError::TooLarge } else { StoreError::OutOfMemory };
            match key {
                Some(k) => {
                    exec::refuse_store(ctx, k, unlink, e);
                }
                None => {
                    exec::store_error(ctx.counters, e);
                }
            }
            if c == Check::TooLarge {
                error(out, h, Status::TooLarge);
            } else {
                // memcached's words for it in the binary protocol.
                response(out, h.opcode, Status::OutOfMemory, h.opaque, 0, &[], &[], b"Out of memory allocating item");
            }
        }
        Check::Close | Check::Run => {}
    }
}

fn be32(b: &[u8]) -> u32 {
    b.get(..4).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn be64(b: &[u8]) -> u64 {
    b.get(..8).map_or(0, |b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
}

/// Runs a whole packet (header checked with [`check`] as [`Check::Run`]): `body` is its
/// extras, key and value.
pub fn run(ctx: &mut Ctx<'_>, h: &Header, body: &[u8], out: &mut Out) -> After {
    let ext_end = usize::from(h.extlen).min(body.len());
    let key_end = (ext_end + usize::from(h.keylen)).min(body.len());
    let (extras, key, value) = (&body[..ext_end], &body[ext_end..key_end], &body[key_end..]);
    let (opcode, quiet) = h.base();
    let clock = ctx.clock;
    // A reply that a quiet opcode leaves out on success.
    let ok = |out: &mut Vec<u8>, cas: u64, extras: &[u8], value: &[u8]| {
        if !quiet {
            response(out, h.opcode, Status::Success, h.opaque, cas, extras, &[], value);
        }
    };
    match opcode {
        op::NOOP => ok(out, 0, &[], &[]),
        op::VERSION => ok(out, 0, &[], ctx.host.version().as_bytes()),
        op::QUIT => {
            ok(out, 0, &[], &[]);
            return After::Close;
        }
        op::FLUSH => {
            if !ctx.settings.flush {
                error(out, h, Status::AuthError);
                return After::Continue;
            }
            ctx.counters.cmd_flush += 1;
            let exptime = if extras.len() == 4 { be32(extras) as i32 } else { 0 };
            exec::flush_at(ctx.store, clock, exptime);
            ok(out, 0, &[], &[]);
        }
        op::GET | op::GETK | op::TOUCH | op::GAT | op::GATK => get(ctx, h, opcode, quiet, extras, key, out),
        op::SET | op::ADD | op::REPLACE | op::APPEND | op::PREPEND => match store(ctx, h, opcode, extras, key, value) {
            Ok(cas) => ok(out, cas, &[], &[]),
            Err(s) => error(out, h, s),
        },
        op::DELETE => match delete(ctx, h, key) {
            Ok(()) => ok(out, 0, &[], &[]),
            Err(s) => error(out, h, s),
        },
        op::INCREMENT | op::DECREMENT => match arith(ctx, h, opcode == op::INCREMENT, extras, key) {
            Ok((n, cas)) => ok(out, cas, &[], &n.to_be_bytes()),
            Err(s) => error(out, h, s),
        },
        op::STAT => stat(ctx, h, key, out),
        _ => error(out, h, Status::UnknownCommand),
    }
    After::Continue
}

/// set, add, replace, append, prepend (and their quiet forms): the new CAS value, or
/// the error status.
fn store(ctx: &mut Ctx<'_>, h: &Header, opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Result<u64, Status> {
    let clock = ctx.clock;
    let (flags, exptime) = if extras.len() == 8 { (be32(extras), be32(&extras[4..]) as i32) } else { (0, 0) };
    let mut mode = match opcode {
        op::SET => StoreMode::Set,
        op::ADD => StoreMode::Add,
        op::REPLACE => StoreMode::Replace,
        op::APPEND => StoreMode::Append,
        _ => StoreMode::Prepend,
    };
    // A set or replace with a CAS value is a cas (add ignores it).
    if h.cas != 0 && matches!(mode, StoreMode::Set | StoreMode::Replace) {
        mode = StoreMode::Cas;
    }
    let c = &mut *ctx.counters;
    c.cmd_set += 1;
    let exp = clock.deadline(i64::from(exptime));
    let (r, cas) = ctx.store.with_slot(key, clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        let r = store_in(c, slot, mode, value, flags, exp, h.cas, false);
        (r, slot.item().map_or(0, |it| it.cas()))
    });
    match r {
        Outcome::Stored => Ok(cas),
        Outcome::Exists => Err(Status::KeyExists),
        Outcome::NotFound => Err(Status::KeyNotFound),
        Outcome::NotStored | Outcome::Failed(_) => {
            if let Outcome::Failed(e) = r {
                exec::store_error(c, e);
            }
            Err(match opcode {
                op::ADD => Status::KeyExists,
                op::REPLACE => Status::KeyNotFound,
                _ => Status::NotStored,
            })
        }
    }
}

/// delete (and deleteq): removes the key if its CAS value matches (0: any).
fn delete(ctx: &mut Ctx<'_>, h: &Header, key: &[u8]) -> Result<(), Status> {
    let c = &mut *ctx.counters;
    let r = ctx.store.with_slot(key, ctx.clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        match slot.item().map(|it| it.cas()) {
            None => Err(Status::KeyNotFound),
            Some(cas) if h.cas != 0 && h.cas != cas => Err(Status::KeyExists),
            Some(_) => {
                slot.remove();
                Ok(())
            }
        }
    });
    match r {
        Ok(()) => c.delete_hits += 1,
        Err(Status::KeyNotFound) => c.delete_misses += 1,
        Err(_) => {}
    }
    r
}

/// increment, decrement (and their quiet forms): the new value and CAS value. A
/// missing key is created with the initial value unless the expiration is all ones.
fn arith(ctx: &mut Ctx<'_>, h: &Header, incr: bool, extras: &[u8], key: &[u8]) -> Result<(u64, u64), Status> {
    let clock = ctx.clock;
    let (delta, initial, expiration) =
        (be64(extras), be64(&extras[8.min(extras.len())..]), be32(&extras[16.min(extras.len())..]));
    let c = &mut *ctx.counters;
    ctx.store.with_slot(key, clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        match arith_slot(slot, incr, delta, h.cas) {
            Arith::Missing if expiration != u32::MAX => {
                let mut text = Vec::with_capacity(20);
                super::reply::push_u64(&mut text, initial);
                let exp = clock.deadline(i64::from(expiration as i32));
                match slot.store(&text, 0, exp, None) {
                    Ok(cas) => Ok((initial, cas)),
                    Err(_) => Err(Status::OutOfMemory),
                }
            }
            Arith::Done(n) => {
                if incr {
                    c.incr_hits += 1
                } else {
                    c.decr_hits += 1
                }
                Ok((n, slot.item().map_or(0, |it| it.cas())))
            }
            Arith::Missing => {
                if incr {
                    c.incr_misses += 1
                } else {
                    c.decr_misses += 1
                }
                Err(Status::KeyNotFound)
            }
            Arith::NonNumeric => Err(Status::NonNumeric),
            Arith::CasMismatch => Err(Status::KeyExists),
            Arith::Failed => Err(Status::OutOfMemory),
        }
    })
}

/// get, getk, touch, gat, gatk (and their quiet forms).
fn get(ctx: &mut Ctx<'_>, h: &Header, opcode: u8, quiet: bool, extras: &[u8], key: &[u8], out: &mut Out) {
    let touch = matches!(opcode, op::TOUCH | op::GAT | op::GATK);
    let with_key = matches!(opcode, op::GETK | op::GATK);
    let with_value = opcode != op::TOUCH;
    let clock = ctx.clock;
    let exp = touch.then(|| clock.deadline(i64::from(be32(extras) as i32)));
    let c = &mut *ctx.counters;
    let hit = ctx.store.with_slot(key, clock.now_ms, |slot| {
        count_gone(c, slot.gone());
        if let (Some(e), Some(it)) = (exp, slot.item_mut()) {
            it.set_exp(e);
        }
        slot.hit()?;
        let it = slot.item()?;
        let flags = it.flags().to_be_bytes();
        let (data, value) = it.shared_value();
        let value = if with_value { value } else { 0..0 };
        // The header says how long the value is; the value itself may go by reference.
        let key = if with_key { key } else { &[] };
        header(out, h.opcode, Status::Success, h.opaque, it.cas(), flags.len(), key.len(), value.len());
        out.extend_from_slice(&flags);
        out.extend_from_slice(key);
        out.push_value(data, value);
        Some(())
    });
    exec::count_lookup(c, touch, hit.is_some());
    if hit.is_none() && !quiet {
        if with_key {
            response(out, h.opcode, Status::KeyNotFound, h.opaque, 0, &[], key, &[]);
        } else {
            error(out, h, Status::KeyNotFound);
        }
    }
}

/// stat: one packet per statistic (key: its name, value: its value), then an empty
/// packet. The statistics are the text protocol's, read back from its lines.
fn stat(ctx: &mut Ctx<'_>, h: &Header, key: &[u8], out: &mut Vec<u8>) {
    let kind = match key {
        b"" => StatsKind::General,
        b"reset" => StatsKind::Reset,
        b"settings" => StatsKind::Settings,
        b"items" => StatsKind::Items,
        b"slabs" => StatsKind::Slabs,
        b"sizes" => StatsKind::Sizes,
        b"conns" => StatsKind::Conns,
        // Per-prefix stats are not kept: on, off and dump answer an empty list.
        b"detail on" | b"detail off" | b"detail dump" => StatsKind::Detail { dump: true },
        _ => {
            error(out, h, Status::KeyNotFound);
            return;
        }
    };
    let mut text = Vec::new();
    if !matches!(kind, StatsKind::Detail { .. }) {
        ctx.host.stats(kind, ctx.store, ctx.counters, ctx.clock, &mut text);
    }
    for line in text.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(stat) = line.strip_prefix(b"STAT ") else { continue };
        let (name, value) = match memchr::memchr(b' ', stat) {
            Some(i) => (&stat[..i], &stat[i + 1..]),
            None => (stat, &[][..]),
        };
        response(out, h.opcode, Status::Success, h.opaque, 0, &[], name, value);
    }
    response(out, h.opcode, Status::Success, h.opaque, 0, &[], &[], &[]);
}

/// A request packet (tests, fuzzing, clients).
#[allow(clippy::too_many_arguments)]
pub fn request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], opaque: u32, cas: u64) -> Vec<u8> {
    let mut p = Vec::with_capacity(HEADER + extras.len() + key.len() + value.len());
    response(&mut p, opcode, Status::Success, opaque, cas, extras, key, value);
    p[0] = REQUEST;
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_checks_follow_memcached() {
        let p = request(op::SET, &[0, 0, 0, 5, 0, 0, 0, 0], b"key", b"value", 7, 9);
        let h = Header::parse(&p).unwrap();
        assert_eq!(h, Header { magic: REQUEST, opcode: op::SET, keylen: 3, extlen: 8, bodylen: 16, opaque: 7, cas: 9 });
        assert_eq!(h.value_len(), 5);
        assert_eq!(check(&h, 1024), Check::Run);
        assert_eq!(check(&h, 4), Check::TooLarge);
        assert_eq!(Header::parse(&p[..23]), None);
        // Not a request: close.
        assert_eq!(check(&Header { magic: b'g', ..h }, 1024), Check::Close);
        // The key longer than the body: unknown command, close.
        assert_eq!(check(&Header { bodylen: 2, ..h }, 1024), Check::Fatal(Status::UnknownCommand));
        // A get with extras, a set without: invalid, close.
        let g = Header::parse(&request(op::GET, &[1], b"k", b"", 0, 0)).unwrap();
        assert_eq!(check(&g, 1024), Check::Fatal(Status::InvalidArguments));
        let s = Header::parse(&request(op::SET, &[], b"k", b"v", 0, 0)).unwrap();
        assert_eq!(check(&s, 1024), Check::Fatal(Status::InvalidArguments));
        // A key longer than memcached's: invalid, close.
        let k = Header::parse(&request(op::GET, &[], &[b'k'; 251], b"", 0, 0)).unwrap();
        assert_eq!(check(&k, 1024), Check::Fatal(Status::InvalidArguments));
        // An opcode memcached does not serve: refused, the connection goes on.
        let u = Header::parse(&request(0x30, &[], b"", b"xyz", 0, 0)).unwrap();
        assert_eq!(check(&u, 1024), Check::Refuse(Status::UnknownCommand));
    }

    #[test]
    fn never_panics_on_any_header() {
        let mut b = [0u8; HEADER];
        for seed in 0u32..20_000 {
            for (i, x) in b.iter_mut().enumerate() {
                *x = (seed.wrapping_mul(2654435761).rotate_left(i as u32) >> 3) as u8;
            }
            b[0] = REQUEST;
            let h = Header::parse(&b).unwrap();
            let _ = (check(&h, 1 << 20), h.value_len(), h.base());
        }
    }
}
