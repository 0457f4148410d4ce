//! cargo fuzz run rr_stream
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_rr::proto::fuzzing::stream(data));
