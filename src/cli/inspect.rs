//! `edgellm inspect MODEL`: what a GGUF file holds and what it will cost in memory.

use super::CliResult;
use edgellm::gguf::{GgmlType, Gguf, Metadata, OpenOptions};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Show a model's architecture, sizes, quant types, tokenizer, chat template and the memory it
/// needs at a given context length.
#[derive(clap::Args)]
#[command(after_help = "\
Memory estimate = weights (the tensor data, mmapped) + KV cache (f16: 2 x layers x ctx x kv heads \
x head dim x 2 bytes) + activations for a prompt batch and the logits. The file is only mapped, \
not read, so inspecting a large model is instant.

Example: edgellm inspect smollm2-135m-q4_0.gguf --ctx 4096")]
pub struct Args {
    /// Model file (.gguf).
    model: PathBuf,
    /// Context length (tokens) for the memory estimate.
    #[arg(long, default_value_t = 2048)]
    ctx: u64,
    /// Tokens per prompt-processing batch, for the activation estimate.
    #[arg(long, default_value_t = 32)]
    batch: u64,
    /// Also list every metadata key (arrays shown by type and length).
    #[arg(long)]
    metadata: bool,
    /// Also list every tensor.
    #[arg(long)]
    tensors: bool,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
}

/// Hyperparameters read from `{arch}.*` keys.
struct Hparams {
    n_layer: u64,
    n_embd: u64,
    n_head: u64,
    n_head_kv: u64,
    head_dim: u64,
    n_ff: u64,
    n_vocab: u64,
    n_ctx_train: Option<u64>,
}

fn hparams(m: &Metadata, arch: &str, n_vocab: u64) -> edgellm::gguf::Result<Hparams> {
    let k = |s: &str| format!("{arch}.{s}");
    let n_embd = m.get_u64(&k("embedding_length"))?;
    let n_head = m.get_u64(&k("attention.head_count"))?;
    let head_dim = match m.opt_u64(&k("attention.key_length"))? {
        Some(d) => d,
        None => n_embd / n_head.max(1),
    };
    Ok(Hparams {
        n_layer: m.get_u64(&k("block_count"))?,
        n_embd,
        n_head,
        n_head_kv: m.opt_u64(&k("attention.head_count_kv"))?.unwrap_or(n_head),
        head_dim,
        n_ff: m.get_u64(&k("feed_forward_length"))?,
        n_vocab,
        n_ctx_train: m.opt_u64(&k("context_length"))?,
    })
}

/// The parts of the memory estimate, in bytes.
struct Memory {
    weights: u64,
    kv: u64,
    activations: u64,
    logits: u64,
}

fn memory(h: &Hparams, weights: u64, ctx: u64, batch: u64) -> Memory {
    let kv = 2 * h.n_layer * ctx * h.n_head_kv * h.head_dim * 2;
    let q_dim = h.n_head * h.head_dim;
    let kv_dim = h.n_head_kv * h.head_dim;
    // Per token in flight (f32): residual + 2 norm/attention outputs, q, k, v, the two FFN
    // hidden vectors and one row of attention scores per head.
    let per_token = 3 * h.n_embd + q_dim + 2 * kv_dim + 2 * h.n_ff + h.n_head * ctx;
    Memory {
        weights,
        kv,
        activations: 4 * batch * per_token,
        logits: 4 * h.n_vocab,
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

pub fn run(a: Args) -> CliResult {
    let g = Gguf::open(
        &a.model,
        &OpenOptions::new().hint(edgellm::gguf::AccessHint::Random),
    )?;
    let in_file = |e: edgellm::gguf::GgufError| e.in_file(&a.model);
    let m = g.metadata();
    let arch = m
        .opt_str("general.architecture")
        .map_err(in_file)?
        .unwrap_or("?")
        .to_string();

    let mut by_type: BTreeMap<GgmlType, (u64, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 += t.size;
    }
    let weights: u64 = g.tensors().iter().map(|t| t.size).sum();
    let n_params: u64 = g.tensors().iter().map(|t| t.n_elements()).sum();
    let runnable = g.check_all_runnable().err().map(|e| e.to_string());

    let tokens = m.opt_array_str("tokenizer.ggml.tokens").map_err(in_file)?;
    let n_vocab = tokens.map_or(0, |t| t.len() as u64);
    let merges = m
        .opt_array_str("tokenizer.ggml.merges")
        .map_err(in_file)?
        .map_or(0, |v| v.len());
    let tok_name = |key: &str| -> Option<(u32, String)> {
        let id = m.opt_u32(key).ok().flatten()?;
        let s = tokens
            .and_then(|t| t.get(id as usize))
            .cloned()
            .unwrap_or_default();
        Some((id, s))
    };
    let bos = tok_name("tokenizer.ggml.bos_token_id");
    let eos = tok_name("tokenizer.ggml.eos_token_id");
    let tok_model = m
        .opt_str("tokenizer.ggml.model")
        .map_err(in_file)?
        .map(str::to_string);
    let tok_pre = m
        .opt_str("tokenizer.ggml.pre")
        .map_err(in_file)?
        .map(str::to_string);
    let template = m.opt_str("tokenizer.chat_template").map_err(in_file)?;
    let file_type = m.opt_u32("general.file_type").map_err(in_file)?;

    let h = hparams(m, &arch, n_vocab);
    let mem = h.as_ref().ok().map(|h| memory(h, weights, a.ctx, a.batch));

    if a.json {
        let types: serde_json::Map<_, _> = by_type
            .iter()
            .map(|(t, (n, b))| (t.name().to_string(), json!({"n_tensors": n, "bytes": b})))
            .collect();
        let mut v = json!({
            "file": a.model,
            "file_bytes": g.file_size(),
            "gguf_version": g.version(),
            "architecture": arch,
            "name": m.opt_str("general.name").ok().flatten(),
            "file_type": file_type,
            "n_tensors": g.tensors().len(),
            "n_params": n_params,
            "tensor_bytes": weights,
            "tensor_types": types,
            "runnable": runnable.is_none(),
            "not_runnable_reason": runnable,
            "tokenizer": {
                "model": tok_model, "pre": tok_pre, "n_tokens": n_vocab, "n_merges": merges,
                "bos": bos, "eos": eos,
            },
            "chat_template": template.is_some(),
        });
        if let Ok(h) = &h {
            v["hparams"] = json!({
                "n_layer": h.n_layer, "n_embd": h.n_embd, "n_head": h.n_head,
                "n_head_kv": h.n_head_kv, "head_dim": h.head_dim, "n_ff": h.n_ff,
                "n_ctx_train": h.n_ctx_train,
            });
        }
        if let Some(mm) = &mem {
            v["memory"] = json!({
                "ctx": a.ctx, "batch": a.batch, "weights": mm.weights, "kv_cache": mm.kv,
                "activations": mm.activations, "logits": mm.logits,
                "total": mm.weights + mm.kv + mm.activations + mm.logits,
            });
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }

    println!(
        "file:          {} ({}, GGUF v{})",
        a.model.display(),
        mib(g.file_size()),
        g.version()
    );
    match m.opt_str("general.name").ok().flatten() {
        Some(n) => println!("architecture:  {arch} ({n})"),
        None => println!("architecture:  {arch}"),
    }
    if let Some(ft) = file_type {
        println!(
            "file type:     {} (general.file_type {ft})",
            file_type_name(ft)
        );
    }
    println!("parameters:    {n_params} ({:.1} M)", n_params as f64 / 1e6);
    match &h {
        Ok(h) => {
            println!(
                "shape:         {} layers, embd {}, heads {} (kv {}), head dim {}, ffn {}, vocab {}",
                h.n_layer, h.n_embd, h.n_head, h.n_head_kv, h.head_dim, h.n_ff, h.n_vocab
            );
            if let Some(c) = h.n_ctx_train {
                println!("train context: {c}");
            }
        }
        Err(e) => println!("shape:         unknown ({e})"),
    }
    println!(
        "tensors:       {} ({} of data)",
        g.tensors().len(),
        mib(weights)
    );
    for (t, (n, b)) in by_type.iter().rev() {
        let s = if *n == 1 { "" } else { "s" };
        println!("  {:<8} {n:>5} tensor{s:<1} {:>12}", t.name(), mib(*b));
    }
    match &runnable {
        None => println!("runnable:      yes"),
        Some(e) => println!("runnable:      no: {e}"),
    }
    let tok = |o: &Option<(u32, String)>| {
        o.as_ref()
            .map_or("-".to_string(), |(i, s)| format!("{i} {s:?}"))
    };
    println!(
        "tokenizer:     {} (pre {}), {n_vocab} tokens, {merges} merges, bos {}, eos {}",
        tok_model.as_deref().unwrap_or("none"),
        tok_pre.as_deref().unwrap_or("-"),
        tok(&bos),
        tok(&eos)
    );
    match template {
        Some(t) => println!("chat template: present ({} bytes)", t.len()),
        None => println!("chat template: absent"),
    }
    if let (Some(mm), Ok(h)) = (&mem, &h) {
        println!("memory at ctx {} (batch {}):", a.ctx, a.batch);
        println!(
            "  weights      {:>12}  (tensor data, mmapped: shared and evictable unless --mlock)",
            mib(mm.weights)
        );
        println!(
            "  KV cache     {:>12}  (f16: 2 x {} layers x {} ctx x {} kv heads x {} head dim x 2 B)",
            mib(mm.kv),
            h.n_layer,
            a.ctx,
            h.n_head_kv,
            h.head_dim
        );
        println!(
            "  activations  {:>12}  (f32, {} tokens in flight, incl. attention scores)",
            mib(mm.activations),
            a.batch
        );
        println!(
            "  logits       {:>12}  (f32 x {} vocab)",
            mib(mm.logits),
            h.n_vocab
        );
        println!(
            "  total        {:>12}",
            mib(mm.weights + mm.kv + mm.activations + mm.logits)
        );
    }
    if a.metadata {
        println!("metadata ({} keys):", m.len());
        for (k, v) in m.iter() {
            println!("  {k} = {v}");
        }
    }
    if a.tensors {
        println!("tensors:");
        for t in g.tensors() {
            println!(
                "  {:<32} {:<6} {:<16} {:>10} B at {}",
                t.name,
                t.ty.name(),
                t.shape_string(),
                t.size,
                g.data_offset() + t.offset
            );
        }
    }
    Ok(())
}

/// llama.cpp's name of a `general.file_type` value.
fn file_type_name(ft: u32) -> &'static str {
    match ft {
        0 => "all F32",
        1 => "mostly F16",
        2 => "mostly Q4_0",
        3 => "mostly Q4_1",
        7 => "mostly Q8_0",
        8 => "mostly Q5_0",
        9 => "mostly Q5_1",
        10 => "mostly Q2_K",
        11..=13 => "mostly Q3_K",
        14 | 15 => "mostly Q4_K",
        16 | 17 => "mostly Q5_K",
        18 => "mostly Q6_K",
        32 => "mostly BF16",
        _ => "other",
    }
}
