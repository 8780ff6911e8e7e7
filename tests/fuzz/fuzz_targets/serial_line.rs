#![no_main]
//! Fuzz target `serial_line`: see `harness::serial_line`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::serial_line(data));
