#![no_main]

libfuzzer_sys::fuzz_target!(init: meshc_fuzz::init(), |data: &[u8]| meshc_fuzz::text_graph(data));
