//! cargo fuzz run nvme_host_queue -- seeds in fuzz/corpus/nvme_host_queue
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_nvme::proto::fuzzing::host_queue(data));
