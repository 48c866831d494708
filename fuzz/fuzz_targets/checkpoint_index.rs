#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshc_fuzz::checkpoint_index(data));
