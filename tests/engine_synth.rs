//! The fast engine against the golden scalar forward pass, on tiny synthetic models of every
//! weight type and flavour, and its determinism across thread counts and chunk sizes.

use edgellm::engine::{Engine, EngineConfig};
use edgellm::gguf::GgmlType;
use edgellm::kv::KvType;
use edgellm::model::Model;
use edgellm::model::golden::golden_logits;
use edgellm::model::synth::{SynthSpec, synth_model};
use kernels_neon::{Kernels, Path};
use std::sync::Arc;

fn tokens(n: usize, n_vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % n_vocab) as u32).collect()
}

fn engine(model: &Arc<Model>, threads: usize, chunk: usize, kv_type: KvType) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 64,
        chunk,
        threads,
        kv_type,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).expect("engine")
}

/// `max |a - b| / max(1, max |b|)`.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

fn specs() -> Vec<SynthSpec> {
    let mut v = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::F16,
    ] {
        v.push(SynthSpec {
            weight_type: ty,
            ..Default::default()
        });
    }
    // The formats of Q4_K_M and Q5_K_M files: 256-value superblocks need wider rows.
    for ty in [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        v.push(SynthSpec {
            weight_type: ty,
            n_embd: 256,
            n_ff: 512,
            seed: 13,
            ..Default::default()
        });
    }
    v.push(SynthSpec {
        tied: false,
        seed: 5,
        ..Default::default()
    });
    v.push(SynthSpec {
        arch: "qwen2",
        biases: true,
        n_head_kv: 1,
        seed: 9,
        ..Default::default()
    });
    // Gemma 3: q/k norms, post norms, GeGLU, scaled embedding, a window of 4 on layers 0-4 (the
    // prompts are 20+ tokens) and wider heads than n_embd / n_head.
    v.push(SynthSpec::gemma3());
    v.push(SynthSpec {
        weight_type: GgmlType::Q8_0,
        n_head: 4,
        n_head_kv: 2,
        head_dim: Some(32),
        sliding_window: 7,
        seed: 21,
        ..SynthSpec::gemma3()
    });
    v
}

/// With the reference kernels the engine performs the golden pass's arithmetic in the same
/// order, so logits after each token (fed one at a time, or in chunks) agree to 1e-5.
#[test]
fn engine_on_reference_kernels_matches_the_golden_forward_pass() {
    for spec in specs() {
        let model = Arc::new(synth_model(&spec));
        for kv_type in [KvType::F16, KvType::F32] {
            let toks = tokens(20, spec.n_vocab);
            let golden = golden_logits(&model, &toks, kv_type);
            let cfg = EngineConfig {
                n_ctx: 64,
                chunk: 8,
                threads: 2,
                kv_type,
                max_batch: 1,
            };
            let k = Kernels::for_path(Path::Reference).unwrap();
            let mut e = Engine::with_kernels(Arc::clone(&model), cfg, k).unwrap();
            let mut s = e.new_session();
            for (i, &t) in toks.iter().enumerate() {
                let got = e.feed(&mut s, &[t]).unwrap().to_vec();
                let err = rel_err(&got, &golden[i]);
                assert!(
                    err < 1e-5,
                    "{spec:?} kv {kv_type}: token {i}: relative error {err}"
                );
            }
            // The same prompt in chunks of 8 (3 chunks, the last partial) ends at the same logits.
            let mut s = e.new_session();
            let got = e.feed(&mut s, &toks).unwrap().to_vec();
            let err = rel_err(&got, &golden[toks.len() - 1]);
            assert!(
                err < 1e-5,
                "{spec:?} kv {kv_type}: chunked prompt: relative error {err}"
            );
        }
    }
}

/// The SIMD paths sum in other orders; an activation that lands on a rounding boundary of the
/// Q8 quantizer can then round the other way, a discrete step of up to 1/127 of the block's
/// largest value. So: a looser bound, and the same greedy token.
#[test]
fn engine_on_every_kernel_path_stays_close_to_the_golden_pass() {
    for spec in specs() {
        let model = Arc::new(synth_model(&spec));
        let toks = tokens(20, spec.n_vocab);
        let golden = golden_logits(&model, &toks, KvType::F16);
        for p in Path::available() {
            let cfg = EngineConfig {
                n_ctx: 64,
                chunk: 8,
                threads: 2,
                kv_type: KvType::F16,
                max_batch: 1,
            };
            let mut e =
                Engine::with_kernels(Arc::clone(&model), cfg, Kernels::for_path(p).unwrap())
                    .unwrap();
            let mut s = e.new_session();
            for (i, &t) in toks.iter().enumerate() {
                let got = e.feed(&mut s, &[t]).unwrap().to_vec();
                let err = rel_err(&got, &golden[i]);
                assert!(
                    err < 3e-2,
                    "{spec:?} path {p}: token {i}: relative error {err}"
                );
                let (a, b) = (argmax(&got), argmax(&golden[i]));
                let margin = golden[i][b] - golden[i][a];
                assert!(
                    a == b || margin < 2.0 * err * 1f32.max(golden[i][b].abs()),
                    "{spec:?} path {p}: token {i}: argmax {a} != {b}"
                );
            }
        }
    }
}

fn argmax(v: &[f32]) -> usize {
    edgellm::engine::sampler::argmax(v)
}

/// Every row is computed whole by one thread, so logits are bit-identical for any thread count
/// and for any split of the prompt into chunks of the same size.
#[test]
fn logits_are_bit_identical_across_thread_counts() {
    for spec in specs() {
        let model = Arc::new(synth_model(&spec));
        let toks = tokens(23, spec.n_vocab);
        let run = |threads: usize| {
            let mut e = engine(&model, threads, 16, KvType::F16);
            let mut s = e.new_session();
            let mut out = e.feed(&mut s, &toks).unwrap().to_vec();
            for t in [5u32, 17, 3] {
                out.extend_from_slice(e.feed(&mut s, &[t]).unwrap());
            }
            out
        };
        let one = run(1);
        for threads in [2, 3, 5] {
            let other = run(threads);
            assert!(
                one.iter()
                    .zip(&other)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{spec:?}: {threads} threads differ from 1"
            );
        }
    }
}

#[test]
fn prompts_beyond_the_context_or_vocabulary_are_errors_not_panics() {
    let spec = SynthSpec::default();
    let model = Arc::new(synth_model(&spec));
    let mut e = engine(&model, 1, 8, KvType::F16);
    let mut s = e.new_session();
    let e1 = e
        .feed(&mut s, &tokens(65, spec.n_vocab))
        .unwrap_err()
        .to_string();
    assert!(e1.contains("65 positions") && e1.contains("64"), "{e1}");
    let e2 = e
        .feed(&mut s, &[spec.n_vocab as u32])
        .unwrap_err()
        .to_string();
    assert!(e2.contains("outside the vocabulary"), "{e2}");
    assert!(e.feed(&mut s, &[]).is_err());
    // The session is still usable after the errors.
    assert!(e.feed(&mut s, &[3, 4]).is_ok());
    assert_eq!(s.tokens(), &[3, 4]);
}

/// Sampling with a temperature and a seed: the same tokens whatever the thread count, and the
/// same tokens again on a rerun; another seed gives another sequence.
#[test]
fn seeded_sampling_is_reproducible_across_thread_counts() {
    use edgellm::engine::{GenParams, Sampler, SamplingParams};
    let spec = SynthSpec::default();
    let model = Arc::new(synth_model(&spec));
    let prompt = tokens(9, spec.n_vocab);
    let run = |threads: usize, seed: u64| {
        let mut e = engine(&model, threads, 4, KvType::F16);
        let mut s = e.new_session();
        let params = SamplingParams {
            temperature: 1.2,
            top_k: 0,
            top_p: 0.98,
            min_p: 0.0,
            repeat_penalty: 1.1,
            seed,
            ..Default::default()
        };
        let mut sampler = Sampler::new(params, spec.n_vocab);
        let gp = GenParams {
            max_tokens: 40,
            top_logits: 0,
        };
        e.generate(&mut s, &prompt, &gp, &mut sampler, &|_| false, &mut |_| {
            true
        })
        .unwrap()
        .generated
    };
    let a = run(1, 42);
    assert_eq!(a.len(), 40);
    assert_eq!(a, run(2, 42), "1 vs 2 threads");
    assert_eq!(a, run(3, 42), "1 vs 3 threads");
    assert_ne!(a, run(1, 43), "another seed, the same 40 tokens");
}

/// Sliding-window layers keep a ring of their recent positions, shifted as a session grows:
/// through prompts fed in pieces of every size, shifts and rewinds (within the ring's slack,
/// and deeper, which starts again from position 0), the logits stay the golden pass's, whose
/// cache holds every position.
#[test]
fn sliding_window_rings_match_the_golden_pass_through_shifts_and_rewinds() {
    // The two Gemma specs: windows of 4 and 7.
    for spec in specs().into_iter().filter(|s| s.arch == "gemma3") {
        let model = Arc::new(synth_model(&spec));
        let window = spec.sliding_window;
        let n = 60;
        let toks = tokens(n, spec.n_vocab);
        let golden = golden_logits(&model, &toks, KvType::F16);
        let cfg = EngineConfig {
            n_ctx: 64,
            chunk: 8,
            threads: 2,
            kv_type: KvType::F16,
            max_batch: 1,
        };
        let k = Kernels::for_path(Path::Reference).unwrap();
        let mut e = Engine::with_kernels(Arc::clone(&model), cfg, k).unwrap();
        let mut s = e.new_session();
        assert!(s.kv.ring() < n / 2, "window {window}: ring {}", s.kv.ring());
        let mut at = 0;
        for piece in [1, 3, 8, 13, 2, 9, 1, 1, 7, 15] {
            let got = e.feed(&mut s, &toks[at..at + piece]).unwrap().to_vec();
            at += piece;
            let err = rel_err(&got, &golden[at - 1]);
            assert!(
                err < 1e-5,
                "window {window}: after {at}: relative error {err}"
            );
        }
        assert_eq!(at, n);
        assert!(s.kv.window_base() > 0, "window {window}: the ring shifted");
        for back in [1, 4, window, window + 8, 2 * window + 9, 30] {
            let mut s = e.new_session();
            e.feed(&mut s, &toks).unwrap();
            let m = s.truncate(n - back);
            assert!(
                m == n - back || m == 0,
                "window {window}: rewind by {back} kept {m}"
            );
            if back <= window {
                assert_eq!(
                    m,
                    n - back,
                    "window {window}: a rewind by {back} is in the slack"
                );
            }
            if back > s.kv.ring() {
                assert_eq!(m, 0, "window {window}: a rewind by {back} is past the ring");
            }
            // Another continuation from there.
            let mut other = toks[..n - back].to_vec();
            other.extend((0..back).map(|i| ((i * 53 + 7) % spec.n_vocab) as u32));
            let want = golden_logits(&model, &other, KvType::F16);
            let got = e.feed(&mut s, &other[m..]).unwrap().to_vec();
            let err = rel_err(&got, &want[n - 1]);
            assert!(
                err < 1e-5,
                "window {window}: rewind by {back} (kept {m}): error {err}"
            );
        }
    }
}

/// `feed_each` hands over, for every position asked for, the bits `feed` returns after that
/// token: on every kernel path, with the vocabulary cut into ragged slices (517 is no multiple
/// of the slice length nor of a packed group) or in whole packed groups (300), and when the
/// last chunk of the prefix is a single token (the fused decode products).
#[test]
fn every_positions_logits_are_the_bits_feed_returns_after_that_token() {
    let mut specs = specs();
    specs.push(SynthSpec {
        n_vocab: 517,
        seed: 33,
        ..Default::default()
    });
    for spec in specs {
        let model = Arc::new(synth_model(&spec));
        let toks = tokens(25, spec.n_vocab);
        for p in Path::available() {
            let cfg = EngineConfig {
                n_ctx: 64,
                chunk: 8,
                threads: 2,
                kv_type: KvType::F16,
                max_batch: 1,
            };
            let k = Kernels::for_path(p).unwrap();
            let mut e = Engine::with_kernels(Arc::clone(&model), cfg, k).unwrap();
            let mut room = vec![0.0; e.logits_room()];
            let mut s = e.new_session();
            let mut all = Vec::new();
            e.feed_each(&mut s, &toks, 5, &mut room, |i, l| {
                all.push((i, l.to_vec()))
            })
            .unwrap();
            assert_eq!(s.tokens(), &toks[..], "every token is fed");
            let at: Vec<usize> = all.iter().map(|(i, _)| *i).collect();
            assert_eq!(at, (5..25).collect::<Vec<_>>());
            for (i, got) in all {
                let mut s = e.new_session();
                let want = e.feed(&mut s, &toks[..=i]).unwrap();
                assert!(
                    got.iter()
                        .zip(want.iter())
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{spec:?} path {p}: position {i} differs from feed"
                );
            }
        }
    }
}

#[test]
fn feed_each_refuses_a_room_too_small_for_a_pass() {
    let spec = SynthSpec::default();
    let model = Arc::new(synth_model(&spec));
    let mut e = engine(&model, 1, 8, KvType::F16);
    let mut room = vec![0.0; e.logits_room() - 1];
    let mut s = e.new_session();
    let err = e
        .feed_each(&mut s, &tokens(9, spec.n_vocab), 0, &mut room, |_, _| {})
        .unwrap_err();
    assert!(err.to_string().contains("logits room"), "{err}");
}
