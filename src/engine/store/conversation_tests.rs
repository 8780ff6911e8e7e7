//! The conversation log over bytes: what is written reads back, a cut write loses only the
//! record being written, changed bytes stop the reading there, hostile lengths are refused.

use super::*;

fn turn(user: &str, answer: &str) -> Record {
    Record::Turn {
        user: user.into(),
        answer: answer.into(),
    }
}

/// A log of a system prompt and three turns, with each record's end offset.
fn three_turns() -> (Vec<u8>, Vec<usize>) {
    let mut log = header().to_vec();
    let mut ends = Vec::new();
    for r in [
        Record::Replace {
            system: Some("You are a maintenance assistant.".into()),
            messages: vec![],
            turns: 0,
        },
        turn("My name is Ana.", "Hello Ana."),
        turn("The press is number 7.", "Noted: press 7."),
        turn("What is my name?", "Your name is Ana — ü, 漢字 too."),
    ] {
        log.extend_from_slice(&encode(&r));
        ends.push(log.len());
    }
    (log, ends)
}

#[test]
fn a_log_reads_back_as_the_conversation_it_recorded() {
    let (log, _) = three_turns();
    let d = decode(&log).unwrap();
    assert_eq!((d.records, d.good_len, d.tail), (4, log.len(), Tail::Clean));
    let c = &d.conversation;
    assert_eq!(
        c.system.as_deref(),
        Some("You are a maintenance assistant.")
    );
    assert_eq!(c.turns, 3);
    let roles: Vec<_> = c.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant"].repeat(3));
    assert_eq!(c.messages[5].content, "Your name is Ana — ü, 漢字 too.");
}

#[test]
fn a_log_cut_at_every_byte_of_its_last_record_loses_that_turn_only() {
    let (log, ends) = three_turns();
    let before_last = ends[ends.len() - 2];
    let whole = decode(&log[..before_last]).unwrap();
    for cut in before_last..log.len() {
        let d = decode(&log[..cut]).unwrap();
        assert_eq!(d.conversation, whole.conversation, "cut at {cut}");
        assert_eq!(d.good_len, before_last, "cut at {cut}");
        let torn = cut - before_last;
        let want = if torn == 0 {
            Tail::Clean
        } else {
            Tail::Torn { bytes: torn }
        };
        assert_eq!(d.tail, want, "cut at {cut}");
    }
    // Cut back to its last whole record, the log goes on as if the torn one was never written.
    let torn = &log[..before_last + 3];
    let mut log2 = torn[..decode(torn).unwrap().good_len].to_vec();
    log2.extend_from_slice(&encode(&turn("Again?", "Yes.")));
    let d = decode(&log2).unwrap();
    assert_eq!((d.conversation.turns, d.tail), (3, Tail::Clean));
    assert_eq!(d.conversation.messages[5].content, "Yes.");
}

#[test]
fn a_changed_byte_stops_the_reading_at_its_record_and_says_corrupt() {
    let (log, ends) = three_turns();
    for at in ends[0]..ends[1] {
        let mut bad = log.clone();
        bad[at] ^= 0x20;
        let d = decode(&bad).unwrap();
        assert_eq!(d.conversation.turns, 0, "flip at {at}");
        assert_eq!(d.good_len, ends[0]);
        // Its header's length may now run past the end: then it reads as torn.
        assert_ne!(d.tail, Tail::Clean, "flip at {at}");
    }
    // A flip in the body of a whole record, with records after it: corrupt, not torn.
    let mut bad = log.clone();
    bad[ends[1] + RECORD_HEADER_LEN + 2] ^= 1;
    assert_eq!(
        decode(&bad).unwrap().tail,
        Tail::Corrupt {
            at: ends[1],
            bytes: log.len() - ends[1]
        }
    );
}

#[test]
fn hostile_lengths_and_counts_are_refused_without_allocating_them() {
    let mut log = header().to_vec();
    // A record that claims 4 GiB.
    log.extend_from_slice(&u32::MAX.to_le_bytes());
    log.extend_from_slice(&[0; 4]);
    assert!(matches!(
        decode(&log).unwrap().tail,
        Tail::Corrupt { at: 8, .. }
    ));
    // A replace that claims a billion messages, checksummed as if it were honest.
    let mut body = vec![KIND_REPLACE];
    body.extend_from_slice(&0u64.to_le_bytes());
    body.extend_from_slice(&NO_SYSTEM.to_le_bytes());
    body.extend_from_slice(&1_000_000_000u32.to_le_bytes());
    let mut log = header().to_vec();
    log.extend_from_slice(&(body.len() as u32).to_le_bytes());
    log.extend_from_slice(&crc32c(&body).to_le_bytes());
    log.extend_from_slice(&body);
    assert!(matches!(decode(&log).unwrap().tail, Tail::Corrupt { .. }));
    // A turn whose user length runs past its body; bytes that are not UTF-8; an unknown kind.
    for body in [
        vec![KIND_TURN, 9, 0, 0, 0, b'a'],
        vec![KIND_TURN, 1, 0, 0, 0, 0xff],
        vec![9],
        vec![],
    ] {
        let mut log = header().to_vec();
        log.extend_from_slice(&(body.len() as u32).to_le_bytes());
        log.extend_from_slice(&crc32c(&body).to_le_bytes());
        log.extend_from_slice(&body);
        assert!(
            matches!(decode(&log).unwrap().tail, Tail::Corrupt { .. }),
            "{body:?}"
        );
    }
    assert!(decode(b"EDGL").is_err());
    assert!(decode(b"EDGEKV\0\0 a KV snapshot").is_err());
}

#[test]
fn a_replace_and_a_drop_reshape_the_conversation_and_keep_the_turn_count() {
    let (mut log, _) = three_turns();
    log.extend_from_slice(&encode(&Record::Drop(2)));
    let d = decode(&log).unwrap();
    assert_eq!(d.conversation.messages.len(), 4);
    assert_eq!(d.conversation.messages[0].content, "The press is number 7.");
    assert_eq!(d.conversation.turns, 3);
    let messages = vec![
        ChatMessage::new("user", "Start over."),
        ChatMessage::new("tool", ""),
    ];
    log.extend_from_slice(&encode(&Record::Replace {
        system: None,
        messages,
        turns: 3,
    }));
    log.extend_from_slice(&encode(&Record::Drop(99)));
    log.extend_from_slice(&encode(&turn("Next.", "Turn 4.")));
    let c = decode(&log).unwrap().conversation;
    assert_eq!((c.system, c.messages.len(), c.turns), (None, 2, 4));
}
