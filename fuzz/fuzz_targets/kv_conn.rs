//! cargo fuzz run kv_conn -- seeds in fuzz/corpus/kv_conn
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_kv::proto::fuzzing::conn(data));
