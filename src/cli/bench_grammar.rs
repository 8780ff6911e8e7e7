//! `edgellm bench --grammar FILE`: what an answer format costs. The same chat prompt is
//! answered unconstrained (a fixed number of tokens) and under the format, at each thread
//! count; the table gives both decode rates, their ratio, the constraint's cost per sampled
//! token (the check, and the mask when the token is refused: mean and p99) as a share of an
//! unconstrained decode step, and what finding the forced tokens cost per forced token.

use edgellm::engine::constraint::{Grammars, Limits, Shape};
use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::model::Model;
use edgellm::tokenizer::ChatMessage;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;

/// What the grammar benchmark needs from `bench`'s options.
pub struct Opts<'a> {
    pub model_path: &'a Path,
    pub model: Arc<Model>,
    pub file: &'a Path,
    pub configs: Vec<EngineConfig>,
    pub n_gen: usize,
    pub reps: usize,
    pub json: bool,
}

/// The question every run answers: an alarm report, which most schemas of a plant can hold.
const QUESTION: &str = "Report this alarm in the requested format: motor 3 on line 2, current \
                        12.5 A against a limit of 10 A, bearing temperature 95 C and rising, \
                        operator on site.";

/// A JSON file is a JSON Schema; anything else a Lark grammar.
fn shape_of(file: &Path) -> Result<Shape, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if file.extension().is_some_and(|e| e == "json") {
        let v = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not JSON: {e}", file.display()))?;
        Ok(Shape::JsonSchema(v))
    } else {
        Ok(Shape::Lark(text))
    }
}

pub fn run(o: Opts<'_>) -> Result<(), String> {
    let shape = shape_of(o.file)?;
    let tok = &o.model.tokenizer;
    let template = o.model.chat_template().map_err(|e| e.to_string())?;
    let r = template
        .render_protected(None, &[ChatMessage::new("user", QUESTION)], true)
        .map_err(|e| e.to_string())?;
    let prompt = tok.encode_protected(&r.text, true, &r.ranges());
    let t0 = std::time::Instant::now();
    let grammars = Grammars::new(&o.model, Limits::default())?;
    let tables_ms = t0.elapsed().as_secs_f64() * 1000.0;
    let mut rows = Vec::new();
    for cfg in o.configs {
        let threads = cfg.threads;
        let mut e = Engine::new(Arc::clone(&o.model), cfg).map_err(|e| e.to_string())?;
        let (mut free, mut shaped) = (Vec::new(), Vec::new());
        let mut last = None;
        // One warm-up of each, then the repetitions.
        for rep in 0..=o.reps {
            let params = GenParams {
                max_tokens: o.n_gen,
                top_logits: 0,
            };
            let mut s = e.new_session();
            let mut sampler = Sampler::new(SamplingParams::default(), o.model.hp.n_vocab);
            let out = e
                .generate(
                    &mut s,
                    &prompt,
                    &params,
                    &mut sampler,
                    &|_| false,
                    &mut |_| true,
                )
                .map_err(|e| e.to_string())?;
            let mut s = e.new_session();
            let mut sampler = Sampler::new(SamplingParams::default(), o.model.hp.n_vocab);
            sampler.constrain(
                grammars
                    .compile(&shape, o.n_gen)
                    .map_err(|e| e.to_string())?,
            );
            let is_eog = |t: u32| tok.is_eog(t);
            let c = e
                .generate(&mut s, &prompt, &params, &mut sampler, &is_eog, &mut |_| {
                    true
                })
                .map_err(|e| e.to_string())?;
            if rep > 0 {
                free.push(out.timings.decode_tps);
                shaped.push(c.timings.decode_tps);
            }
            last = Some(c);
        }
        let c = last.ok_or("no run")?;
        let stats = c.constraint.clone().unwrap_or_default();
        let free_tps = mean(&free);
        let step_us = 1e6 / free_tps.max(f64::MIN_POSITIVE);
        rows.push(json!({
            "threads": threads,
            "tg_tps": free_tps,
            "constrained_tps": mean(&shaped),
            "ratio": mean(&shaped) / free_tps,
            "tokens": c.generated.len(),
            "valid": c.valid,
            "sampled": stats.steps,
            "masks": stats.masks,
            "compile_ms": stats.compile_ms,
            "mask_mean_us": stats.mean_us,
            "mask_p99_us": stats.p99_us,
            "mask_mean_of_step": stats.mean_us / step_us,
            "mask_p99_of_step": stats.p99_us / step_us,
            "forced": stats.forced,
            "forced_us_per_token": stats.forced_us / stats.forced.max(1) as f64,
            "text": String::from_utf8_lossy(&tok.decode(&c.generated)),
        }));
    }
    if o.json {
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    println!(
        "model: {}  format: {} ({})  vocabulary tables: {tables_ms:.0} ms",
        o.model_path.display(),
        o.file.display(),
        shape.kind()
    );
    println!(
        "| threads | tg t/s | constrained t/s | ratio | tokens (sampled, masked) | check mean µs | \
         p99 µs | mean of a step | p99 of a step | forced | µs a forced token | compile ms |"
    );
    println!("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {} ({}, {}){} | {:.1} | {:.1} | {:.2}% | {:.2}% | {} | {:.1} | {:.1} |",
            r["threads"],
            r["tg_tps"].as_f64().unwrap_or(0.0),
            r["constrained_tps"].as_f64().unwrap_or(0.0),
            r["ratio"].as_f64().unwrap_or(0.0),
            r["tokens"],
            r["sampled"],
            r["masks"],
            if r["valid"] == json!(true) {
                ""
            } else {
                " invalid"
            },
            r["mask_mean_us"].as_f64().unwrap_or(0.0),
            r["mask_p99_us"].as_f64().unwrap_or(0.0),
            100.0 * r["mask_mean_of_step"].as_f64().unwrap_or(0.0),
            100.0 * r["mask_p99_of_step"].as_f64().unwrap_or(0.0),
            r["forced"],
            r["forced_us_per_token"].as_f64().unwrap_or(0.0),
            r["compile_ms"].as_f64().unwrap_or(0.0),
        );
    }
    if let Some(r) = rows.last() {
        println!("\nanswer: {}", r["text"].as_str().unwrap_or(""));
    }
    Ok(())
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}
