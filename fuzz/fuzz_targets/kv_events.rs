#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fairway::fuzz::kv_events(data));
