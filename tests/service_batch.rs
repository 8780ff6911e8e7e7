//! Continuous batching in the service: requests that arrive while others are answered join
//! the running batch, and every answer — its tokens, its text, how it ended — is the one it
//! gets alone, whatever arrived beside it, in whatever order, at any thread count.
//!
//! The worker is held at the first request's first token (its ticket holds one event and
//! nobody reads it yet) while the rest are queued, so every round starts with a full queue and
//! the batch is certain, not a race against a fast model.

mod common;

use edgellm::engine::{Engine, EngineConfig, SamplingParams};
use edgellm::gguf::Gguf;
use edgellm::model::synth::SynthSpec;
use edgellm::model::{LoadOptions, Model};
use edgellm::service::{
    Done, Event, FinishReason, Format, Handle, Prompt, Request, Service, ServiceConfig, Sessions,
    Shape, Ticket,
};
use edgellm::tokenizer::ChatMessage;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn synth_model() -> Arc<Model> {
    let bytes = common::ascii_chat_model_bytes(&SynthSpec::default(), Some(CHATML));
    let g = Gguf::from_bytes("chat.gguf", bytes).unwrap();
    Arc::new(Model::from_gguf(g).unwrap())
}

/// Every test service's context.
const N_CTX: usize = 256;

/// A service of `max_batch` on `model`; prompts go in chunks of 8 tokens, so the longer ones
/// take several steps to feed (in pieces sized by the time a step takes, while others stream).
fn service(model: &Arc<Model>, max_batch: usize, threads: usize, sessions: Sessions) -> Service {
    service_chunked(model, max_batch, threads, sessions, 8)
}

/// A chunk that holds every prompt of these tests: each goes in one piece, so how many steps
/// the answers share does not depend on how fast this machine feeds a prompt.
const WHOLE: usize = 128;

fn service_chunked(
    model: &Arc<Model>,
    max_batch: usize,
    threads: usize,
    sessions: Sessions,
    chunk: usize,
) -> Service {
    let cfg = EngineConfig {
        n_ctx: N_CTX,
        chunk,
        threads,
        max_batch,
        ..Default::default()
    };
    let engine = Engine::new(Arc::clone(model), cfg).unwrap();
    let cfg = ServiceConfig {
        queue_depth: 32,
        per_source: 32,
        max_prompt_bytes: 4000,
        sessions,
        ticket_capacity: 1,
        ..ServiceConfig::default()
    };
    Service::start(engine, cfg).unwrap()
}

fn raw(id: &str, text: &str, max_tokens: usize) -> Request {
    let prompt = Prompt::Text {
        text: text.into(),
        special: false,
    };
    let mut r = Request::new(id, "plc", prompt);
    r.max_tokens = max_tokens;
    r
}

/// Requests of every kind a batch takes: raw prompts from 2 to ~70 tokens, greedy and seeded,
/// a chat, an answer held to a format, lengths from 3 to 40 tokens.
fn requests() -> Vec<Request> {
    let mut v = vec![
        raw("short", "Hi", 12),
        raw(
            "long",
            "The pump on line 3 reports a pressure of 4.2 bar and a flow of 17 l/min; is that",
            40,
        ),
        raw("three", "abc", 3),
        raw("mid", "Valve V-12 closed at 14:02.", 25),
    ];
    let mut seeded = raw("seeded", "Temperature of tank 2 is", 30);
    seeded.sampling = SamplingParams {
        temperature: 0.9,
        seed: 42,
        ..SamplingParams::default()
    };
    v.push(seeded);
    let mut seeded2 = raw("seeded2", "Temperature of tank 2 is", 30);
    seeded2.sampling = SamplingParams {
        temperature: 0.7,
        top_k: 5,
        seed: 7,
        ..SamplingParams::default()
    };
    v.push(seeded2);
    let mut chat = Request::new(
        "chat",
        "scada",
        Prompt::Chat(vec![ChatMessage::new("user", "Status of the boiler?")]),
    );
    chat.max_tokens = 20;
    v.push(chat);
    let mut fmt = raw("format", "Reading:", 16);
    fmt.format = Some(Format::Shape(Arc::new(Shape::Regex(
        "[0-9]{1,3}\\.[0-9]".into(),
    ))));
    v.push(fmt);
    v
}

/// An answer as a front end sees it: the text events joined, and the last event.
struct Answer {
    streamed: String,
    last: Event,
}

fn read(mut t: Ticket) -> JoinHandle<Answer> {
    std::thread::spawn(move || {
        let mut streamed = String::new();
        loop {
            match t.blocking_recv() {
                Some(Event::Text(c)) => streamed.push_str(&c),
                Some(last) => return Answer { streamed, last },
                None => panic!("{}: the ticket ended without a last event", t.id()),
            }
        }
    })
}

fn done(id: &str, a: &Answer) -> Done {
    match &a.last {
        Event::Done(d) => {
            assert_eq!(
                a.streamed, d.text,
                "{id}: the streamed text is not the answer's"
            );
            (**d).clone()
        }
        other => panic!("{id}: expected an answer, got {other:?}"),
    }
}

/// Each request answered by itself, one after the other.
fn alone(h: &Handle, reqs: &[Request]) -> BTreeMap<String, Done> {
    reqs.iter()
        .map(|r| {
            let a = read(h.submit(r.clone()).unwrap()).join().unwrap();
            (r.id.clone(), done(&r.id, &a))
        })
        .collect()
}

/// Waits until the worker is held at `t`'s first event (its ticket full, nobody reading).
fn held(h: &Handle, t: &Ticket) {
    let until = Instant::now() + Duration::from_secs(30);
    while !(h.running_count() >= 1 && t.waiting() == 1) {
        assert!(Instant::now() < until, "the worker never filled {}", t.id());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// All of `reqs` at once, in this order: the first holds the worker until the rest are queued.
fn together(h: &Handle, reqs: &[Request]) -> BTreeMap<String, Done> {
    let first = h.submit(reqs[0].clone()).unwrap();
    held(h, &first);
    let mut readers = vec![(reqs[0].id.clone(), read(first))];
    for r in &reqs[1..] {
        readers.push((r.id.clone(), read(h.submit(r.clone()).unwrap())));
    }
    readers
        .into_iter()
        .map(|(id, j)| {
            let a = j.join().unwrap();
            let d = done(&id, &a);
            (id, d)
        })
        .collect()
}

fn same(what: &str, got: &BTreeMap<String, Done>, want: &BTreeMap<String, Done>) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (id, w) in want {
        let g = &got[id];
        assert_eq!(g.generated_ids, w.generated_ids, "{what}: {id}'s tokens");
        assert_eq!(g.text, w.text, "{what}: {id}'s text");
        assert_eq!(g.finish_reason, w.finish_reason, "{what}: {id}'s finish");
        assert_eq!(g.valid, w.valid, "{what}: {id}'s validity");
        assert_eq!(g.usage.prompt_tokens, w.usage.prompt_tokens, "{what}: {id}");
    }
}

/// A permutation of 0..n from `seed` (a small LCG: the orders are the same every run).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    for i in (1..n).rev() {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.swap(i, (x >> 33) as usize % (i + 1));
    }
    v
}

#[test]
fn synthetic_answers_decoded_together_are_the_answers_alone() {
    let model = synth_model();
    let reqs = requests();
    let one = service(&model, 1, 1, Sessions::None);
    let want = alone(&one.handle(), &reqs);
    drop(one);
    // The format's answer is one the grammar took to its end; the others ran their course.
    assert_eq!(
        want["format"].valid,
        Some(true),
        "{:?}",
        want["format"].text
    );
    for (threads, max_batch) in [(1, 4), (2, 4), (2, 3), (1, 8)] {
        let svc = service(&model, max_batch, threads, Sessions::None);
        let h = svc.handle();
        for round in 0..3u64 {
            let order: Vec<Request> = shuffled(reqs.len(), round * 31 + threads as u64)
                .into_iter()
                .map(|i| reqs[i].clone())
                .collect();
            let steps = h.counters().batched_steps.load(Ordering::Relaxed);
            let got = together(&h, &order);
            let what = format!("threads {threads}, batch {max_batch}, round {round}");
            same(&what, &got, &want);
            let batched = h.counters().batched_steps.load(Ordering::Relaxed) - steps;
            assert!(
                batched >= 10,
                "{what}: only {batched} steps decoded several answers"
            );
        }
        // Every answer has left the batch (each leaves just after its last event).
        let until = Instant::now() + Duration::from_secs(10);
        while h.running_count() > 0 {
            assert!(
                Instant::now() < until,
                "{} answers never left",
                h.running_count()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        svc.shutdown(Duration::from_secs(5));
    }
}

#[test]
fn synthetic_a_cancelled_answer_leaves_the_batch_and_the_others_go_on() {
    let model = synth_model();
    let reqs = vec![
        raw("a", "Line 1 pressure", 60),
        raw("b", "Line 2 flow rate and the valve positions of the", 60),
        raw("c", "Line 3", 60),
    ];
    let want = alone(&service(&model, 1, 1, Sessions::None).handle(), &reqs);
    for id in ["a", "b", "c"] {
        assert_eq!(want[id].finish_reason, FinishReason::Length, "{id}");
    }
    let svc = service(&model, 4, 2, Sessions::None);
    let h = svc.handle();
    let first = h.submit(reqs[0].clone()).unwrap();
    held(&h, &first);
    let b = h.submit(reqs[1].clone()).unwrap();
    let b_cancel = b.canceller();
    let c = h.submit(reqs[2].clone()).unwrap();
    let (a, c) = (read(first), read(c));
    // b is cancelled after its third piece of text, while a and c are decoded beside it.
    let b = std::thread::spawn(move || {
        let mut b = b;
        let mut pieces = 0;
        let mut streamed = String::new();
        loop {
            match b.blocking_recv() {
                Some(Event::Text(t)) => {
                    streamed.push_str(&t);
                    pieces += 1;
                    if pieces == 3 {
                        b_cancel.cancel();
                    }
                }
                Some(last) => return Answer { streamed, last },
                None => panic!("b ended without a last event"),
            }
        }
    });
    let (a, b, c) = (a.join().unwrap(), b.join().unwrap(), c.join().unwrap());
    assert_eq!(done("a", &a).generated_ids, want["a"].generated_ids);
    assert_eq!(done("c", &c).generated_ids, want["c"].generated_ids);
    // Its text holds the piece whose sending found it cancelled: what was streamed is a
    // beginning of it.
    let b = match b.last {
        Event::Done(d) if d.text.starts_with(&b.streamed) => d,
        other => panic!("b: {other:?} after {:?}", b.streamed),
    };
    assert_eq!(b.finish_reason, FinishReason::Cancelled);
    assert!(b.generated_ids.len() < want["b"].generated_ids.len());
    assert_eq!(
        b.generated_ids[..],
        want["b"].generated_ids[..b.generated_ids.len()]
    );
    assert_eq!(h.counters().cancelled.load(Ordering::Relaxed), 1);
}

/// `f`'s result; when it takes longer than `limit` (an answer that never ends), the test
/// process exits with a failure naming `what`: a panic would wait for the stuck worker.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|e| {
        // Straight to stderr: the test harness's capture is lost when the process exits.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{what}: the answers did not all end within {limit:?} ({e})"
        );
        std::process::exit(101)
    })
}

/// A chat turn in named session `session`.
fn turn(id: &str, session: &str, text: &str) -> Request {
    let mut r = Request::new(
        id,
        "hmi",
        Prompt::Chat(vec![ChatMessage::new("user", text)]),
    );
    r.session = Some(session.parse().unwrap());
    r.max_tokens = 12;
    r
}

/// A state directory of its own, holding `resident` sessions in RAM.
fn store(dir: &std::path::Path, model: &Model, resident: u64) -> Sessions {
    let cfg = EngineConfig {
        n_ctx: N_CTX,
        ..Default::default()
    };
    let per_session = edgellm::engine::session_kv_bytes(model, &cfg).unwrap();
    Sessions::Dir(edgellm::engine::store::StoreConfig {
        dir: dir.to_owned(),
        ram_bytes: resident * per_session,
        disk_bytes: 64 << 20,
        max_sessions: None,
    })
}

/// Named sessions are decoded together as scratch ones are: a session's turns continue its own
/// cache and conversation, and every answer is the one it gets alone. A turn of a session
/// another answer of the batch holds waits for it; so does a session the store has no room for
/// in RAM (two resident here, three sessions), and it comes back from its file.
#[test]
fn synthetic_named_sessions_decoded_together_are_the_sessions_alone() {
    let model = synth_model();
    let rounds: Vec<Vec<Request>> = vec![
        vec![
            turn("a1", "hmi-1", "Boiler 4?"),
            turn("b1", "hmi-2", "Pump 7 flow"),
            raw("x", "Boiler 1 pressure", 30),
            turn("a2", "hmi-1", "And boiler 5?"),
            turn("c1", "hmi-3", "Valve V-12 position, please"),
        ],
        vec![
            turn("c2", "hmi-3", "Why?"),
            turn("b2", "hmi-2", "And pump 8 flow"),
            turn("a3", "hmi-1", "Thanks"),
            raw("y", "Boiler 2", 20),
        ],
    ];
    let want: Vec<BTreeMap<String, Done>> = {
        let dir = tempfile::tempdir().unwrap();
        let svc = service_chunked(&model, 1, 1, store(dir.path(), &model, 2), WHOLE);
        rounds.iter().map(|r| alone(&svc.handle(), r)).collect()
    };
    // Each session's turns went on from its conversation: the later ones restored positions.
    for id in ["a2", "a3", "b2", "c2"] {
        let w = want.iter().find_map(|round| round.get(id)).unwrap();
        assert_eq!(w.finish_reason, FinishReason::Length, "{id}");
        assert!(w.usage.restored_tokens > 0, "{id}: {:?}", w.usage);
    }
    for threads in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let svc = service_chunked(&model, 4, threads, store(dir.path(), &model, 2), WHOLE);
        let h = svc.handle();
        let (mut evicted, mut restored) = (0, 0);
        for (round, (reqs, want)) in rounds.iter().zip(&want).enumerate() {
            let steps = h.counters().batched_steps.load(Ordering::Relaxed);
            let what = format!("threads {threads}, round {round}");
            let got = within(Duration::from_secs(60), &what, {
                let (h, reqs) = (h.clone(), reqs.clone());
                move || together(&h, &reqs)
            });
            same(&what, &got, want);
            for (id, w) in want {
                let (g, w) = (got[id].session.as_ref(), w.session.as_ref());
                assert_eq!(g.map(|s| s.turn), w.map(|s| s.turn), "{what}: {id}'s turn");
                assert_eq!(
                    g.map(|s| (s.saved, s.tokens)),
                    w.map(|s| (s.saved, s.tokens)),
                    "{what}: {id}'s file"
                );
                if let Some(st) = got[id].session.as_ref().and_then(|s| s.status.as_ref()) {
                    evicted = evicted.max(st.evicted_ram);
                    restored = restored.max(st.restored);
                }
            }
            let batched = h.counters().batched_steps.load(Ordering::Relaxed) - steps;
            assert!(
                batched >= 5,
                "{what}: only {batched} steps decoded several answers"
            );
        }
        // A third session came while two were held: the least recently used one went to its
        // file and came back from it.
        assert!(
            evicted > 0 && restored > 0,
            "{what}: evicted {evicted}, restored {restored}",
            what = format!("threads {threads}")
        );
        svc.shutdown(Duration::from_secs(5));
    }
}

#[test]
fn real_model_chats_together_are_the_chats_alone() {
    let model =
        Arc::new(Model::load(&common::model_path("q4_0"), &LoadOptions::default()).unwrap());
    let reqs: Vec<Request> = [
        "What is the boiling point of water?",
        "Name a primary colour.",
        "Say hello to the operator in one short sentence, please.",
        "2+2=",
        "What does a PLC do?",
    ]
    .iter()
    .enumerate()
    .map(|(i, q)| {
        let mut r = Request::new(
            format!("q{i}"),
            "plc",
            Prompt::Chat(vec![ChatMessage::new("user", *q)]),
        );
        r.max_tokens = 24;
        r
    })
    .collect();
    let want = alone(
        &service_chunked(&model, 1, 2, Sessions::None, WHOLE).handle(),
        &reqs,
    );
    let svc = service_chunked(&model, 4, 2, Sessions::None, WHOLE);
    let h = svc.handle();
    let got = together(&h, &reqs);
    same("SmolLM2 Q4_0", &got, &want);
    assert!(h.counters().batched_steps.load(Ordering::Relaxed) >= 10);
}
