//! Bytes coming in: any split, CRCs, resynchronisation, bounds, noise.

use super::*;
use crate::serial::core::Core;
use crate::serial::frame::codec::{self, START};
use crate::serial::frame::*;
use crate::serial::stats::Count;
use crate::service::FinishReason;

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
    c.on_open(&mut e);
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
        hex("A5 0C 00 01 84 02 00 00 09 00 00 00 02 00 00 00 00 05 D5")
    );
    e.out.clear();
    c.on_bytes(&hex("A5 02 00 01 02 02 00 4E B4"), &mut e);
    assert_eq!(c.deadline(), None);
    // The NAK of the docs: the same REQUEST with a damaged byte.
    c.on_bytes(&hex("A5 05 00 01 01 00 10 00 48 6A BA 3A"), &mut e);
    assert_eq!(e.out, hex("A5 01 00 01 82 01 D5 8E"));
}
