#![no_main]
//! Fuzz target `frame`: see `harness::frame`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::frame(data));
