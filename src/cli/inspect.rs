//! `edgellm inspect MODEL`: what a GGUF file holds and what it will cost in memory.

use super::CliResult;
use super::common::{ModelArgs, ModelFile, NoThreads};
use edgellm::gguf::{GgmlType, Gguf, OpenOptions};
use edgellm::model::HParams;
use serde_json::json;
use std::collections::BTreeMap;

/// Show a model's architecture, sizes, quant types, tokenizer, chat template and the memory it
/// needs at a given context length.
#[derive(clap::Args)]
#[command(after_help = "\
Memory estimate = weights (the tensor data, mmapped) + KV cache (2 x layers x ctx x kv heads x \
head dim x the --kv-type's bytes; a sliding-window layer holds a ring of 2 x window - 1 + \
max(chunk, window / 2) positions instead of ctx) + activations for a chunk of --chunk tokens and the logits. \
With --batch B (the daemon's model.max_batch), B answers are decoded together, each with a KV \
cache of its own and a row of logits: the estimate counts B of them and says what each slot \
beyond the first costs. \
The file is only mapped, not read, so inspecting a large model is instant; the metadata is \
not trusted: a size that would not fit is reported as an overflow.

Examples:
  edgellm inspect smollm2-135m-q4_0.gguf --ctx 4096
  edgellm inspect qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --ctx 2048 --batch 4
  edgellm inspect -m smollm2-135m-q4_0.gguf --json")]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs<NoThreads, ModelFile>,
    /// Also list every metadata key (arrays shown by type and length).
    #[arg(long)]
    metadata: bool,
    /// Also list every tensor.
    #[arg(long)]
    tensors: bool,
    /// Print as JSON.
    #[arg(long)]
    json: bool,
    /// Answers decoded together (the daemon's model.max_batch): count a KV cache and a row of
    /// logits for each.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=edgellm::engine::MAX_BATCH as i64))]
    batch: u32,
}

/// The parts of the memory estimate, in bytes. Checked arithmetic: the counts come from an
/// untrusted file and the command line.
struct Memory {
    weights: u64,
    /// One session's KV cache.
    kv: u64,
    activations: u64,
    /// One row of logits.
    logits: u64,
    /// Answers decoded together: a KV cache and a row of logits each.
    batch: u64,
    total: u64,
}

impl Memory {
    /// What each answer of a batch beyond the first adds.
    fn per_extra_slot(&self) -> u64 {
        self.kv + self.logits
    }
}

fn product(xs: &[u64]) -> Option<u64> {
    xs.iter().try_fold(1u64, |p, &x| p.checked_mul(x))
}

fn sum(xs: impl IntoIterator<Item = u64>) -> Option<u64> {
    xs.into_iter().try_fold(0u64, |s, x| s.checked_add(x))
}

/// `None` if a size overflows 64 bits.
fn memory(
    h: &HParams,
    weights: u64,
    a: &ModelArgs<NoThreads, ModelFile>,
    batch: u64,
) -> Option<Memory> {
    let u = |v: usize| v as u64;
    let ctx = u(a.ctx);
    let kv = edgellm::kv::KvCache::bytes_for(
        h.n_layer,
        a.ctx,
        h.kv_dim(),
        a.kv_type,
        h.kv_window(),
        a.chunk,
    )?;
    // Per token in flight (f32): residual + 2 norm/attention outputs, q, k, v, the two FFN
    // hidden vectors and one row of attention scores per head.
    let per_token = sum([
        product(&[3, u(h.n_embd)])?,
        u(h.q_dim()),
        product(&[2, u(h.kv_dim())])?,
        product(&[2, u(h.n_ff)])?,
        product(&[u(h.n_head), ctx])?,
    ])?;
    let activations = product(&[4, u(a.chunk), per_token])?;
    let logits = product(&[4, u(h.n_vocab)])?;
    Some(Memory {
        weights,
        kv,
        activations,
        logits,
        batch,
        total: sum([
            weights,
            product(&[batch, kv])?,
            activations,
            product(&[batch, logits])?,
        ])?,
    })
}

/// What the estimate says when a size does not fit.
const OVERFLOW: &str = "overflow (the sizes do not fit in 64 bits)";

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

pub fn run(a: Args) -> CliResult {
    let path = a.model.path();
    let g = Gguf::open(
        path,
        &OpenOptions::new().hint(edgellm::gguf::AccessHint::Random),
    )?;
    let in_file = |e: edgellm::gguf::GgufError| e.in_file(path);
    let m = g.metadata();
    let arch = m
        .opt_str("general.architecture")
        .map_err(in_file)?
        .unwrap_or("?")
        .to_string();

    // The reader keeps every tensor inside the file and apart from the others, so their sizes
    // add up to at most the file's; the element counts are checked all the same.
    let overflow = || format!("{}: tensor sizes overflow 64 bits", path.display());
    let mut by_type: BTreeMap<GgmlType, (u64, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ty).or_default();
        e.0 += 1;
        e.1 = e.1.checked_add(t.size).ok_or_else(overflow)?;
    }
    let weights = sum(g.tensors().iter().map(|t| t.size)).ok_or_else(overflow)?;
    let n_params = sum(g.tensors().iter().map(|t| t.n_elements())).ok_or_else(overflow)?;

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

    let h = HParams::describe(m, n_vocab as usize).map_err(|e| e.to_string());
    let mem = h
        .as_ref()
        .ok()
        .map(|h| memory(h, weights, &a.model, u64::from(a.batch)));
    // Shown only when the file says it (HParams assumes 2048 otherwise).
    let n_ctx_train = h.as_ref().ok().and_then(|h| {
        m.opt_u64(&format!("{arch}.context_length"))
            .ok()
            .flatten()
            .map(|_| h.n_ctx_train)
    });
    // Tensor types first (a file we could run after `edgellm quantize`), then the graph.
    let runnable = g
        .check_all_runnable()
        .map_err(|e| e.to_string())
        .and_then(|()| {
            HParams::from_metadata(m, n_vocab as usize)
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .err();

    if a.json {
        let types: serde_json::Map<_, _> = by_type
            .iter()
            .map(|(t, (n, b))| (t.name().to_string(), json!({"n_tensors": n, "bytes": b})))
            .collect();
        let mut v = json!({
            "file": path,
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
                "n_ctx_train": n_ctx_train,
            });
        }
        let sizes = json!({"ctx": a.model.ctx, "chunk": a.model.chunk,
                           "kv_type": a.model.kv_type.to_string(), "batch": a.batch});
        match &mem {
            Some(Some(mm)) => {
                v["memory"] = sizes;
                v["memory"]["weights"] = json!(mm.weights);
                v["memory"]["kv_cache"] = json!(mm.kv);
                v["memory"]["activations"] = json!(mm.activations);
                v["memory"]["logits"] = json!(mm.logits);
                v["memory"]["per_extra_slot"] = json!(mm.per_extra_slot());
                v["memory"]["total"] = json!(mm.total);
            }
            Some(None) => {
                v["memory"] = sizes;
                v["memory"]["error"] = json!(OVERFLOW);
            }
            None => {}
        }
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }

    println!(
        "file:          {} ({}, GGUF v{})",
        path.display(),
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
            if let Some(c) = n_ctx_train {
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
    let (ctx, chunk, kv_type) = (a.model.ctx, a.model.chunk, a.model.kv_type);
    let at = match a.batch {
        1 => format!("ctx {ctx} (chunk {chunk})"),
        b => format!("ctx {ctx} (chunk {chunk}, batch {b})"),
    };
    if let (Some(None), Ok(_)) = (&mem, &h) {
        println!("memory at {at}: {OVERFLOW}");
    }
    if let (Some(Some(mm)), Ok(h)) = (&mem, &h) {
        println!("memory at {at}:");
        println!(
            "  weights      {:>12}  (tensor data, mmapped: shared and evictable unless --mlock)",
            mib(mm.weights)
        );
        // Layers that hold every position, and (with a window) those that hold a ring.
        let window = h.kv_window();
        let sliding = edgellm::kv::Window::sliding_layers(window, h.n_layer);
        let (ring, _) = edgellm::kv::ring_shape(ctx, window, chunk);
        let positions = if sliding == 0 {
            format!("{} layers x {ctx} ctx", h.n_layer)
        } else {
            format!(
                "({} layers x {ctx} ctx + {sliding} sliding-window layers x {ring})",
                h.n_layer - sliding
            )
        };
        let slots = match mm.batch {
            1 => String::new(),
            b => format!("{b} x "),
        };
        println!(
            "  KV cache     {:>12}  ({slots}{kv_type}: 2 x {positions} x {} kv heads x {} head dim x {} B)",
            mib(mm.kv.saturating_mul(mm.batch)),
            h.n_head_kv,
            h.head_dim,
            kv_type.bytes()
        );
        println!(
            "  activations  {:>12}  (f32, {chunk} tokens in flight, incl. attention scores)",
            mib(mm.activations),
        );
        println!(
            "  logits       {:>12}  ({slots}f32 x {} vocab)",
            mib(mm.logits.saturating_mul(mm.batch)),
            h.n_vocab
        );
        println!("  total        {:>12}", mib(mm.total));
        println!(
            "  per extra batch slot {} (its KV cache {} + its logits {})",
            mib(mm.per_extra_slot()),
            mib(mm.kv),
            mib(mm.logits)
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
