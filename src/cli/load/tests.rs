use super::*;

#[test]
fn percentiles_of_no_samples_are_none() {
    assert_eq!(percentile(&[], 50.0), None);
    assert_eq!(percentile(&[], 99.0), None);
    assert_eq!(
        Spread::of(Vec::new()),
        Spread {
            n: 0,
            p50: None,
            p99: None
        }
    );
}

#[test]
fn every_percentile_of_one_sample_is_that_sample() {
    for p in [1.0, 50.0, 99.0, 100.0] {
        assert_eq!(percentile(&[7.5], p), Some(7.5), "p{p}");
    }
}

#[test]
fn of_two_samples_p50_is_the_smaller_and_p99_the_larger() {
    assert_eq!(percentile(&[1.0, 9.0], 50.0), Some(1.0));
    assert_eq!(percentile(&[1.0, 9.0], 99.0), Some(9.0));
}

#[test]
fn percentiles_are_nearest_rank_samples() {
    let v: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(percentile(&v, 50.0), Some(50.0));
    assert_eq!(percentile(&v, 99.0), Some(99.0));
    assert_eq!(percentile(&v, 100.0), Some(100.0));
    // 7% of 100 is rank 7 exactly, not 8 (0.07 × 100 is not exact in floating point).
    assert_eq!(percentile(&v, 7.0), Some(7.0));
    let odd = [1.0, 2.0, 3.0];
    assert_eq!(percentile(&odd, 50.0), Some(2.0));
    assert_eq!(percentile(&odd, 99.0), Some(3.0));
}

#[test]
fn a_spread_sorts_its_samples_first() {
    let s = Spread::of(vec![5.0, 1.0, 3.0, 4.0, 2.0]);
    assert_eq!((s.n, s.p50, s.p99), (5, Some(3.0), Some(5.0)));
}

fn key(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

fn done(id: &str, tokens: u64) -> String {
    json!({"id": id, "text": "x", "finish_reason": "length",
           "usage": {"prompt_tokens": 9, "completion_tokens": tokens, "restored_tokens": 0},
           "timings": {"queue_ms": 2.0, "ttft_ms": 30.0, "decode_tps": 250.0}, "done": true})
    .to_string()
}

fn chunk(id: &str, seq: u64) -> String {
    json!({"id": id, "seq": seq, "delta": "a", "done": false}).to_string()
}

#[test]
fn a_streamed_answer_is_timed_from_its_publish_to_its_first_chunk() {
    let t0 = Instant::now();
    let mut tr = Tracker::new(Duration::from_secs(10));
    tr.sent(key("r-0"), t0);
    let ms = Duration::from_millis;
    tr.message(Some(key("r-0")), chunk("r-0", 0).as_bytes(), t0 + ms(40));
    tr.message(Some(key("r-0")), chunk("r-0", 1).as_bytes(), t0 + ms(45));
    assert_eq!(tr.in_flight(), 1);
    tr.message(Some(key("r-0")), done("r-0", 8).as_bytes(), t0 + ms(80));
    assert_eq!(tr.in_flight(), 0);
    let [Outcome::Answered(a)] = tr.outcomes.as_slice() else {
        panic!("{:?}", tr.outcomes)
    };
    assert!((a.client_ttfc_ms - 40.0).abs() < 1e-6, "{a:?}");
    assert_eq!((a.queue_ms, a.ttft_ms, a.completion_tokens), (2.0, 30.0, 8));
    // One gap between its two chunks.
    assert_eq!(tr.gaps_ms.len(), 1);
    assert!((tr.gaps_ms[0] - 5.0).abs() < 1e-6, "{:?}", tr.gaps_ms);
}

#[test]
fn gaps_between_chunks_are_kept_per_answer_and_only_once_it_is_answered() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut tr = Tracker::new(Duration::from_secs(10));
    tr.sent(key("a"), t0);
    tr.sent(key("b"), t0);
    // Interleaved: each answer's gaps are its own chunks' (a: 10, 30; b: 12).
    tr.message(Some(key("a")), chunk("a", 0).as_bytes(), t0 + ms(10));
    tr.message(Some(key("b")), chunk("b", 0).as_bytes(), t0 + ms(15));
    tr.message(Some(key("a")), chunk("a", 1).as_bytes(), t0 + ms(20));
    tr.message(Some(key("b")), chunk("b", 1).as_bytes(), t0 + ms(27));
    tr.message(Some(key("a")), chunk("a", 2).as_bytes(), t0 + ms(50));
    assert!(tr.gaps_ms.is_empty(), "none before an answer ends");
    tr.message(Some(key("a")), done("a", 3).as_bytes(), t0 + ms(60));
    let busy = json!({"id": "b", "error": {"code": "busy", "message": "x"}, "done": true});
    tr.message(Some(key("b")), busy.to_string().as_bytes(), t0 + ms(70));
    let got: Vec<i64> = tr.gaps_ms.iter().map(|g| g.round() as i64).collect();
    assert_eq!(
        got,
        [10, 30],
        "b ended in an error: its gaps are not an answer's"
    );
}

#[test]
fn answers_are_told_apart_by_correlation_data_or_else_by_id() {
    let t0 = Instant::now();
    let mut tr = Tracker::new(Duration::from_secs(10));
    tr.sent(key("a"), t0);
    tr.sent(key("b"), t0);
    let busy = json!({"id": "b", "error": {"code": "busy", "message": "full"}, "done": true});
    tr.message(Some(key("b")), busy.to_string().as_bytes(), t0);
    // No correlation data: the payload's id names the request.
    tr.message(None, done("a", 3).as_bytes(), t0);
    assert_eq!(tr.outcomes.len(), 2);
    assert_eq!(tr.outcomes[0], Outcome::Error("busy".into()));
    assert!(matches!(tr.outcomes[1], Outcome::Answered(_)));
    // A late or stranger's message changes nothing.
    tr.message(Some(key("zz")), done("zz", 3).as_bytes(), t0);
    tr.message(None, b"not json", t0);
    assert_eq!(tr.outcomes.len(), 2);
}

#[test]
fn a_chunk_out_of_order_or_a_final_message_without_timings_is_invalid() {
    let t0 = Instant::now();
    let mut tr = Tracker::new(Duration::from_secs(10));
    tr.sent(key("a"), t0);
    tr.sent(key("b"), t0);
    tr.sent(key("c"), t0);
    tr.message(Some(key("a")), chunk("a", 1).as_bytes(), t0);
    tr.message(Some(key("b")), br#"{"id":"b","text":"","done":true}"#, t0);
    tr.message(Some(key("c")), b"{oops", t0);
    assert_eq!(tr.in_flight(), 0);
    assert!(
        tr.outcomes.iter().all(|o| matches!(o, Outcome::Invalid(_))),
        "{:?}",
        tr.outcomes
    );
}

#[test]
fn requests_time_out_in_send_order_and_their_late_answers_are_ignored() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut tr = Tracker::new(s(5));
    tr.sent(key("a"), t0);
    tr.sent(key("b"), t0 + s(1));
    tr.sent(key("c"), t0 + s(2));
    tr.message(Some(key("b")), done("b", 2).as_bytes(), t0 + s(3));
    assert_eq!(tr.next_deadline(), Some(t0 + s(5)));
    tr.expire(t0 + s(6));
    assert_eq!(tr.in_flight(), 1, "a timed out, b answered, c waits");
    // b's finished entry is skipped on the way to c's deadline.
    assert_eq!(tr.next_deadline(), Some(t0 + s(7)));
    tr.expire(t0 + s(7));
    assert_eq!(tr.next_deadline(), None);
    tr.message(Some(key("a")), done("a", 2).as_bytes(), t0 + s(8));
    let timeouts = tr
        .outcomes
        .iter()
        .filter(|o| **o == Outcome::Timeout)
        .count();
    assert_eq!((tr.outcomes.len(), timeouts), (3, 2));
}

fn answered(ttfc: f64, queue: f64, ttft: f64, tokens: u64, tps: f64) -> Outcome {
    Outcome::Answered(Answer {
        client_ttfc_ms: ttfc,
        queue_ms: queue,
        ttft_ms: ttft,
        decode_tps: tps,
        completion_tokens: tokens,
        finish_reason: "length".into(),
    })
}

#[test]
fn the_summary_counts_every_outcome_once_and_errors_by_code() {
    let outcomes = [
        answered(40.0, 5.0, 30.0, 8, 200.0),
        answered(60.0, 20.0, 32.0, 8, 300.0),
        // One token: no decode speed, left out of the mean.
        answered(50.0, 10.0, 35.0, 1, 0.0),
        Outcome::Error("busy".into()),
        Outcome::Error("busy".into()),
        Outcome::Error("timeout".into()),
        Outcome::Timeout,
        Outcome::Invalid("chunk 2 arrived, 1 expected".into()),
    ];
    let s = summarize(&outcomes, &[9.0, 7.0, 30.0], 3, Duration::from_secs(2));
    assert_eq!(
        (s.requests, s.ok, s.errors(), s.timeouts, s.invalid),
        (8, 3, 3, 1, 1)
    );
    assert_eq!(s.errors_by_code["busy"], 2);
    assert_eq!(s.errors_by_code["timeout"], 1);
    assert_eq!(s.finish_reasons["length"], 3);
    assert_eq!((s.queue_ms.p50, s.queue_ms.p99), (Some(10.0), Some(20.0)));
    assert_eq!(s.client_ttfc_ms.p50, Some(50.0));
    assert_eq!(s.ttft_ms.p99, Some(35.0));
    // Overheads 5, 8 and 5 ms.
    assert_eq!(
        (s.overhead_ms.p50, s.overhead_ms.p99),
        (Some(5.0), Some(8.0))
    );
    assert_eq!(s.completion_tokens, 17);
    assert!((s.aggregate_tps - 8.5).abs() < 1e-9);
    assert_eq!(s.mean_decode_tps, Some(250.0));
    assert_eq!(
        (
            s.inter_chunk_ms.n,
            s.inter_chunk_ms.p50,
            s.inter_chunk_ms.p99
        ),
        (3, Some(9.0), Some(30.0))
    );
    let j = s.to_json();
    assert_eq!(j["inter_chunk_ms"]["p99"], 30.0);
    assert_eq!((j["ok"].as_u64(), j["errors"].as_u64()), (Some(3), Some(3)));
    assert_eq!(j["errors_by_code"]["busy"], 2);
    assert_eq!(j["first_invalid"], "chunk 2 arrived, 1 expected");
}

#[test]
fn a_summary_without_answers_has_no_percentiles_and_prints() {
    let s = summarize(&[Outcome::Error("busy".into())], &[], 1, Duration::ZERO);
    assert_eq!((s.ok, s.queue_ms.p50, s.mean_decode_tps), (0, None, None));
    assert_eq!(s.aggregate_tps, 0.0);
    assert!(s.to_json()["queue_ms"]["p50"].is_null());
    let text = s.to_string();
    assert!(
        text.contains("1 errors") && text.contains("busy 1"),
        "{text}"
    );
}
