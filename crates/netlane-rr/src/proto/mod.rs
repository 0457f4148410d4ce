//! The sans-IO protocol core: no sockets, clocks, files or threads. The drivers feed it
//! bytes and times; the fuzz targets feed it anything.

pub mod adapt;
pub mod client;
pub mod crafted;
pub mod frames;
pub mod fuzzing;
pub mod guard;
pub mod ipid;
pub mod packet;
pub mod reasm;
pub mod server;
pub mod stream;
pub mod wire;
