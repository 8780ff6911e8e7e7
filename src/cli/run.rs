//! `edgellm run`: one prompt in, a completion out (streamed, or one JSON object at the end).

use super::CliResult;
use super::common::{FormatArgs, ModelArgs, parse_size};
use edgellm::engine::SamplingParams;
use edgellm::engine::store::{SessionId, StoreConfig};
use edgellm::service::{
    ErrorCode, Event, FinishReason, Format, Prompt, Request, Service, ServiceConfig, Sessions,
};
use edgellm::tokenizer::ChatMessage;
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
decode_tps, prompt_tokens: the whole prompt, restored_tokens: those of it restored from a
session, …). With --session-file, \"session\" reports the load (tokens
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
    /// Treat the prompt as a user message and apply the model's chat template (a Gemma file
    /// without one: the built-in Gemma template).
    #[arg(long)]
    chat: bool,
    /// The chat template for --chat instead of the model's: a Jinja file, or a built-in name
    /// (gemma, chatml).
    #[arg(long, value_name = "FILE|NAME", requires = "chat")]
    chat_template: Option<PathBuf>,
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
    /// With --chat the prompt is the next turn of the session's conversation
    /// (sessions/<name>.conv): every earlier question and answer is answered with it.
    #[arg(long, requires = "state_dir", default_value = "default")]
    session: SessionId,
    /// Flash the state directory may use; past it the least recently saved sessions are
    /// deleted. Sizes: 4096, 64K, 256M, 2G.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    disk_budget: u64,
    /// Drop tokens from the front of a prompt that does not fit the context (with a warning)
    /// instead of failing.
    #[arg(long)]
    truncate: bool,
    /// Let control tokens written in a raw prompt (e.g. `<|im_start|>`, for a template
    /// rendered by hand) be control tokens. Without it, and always in a --chat message, text
    /// is text: a typed control token cannot open or close a turn.
    #[arg(long, conflicts_with = "chat")]
    raw_special: bool,
    #[command(flatten)]
    format: FormatArgs,
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

/// The request this run makes of the service.
fn request(a: &Args, prompt: String) -> Result<Request, String> {
    let prompt = if a.chat {
        Prompt::Chat(vec![ChatMessage::new("user", prompt)])
    } else {
        Prompt::Text {
            text: prompt,
            special: a.raw_special,
        }
    };
    let mut req = Request::new("run", "cli", prompt);
    req.system = a.system.clone();
    req.session = a.state_dir.as_ref().map(|_| a.session.clone());
    req.sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        repeat_last_n: a.repeat_last_n,
        seed: a.seed,
    };
    req.max_tokens = a.max_tokens;
    req.top_logits = a.top_logits;
    req.truncate = a.truncate;
    req.format = a
        .format
        .shape()?
        .map(|s| Format::Shape(std::sync::Arc::new(s)));
    Ok(req)
}

/// `edgellm run` is a client of the service: one request, its events printed as they come.
pub fn run(a: Args) -> CliResult {
    let prompt = read_prompt(&a)?;
    let req = request(&a, prompt)?;
    req.sampling.validate()?;
    let loaded = a.model.load()?;
    let kernels = loaded.engine.kernels().name();
    let threads = loaded.engine.config().threads;
    let n_ctx = loaded.engine.config().n_ctx;
    let sessions = match (&a.session_file, &a.state_dir) {
        (Some(f), _) => Sessions::File(f.clone()),
        (None, Some(dir)) => Sessions::Dir(StoreConfig {
            dir: dir.clone(),
            // One resident session: a run answers one request.
            ram_bytes: 0,
            disk_bytes: a.disk_budget,
            max_sessions: None,
        }),
        (None, None) => Sessions::None,
    };
    let cfg = ServiceConfig {
        queue_depth: 1,
        per_source: 1,
        max_prompt_bytes: MAX_PROMPT_BYTES as usize,
        sessions,
        chat_template: a.chat_template.clone(),
        ..ServiceConfig::default()
    };
    let service = Service::start(loaded.engine, cfg).map_err(|e| e.to_string())?;
    let mut ticket = service.handle().submit(req).map_err(|e| e.to_string())?;

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut done = None;
    while let Some(ev) = ticket.blocking_recv() {
        match ev {
            Event::Text(chunk) if !a.json => {
                if let Err(e) = out.write_all(chunk.as_bytes()).and_then(|_| out.flush()) {
                    // A closed pipe (e.g. `| head`): dropping the ticket stops generation
                    // instead of wasting the CPU.
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(());
                    }
                    return Err(format!("writing to standard output: {e}").into());
                }
            }
            Event::Text(_) => {}
            Event::Done(d) => done = Some(d),
            Event::Error(e) if e.code == ErrorCode::ContextFull => {
                return Err(format!("{e} (raise --ctx, or pass --truncate)").into());
            }
            Event::Error(e) => return Err(e.message.into()),
        }
    }
    // The answer has ended: the worker is only leaving it, which a moment's grace lets it do
    // without a "cancelling" warning.
    service.shutdown(std::time::Duration::from_secs(1));
    let d = done.ok_or("the service ended without an answer")?;

    let t = &d.timings;
    tracing::info!(
        prompt_tokens = d.usage.prompt_tokens,
        generated = d.generated_ids.len(),
        prompt_ms = format_args!("{:.1}", t.prompt_ms),
        ttft_ms = format_args!("{:.1}", t.ttft_ms),
        decode_tps = format_args!("{:.1}", t.decode_tps),
        finish = ?d.finish_reason,
        "done"
    );
    if a.json {
        let mut v = json!({
            "prompt_ids": d.prompt_ids,
            "generated_ids": d.generated_ids,
            "text": d.text,
            "finish_reason": d.finish_reason,
            "top_logits": d.top_logits.iter().map(|(id, l)| json!([id, l])).collect::<Vec<_>>(),
            "timings": {
                "load_ms": loaded.load_ms,
                "prompt_ms": t.prompt_ms,
                "ttft_ms": t.ttft_ms,
                "decode_ms": t.decode_ms,
                "decode_tps": t.decode_tps,
                "prompt_tokens": d.usage.prompt_tokens,
                "restored_tokens": d.usage.restored_tokens,
            },
            "kernels": kernels,
            "threads": threads,
        });
        if let Some(r) = &d.session {
            v["session"] = serde_json::to_value(r)?;
        }
        if let Some(valid) = d.valid {
            v["valid"] = valid.into();
            v["format"] = serde_json::to_value(&d.constraint)?;
        }
        if let Some(j) = &d.json {
            v["json"] = j.clone();
        }
        writeln!(out, "{v}")?;
    } else {
        if !d.text.ends_with('\n') {
            writeln!(out)?;
        }
        if d.finish_reason == FinishReason::ContextFull {
            tracing::warn!("generation stopped: the context ({n_ctx} tokens) is full");
        }
    }
    if d.valid == Some(false) {
        return Err(format!(
            "the answer does not have the asked-for shape: it ended ({}) after {} tokens \
             before the format was complete (raise -n)",
            d.finish_reason.as_str(),
            d.generated_ids.len()
        )
        .into());
    }
    Ok(())
}
