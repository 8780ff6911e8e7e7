//! The fuzz harness: one function per target, each feeding arbitrary bytes to a
//! real entry point of the library and checking what must hold for any input (a panic, an
//! assertion failure, a hang or a huge allocation is a bug). Shared by the libFuzzer targets
//! (`tests/fuzz/fuzz_targets/`, nightly) and by `tests/fuzz_regressions.rs`, which replays the
//! corpora and every regression input on stable in `cargo test`.
//!
//! The targets live in `harness/`, one file per family, so that each reads in one sitting:
//! model files (GGUF, KV snapshots), request interfaces (MQTT and the serial cores) and
//! tokenizers (with the chat template). This file keeps what they share: the target list, the
//! dispatch and the input reader.
//!
//! Uses only `edgellm`, `serde_json` and std: both crates that include it have those.
#![allow(dead_code)]

// Explicit paths: this file is itself included by `#[path]` from two directories (tests/ and
// tests/fuzz/fuzz_targets/), and a path relative to it reads the same from both.
#[path = "harness/formats.rs"]
mod formats;
#[path = "harness/interfaces.rs"]
mod interfaces;
#[path = "harness/model_files.rs"]
mod model_files;
#[path = "harness/tokenizers.rs"]
mod tokenizers;

// Every target at the top, as `harness::<target>`: the fuzz target files call them so, and
// `fuzz_regressions` checks they do.
pub use formats::answer_format;
pub use interfaces::{console, frame, modbus, mqtt_request, serial_line};
pub use model_files::{gguf, kv_snapshot};
pub use tokenizers::{chat_template, tokenizer};
// For the stable replay and make_corpus; no fuzz target reads it, hence the allow (the
// targets above are used by `run` in every crate).
#[allow(unused_imports)]
pub use tokenizers::SMOLLM2_TEMPLATE;

/// The targets, as named in `fuzz_targets/` and in `corpus/` and `regressions/`.
pub const TARGETS: [&str; 10] = [
    "gguf",
    "kv_snapshot",
    "mqtt_request",
    "serial_line",
    "frame",
    "modbus",
    "console",
    "chat_template",
    "tokenizer",
    "answer_format",
];

/// Runs target `name` on one input (the regression test's dispatch).
pub fn run(name: &str, data: &[u8]) {
    match name {
        "gguf" => gguf(data),
        "kv_snapshot" => kv_snapshot(data),
        "mqtt_request" => mqtt_request(data),
        "serial_line" => serial_line(data),
        "frame" => frame(data),
        "modbus" => modbus(data),
        "console" => console(data),
        "chat_template" => chat_template(data),
        "tokenizer" => tokenizer(data),
        "answer_format" => answer_format(data),
        other => panic!("no fuzz target {other:?}"),
    }
}

/// Reads the fuzz input as a script: small numbers and byte runs, never failing (an exhausted
/// input reads as zeros, so every input is a valid script).
pub struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input(data)
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
    /// A byte run with its length first (one byte).
    pub fn run(&mut self) -> &'a [u8] {
        let n = self.u8() as usize;
        self.bytes(n)
    }
    pub fn rest(&mut self) -> &'a [u8] {
        self.bytes(usize::MAX)
    }
}

/// Lossy UTF-8 of `b`, cut to at most `max` bytes on a character boundary.
fn text(b: &[u8], max: usize) -> String {
    let mut s = String::from_utf8_lossy(b).into_owned();
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}
