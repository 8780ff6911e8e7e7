//! Batch invariance: a session decoded in one step with other sessions ([`Engine::decode`])
//! gets, bit for bit, the logits it gets decoded alone, whatever the sessions beside it, their
//! order in the step, the batch size, the prompts processed between steps and the thread
//! count; so greedy and seeded answers do not depend on who else the appliance is serving.
//!
//! Each session's run alone is the reference: its prompt fed, then one token at a time. The
//! same sessions then run together: they arrive in a shuffled order, each prompt fed in pieces
//! of random sizes between decoding steps, and each step takes a shuffled subset of the running
//! sessions, of every size from 1 to the engine's batch.

mod common;

use edgellm::engine::{Engine, EngineConfig, Sampler, SamplingParams, Session};
use edgellm::gguf::GgmlType;
use edgellm::kv::KvType;
use edgellm::model::synth::{SynthSpec, synth_model};
use edgellm::model::{LoadOptions, Model};
use kernels_neon::{Kernels, Path};
use std::sync::Arc;

/// A small deterministic generator for the schedules (xorshift).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// The bits of a step's logits, folded (FNV-1a over each float's bits) with the token taken.
fn digest(logits: &[f32], tok: u32) -> (u64, u32) {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for x in logits {
        h = (h ^ u64::from(x.to_bits())).wrapping_mul(0x100_0000_01b3);
    }
    (h, tok)
}

/// How tokens are chosen: greedy, or sampled with a seed of the session's own.
#[derive(Clone, Copy)]
enum Pick {
    Greedy,
    Seeded(u64),
}

fn sampler(pick: Pick, n_vocab: usize, session: usize) -> Sampler {
    let params = match pick {
        Pick::Greedy => SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        Pick::Seeded(seed) => SamplingParams {
            temperature: 0.9,
            top_k: 40,
            seed: seed + session as u64,
            ..Default::default()
        },
    };
    Sampler::new(params, n_vocab)
}

/// Each session's steps alone: the digest of the logits after its prompt and after each of
/// `steps` tokens it then decodes.
fn alone(e: &mut Engine, prompts: &[Vec<u32>], steps: usize, pick: Pick) -> Vec<Vec<(u64, u32)>> {
    let n_vocab = e.model().hp.n_vocab;
    let mut all = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let mut smp = sampler(pick, n_vocab, i);
        let mut s = e.new_session();
        let mut run = Vec::new();
        let mut logits = e.feed(&mut s, prompt).unwrap().to_vec();
        for _ in 0..=steps {
            let tok = smp.sample(&mut logits, s.tokens());
            run.push(digest(&logits, tok));
            if run.len() > steps {
                break;
            }
            logits = e.feed(&mut s, &[tok]).unwrap().to_vec();
        }
        all.push(run);
    }
    all
}

/// The same sessions together: arrivals and step compositions from `seed`.
fn together(
    e: &mut Engine,
    prompts: &[Vec<u32>],
    steps: usize,
    pick: Pick,
    seed: u64,
) -> Vec<Vec<(u64, u32)>> {
    let n_vocab = e.model().hp.n_vocab;
    let (batch, chunk) = (e.config().max_batch, e.config().chunk);
    let mut rng = Lcg(seed | 1);
    let n = prompts.len();
    let mut arrivals: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut arrivals);
    let mut sessions: Vec<Session> = (0..n).map(|_| e.new_session()).collect();
    let mut samplers: Vec<Sampler> = (0..n).map(|i| sampler(pick, n_vocab, i)).collect();
    let mut runs: Vec<Vec<(u64, u32)>> = vec![Vec::new(); n];
    // The token each running session decodes next.
    let mut next: Vec<Option<u32>> = vec![None; n];
    let mut arrived = 0;
    // The prompt being fed, a piece between two steps: its session and the tokens fed so far.
    let mut feeding: Option<(usize, usize)> = None;
    let mut guard = 0;
    while runs.iter().any(|r| r.len() <= steps) {
        guard += 1;
        assert!(guard < 100 * n * (steps + 1), "the schedule does not end");
        // A prompt arrives when nothing runs, or one time in three; it goes in pieces of 1 to
        // a chunk's tokens, one piece before each step.
        let running: Vec<usize> = (0..n).filter(|&i| next[i].is_some()).collect();
        if feeding.is_none() && arrived < n && (running.is_empty() || rng.below(3) == 0) {
            feeding = Some((arrivals[arrived], 0));
            arrived += 1;
        }
        if let Some((i, fed)) = feeding {
            let end = (fed + 1 + rng.below(chunk)).min(prompts[i].len());
            let logits = e.feed(&mut sessions[i], &prompts[i][fed..end]).unwrap();
            feeding = Some((i, end));
            if end == prompts[i].len() {
                let mut logits = logits.to_vec();
                let tok = samplers[i].sample(&mut logits, sessions[i].tokens());
                runs[i].push(digest(&logits, tok));
                next[i] = (runs[i].len() <= steps).then_some(tok);
                feeding = None;
            }
        }
        if running.is_empty() {
            continue;
        }
        // A shuffled subset of the running sessions, of 1 to `batch`.
        let mut chosen = running;
        rng.shuffle(&mut chosen);
        chosen.truncate(1 + rng.below(batch.min(chosen.len())));
        let toks: Vec<u32> = chosen.iter().map(|&i| next[i].unwrap()).collect();
        let mut refs: Vec<(usize, &mut Session)> = sessions
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| chosen.contains(i))
            .collect();
        refs.sort_by_key(|(i, _)| chosen.iter().position(|c| c == i));
        let mut refs: Vec<&mut Session> = refs.into_iter().map(|(_, s)| s).collect();
        let logits = e.decode(&mut refs, &toks).unwrap();
        for (row, &i) in logits.chunks_exact_mut(n_vocab).zip(&chosen) {
            let history = sessions_tokens(&refs, &chosen, i);
            let tok = samplers[i].sample(row, &history);
            runs[i].push(digest(row, tok));
            next[i] = (runs[i].len() <= steps).then_some(tok);
        }
    }
    runs
}

/// The tokens of session `i` among the step's `refs` (listed in `chosen`'s order).
fn sessions_tokens(refs: &[&mut Session], chosen: &[usize], i: usize) -> Vec<u32> {
    let at = chosen.iter().position(|&c| c == i).unwrap();
    refs[at].tokens().to_vec()
}

fn engine(model: &Arc<Model>, k: &'static Kernels, threads: usize, batch: usize) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 96,
        chunk: 8,
        threads,
        kv_type: KvType::F16,
        max_batch: batch,
    };
    Engine::with_kernels(Arc::clone(model), cfg, k).expect("engine")
}

/// Prompts of different lengths (a few over a chunk), so the sessions sit at different
/// positions in every step.
fn prompts(n_vocab: usize, n: usize) -> Vec<Vec<u32>> {
    (0..n)
        .map(|i| {
            (0..3 + 5 * i)
                .map(|j| ((j * 31 + i * 17 + 7) % n_vocab) as u32)
                .collect()
        })
        .collect()
}

fn same_runs(what: &str, got: &[Vec<(u64, u32)>], want: &[Vec<(u64, u32)>]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "{what}: session {i}: steps");
        for (step, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(
                a, b,
                "{what}: session {i}, step {step}: logits digest and token batched {a:?}, alone {b:?}"
            );
        }
    }
}

fn specs() -> Vec<SynthSpec> {
    let mut v: Vec<SynthSpec> = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0]
        .into_iter()
        .map(|ty| SynthSpec {
            weight_type: ty,
            n_vocab: 304,
            seed: 21,
            ..Default::default()
        })
        .collect();
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
        v.push(SynthSpec {
            weight_type: ty,
            n_embd: 256,
            n_ff: 512,
            n_vocab: 304,
            seed: 23,
            ..Default::default()
        });
    }
    // Qwen2's biases; Gemma 3's sliding window (ring caches that shift at different steps).
    v.push(SynthSpec {
        arch: "qwen2",
        biases: true,
        n_head_kv: 1,
        n_vocab: 304,
        seed: 25,
        ..Default::default()
    });
    v.push(SynthSpec {
        n_vocab: 304,
        seed: 27,
        ..SynthSpec::gemma3()
    });
    v
}

/// Every kernel path, every weight format, threads 1 and 3, batches 1 to 4, two schedules,
/// greedy and seeded.
#[test]
fn synthetic_a_sessions_logits_do_not_depend_on_the_batch_it_ran_in() {
    let mut checked = 0;
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        for spec in specs() {
            let model = Arc::new(synth_model(&spec));
            let n_vocab = model.hp.n_vocab;
            let prompts = prompts(n_vocab, 5);
            for pick in [Pick::Greedy, Pick::Seeded(77)] {
                let want = alone(&mut engine(&model, k, 1, 1), &prompts, 9, pick);
                for (threads, batch, seed) in [(1, 4, 3), (3, 4, 11), (2, 2, 5), (1, 3, 8)] {
                    let mut e = engine(&model, k, threads, batch);
                    let got = together(&mut e, &prompts, 9, pick, seed);
                    let what = format!(
                        "{p} {:?} {} threads={threads} batch={batch} seed={seed}",
                        spec.weight_type, spec.arch
                    );
                    same_runs(&what, &got, &want);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 7 * 2 * 4, "only {checked} combinations checked");
}

/// A step that cannot be taken is refused whole: no session moves.
#[test]
fn synthetic_a_step_over_the_batch_or_with_a_bad_token_changes_no_session() {
    let model = Arc::new(synth_model(&SynthSpec::default()));
    let k = Kernels::detect().unwrap();
    let mut e = engine(&model, k, 1, 2);
    let (mut a, mut b, mut c) = (e.new_session(), e.new_session(), e.new_session());
    for s in [&mut a, &mut b, &mut c] {
        e.feed(s, &[5, 6, 7]).unwrap();
    }
    let err = e
        .decode(&mut [&mut a, &mut b, &mut c], &[1, 2, 3])
        .unwrap_err();
    assert!(err.to_string().contains("sized for 2"), "{err}");
    let err = e.decode(&mut [&mut a, &mut b], &[1, 9999]).unwrap_err();
    assert!(err.to_string().contains("9999"), "{err}");
    let err = e.decode(&mut [&mut a, &mut b], &[1]).unwrap_err();
    assert!(err.to_string().contains("one token a session"), "{err}");
    for s in [&a, &b, &c] {
        assert_eq!(s.tokens(), &[5, 6, 7]);
    }
    // A full context is refused too.
    let mut full = e.new_session();
    let long: Vec<u32> = (0..96).map(|i| i % 50 + 3).collect();
    e.feed(&mut full, &long).unwrap();
    let err = e.decode(&mut [&mut a, &mut full], &[1, 2]).unwrap_err();
    assert!(err.to_string().contains("context"), "{err}");
    assert_eq!(a.tokens(), &[5, 6, 7]);
    let cfg = EngineConfig {
        n_ctx: 32,
        chunk: 8,
        threads: 1,
        kv_type: KvType::F16,
        max_batch: 9,
    };
    let err = Engine::with_kernels(Arc::clone(&model), cfg, k)
        .err()
        .unwrap();
    assert!(err.to_string().contains("batch 9"), "{err}");
}

/// The real models: SmolLM2 (Q4_0 and Q8_0), Gemma 3 270M and the Qwen2.5-Coder 0.5B, four
/// sessions greedy and seeded, at 1 and 2 threads.
#[test]
fn real_models_answer_the_same_alone_and_batched() {
    for quant in ["q4_0", "q8_0", common::GEMMA3, common::QWEN_05B] {
        let p = common::model_path(quant);
        let model = Arc::new(Model::load(&p, &LoadOptions::default()).unwrap());
        let k = Kernels::detect().unwrap();
        let n_vocab = model.hp.n_vocab;
        let prompts = prompts(n_vocab, 4);
        let cfg = |threads, batch| EngineConfig {
            n_ctx: 96,
            chunk: 16,
            threads,
            kv_type: KvType::F16,
            max_batch: batch,
        };
        for pick in [Pick::Greedy, Pick::Seeded(5)] {
            let mut e = Engine::with_kernels(Arc::clone(&model), cfg(1, 1), k).unwrap();
            let want = alone(&mut e, &prompts, 12, pick);
            drop(e);
            for (threads, seed) in [(1, 2), (2, 9)] {
                let mut e = Engine::with_kernels(Arc::clone(&model), cfg(threads, 4), k).unwrap();
                let got = together(&mut e, &prompts, 12, pick, seed);
                same_runs(&format!("{quant} threads={threads}"), &got, &want);
            }
        }
    }
}
