#![no_main]
//! Fuzz target `kv_snapshot`: see `harness::kv_snapshot`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::kv_snapshot(data));
