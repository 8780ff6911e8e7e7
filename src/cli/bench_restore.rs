//! `edgellm bench --restore`: what the persisted KV cache buys. Time to first token for a long
//! prompt (a system prompt of --restore-prompt tokens and a short question) computed from
//! scratch, against a fresh process's store restoring the system prompt from flash (page cache
//! dropped) and computing only the question; and the flash bytes written per conversation turn.

use edgellm::engine::store::{SessionId, SessionStore, Source, StoreConfig};
use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::kv::{KvType, SaveKind};
use edgellm::model::Model;
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

/// What the restore benchmark needs from `bench`'s options.
pub struct Opts<'a> {
    pub model_path: &'a Path,
    pub model: Arc<Model>,
    pub prompt_tokens: usize,
    pub threads: usize,
    pub chunk: usize,
    pub kv_type: KvType,
    pub reps: usize,
    pub json: bool,
    /// Where to write the snapshots (a directory on the flash to measure); a temporary
    /// directory by default, which may be RAM (tmpfs) on a device.
    pub dir: Option<&'a Path>,
}

/// Tokens of the question that follows the system prompt, and of each later turn.
const QUESTION: usize = 16;
/// Tokens generated per turn.
const ANSWER: usize = 16;

pub fn run(o: Opts<'_>) -> Result<(), String> {
    let n_vocab = o.model.hp.n_vocab as u32;
    // Ordinary token ids (not special tokens), different for each part.
    let ids = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| 100 + (i * 7919 + salt * 104_729) % (n_vocab - 200))
            .collect()
    };
    let system = ids(o.prompt_tokens, 1);
    let prompt = [system.as_slice(), &ids(QUESTION, 2)].concat();
    let n_ctx = (prompt.len() + 3 * (QUESTION + ANSWER) + 8).next_multiple_of(64);
    let cfg = EngineConfig {
        n_ctx,
        chunk: o.chunk,
        threads: o.threads,
        kv_type: o.kv_type,
        max_batch: 1,
    };
    let mut e = Engine::new(Arc::clone(&o.model), cfg).map_err(|e| e.to_string())?;
    let dir = scratch_dir(o.dir)?;
    let store_cfg = StoreConfig {
        dir: dir.clone(),
        ram_bytes: 0,
        disk_bytes: u64::MAX,
        max_sessions: None,
    };
    let greedy = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    let one = GenParams {
        max_tokens: 1,
        top_logits: 0,
    };

    let mut cold = Vec::new();
    let mut restored = Vec::new();
    let mut restore_only = Vec::new();
    let mut dropped = "posix_fadvise(DONTNEED)";
    let mut snapshot_bytes = 0;
    for rep in 0..=o.reps {
        // Cold: the whole prompt from an empty cache.
        let mut s = e.new_session();
        let mut smp = Sampler::new(greedy.clone(), n_vocab as usize);
        let t0 = Instant::now();
        let mut first = None;
        e.generate(&mut s, &prompt, &one, &mut smp, &|_| false, &mut |_| {
            first.get_or_insert_with(|| t0.elapsed());
            true
        })
        .map_err(|e| e.to_string())?;
        let cold_ms = first.unwrap_or_default().as_secs_f64() * 1e3;
        drop(s);

        // The system prompt computed once and saved (the first start of a device).
        let _ = std::fs::remove_dir_all(&dir);
        {
            let mut st = SessionStore::open(&e, store_cfg.clone()).map_err(|e| e.to_string())?;
            let r = st
                .add_system_prompt(&mut e, &system)
                .map_err(|e| e.to_string())?;
            if let Some(err) = r.save_error {
                return Err(format!("cannot save the system prompt: {err}"));
            }
        }
        let prefix_file = only_file(&dir.join("prefixes"))?;
        snapshot_bytes = std::fs::metadata(&prefix_file)
            .map_err(|e| e.to_string())?
            .len();
        if !drop_page_cache(&prefix_file) {
            dropped = "not possible here (page cache warm)";
        }

        // A restart: open the store, restore the system prompt, answer the question.
        let t0 = Instant::now();
        let mut st = SessionStore::open(&e, store_cfg.clone()).map_err(|e| e.to_string())?;
        let r = st
            .add_system_prompt(&mut e, &system)
            .map_err(|e| e.to_string())?;
        let restore_ms = r.ms;
        if !matches!(r.source, Source::File { .. }) {
            return Err(format!(
                "the system prompt was not restored: {:?}",
                r.source
            ));
        }
        let id = SessionId::parse("bench").map_err(|e| e.to_string())?;
        let mut smp = Sampler::new(greedy.clone(), n_vocab as usize);
        let mut first = None;
        let (_, turn) = st
            .generate(
                &mut e,
                &id,
                &prompt,
                &one,
                &mut smp,
                &|_| false,
                &mut |_| {
                    first.get_or_insert_with(|| t0.elapsed());
                    true
                },
            )
            .map_err(|e| e.to_string())?;
        if turn.prefix_tokens != system.len() {
            return Err(format!(
                "{} of {} system prompt tokens reused",
                turn.prefix_tokens,
                system.len()
            ));
        }
        let restored_ms = first.unwrap_or_default().as_secs_f64() * 1e3;
        if rep > 0 {
            // Repetition 0 warms up code and weights.
            cold.push(cold_ms);
            restored.push(restored_ms);
            restore_only.push(restore_ms);
        }
    }

    // Flash written per turn of a conversation that continues the session.
    let turns = flash_per_turn(&mut e, &store_cfg, &prompt, &ids)?;
    let _ = std::fs::remove_dir_all(&dir);

    let (c, r) = (median(&cold), median(&restored));
    let per_pos = 2 * o.model.hp.n_layer * o.model.hp.kv_dim() * o.kv_type.bytes();
    if o.json {
        let v = json!({
            "prompt_tokens": prompt.len(), "system_tokens": system.len(), "threads": o.threads,
            "kernels": e.kernels().name(), "reps": o.reps,
            "cold_ttft_ms": c, "restored_ttft_ms": r, "speedup": c / r,
            "system_prompt_restore_ms": median(&restore_only),
            "cold_ttft_ms_all": cold, "restored_ttft_ms_all": restored,
            "page_cache": dropped, "snapshot_bytes": snapshot_bytes,
            "kv_bytes_per_position": per_pos, "turns": turns,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "model: {}  threads: {}  kernels: {}",
        o.model_path.display(),
        o.threads,
        e.kernels().name()
    );
    println!(
        "prompt: {} tokens = system prompt {} + question {QUESTION}; median of {} runs; page cache of the snapshot: {dropped}",
        prompt.len(),
        system.len(),
        o.reps
    );
    println!("| time to first token            |         ms |");
    println!("|--------------------------------|-----------:|");
    println!("| cold (whole prompt computed)   | {c:>10.1} |");
    println!("| restored (open, restore, rest) | {r:>10.1} |");
    println!("| speed-up                       | {:>9.1}x |", c / r);
    println!(
        "of which restoring the system prompt's {} positions from flash: {:.1} ms",
        system.len(),
        median(&restore_only)
    );
    println!(
        "system prompt snapshot: {snapshot_bytes} bytes ({per_pos} bytes of K/V per position)"
    );
    println!("| turn | new positions | bytes written | bytes/position |");
    println!("|-----:|--------------:|--------------:|---------------:|");
    for (i, t) in turns.iter().enumerate() {
        println!(
            "| {:>4} | {:>13} | {:>13} | {:>14.0} |",
            i + 1,
            t["positions"],
            t["bytes"],
            t["bytes"].as_f64().unwrap_or(0.0) / t["positions"].as_f64().unwrap_or(1.0)
        );
    }
    Ok(())
}

/// Three turns of one session: question, answer, saved; returns what each save wrote.
fn flash_per_turn(
    e: &mut Engine,
    cfg: &StoreConfig,
    prompt: &[u32],
    ids: &dyn Fn(usize, u32) -> Vec<u32>,
) -> Result<Vec<serde_json::Value>, String> {
    let mut st = SessionStore::open(e, cfg.clone()).map_err(|e| e.to_string())?;
    let id = SessionId::parse("turns").map_err(|e| e.to_string())?;
    let params = GenParams {
        max_tokens: ANSWER,
        top_logits: 0,
    };
    let mut conv = prompt.to_vec();
    let mut out = Vec::new();
    for turn in 0..3u32 {
        let mut smp = Sampler::new(SamplingParams::default(), e.model().hp.n_vocab);
        let (g, rep) = st
            .generate(e, &id, &conv, &params, &mut smp, &|_| false, &mut |_| true)
            .map_err(|e| e.to_string())?;
        let (positions, bytes) = match rep.save {
            Ok(SaveKind::Appended { positions, bytes })
            | Ok(SaveKind::Rewritten { positions, bytes }) => (positions, bytes),
            Ok(SaveKind::Unchanged) => (0, 0),
            Err(err) => return Err(format!("turn {turn} not saved: {err}")),
        };
        out.push(json!({"positions": positions, "bytes": bytes,
                        "kind": if turn == 0 { "first save (whole session)" } else { "append" }}));
        conv.extend(g.generated);
        conv.extend(ids(QUESTION, 10 + turn));
    }
    Ok(out)
}

/// Asks the kernel to forget the file's cached pages (clean after the save's fsync), so the
/// restore reads flash. Returns whether the request was accepted.
fn drop_page_cache(path: &Path) -> bool {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let _ = f.sync_all();
    use std::os::fd::AsRawFd;
    posix_fadvise(f.as_raw_fd(), 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED).is_ok()
}

fn only_file(dir: &Path) -> Result<std::path::PathBuf, String> {
    std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "kv"))
        .ok_or_else(|| format!("{}: no snapshot written", dir.display()))
}

/// A fresh directory of ours under `parent` (the system's temporary directory by default).
fn scratch_dir(parent: Option<&Path>) -> Result<std::path::PathBuf, String> {
    let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
    let d = parent.join(format!("edgellm-bench-restore-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    Ok(d)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
