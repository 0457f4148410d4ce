//! The binary protocol's sequences, by command family, in the table's order (the fuzz
//! seeds are named by their place in it).

use crate::proto::binary::{op, request};

/// A set's extras: flags and expiry.
fn set_extras(flags: u32, exp: u32) -> Vec<u8> {
    [flags.to_be_bytes(), exp.to_be_bytes()].concat()
}

/// An incr's or decr's extras: delta, initial value and expiry.
fn incr(delta: u64, initial: u64, exp: u32) -> Vec<u8> {
    [&delta.to_be_bytes()[..], &initial.to_be_bytes(), &exp.to_be_bytes()].concat()
}

/// A request without a CAS value; its opaque is its opcode plus 100.
fn p(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    request(opcode, extras, key, value, u32::from(opcode) + 100, 0)
}

/// A request with a CAS value (opaque 7).
fn with_cas(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
    request(opcode, extras, key, value, 7, cas)
}

/// The commands on items: get, set, add, replace, cas, append, prepend, delete, incr,
/// decr, touch, gat and their quiet forms.
pub(super) fn item_rows() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        (
            "get, set, getk, quiet gets",
            vec![
                p(op::GET, &[], b"k", b""),
                p(op::SET, &set_extras(5, 0), b"k", b"hello"),
                p(op::GET, &[], b"k", b""),
                p(op::GETK, &[], b"k", b""),
                p(op::GETK, &[], b"nope", b""),
                [p(op::GETQ, &[], b"nope", b""), p(op::GETKQ, &[], b"k", b""), p(op::GETQ, &[], b"k", b"")].concat(),
                p(op::SETQ, &set_extras(0, 0), b"q", b"quiet"),
                p(op::GET, &[], b"q", b""),
            ],
        ),
        (
            "add, replace, cas, append, prepend",
            vec![
                p(op::ADD, &set_extras(0, 0), b"k", b"a"),
                p(op::ADD, &set_extras(0, 0), b"k", b"b"),
                p(op::ADDQ, &set_extras(0, 0), b"k", b"b"),
                p(op::REPLACE, &set_extras(0, 0), b"nope", b"b"),
                p(op::REPLACEQ, &set_extras(0, 0), b"nope", b"b"),
                p(op::REPLACE, &set_extras(3, 0), b"k", b"c"),
                with_cas(op::SET, &set_extras(0, 0), b"k", b"d", 99),
                with_cas(op::SET, &set_extras(0, 0), b"k", b"d", 2),
                with_cas(op::SET, &set_extras(0, 0), b"nope", b"d", 2),
                p(op::APPEND, &[], b"k", b"e"),
                p(op::PREPEND, &[], b"k", b"f"),
                p(op::APPENDQ, &[], b"k", b"g"),
                p(op::PREPENDQ, &[], b"nope", b"g"),
                p(op::GET, &[], b"k", b""),
            ],
        ),
        (
            "delete",
            vec![
                p(op::SET, &set_extras(0, 0), b"k", b"v"),
                with_cas(op::DELETE, &[], b"k", b"", 99),
                p(op::DELETE, &[], b"k", b""),
                p(op::DELETE, &[], b"k", b""),
                p(op::DELETEQ, &[], b"k", b""),
                p(op::SET, &set_extras(0, 0), b"k", b"v"),
                p(op::DELETEQ, &[], b"k", b""),
                p(op::GET, &[], b"k", b""),
            ],
        ),
        (
            "incr and decr",
            vec![
                p(op::INCREMENT, &incr(1, 10, u32::MAX), b"n", b""),
                p(op::INCREMENT, &incr(1, 10, 0), b"n", b""),
                p(op::INCREMENT, &incr(5, 0, 0), b"n", b""),
                p(op::DECREMENT, &incr(100, 0, 0), b"n", b""),
                p(op::INCREMENTQ, &incr(7, 0, 0), b"n", b""),
                p(op::DECREMENTQ, &incr(2, 0, 0), b"n", b""),
                p(op::GET, &[], b"n", b""),
                p(op::SET, &set_extras(0, 0), b"t", b"text"),
                p(op::INCREMENT, &incr(1, 0, 0), b"t", b""),
                with_cas(op::INCREMENT, &incr(1, 0, 0), b"n", b"", 99),
                p(op::SET, &set_extras(0, 0), b"w", b"18446744073709551615"),
                p(op::INCREMENT, &incr(2, 0, 0), b"w", b""),
            ],
        ),
        (
            "touch, gat, gatk",
            vec![
                p(op::TOUCH, &100u32.to_be_bytes(), b"k", b""),
                p(op::SET, &set_extras(9, 0), b"k", b"v"),
                p(op::TOUCH, &100u32.to_be_bytes(), b"k", b""),
                p(op::GAT, &100u32.to_be_bytes(), b"k", b""),
                p(op::GATK, &100u32.to_be_bytes(), b"k", b""),
                p(op::GATQ, &100u32.to_be_bytes(), b"nope", b""),
                p(op::GATKQ, &100u32.to_be_bytes(), b"k", b""),
            ],
        ),
    ]
}

/// The commands about the server: flush, noop, version, stat.
pub(super) fn server_rows() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![(
        "flush, noop, version",
        vec![
            p(op::SET, &set_extras(0, 0), b"k", b"v"),
            p(op::FLUSH, &[], b"", b""),
            p(op::GET, &[], b"k", b""),
            p(op::FLUSHQ, &[], b"", b""),
            p(op::FLUSH, &0u32.to_be_bytes(), b"", b""),
            p(op::NOOP, &[], b"", b""),
            p(op::VERSION, &[], b"", b""),
            p(op::STAT, &[], b"reset", b""),
        ],
    )]
}

/// Packets refused: skipped and the connection goes on, or it closes.
pub(super) fn refused_rows() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![
        (
            "refused packets",
            vec![
                // Too large: refused, its value skipped, and the key's old value dropped.
                p(op::SET, &set_extras(0, 0), b"big", b"v"),
                p(op::SET, &set_extras(0, 0), b"big", &[b'x'; 2000]),
                p(op::GET, &[], b"big", b""),
                // An opcode memcached does not serve: refused, its body skipped.
                p(0x30, &[], b"", b"xyz"),
                p(0x20, &[], b"", b""),
            ],
        ),
        ("a get with extras closes", vec![p(op::GET, &[1, 2, 3, 4], b"k", b"")]),
        (
            "a key longer than the body closes",
            vec![{
                let mut b = p(op::GET, &[], b"k", b"");
                b[2..4].copy_from_slice(&9u16.to_be_bytes());
                b
            }],
        ),
        ("a key over 250 bytes closes", vec![p(op::GET, &[], &[b'k'; 251], b"")]),
    ]
}

/// quit and quitq.
pub(super) fn quit_rows() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    vec![("quit", vec![p(op::QUIT, &[], b"", b"")]), ("quitq", vec![p(op::QUITQ, &[], b"", b"")])]
}
