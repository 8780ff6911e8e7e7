#![no_main]
//! Fuzz target `gguf`: see `harness::gguf`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::gguf(data));
