use super::read::{self, verify};
use super::*;
use crate::service::{Done, Event, Request, Timings};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

fn model() -> ModelFacts {
    ModelFacts {
        name: "test".into(),
        sha256: "ab".repeat(32),
        quant: "Q4_1".into(),
    }
}

fn engine() -> EngineFacts {
    EngineFacts {
        kernels: "portable".into(),
        threads: 2,
        ctx: 256,
        chunk: 64,
        kv_type: KvType::F16,
    }
}

fn answer(id: &str, text: &str) -> (Request, Event) {
    let req = Request::new(
        id,
        "serial:/dev/ttyUSB0",
        Prompt::Text {
            text: format!("question {id}"),
            special: false,
        },
    );
    let done = Done {
        id: id.into(),
        text: text.into(),
        finish_reason: FinishReason::Eog,
        usage: Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            restored_tokens: 0,
            dropped_turns: 0,
        },
        timings: Timings::default(),
        prompt_ids: vec![1, 2, 3],
        generated_ids: vec![7, 2],
        top_logits: Vec::new(),
        truncated_tokens: 0,
        valid: None,
        json: None,
        constraint: None,
        shape: None,
        session: None,
    };
    (req, Event::Done(Box::new(done)))
}

fn open(dir: &std::path::Path, max_bytes: u64, texts: bool) -> AuditLog {
    let sha = Arc::new(OnceLock::new());
    let _ = sha.set(model().sha256);
    AuditLog::open(
        AuditConfig {
            dir: dir.to_path_buf(),
            max_bytes,
            texts,
        },
        ModelFacts {
            sha256: String::new(),
            ..model()
        },
        sha,
        Arc::default(),
    )
    .unwrap()
}

fn write(log: &mut AuditLog, n: usize) {
    use crate::service::Recorder;
    let cfg = crate::engine::EngineConfig {
        n_ctx: 256,
        chunk: 64,
        threads: 2,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    for i in 0..n {
        let (req, ev) = answer(&format!("r{i}"), &format!("answer {i}"));
        log.record(&req, &ev, &cfg, "portable");
    }
}

fn lines(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    for s in read::segments(dir).unwrap() {
        for l in std::fs::read_to_string(&s.path).unwrap().lines() {
            out.push((s.path.clone(), l.to_owned()));
        }
    }
    out
}

#[test]
fn rfc3339_gives_the_calendar_date_and_time_in_utc() {
    let at = |s: u64, ms: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
    assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
    // 2000-02-29 (a leap day of a century year) 12:34:56.789
    assert_eq!(at(951_827_696, 789), "2000-02-29T12:34:56.789Z");
    assert_eq!(at(1_798_761_599, 999), "2026-12-31T23:59:59.999Z");
    assert_eq!(at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z");
}

#[test]
fn a_sealed_entry_unseals_to_itself_and_any_edit_is_seen() {
    let (req, ev) = answer("a", "hello");
    let mut e = entry_of(&req, &ev, &model(), engine(), true);
    e.seq = 1;
    e.prev = GENESIS.into();
    e.time = "2026-12-01T00:00:00.000Z".into();
    let (line, hash) = seal(&e);
    assert_eq!(line.last(), Some(&b'\n'));
    let body = &line[..line.len() - 1];
    let (back, stated) = unseal(body).unwrap();
    assert_eq!((back, stated), (e.clone(), hash));
    // One changed byte in the answer, the hash left alone.
    let edited = String::from_utf8(body.to_vec())
        .unwrap()
        .replace("\"answer\":\"hello\"", "\"answer\":\"hellO\"");
    assert_ne!(edited.as_bytes(), body);
    let err = unseal(edited.as_bytes()).unwrap_err();
    assert!(err.contains("edited"), "{err}");
    // The hash cut off.
    assert!(unseal(&body[..body.len() - 10]).is_err());
}

#[test]
fn the_prompt_hash_is_the_one_of_the_request_content_a_client_can_compute() {
    let (req, ev) = answer("a", "hello");
    let e = entry_of(&req, &ev, &model(), engine(), false);
    assert_eq!(
        e.prompt_sha256.as_deref(),
        Some(sha256_hex(br#"{"prompt":"question a"}"#).as_str())
    );
    assert_eq!(
        e.answer_sha256.as_deref(),
        Some(sha256_hex(b"hello").as_str())
    );
    // Without texts: hashes only.
    assert!(e.request.is_none() && e.answer.is_none() && e.prompt_ids.is_none());
    let mut le = Vec::new();
    for id in [7u32, 2] {
        le.extend_from_slice(&id.to_le_bytes());
    }
    assert_eq!(e.answer_ids_sha256, Some(sha256_hex(&le)));
}

#[test]
fn entries_chain_across_restarts_and_verify_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 3);
    drop(log);
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 2);
    let v = verify(dir.path()).unwrap();
    assert!(v.bad.is_none(), "{v:?}");
    assert_eq!((v.entries, v.first_seq, v.last_seq), (5, Some(1), Some(5)));
    assert_eq!(
        log.state()
            .written
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    let (e, _) = read::find(dir.path(), 4).unwrap();
    assert_eq!(
        (e.id.as_str(), e.source.as_str()),
        ("r0", "serial:/dev/ttyUSB0")
    );
    assert_eq!(e.model.sha256, model().sha256);
}

#[test]
fn a_removed_an_edited_and_a_replaced_entry_are_each_named() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), 1 << 20, true);
    write(&mut log, 5);
    drop(log);
    let all = lines(dir.path());
    let file = &all[0].0;
    let put = |ls: &[String]| std::fs::write(file, ls.join("\n") + "\n").unwrap();
    let orig: Vec<String> = all.iter().map(|(_, l)| l.clone()).collect();

    // Entry 3 removed.
    let mut ls = orig.clone();
    ls.remove(2);
    put(&ls);
    let bad = verify(dir.path()).unwrap().bad.unwrap();
    assert_eq!(bad.seq, 4, "{bad:?}");
    assert!(bad.reason.contains("entries 3 to 3 are missing"), "{bad:?}");

    // Entry 2's answer edited.
    let mut ls = orig.clone();
    ls[1] = ls[1].replace("answer 1", "answer X");
    put(&ls);
    let bad = verify(dir.path()).unwrap().bad.unwrap();
    assert_eq!((bad.seq, bad.line), (2, 2), "{bad:?}");
    assert!(bad.reason.contains("edited"), "{bad:?}");

    // Entry 2 replaced by a well-sealed forgery: its own hash checks, the next link does not.
    let (mut e, _) = unseal(orig[1].as_bytes()).unwrap();
    e.answer = Some("forged".into());
    let (line, _) = seal(&e);
    let mut ls = orig.clone();
    ls[1] = String::from_utf8(line).unwrap().trim_end().to_owned();
    put(&ls);
    let bad = verify(dir.path()).unwrap().bad.unwrap();
    assert_eq!(bad.seq, 3, "{bad:?}");
    assert!(bad.reason.contains("replaced"), "{bad:?}");

    put(&orig);
    assert!(verify(dir.path()).unwrap().bad.is_none());
}

#[test]
fn a_torn_last_line_is_cut_at_open_and_noted_in_the_next_entry() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 2);
    drop(log);
    let file = read::segments(dir.path()).unwrap()[0].path.clone();
    let mut bytes = std::fs::read(&file).unwrap();
    let whole = bytes.len();
    bytes.extend_from_slice(b"{\"seq\":3,\"prev\":\"12");
    std::fs::write(&file, &bytes).unwrap();
    let bad = verify(dir.path()).unwrap().bad.unwrap();
    assert!(bad.reason.contains("incomplete line"), "{bad:?}");

    let mut log = open(dir.path(), 1 << 20, false);
    assert_eq!(std::fs::metadata(&file).unwrap().len() as usize, whole);
    write(&mut log, 1);
    let v = verify(dir.path()).unwrap();
    assert!(v.bad.is_none(), "{v:?}");
    assert_eq!((v.last_seq, v.tails_cut), (Some(3), 1));
    assert_eq!(read::find(dir.path(), 3).unwrap().0.tail_cut, Some(19));
}

#[test]
fn the_trail_stays_within_its_budget_and_verifies_from_its_oldest_entry() {
    let dir = tempfile::tempdir().unwrap();
    let budget = 16 << 10;
    let mut log = open(dir.path(), budget, true);
    write(&mut log, 200);
    let segs = read::segments(dir.path()).unwrap();
    let total: u64 = segs
        .iter()
        .map(|s| std::fs::metadata(&s.path).unwrap().len())
        .sum();
    assert!(total <= budget, "{total} bytes in {} segments", segs.len());
    assert!(segs.len() >= 2);
    let v = verify(dir.path()).unwrap();
    assert!(v.bad.is_none(), "{v:?}");
    assert_eq!(v.last_seq, Some(200));
    assert!(v.first_seq.unwrap() > 1, "nothing was rotated out: {v:?}");
    assert_eq!(v.entries, 200 - v.first_seq.unwrap() + 1);
}

#[test]
fn a_write_that_fails_is_counted_undone_and_the_next_one_continues_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 1);
    // The segment turns read-only under the writer (as a remount would): reopened, it fails.
    let seg = read::segments(dir.path()).unwrap()[0].path.clone();
    log.file = Some(std::fs::File::open(&seg).unwrap());
    write(&mut log, 1);
    let st = log.state();
    assert_eq!(st.health.failures(), 1);
    assert!(st.health.error().is_some());
    log.file = None;
    write(&mut log, 1);
    assert!(st.health.error().is_none(), "the error did not clear");
    let v = verify(dir.path()).unwrap();
    assert!(v.bad.is_none(), "{v:?}");
    assert_eq!((v.entries, v.last_seq), (2, Some(2)));
}

#[test]
fn an_empty_newest_segment_continues_the_chain_from_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 2);
    drop(log);
    // The power went just after the next segment was made, before its first entry.
    std::fs::write(dir.path().join(read::segment_name(2)), b"").unwrap();
    let mut log = open(dir.path(), 1 << 20, false);
    write(&mut log, 1);
    let v = verify(dir.path()).unwrap();
    assert!(v.bad.is_none(), "{v:?}");
    assert_eq!((v.entries, v.last_seq), (3, Some(3)));
}
