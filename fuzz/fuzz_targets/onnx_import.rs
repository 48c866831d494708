#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshc_fuzz::onnx_import(data));
