//! `edgellm bench --batch LIST`: decoding several sessions in one step. For each thread count
//! and batch size B, B sessions (each after a short prompt of its own) decode -n tokens
//! together, and the table gives the aggregate tokens/s, its ratio to batch 1, and its share
//! of the ceiling: a batch cannot decode faster than B sessions decoding at batch 1's rate,
//! nor faster than a prompt is processed (pp, measured in the same run at the same threads),
//! since a batched step is a prompt's matrix products over B tokens.

use edgellm::engine::{Engine, EngineConfig, Session, sampler::argmax};
use edgellm::model::Model;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What the batch benchmark needs from `bench`'s options.
pub struct Opts<'a> {
    pub model_path: &'a Path,
    pub model: Arc<Model>,
    /// One engine configuration per thread count (its context fits the run).
    pub configs: Vec<EngineConfig>,
    pub batches: &'a [usize],
    pub n_prompt: usize,
    pub n_gen: usize,
    pub reps: usize,
    pub json: bool,
}

/// Tokens of each session's own prompt before it decodes (different per session, so the
/// sessions sit at different positions as they would in the field).
pub const SESSION_PROMPT: usize = 16;

pub fn run(o: Opts<'_>) -> Result<(), String> {
    let n_vocab = o.model.hp.n_vocab as u32;
    let widest = o.batches.iter().copied().max().ok_or("--batch: no sizes")?;
    if o.batches.contains(&0) || o.n_gen == 0 {
        return Err("--batch needs sizes of at least 1 and -n of at least 1".into());
    }
    let token = |i: usize| 100 + (i as u32 * 7919) % (n_vocab - 200);
    let prompt: Vec<u32> = (0..o.n_prompt).map(token).collect();
    // Batch 1 first: every other size is measured against it.
    let batches: Vec<usize> = std::iter::once(1)
        .chain(o.batches.iter().copied().filter(|&b| b != 1))
        .collect();
    let mut rows = Vec::new();
    for cfg in o.configs {
        let threads = cfg.threads;
        let cfg = EngineConfig {
            max_batch: widest,
            chunk: cfg.chunk.max(widest),
            ..cfg
        };
        let mut e = Engine::new(Arc::clone(&o.model), cfg).map_err(|e| e.to_string())?;
        let mut sessions: Vec<Session> = (0..widest).map(|_| e.new_session()).collect();
        // pp at these threads: the ceiling's second term.
        let pp = if o.n_prompt > 0 {
            let mut s = e.new_session();
            let mut best = 0.0f64;
            for _ in 0..=o.reps {
                s.truncate(0);
                let t0 = Instant::now();
                e.feed(&mut s, &prompt).map_err(|e| e.to_string())?;
                best = best.max(o.n_prompt as f64 / t0.elapsed().as_secs_f64());
            }
            Some(best)
        } else {
            None
        };
        let mut base = None;
        for &b in &batches {
            let mut tps = Vec::new();
            // One warm-up, then the repetitions.
            for rep in 0..=o.reps {
                let t = decode_run(&mut e, &mut sessions[..b], o.n_gen, token)?;
                if rep > 0 {
                    tps.push(t);
                }
            }
            let mean = tps.iter().sum::<f64>() / tps.len().max(1) as f64;
            // Batch 1's rate, measured first.
            let one = *base.get_or_insert(mean);
            let ceiling = pp.map_or(b as f64 * one, |pp| (b as f64 * one).min(pp));
            rows.push(json!({
                "threads": threads,
                "kernels": e.kernels().name(),
                "batch": b,
                "n_gen": o.n_gen,
                "tps": mean,
                "per_session_tps": mean / b as f64,
                "vs_batch1": mean / one,
                "pp_tps": pp,
                "ceiling_tps": ceiling,
                "of_ceiling": mean / ceiling,
            }));
        }
    }
    if o.json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "model: {}  (each session after a {SESSION_PROMPT}-token prompt of its own; \
         ceiling = min(batch × tg at batch 1, pp{}))",
        o.model_path.display(),
        o.n_prompt
    );
    println!(
        "| threads | kernels | batch | aggregate t/s | per session t/s | × batch 1 | pp t/s | ceiling t/s | of ceiling |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.0}% |",
            r["threads"],
            r["kernels"].as_str().unwrap_or(""),
            r["batch"],
            f(&r["tps"]),
            f(&r["per_session_tps"]),
            f(&r["vs_batch1"]),
            f(&r["pp_tps"]),
            f(&r["ceiling_tps"]),
            100.0 * f(&r["of_ceiling"]),
        );
    }
    Ok(())
}

/// `sessions` each take their prompt, then decode `n` tokens together (greedy); returns the
/// aggregate tokens/s of the decoding.
fn decode_run(
    e: &mut Engine,
    sessions: &mut [Session],
    n: usize,
    token: impl Fn(usize) -> u32,
) -> Result<f64, String> {
    let n_vocab = e.model().hp.n_vocab;
    let mut next = Vec::with_capacity(sessions.len());
    for (i, s) in sessions.iter_mut().enumerate() {
        s.truncate(0);
        let p: Vec<u32> = (0..SESSION_PROMPT)
            .map(|j| token(j * 13 + i * 101))
            .collect();
        let logits = e.feed(s, &p).map_err(|e| e.to_string())?;
        next.push(argmax(logits) as u32);
    }
    let mut refs: Vec<&mut Session> = sessions.iter_mut().collect();
    let t0 = Instant::now();
    for _ in 0..n {
        let logits = e.decode(&mut refs, &next).map_err(|e| e.to_string())?;
        for (t, row) in next.iter_mut().zip(logits.chunks_exact(n_vocab)) {
            *t = argmax(row) as u32;
        }
    }
    Ok((n * sessions.len()) as f64 / t0.elapsed().as_secs_f64())
}
