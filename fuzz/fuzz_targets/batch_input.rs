#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fairway::fuzz::batch_input(data));
