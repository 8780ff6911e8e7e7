//! Weights packed at load (the interleaved layout of `avx512vnni`, `dotprod` and `i8mm`)
//! change no answer: an engine on a packing path gives, bit for bit, the logits of the same
//! arithmetic over the file's layout (`avx2`, `neon`), decoding's fused q|k|v and gate|up
//! products included, and a packed model still serves engines of other paths.

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

fn specs() -> Vec<SynthSpec> {
    let mut v = Vec::new();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for tied in [true, false] {
            // 304 rows of output: packed (tied, the embedding lookup reads the packed copy);
            // 300: the output stays in the file's layout, the layers are packed.
            for n_vocab in [304, 300] {
                v.push(SynthSpec {
                    weight_type: ty,
                    tied,
                    n_vocab,
                    seed: 3 + n_vocab as u64,
                    ..Default::default()
                });
            }
        }
    }
    // Biases on q/k/v, added after the fused q|k|v product of decoding.
    v.push(SynthSpec {
        arch: "qwen2",
        biases: true,
        n_head_kv: 1,
        n_vocab: 304,
        seed: 9,
        ..Default::default()
    });
    v
}

/// Each path with packed products, and a path of the same arithmetic over the file's layout:
/// `avx512vnni`'s integer sums are `avx2`'s bits, and every ARM path computes the pair form of
/// `neon/dot.rs` (base NEON has no packed products).
fn pairs() -> Vec<(&'static Kernels, &'static Kernels)> {
    [
        (Path::Avx512Vnni, Path::Avx2),
        (Path::Dotprod, Path::Neon),
        (Path::I8mm, Path::Neon),
    ]
    .into_iter()
    .filter_map(|(p, q)| Some((Kernels::for_path(p).ok()?, Kernels::for_path(q).ok()?)))
    .collect()
}

#[test]
fn packed_weights_give_the_bits_of_the_files_layout() {
    let pairs = pairs();
    if pairs.is_empty() {
        eprintln!("engine_packed: no path with packed products on this CPU; nothing to compare");
        return;
    }
    for (packing, plain) in pairs {
        assert!(packing.packed.is_some() && plain.packed.is_none());
        for spec in specs() {
            let what = format!("{} vs {} {spec:?}", packing.name(), plain.name());
            let model = Arc::new(synth_model(&spec));
            let want = logits(&model, plain, 1);
            assert!(
                model.packed().is_none(),
                "{what}: the plain engine packed the model"
            );
            for threads in [1, 2, 3] {
                let got = logits(&model, packing, threads);
                same_bits(&format!("{what} {threads} threads"), &got, &want);
            }
            // Every layer matrix is packed, and the output when its rows are whole groups of 8.
            let (n, _) = model.packed().expect("the packing engine packs").stats();
            let per_layer = 7 * model.hp.n_layer;
            let output = usize::from(spec.n_vocab % 8 == 0);
            assert_eq!(n, per_layer + output, "{what}: packed matrices");
            // The packed model still serves a path that reads the file's layout.
            same_bits(
                &format!("{what}, plain after packing"),
                &logits(&model, plain, 2),
                &want,
            );
        }
        eprintln!(
            "engine_packed: {} (packed) gives the bits of {}",
            packing.name(),
            plain.name()
        );
    }
}

#[test]
fn a_packed_model_serves_the_reference_path_unchanged() {
    let Some(&(packing, _)) = pairs().first() else {
        eprintln!("engine_packed: no path with packed products on this CPU; nothing to compare");
        return;
    };
    let reference = Kernels::for_path(Path::Reference).unwrap();
    let spec = SynthSpec {
        weight_type: GgmlType::Q4_0,
        n_vocab: 304,
        ..Default::default()
    };
    let fresh = Arc::new(synth_model(&spec));
    let want = logits(&fresh, reference, 1);
    let packed = Arc::new(synth_model(&spec));
    logits(&packed, packing, 2);
    assert!(packed.packed().is_some());
    same_bits(
        "reference on a packed model",
        &logits(&packed, reference, 2),
        &want,
    );
}

/// A model that would not fit packed in the memory available stays in the file's layout,
/// and a packing path then runs over that layout: its own unpacked bits.
#[test]
fn without_room_to_pack_the_file_layout_serves() {
    let Some(&(packing, _)) = pairs().first() else {
        eprintln!("engine_packed: no path with packed products on this CPU; nothing to compare");
        return;
    };
    let spec = SynthSpec {
        weight_type: GgmlType::Q4_1,
        n_vocab: 304,
        ..Default::default()
    };
    let roomy = Arc::new(synth_model(&spec));
    let want = logits(&roomy, packing, 1);
    assert!(roomy.packed().is_some_and(|p| p.stats().0 > 0));
    let tight = Arc::new(synth_model(&spec));
    assert!(!tight.pack_within(1, Some(1024)), "packed into 1 KiB");
    assert_eq!(tight.packed().map(|p| p.stats().0), Some(0));
    // The engine's own call to pack finds the decision made.
    let got = logits(&tight, packing, 2);
    same_bits("file layout on a packing path", &got, &want);
}
