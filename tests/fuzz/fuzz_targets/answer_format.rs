#![no_main]
//! Fuzz target `answer_format`: see `harness::answer_format`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::answer_format(data));
