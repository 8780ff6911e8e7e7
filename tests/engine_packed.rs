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

fn specs() -> Vec<SynthSpec> {
    let mut v = Vec::new();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
    ] {
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
const PAIRS: [(Path, Path); 3] = [
    (Path::Avx512Vnni, Path::Avx2),
    (Path::Dotprod, Path::Neon),
    (Path::I8mm, Path::Neon),
];

/// The paths `EDGELLM_EXPECT_PATHS` (set by `scripts/test.sh` and `scripts/test-aarch64.sh`
/// per CPU) says this CPU has.
fn expected_paths() -> Vec<Path> {
    let list = std::env::var("EDGELLM_EXPECT_PATHS").unwrap_or_default();
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Path::parse(s).expect("EDGELLM_EXPECT_PATHS names a known path"))
        .collect()
}

/// The pairs of [`PAIRS`] this CPU runs. A packing path that CI expects here and that is
/// missing fails every test (as `kernels_neon/tests/dispatch_walk.rs` does), so that a CPU
/// model that lost a feature cannot turn these tests into the file layout's alone.
fn pairs() -> Vec<(&'static Kernels, &'static Kernels)> {
    let expected = expected_paths();
    PAIRS
        .into_iter()
        .filter_map(|(p, q)| match Kernels::for_path(p) {
            Ok(packing) => {
                let plain = Kernels::for_path(q)
                    .unwrap_or_else(|e| panic!("{p} is available but its plain twin is not: {e}"));
                assert!(
                    packing.packed.is_some() && plain.packed.is_none(),
                    "{p} vs {q}"
                );
                Some((packing, plain))
            }
            Err(e) => {
                assert!(
                    !expected.contains(&p),
                    "EDGELLM_EXPECT_PATHS lists {p}, but {e}"
                );
                None
            }
        })
        .collect()
}

/// The path with packed products these tests run, if this CPU has one; else `None`, and the
/// tests pack the model themselves (packing does not depend on the path) and check what the
/// file-layout paths of this CPU do with it.
fn packing_path() -> Option<&'static Kernels> {
    pairs().first().map(|&(packing, _)| packing)
}

/// Packs `model` as an engine on `packing` does (its engine's own call), or by hand.
fn pack(model: &Arc<Model>, packing: Option<&'static Kernels>) {
    match packing {
        Some(k) => drop(logits(model, k, 2)),
        None => assert!(model.pack_within(2, None), "packing by hand packed nothing"),
    }
    assert!(
        model.packed().is_some_and(|p| p.stats().0 > 0),
        "model not packed"
    );
}

/// Every path of this CPU with packed products is one of [`PAIRS`], so none goes unchecked;
/// each path CI expects here is available.
#[test]
fn every_packing_path_of_this_cpu_is_paired_and_expected_ones_are_here() {
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        let paired = PAIRS.iter().any(|&(q, _)| q == p);
        assert_eq!(k.packed.is_some(), paired, "{p}: packed products vs PAIRS");
    }
    // `pairs` fails where an expected path is missing.
    let pairs = pairs();
    eprintln!(
        "engine_packed: packing paths here: [{}] (expected: {})",
        pairs
            .iter()
            .map(|(k, _)| k.name())
            .collect::<Vec<_>>()
            .join(" "),
        std::env::var("EDGELLM_EXPECT_PATHS").unwrap_or_else(|_| "unset".into())
    );
}

/// On each packing path, for every synthetic model: the logits of its engine (packing the
/// model) are its plain twin's, for 1-3 threads. Where this CPU has no packing path, the model
/// is packed by hand. Either way: every layer matrix is packed (and the output when its rows
/// are whole groups of 8), a plain engine leaves the model unpacked, and still gives its bits
/// on the packed model.
#[test]
fn packed_weights_give_the_bits_of_the_files_layout() {
    let runs: Vec<(Option<&'static Kernels>, &'static Kernels)> = match pairs() {
        p if p.is_empty() => vec![(None, Kernels::for_path(Path::best()).unwrap())],
        p => p.into_iter().map(|(a, b)| (Some(a), b)).collect(),
    };
    for (packing, plain) in runs {
        let packing_name = packing.map_or("packed by hand", |k| k.name());
        for spec in specs() {
            let what = format!("{packing_name} vs {} {spec:?}", plain.name());
            let model = Arc::new(synth_model(&spec));
            let want = logits(&model, plain, 1);
            assert!(
                model.packed().is_none(),
                "{what}: the plain engine packed the model"
            );
            match packing {
                Some(packing) => {
                    for threads in [1, 2, 3] {
                        let got = logits(&model, packing, threads);
                        same_bits(&format!("{what} {threads} threads"), &got, &want);
                    }
                }
                None => pack(&model, None),
            }
            let (n, _) = model.packed().expect("the model is packed").stats();
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
            "engine_packed: {packing_name} gives the bits of {}",
            plain.name()
        );
    }
}

#[test]
fn a_packed_model_serves_the_reference_path_unchanged() {
    let reference = Kernels::for_path(Path::Reference).unwrap();
    let spec = SynthSpec {
        weight_type: GgmlType::Q4_0,
        n_vocab: 304,
        ..Default::default()
    };
    let fresh = Arc::new(synth_model(&spec));
    let want = logits(&fresh, reference, 1);
    assert!(
        fresh.packed().is_none(),
        "the reference engine packed the model"
    );
    let packed = Arc::new(synth_model(&spec));
    pack(&packed, packing_path());
    same_bits(
        "reference on a packed model",
        &logits(&packed, reference, 2),
        &want,
    );
}

/// A model that would not fit packed in the memory available stays in the file's layout,
/// and a packing path then runs over that layout: its own unpacked bits (where this CPU has no
/// packing path, its best path's bits on the packed model).
#[test]
fn without_room_to_pack_the_file_layout_serves() {
    let packing = packing_path();
    let k = packing.unwrap_or_else(|| Kernels::for_path(Path::best()).unwrap());
    let spec = SynthSpec {
        weight_type: GgmlType::Q4_1,
        n_vocab: 304,
        ..Default::default()
    };
    let roomy = Arc::new(synth_model(&spec));
    pack(&roomy, packing);
    let want = logits(&roomy, k, 1);
    let tight = Arc::new(synth_model(&spec));
    assert!(!tight.pack_within(1, Some(1024)), "packed into 1 KiB");
    assert_eq!(tight.packed().map(|p| p.stats().0), Some(0));
    // The engine's own call to pack finds the decision made.
    let got = logits(&tight, k, 2);
    assert_eq!(
        tight.packed().map(|p| p.stats().0),
        Some(0),
        "packed after all"
    );
    same_bits(&format!("file layout on {}", k.name()), &got, &want);
}
