//! Constrained decoding in the engine, on the real models: the lazy check agrees with the full
//! mask, forced tokens fed as a chunk give the tokens stepping gives, answers keep their shape,
//! bits stay the same across thread counts, and hostile constraints are refused.

mod common;

use edgellm::engine::constraint::{ConstraintError, Grammars, Limits, Shape};
use edgellm::engine::{Engine, EngineConfig, FinishReason, GenParams, Sampler, SamplingParams};
use edgellm::kv::KvType;
use edgellm::model::{LoadOptions, Model};
use edgellm::tokenizer::ChatMessage;
use serde_json::json;
use std::sync::Arc;

fn load(name: &str) -> Arc<Model> {
    let p = common::model_path(name);
    Arc::new(Model::load(&p, &LoadOptions::default()).unwrap())
}

fn engine(model: &Arc<Model>, threads: usize) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 512,
        chunk: 64,
        threads,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).unwrap()
}

fn chat(model: &Model, question: &str) -> Vec<u32> {
    let t = model.chat_template().unwrap();
    let r = t
        .render_protected(None, &[ChatMessage::new("user", question)], true)
        .unwrap();
    model.tokenizer.encode_protected(&r.text, true, &r.ranges())
}

struct Answer {
    ids: Vec<u32>,
    text: String,
    finish: FinishReason,
    valid: Option<bool>,
}

fn answer(
    e: &mut Engine,
    g: &Grammars,
    shape: &Shape,
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
    chunks: bool,
) -> Answer {
    answer_with(e, g, shape, prompt, sampling, max_tokens, chunks, false)
}

#[allow(clippy::too_many_arguments)]
fn answer_with(
    e: &mut Engine,
    g: &Grammars,
    shape: &Shape,
    prompt: &[u32],
    sampling: SamplingParams,
    max_tokens: usize,
    chunks: bool,
    always_mask: bool,
) -> Answer {
    let model = Arc::clone(e.model());
    let tok = &model.tokenizer;
    let mut c = g.compile(shape, max_tokens).unwrap();
    c.forced_in_chunks = chunks;
    c.always_mask = always_mask;
    let mut sampler = Sampler::new(sampling, model.hp.n_vocab);
    sampler.constrain(c);
    let mut s = e.new_session();
    let params = GenParams {
        max_tokens,
        top_logits: 0,
    };
    let out = e
        .generate(
            &mut s,
            prompt,
            &params,
            &mut sampler,
            &|t| tok.is_eog(t),
            &mut |_| true,
        )
        .unwrap();
    let text: Vec<u8> = out
        .generated
        .iter()
        .filter(|t| !tok.is_eog(**t))
        .flat_map(|&t| tok.token_to_piece(t).to_vec())
        .collect();
    Answer {
        ids: out.generated,
        text: String::from_utf8(text).unwrap(),
        finish: out.finish,
        valid: out.valid,
    }
}

fn alarm_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "severity": {"type": "integer", "minimum": 0, "maximum": 3},
            "stop_line": {"type": "boolean"},
            "reason": {"type": "string", "enum": ["bearing", "overheat", "sensor", "other"]}
        },
        "required": ["severity", "stop_line", "reason"],
        "additionalProperties": false
    })
}

#[test]
fn json_schema_choice_and_regex_answers_have_their_shape() {
    let model = load("q8_0");
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let mut e = engine(&model, 2);
    let q = chat(
        &model,
        "Alarm: spindle bearing temperature 95 C and rising. Classify it.",
    );
    let a = answer(
        &mut e,
        &g,
        &Shape::JsonSchema(alarm_schema()),
        &q,
        SamplingParams::default(),
        64,
        true,
    );
    eprintln!("json: {:?} {:?}", a.text, a.finish);
    assert_eq!(a.valid, Some(true), "{}", a.text);
    let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
    assert!(
        v["severity"].as_i64().is_some_and(|s| (0..=3).contains(&s)),
        "{v}"
    );
    assert!(v["stop_line"].is_boolean(), "{v}");

    let opts = vec![
        "low".to_string(),
        "medium".into(),
        "high".into(),
        "critical".into(),
    ];
    let a = answer(
        &mut e,
        &g,
        &Shape::Choice(opts.clone()),
        &q,
        SamplingParams::default(),
        16,
        true,
    );
    eprintln!("choice: {:?}", a.text);
    assert_eq!(a.valid, Some(true));
    assert!(opts.contains(&a.text), "{:?}", a.text);

    let a = answer(
        &mut e,
        &g,
        &Shape::Regex("[0-9]{1,3}\\.[0-9]".into()),
        &q,
        SamplingParams::default(),
        16,
        true,
    );
    eprintln!("regex: {:?}", a.text);
    assert_eq!(a.valid, Some(true));
    assert!(regex_like_number(&a.text), "{:?}", a.text);
}

/// Gemma 3's 262k SentencePiece vocabulary: a schema answer has its shape, and forced text the
/// tokenizer cannot spell back (a literal `▁`, which SentencePiece reads as a space) is fed as
/// the vocabulary's byte tokens rather than failing the constraint.
#[test]
fn gemma_answers_have_their_shape_and_forced_text_keeps_its_bytes() {
    let model = load(common::GEMMA3);
    assert!(model.hp.n_vocab > 260_000, "{}", model.hp.n_vocab);
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let mut e = engine(&model, 2);
    let q = chat(
        &model,
        "Alarm: spindle bearing temperature 95 C and rising. Classify it.",
    );
    let a = answer(
        &mut e,
        &g,
        &Shape::JsonSchema(alarm_schema()),
        &q,
        SamplingParams::default(),
        64,
        true,
    );
    assert_eq!(a.valid, Some(true), "{}", a.text);
    let v: serde_json::Value = serde_json::from_str(&a.text).unwrap();
    assert!(v["stop_line"].is_boolean(), "{v}");
    let a = answer(
        &mut e,
        &g,
        &Shape::Regex("(OK|WARN|FAIL) [0-9]{1,3} ▁x".into()),
        &q,
        SamplingParams::default(),
        32,
        true,
    );
    assert_eq!(a.valid, Some(true), "{:?}", a.text);
    assert!(a.text.ends_with(" ▁x"), "{:?}", a.text);
}

/// For 1,000 random (grammar state, token) pairs the lazy check (is this one token allowed?)
/// says what the full mask says, on a 49k and a 151k vocabulary.
#[test]
fn the_lazy_check_agrees_with_the_full_mask() {
    for name in ["q8_0", "qwen2.5-0.5b"] {
        let model = load(name);
        let g = Grammars::new(&model, Limits::default()).unwrap();
        let n_vocab = model.hp.n_vocab as u32;
        let mut rng = edgellm::engine::sampler::Rng::new(7);
        let shapes = [
            Shape::JsonSchema(alarm_schema()),
            Shape::JsonObject,
            Shape::Regex("(ok|fail) [0-9]{2,4}( [a-z]+)?".into()),
            Shape::Choice(vec!["bearing".into(), "belt".into(), "sensor fault".into()]),
        ];
        let (mut pairs, mut allowed) = (0, 0);
        for shape in &shapes {
            // Walk each grammar along random allowed tokens; at every state, check 50 random
            // tokens and 10 of the allowed ones against the mask.
            for _walk in 0..2 {
                let mut c = g.compile(shape, 64).unwrap();
                for _step in 0..4 {
                    if c.is_complete() {
                        break;
                    }
                    let mask = c.mask().unwrap();
                    let ok: Vec<u32> = (0..n_vocab).filter(|&t| mask[t as usize]).collect();
                    let mut probe: Vec<u32> = (0..50)
                        .map(|_| (rng.next_u64() % n_vocab as u64) as u32)
                        .collect();
                    for _ in 0..10 {
                        let i = (rng.next_u64() % ok.len().max(1) as u64) as usize;
                        probe.extend(ok.get(i).copied());
                    }
                    for t in probe {
                        assert_eq!(
                            c.would_take(t).unwrap(),
                            mask[t as usize],
                            "{name} {shape:?} token {t}"
                        );
                        pairs += 1;
                        allowed += usize::from(mask[t as usize]);
                    }
                    let next = ok.iter().copied().find(|t| !model.tokenizer.is_eog(*t));
                    let Some(next) = next else { break };
                    let pick = ok[(rng.next_u64() % ok.len() as u64) as usize];
                    let pick = if model.tokenizer.is_eog(pick) {
                        next
                    } else {
                        pick
                    };
                    c.advance(pick).unwrap();
                }
            }
        }
        eprintln!("{name}: {pairs} pairs, {allowed} allowed");
        assert!(
            pairs >= 1000 / 2 && allowed > 50,
            "{pairs} pairs, {allowed} allowed"
        );
    }
}

/// A pick under a constraint is a pick from the logits with every refused token removed, as
/// the full mask (read token by token) says: greedy, lazily or masking at every token, is the
/// argmax of the allowed logits; a seeded draw that masks is the draw an unconstrained sampler
/// with the same seed makes from the masked logits after its first draw; a lazy seeded draw is
/// an allowed token.
#[test]
fn a_constrained_pick_is_a_pick_from_the_masked_logits() {
    let model = load("q8_0");
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let n = model.hp.n_vocab;
    let mut rng = edgellm::engine::sampler::Rng::new(11);
    let greedy = SamplingParams {
        temperature: 0.0,
        repeat_penalty: 1.0,
        ..SamplingParams::default()
    };
    let seeded = |seed| SamplingParams {
        temperature: 0.9,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        seed,
        ..SamplingParams::default()
    };
    let shapes = [
        Shape::JsonSchema(alarm_schema()),
        Shape::Regex("(ok|fail) [0-9]{2,4}".into()),
        Shape::Choice(vec!["bearing".into(), "belt".into(), "sensor fault".into()]),
    ];
    let mut states = 0;
    for shape in &shapes {
        let mut prefix: Vec<u32> = Vec::new();
        for _step in 0..6 {
            // The constraint in the state `prefix` leads to, fresh for each use.
            let at = || {
                let mut c = g.compile(shape, 64).unwrap();
                for &t in &prefix {
                    c.advance(t).unwrap();
                }
                c
            };
            let mut reference = at();
            if reference.is_complete() {
                break;
            }
            let mask = reference.mask().unwrap();
            // Random logits, with the likeliest tokens mostly refused: the mask decides.
            let logits: Vec<f32> = (0..n).map(|_| rng.next_f32() * 8.0 - 4.0).collect();
            let masked: Vec<f32> = logits
                .iter()
                .zip(&mask)
                .map(|(&l, &ok)| if ok { l } else { f32::NEG_INFINITY })
                .collect();
            let best = edgellm::engine::sampler::argmax(&masked) as u32;
            for always_mask in [false, true] {
                let mut c = at();
                c.always_mask = always_mask;
                let mut s = Sampler::new(greedy.clone(), n);
                s.constrain(c);
                let tok = s.next(&mut logits.clone(), &[]).unwrap();
                assert_eq!(
                    tok, best,
                    "{shape:?} after {prefix:?}, always_mask {always_mask}"
                );
            }
            for seed in [1, 2, 3] {
                let mut c = at();
                c.always_mask = true;
                let mut s = Sampler::new(seeded(seed), n);
                s.constrain(c);
                let tok = s.next(&mut logits.clone(), &[]).unwrap();
                // The refused first draw was made (and its random number used) before the
                // mask: the masked draw is the sampler's second.
                let mut plain = Sampler::new(seeded(seed), n);
                plain.next(&mut logits.clone(), &[]).unwrap();
                let want = plain.next(&mut masked.clone(), &[]).unwrap();
                assert_eq!(tok, want, "{shape:?} after {prefix:?}, seed {seed}");
                let mut s = Sampler::new(seeded(seed), n);
                s.constrain(at());
                let tok = s.next(&mut logits.clone(), &[]).unwrap();
                assert!(
                    mask[tok as usize],
                    "{shape:?}: lazy seeded pick {tok} refused"
                );
            }
            states += 1;
            if model.tokenizer.is_eog(best) {
                break;
            }
            prefix.push(best);
        }
    }
    assert!(states >= 10, "only {states} states");
}

/// Forced tokens fed as one chunk give the tokens that feeding them one step each gives, and
/// a seeded answer is the same at 1 and 2 threads.
#[test]
fn forced_chunks_and_thread_counts_change_no_token() {
    for name in ["q4_0", "qwen2.5-0.5b"] {
        let model = load(name);
        let g = Grammars::new(&model, Limits::default()).unwrap();
        let q = chat(
            &model,
            "Motor 3 current 12.5 A, limit 10 A. Report it as JSON.",
        );
        let schema = Shape::JsonSchema(json!({
            "type": "object",
            "properties": {
                "motor": {"type": "integer"},
                "current_a": {"type": "number"},
                "over_limit": {"type": "boolean"},
                "action": {"type": "string", "maxLength": 40}
            },
            "required": ["motor", "current_a", "over_limit", "action"],
            "additionalProperties": false
        }));
        let seeded = SamplingParams {
            temperature: 0.8,
            seed: 42,
            ..Default::default()
        };
        for sampling in [SamplingParams::default(), seeded] {
            let mut e2 = engine(&model, 2);
            let chunked = answer(&mut e2, &g, &schema, &q, sampling.clone(), 96, true);
            let stepped = answer(&mut e2, &g, &schema, &q, sampling.clone(), 96, false);
            let mut e1 = engine(&model, 1);
            let one_thread = answer(&mut e1, &g, &schema, &q, sampling.clone(), 96, true);
            eprintln!(
                "{name} t={}: {:?} {:?}",
                sampling.temperature, chunked.text, chunked.finish
            );
            assert_eq!(chunked.ids, stepped.ids, "{name}: chunked vs stepped");
            assert_eq!(chunked.ids, one_thread.ids, "{name}: 2 threads vs 1");
            if chunked.valid == Some(true) {
                let v: serde_json::Value = serde_json::from_str(&chunked.text).unwrap();
                assert!(v["over_limit"].is_boolean(), "{v}");
            }
        }
    }
}

/// A greedy answer checked lazily (the sampled token, then the next likeliest ones) is the
/// answer the full mask at every token gives.
#[test]
fn greedy_lazy_checks_pick_what_the_full_mask_picks() {
    for name in ["q4_0", "qwen2.5-0.5b"] {
        let model = load(name);
        let g = Grammars::new(&model, Limits::default()).unwrap();
        let mut e = engine(&model, 2);
        let q = chat(
            &model,
            "Alarm: spindle bearing temperature 95 C and rising. Classify it.",
        );
        let shapes = [
            Shape::JsonSchema(alarm_schema()),
            Shape::Regex("(OK|WARN|FAIL) [0-9]{1,3}".into()),
            Shape::Choice(vec![
                "stop the line".into(),
                "slow down".into(),
                "carry on".into(),
            ]),
        ];
        for shape in &shapes {
            let lazy = answer_with(
                &mut e,
                &g,
                shape,
                &q,
                SamplingParams::default(),
                48,
                true,
                false,
            );
            let full = answer_with(
                &mut e,
                &g,
                shape,
                &q,
                SamplingParams::default(),
                48,
                true,
                true,
            );
            eprintln!("{name}: {:?}", lazy.text);
            assert_eq!(lazy.ids, full.ids, "{name} {shape:?}");
            assert_eq!(lazy.valid, Some(true), "{name} {shape:?}: {:?}", lazy.text);
        }
    }
}

/// A shape that cannot be finished in `max_tokens` ends `length`, marked invalid.
#[test]
fn an_answer_cut_by_max_tokens_is_not_valid() {
    let model = load("q4_0");
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let mut e = engine(&model, 2);
    let q = chat(&model, "Write a long list of machine parts.");
    let shape = Shape::JsonSchema(json!({
        "type": "array", "items": {"type": "string"}, "minItems": 30
    }));
    let a = answer(&mut e, &g, &shape, &q, SamplingParams::default(), 12, true);
    assert_eq!(a.finish, FinishReason::Length);
    assert_eq!(a.valid, Some(false), "{:?}", a.text);
}

/// Hostile constraints are refused with a reason, in bounded time, and the grammars keep
/// compiling good ones afterwards.
#[test]
fn hostile_constraints_are_refused_by_name() {
    let model = load("q4_0");
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let big = Shape::JsonSchema(json!({"type": "string", "description": "x".repeat(1 << 20)}));
    assert!(matches!(g.compile(&big, 8), Err(ConstraintError::TooLarge(m)) if m.contains("bytes")));
    let mut deep = json!({"type": "integer"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    assert!(
        matches!(g.compile(&Shape::JsonSchema(deep), 8), Err(ConstraintError::TooLarge(m)) if m.contains("deep"))
    );
    // A JSON Schema keyword the grammar cannot enforce is refused by name (a keyword no draft
    // knows is an annotation, as validators treat it).
    let unknown = Shape::JsonSchema(json!({
        "type": "array", "items": {"type": "integer"}, "uniqueItems": true, "x-unit": "mm"
    }));
    match g.compile(&unknown, 8) {
        Err(ConstraintError::Invalid(m)) => assert!(m.contains("uniqueItems"), "{m}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    for (rx, what) in [
        ("(a+)+$", "nested repetition"),
        ("(a|aa)*b", "alternation under a star"),
        ("(x{1,1000}){1,1000}y", "a million-state repetition"),
    ] {
        let t0 = std::time::Instant::now();
        let r = g.compile(&Shape::Regex(rx.into()), 8);
        let ms = t0.elapsed().as_millis();
        eprintln!("{what}: {:?} in {ms} ms", r.as_ref().map(|_| ()));
        assert!(ms < 5_000, "{what} took {ms} ms");
    }
    assert!(matches!(
        g.compile(&Shape::Regex("(unclosed".into()), 8),
        Err(ConstraintError::Invalid(_))
    ));
    assert!(matches!(
        g.compile(&Shape::Lark("start: foo".into()), 8),
        Err(ConstraintError::Invalid(_))
    ));
    assert!(matches!(
        g.compile(&Shape::Choice(vec![]), 8),
        Err(ConstraintError::Invalid(_))
    ));
    g.compile(&Shape::JsonSchema(alarm_schema()), 8).unwrap();
}

fn regex_like_number(s: &str) -> bool {
    let (a, b) = s.split_once('.').unwrap_or(("", ""));
    (1..=3).contains(&a.len())
        && a.bytes().all(|c| c.is_ascii_digit())
        && b.len() == 1
        && b.bytes().all(|c| c.is_ascii_digit())
}

/// Constrained greedy ids are the same on x86-64 and aarch64 (`EDGELLM_FORMAT_IDS_OUT` on one,
/// `EDGELLM_FORMAT_IDS_EXPECT` on the other, as scripts/test.sh runs them). Each step here is
/// the reference: the full mask, the masked argmax and its margin over the next allowed token
/// (a near-tie may fall either way on another architecture, and is reported as such); the
/// engine's own constrained answer must be these ids.
#[test]
fn constrained_greedy_ids_are_identical_across_architectures() {
    let model = load("q4_0");
    let g = Grammars::new(&model, Limits::default()).unwrap();
    let tok = &model.tokenizer;
    let mut e = engine(&model, 2);
    let q = chat(
        &model,
        "Alarm: spindle bearing temperature 95 C and rising. Classify it.",
    );
    let cases = [
        ("alarm", Shape::JsonSchema(alarm_schema())),
        (
            "choice",
            Shape::Choice(vec![
                "stop the line".into(),
                "slow down".into(),
                "carry on".into(),
            ]),
        ),
    ];
    let mut all = Vec::new();
    for (id, shape) in &cases {
        let mut c = g.compile(shape, 32).unwrap();
        let mut s = e.new_session();
        let mut logits = e.feed(&mut s, &q).unwrap().to_vec();
        let (mut ids, mut margins) = (Vec::new(), Vec::new());
        while ids.len() < 24 && !c.is_complete() {
            let mask = c.mask().unwrap();
            let mut best: Option<(u32, f32)> = None;
            let mut second = f32::NEG_INFINITY;
            for (t, &l) in logits.iter().enumerate() {
                if !mask[t] {
                    continue;
                }
                match best {
                    Some((_, b)) if l <= b => second = second.max(l),
                    Some((_, b)) => {
                        second = b;
                        best = Some((t as u32, l));
                    }
                    None => best = Some((t as u32, l)),
                }
            }
            let (t, l) = best.expect("an allowed token");
            ids.push(t);
            margins.push(if second == f32::NEG_INFINITY {
                1e9
            } else {
                l - second
            });
            if tok.is_eog(t) {
                break;
            }
            c.advance(t).unwrap();
            logits = e.feed(&mut s, &[t]).unwrap().to_vec();
        }
        let engine_ids = answer(&mut e, &g, shape, &q, SamplingParams::default(), 32, true).ids;
        assert_eq!(
            engine_ids, ids,
            "{id}: the engine's answer vs the reference steps"
        );
        all.push(json!({"id": id, "ids": ids, "margins": margins}));
    }
    if let Some(path) = std::env::var_os("EDGELLM_FORMAT_IDS_OUT") {
        std::fs::write(&path, serde_json::to_string(&all).unwrap()).unwrap();
    }
    if let Some(path) = std::env::var_os("EDGELLM_FORMAT_IDS_EXPECT") {
        let gap = common::vectors::compare_with_other_architecture(&all, &path);
        eprintln!(
            "constrained: {} ids identical to the other architecture's (largest margin \
             difference {gap:e})",
            std::env::consts::ARCH
        );
    }
}
