use super::*;
use crate::service::{Done, FinishReason, Timings, Usage};
use serde_json::json;

fn limits() -> Limits {
    Limits {
        max_payload: 512,
        max_tokens: 100,
        timeout: Some(Duration::from_secs(5)),
    }
}

fn parse(payload: &str, origin: Origin) -> Result<Parsed, Refused> {
    parse_request(
        payload.as_bytes(),
        origin,
        "client-a",
        || "gen-1".into(),
        &limits(),
        Instant::now(),
    )
}

#[test]
fn topics_follow_the_prefix_device_and_group_and_refuse_wildcards() {
    let t = Topics::new("plant/edgellm", "dev-1", Some("line3")).unwrap();
    assert_eq!(t.request, "plant/edgellm/dev-1/request");
    assert_eq!(t.cancel, "plant/edgellm/dev-1/cancel");
    assert_eq!(t.status, "plant/edgellm/dev-1/status");
    assert_eq!(t.response("r9"), "plant/edgellm/dev-1/response/r9");
    assert_eq!(
        t.fleet_request.as_deref(),
        Some("$share/line3/plant/edgellm/fleet/request")
    );
    assert_eq!(
        t.fleet_topic.as_deref(),
        Some("plant/edgellm/fleet/request")
    );
    assert_eq!(
        t.fleet_cancel.as_deref(),
        Some("plant/edgellm/fleet/cancel")
    );
    assert_eq!(
        Topics::new("edgellm", "d", None).unwrap().fleet_request,
        None
    );
    for (p, d, g) in [
        ("edgellm", "a/b", None),
        ("edgellm", "a+", None),
        ("edge#", "d", None),
        ("$SYS", "d", None),
        ("a//b", "d", None),
        ("edgellm", "", None),
        ("edgellm", "d", Some("g/h")),
        ("edgellm", &"x".repeat(65), None),
    ] {
        assert!(Topics::new(p, d, g).is_err(), "{p} {d} {g:?}");
    }
}

#[test]
fn a_prompt_becomes_a_user_message_with_the_settings_given() {
    let now = Instant::now();
    let p = parse_request(
        br#"{"id":"r1","prompt":"Status?","system":"Be brief.","session":"plc-7","max_tokens":12,"temperature":0.5,"top_p":0.9,"top_k":5,"seed":7,"stream":true}"#,
        Origin::Device,
        "client-a",
        || unreachable!("the request has an id"),
        &limits(),
        now,
    )
    .unwrap();
    let r = &p.request;
    assert!(p.stream && !p.generated_id);
    assert_eq!((r.id.as_str(), r.source.as_str()), ("r1", "client-a"));
    assert!(matches!(&r.prompt, Prompt::Chat(m) if m == &[ChatMessage::new("user", "Status?")]));
    assert_eq!(r.system.as_deref(), Some("Be brief."));
    assert_eq!(r.session.as_ref().map(|s| s.as_str()), Some("plc-7"));
    assert_eq!(r.max_tokens, 12);
    assert_eq!(
        (
            r.sampling.temperature,
            r.sampling.top_p,
            r.sampling.top_k,
            r.sampling.seed
        ),
        (0.5, 0.9, 5, 7)
    );
    assert_eq!(r.deadline, Some(now + Duration::from_secs(5)));
}

#[test]
fn messages_are_taken_as_given_and_a_missing_id_is_generated() {
    let p = parse(
        r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#,
        Origin::Device,
    )
    .unwrap();
    assert!(p.generated_id && !p.stream);
    assert_eq!(p.request.id, "gen-1");
    assert!(matches!(&p.request.prompt, Prompt::Chat(m) if m.len() == 3 && m[2].content == "c"));
    assert_eq!(p.request.sampling.temperature, 0.0, "greedy unless asked");
}

#[test]
fn malformed_requests_are_refused_with_their_id_when_it_can_be_read() {
    let cases = [
        (
            r#"{"id":"r2","prompt":"x","temprature":0.5}"#,
            Some("r2"),
            ErrorCode::BadRequest,
            "unknown field",
        ),
        (
            r#"{"id":"r3","prompt":5}"#,
            Some("r3"),
            ErrorCode::BadRequest,
            "invalid type",
        ),
        (
            r#"{"id":"r4"}"#,
            Some("r4"),
            ErrorCode::BadRequest,
            "prompt or messages",
        ),
        (
            r#"{"id":"r5","prompt":"x","messages":[]}"#,
            Some("r5"),
            ErrorCode::BadRequest,
            "not both",
        ),
        (
            r#"{"id":"r6","prompt":"x","max_tokens":101}"#,
            Some("r6"),
            ErrorCode::TooLarge,
            "max_tokens",
        ),
        (
            r#"{"id":"r7","prompt":"x","max_tokens":0}"#,
            Some("r7"),
            ErrorCode::TooLarge,
            "max_tokens",
        ),
        (
            r#"{"id":"r8","prompt":"x","top_p":3}"#,
            Some("r8"),
            ErrorCode::BadRequest,
            "top_p",
        ),
        (
            r#"{"id":"r9","prompt":"x","session":"../etc"}"#,
            Some("r9"),
            ErrorCode::BadRequest,
            "session name",
        ),
        (
            r#"{"id":"a/b","prompt":"x"}"#,
            None,
            ErrorCode::BadRequest,
            "'/' at position 2",
        ),
        (
            r#"{"id":"line 3","prompt":"x"}"#,
            None,
            ErrorCode::BadRequest,
            "' ' at position 5",
        ),
        (
            r#"{"id":"ré","prompt":"x"}"#,
            None,
            ErrorCode::BadRequest,
            "'é' at position 2",
        ),
        (
            r#"{"id":"","prompt":"x"}"#,
            None,
            ErrorCode::BadRequest,
            "the request id is empty",
        ),
        (
            r#"{"id":"r10","prompt":"x""#,
            None,
            ErrorCode::BadRequest,
            "invalid request",
        ),
        (
            "\u{0}\u{ff}garbage",
            None,
            ErrorCode::BadRequest,
            "invalid request",
        ),
        (
            r#"["not","an","object"]"#,
            None,
            ErrorCode::BadRequest,
            "invalid request",
        ),
    ];
    for (payload, id, code, says) in cases {
        let r = parse(payload, Origin::Device).unwrap_err();
        assert_eq!(r.id.as_deref(), id, "{payload}");
        assert_eq!(r.error.code, code, "{payload}: {}", r.error);
        assert!(r.error.message.contains(says), "{payload}: {}", r.error);
    }
    let big = format!(r#"{{"id":"big","prompt":"{}"}}"#, "x".repeat(600));
    let r = parse(&big, Origin::Device).unwrap_err();
    assert_eq!(
        (r.id.as_deref(), r.error.code),
        (Some("big"), ErrorCode::TooLarge)
    );
    let r = parse(&format!("{}{{", "x".repeat(600)), Origin::Device).unwrap_err();
    assert_eq!((r.id, r.error.code), (None, ErrorCode::TooLarge));
}

#[test]
fn a_fleet_request_cannot_name_a_session() {
    let r = parse(r#"{"id":"f1","prompt":"x","session":"s"}"#, Origin::Fleet).unwrap_err();
    assert_eq!(r.error.code, ErrorCode::BadRequest);
    assert!(r.error.message.contains("own request topic"), "{}", r.error);
    assert!(parse(r#"{"id":"f2","prompt":"x"}"#, Origin::Fleet).is_ok());
}

#[test]
fn cancel_takes_an_id_and_nothing_else() {
    assert_eq!(parse_cancel(br#"{"id":"r1"}"#).unwrap(), "r1");
    assert!(parse_cancel(br#"{"id":"r1","x":1}"#).is_err());
    assert!(parse_cancel(b"r1").is_err());
    assert_eq!(
        parse_cancel(&vec![b' '; 2000]).unwrap_err().code,
        ErrorCode::TooLarge
    );
}

#[test]
fn answers_have_the_documented_shape() {
    let v: Value = serde_json::from_slice(&chunk_json("r1", 3, "he")).unwrap();
    assert_eq!(
        v,
        json!({"id": "r1", "seq": 3, "delta": "he", "done": false})
    );

    let d = Done {
        id: "r1".into(),
        text: "hello".into(),
        finish_reason: FinishReason::Eog,
        usage: Usage {
            prompt_tokens: 40,
            completion_tokens: 2,
            restored_tokens: 30,
            dropped_turns: 0,
        },
        timings: Timings {
            queue_ms: 1.23456,
            ttft_ms: 20.0,
            decode_tps: 300.5,
            ..Default::default()
        },
        prompt_ids: vec![1, 2],
        generated_ids: vec![5, 2],
        top_logits: vec![],
        truncated_tokens: 0,
        valid: None,
        json: None,
        constraint: None,
        shape: None,
        session: None,
    };
    let v: Value = serde_json::from_slice(&done_json(&d)).unwrap();
    assert_eq!(
        v,
        json!({"id": "r1", "text": "hello", "finish_reason": "stop",
               "usage": {"prompt_tokens": 40, "completion_tokens": 2, "restored_tokens": 30},
               "timings": {"queue_ms": 1.235, "ttft_ms": 20.0, "decode_tps": 300.5}, "done": true})
    );
    let names: Vec<_> = [
        FinishReason::Length,
        FinishReason::ContextFull,
        FinishReason::Cancelled,
        FinishReason::Timeout,
    ]
    .into_iter()
    .map(finish_name)
    .collect();
    assert_eq!(names, ["length", "length", "cancelled", "timeout"]);

    let e = ServiceError::new(ErrorCode::Busy, "busy: 16 requests are already waiting");
    let v: Value = serde_json::from_slice(&error_json(Some("r2"), &e)).unwrap();
    assert_eq!(
        v,
        json!({"id": "r2", "error": {"code": "busy", "message": "busy: 16 requests are already waiting"}, "done": true})
    );
    let v: Value = serde_json::from_slice(&error_json(None, &e)).unwrap();
    assert_eq!(v["id"], Value::Null);
}

#[test]
fn a_request_a_client_builds_is_the_request_the_daemon_parses() {
    let body = RequestBody {
        id: Some("ask-1".into()),
        system: Some("Be brief.".into()),
        session: Some("shift-a".into()),
        max_tokens: Some(16),
        temperature: Some(0.5),
        stream: true,
        ..RequestBody::prompt("Status?")
    };
    let json: Value = serde_json::from_slice(&body.to_json()).unwrap();
    // What is not set is not sent: the daemon's defaults apply.
    assert_eq!(
        json,
        json!({"id": "ask-1", "prompt": "Status?", "system": "Be brief.", "session": "shift-a",
               "max_tokens": 16, "temperature": 0.5, "stream": true})
    );
    let p = parse_request(
        &body.to_json(),
        Origin::Device,
        "cli",
        || unreachable!(),
        &limits(),
        Instant::now(),
    )
    .unwrap();
    assert_eq!(p.request.id, "ask-1");
    assert_eq!(p.request.max_tokens, 16);
    assert_eq!(
        p.request.session.as_ref().map(|s| s.as_str()),
        Some("shift-a")
    );
    assert_eq!(p.request.sampling.temperature, 0.5);
    assert!(p.stream);
}

#[test]
fn every_message_the_daemon_publishes_reads_back_as_what_it_said() {
    assert_eq!(
        parse_reply(&chunk_json("r1", 3, "hé")).unwrap(),
        Reply::Chunk(Chunk {
            id: "r1".into(),
            seq: 3,
            delta: "hé".into()
        })
    );
    let d = Done {
        id: "r1".into(),
        text: "hello".into(),
        finish_reason: FinishReason::Timeout,
        usage: Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            restored_tokens: 1,
            dropped_turns: 0,
        },
        timings: Timings {
            queue_ms: 0.5,
            ttft_ms: 20.0,
            decode_tps: 30.0,
            ..Default::default()
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
    };
    match parse_reply(&done_json(&d)).unwrap() {
        Reply::Final(f) => {
            assert_eq!(
                (f.id.as_str(), f.text.as_str(), f.finish_reason.as_str()),
                ("r1", "hello", "timeout")
            );
            assert_eq!(f.usage, d.usage);
            assert_eq!(
                f.timings,
                FinalTimings {
                    queue_ms: 0.5,
                    ttft_ms: 20.0,
                    decode_tps: 30.0
                }
            );
        }
        other => panic!("{other:?}"),
    }
    let e = ServiceError::new(ErrorCode::Busy, "busy");
    assert_eq!(
        parse_reply(&error_json(None, &e)).unwrap(),
        Reply::Error {
            id: None,
            error: e.clone()
        }
    );
    assert_eq!(
        parse_reply(&error_json(Some("r2"), &e)).unwrap().id(),
        Some("r2")
    );
}

#[test]
fn a_reply_that_is_not_the_contracts_is_an_error_not_a_panic() {
    for bad in [
        &b""[..],
        b"null",
        b"[1,2]",
        b"{\"done\": false, \"id\": \"r\"}",
        b"{\"done\": true, \"id\": \"r\", \"text\": \"x\"}",
        b"{\"id\": \"r\", \"seq\": 0, \"delta\": \"x\"}",
        b"{\"done\": true, \"error\": {\"code\": \"nonsense\", \"message\": \"\"}}",
        &[0xff, 0xfe, b'{'],
    ] {
        assert!(
            parse_reply(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}
