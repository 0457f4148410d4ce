//! The warm-up: every key of the workload stored once, so gets hit.

use std::io::{Read as _, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use super::{LoadConfig, LoadError, connect, io_err};
use crate::load::codec::{Codec, Reply, SetReply};
use crate::load::workload::Workload;

/// Stores every key of the workload once (pipelined, over up to 8 connections), so
/// gets hit. Every set must be answered STORED. Returns the keys stored.
pub fn warm_up(cfg: &LoadConfig) -> Result<u64, LoadError> {
    let workload = Workload::new(cfg.workload).map_err(|e| LoadError::Config(e.to_string()))?;
    let lanes = 8.min(cfg.connections as usize).max(1);
    let keys = workload.spec().keys;
    let results: Vec<Result<u64, LoadError>> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..lanes)
            .map(|lane| {
                let workload = &workload;
                sc.spawn(move || warm_lane(cfg.server, workload, lane as u64, lanes as u64))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(LoadError::Warmup("thread panicked".into()))))
            .collect()
    });
    let mut stored = 0;
    for r in results {
        stored += r?;
    }
    if stored != keys {
        return Err(LoadError::Warmup(format!("{stored} of {keys} keys stored")));
    }
    Ok(stored)
}

fn warm_lane(server: SocketAddr, workload: &Workload, lane: u64, lanes: u64) -> Result<u64, LoadError> {
    let mut s = connect(server)?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io_err("read timeout"))?;
    let mut codec = Codec::new(workload.spec().item_max);
    let (mut out, mut buf) = (Vec::new(), vec![0u8; 65536]);
    let (mut stored, mut bad) = (0u64, None);
    let mut pending = 0usize;
    let requests = workload.warmup().enumerate().filter(|(i, _)| *i as u64 % lanes == lane).map(|(_, r)| r);
    let mut requests = requests.peekable();
    while requests.peek().is_some() || pending > 0 {
        out.clear();
        while pending < 64
            && let Some(r) = requests.next()
        {
            codec.encode(0, &r, &mut out);
            pending += 1;
        }
        s.write_all(&out).map_err(io_err("warm-up write"))?;
        let n = s.read(&mut buf).map_err(io_err("warm-up read"))?;
        if n == 0 {
            return Err(LoadError::Warmup("the server closed the connection".into()));
        }
        codec
            .decode(&buf[..n], |c| {
                pending -= 1;
                match c.reply {
                    Reply::Set(SetReply::Stored) => stored += 1,
                    other => bad = Some(format!("{other:?}")),
                }
            })
            .map_err(|e| LoadError::Warmup(e.to_string()))?;
        if let Some(b) = &bad {
            return Err(LoadError::Warmup(format!("a set was answered {b}")));
        }
    }
    Ok(stored)
}
