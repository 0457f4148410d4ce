//! cargo fuzz run nvme_target_queue -- seeds in fuzz/corpus/nvme_target_queue
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_nvme::proto::fuzzing::target_queue(data));
