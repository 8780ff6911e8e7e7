//! `edgellm perplexity`: a model's perplexity over a text, and its KL divergence from a
//! reference model's saved logits, computed as llama.cpp's `llama-perplexity` computes them so
//! that the two tools' figures can be set side by side (the windows, the BOS, the scored half,
//! the ± error are its; see `edgellm::eval`).
//!
//! Each window is fed from an empty cache through [`Engine::feed_each`], which hands over the
//! logits of every scored position; its last token is not fed, since nothing inside the window
//! predicts from it.

use super::CliResult;
use super::common::ModelArgs;
use clap::builder::TypedValueParser;
use edgellm::engine::Engine;
use edgellm::eval::score::{KlStats, KlSummary, Nll, RefPoint, Scorer};
use edgellm::eval::topk::{self, Header, Reader, TopKError, Writer};
use edgellm::eval::{first_scored, scored_per_window, tokens_checksum, windows};
use serde_json::json;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Measure a model's perplexity over a text, as llama-perplexity does.
#[derive(clap::Args)]
#[command(
    mut_arg("ctx", |a| a
        .default_value("512")
        .help("Window length in tokens (llama-perplexity's -c): the text is cut into windows \
               of this many tokens, each scored on its second half")),
    after_help = "\
The text (one trailing newline dropped, as llama-perplexity's -f) is tokenized and cut \
into windows of --ctx tokens; each window is evaluated from an empty cache, its first token \
replaced by BOS when the model adds one, and the predictions of its second half are scored. \
The running perplexity is printed after each window as [window]value, then \
`Final estimate: PPL = X +/- Y` (Y: the standard error). The text must hold two windows.

--save-logits FILE keeps, for every scored position, the reference model's --top-k (default 64) \
most likely tokens' log-probabilities, the log-sum-exp of its logits and its probability mass \
outside them: llama.cpp keeps every logit (~98 KB a position for a 49k-token vocabulary); this \
keeps ~0.5 KB whatever the vocabulary. --kl-divergence FILE runs another model with the same \
vocabulary over the same text and --ctx and reports KL(reference || this model) over those \
tokens with the rest merged into one bucket, its 99th percentile, how often both models' most \
likely token agree, and this model's perplexity minus the reference's. Merging the tail makes \
the KL divergence a lower bound of llama-perplexity's, which sums every token: on SmolLM2-135M \
the top-64 figure is about 80 % of the full one (the tail of a small model's distribution holds \
real divergence; each doubling of --top-k adds a few percent). Compare figures made with the \
same --top-k; top-1 agreement and the perplexities do not depend on it.

Examples:
  edgellm perplexity -m smollm2-135m-q4_1.gguf -f text.txt
  edgellm perplexity -m smollm2-135m-q8_0.gguf -f text.txt --save-logits q8.topk
  edgellm perplexity -m smollm2-135m-q4_0.gguf -f text.txt --kl-divergence q8.topk --json"
)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The text to score (UTF-8 or not: its bytes are tokenized).
    #[arg(short = 'f', long, value_name = "FILE")]
    file: PathBuf,
    /// Score at most N windows (default: every whole window of the text; with --kl-divergence,
    /// every window of the saved file).
    #[arg(long, value_name = "N")]
    chunks: Option<usize>,
    /// Save the scored positions' top-k log-probabilities, log-sum-exp and remaining mass to
    /// FILE, as the reference for --kl-divergence.
    #[arg(long, value_name = "FILE", conflicts_with = "kl_divergence")]
    save_logits: Option<PathBuf>,
    /// Tokens kept per position by --save-logits (1..=256): more keeps more of the reference's
    /// tail, and the file grows by 8 bytes a position per token.
    #[arg(long, value_name = "K", default_value_t = topk::TOP_K, requires = "save_logits",
          value_parser = clap::value_parser!(u16).range(1..=topk::MAX_TOP_K as i64).map(usize::from))]
    top_k: usize,
    /// Compare with the reference saved by --save-logits in FILE: mean and 99th-percentile KL
    /// divergence, top-1 agreement, perplexity difference.
    #[arg(long, value_name = "FILE")]
    kl_divergence: Option<PathBuf>,
    /// Print one JSON object at the end instead of text.
    #[arg(long)]
    json: bool,
}

/// Largest text read.
const MAX_TEXT: u64 = 64 << 20;

/// What is done with each scored position besides our perplexity.
enum Mode {
    Perplexity,
    Save {
        writer: Writer<BufWriter<File>>,
        record: RefPoint,
    },
    Compare {
        reader: Reader<BufReader<File>>,
        record: RefPoint,
        stats: KlStats,
    },
}

pub fn run(a: Args) -> CliResult {
    let text = read_text(&a.file)?;
    let loaded = a.model.load()?;
    let mut engine = loaded.engine;
    let n_ctx = a.model.ctx;
    if scored_per_window(n_ctx) == 0 {
        return Err(format!("--ctx {n_ctx}: a window needs at least 3 tokens").into());
    }
    let (tokens, bos) = {
        let tok = &engine.model().tokenizer;
        let bos = tok.bos().filter(|_| tok.add_bos());
        (tok.encode_bytes(&text, true, false), bos)
    };
    if tokens.len() < 2 * n_ctx {
        return Err(format!(
            "{}: {} tokens; a context of {n_ctx} needs at least {} (two windows)",
            a.file.display(),
            tokens.len(),
            2 * n_ctx
        )
        .into());
    }
    let whole = tokens.len() / n_ctx;
    let n_vocab = engine.model().hp.n_vocab;

    let (mut mode, n_windows) = match (&a.save_logits, &a.kl_divergence) {
        (Some(path), _) => {
            let n = a.chunks.unwrap_or(whole).clamp(1, whole);
            let header = Header {
                n_vocab: n_vocab as u32,
                n_ctx: n_ctx as u32,
                top_k: a.top_k.min(n_vocab) as u32,
                n_windows: n as u32,
                tokens_sha256: tokens_checksum(&windows(&tokens, n_ctx, n, bos)),
            };
            let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let writer = Writer::new(BufWriter::new(file), header).map_err(in_file(Some(path)))?;
            let record = RefPoint::default();
            (Mode::Save { writer, record }, n)
        }
        (None, Some(path)) => {
            let reader = open_reference(path)?;
            let h = reader.header();
            let saved = h.n_windows as usize;
            if saved > whole {
                return Err(format!(
                    "{}: holds {saved} windows of {n_ctx} tokens, {} gives {whole}: it was saved \
                     from another text",
                    path.display(),
                    a.file.display()
                )
                .into());
            }
            let sum = tokens_checksum(&windows(&tokens, n_ctx, saved, bos));
            h.check_matches(n_vocab, n_ctx, &sum)
                .map_err(in_file(Some(path)))?;
            let n = a.chunks.unwrap_or(saved).clamp(1, saved);
            let (record, stats) = (RefPoint::default(), KlStats::default());
            (
                Mode::Compare {
                    reader,
                    record,
                    stats,
                },
                n,
            )
        }
        (None, None) => (Mode::Perplexity, a.chunks.unwrap_or(whole).clamp(1, whole)),
    };

    // The top-k of the reference compared with (its file says it).
    let ref_k = match &mode {
        Mode::Compare { reader, .. } => reader.header().top_k as usize,
        _ => 0,
    };
    let fed = windows(&tokens, n_ctx, n_windows, bos);
    let first = first_scored(n_ctx);
    if !a.json {
        eprintln!(
            "perplexity: {} tokens, {n_windows} windows of {n_ctx}, scoring the last {} \
             predictions of each",
            tokens.len(),
            scored_per_window(n_ctx)
        );
    }
    // One pass's logits: allocated here, once, not by the engine (decoding never needs them).
    let mut room = vec![0.0f32; engine.logits_room()];
    let mut session = engine.new_session();
    let mut scorer = Scorer::default();
    let mut nll = Nll::default();
    let mut running = Vec::with_capacity(n_windows);
    let mut kl_running = Vec::new();
    let t0 = Instant::now();
    for (w, win) in fed.chunks_exact(n_ctx).enumerate() {
        session.truncate(0);
        if let Mode::Compare { reader, .. } = &mut mode {
            reader
                .next_window()
                .map_err(in_file(a.kl_divergence.as_ref()))?;
        }
        let mut failed: Option<TopKError> = None;
        let each = |i: usize, logits: &[f32]| {
            let target = win[i + 1];
            match &mut mode {
                Mode::Perplexity => nll.add(Scorer::nll(logits, target)),
                Mode::Save { writer, record } => {
                    nll.add(scorer.reference(logits, target, record_k(writer), record));
                    if let Err(e) = writer.push(record) {
                        failed.get_or_insert(e);
                    }
                }
                Mode::Compare {
                    reader,
                    record,
                    stats,
                } => {
                    reader.record(i - first, record);
                    let c = scorer.compare(logits, target, record);
                    nll.add(c.nll);
                    stats.add(c);
                }
            }
        };
        feed_window(&mut engine, &mut session, win, first, &mut room, each)?;
        if let Some(e) = failed {
            return Err(in_file(a.save_logits.as_ref())(e).into());
        }
        if w == 0 && !a.json {
            eprintln!(
                "perplexity: {:.2} seconds per window",
                t0.elapsed().as_secs_f64()
            );
        }
        running.push(nll.ppl());
        match &mode {
            Mode::Compare { stats, .. } => {
                let s = stats.summary().expect("a window scores a position");
                if !a.json {
                    if w == 0 {
                        println!(
                            "window        PPL    ln(PPL(Q)/PPL(base))   KL divergence    same top"
                        );
                    }
                    println!(
                        "{:6} {:10.4} {:12.5} {:20.5} {:10.3} %",
                        w + 1,
                        s.ppl,
                        s.ppl.ln() - s.ppl_base.ln(),
                        s.kld_mean,
                        100.0 * s.same_top
                    );
                }
                kl_running.push(s);
            }
            _ if !a.json => {
                print!("[{}]{:.4},", w + 1, nll.ppl());
                std::io::stdout().flush()?;
            }
            _ => {}
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let scored = nll.count();
    let (ppl, err) = (nll.ppl(), nll.ppl_err());

    let saved = match mode {
        Mode::Save { writer, .. } => {
            let path = a.save_logits.as_ref().expect("save mode");
            writer
                .finish()
                .and_then(|w| w.into_inner().map_err(|e| e.into_error().into()))
                .and_then(|f| f.sync_all().map_err(TopKError::from))
                .map_err(in_file(Some(path)))?;
            let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            Some((path.clone(), bytes))
        }
        _ => None,
    };
    let kl = kl_running.last().copied();

    if a.json {
        let v = json!({
            "model": a.model.path().display().to_string(),
            "file": a.file.display().to_string(),
            "n_ctx": n_ctx,
            "chunk": engine.config().chunk,
            "threads": engine.config().threads,
            "kernels": engine.kernels().name(),
            "tokens": tokens.len(),
            "windows": n_windows,
            "scored": scored,
            "ppl": ppl,
            "ppl_err": err,
            "per_window": running,
            "load_ms": loaded.load_ms,
            "seconds": seconds,
            "tokens_per_s": (n_windows * (n_ctx - 1)) as f64 / seconds,
            "kld": kl.map(|s| kl_json(&s, ref_k)),
            "saved": saved.as_ref().map(|(p, bytes)| json!({
                "file": p.display().to_string(),
                "top_k": a.top_k.min(n_vocab),
                "bytes": bytes,
            })),
        });
        println!("{v}");
        return Ok(());
    }
    if let Some(s) = kl {
        print_kl(&s, ref_k);
    } else {
        println!();
    }
    if let Some((p, bytes)) = saved {
        eprintln!(
            "perplexity: saved the top-{} of {scored} positions to {} ({bytes} bytes)",
            a.top_k.min(n_vocab),
            p.display()
        );
    }
    eprintln!(
        "perplexity: {scored} predictions scored in {seconds:.2} s ({:.1} tokens/s)",
        (n_windows * (n_ctx - 1)) as f64 / seconds
    );
    match err {
        Some(err) => println!("Final estimate: PPL = {ppl:.4} +/- {err:.5}"),
        None => println!("Final estimate: PPL = {ppl:.4} (no spread to estimate an error from)"),
    }
    Ok(())
}

/// The top-k of the records a writer takes.
fn record_k<W: Write>(w: &Writer<W>) -> usize {
    w.header().top_k as usize
}

/// Feeds one window but its last token from an empty cache; `each(i, logits)` for every
/// position `i` from `first` on.
fn feed_window(
    engine: &mut Engine,
    session: &mut edgellm::engine::Session,
    win: &[u32],
    first: usize,
    room: &mut [f32],
    each: impl FnMut(usize, &[f32]),
) -> Result<(), String> {
    engine
        .feed_each(session, &win[..win.len() - 1], first, room, each)
        .map_err(|e| e.to_string())
}

/// The text, one trailing newline dropped (as llama-perplexity's -f reads it).
fn read_text(path: &Path) -> Result<Vec<u8>, String> {
    let named = |e: std::io::Error| format!("{}: {e}", path.display());
    let mut text = Vec::new();
    File::open(path)
        .map_err(named)?
        .take(MAX_TEXT + 1)
        .read_to_end(&mut text)
        .map_err(named)?;
    if text.len() as u64 > MAX_TEXT {
        return Err(format!(
            "{}: larger than {} MiB",
            path.display(),
            MAX_TEXT >> 20
        ));
    }
    if text.last() == Some(&b'\n') {
        text.pop();
    }
    Ok(text)
}

fn open_reference(path: &Path) -> Result<Reader<BufReader<File>>, String> {
    let named = |e: std::io::Error| format!("{}: {e}", path.display());
    let f = File::open(path).map_err(named)?;
    let len = f.metadata().map_err(named)?.len();
    Reader::new(BufReader::new(f), len).map_err(in_file(Some(path)))
}

/// Names the saved-logits file in its error.
fn in_file<P: AsRef<Path>>(path: Option<P>) -> impl Fn(TopKError) -> String {
    let name = path.map_or_else(String::new, |p| p.as_ref().display().to_string());
    move |e| format!("{name}: {e}")
}

fn kl_json(s: &KlSummary, k: usize) -> serde_json::Value {
    json!({
        "positions": s.count,
        "top_k": k,
        "kld_mean": s.kld_mean,
        "kld_mean_err": s.kld_err,
        "kld_median": s.kld_median,
        "kld_p99": s.kld_p99,
        "kld_max": s.kld_max,
        "same_top": s.same_top,
        "same_top_err": s.same_top_err,
        "ppl": s.ppl,
        "ppl_base": s.ppl_base,
        "delta_ppl": s.delta_ppl,
    })
}

fn print_kl(s: &KlSummary, k: usize) {
    println!();
    println!("====== Perplexity statistics ======");
    println!("Mean PPL(Q)                   : {:10.6}", s.ppl);
    println!("Mean PPL(base)                : {:10.6}", s.ppl_base);
    println!("Mean PPL(Q)-PPL(base)         : {:10.6}", s.delta_ppl);
    println!();
    println!("====== KL divergence statistics (top-{k} + the rest as one bucket) ======");
    println!("Mean    KLD: {:10.6} ± {:10.6}", s.kld_mean, s.kld_err);
    println!("Maximum KLD: {:10.6}", s.kld_max);
    println!("99.0%   KLD: {:10.6}", s.kld_p99);
    println!("Median  KLD: {:10.6}", s.kld_median);
    println!(
        "Same top p: {:6.3} ± {:5.3} %",
        100.0 * s.same_top,
        100.0 * s.same_top_err
    );
}
