//! ConsoleCore over a MemEnv: editing, escape sequences, commands, streaming, Ctrl-C.

use super::*;
use crate::serial::core::MemEnv;
use crate::service::{Chunk, Done, ErrorCode, FinishReason, ServiceError, Timings, Usage};

fn console() -> ConsoleCore {
    ConsoleCore::new(ConsoleConfig {
        max_line: 32,
        max_tokens: 77,
        timeout: Some(std::time::Duration::from_secs(9)),
    })
    .unwrap()
}

fn bound(max_line: usize) -> Result<ConsoleCore, ConsoleError> {
    ConsoleCore::new(ConsoleConfig {
        max_line,
        ..ConsoleConfig::default()
    })
}

fn typed(c: &mut ConsoleCore, e: &mut MemEnv, s: &[u8]) -> String {
    c.on_bytes(s, e);
    e.take()
}

fn text(s: &str) -> Event {
    Event::Text(Chunk::try_from(s).unwrap())
}

fn done(finish: FinishReason) -> Event {
    Event::Done(Box::new(Done {
        id: "x".into(),
        text: String::new(),
        finish_reason: finish,
        usage: Usage {
            prompt_tokens: 11,
            completion_tokens: 5,
            restored_tokens: 0,
            dropped_turns: 0,
        },
        timings: Timings {
            decode_tps: 23.46,
            ..Timings::default()
        },
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

fn content(e: &MemEnv, i: usize) -> String {
    match &e.submitted[i].prompt {
        Prompt::Chat(m) => {
            assert_eq!((m.len(), m[0].role.as_str()), (1, "user"));
            m[0].content.clone()
        }
        p => panic!("not a chat: {p:?}"),
    }
}

#[test]
fn typed_characters_are_echoed_and_enter_submits_a_chat_message() {
    let (mut c, mut e) = (console(), MemEnv::default());
    assert_eq!(typed(&mut c, &mut e, b"Hi there"), "Hi there");
    assert_eq!(typed(&mut c, &mut e, b"\r"), "\r\n");
    assert_eq!(content(&e, 0), "Hi there");
    assert_eq!(e.counts, [Count::Requests]);
    assert_eq!(e.submitted[0].max_tokens, 77);
    assert!(e.submitted[0].deadline.is_some());
}

#[test]
fn cr_lf_and_lf_each_submit_once() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"help\r\nhelp\nhelp\r", &mut e);
    assert_eq!(
        e.take().matches(PROMPT).count(),
        3,
        "three commands, not four"
    );
    // The LF of a CR LF split across reads is still the same Enter; a second one is an
    // empty line, which shows the prompt again.
    assert_eq!(typed(&mut c, &mut e, b"\n"), "");
    assert_eq!(typed(&mut c, &mut e, b"\n"), format!("\r\n{PROMPT}"));
}

#[test]
fn backspace_and_delete_erase_one_character() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes("ab€".as_bytes(), &mut e);
    e.take();
    assert_eq!(typed(&mut c, &mut e, b"\x7f"), "\x08 \x08");
    assert_eq!(c.line(), "ab");
    assert_eq!(
        typed(&mut c, &mut e, b"\x08\x08\x08"),
        "\x08 \x08\x08 \x08",
        "nothing left to erase"
    );
    assert_eq!(c.line(), "");
}

#[test]
fn ctrl_u_erases_the_line() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes("héllo".as_bytes(), &mut e);
    e.take();
    assert_eq!(typed(&mut c, &mut e, b"\x15"), "\x08 \x08".repeat(5));
    assert_eq!(c.line(), "");
    c.on_bytes(b"ok\r", &mut e);
    assert_eq!(content(&e, 0), "ok");
}

#[test]
fn ctrl_c_while_editing_clears_the_line_and_prompts_again() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"half a", &mut e);
    e.take();
    assert_eq!(typed(&mut c, &mut e, b"\x03"), format!("^C\r\n{PROMPT}"));
    assert_eq!(c.line(), "");
    assert!(e.submitted.is_empty());
    assert_eq!(e.cancels, 0);
}

#[test]
fn arrow_and_function_keys_are_swallowed_without_echo() {
    let (mut c, mut e) = (console(), MemEnv::default());
    // Up, Left (CSI), F1 (SS3), Delete (CSI 3 ~), Alt-x (ESC x), then text.
    let out = typed(&mut c, &mut e, b"a\x1b[A\x1b[D\x1bOP\x1b[3~\x1bxb");
    assert_eq!(out, "ab");
    assert_eq!(c.line(), "ab");
}

#[test]
fn an_escape_sequence_split_across_reads_is_still_swallowed() {
    let (mut c, mut e) = (console(), MemEnv::default());
    for b in b"\x1b[1;5C" {
        c.on_bytes(&[*b], &mut e);
    }
    c.on_bytes(b"z", &mut e);
    assert_eq!((e.take().as_str(), c.line()), ("z", "z"));
}

#[test]
fn utf8_split_across_reads_is_echoed_whole_and_invalid_utf8_rings_the_bell() {
    let (mut c, mut e) = (console(), MemEnv::default());
    let euro = "€".as_bytes();
    c.on_bytes(&euro[..1], &mut e);
    assert_eq!(e.take(), "");
    c.on_bytes(&euro[1..], &mut e);
    assert_eq!(e.take(), "€");
    // A lone continuation byte, a cut sequence, an overlong encoding, a surrogate.
    for bad in [&b"\x80"[..], b"\xe2\x82x", b"\xe0\x80\xaf", b"\xed\xa0\x80"] {
        e.counts.clear();
        let out = typed(&mut c, &mut e, bad);
        assert!(out.starts_with('\x07'), "{bad:?} gave {out:?}");
        assert_eq!(e.counts, [Count::BadInput], "{bad:?}");
    }
    assert_eq!(c.line(), "€x");
}

#[test]
fn a_line_over_its_bound_rings_the_bell_and_never_grows() {
    let (mut c, mut e) = (console(), MemEnv::default());
    let cap = c.line_capacity();
    let out = typed(&mut c, &mut e, &[b'y'; 40]);
    assert_eq!(out, format!("{}{}", "y".repeat(32), "\x07".repeat(8)));
    assert_eq!(c.line().len(), 32);
    assert_eq!(e.counts, [Count::BadInput], "counted once per line");
    // A multi-byte character that would cross the bound is refused whole.
    c.on_bytes(b"\x7f", &mut e);
    e.take();
    assert_eq!(typed(&mut c, &mut e, "é".as_bytes()), "\x07");
    assert_eq!(c.line_capacity(), cap);
    c.on_bytes(b"\r", &mut e);
    assert_eq!(content(&e, 0), "y".repeat(31));
}

#[test]
fn help_lists_the_commands_with_crlf_line_endings() {
    let (mut c, mut e) = (console(), MemEnv::default());
    let out = typed(&mut c, &mut e, b"help\r");
    for cmd in ["help", "status", "sessions", "log [N]", "Ctrl-C"] {
        assert!(out.contains(cmd), "{cmd} missing from {out:?}");
    }
    assert!(
        !out.replace("\r\n", "").contains('\n'),
        "a bare LF: {out:?}"
    );
    assert!(out.ends_with(PROMPT));
    assert!(e.submitted.is_empty());
}

#[test]
fn status_shows_the_daemon_and_port_counters() {
    let (mut c, mut e) = (console(), MemEnv::default());
    e.status.state = "busy";
    e.status.model = "SmolLM2-135M".into();
    e.status.queue = 3;
    e.status.running = true;
    e.status.answered = 42;
    e.status.port_bad_input = 7;
    let out = typed(&mut c, &mut e, b"status\r");
    for want in ["busy (model SmolLM2-135M)", "3 waiting, answering: yes"] {
        assert!(out.contains(want), "{want} missing from {out:?}");
    }
    // Every counter of the line's STATUS, on a line of its own: name, then value.
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for name in [
        "answered",
        "failed",
        "busy",
        "uptime_s",
        "port_requests",
        "port_bad_input",
        "port_checksum_errors",
    ] {
        let n = match name {
            "answered" => "42",
            "port_bad_input" => "7",
            _ => "0",
        };
        assert!(
            rows.iter().any(|r| *r == [name, n]),
            "{name} {n} missing from {out:?}"
        );
    }
}

#[test]
fn sessions_and_log_list_their_lines() {
    let (mut c, mut e) = (console(), MemEnv::default());
    assert!(typed(&mut c, &mut e, b"sessions\r").contains("no sessions"));
    e.sessions = vec!["line-3".into(), "kiln".into()];
    let out = typed(&mut c, &mut e, b"sessions\r");
    assert!(out.contains("line-3\r\nkiln\r\n"), "{out:?}");
    e.log = (1..=30).map(|i| format!("log line {i}")).collect();
    let out = typed(&mut c, &mut e, b"log\r");
    assert!(out.contains("log line 11\r\n") && out.contains("log line 30\r\n"));
    assert!(!out.contains("log line 10\r\n"), "20 lines by default");
    let out = typed(&mut c, &mut e, b"log 2\r");
    assert_eq!(
        out,
        format!("log 2\r\nlog line 29\r\nlog line 30\r\n{PROMPT}")
    );
    assert!(typed(&mut c, &mut e, b"log many\r").contains("N is a number"));
    // A log line with an escape sequence does not reach the terminal as one.
    e.log = vec!["\x1b[31mred\x1b[0m".into()];
    assert!(!typed(&mut c, &mut e, b"log 1\r").contains('\x1b'));
}

#[test]
fn a_command_word_with_more_text_is_a_prompt() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"  help me write a poem \r", &mut e);
    assert_eq!(content(&e, 0), "help me write a poem");
}

#[test]
fn the_answer_streams_with_crlf_then_a_summary_and_the_prompt() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"hi\r", &mut e);
    e.take();
    c.on_event(text("Hello,\nworld"), &mut e);
    assert_eq!(e.take(), "Hello,\r\nworld");
    c.on_event(text("\x1b[2J!"), &mut e);
    assert_eq!(e.take(), "[2J!", "ESC is not passed to the terminal");
    c.on_event(done(FinishReason::Eog), &mut e);
    assert_eq!(
        e.take(),
        format!("\r\n[eog · 11 prompt tokens · 5 tokens · 23.5 tok/s]\r\n{PROMPT}")
    );
}

#[test]
fn typing_while_an_answer_streams_is_dropped_and_ctrl_c_cancels_it() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"hi\r", &mut e);
    c.on_event(text("Once\n"), &mut e);
    e.take();
    assert_eq!(typed(&mut c, &mut e, b"status\r\x1b[A"), "");
    assert_eq!(e.submitted.len(), 1);
    assert_eq!(typed(&mut c, &mut e, b"\x03"), "^C");
    assert_eq!(e.cancels, 1);
    c.on_event(done(FinishReason::Cancelled), &mut e);
    let out = e.take();
    assert!(out.starts_with("\r\n[cancelled"), "{out:?}");
    assert!(out.ends_with(PROMPT));
    // Editing works again, and nothing typed during the answer came back.
    assert_eq!(c.line(), "");
    assert_eq!(typed(&mut c, &mut e, b"x"), "x");
}

#[test]
fn an_answer_ending_on_a_newline_gets_no_blank_line_before_its_summary() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"hi\r", &mut e);
    c.on_event(text("done\n"), &mut e);
    e.take();
    c.on_event(done(FinishReason::Length), &mut e);
    assert!(e.take().starts_with("[length"));
}

#[test]
fn errors_of_the_service_are_shown_and_the_prompt_returns() {
    let (mut c, mut e) = (console(), MemEnv::default());
    e.refuse = Some(ServiceError::new(ErrorCode::Busy, "the queue is full"));
    let out = typed(&mut c, &mut e, b"hi\r");
    assert_eq!(
        out,
        format!("hi\r\nerror: busy: the queue is full\r\n{PROMPT}")
    );
    e.refuse = None;
    c.on_bytes(b"hi\r", &mut e);
    e.take();
    c.on_event(
        Event::Error(ServiceError::new(ErrorCode::ContextFull, "too long")),
        &mut e,
    );
    assert_eq!(
        e.take(),
        format!("error: context_full: too long\r\n{PROMPT}")
    );
}

#[test]
fn a_reopened_port_gets_a_fresh_prompt_and_an_empty_line() {
    let (mut c, mut e) = (console(), MemEnv::default());
    c.on_bytes(b"half", &mut e);
    e.take();
    c.on_open(&mut e);
    assert_eq!((e.take(), c.line()), (format!("\r\n{PROMPT}"), ""));
}

#[test]
fn a_megabyte_of_random_bytes_leaves_the_line_bounded_and_the_console_working() {
    let (mut c, mut e) = (console(), MemEnv::default());
    let cap = c.line_capacity();
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut fed = 0;
    while fed < 1 << 20 {
        let n = (s % 200) as usize + 1;
        let chunk: Vec<u8> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect();
        c.on_bytes(&chunk, &mut e);
        fed += n;
        // Random bytes hold CRs: requests start; end each so the noise keeps being edited.
        if !e.submitted.is_empty() {
            c.on_event(done(FinishReason::Eog), &mut e);
            e.submitted.clear();
        }
        assert!(c.line().len() <= 32 && c.line_capacity() == cap);
        e.out.clear();
    }
    c.on_bytes(b"\x15\x1b\x1b", &mut e);
    c.on_bytes(b"\x03", &mut e);
    e.take();
    c.on_bytes(b"sessions\r", &mut e);
    assert_eq!(e.take(), format!("sessions\r\nno sessions\r\n{PROMPT}"));
}

#[test]
fn a_line_bound_outside_the_range_is_refused() {
    assert_eq!(bound(0).err(), Some(ConsoleError::LineBound { got: 0 }));
    assert!(bound(MAX_LINE + 1).is_err());
    assert!(bound(MAX_LINE).is_ok());
}

#[test]
fn slash_session_makes_messages_continue_it_and_reset_and_history_act_on_it() {
    let (mut c, mut e) = (console(), MemEnv::default());
    // Without a session: a message stands alone, /reset and /history say what is missing.
    c.on_bytes(b"/history\r", &mut e);
    assert!(
        e.take()
            .contains("no session: choose one with /session NAME")
    );
    assert!(e.submitted.is_empty());
    c.on_bytes(b"/session ../x\r", &mut e);
    assert!(e.take().contains("error: "), "a bad name is refused");
    assert_eq!(e.refusals.len(), 1, "and told to the audit trail");
    assert_eq!(e.refusals[0].session.as_deref(), Some("../x"));
    c.on_bytes(b"/session shift-a\r", &mut e);
    assert!(
        e.take()
            .contains("session shift-a: messages continue its conversation")
    );
    c.on_bytes(b"/session\r", &mut e);
    assert!(e.take().contains("session shift-a"));

    c.on_bytes(b"Pump 7 is hot\r", &mut e);
    assert_eq!(content(&e, 0), "Pump 7 is hot");
    assert_eq!(e.submitted[0].session.as_ref().unwrap().as_str(), "shift-a");
    c.on_event(done(FinishReason::Eog), &mut e);
    e.take();

    c.on_bytes(b"/history\r", &mut e);
    e.take();
    assert!(matches!(e.submitted[1].prompt, Prompt::History));
    assert_eq!(e.submitted[1].session.as_ref().unwrap().as_str(), "shift-a");
    c.on_event(text("user: Pump 7 is hot"), &mut e);
    let mut end = done(FinishReason::Eog);
    if let Event::Done(d) = &mut end {
        d.text = "user: Pump 7 is hot".into();
    }
    c.on_event(end, &mut e);
    assert_eq!(e.take(), format!("user: Pump 7 is hot\r\n{PROMPT}"));

    c.on_bytes(b"/reset\r", &mut e);
    assert!(matches!(e.submitted[2].prompt, Prompt::Forget));
    c.on_event(done(FinishReason::Eog), &mut e);
    assert!(e.take().contains("session shift-a forgotten"));
}
