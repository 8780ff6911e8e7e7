use super::*;
use crate::engine::constraint::Shape;
use crate::service::{Chunk, Done, FinishReason, Timings, Usage};
use serde_json::json;

fn cfg() -> MailboxConfig {
    MailboxConfig {
        max_prompt_bytes: 1000,
        max_tokens: 64,
        max_answer_bytes: 600,
        id_prefix: "modbus-t".into(),
        vendor: "edgellm".into(),
        product: "tiny".into(),
        version: "0.1.0".into(),
        formats: formats(),
    }
}

/// `FORMAT` 1: a schema with an enum, a boolean, a string and a float; 2: a choice.
fn formats() -> Arc<[Typed]> {
    let alarm = Shape::JsonSchema(json!({"type": "object", "properties": {
        "severity": {"enum": ["low", "medium", "high"]},
        "stop_line": {"type": "boolean"},
        "reason": {"type": "string"},
        "temperature_c": {"type": "number"}}}));
    let choice = Shape::Choice(vec!["pump".into(), "valve".into(), "motor".into()]);
    Arc::from([
        Typed::of("alarm", &alarm).unwrap(),
        Typed::of("part", &choice).unwrap(),
    ])
}

fn mailbox() -> Mailbox {
    Mailbox::new(cfg())
}

/// Writes `prompt` and its length, then `seq`: the request it submits.
fn ask(m: &mut Mailbox, prompt: &str, seq: u16) -> Request {
    let regs = text_to_registers(prompt);
    for (i, c) in regs.chunks(MAX_WRITE).enumerate() {
        m.write(PROMPT + (i * MAX_WRITE) as u16, c).unwrap();
    }
    m.write(PROMPT_LEN, &[prompt.len() as u16]).unwrap();
    match m.write(REQUEST_SEQ, &[seq]).unwrap() {
        Written::Submit(r) => *r,
        other => panic!("expected a submission, got {other:?}"),
    }
}

fn done(id: &str, text: &str, why: FinishReason, tokens: usize) -> Event {
    Event::Done(Box::new(Done {
        id: id.into(),
        text: text.into(),
        finish_reason: why,
        usage: Usage {
            prompt_tokens: 3,
            completion_tokens: tokens,
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

/// A finished answer under a format: `valid`, and for a JSON one its parse.
fn done_valid(id: &str, text: &str, why: FinishReason, valid: bool) -> Event {
    let Event::Done(mut d) = done(id, text, why, 4) else {
        unreachable!()
    };
    d.valid = Some(valid);
    d.json = serde_json::from_str(text).ok().filter(|_| valid);
    Event::Done(d)
}

fn text(s: &str) -> Event {
    Event::Text(Chunk::try_from(s).unwrap())
}

fn answer(m: &Mailbox) -> String {
    let len = m.read(ANSWER_LEN, 2).unwrap();
    let len = ((len[0] as usize) << 16) | len[1] as usize;
    let mut m2 = Vec::new();
    let pages = m.read(PAGE_COUNT, 1).unwrap()[0];
    // Pages are read through FC23 on a clone of the state: select and read in one go.
    let mut probe = m.clone();
    for p in 0..pages {
        let (_, regs) = probe
            .read_write(ANSWER_PAGE, PAGE_REGS, PAGE_SELECT, &[p])
            .unwrap();
        m2.extend(registers_to_bytes(&regs));
    }
    m2.truncate(len);
    String::from_utf8(m2).unwrap()
}

#[test]
fn a_fresh_mailbox_is_idle_and_describes_itself() {
    let m = mailbox();
    let r = m.read(0, 16).unwrap();
    assert_eq!(r[STATUS as usize], Status::Idle as u16);
    assert_eq!(r[MAP_VERSION as usize], VERSION);
    assert_eq!(r[PROMPT_CAPACITY as usize], 1000);
    assert_eq!(r[MAX_TOKENS_LIMIT as usize], 64);
    assert_eq!(m.read(SEED, 2).unwrap(), vec![0, 0x5eed]);
}

#[test]
fn prompt_written_in_pieces_and_a_new_sequence_submit_one_request() {
    let mut m = mailbox();
    let prompt = "The boiling point of water is ".repeat(9); // 270 bytes: three writes
    let req = ask(&mut m, &prompt, 7);
    match &req.prompt {
        Prompt::Text { text, special } => {
            assert_eq!(text, &prompt);
            assert!(!special);
        }
        p => panic!("expected raw text, got {p:?}"),
    }
    assert_eq!(req.id, "modbus-t-1");
    assert_eq!(req.max_tokens, 64, "MAX_TOKENS 0 means the limit");
    assert_eq!(req.sampling.temperature, 0.0);
    assert_eq!(req.sampling.seed, 0x5eed);
    assert!(req.session.is_none());
    assert_eq!(
        m.read(STATUS, 3).unwrap(),
        vec![Status::Queued as u16, 0, 7]
    );
}

#[test]
fn parameters_registers_shape_the_request() {
    let mut m = mailbox();
    m.write(MAX_TOKENS, &[12, 80, 0x0001, 0x0002, 42, 1])
        .unwrap();
    let req = ask(&mut m, "hi", 1);
    assert_eq!(req.max_tokens, 12);
    assert!((req.sampling.temperature - 0.8).abs() < 1e-6);
    assert_eq!(req.sampling.seed, 0x0001_0002);
    assert_eq!(req.session.as_ref().unwrap().as_str(), "modbus-42");
    assert!(matches!(&req.prompt, Prompt::Chat(msgs) if msgs[0].content == "hi"));
}

#[test]
fn modes_2_and_3_reset_the_session_and_read_its_conversation() {
    let mut m = mailbox();
    m.write(SESSION, &[7, 2]).unwrap();
    let req = ask(&mut m, "", 1);
    assert!(matches!(req.prompt, Prompt::Forget), "{req:?}");
    assert_eq!(req.session.as_ref().unwrap().as_str(), "modbus-7");
    m.on_event(&req.id, done(&req.id, "", FinishReason::Eog, 0));
    m.write(MODE, &[3]).unwrap();
    let req = ask(&mut m, "", 2);
    assert!(matches!(req.prompt, Prompt::History), "{req:?}");
}

#[test]
fn a_zero_length_means_up_to_the_first_nul() {
    let mut m = mailbox();
    m.write(PROMPT, &text_to_registers("abc\0\0zz")).unwrap();
    let req = match m.write(REQUEST_SEQ, &[1]).unwrap() {
        Written::Submit(r) => r,
        w => panic!("{w:?}"),
    };
    assert!(matches!(&req.prompt, Prompt::Text { text, .. } if text == "abc"));
}

#[test]
fn the_sequence_register_written_last_in_one_write_submits_after_the_rest_is_kept() {
    let mut m = mailbox();
    m.write(PROMPT, &text_to_registers("hello")).unwrap();
    // FC16 at 16: seq first in address order, but the request sees the length written with it.
    let w = m.write(REQUEST_SEQ, &[3, 5, 9]).unwrap();
    let Written::Submit(req) = w else {
        panic!("{w:?}")
    };
    assert!(matches!(&req.prompt, Prompt::Text { text, .. } if text == "hello"));
    assert_eq!(req.max_tokens, 9);
}

#[test]
fn the_same_sequence_written_again_is_a_duplicate_and_submits_nothing() {
    let mut m = mailbox();
    let req = ask(&mut m, "hi", 5);
    assert!(matches!(m.write(REQUEST_SEQ, &[5]), Ok(Written::Duplicate)));
    m.on_event(&req.id, done(&req.id, "x", FinishReason::Eog, 1));
    assert!(matches!(m.write(REQUEST_SEQ, &[5]), Ok(Written::Duplicate)));
    assert!(matches!(m.write(REQUEST_SEQ, &[6]), Ok(Written::Submit(_))));
}

#[test]
fn a_new_sequence_while_a_request_runs_is_busy_and_changes_nothing() {
    let mut m = mailbox();
    let req = ask(&mut m, "hi", 1);
    assert_eq!(
        m.write(REQUEST_SEQ, &[2, 0, 3]).unwrap_err(),
        Exception::ServerDeviceBusy
    );
    assert_eq!(m.read(REQUEST_SEQ, 3).unwrap(), vec![1, 2, 0]);
    assert_eq!(m.current(), Some(req.id.as_str()));
}

#[test]
fn status_follows_the_request_from_queued_to_running_to_done() {
    let mut m = mailbox();
    let req = ask(&mut m, "hi", 9);
    m.started(&req.id);
    assert_eq!(m.read(STATUS, 1).unwrap()[0], Status::Running as u16);
    assert!(m.on_event(&req.id, text("Hel")));
    assert!(m.on_event(&req.id, text("lo")));
    assert_eq!(answer(&m), "Hello");
    assert!(m.on_event(&req.id, done(&req.id, "Hello", FinishReason::Length, 2)));
    let r = m.read(0, 10).unwrap();
    assert_eq!(r[STATUS as usize], Status::Done as u16);
    assert_eq!(r[RESPONSE_SEQ as usize], 9);
    assert_eq!(r[FINISH_REASON as usize], 2);
    assert_eq!(r[TOKENS as usize], 2);
    assert_eq!(&r[4..6], &[0, 5]);
    assert_eq!(m.current(), None);
}

#[test]
fn a_service_error_shows_as_status_error_with_its_code() {
    let mut m = mailbox();
    let req = ask(&mut m, "hi", 1);
    m.on_event(
        &req.id,
        Event::Error(ServiceError::new(ErrorCode::ContextFull, "full")),
    );
    assert_eq!(m.read(STATUS, 2).unwrap(), vec![Status::Error as u16, 3]);
    assert!(matches!(m.write(REQUEST_SEQ, &[2]), Ok(Written::Submit(_))));
}

#[test]
fn a_full_queue_is_a_busy_exception_and_the_same_sequence_may_retry() {
    let mut m = mailbox();
    ask(&mut m, "hi", 4);
    let e = ServiceError::new(ErrorCode::Busy, "queue full");
    assert_eq!(m.refused(&e), Some(Exception::ServerDeviceBusy));
    assert_eq!(m.read(STATUS, 2).unwrap(), vec![Status::Error as u16, 4]);
    assert!(matches!(m.write(REQUEST_SEQ, &[4]), Ok(Written::Submit(_))));
    let e = ServiceError::new(ErrorCode::BadRequest, "no sessions");
    assert_eq!(m.refused(&e), None);
    assert_eq!(m.read(STATUS, 2).unwrap(), vec![Status::Error as u16, 1]);
}

#[test]
fn events_of_an_old_request_are_refused_and_do_not_touch_the_answer() {
    let mut m = mailbox();
    let old = ask(&mut m, "hi", 1);
    m.on_event(&old.id, done(&old.id, "first", FinishReason::Eog, 1));
    let new = ask(&mut m, "hi", 2);
    assert!(!m.on_event(&old.id, text("stale")));
    assert_eq!(answer(&m), "");
    assert_ne!(old.id, new.id);
}

#[test]
fn a_new_request_clears_the_old_answer_and_its_page() {
    let mut m = mailbox();
    let r = ask(&mut m, "hi", 1);
    m.on_event(&r.id, done(&r.id, &"a".repeat(300), FinishReason::Eog, 1));
    m.write(PAGE_SELECT, &[1]).unwrap();
    ask(&mut m, "hi", 2);
    assert_eq!(m.read(ANSWER_LEN, 4).unwrap(), vec![0, 0, 0, 0]);
}

#[test]
fn pages_hold_250_bytes_each_nul_padded_and_page_select_past_the_answer_is_refused() {
    let mut m = mailbox();
    let r = ask(&mut m, "hi", 1);
    let long: String = (0..520).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    m.on_event(&r.id, done(&r.id, &long, FinishReason::Eog, 100));
    assert_eq!(m.read(PAGE_COUNT, 1).unwrap(), vec![3]);
    m.write(PAGE_SELECT, &[2]).unwrap();
    assert_eq!(m.read(PAGE_SHOWN, 1).unwrap(), vec![2]);
    let last = registers_to_bytes(&m.read(ANSWER_PAGE, PAGE_REGS).unwrap());
    assert_eq!(&last[..20], &long.as_bytes()[500..]);
    assert!(last[20..].iter().all(|&b| b == 0));
    assert_eq!(
        m.write(PAGE_SELECT, &[3]).unwrap_err(),
        Exception::IllegalDataValue
    );
    assert_eq!(answer(&m), long);
}

#[test]
fn fc23_selects_the_page_and_reads_it_in_one_transaction() {
    let mut m = mailbox();
    let r = ask(&mut m, "hi", 1);
    let long = format!("{}{}", "x".repeat(250), "yz");
    m.on_event(&r.id, done(&r.id, &long, FinishReason::Eog, 1));
    let (w, regs) = m.read_write(ANSWER_PAGE, 1, PAGE_SELECT, &[1]).unwrap();
    assert!(matches!(w, Written::Stored));
    assert_eq!(regs, vec![u16::from_be_bytes(*b"yz")]);
}

#[test]
fn an_answer_over_its_bound_is_cut_on_a_character_and_ends_as_length() {
    let mut m = mailbox();
    let r = ask(&mut m, "hi", 1);
    let mut more = true;
    for _ in 0..400 {
        more = m.on_event(&r.id, text("é"));
        if !more {
            break;
        }
    }
    assert!(!more, "the worker is told to stop");
    let a = answer(&m);
    assert_eq!(a.len(), 600);
    assert!(a.chars().all(|c| c == 'é'));
    assert_eq!(m.read(STATUS, 1).unwrap()[0], Status::Done as u16);
    assert_eq!(m.read(FINISH_REASON, 1).unwrap()[0], 2);
}

#[test]
fn the_heartbeat_counts_seconds_and_wraps() {
    let mut m = mailbox();
    m.advance(1);
    m.advance(1);
    assert_eq!(m.read(HEARTBEAT, 1).unwrap(), vec![2]);
    m.heartbeat = u16::MAX;
    m.advance(1);
    assert_eq!(m.read(HEARTBEAT, 1).unwrap(), vec![0]);
    m.advance(65_536 + 3);
    assert_eq!(m.read(HEARTBEAT, 1).unwrap(), vec![3]);
}

#[test]
fn cancel_is_reported_and_reads_zero() {
    let mut m = mailbox();
    ask(&mut m, "hi", 1);
    assert!(matches!(m.write(CANCEL, &[1]), Ok(Written::Cancel)));
    assert!(matches!(m.write(CANCEL, &[0]), Ok(Written::Stored)));
    assert_eq!(m.read(CANCEL, 1).unwrap(), vec![0]);
}

#[test]
fn unmapped_and_read_only_addresses_are_illegal_data_addresses() {
    let mut m = mailbox();
    let a = Exception::IllegalDataAddress;
    assert_eq!(m.read(150, 10).unwrap_err(), a, "past the answer window");
    assert_eq!(
        m.read(158, 1).unwrap_err(),
        a,
        "the gap before the typed block"
    );
    // 29–31, between the control block and the answer window, are unmapped too, and a read
    // may not span two blocks.
    for (addr, n) in [
        (29, 1),
        (31, 1),
        (29, 3),
        (28, 2),
        (30, 3),
        (0, 32),
        (0, 125),
        (155, 6),
        (250, 7),
    ] {
        assert_eq!(m.read(addr, n).unwrap_err(), a, "{n} from {addr}");
        assert_eq!(
            m.read_write(addr, n, PAGE_SELECT, &[0]).unwrap_err(),
            a,
            "FC23: {n} from {addr}"
        );
    }
    assert_eq!(m.read(0, 29).unwrap().len(), 29, "up to CHOICE");
    assert_eq!(m.read(ANSWER_PAGE, 125).unwrap().len(), 125);
    assert_eq!(m.read(TYPED, 96).unwrap(), vec![0; 96]);
    assert_eq!(m.read(PROMPT + 500, 1).unwrap_err(), a, "past the prompt");
    assert_eq!(m.read(PROMPT + 499, 1).unwrap(), vec![0]);
    assert_eq!(m.read(65535, 1).unwrap_err(), a);
    assert_eq!(m.write(STATUS, &[1]).unwrap_err(), a, "read-only");
    assert_eq!(m.write(15, &[0, 1]).unwrap_err(), a, "straddles read-only");
    assert_eq!(
        m.write(FORMAT, &[0, 0]).unwrap_err(),
        a,
        "past the control block"
    );
    assert_eq!(m.write(VALID, &[1]).unwrap_err(), a, "read-only");
    assert_eq!(m.write(ANSWER_PAGE, &[1]).unwrap_err(), a);
    assert_eq!(m.write(TYPED, &[1]).unwrap_err(), a);
    assert_eq!(m.write(PROMPT + 499, &[1, 2]).unwrap_err(), a);
    assert_eq!(
        m.read(REQUEST_SEQ, 1).unwrap(),
        vec![0],
        "nothing was written"
    );
}

#[test]
fn quantities_and_values_out_of_range_are_illegal_data_values() {
    let mut m = mailbox();
    let v = Exception::IllegalDataValue;
    assert_eq!(m.read(0, 0).unwrap_err(), v);
    assert_eq!(m.read(PROMPT, 126).unwrap_err(), v);
    assert_eq!(m.write(PROMPT, &[0; 124]).unwrap_err(), v);
    assert!(m.write(PROMPT, &[0; 123]).is_ok());
    assert_eq!(m.write(PROMPT, &[]).unwrap_err(), v);
    assert_eq!(m.read_write(0, 1, PROMPT, &[0; 122]).unwrap_err(), v);
    assert_eq!(m.write(PROMPT_LEN, &[1001]).unwrap_err(), v);
    assert_eq!(m.write(MAX_TOKENS, &[65]).unwrap_err(), v);
    assert_eq!(m.write(TEMPERATURE, &[201]).unwrap_err(), v);
    assert_eq!(m.write(SESSION, &[10000]).unwrap_err(), v);
    assert_eq!(m.write(MODE, &[4]).unwrap_err(), v);
    assert_eq!(m.write(FORMAT, &[3]).unwrap_err(), v, "two formats");
    assert_eq!(m.write(PAGE_SELECT, &[1]).unwrap_err(), v);
    // One bad value refuses the whole write.
    assert_eq!(m.write(PROMPT_LEN, &[4, 65]).unwrap_err(), v);
    assert_eq!(m.read(PROMPT_LEN, 1).unwrap(), vec![0]);
}

#[test]
fn an_invalid_utf8_prompt_is_refused_and_changes_nothing() {
    let mut m = mailbox();
    let v = Exception::IllegalDataValue;
    m.write(PROMPT, &[0xC328]).unwrap(); // 0xC3 then '(' : not UTF-8
    m.write(PROMPT_LEN, &[2]).unwrap();
    assert_eq!(m.write(REQUEST_SEQ, &[1]).unwrap_err(), v);
    assert_eq!(m.read(STATUS, 3).unwrap(), vec![0, 0, 0]);
    assert_eq!(m.read(REQUEST_SEQ, 1).unwrap(), vec![0]);
}

/// An empty prompt is the service's to refuse, as for every front end: the write is taken and
/// the request ends in status 4 with `bad_request`.
#[test]
fn an_empty_prompt_goes_to_the_service_which_refuses_it() {
    let mut m = mailbox();
    let req = match m.write(REQUEST_SEQ, &[1]).unwrap() {
        Written::Submit(r) => *r,
        other => panic!("expected a submission, got {other:?}"),
    };
    let e = crate::service::check(&req).unwrap_err();
    assert_eq!(m.refused(&e), None, "the write is acknowledged");
    assert_eq!(m.read(STATUS, 3).unwrap(), vec![Status::Error as u16, 1, 1]);
}

#[test]
fn a_refused_fc23_read_writes_nothing() {
    let mut m = mailbox();
    let r = ask(&mut m, "hi", 1);
    m.on_event(&r.id, done(&r.id, &"a".repeat(300), FinishReason::Eog, 1));
    assert_eq!(
        m.read_write(158, 1, PAGE_SELECT, &[1]).unwrap_err(),
        Exception::IllegalDataAddress
    );
    assert_eq!(m.read(PAGE_SELECT, 1).unwrap(), vec![0]);
}

#[test]
fn device_identification_names_vendor_model_and_version() {
    let m = mailbox();
    let all = m.device_id(1, 0).unwrap();
    assert_eq!(
        all,
        vec![
            (0, "edgellm".to_string()),
            (1, "tiny".to_string()),
            (2, "0.1.0".to_string())
        ]
    );
    assert_eq!(m.device_id(4, 1).unwrap(), vec![(1, "tiny".to_string())]);
    assert_eq!(
        m.device_id(2, 9).unwrap().len(),
        3,
        "unknown start restarts at 0"
    );
    assert_eq!(
        m.device_id(4, 9).unwrap_err(),
        Exception::IllegalDataAddress
    );
}

#[test]
fn text_and_registers_round_trip_high_byte_first() {
    assert_eq!(text_to_registers("AB C"), vec![0x4142, 0x2043]);
    assert_eq!(text_to_registers("xyz"), vec![0x7879, 0x7a00]);
    assert_eq!(registers_to_bytes(&[0x4142]), b"AB");
}

#[test]
fn a_choice_answer_is_its_index_and_a_schema_answer_fills_the_typed_block() {
    let mut m = mailbox();
    assert_eq!(m.read(VALID, 2).unwrap(), vec![0, 0xFFFF], "nothing asked");

    // A choice: the request names the format; CHOICE is the option's index once done.
    m.write(FORMAT, &[2]).unwrap();
    let req = ask(&mut m, "Which part failed?", 1);
    assert!(
        matches!(&req.format, Some(Format::Named(n)) if n == "part"),
        "{req:?}"
    );
    m.on_event(&req.id, text("valve"));
    assert_eq!(m.read(VALID, 2).unwrap(), vec![0, 0xFFFF], "not done yet");
    m.on_event(
        &req.id,
        done_valid(&req.id, "valve", FinishReason::Eog, true),
    );
    assert_eq!(m.read(STATUS, 1).unwrap(), vec![Status::Done as u16]);
    assert_eq!(m.read(VALID, 2).unwrap(), vec![1, 1]);
    assert_eq!(
        m.read(TYPED, 4).unwrap(),
        vec![0; 4],
        "a choice has no typed block"
    );
    assert_eq!(answer(&m), "valve");

    // A schema: each typed property at its place; the string only in the text.
    m.write(FORMAT, &[1]).unwrap();
    let req = ask(&mut m, "Classify: bearing overheating", 2);
    assert!(matches!(&req.format, Some(Format::Named(n)) if n == "alarm"));
    // The answer reported is the request's, whatever FORMAT says meanwhile.
    m.write(FORMAT, &[0]).unwrap();
    let json =
        r#"{"severity": "high", "stop_line": true, "reason": "bearing", "temperature_c": 81.5}"#;
    m.on_event(&req.id, done_valid(&req.id, json, FinishReason::Eog, true));
    let t = 81.5f32.to_bits();
    assert_eq!(m.read(VALID, 2).unwrap(), vec![1, 0xFFFF]);
    assert_eq!(
        m.read(TYPED, 5).unwrap(),
        vec![2, 1, (t >> 16) as u16, t as u16, 0]
    );
    assert_eq!(answer(&m), json);

    // Cut short: not valid, every typed register "no value", no index.
    m.write(FORMAT, &[1]).unwrap();
    let req = ask(&mut m, "Classify again", 3);
    assert_eq!(
        m.read(TYPED, 4).unwrap(),
        vec![0xFFFF, 0xFFFF, 0x7FC0, 0],
        "cleared"
    );
    m.on_event(
        &req.id,
        done_valid(&req.id, r#"{"severity": "hi"#, FinishReason::Length, false),
    );
    assert_eq!(m.read(VALID, 2).unwrap(), vec![2, 0xFFFF]);
    assert_eq!(m.read(FINISH_REASON, 1).unwrap(), vec![2]);
    assert_eq!(m.read(TYPED, 4).unwrap(), vec![0xFFFF, 0xFFFF, 0x7FC0, 0]);
    m.write(FORMAT, &[2]).unwrap();
    let req = ask(&mut m, "Which part?", 4);
    m.on_event(
        &req.id,
        done_valid(&req.id, "mot", FinishReason::Length, false),
    );
    assert_eq!(m.read(VALID, 2).unwrap(), vec![2, 0xFFFF]);

    // Without a format: no format on the request, VALID 0.
    m.write(FORMAT, &[0]).unwrap();
    let req = ask(&mut m, "Free text", 5);
    assert!(req.format.is_none());
    m.on_event(&req.id, done(&req.id, "anything", FinishReason::Eog, 2));
    assert_eq!(m.read(VALID, 2).unwrap(), vec![0, 0xFFFF]);
    assert_eq!(m.read(TYPED, 4).unwrap(), vec![0; 4]);
}
