//! SmolLM2-135M requantized by `edgellm quantize` into llama.cpp's Q4_K_M mix: the engine runs
//! real weights of the new formats at real shapes. SmolLM2's 576-wide rows are not whole
//! superblocks, so the mix is Q5_0 (most matrices), Q4_K and Q6_K (the 1536-wide `ffn_down`),
//! Q8_0 (the `attn_v` that get more bits, and the tied output).
//!
//! - On the reference kernels the engine is the golden scalar pass (same arithmetic).
//! - On this CPU's best path, greedy ids are the same at 1 and 2 threads, and wherever the
//!   Q8_0 file (the engine's Q8_0 is matched to llama.cpp in `engine_real`) picks its next
//!   token after a prompt by a wide margin, the Q4_K_M file picks the same one.

mod common;

use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::gguf::{GgmlType, Gguf, OpenOptions};
use edgellm::kv::KvType;
use edgellm::model::golden::golden_logits;
use edgellm::model::{LoadOptions, Model};
use edgellm::quantize::{QuantType, quantize_file};
use kernels_neon::{Kernels, Path};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The Q8_0 file requantized to Q4_K_M (in a temporary directory), and its tensor types.
fn q4_k_m() -> (tempfile::TempDir, Arc<Model>, BTreeMap<GgmlType, usize>) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("smollm2-135m-q4_k_m.gguf");
    quantize_file(&common::model_path("q8_0"), &out, QuantType::Q4KM, |_| {})
        .unwrap_or_else(|e| panic!("{e}"));
    let g = Gguf::open(&out, &OpenOptions::default()).unwrap();
    let mut types = BTreeMap::new();
    for t in g.tensors() {
        *types.entry(t.ty).or_insert(0) += 1;
    }
    let model = Model::load(&out, &LoadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    (dir, Arc::new(model), types)
}

fn engine(model: &Arc<Model>, threads: usize, kernels: &'static Kernels) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 128,
        chunk: 16,
        threads,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::with_kernels(Arc::clone(model), cfg, kernels).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn greedy(e: &mut Engine, n_vocab: usize, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = e.new_session();
    // Temperature 0 by default: greedy.
    let mut sampler = Sampler::new(SamplingParams::default(), n_vocab);
    let params = GenParams {
        max_tokens: n,
        top_logits: 0,
    };
    e.generate(
        &mut s,
        prompt,
        &params,
        &mut sampler,
        &|_| false,
        &mut |_| true,
    )
    .unwrap()
    .generated
}

#[test]
fn smollm2_requantized_to_q4_k_m_runs_every_new_format() {
    let (_dir, model, types) = q4_k_m();
    // 30 layers: use_more_bits picks 14 of them for attn_v (Q6_K, falling back to Q8_0 on
    // 576-wide rows) and ffn_down (Q6_K).
    let want: BTreeMap<GgmlType, usize> = [
        (GgmlType::F32, 61),
        (GgmlType::Q5_0, 6 * 30 - 14),
        (GgmlType::Q8_0, 14 + 1),
        (GgmlType::Q4_K, 16),
        (GgmlType::Q6_K, 14),
    ]
    .into();
    assert_eq!(types, want);

    let data = common::read_json("greedy.json");
    let cases = data["cases"].as_array().unwrap();
    // The reference kernels: the golden pass's arithmetic, to 1e-5, at the prompt's end.
    let prompt = ids(&cases[0]["prompt_ids"]);
    let golden = golden_logits(&model, &prompt, KvType::F16);
    let mut e = engine(&model, 2, Kernels::for_path(Path::Reference).unwrap());
    let mut s = e.new_session();
    let got = e.feed(&mut s, &prompt).unwrap().to_vec();
    let last = golden.last().unwrap();
    let scale = last.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(last)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    assert!(
        err < 1e-5,
        "engine on the reference kernels vs golden: {err}"
    );

    // This CPU's best path.
    let best = Kernels::detect().unwrap();
    let q8 = Arc::new(Model::load(&common::model_path("q8_0"), &LoadOptions::default()).unwrap());
    let mut e8 = engine(&q8, 2, best);
    let (mut e1, mut e2) = (engine(&model, 1, best), engine(&model, 2, best));
    let mut checked = 0;
    for (i, c) in cases.iter().enumerate() {
        let prompt = ids(&c["prompt_ids"]);
        let nv = model.hp.n_vocab;
        // Scalar kernels for most matrices still (seconds a token): two cases suffice.
        if i < 2 {
            let a = greedy(&mut e1, nv, &prompt, 6);
            assert_eq!(
                a,
                greedy(&mut e2, nv, &prompt, 6),
                "{}: 1 vs 2 threads",
                c["id"]
            );
        }
        let mut s = e8.new_session();
        let want = edgellm::engine::top_k_logits(e8.feed(&mut s, &prompt).unwrap(), 2);
        let mut s = e2.new_session();
        let got = edgellm::engine::top_k_logits(e2.feed(&mut s, &prompt).unwrap(), 1);
        let margin = want[0].1 - want[1].1;
        eprintln!(
            "{}: next token {} (Q8_0 {}, margin {margin:.2})",
            c["id"], got[0].0, want[0].0
        );
        if margin >= 1.0 {
            assert_eq!(
                got[0].0, want[0].0,
                "{}: next token (Q8_0 margin {margin})",
                c["id"]
            );
            checked += 1;
        }
    }
    assert!(checked >= 4, "only {checked} cases with a wide margin");
}
