//! `edgellm run`: one prompt in, a completion out (streamed, or one JSON object at the end).

use super::CliResult;
use super::common::ModelArgs;
use super::state::{self, StoreRun};
use edgellm::engine::store::SessionId;
use edgellm::engine::{FinishReason, GenParams, Sampler, SamplingParams};
use edgellm::kv::Geometry;
use edgellm::tokenizer::{ChatMessage, StreamDecoder};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

/// Generate a completion for one prompt.
///
/// By default the prompt is raw text, continued as is; with --chat it is the user's message
/// and the model's own chat template (with its default system prompt, or --system) is applied.
/// Sampling is greedy unless --temp is above 0.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm run -m smollm2-135m-q4_0.gguf --chat --prompt 'What is the boiling point of water?'
  edgellm run -m model.gguf --prompt 'Once upon a time' -n 64 --temp 0.8 --seed 7
  edgellm run -m model.gguf --prompt-file req.txt --json --top-logits 5
  edgellm run -m model.gguf --chat --prompt 'Status?' --state-dir /var/lib/edgellm --session plc-7

With --json, one object is printed at the end: prompt_ids, generated_ids (with the
end-of-generation token when generation stopped on one), text, finish_reason, top_logits
([id, logit] after the prompt, with --top-logits) and timings (load_ms, prompt_ms, ttft_ms,
decode_tps, restored_tokens, …). With --session-file, \"session\" reports the load (tokens
restored, a dropped torn tail, or why the file was refused and where it was moved) and the save
(saved, write: appended|rewritten|unchanged, or the error; the answer is printed and the exit
status is 0 even when saving fails). With --state-dir, \"session\" reports where the session
came from (source: ram|file|new|refused|unreadable), prefix_tokens taken from the cached system
prompt, the save, the store's status and the system prompt's cache entry. Errors go to stderr
with a non-zero exit status.")]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(
        short = 'p',
        long,
        conflicts_with = "prompt_file",
        required_unless_present = "prompt_file"
    )]
    prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    prompt_file: Option<PathBuf>,
    /// Most tokens to generate.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 128)]
    max_tokens: usize,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System prompt for --chat (replaces the template's default one).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Sampling temperature; 0 means greedy (argmax).
    #[arg(long = "temp", default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Drop tokens less likely than P × the most likely one.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise tokens seen in the last --repeat-last-n tokens (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed: the same seed and settings give the same tokens.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Also report the K best [id, logit] after the prompt.
    #[arg(long, default_value_t = 0)]
    top_logits: usize,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    json: bool,
    /// Keep the session's KV cache in this file: restore it when its tokens are a prefix of
    /// this prompt's (only the rest is computed), save the new positions after generating.
    /// A bad or foreign file is moved aside (F.corrupt-<time>) and the prompt is computed.
    #[arg(long, conflicts_with = "state_dir")]
    session_file: Option<PathBuf>,
    /// Keep named sessions in this directory (sessions/<name>.kv, prefixes/ for system
    /// prompts, a LOCK so two processes cannot share it). With --chat the system prompt is
    /// computed once and restored by every later run.
    #[arg(long, env = "EDGELLM_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// The session's name in --state-dir: 1-64 of A-Z a-z 0-9 _ - . (not starting with . or -).
    #[arg(long, requires = "state_dir", default_value = "default")]
    session: SessionId,
    /// Flash the state directory may use; past it the least recently saved sessions are
    /// deleted. Sizes: 4096, 64K, 256M, 2G.
    #[arg(long, default_value = "256M", value_parser = state::parse_size)]
    disk_budget: u64,
    /// Drop tokens from the front of a prompt that does not fit the context (with a warning)
    /// instead of failing.
    #[arg(long)]
    truncate: bool,
}

/// Largest prompt file read.
const MAX_PROMPT_BYTES: u64 = 16 << 20;

fn read_prompt(a: &Args) -> Result<String, String> {
    if let Some(p) = &a.prompt {
        return Ok(p.clone());
    }
    let path = a
        .prompt_file
        .as_ref()
        .ok_or("no prompt given (--prompt or --prompt-file)")?;
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() > MAX_PROMPT_BYTES {
        return Err(format!(
            "{}: prompt file is larger than {} MiB",
            path.display(),
            MAX_PROMPT_BYTES >> 20
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| format!("{}: prompt is not UTF-8 ({e})", path.display()))
}

pub fn run(a: Args) -> CliResult {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        seed: a.seed,
    };
    sampling.validate()?;
    let prompt = read_prompt(&a)?;
    let mut loaded = a.model.load()?;
    let engine = &mut loaded.engine;
    let model = std::sync::Arc::clone(engine.model());
    let tok = &model.tokenizer;

    let mut prompt_ids = if a.chat {
        let tmpl = model
            .chat_template()
            .map_err(|e| format!("{}: {e}", a.model.model.display()))?;
        let text = tmpl.render_with_system(
            a.system.as_deref(),
            &[ChatMessage::new("user", prompt)],
            true,
        )?;
        tok.encode(&text, true, true)
    } else {
        tok.encode(&prompt, true, false)
    };
    let n_ctx = engine.config().n_ctx;
    if prompt_ids.len() >= n_ctx {
        if !a.truncate {
            return Err(format!(
                "the prompt is {} tokens but the context holds {n_ctx} (raise --ctx, or pass --truncate)",
                prompt_ids.len()
            )
            .into());
        }
        let keep = n_ctx - a.max_tokens.clamp(1, n_ctx / 2);
        tracing::warn!(
            dropped = prompt_ids.len() - keep,
            kept = keep,
            "prompt truncated from the front to fit the context"
        );
        prompt_ids.drain(..prompt_ids.len() - keep);
    }
    if prompt_ids.is_empty() {
        return Err("the prompt is empty".into());
    }

    let mut sampler = Sampler::new(sampling, model.hp.n_vocab);
    let mut store = match &a.state_dir {
        Some(dir) => Some(StoreRun::open(
            engine,
            dir,
            a.session.clone(),
            a.disk_budget,
        )?),
        None => None,
    };
    if let (Some(st), true) = (&mut store, a.chat) {
        let tmpl = model.chat_template()?;
        if let Some(text) = tmpl.system_prefix(a.system.as_deref())? {
            st.cache_system_prompt(engine, &tok.encode(&text, true, true), &prompt_ids);
        }
    }
    // A session of our own, unless the store provides it.
    let mut session = store.is_none().then(|| engine.new_session());
    let mut snapshot = match (&a.session_file, &mut session) {
        (Some(path), Some(session)) => {
            let g = Geometry::of(&model, n_ctx, engine.config().kv_type);
            Some(state::restore(path, g, session)?)
        }
        _ => None,
    };
    let params = GenParams {
        max_tokens: a.max_tokens,
        top_logits: a.top_logits,
    };
    let mut stream = StreamDecoder::new();
    let mut text = String::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_failed = None;
    let is_eog = |t: u32| tok.is_eog(t);
    let mut on_token = |t: u32| {
        if tok.is_eog(t) {
            return true;
        }
        let start = text.len();
        stream.push_into(tok.token_to_piece(t), &mut text);
        if !a.json
            && let Err(e) = out
                .write_all(&text.as_bytes()[start..])
                .and_then(|_| out.flush())
        {
            // A closed pipe (e.g. `| head`) stops generation instead of wasting the CPU.
            write_failed = Some(e);
            return false;
        }
        true
    };
    // Saving never loses the answer: a failure is logged and reported, and exit is 0.
    let (result, session_report) = match (&mut store, &mut session) {
        (Some(st), _) => {
            let (r, turn) = st.store.generate(
                engine,
                &st.id,
                &prompt_ids,
                &params,
                &mut sampler,
                &is_eog,
                &mut on_token,
            )?;
            (r, Some(st.report(&turn)))
        }
        (None, Some(session)) => {
            let r = engine.generate(
                session,
                &prompt_ids,
                &params,
                &mut sampler,
                &is_eog,
                &mut on_token,
            )?;
            let report = snapshot.as_mut().map(|f| state::save(f, session));
            (r, report)
        }
        (None, None) => unreachable!("a run has a session or a store"),
    };
    text.push_str(&stream.finish());
    if let Some(e) = write_failed {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(());
        }
        return Err(format!("writing to standard output: {e}").into());
    }

    let t = &result.timings;
    tracing::info!(
        prompt_tokens = t.prompt_tokens,
        generated = result.generated.len(),
        prompt_ms = format_args!("{:.1}", t.prompt_ms),
        ttft_ms = format_args!("{:.1}", t.ttft_ms),
        decode_tps = format_args!("{:.1}", t.decode_tps),
        finish = ?result.finish,
        "done"
    );
    if a.json {
        let v = json!({
            "prompt_ids": prompt_ids,
            "generated_ids": result.generated,
            "text": text,
            "finish_reason": result.finish,
            "top_logits": result.top_logits.iter().map(|(id, l)| json!([id, l])).collect::<Vec<_>>(),
            "timings": {
                "load_ms": loaded.load_ms,
                "prompt_ms": t.prompt_ms,
                "ttft_ms": t.ttft_ms,
                "decode_ms": t.decode_ms,
                "decode_tps": t.decode_tps,
                "prompt_tokens": t.prompt_tokens,
                "restored_tokens": t.restored_tokens,
            },
            "kernels": engine.kernels().name(),
            "threads": engine.config().threads,
        });
        let mut v = v;
        if let Some(r) = session_report {
            v["session"] = r;
        }
        writeln!(out, "{v}")?;
    } else {
        if !text.ends_with('\n') {
            writeln!(out)?;
        }
        if result.finish == FinishReason::ContextFull {
            tracing::warn!("generation stopped: the context ({n_ctx} tokens) is full");
        }
    }
    Ok(())
}
