//! FrameCore over a MemEnv: every frame type and error, splits, resynchronisation, the cache,
//! retransmission on a fake clock, and a megabyte of noise.

use super::codec::{self, Decoded, Decoder, START};
use super::*;
use crate::serial::core::{Core, MemEnv};
use crate::serial::stats::Count;
use crate::service::{
    Chunk, Done, ErrorCode, Event, FinishReason, Prompt, ServiceError, Timings, Usage,
};
use std::time::{Duration, Instant};

type Frames = Vec<(u8, u8, Vec<u8>)>;

fn core() -> FrameCore {
    FrameCore::new(FrameConfig {
        max_payload: 64,
        ..FrameConfig::default()
    })
    .unwrap()
}

fn env() -> MemEnv {
    let mut e = MemEnv::default();
    e.clock = Some(Instant::now());
    e
}

fn frame(seq: u8, k: u8, payload: &[u8]) -> Vec<u8> {
    codec::encode(seq, k, payload).to_vec()
}

fn request(seq: u8, text: &str) -> Vec<u8> {
    let mut p = vec![0, 0, 0];
    p.extend_from_slice(text.as_bytes());
    frame(seq, kind::REQUEST, &p)
}

fn ack(seq: u8, index: u16) -> Vec<u8> {
    frame(seq, kind::ACK, &index.to_le_bytes())
}

/// The frames written since the last call; anything else on the wire fails the test.
fn frames(env: &mut MemEnv) -> Frames {
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

fn text(s: &str) -> Event {
    Event::Text(Chunk::try_from(s).unwrap())
}

fn done(finish: FinishReason, prompt: usize, completion: usize) -> Event {
    Event::Done(Box::new(Done {
        id: "x".into(),
        text: String::new(),
        finish_reason: finish,
        usage: Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            restored_tokens: 0,
        },
        timings: Timings::default(),
        prompt_ids: vec![],
        generated_ids: vec![],
        top_logits: vec![],
        truncated_tokens: 0,
        session: None,
    }))
}

fn data(seq: u8, index: u16, s: &str) -> (u8, u8, Vec<u8>) {
    let mut p = index.to_le_bytes().to_vec();
    p.extend_from_slice(s.as_bytes());
    (seq, kind::DATA, p)
}

fn end(seq: u8, index: u16, finish: u8, prompt: u32, completion: u32) -> (u8, u8, Vec<u8>) {
    let mut p = index.to_le_bytes().to_vec();
    p.push(finish);
    p.extend_from_slice(&prompt.to_le_bytes());
    p.extend_from_slice(&completion.to_le_bytes());
    (seq, kind::END, p)
}

fn r_ack(seq: u8) -> (u8, u8, Vec<u8>) {
    (seq, kind::R_ACK, vec![])
}

fn r_nak(seq: u8, reason: u8) -> (u8, u8, Vec<u8>) {
    (seq, kind::R_NAK, vec![reason])
}

/// An ERROR frame's (index, code, message).
fn error_of(f: &(u8, u8, Vec<u8>)) -> (u16, u8, String) {
    assert_eq!(f.1, kind::ERROR, "not an ERROR frame: {f:?}");
    let p = &f.2;
    (
        u16::from_le_bytes([p[0], p[1]]),
        p[2],
        String::from_utf8(p[3..].to_vec()).unwrap(),
    )
}

/// A whole request and answer: "Hello" then "world", ended by eog.
fn answered(c: &mut FrameCore, e: &mut MemEnv, seq: u8, prompt: &str) {
    c.on_bytes(&request(seq, prompt), e);
    c.on_event(text("Hello "), e);
    c.on_bytes(&ack(seq, 0), e);
    c.on_event(text("world"), e);
    c.on_event(done(FinishReason::Eog, 7, 2), e);
    c.on_bytes(&ack(seq, 1), e);
    c.on_bytes(&ack(seq, 2), e);
}

fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn encoded_frame_has_its_bytes_where_the_docs_say() {
    // The worked example of docs/serial.md: PING, seq 7, payload "hi".
    let f = frame(7, kind::PING, b"hi");
    let crc = codec::crc16(&f[..7]).to_le_bytes();
    assert_eq!(f, [START, 2, 0, 7, 0x04, b'h', b'i', crc[0], crc[1]]);
    // CRC-16/MODBUS's check value, so the table is the standard one.
    assert_eq!(codec::crc16(b"123456789"), 0x4B37);
}

#[test]
fn request_is_acknowledged_and_submitted_as_a_chat_message() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(1, "What is 2+2?"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(1)]);
    assert_eq!(e.submitted.len(), 1);
    let r = &e.submitted[0];
    assert_eq!(r.source, "serial:test");
    assert_eq!(r.max_tokens, 128, "0 means the default");
    assert_eq!(r.deadline, None);
    match &r.prompt {
        Prompt::Chat(m) => {
            assert_eq!(
                (m[0].role.as_str(), m[0].content.as_str()),
                ("user", "What is 2+2?")
            )
        }
        p => panic!("not a chat: {p:?}"),
    }
    assert_eq!(e.counts, [Count::Requests]);
}

#[test]
fn raw_flag_and_max_tokens_reach_the_request() {
    let (mut c, mut e) = (core(), env());
    let mut p = vec![FLAG_RAW, 40, 1];
    p.extend_from_slice(b"Once upon");
    c.on_bytes(&frame(3, kind::REQUEST, &p), &mut e);
    assert_eq!(frames(&mut e), [r_ack(3)]);
    assert_eq!(e.submitted[0].max_tokens, 296);
    assert!(
        matches!(&e.submitted[0].prompt, Prompt::Text { text, special: false } if text == "Once upon")
    );
}

#[test]
fn answer_streams_one_frame_at_a_time_each_sent_after_the_previous_ack() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(9, "hi"), &mut e);
    frames(&mut e);
    c.on_event(text("Hello "), &mut e);
    assert_eq!(frames(&mut e), [data(9, 0, "Hello ")]);
    // Text arriving while frame 0 waits for its ACK is held, then sent in one frame.
    c.on_event(text("wor"), &mut e);
    c.on_event(text("ld"), &mut e);
    assert_eq!(frames(&mut e), []);
    c.on_bytes(&ack(9, 0), &mut e);
    assert_eq!(frames(&mut e), [data(9, 1, "world")]);
    c.on_event(done(FinishReason::Length, 12, 3), &mut e);
    assert_eq!(frames(&mut e), []);
    c.on_bytes(&ack(9, 1), &mut e);
    assert_eq!(frames(&mut e), [end(9, 2, 1, 12, 3)]);
    c.on_bytes(&ack(9, 2), &mut e);
    assert_eq!(frames(&mut e), []);
    assert_eq!(c.deadline(), None, "nothing is waiting for an ACK");
}

#[test]
fn ack_of_another_frame_or_sequence_is_ignored() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(9, "hi"), &mut e);
    c.on_event(text("a"), &mut e);
    c.on_event(text("b"), &mut e);
    frames(&mut e);
    c.on_bytes(&ack(8, 0), &mut e);
    c.on_bytes(&ack(9, 5), &mut e);
    assert_eq!(frames(&mut e), []);
    c.on_bytes(&ack(9, 0), &mut e);
    assert_eq!(frames(&mut e), [data(9, 1, "b")]);
}

#[test]
fn long_answer_is_cut_into_frames_at_character_boundaries() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(2, "hi"), &mut e);
    frames(&mut e);
    c.on_event(text("x"), &mut e);
    let answer: String = "é€😀 ascii ".repeat(20);
    let mut sent = String::from_utf8(frames(&mut e)[0].2[2..].to_vec()).unwrap();
    for piece in answer
        .as_bytes()
        .chunks(1)
        .collect::<Vec<_>>()
        .chunk_by(|_, b| b[0] & 0xC0 == 0x80)
    {
        let s: Vec<u8> = piece.concat();
        c.on_event(
            Event::Text(Chunk::try_from(std::str::from_utf8(&s).unwrap()).unwrap()),
            &mut e,
        );
    }
    c.on_event(done(FinishReason::Eog, 1, 1), &mut e);
    for index in 0.. {
        c.on_bytes(&ack(2, index), &mut e);
        let f = frames(&mut e);
        let Some((_, k, p)) = f.first() else { break };
        assert!(p.len() <= 64, "payload over the bound: {}", p.len());
        if *k == kind::END {
            break;
        }
        assert_eq!(u16::from_le_bytes([p[0], p[1]]), index + 1);
        sent.push_str(std::str::from_utf8(&p[2..]).expect("a frame cut a character"));
    }
    assert_eq!(sent, format!("x{answer}"));
}

#[test]
fn byte_by_byte_split_and_burst_input_give_the_same_frames() {
    let mut first = request(1, "Zürich");
    first.extend(frame(2, kind::PING, b"abc"));
    let mut second = ack(1, 0);
    second.extend(frame(3, kind::STATUS, b""));
    let run = |splits: &dyn Fn(&[u8]) -> Vec<Vec<u8>>| {
        let (mut c, mut e) = (core(), env());
        for part in splits(&first) {
            c.on_bytes(&part, &mut e);
        }
        c.on_event(text("ok"), &mut e);
        c.on_event(text("!"), &mut e);
        for part in splits(&second) {
            c.on_bytes(&part, &mut e);
        }
        (frames(&mut e), e.submitted.len())
    };
    let burst = run(&|b| vec![b.to_vec()]);
    let bytes = run(&|b| {
        let mut v = vec![vec![]];
        v.extend(b.iter().map(|x| vec![*x]));
        v
    });
    let pieces = run(&|b| vec![vec![], b[..3].to_vec(), b[3..11].to_vec(), b[11..].to_vec()]);
    let f = &burst.0;
    assert_eq!(
        f[..4],
        [
            r_ack(1),
            (2, kind::PONG, b"abc".to_vec()),
            data(1, 0, "ok"),
            data(1, 1, "!")
        ]
    );
    assert_eq!((f.len(), f[4].1, burst.1), (5, kind::STATUS_REPLY, 1));
    assert_eq!(bytes, burst);
    assert_eq!(pieces, burst);
}

#[test]
fn frame_with_bad_crc_is_nakked_and_counted_and_the_next_frame_is_taken() {
    let (mut c, mut e) = (core(), env());
    let mut bad = request(4, "hello");
    bad[7] ^= 0x10;
    c.on_bytes(&bad, &mut e);
    assert_eq!(frames(&mut e), [r_nak(4, nak::CRC)]);
    assert!(e.submitted.is_empty());
    assert_eq!(e.counts, [Count::Checksum]);
    c.on_bytes(&request(4, "hello"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(4)]);
    assert_eq!(e.submitted.len(), 1);
}

#[test]
fn garbage_before_a_frame_is_skipped_and_counted_once() {
    let (mut c, mut e) = (core(), env());
    let mut input = b"\x00\x11 noise from the bus \xff\xfe".to_vec();
    input.extend(frame(1, kind::PING, b""));
    c.on_bytes(&input, &mut e);
    assert_eq!(frames(&mut e), [(1, kind::PONG, vec![])]);
    assert_eq!(e.counts, [Count::BadInput]);
}

#[test]
fn a_stray_start_byte_in_front_of_a_frame_does_not_hide_it() {
    // A5 10 00: a header claiming 16 bytes, whose "payload" is the real frame behind it. Its
    // CRC fails; the search starts again one byte on and finds the real frame.
    let (mut c, mut e) = (core(), env());
    let mut input = vec![START, 0x10, 0x00];
    input.extend(request(5, "a question of some length"));
    c.on_bytes(&input, &mut e);
    let f = frames(&mut e);
    assert_eq!(f.last(), Some(&r_ack(5)), "{f:?}");
    assert_eq!(e.submitted.len(), 1);
}

#[test]
fn overlong_frame_is_nakked_counted_and_the_parser_resynchronises() {
    let (mut c, mut e) = (core(), env());
    let mut input = vec![START, 0xE8, 0x03, 6, kind::REQUEST];
    input.extend(std::iter::repeat_n(b'x', 1000));
    input.extend([0x12, 0x34]);
    input.extend(frame(7, kind::PING, b"p"));
    c.on_bytes(&input, &mut e);
    assert_eq!(
        frames(&mut e),
        [r_nak(6, nak::TOO_LONG), (7, kind::PONG, b"p".to_vec())]
    );
    assert_eq!(e.counts, [Count::BadInput]);
    assert!(e.submitted.is_empty());
}

#[test]
fn unknown_type_and_malformed_ack_are_nakked_and_counted() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&frame(1, 0x40, b"?"), &mut e);
    c.on_bytes(&frame(2, kind::ACK, b"\x00"), &mut e);
    c.on_bytes(&frame(3, kind::NAK, b""), &mut e);
    assert_eq!(
        frames(&mut e),
        [
            r_nak(1, nak::UNKNOWN_TYPE),
            r_nak(2, nak::MALFORMED),
            r_nak(3, nak::MALFORMED)
        ]
    );
    assert_eq!(e.counts, [Count::BadInput; 3]);
}

#[test]
fn malformed_requests_are_refused_with_bad_request_and_never_submitted() {
    let cases: [(&[u8], &str); 5] = [
        (b"\x00\x00", "shorter"),
        (b"\x80\x00\x00hi", "flags"),
        (b"\x00\x00\x00\xff\xfeok", "UTF-8"),
        (b"\x00\x00\x00", "empty"),
        (b"\x00\x00\x00  \r\n", "empty"),
    ];
    for (payload, why) in cases {
        let (mut c, mut e) = (core(), env());
        c.on_bytes(&frame(1, kind::REQUEST, payload), &mut e);
        let f = frames(&mut e);
        let (index, code, message) = error_of(&f[0]);
        assert_eq!((f.len(), index, code), (1, REFUSAL_INDEX, 1), "{why}");
        assert!(message.contains(why), "{message:?} should say {why}");
        assert!(e.submitted.is_empty());
        assert_eq!(e.counts, [Count::BadInput]);
    }
}

#[test]
fn a_second_request_while_one_runs_is_refused_busy() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(1, "first"), &mut e);
    c.on_bytes(&request(2, "second"), &mut e);
    let f = frames(&mut e);
    assert_eq!(f[0], r_ack(1));
    assert_eq!(error_of(&f[1]).0, REFUSAL_INDEX);
    assert_eq!(error_of(&f[1]).1, super::core::code_byte(ErrorCode::Busy));
    assert_eq!(e.submitted.len(), 1);
    // Once the first has ended, the same second request is taken.
    c.on_event(done(FinishReason::Eog, 1, 0), &mut e);
    c.on_bytes(&request(2, "second"), &mut e);
    assert_eq!(frames(&mut e).last(), Some(&r_ack(2)));
    assert_eq!(e.submitted.len(), 2);
}

#[test]
fn a_refusal_of_the_service_is_an_error_frame() {
    let (mut c, mut e) = (core(), env());
    e.refuse = Some(ServiceError::new(ErrorCode::Busy, "the queue is full"));
    c.on_bytes(&request(1, "hi"), &mut e);
    let f = frames(&mut e);
    assert_eq!(
        error_of(&f[0]),
        (REFUSAL_INDEX, 4, "the queue is full".into())
    );
    assert!(e.counts.is_empty());
    // Nothing was kept: the same request is tried again.
    e.refuse = None;
    c.on_bytes(&request(1, "hi"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(1)]);
}

#[test]
fn an_error_event_ends_the_answer_with_an_error_frame_that_needs_an_ack() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(1, "hi"), &mut e);
    frames(&mut e);
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::Timeout, "deadline passed")),
        &mut e,
    );
    let f = frames(&mut e);
    assert_eq!(error_of(&f[0]), (0, 5, "deadline passed".into()));
    assert!(c.deadline().is_some(), "it waits for its ACK");
    c.on_bytes(&ack(1, 0), &mut e);
    assert_eq!(c.deadline(), None);
}

#[test]
fn a_repeated_request_is_answered_from_the_cache_without_a_second_submit() {
    let (mut c, mut e) = (core(), env());
    answered(&mut c, &mut e, 3, "hi");
    frames(&mut e);
    e.counts.clear();
    c.on_bytes(&request(3, "hi"), &mut e);
    // The whole answer again, from frame 0, one frame per ACK.
    assert_eq!(frames(&mut e), [r_ack(3), data(3, 0, "Hello world")]);
    c.on_bytes(&ack(3, 0), &mut e);
    assert_eq!(frames(&mut e), [end(3, 1, 0, 7, 2)]);
    assert_eq!(e.submitted.len(), 1);
    assert_eq!(e.counts, [Count::Duplicate]);
}

#[test]
fn a_repeated_request_while_it_runs_is_acknowledged_again_and_not_resubmitted() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(3, "hi"), &mut e);
    c.on_event(text("Hel"), &mut e);
    frames(&mut e);
    c.on_bytes(&request(3, "hi"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(3)]);
    assert_eq!(e.submitted.len(), 1);
    assert_eq!(e.counts, [Count::Requests, Count::Duplicate]);
    c.on_bytes(&ack(3, 0), &mut e);
    c.on_event(text("lo"), &mut e);
    assert_eq!(frames(&mut e), [data(3, 1, "lo")]);
}

#[test]
fn the_same_sequence_with_another_prompt_is_a_new_request() {
    let (mut c, mut e) = (core(), env());
    answered(&mut c, &mut e, 3, "hi");
    c.on_bytes(&request(3, "something else"), &mut e);
    assert_eq!(e.submitted.len(), 2);
    assert!(!e.counts.contains(&Count::Duplicate));
}

#[test]
fn the_cache_holds_the_last_four_answers() {
    let (mut c, mut e) = (core(), env());
    for seq in 1..=5 {
        answered(&mut c, &mut e, seq, "hi");
    }
    for seq in 2..=5 {
        c.on_bytes(&request(seq, "hi"), &mut e);
    }
    assert_eq!(e.submitted.len(), 5, "2 to 5 came from the cache");
    c.on_bytes(&request(1, "hi"), &mut e);
    assert_eq!(
        e.submitted.len(),
        6,
        "1 was forgotten and is computed again"
    );
}

#[test]
fn an_unacknowledged_frame_is_sent_again_after_the_timeout_then_given_up() {
    let (mut c, mut e) = (core(), env());
    let t0 = e.clock.unwrap();
    c.on_bytes(&request(1, "hi"), &mut e);
    c.on_event(text("Hello"), &mut e);
    let sent = std::mem::take(&mut e.out);
    let timeout = FrameConfig::default().ack_timeout;
    assert_eq!(c.deadline(), Some(t0 + timeout));
    e.clock = Some(t0 + timeout - Duration::from_millis(1));
    c.on_tick(&mut e);
    assert!(e.out.is_empty(), "sent again too early");
    for n in 1..=3u32 {
        e.clock = Some(t0 + timeout * n);
        assert_eq!(c.deadline(), e.clock);
        c.on_tick(&mut e);
        assert_eq!(
            e.out,
            sent[sent.len() - e.out.len()..],
            "try {n} is the same frame"
        );
        assert_eq!(frames(&mut e), [data(1, 0, "Hello")]);
    }
    e.clock = Some(t0 + timeout * 4);
    c.on_tick(&mut e);
    assert!(e.out.is_empty(), "given up after 3 retries");
    assert_eq!(c.deadline(), None);
    assert_eq!(
        e.counts.iter().filter(|&&k| k == Count::Retransmit).count(),
        3
    );
    // The answer is finished and kept: the master's repeat of the request gets it all.
    c.on_event(text(" world"), &mut e);
    c.on_event(done(FinishReason::Eog, 2, 2), &mut e);
    assert!(e.out.is_empty());
    c.on_bytes(&request(1, "hi"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(1), data(1, 0, "Hello world")]);
    assert_eq!(e.submitted.len(), 1);
}

#[test]
fn a_nak_from_the_master_sends_the_frame_again_at_once() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(1, "hi"), &mut e);
    c.on_event(text("Hello"), &mut e);
    frames(&mut e);
    c.on_bytes(&frame(1, kind::NAK, &0u16.to_le_bytes()), &mut e);
    assert_eq!(frames(&mut e), [data(1, 0, "Hello")]);
    assert_eq!(e.counts.last(), Some(&Count::Retransmit));
}

#[test]
fn ping_is_answered_with_its_payload_and_status_with_the_counters() {
    let (mut c, mut e) = (core(), env());
    e.status.state = "online";
    e.status.model = "SmolLM2".into();
    e.status.queue = 2;
    e.status.answered = 300;
    e.status.port_checksum_errors = 9;
    c.on_bytes(&frame(1, kind::PING, b"\x01\x02"), &mut e);
    c.on_bytes(&frame(2, kind::STATUS, b""), &mut e);
    let f = frames(&mut e);
    assert_eq!(f[0], (1, kind::PONG, vec![1, 2]));
    let (seq, k, p) = &f[1];
    assert_eq!((*seq, *k), (2, kind::STATUS_REPLY));
    assert_eq!(p[..4], [0, 0, 2, 0]);
    assert_eq!(p[4..8], 300u32.to_le_bytes());
    assert_eq!(p[28..32], 9u32.to_le_bytes());
    assert_eq!(&p[32..], b"SmolLM2");
}

#[test]
fn cancel_cancels_the_running_request_and_is_acknowledged() {
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&frame(1, kind::CANCEL, b""), &mut e);
    assert_eq!(
        (frames(&mut e), e.cancels),
        (vec![r_ack(1)], 0),
        "nothing runs"
    );
    c.on_bytes(&request(2, "hi"), &mut e);
    c.on_bytes(&frame(2, kind::CANCEL, b""), &mut e);
    assert_eq!((frames(&mut e), e.cancels), (vec![r_ack(2), r_ack(2)], 1));
    c.on_event(done(FinishReason::Cancelled, 1, 0), &mut e);
    assert_eq!(frames(&mut e), [end(2, 0, 3, 1, 0)]);
}

#[test]
fn a_partial_frame_is_given_up_after_the_gap_and_what_follows_its_start_is_read() {
    let (mut c, mut e) = (core(), env());
    let t0 = e.clock.unwrap();
    // A header whose length (60) was corrupted, then a whole PING: the PING is inside the
    // claimed payload, so only the gap can free it.
    let mut input = vec![START, 60, 0, 1, kind::REQUEST];
    input.extend(frame(2, kind::PING, b""));
    c.on_bytes(&input, &mut e);
    assert!(e.out.is_empty());
    let gap = FrameConfig::default().gap;
    assert_eq!(c.deadline(), Some(t0 + gap));
    e.clock = Some(t0 + gap);
    c.on_tick(&mut e);
    assert_eq!(frames(&mut e), [(2, kind::PONG, vec![])]);
    assert_eq!(c.rx_buffer().0, 0);
    assert_eq!(e.counts, [Count::BadInput]);
}

#[test]
fn a_reopened_port_forgets_the_half_frame() {
    let (mut c, mut e) = (core(), env());
    let f = frame(1, kind::PING, b"");
    c.on_bytes(&f[..4], &mut e);
    c.on_reopen(&mut e);
    c.on_bytes(&f, &mut e);
    assert_eq!(frames(&mut e), [(1, kind::PONG, vec![])]);
}

#[test]
fn a_megabyte_of_random_bytes_leaves_memory_flat_and_the_core_answering() {
    let (mut c, mut e) = (core(), env());
    let capacity = c.rx_buffer().1;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut fed = 0;
    while fed < 1 << 20 {
        let n = (xorshift(&mut s) % 300) as usize + 1;
        let chunk: Vec<u8> = (0..n).map(|_| xorshift(&mut s) as u8).collect();
        c.on_bytes(&chunk, &mut e);
        fed += n;
        let (held, cap) = c.rx_buffer();
        assert!(held <= cap && cap == capacity, "buffer {held}/{cap}");
    }
    assert!(e.submitted.is_empty(), "noise made a request");
    // Anything half-read is given up after the gap, then the port answers.
    e.clock = Some(e.clock.unwrap() + FrameConfig::default().gap);
    c.on_tick(&mut e);
    e.out.clear();
    c.on_bytes(&frame(1, kind::PING, b"alive"), &mut e);
    assert_eq!(frames(&mut e), [(1, kind::PONG, b"alive".to_vec())]);
    c.on_bytes(&request(2, "hi"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(2)]);
}

#[test]
fn a_payload_bound_outside_the_range_is_refused() {
    for bad in [0, MIN_PAYLOAD - 1, codec::MAX_PAYLOAD + 1] {
        let cfg = FrameConfig {
            max_payload: bad,
            ..FrameConfig::default()
        };
        assert_eq!(
            FrameCore::new(cfg).err(),
            Some(FrameError::PayloadBound { got: bad })
        );
    }
}

#[test]
fn the_worked_example_of_the_docs_is_what_the_core_reads_and_writes() {
    let hex = |s: &str| -> Vec<u8> {
        s.split(' ')
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect()
    };
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&hex("A5 05 00 01 01 00 10 00 48 69 BA 3A"), &mut e);
    assert_eq!(e.out, hex("A5 00 00 01 81 A9 E9"));
    assert_eq!(e.submitted[0].max_tokens, 16);
    e.out.clear();
    c.on_event(text("Hello"), &mut e);
    assert_eq!(e.out, hex("A5 07 00 01 83 00 00 48 65 6C 6C 6F E7 AD"));
    e.out.clear();
    c.on_event(text("!"), &mut e);
    c.on_event(done(FinishReason::Eog, 9, 2), &mut e);
    c.on_bytes(&hex("A5 02 00 01 02 00 00 4F D4"), &mut e);
    assert_eq!(e.out, hex("A5 03 00 01 83 01 00 21 3C D0"));
    e.out.clear();
    c.on_bytes(&hex("A5 02 00 01 02 01 00 4E 44"), &mut e);
    assert_eq!(
        e.out,
        hex("A5 0B 00 01 84 02 00 00 09 00 00 00 02 00 00 00 75 86")
    );
    e.out.clear();
    c.on_bytes(&hex("A5 02 00 01 02 02 00 4E B4"), &mut e);
    assert_eq!(c.deadline(), None);
    // The NAK of the docs: the same REQUEST with a damaged byte.
    c.on_bytes(&hex("A5 05 00 01 01 00 10 00 48 6A BA 3A"), &mut e);
    assert_eq!(e.out, hex("A5 01 00 01 82 01 D5 8E"));
}

#[test]
fn max_tokens_over_the_limit_is_refused_too_large_and_the_timeout_becomes_a_deadline() {
    let mut c = FrameCore::new(FrameConfig {
        max_payload: 64,
        max_tokens: 100,
        default_tokens: 32,
        timeout: Some(Duration::from_secs(5)),
        ..FrameConfig::default()
    })
    .unwrap();
    let mut e = env();
    c.on_bytes(&frame(1, kind::REQUEST, b"\x00\x65\x00hi"), &mut e);
    let f = frames(&mut e);
    let (index, code, message) = error_of(&f[0]);
    assert_eq!((index, code), (REFUSAL_INDEX, 2));
    assert!(message.contains("100"), "{message}");
    assert!(e.submitted.is_empty());
    c.on_bytes(&request(2, "hi"), &mut e);
    assert_eq!(e.submitted[0].max_tokens, 32);
    assert_eq!(
        e.submitted[0].deadline,
        Some(e.clock.unwrap() + Duration::from_secs(5))
    );
}
