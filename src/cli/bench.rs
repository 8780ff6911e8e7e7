//! `edgellm bench`: prompt processing (pp) and token generation (tg) speed, as llama-bench
//! measures them, so the two can be run side by side on the same files.

use super::CliResult;
use super::bench_bw::{PAIR_PASSES, PASSES, Probe, median, paired_shares};
use super::common::{ModelArgs, ThreadList};
use super::profile::{self, Phase};
use edgellm::engine::{Engine, EngineConfig, MAX_CTX, Session};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Measure prompt processing and generation speed (tokens/s), like llama-bench.
#[derive(clap::Args)]
#[command(after_help = "\
pp: a prompt of -p tokens processed from an empty cache. tg: -n tokens decoded one at a time \
from an empty cache. With -d N both start after N tokens already in the cache instead \
(llama-bench's -d): how a long system prompt or conversation slows them. Each is repeated -r \
times after one warm-up; the table shows the mean and standard deviation. The KV cache holds \
--ctx positions, raised to fit -d plus the longer of -p and -n.

Example: edgellm bench -m smollm2-135m-q4_0.gguf -p 128 -n 64 -t 1,2")]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs<ThreadList>,
    /// Prompt length for pp (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 128)]
    n_prompt: usize,
    /// Generated tokens for tg (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 64)]
    n_gen: usize,
    /// Tokens already in the cache when pp and tg start (computed once, not timed).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    depth: usize,
    /// Repetitions per measurement.
    #[arg(short = 'r', long, default_value_t = 3)]
    repetitions: usize,
    /// Print a JSON list of {threads, pp_tps, tg_tps, …} instead of a table.
    #[arg(long)]
    json: bool,
    /// Instead of pp/tg: time to first token for a long prompt computed cold vs restored from
    /// a KV snapshot by a fresh store (page cache dropped), and flash bytes written per turn.
    /// Uses the first --threads value.
    #[arg(long, conflicts_with_all = ["profile", "svg"])]
    restore: bool,
    /// System prompt tokens for --restore (a 16-token question follows).
    #[arg(long, default_value_t = 1000, requires = "restore")]
    restore_prompt: usize,
    /// Directory for --restore's snapshots: put it on the flash to measure (default: the
    /// temporary directory, which is RAM on many devices).
    #[arg(long, requires = "restore")]
    restore_dir: Option<PathBuf>,
    /// After the measurement, run one profiled pp and tg pass per thread count and print a
    /// table per phase of each operation's time (matrix products by tensor, attention, norms,
    /// RoPE, sampling, …); with --json, a "profile" field per row instead.
    #[arg(long)]
    profile: bool,
    /// Also write the profile as an SVG bar chart to this file (implies --profile).
    #[arg(long, value_name = "FILE")]
    svg: Option<PathBuf>,
    /// Also measure the read bandwidth on each thread count (a 256 MiB buffer read before,
    /// between and after the runs; the best pass counts) and report the bound of decoding,
    /// bandwidth / weight bytes per token, and tg as a share of it: the mean tg against the
    /// best probe, and each tg run against the probes just before and after it (their median:
    /// a share measured under the machine's load of the moment).
    #[arg(long, conflicts_with = "restore")]
    bandwidth: bool,
    /// Instead of pp/tg: the cost of an answer format (a JSON Schema file, *.json, or a Lark
    /// grammar): decode t/s of a chat answer unconstrained (-n tokens) and under the format,
    /// their ratio, the format's check per sampled token (mean, p99) against a decode step, and
    /// the cost of finding each token the format forces.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["restore", "profile", "svg", "bandwidth"])]
    grammar: Option<PathBuf>,
    /// Instead of pp/tg: decode several sessions in one step, for each of these batch sizes
    /// (comma-separated, up to 16): aggregate tokens/s of -n tokens a session, against batch 1
    /// and against the ceiling min(batch × tg at batch 1, pp of -p tokens at the same threads).
    #[arg(long, value_name = "LIST", value_delimiter = ',',
          conflicts_with_all = ["restore", "profile", "svg", "bandwidth", "grammar"])]
    batch: Vec<usize>,
}

/// What was measured at one thread count.
struct Row {
    threads: usize,
    kernels: &'static str,
    /// Tokens/s of each pp repetition (none with -p 0).
    pp: Vec<f64>,
    /// Tokens/s of each tg repetition (none with -n 0).
    tg: Vec<f64>,
    /// The profiled pp and tg phases (with --profile or --svg).
    profile: Vec<Phase>,
    /// Best read bandwidth in bytes/s around the runs (with --bandwidth).
    bandwidth: Option<f64>,
    /// Each tg run's share of the bound set by the probes just before and after it.
    paired: Vec<f64>,
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

/// Tokens per second of each repetition of `f` (after one warm-up run); `around` runs before
/// each repetition and after the last, untimed.
fn measure(
    reps: usize,
    tokens: usize,
    mut f: impl FnMut() -> Result<(), String>,
    mut around: impl FnMut(),
) -> Result<Vec<f64>, String> {
    f()?;
    let mut out = Vec::with_capacity(reps);
    for _ in 0..reps {
        around();
        let t0 = Instant::now();
        f()?;
        out.push(tokens as f64 / t0.elapsed().as_secs_f64());
    }
    around();
    Ok(out)
}

pub fn run(a: Args) -> CliResult {
    let model = Arc::new(a.model.load_model()?);
    let threads_list = &a.model.threads.list;
    if a.restore {
        return Ok(super::bench_restore::run(super::bench_restore::Opts {
            model_path: a.model.path(),
            model,
            prompt_tokens: a.restore_prompt,
            threads: threads_list.first().copied().unwrap_or(1),
            chunk: a.model.chunk,
            kv_type: a.model.kv_type,
            reps: a.repetitions,
            json: a.json,
            dir: a.restore_dir.as_deref(),
        })?);
    }
    if let Some(file) = &a.grammar {
        let configs = threads_list
            .iter()
            .map(|&t| a.model.engine_config(t))
            .collect();
        return Ok(super::bench_grammar::run(super::bench_grammar::Opts {
            model_path: a.model.path(),
            model,
            file,
            configs,
            n_gen: a.n_gen,
            reps: a.repetitions,
            json: a.json,
        })?);
    }
    if !a.batch.is_empty() {
        let ctx = super::bench_batch::SESSION_PROMPT + a.n_gen.max(a.n_prompt) + 1;
        let configs = threads_list
            .iter()
            .map(|&t| EngineConfig {
                n_ctx: a.model.ctx.min(MAX_CTX).max(ctx.min(MAX_CTX)),
                ..a.model.engine_config(t)
            })
            .collect();
        return Ok(super::bench_batch::run(super::bench_batch::Opts {
            model_path: a.model.path(),
            model,
            configs,
            batches: &a.batch,
            n_prompt: a.n_prompt,
            n_gen: a.n_gen,
            reps: a.repetitions,
            json: a.json,
        })?);
    }
    let n_vocab = model.hp.n_vocab as u32;
    // Checked before the token lists are built: -d, -p and -n come from the command line.
    let need = a
        .depth
        .checked_add(a.n_prompt.max(a.n_gen))
        .and_then(|n| n.checked_add(1))
        .filter(|&n| n <= MAX_CTX)
        .ok_or_else(|| {
            format!(
                "-d {} plus the longer of -p {} and -n {} exceeds the largest context, {MAX_CTX}",
                a.depth, a.n_prompt, a.n_gen
            )
        })?;
    let ctx = a.model.ctx.max(need);
    // Deterministic, ordinary token ids (not special tokens).
    let prompt: Vec<u32> = (0..a.n_prompt as u32)
        .map(|i| 100 + (i * 7919) % (n_vocab - 200))
        .collect();
    let context: Vec<u32> = (0..a.depth as u32)
        .map(|i| 100 + (i * 104_729 + 17) % (n_vocab - 200))
        .collect();
    let at = a.depth;
    let weight_bytes = model.weight_bytes_per_token() as f64;
    let probe = a.bandwidth.then(Probe::new);
    let mut rows = Vec::new();
    for &threads in threads_list {
        let cfg = EngineConfig {
            n_ctx: ctx,
            ..a.model.engine_config(threads)
        };
        let mut e = Engine::new(Arc::clone(&model), cfg)?;
        let mut s = e.new_session();
        if !context.is_empty() {
            e.feed(&mut s, &context).map_err(|e| e.to_string())?;
        }
        let bw_before = probe.as_ref().map(|p| p.read_bandwidth(threads, PASSES));
        let pp = if a.n_prompt > 0 {
            measure(
                a.repetitions,
                a.n_prompt,
                || {
                    if s.truncate(at) != at {
                        return Err(format!("the session cannot be rewound to the depth {at}"));
                    }
                    e.feed(&mut s, &prompt)
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                },
                || (),
            )?
        } else {
            Vec::new()
        };
        // The probes around each tg run, for the paired shares.
        let mut tg_bw = Vec::new();
        let tg = if a.n_gen > 0 {
            measure(
                a.repetitions,
                a.n_gen,
                || tg_run(&mut e, &mut s, at, a.n_gen),
                || {
                    if let Some(p) = &probe {
                        tg_bw.push(p.read_bandwidth(threads, PAIR_PASSES));
                    }
                },
            )?
        } else {
            Vec::new()
        };
        let profile = if a.profile || a.svg.is_some() {
            profile::run(&mut e, &mut s, at, &prompt, a.n_gen)?
        } else {
            Vec::new()
        };
        let bandwidth = probe.as_ref().zip(bw_before).map(|(p, b)| {
            tg_bw
                .iter()
                .fold(b.max(p.read_bandwidth(threads, PASSES)), |m, &x| m.max(x))
        });
        let paired = paired_shares(&tg, &tg_bw, weight_bytes);
        rows.push(Row {
            threads,
            kernels: e.kernels().name(),
            pp,
            tg,
            profile,
            bandwidth,
            paired,
        });
    }
    // tokens/s that the bandwidth allows when every weight byte is read once per token.
    let bound = |bw: f64| bw / weight_bytes;
    if let Some(path) = &a.svg {
        let phases: Vec<_> = rows.iter().flat_map(|r| &r.profile).collect();
        let heading = format!("edgellm bench --profile: {}", a.model.path().display());
        std::fs::write(path, profile::svg(&heading, &phases))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }

    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|r| {
                let (ppm, pps) = mean_sd(&r.pp);
                let (tgm, tgs) = mean_sd(&r.tg);
                let mut row = json!({"threads": r.threads, "kernels": r.kernels,
                       "n_prompt": a.n_prompt, "n_gen": a.n_gen, "n_depth": a.depth,
                       "pp_tps": ppm, "pp_sd": pps, "tg_tps": tgm, "tg_sd": tgs});
                if !r.profile.is_empty() {
                    row["profile"] = profile::json(&r.profile);
                }
                if let Some(bw) = r.bandwidth {
                    row["bw_gbps"] = json!(bw / 1e9);
                    row["tg_bound_tps"] = json!(bound(bw));
                    row["tg_of_bound"] = json!(tgm / bound(bw));
                    if let Some(m) = median(&r.paired) {
                        row["tg_of_bound_paired"] = json!(m);
                        row["tg_paired_shares"] = json!(r.paired);
                    }
                }
                row
            })
            .collect();
        println!("{}", serde_json::Value::Array(v));
        return Ok(());
    }
    println!(
        "model: {}  ({:.1} MiB of weights per token)",
        a.model.path().display(),
        model.weight_bytes_per_token() as f64 / (1 << 20) as f64
    );
    println!("| threads | kernels | test   |            t/s |");
    println!("|--------:|---------|--------|---------------:|");
    let depth = profile::at_depth(a.depth);
    for r in &rows {
        for (name, v, n) in [("pp", &r.pp, a.n_prompt), ("tg", &r.tg, a.n_gen)] {
            if !v.is_empty() {
                let (m, sd) = mean_sd(v);
                println!(
                    "| {:>7} | {:<7} | {:<6} | {m:>8.2} ± {sd:>4.2} |",
                    r.threads,
                    r.kernels,
                    format!("{name}{n}{depth}")
                );
            }
        }
    }
    for r in &rows {
        if let Some(bw) = r.bandwidth {
            let b = bound(bw);
            print!(
                "\n{} thread(s): read bandwidth {:.1} GB/s, {:.1} MB of weights per token: \
                 decoding is bounded near {b:.0} t/s",
                r.threads,
                bw / 1e9,
                weight_bytes / 1e6
            );
            if !r.tg.is_empty() {
                print!("; tg is {:.1}% of it", 100.0 * mean_sd(&r.tg).0 / b);
            }
            if let Some(m) = median(&r.paired) {
                print!(
                    " (each run against the probes just before and after it: median {:.1}%)",
                    100.0 * m
                );
            }
            println!();
        }
    }
    for p in rows.iter().flat_map(|r| &r.profile) {
        print!("\n{}", profile::table(p));
    }
    Ok(())
}

/// One tg run: `n` tokens decoded one at a time after the first `depth` cached positions.
fn tg_run(e: &mut Engine, s: &mut Session, depth: usize, n: usize) -> Result<(), String> {
    s.truncate(depth);
    if s.tokens().len() != depth {
        return Err(format!(
            "the session holds {} tokens, not the depth {depth}",
            s.tokens().len()
        ));
    }
    let mut tok = 1u32;
    for _ in 0..n {
        let logits = e.feed(s, &[tok]).map_err(|e| e.to_string())?;
        tok = edgellm::engine::sampler::argmax(logits) as u32;
    }
    Ok(())
}
