//! `edgellm quantize` against llama.cpp: requantizing SmolLM2-135M's Q4_1 file, and Gemma 3
//! 270M's Q4_K_M file (Q8_0, Q5_0, Q4_K and Q6_K tensors), to Q4_0 and Q8_0 must give, for every
//! tensor, the very bytes `llama-quantize --allow-requantize` wrote (sha256 per tensor in
//! tests/data/quantize.json and tests/data/gemma3/quantize.json), and keep the metadata.

mod common;

use common::{GEMMA3, model_path, read_json, sha256_hex};
use edgellm::gguf::{GgmlType, Gguf, GgufWriter, OpenOptions, Value};
use edgellm::quantize::{QuantType, quantize_file};
use kernels_neon::reference as r;
use kernels_neon::{BlockQ4_0, BlockQ4_1, BlockQ8_0, f16};

/// Quantizes the Q4_1 model to `ty` in a temporary directory and compares every tensor with
/// llama.cpp's file `key` of quantize.json; returns the output for further checks.
fn quantize_and_compare(ty: QuantType, key: &str) -> (tempfile::TempDir, Gguf) {
    compare_with_llama_cpp("q4_1", "", 272, ty, key)
}

/// Quantizes model `source` (a [`model_path`] name) to `ty` and compares each of its `n`
/// tensors with llama.cpp's file `key` of `{data}quantize.json`.
fn compare_with_llama_cpp(
    source: &str,
    data: &str,
    n: usize,
    ty: QuantType,
    key: &str,
) -> (tempfile::TempDir, Gguf) {
    let src_path = model_path(source);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(format!("out-{ty}.gguf"));
    let mut calls = 0;
    let summary = quantize_file(&src_path, &out, ty, |p| {
        calls += 1;
        assert_eq!(p.total, n);
        assert!(p.bytes_done <= p.bytes_total);
    })
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(calls, n, "progress once per tensor");
    assert_eq!(summary.n_tensors, n);

    let g = Gguf::open(&out, &OpenOptions::default()).unwrap();
    assert_eq!(summary.bytes_out, g.file_size());
    let want = read_json(&format!("{data}quantize.json"));
    let list = want["files"][key]["tensors"].as_array().unwrap();
    assert_eq!(list.len(), n);
    assert_eq!(g.tensors().len(), n);
    let mut differ = Vec::new();
    for t in list {
        let name = t["name"].as_str().unwrap();
        let info = g.tensor_info(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            info.ty.name(),
            t["type"].as_str().unwrap(),
            "type of {name}"
        );
        assert_eq!(info.size, t["bytes"].as_u64().unwrap(), "size of {name}");
        if sha256_hex(g.tensor_data(info)) != t["sha256"].as_str().unwrap() {
            differ.push(name.to_string());
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {n} {key} tensors differ from llama.cpp's: {differ:?}",
        differ.len()
    );

    // Metadata: everything kept, file type set as llama.cpp sets it.
    let src = Gguf::open(&src_path, &OpenOptions::default()).unwrap();
    let want_ft = read_json(&format!("{data}model.json"))["files"][key]["general.file_type"]
        .as_u64()
        .unwrap();
    assert_eq!(g.metadata().get_u64("general.file_type").unwrap(), want_ft);
    assert_eq!(
        g.metadata()
            .get_u32("general.quantization_version")
            .unwrap(),
        2
    );
    for (k, v) in src.metadata().iter() {
        if k != "general.file_type" {
            assert_eq!(g.metadata().get(k), Some(v), "metadata {k}");
        }
    }
    assert_eq!(g.metadata().len(), src.metadata().len());
    // Tensor order and shapes as in the source.
    for (a, b) in src.tensors().iter().zip(g.tensors()) {
        assert_eq!((&a.name, &a.dims), (&b.name, &b.dims));
    }
    (dir, g)
}

#[test]
fn q4_1_to_q4_0_is_byte_identical_to_llama_quantize() {
    let (_dir, g) = quantize_and_compare(QuantType::Q4_0, "Q4_0");
    assert_eq!(
        g.tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q4_0)
            .count(),
        210
    );
    assert_eq!(
        g.tensor_info("token_embd.weight").unwrap().ty,
        GgmlType::Q8_0
    );
    assert_eq!(
        g.tensor_info("blk.7.attn_norm.weight").unwrap().ty,
        GgmlType::F32
    );
}

#[test]
fn q4_1_to_q8_0_is_byte_identical_to_llama_quantize() {
    let (_dir, g) = quantize_and_compare(QuantType::Q8_0, "Q8_0");
    assert_eq!(
        g.tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q8_0)
            .count(),
        211
    );
}

/// Gemma 3's Q4_K_M file, dequantized through ggml's Q5_0, Q4_K, Q6_K and Q8_0 formulas: one
/// wrong bit in a dequantizer moves some value across a rounding boundary of the requantizer.
#[test]
fn gemma3_q4_k_m_to_q4_0_and_q8_0_is_byte_identical_to_llama_quantize() {
    let (_dir, g) = compare_with_llama_cpp(GEMMA3, "gemma3/", 236, QuantType::Q4_0, "Q4_0");
    assert_eq!(
        g.tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q4_0)
            .count(),
        126
    );
    drop(g);
    let (_dir, g) = compare_with_llama_cpp(GEMMA3, "gemma3/", 236, QuantType::Q8_0, "Q8_0");
    assert_eq!(
        g.tensors()
            .iter()
            .filter(|t| t.ty == GgmlType::Q8_0)
            .count(),
        127
    );
}

/// llama.cpp made the shipped Q4_K_M file: our Q4_K_M plan for it gives every one of its 236
/// tensors the type llama.cpp gave (the Q6_K of the more-bits layers' attn_v and ffn_down,
/// the fallbacks of 640-wide rows to Q5_0 and Q8_0), so requantizing it copies every byte.
#[test]
fn gemma3_q4_k_m_plan_is_llama_cpps_and_requantizing_copies_it() {
    let src = model_path(GEMMA3);
    let g = Gguf::open(&src, &OpenOptions::default()).unwrap();
    let plan = edgellm::quantize::plan(&g, QuantType::Q4KM);
    let wrong: Vec<String> = plan
        .iter()
        .filter(|p| !p.is_copy())
        .map(|p| format!("{}: {} -> {}", p.name, p.from, p.to))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} tensors differ: {wrong:?}",
        wrong.len()
    );
    assert_eq!(plan.len(), 236);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("again.gguf");
    let summary = quantize_file(&src, &out, QuantType::Q4KM, |_| {}).unwrap();
    assert_eq!(summary.n_requantized, 0);
    let again = Gguf::open(&out, &OpenOptions::default()).unwrap();
    for t in g.tensors() {
        let a = again.tensor_info(&t.name).unwrap();
        assert_eq!(g.tensor_data(t), again.tensor_data(a), "{}", t.name);
    }
}

#[test]
fn q4_1_to_q4_1_copies_every_tensor() {
    let (_dir, _g) = quantize_and_compare(QuantType::Q4_1, "Q4_1");
}

/// A synthetic F32 model: each quantized tensor equals the reference quantizer applied to its
/// rows, norms and 1-D tensors are copied, F16 output converts with round-to-nearest-even.
#[test]
fn synthetic_f32_model_follows_the_reference_quantizers() {
    let n = 64 * 8;
    let w: Vec<f32> = (0..n)
        .map(|i| ((i * 2654435761usize) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut gw = GgufWriter::new();
    gw.set_str("general.architecture", "llama")
        .set("general.file_type", Value::U32(0));
    gw.add_f32("blk.0.attn_q.weight", &[64, 8], &w).unwrap();
    gw.add_f32("blk.0.attn_norm.weight", &[64], &w[..64])
        .unwrap();
    gw.add_f32("token_embd.weight", &[64, 8], &w).unwrap();
    gw.add_f32("output.weight", &[64, 8], &w).unwrap();
    gw.add_f32("blk.0.odd.weight", &[48, 2], &w[..96]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f32.gguf");
    gw.write_file(&src).unwrap();

    let out = dir.path().join("q4_0.gguf");
    quantize_file(&src, &out, QuantType::Q4_0, |_| {}).unwrap();
    let g = Gguf::open(&out, &OpenOptions::default()).unwrap();
    let mut q = vec![BlockQ4_0::default(); n / 32];
    r::quantize_row_q4_0_ref(&w, &mut q);
    assert_eq!(
        g.tensor::<BlockQ4_0>("blk.0.attn_q.weight").unwrap(),
        q.as_slice()
    );
    // Untied: the embedding follows the type, the output projection gets Q8_0.
    assert_eq!(
        g.tensor::<BlockQ4_0>("token_embd.weight").unwrap(),
        q.as_slice()
    );
    let mut q8 = vec![BlockQ8_0::default(); n / 32];
    r::quantize_row_q8_0_ref(&w, &mut q8);
    assert_eq!(
        g.tensor::<BlockQ8_0>("output.weight").unwrap(),
        q8.as_slice()
    );
    assert_eq!(g.tensor::<f32>("blk.0.attn_norm.weight").unwrap(), &w[..64]);
    // 48 is not a multiple of 32: F16 fallback.
    let odd: &[f16] = g.tensor("blk.0.odd.weight").unwrap();
    assert!(
        odd.iter()
            .zip(&w[..96])
            .all(|(h, x)| *h == f16::from_f32(*x))
    );
    assert_eq!(g.metadata().get_u32("general.file_type").unwrap(), 2);

    // And on to Q4_1 from the Q4_0 file: dequantize_row_q4_0 then quantize_row_q4_1_ref.
    let out2 = dir.path().join("q4_1.gguf");
    quantize_file(&out, &out2, QuantType::Q4_1, |_| {}).unwrap();
    let g2 = Gguf::open(&out2, &OpenOptions::default()).unwrap();
    let mut x = vec![0f32; n];
    r::dequantize_row_q4_0(&q, &mut x);
    let mut q41 = vec![BlockQ4_1::default(); n / 32];
    r::quantize_row_q4_1_ref(&x, &mut q41);
    assert_eq!(
        g2.tensor::<BlockQ4_1>("blk.0.attn_q.weight").unwrap(),
        q41.as_slice()
    );
    assert_eq!(
        g2.tensor_info("output.weight").unwrap().ty,
        GgmlType::Q8_0,
        "Q8_0 stays, copied"
    );
    assert_eq!(
        g2.tensor_bytes("output.weight").unwrap(),
        g.tensor_bytes("output.weight").unwrap()
    );

    // To f16: everything 2-D becomes F16.
    let out3 = dir.path().join("f16.gguf");
    quantize_file(&src, &out3, QuantType::F16, |_| {}).unwrap();
    let g3 = Gguf::open(&out3, &OpenOptions::default()).unwrap();
    let h: &[f16] = g3.tensor("output.weight").unwrap();
    assert!(h.iter().zip(&w).all(|(h, x)| *h == f16::from_f32(*x)));
    assert_eq!(g3.metadata().get_u32("general.file_type").unwrap(), 1);
}

#[test]
fn unconvertible_tensors_and_bad_inputs_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut gw = GgufWriter::new();
    gw.add_tensor(
        "blk.0.ffn_up.weight",
        GgmlType::Q2_K,
        &[256, 2],
        vec![0; 168],
    )
    .unwrap();
    let src = dir.path().join("k.gguf");
    gw.write_file(&src).unwrap();
    let out = dir.path().join("out.gguf");
    let e = quantize_file(&src, &out, QuantType::Q4_0, |_| {})
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "tensor 'blk.0.ffn_up.weight' has type Q2_K, which edgellm quantize cannot convert"
        ),
        "{e}"
    );
    assert!(!out.exists(), "no partial output");
    assert!(
        !dir.path().join("out.gguf.tmp").exists(),
        "temporary removed"
    );

    let e = quantize_file(&dir.path().join("none.gguf"), &out, QuantType::Q4_0, |_| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("none.gguf: "), "{e}");
}
