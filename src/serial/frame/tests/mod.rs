//! FrameCore over a MemEnv: every frame type and error, splits, resynchronisation, the cache,
//! retransmission on a fake clock, and a megabyte of noise. Helpers here; the bytes coming in
//! (`input`) and the answers going out (`answer`) in their own files.

mod answer;
mod input;

use super::codec::{self, Decoded, Decoder};
use super::*;
use crate::serial::core::{Core, MemEnv};
use crate::service::{Chunk, Done, Event, FinishReason, Timings, Usage};
use std::time::Instant;

pub(super) type Frames = Vec<(u8, u8, Vec<u8>)>;

pub(super) fn core() -> FrameCore {
    FrameCore::new(FrameConfig {
        max_payload: 64,
        ..FrameConfig::default()
    })
    .unwrap()
}

pub(super) fn env() -> MemEnv {
    let mut e = MemEnv::default();
    e.clock = Some(Instant::now());
    e
}

pub(super) fn frame(seq: u8, k: u8, payload: &[u8]) -> Vec<u8> {
    codec::encode(seq, k, payload).to_vec()
}

pub(super) fn request(seq: u8, text: &str) -> Vec<u8> {
    let mut p = vec![0, 0, 0];
    p.extend_from_slice(text.as_bytes());
    frame(seq, kind::REQUEST, &p)
}

pub(super) fn ack(seq: u8, index: u16) -> Vec<u8> {
    frame(seq, kind::ACK, &index.to_le_bytes())
}

/// The frames written since the last call; anything else on the wire fails the test.
pub(super) fn frames(env: &mut MemEnv) -> Frames {
    let mut d = Decoder::new(codec::MAX_PAYLOAD);
    let out = std::mem::take(&mut env.out);
    assert_eq!(
        d.feed(&out),
        out.len(),
        "more than one frame's bytes at once is fine here"
    );
    let mut v = Vec::new();
    while let Some(x) = d.pop() {
        match x {
            Decoded::Frame { seq, kind, payload } => v.push((seq, kind, payload.to_vec())),
            other => panic!("the core wrote a bad frame: {other:?}"),
        }
    }
    assert_eq!(d.buffered(), 0, "a partial frame was written");
    v
}

pub(super) fn text(s: &str) -> Event {
    Event::Text(Chunk::try_from(s).unwrap())
}

pub(super) fn done(finish: FinishReason, prompt: usize, completion: usize) -> Event {
    Event::Done(Box::new(Done {
        id: "x".into(),
        text: String::new(),
        finish_reason: finish,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            restored_tokens: 0,
            dropped_turns: 0,
        },
        timings: Timings::default(),
        prompt_ids: vec![],
        generated_ids: vec![],
        top_logits: vec![],
        truncated_tokens: 0,
        valid: None,
        json: None,
        constraint: None,
        shape: None,
        session: None,
    }))
}

/// [`done`] of an answer asked for with a format, with or without its shape.
pub(super) fn done_valid(finish: FinishReason, valid: bool) -> Event {
    let Event::Done(mut d) = done(finish, 5, 3) else {
        unreachable!()
    };
    d.valid = Some(valid);
    Event::Done(d)
}

pub(super) fn data(seq: u8, index: u16, s: &str) -> (u8, u8, Vec<u8>) {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(s.as_bytes());
    (seq, kind::DATA, p)
}

/// An END frame of an answer asked for with no format (validity 0).
pub(super) fn end(
    seq: u8,
    index: u16,
    finish: u8,
    prompt: u32,
    completion: u32,
) -> (u8, u8, Vec<u8>) {
    let mut p = index.to_le_bytes().to_vec();
    p.push(finish);
    p.extend_from_slice(&prompt.to_le_bytes());
    p.extend_from_slice(&completion.to_le_bytes());
    p.push(0);
    (seq, kind::END, p)
}

pub(super) fn r_ack(seq: u8) -> (u8, u8, Vec<u8>) {
    (seq, kind::R_ACK, vec![])
}

pub(super) fn r_nak(seq: u8, reason: u8) -> (u8, u8, Vec<u8>) {
    (seq, kind::R_NAK, vec![reason])
}

/// An ERROR frame's (index, code, message).
pub(super) fn error_of(f: &(u8, u8, Vec<u8>)) -> (u16, u8, String) {
    assert_eq!(f.1, kind::ERROR, "not an ERROR frame: {f:?}");
    let p = &f.2;
    (
        u16::from_le_bytes([p[0], p[1]]),
        p[2],
        String::from_utf8(p[3..].to_vec()).unwrap(),
    )
}

/// A whole request and answer: "Hello" then "world", ended by eog.
pub(super) fn answered(c: &mut FrameCore, e: &mut MemEnv, seq: u8, prompt: &str) {
    c.on_bytes(&request(seq, prompt), e);
    c.on_event(text("Hello "), e);
    c.on_bytes(&ack(seq, 0), e);
    c.on_event(text("world"), e);
    c.on_event(done(FinishReason::Eog, 7, 2), e);
    c.on_bytes(&ack(seq, 1), e);
    c.on_bytes(&ack(seq, 2), e);
}

pub(super) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
