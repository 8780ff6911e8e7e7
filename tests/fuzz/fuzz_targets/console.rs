#![no_main]
//! Fuzz target `console`: see `harness::console`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::console(data));
