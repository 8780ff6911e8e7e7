#![no_main]
//! Fuzz target `modbus`: see `harness::modbus`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::modbus(data));
