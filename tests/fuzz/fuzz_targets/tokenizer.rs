#![no_main]
//! Fuzz target `tokenizer`: see `harness::tokenizer`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::tokenizer(data));
