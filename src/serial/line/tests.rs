use super::*;
use crate::serial::core::MemEnv;
use crate::service::{Chunk, Done, ErrorCode, Timings, Usage};

fn core() -> LineCore {
    LineCore::new(LineConfig {
        max_line: 64,
        max_tokens: 100,
        default_tokens: 16,
        timeout: Some(Duration::from_secs(5)),
    })
}

fn send(c: &mut LineCore, env: &mut MemEnv, bytes: &str) -> String {
    c.on_bytes(bytes.as_bytes(), env);
    env.take()
}

fn text(s: &str) -> Event {
    let mut c = Chunk::new();
    c.push_str(s).unwrap();
    Event::Text(c)
}

fn done(reason: FinishReason, text: &str) -> Event {
    Event::Done(Box::new(Done {
        id: "x".into(),
        text: text.into(),
        finish_reason: reason,
        usage: Usage {
            prompt_tokens: 9,
            completion_tokens: 3,
            restored_tokens: 2,
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

#[test]
fn ping_is_answered_pong_with_any_line_ending() {
    let (mut c, mut env) = (core(), MemEnv::default());
    assert_eq!(send(&mut c, &mut env, "PING\r\n"), "OK PONG\r\n");
    assert_eq!(send(&mut c, &mut env, "ping\n"), "OK PONG\r\n");
    assert_eq!(send(&mut c, &mut env, "PING\r"), "OK PONG\r\n");
    // CR LF is one terminator: no empty command after it, and an LF alone later still ends.
    assert_eq!(send(&mut c, &mut env, "\nPING\n\n"), "OK PONG\r\n");
}

#[test]
fn a_line_split_across_reads_or_sent_byte_by_byte_is_one_command() {
    let (mut c, mut env) = (core(), MemEnv::default());
    for b in "GEN hello world\r\n".bytes() {
        c.on_bytes(&[b], &mut env);
    }
    assert_eq!(env.submitted.len(), 1);
    match &env.submitted[0].prompt {
        Prompt::Text { text, special } => {
            assert_eq!(text, "hello world");
            assert!(!special, "serial text must never become control tokens");
        }
        p => panic!("{p:?}"),
    }
    // A burst of two commands in one read.
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    env.take();
    assert_eq!(
        send(&mut c, &mut env, "PING\r\nPING\r\n"),
        "OK PONG\r\nOK PONG\r\n"
    );
}

#[test]
fn gen_answers_the_whole_text_on_one_escaped_line() {
    let (mut c, mut env) = (core(), MemEnv::default());
    send(&mut c, &mut env, "GEN Once\n");
    let r = &env.submitted[0];
    assert_eq!(r.max_tokens, 16);
    assert_eq!(r.source, "serial:test");
    assert!(r.deadline.is_some());
    c.on_event(text("a\\b\nc"), &mut env);
    c.on_event(text("\rd\x01"), &mut env);
    assert_eq!(env.take(), "", "stream is off: nothing before the end");
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    assert_eq!(env.take(), "OK a\\\\b\\nc\\rd\\x01\r\n");
}

#[test]
fn streaming_sends_data_lines_then_end_with_reason_and_counts() {
    let (mut c, mut env) = (core(), MemEnv::default());
    assert_eq!(
        send(&mut c, &mut env, "SET stream=on\n"),
        "OK stream=on\r\n"
    );
    send(&mut c, &mut env, "GEN x\n");
    c.on_event(text("two\nlines"), &mut env);
    assert_eq!(env.take(), "DATA two\\nlines\r\n");
    c.on_event(done(FinishReason::Length, "two\nlines"), &mut env);
    // The whole prompt, as the service counts it (restored tokens included): never added to.
    assert_eq!(env.take(), "END length 9 3\r\n");
}

#[test]
fn chat_takes_a_session_and_the_system_prompt_set_before() {
    let (mut c, mut env) = (core(), MemEnv::default());
    send(&mut c, &mut env, "SET system=You are terse.\n");
    send(&mut c, &mut env, "CHAT session=pump-3 Why is it hot?\n");
    let r = &env.submitted[0];
    assert_eq!(r.session.as_ref().unwrap().as_str(), "pump-3");
    assert_eq!(r.system.as_deref(), Some("You are terse."));
    match &r.prompt {
        Prompt::Chat(m) => assert_eq!(m, &[ChatMessage::new("user", "Why is it hot?")]),
        p => panic!("{p:?}"),
    }
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    env.take();
    send(&mut c, &mut env, "CHAT plain\n");
    assert!(env.submitted[1].session.is_none());
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    env.take();
    let r = send(&mut c, &mut env, "CHAT session=../etc x\n");
    assert!(r.starts_with("ERR bad_request session name"), "{r}");
    assert_eq!(env.submitted.len(), 2);
    // Refused here, and told to the audit trail with the name as sent.
    let [refusal] = env.refusals.as_slice() else {
        panic!("one refusal told: {:?}", env.refusals)
    };
    assert_eq!(
        (refusal.source.as_str(), refusal.session.as_deref()),
        ("serial:test", Some("../etc"))
    );
    assert_eq!(refusal.error.code, crate::service::ErrorCode::BadRequest);
    assert!(refusal.id.starts_with("serial-test-"), "{refusal:?}");
}

#[test]
fn set_checks_each_value_and_the_next_request_uses_them() {
    let (mut c, mut env) = (core(), MemEnv::default());
    for (line, want) in [
        ("SET max_tokens=0", "ERR bad_value max_tokens"),
        ("SET max_tokens=101", "ERR bad_value max_tokens"),
        ("SET temperature=2.5", "ERR bad_value temperature"),
        ("SET temperature=hot", "ERR bad_value temperature"),
        ("SET seed=-1", "ERR bad_value seed"),
        ("SET stream=maybe", "ERR bad_value stream"),
        ("SET colour=red", "ERR bad_request unknown setting"),
        ("SET nothing", "ERR bad_request SET takes key=value"),
        ("SET max_tokens=100", "OK max_tokens=100"),
        ("set TEMPERATURE=0.7", "OK temperature=0.7"),
        ("SET seed=42", "OK seed=42"),
    ] {
        let r = send(&mut c, &mut env, &format!("{line}\n"));
        assert!(r.starts_with(want), "{line}: {r}");
    }
    send(&mut c, &mut env, "GEN x\n");
    let r = &env.submitted[0];
    assert_eq!(
        (r.max_tokens, r.sampling.temperature, r.sampling.seed),
        (100, 0.7, 42)
    );
}

#[test]
fn a_second_request_while_one_runs_is_busy_and_read_only_commands_still_answer() {
    let (mut c, mut env) = (core(), MemEnv::default());
    send(&mut c, &mut env, "GEN one\n");
    let r = send(&mut c, &mut env, "GEN two\n");
    assert!(r.starts_with("ERR busy "), "{r}");
    assert_eq!(env.submitted.len(), 1);
    assert_eq!(send(&mut c, &mut env, "PING\n"), "OK PONG\r\n");
    env.status.state = "busy";
    env.status.model = "m".into();
    env.status.answered = 4;
    env.status.port_checksum_errors = 2;
    let s = send(&mut c, &mut env, "STATUS\n");
    // Every field docs/serial.md lists, in its order.
    assert_eq!(
        s,
        "OK state=busy model=m queue=0 running=no answered=4 failed=0 busy=0 uptime_s=0 \
         port_requests=0 port_bad_input=0 port_checksum_errors=2 this_port=running\r\n"
    );
    assert_eq!(send(&mut c, &mut env, "CANCEL\n"), "OK CANCELLING\r\n");
    assert_eq!(env.cancels, 1);
    c.on_event(done(FinishReason::Cancelled, "par"), &mut env);
    assert_eq!(env.take(), "ERR cancelled the answer was cancelled\r\n");
    assert!(send(&mut c, &mut env, "CANCEL\n").starts_with("ERR idle "));
    // The port is free again.
    send(&mut c, &mut env, "GEN three\n");
    assert_eq!(env.submitted.len(), 2);
}

#[test]
fn a_refusal_of_the_service_is_an_err_line_with_its_code() {
    let (mut c, mut env) = (core(), MemEnv::default());
    env.refuse = Some(ServiceError::new(ErrorCode::Busy, "the queue is full (16)"));
    assert_eq!(
        send(&mut c, &mut env, "GEN x\n"),
        "ERR busy the queue is full (16)\r\n"
    );
    env.refuse = None;
    send(&mut c, &mut env, "GEN x\n");
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::TooLarge, "too\nbig")),
        &mut env,
    );
    assert_eq!(env.take(), "ERR too_large too\\nbig\r\n");
    c.on_event(done(FinishReason::Eog, "late"), &mut env);
    assert_eq!(env.take(), "", "no answer without a request");
}

#[test]
fn a_timeout_mid_answer_is_err_timeout_with_the_tokens_generated() {
    let (mut c, mut env) = (core(), MemEnv::default());
    send(&mut c, &mut env, "GEN x\n");
    c.on_event(done(FinishReason::Timeout, "abc"), &mut env);
    assert_eq!(
        env.take(),
        "ERR timeout the answer did not finish in time (3 tokens generated)\r\n"
    );
}

#[test]
fn unknown_commands_and_invalid_utf8_are_errors_and_counted() {
    let (mut c, mut env) = (core(), MemEnv::default());
    let r = send(&mut c, &mut env, "FLY away\n");
    assert!(
        r.starts_with("ERR unknown_command FLY: the commands are PING"),
        "{r}"
    );
    c.on_bytes(b"GEN \xff\xfe\n", &mut env);
    assert_eq!(env.take(), "ERR bad_utf8 the line is not valid UTF-8\r\n");
    assert_eq!(env.counts, [Count::BadInput, Count::BadInput]);
    assert!(env.submitted.is_empty());
    assert!(send(&mut c, &mut env, "HELP\n").starts_with("OK PING | GEN"));
}

#[test]
fn an_overlong_line_is_refused_once_and_the_next_line_works() {
    let (mut c, mut env) = (core(), MemEnv::default());
    let long = format!("GEN {}\n", "x".repeat(200));
    let r = send(&mut c, &mut env, &long);
    assert_eq!(r, "ERR too_long line longer than 64 bytes, discarded\r\n");
    assert!(env.submitted.is_empty());
    // Exactly at the limit is accepted.
    let max = format!("GEN {}\n", "y".repeat(60));
    send(&mut c, &mut env, &max);
    assert_eq!(env.submitted.len(), 1);
    assert_eq!(c.capacity(), 64);
}

#[test]
fn a_checksum_is_checked_and_echoed_on_every_reply_line() {
    let (mut c, mut env) = (core(), MemEnv::default());
    let with = |body: &str| format!("{body}*{:02X}\r\n", xor(body.as_bytes()));
    assert_eq!(send(&mut c, &mut env, &with("PING")), with("OK PONG"));
    let r = send(&mut c, &mut env, "PING*00\r\n");
    let want = format!("line checksum is 00, the bytes give {:02X}", xor(b"PING"));
    assert_eq!(r, with(&format!("ERR checksum {want}")));
    assert_eq!(env.counts, [Count::Checksum]);
    // The answer of a request that came with a checksum carries one too, streamed or not.
    send(&mut c, &mut env, &with("SET stream=on"));
    send(&mut c, &mut env, &with("GEN hi"));
    c.on_event(text("yo"), &mut env);
    c.on_event(done(FinishReason::Eog, "yo"), &mut env);
    assert_eq!(env.take(), with("DATA yo") + &with("END eog 9 3"));
    // Without one, none: `*` followed by non-hex is just text.
    send(&mut c, &mut env, "GEN 5*G1\n");
    match &env.submitted[1].prompt {
        Prompt::Text { text, .. } => assert_eq!(text, "5*G1"),
        p => panic!("{p:?}"),
    }
}

#[test]
fn reset_forgets_a_named_session_through_the_queue() {
    let (mut c, mut env) = (core(), MemEnv::default());
    send(&mut c, &mut env, "RESET pump-3\n");
    let r = &env.submitted[0];
    assert!(matches!(r.prompt, Prompt::Forget));
    assert_eq!(r.session.as_ref().unwrap().as_str(), "pump-3");
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    assert_eq!(env.take(), "OK RESET pump-3\r\n");
    assert!(send(&mut c, &mut env, "RESET a/b\n").starts_with("ERR bad_request"));
    assert_eq!(env.refusals.len(), 1);
    assert_eq!(env.refusals[0].session.as_deref(), Some("a/b"));
    // As CHAT names a session too.
    send(&mut c, &mut env, "RESET session=pump-4\n");
    assert_eq!(
        env.submitted[1].session.as_ref().unwrap().as_str(),
        "pump-4"
    );
    c.on_event(done(FinishReason::Eog, ""), &mut env);
    assert_eq!(env.take(), "OK RESET pump-4\r\n");
}

#[test]
fn history_answers_a_named_sessions_conversation_through_the_queue() {
    let (mut c, mut env) = (core(), MemEnv::default());
    for line in ["HISTORY pump-3\n", "HISTORY session=pump-3\n"] {
        send(&mut c, &mut env, line);
        let r = env.submitted.last().unwrap();
        assert!(matches!(r.prompt, Prompt::History), "{line}");
        assert_eq!(r.session.as_ref().unwrap().as_str(), "pump-3");
        c.on_event(Event::Text(Chunk::try_from("user: Hi").unwrap()), &mut env);
        c.on_event(done(FinishReason::Eog, ""), &mut env);
        assert_eq!(env.take(), "OK user: Hi\r\n");
    }
    assert!(send(&mut c, &mut env, "HISTORY\n").starts_with("ERR bad_request"));
    assert_eq!(env.refusals.len(), 1);
    assert_eq!(env.refusals[0].session, None, "no name was given");
}

#[test]
fn a_megabyte_of_random_bytes_never_grows_the_buffer_and_ping_answers_after() {
    let (mut c, mut env) = (core(), MemEnv::default());
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut chunk = [0u8; 4096];
    for _ in 0..256 {
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        c.on_bytes(&chunk, &mut env);
        // A random GEN may have been accepted: let it end so the port stays free.
        if c.running.is_some() {
            c.on_event(done(FinishReason::Eog, ""), &mut env);
        }
        env.out.clear();
    }
    assert_eq!(c.capacity(), 64);
    // End whatever line the garbage left open, then the port answers as before.
    send(&mut c, &mut env, "\n");
    assert_eq!(send(&mut c, &mut env, "PING\n"), "OK PONG\r\n");
}
