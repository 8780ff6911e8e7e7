#![no_main]
//! Fuzz target `mqtt_request`: see `harness::mqtt_request`.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::mqtt_request(data));
