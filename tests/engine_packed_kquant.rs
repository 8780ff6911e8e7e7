//! K-quant weights packed at load (`BlockQ4Kx8`, `BlockQ5Kx8`, `BlockQ6Kx8`, on every fast
//! path) change no answer: an engine that packs a Q4_K, Q5_K or Q6_K model gives, bit for bit,
//! the logits of the same path over the file's layout, for prompts (matrix-matrix products)
//! and decoding (its fused q|k|v and gate|up products included), at any thread count.

use edgellm::engine::{Engine, EngineConfig};
use edgellm::gguf::GgmlType;
use edgellm::kv::KvType;
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model};
use kernels_neon::{Kernels, Path};
use std::sync::Arc;

fn logits(model: &Arc<Model>, k: &'static Kernels, threads: usize) -> Vec<f32> {
    let cfg = EngineConfig {
        n_ctx: 64,
        chunk: 8,
        threads,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    let mut e = Engine::with_kernels(Arc::clone(model), cfg, k).expect("engine");
    let mut s = e.new_session();
    let n_vocab = model.hp.n_vocab;
    let prompt: Vec<u32> = (0..13).map(|i| ((i * 37 + 11) % n_vocab) as u32).collect();
    // A prompt (matrix-matrix products over chunks of 8) and then single tokens (decoding).
    let mut out = e.feed(&mut s, &prompt).unwrap().to_vec();
    for t in [5u32, 17, 3, 250] {
        out.extend_from_slice(e.feed(&mut s, &[t]).unwrap());
    }
    out
}

fn same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}: logit {i}: {x} vs {y}");
    }
}

/// Models whose every matrix is one K-quant (widths of whole 256-value blocks), the output
/// tied or not, its rows whole groups of 8 (packed) or not (304 / 300).
fn specs() -> Vec<SynthSpec> {
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
        for (tied, n_vocab) in [(true, 304), (false, 300)] {
            v.push(SynthSpec {
                weight_type: ty,
                n_embd: 256,
                n_ff: 512,
                tied,
                n_vocab,
                seed: 5 + n_vocab as u64,
                ..Default::default()
            });
        }
    }
    // Qwen2's biases after the fused q|k|v product.
    v.push(SynthSpec {
        arch: "qwen2",
        weight_type: GgmlType::Q4_K,
        n_embd: 256,
        n_ff: 512,
        biases: true,
        n_head_kv: 1,
        n_vocab: 304,
        seed: 9,
        ..Default::default()
    });
    v
}

/// `k` without its packed K-quant products: the same arithmetic over the file's layout.
fn unpacked_twin(k: &'static Kernels) -> &'static Kernels {
    let mut twin = *k;
    twin.packed_k = None;
    Box::leak(Box::new(twin))
}

#[test]
fn packed_k_quant_weights_give_the_bits_of_the_files_layout_on_every_path() {
    // Packing K-quants is switched on by the environment, read when a model loads: this test
    // runs itself again as a child with the switch set, rather than change its own
    // environment under threads that may read it.
    if std::env::var_os(edgellm::model::PACK_K_ENV).is_none_or(|v| v != "1") {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "packed_k_quant_weights_give_the_bits_of_the_files_layout_on_every_path",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(edgellm::model::PACK_K_ENV, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "with {}=1:\n{text}",
            edgellm::model::PACK_K_ENV
        );
        assert!(text.contains("1 passed"), "the child ran no test:\n{text}");
    } else {
        every_path_gives_the_files_bits();
    }
}

/// The test's body, run in the child with packing switched on.
fn every_path_gives_the_files_bits() {
    let mut checked = Vec::new();
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        if k.packed_k.is_none() {
            assert_eq!(p, Path::Reference, "{p} has no packed K-quant products");
            continue;
        }
        let plain = unpacked_twin(k);
        for spec in specs() {
            let what = format!(
                "{p} {:?} tied={} vocab={}",
                spec.weight_type, spec.tied, spec.n_vocab
            );
            let file_layout = Arc::new(synth_model(&spec));
            let want = logits(&file_layout, plain, 1);
            assert!(
                file_layout.packed().is_none_or(|p| p.stats().0 == 0),
                "{what}: the engine without packed K-quant products packed them"
            );
            let model = Arc::new(synth_model(&spec));
            for threads in [1, 2, 3] {
                let got = logits(&model, k, threads);
                same_bits(&format!("{what} {threads} threads"), &got, &want);
            }
            let (n, _) = model.packed().expect("the model is packed").stats();
            let output = usize::from(spec.n_vocab % 8 == 0);
            assert_eq!(n, 7 * model.hp.n_layer + output, "{what}: packed matrices");
            // The packed model still serves an engine without packed K-quant products, over
            // the file's layout.
            same_bits(
                &format!("{what}, file layout's engine after packing"),
                &logits(&model, plain, 2),
                &want,
            );
        }
        checked.push(p.name());
    }
    eprintln!(
        "engine_packed_kquant: packed K-quants give the file layout's bits on [{}]",
        checked.join(" ")
    );
}
