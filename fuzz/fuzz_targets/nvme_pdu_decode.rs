//! cargo fuzz run nvme_pdu_decode -- seeds in fuzz/corpus/nvme_pdu_decode
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| netlane_nvme::proto::fuzzing::decode_stream(data));
