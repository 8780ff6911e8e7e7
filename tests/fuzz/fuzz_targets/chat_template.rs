#![no_main]
//! Fuzz target `chat_template`: see `harness::chat_template`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::chat_template(data));
