//! cargo fuzz run rr_exchange -- seeds in fuzz/corpus/rr_exchange
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_rr::proto::fuzzing::exchange(data));
