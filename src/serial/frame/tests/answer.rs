//! Requests and their answers: acknowledgements, the cache, retransmission, refusals.

use super::*;
use crate::serial::core::Core;
use crate::serial::frame::*;
use crate::serial::stats::Count;
use crate::service::{ErrorCode, Event, FinishReason, Format, Prompt, ServiceError};
use std::time::Duration;

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
fn malformed_requests_are_refused_with_bad_request_and_never_submitted() {
    let cases: [(&[u8], &str); 3] = [
        (b"\x00\x00", "shorter"),
        (b"\x80\x00\x00hi", "flags"),
        (b"\x00\x00\x00\xff\xfeok", "UTF-8"),
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
fn an_empty_or_blank_prompt_is_the_services_refusal_sent_at_once() {
    for payload in [
        &b"\x00\x00\x00"[..],
        b"\x00\x00\x00  \r\n",
        b"\x01\x00\x00\t",
    ] {
        let (mut c, mut e) = (core(), env());
        c.on_bytes(&frame(1, kind::REQUEST, payload), &mut e);
        let f = frames(&mut e);
        let (index, code, message) = error_of(&f[0]);
        assert_eq!((f.len(), index, code), (1, REFUSAL_INDEX, 1), "{payload:?}");
        assert!(message.contains("empty or only whitespace"), "{message:?}");
        assert!(e.submitted.is_empty());
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

#[test]
fn a_repeat_of_an_older_request_while_another_runs_is_refused_busy() {
    let (mut c, mut e) = (core(), env());
    answered(&mut c, &mut e, 1, "first");
    c.on_bytes(&request(2, "second"), &mut e);
    c.on_event(text("Sec"), &mut e);
    frames(&mut e);
    c.on_bytes(&request(1, "first"), &mut e);
    let f = frames(&mut e);
    assert_eq!(
        error_of(&f[0]).1,
        super::super::core::code_byte(ErrorCode::Busy)
    );
    // The running answer's frame is still the one waiting for its ACK.
    c.on_bytes(&ack(2, 0), &mut e);
    c.on_event(text("ond"), &mut e);
    assert_eq!(frames(&mut e), [data(2, 1, "ond")]);
}

#[test]
fn the_session_flag_names_a_session_and_reset_and_history_act_on_it() {
    let (mut c, mut e) = (core(), env());
    let with_session = |seq: u8, flags: u8, name: &[u8], text: &[u8]| {
        let mut p = vec![flags | FLAG_SESSION, 0, 0, name.len() as u8];
        p.extend_from_slice(name);
        p.extend_from_slice(text);
        frame(seq, kind::REQUEST, &p)
    };
    c.on_bytes(&with_session(1, 0, b"line-3", b"Why is it hot?"), &mut e);
    assert_eq!(frames(&mut e), [r_ack(1)]);
    let r = &e.submitted[0];
    assert_eq!(r.session.as_ref().unwrap().as_str(), "line-3");
    assert!(matches!(&r.prompt, Prompt::Chat(m) if m[0].content == "Why is it hot?"));
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::Internal, "x")),
        &mut e,
    );
    frames(&mut e);
    c.on_bytes(&frame(2, kind::ACK, &0u16.to_le_bytes()), &mut e);

    c.on_bytes(&with_session(3, FLAG_HISTORY, b"line-3", b""), &mut e);
    assert_eq!(frames(&mut e), [r_ack(3)]);
    assert!(matches!(e.submitted[1].prompt, Prompt::History));
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::Internal, "x")),
        &mut e,
    );
    frames(&mut e);
    c.on_bytes(&frame(3, kind::ACK, &0u16.to_le_bytes()), &mut e);

    c.on_bytes(&with_session(4, FLAG_RESET, b"line-3", b""), &mut e);
    assert_eq!(frames(&mut e), [r_ack(4)]);
    assert!(matches!(e.submitted[2].prompt, Prompt::Forget));
    assert_eq!(e.submitted[2].session.as_ref().unwrap().as_str(), "line-3");
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::Internal, "x")),
        &mut e,
    );
    frames(&mut e);
    c.on_bytes(&frame(4, kind::ACK, &0u16.to_le_bytes()), &mut e);

    // Malformed: a name past the payload, a bad name, reset with a prompt, reset and history,
    // reset without a session: refused at once, nothing submitted.
    let bad = [
        frame(5, kind::REQUEST, &[FLAG_SESSION, 0, 0, 9, b'a']),
        with_session(6, 0, b"../x", b"hi"),
        with_session(7, FLAG_RESET, b"line-3", b"hi"),
        with_session(8, FLAG_RESET | FLAG_HISTORY, b"line-3", b""),
        frame(9, kind::REQUEST, &[FLAG_RESET, 0, 0]),
    ];
    for f in bad {
        c.on_bytes(&f, &mut e);
        let got = frames(&mut e);
        assert_eq!(error_of(&got[0]).1, 1, "bad_request: {got:?}");
    }
    assert_eq!(e.submitted.len(), 3);
    // Each told to the audit trail; the bad name as sent.
    assert_eq!(e.refusals.len(), 5);
    assert_eq!(e.refusals[1].session.as_deref(), Some("../x"));
    assert_eq!(
        e.refusals[0].session, None,
        "a name past the payload was never read"
    );
}

/// A core whose frames hold a 64-byte name and a session name besides.
fn wide_core() -> FrameCore {
    FrameCore::new(FrameConfig {
        max_payload: 256,
        ..FrameConfig::default()
    })
    .unwrap()
}

/// A REQUEST payload: `flags`, max_tokens 0, the session and format names when given, `text`.
fn with_names(flags: u8, session: Option<&[u8]>, format: Option<&[u8]>, text: &str) -> Vec<u8> {
    let mut p = vec![flags, 0, 0];
    for name in [session, format].into_iter().flatten() {
        p.push(name.len() as u8);
        p.extend_from_slice(name);
    }
    p.extend_from_slice(text.as_bytes());
    p
}

#[test]
fn the_format_flag_names_a_configured_format_after_the_header_or_the_session() {
    let (mut c, mut e) = (wide_core(), env());
    let p = with_names(FLAG_FORMAT, None, Some(b"severity"), "Bearing at 95 C?");
    c.on_bytes(&frame(1, kind::REQUEST, &p), &mut e);
    assert_eq!(frames(&mut e), [r_ack(1)]);
    let r = &e.submitted[0];
    assert_eq!(r.format, Some(Format::Named("severity".into())));
    assert!(matches!(&r.prompt, Prompt::Chat(m) if m[0].content == "Bearing at 95 C?"));
    assert_eq!(r.session, None);
    c.on_event(done(FinishReason::Eog, 1, 1), &mut e);
    c.on_bytes(&ack(1, 0), &mut e);

    let name = [b'a'; 64];
    let p = with_names(
        FLAG_FORMAT | FLAG_SESSION | FLAG_RAW,
        Some(b"line-3"),
        Some(&name),
        "{",
    );
    c.on_bytes(&frame(2, kind::REQUEST, &p), &mut e);
    assert_eq!(frames(&mut e), [end(1, 0, 0, 1, 1), r_ack(2)]);
    let r = &e.submitted[1];
    assert_eq!(r.session.as_ref().unwrap().as_str(), "line-3");
    assert_eq!(r.format, Some(Format::Named("a".repeat(64))));
    assert!(matches!(&r.prompt, Prompt::Text { text, .. } if text == "{"));

    // Without the flag, no format: the bytes are the prompt.
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&request(3, "\x08severity"), &mut e);
    assert_eq!(e.submitted[0].format, None);
}

#[test]
fn end_says_whether_the_answer_has_the_formats_shape_in_its_last_byte() {
    for (valid, finish, byte) in [
        (true, FinishReason::Eog, 1),
        (false, FinishReason::Length, 2),
    ] {
        let (mut c, mut e) = (core(), env());
        let p = with_names(FLAG_FORMAT, None, Some(b"alarm"), "Classify");
        c.on_bytes(&frame(1, kind::REQUEST, &p), &mut e);
        c.on_event(text("{\"a\""), &mut e);
        c.on_bytes(&ack(1, 0), &mut e);
        c.on_event(done_valid(finish, valid), &mut e);
        let f = frames(&mut e);
        let mut want = end(1, 1, super::core::finish_byte(finish), 5, 3);
        *want.2.last_mut().unwrap() = byte;
        assert_eq!(f.last(), Some(&want), "valid {valid}");
        // The fields before it are where they always were: 2 + 1 + 4 + 4, then validity.
        assert_eq!(want.2.len(), 12);
        // A repeat is answered from the cache with the same validity.
        c.on_bytes(&ack(1, 1), &mut e);
        c.on_bytes(&frame(1, kind::REQUEST, &p), &mut e);
        c.on_bytes(&ack(1, 0), &mut e);
        assert_eq!(frames(&mut e).last(), Some(&want));
        assert_eq!(e.submitted.len(), 1);
    }
}

#[test]
fn a_malformed_format_field_is_refused_bad_request_and_never_submitted() {
    let long = [b'a'; 65];
    let cases: [(Vec<u8>, &str); 9] = [
        (vec![FLAG_FORMAT, 0, 0], "missing"),
        (vec![FLAG_FORMAT, 0, 0, 9, b'a', b'b'], "past the payload"),
        (with_names(FLAG_FORMAT, None, Some(b""), "hi"), "1 to 64"),
        (with_names(FLAG_FORMAT, None, Some(&long), "hi"), "1 to 64"),
        (
            with_names(FLAG_FORMAT, None, Some(b"al arm"), "hi"),
            "1 to 64",
        ),
        (
            with_names(FLAG_FORMAT, None, Some(b"a.json"), "hi"),
            "1 to 64",
        ),
        (
            with_names(FLAG_FORMAT, None, Some(b"\xff\xfe"), "hi"),
            "1 to 64",
        ),
        (
            with_names(
                FLAG_FORMAT | FLAG_SESSION | FLAG_RESET,
                Some(b"s"),
                Some(b"x"),
                "",
            ),
            "no format",
        ),
        (
            with_names(
                FLAG_FORMAT | FLAG_SESSION | FLAG_HISTORY,
                Some(b"s"),
                Some(b"x"),
                "",
            ),
            "no format",
        ),
    ];
    for (payload, why) in cases {
        let (mut c, mut e) = (wide_core(), env());
        c.on_bytes(&frame(1, kind::REQUEST, &payload), &mut e);
        let f = frames(&mut e);
        let (index, code, message) = error_of(&f[0]);
        assert_eq!((f.len(), index, code), (1, REFUSAL_INDEX, 1), "{payload:?}");
        assert!(message.contains(why), "{message:?} should say {why}");
        assert!(e.submitted.is_empty());
        assert_eq!(e.counts, [Count::BadInput]);
    }
    // The flag after it is still unknown.
    let (mut c, mut e) = (core(), env());
    c.on_bytes(&frame(1, kind::REQUEST, &[0x20, 0, 0, b'h']), &mut e);
    assert!(error_of(&frames(&mut e)[0]).2.contains("flags"));
}
