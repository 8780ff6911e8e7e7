//! Cached prefixes: system prompts computed once, persisted under `prefixes/`, restored at
//! start-up, and copied into any session whose prompt begins with them.

use super::{PREFIXES, SessionStore, Source, StoreError, common_prefix};
use crate::engine::Engine;
use crate::kv::file::{self, SnapshotFile};
use crate::kv::{Geometry, KvCache};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::time::Instant;

/// A system prompt's K/V rows, in a cache just long enough for them.
pub(super) struct Prefix {
    pub name: String,
    pub tokens: Vec<u32>,
    pub kv: KvCache,
}

impl Prefix {
    pub fn bytes(&self) -> u64 {
        self.kv.bytes() as u64
    }
}

/// What [`SessionStore::add_system_prompt`] did.
#[derive(Clone, Debug, Serialize)]
pub struct PrefixReport {
    /// File name stem under `prefixes/`: a hash of the token ids.
    pub name: String,
    pub tokens: usize,
    /// How its rows were obtained (`file` or `new`; `refused` when a bad file was replaced).
    pub source: Source,
    pub ms: f64,
    /// Why it could not be saved, if so (it is still used from RAM).
    pub save_error: Option<String>,
}

/// The file name stem of a prefix: the first 16 hex digits of SHA-256 of the model's
/// fingerprint, the cache's context and type, and the token ids. Engines of other models or
/// settings sharing a state directory keep files of their own instead of replacing each
/// other's.
fn prefix_name(g: &Geometry, tokens: &[u32]) -> String {
    let mut h = Sha256::new();
    h.update(g.fingerprint);
    h.update(g.n_ctx.to_le_bytes());
    h.update([g.dtype.bytes() as u8]);
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    crate::kv::snapshot::hex(&h.finalize()[..8])
}

impl SessionStore {
    /// Makes `tokens` (a system prompt, or any prefix many requests share) a cached prefix:
    /// restored from its file when the file is valid, else computed and saved. Adding the same
    /// tokens twice does nothing new.
    pub fn add_system_prompt(
        &mut self,
        engine: &mut Engine,
        tokens: &[u32],
    ) -> Result<PrefixReport, StoreError> {
        let t0 = Instant::now();
        let name = prefix_name(&self.geometry, tokens);
        let n_ctx = self.geometry.n_ctx as usize;
        if tokens.is_empty() || tokens.len() >= n_ctx {
            return Err(StoreError::Prefix(format!(
                "{} tokens; it must have 1..{n_ctx} (the context)",
                tokens.len()
            )));
        }
        if let Some(p) = self.prefixes.iter().find(|p| p.name == name) {
            return Ok(PrefixReport {
                name,
                tokens: p.tokens.len(),
                source: Source::Ram,
                ms: 0.0,
                save_error: None,
            });
        }
        if self.prefixes.len() >= super::MAX_PREFIXES {
            return Err(StoreError::Prefix(format!(
                "at most {} system prompts are cached",
                super::MAX_PREFIXES
            )));
        }
        // Restored straight into a cache just long enough for it.
        let mut kv = engine.new_cache(tokens.len());
        let path = self.dir.join(PREFIXES).join(format!("{name}.kv"));
        let mut f = SnapshotFile::new(&path, self.geometry.clone());
        let (source, save_error) = match f.load(&mut kv) {
            Ok(None) if f.tokens() == tokens => (
                Source::File {
                    tokens: tokens.len(),
                    torn_tail: false,
                    recomputed: 0,
                },
                None,
            ),
            loaded => {
                let source = match loaded {
                    Ok(_) if !path.exists() => Source::New,
                    // A torn or foreign file: move it aside for a post-mortem, then recompute.
                    other => {
                        let why = match other {
                            Err(e) => e.to_string(),
                            Ok(_) => "the file holds other tokens or a torn tail".into(),
                        };
                        self.status.refused += 1;
                        tracing::warn!(file = %path.display(), "system prompt file refused: {why}");
                        if let Err(e) = file::move_aside(&path) {
                            tracing::error!(file = %path.display(), "cannot move it aside: {e}");
                        }
                        f = SnapshotFile::new(&path, self.geometry.clone());
                        Source::Refused { why, recomputed: 0 }
                    }
                };
                // Computed in a session slot: a prefix file has the engine's context, like a
                // session's, so that it is saved from a cache of that shape.
                let Some(i) = self.free_slot(engine) else {
                    return Err(StoreError::Prefix(
                        "every session held in RAM is in use by an answer: cached with a later request".into(),
                    ));
                };
                let slot = &mut self.slots[i];
                slot.session.truncate(0);
                engine.feed(&mut slot.session, tokens)?;
                let save_error = match f.save(&slot.session.kv, tokens) {
                    Ok(_) => None,
                    Err(e) => {
                        self.status.save_failures += 1;
                        self.status.last_error = Some(e.to_string());
                        tracing::error!(file = %path.display(), "system prompt not saved (used from RAM): {e}");
                        Some(e.to_string())
                    }
                };
                let copied = kv.copy_prefix_from(&slot.session.kv, tokens.len());
                debug_assert!(copied, "prefix cache has the session's shape");
                slot.session.truncate(0);
                (source, save_error)
            }
        };
        self.prefixes.push(Prefix {
            name: name.clone(),
            tokens: tokens.to_vec(),
            kv,
        });
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            name,
            tokens = tokens.len(),
            ?source,
            ms = format_args!("{ms:.1}"),
            "system prompt ready"
        );
        self.enforce_disk_budget(None);
        Ok(PrefixReport {
            name,
            tokens: tokens.len(),
            source,
            ms,
            save_error,
        })
    }

    /// Before a request in slot `i`: when a cached prefix (a system prompt, or another resident
    /// session) shares more of `prompt` than the session itself, copies its rows in. Returns the
    /// positions copied (0 when the session's own cache is the better start).
    pub(super) fn reuse_prefix(&mut self, i: usize, prompt: &[u32]) -> usize {
        // What a cache can go on from: the common prefix, or nothing when its sliding-window
        // layers no longer hold that position's window.
        let usable = |kv: &KvCache, held: &[u32]| {
            let n = common_prefix(held, prompt);
            if kv.can_keep(n) { n } else { 0 }
        };
        let own = usable(&self.slots[i].session.kv, self.slots[i].session.tokens());
        let best_prefix = self
            .prefixes
            .iter()
            .enumerate()
            .map(|(j, p)| (usable(&p.kv, &p.tokens), j))
            .max();
        let best_session = (0..self.slots.len())
            .filter(|&j| j != i && self.slots[j].id.is_some())
            .map(|j| {
                let s = &self.slots[j].session;
                (usable(&s.kv, s.tokens()), j)
            })
            .max();
        // At least one token must stay to be computed (its logits start the answer), which
        // `Engine::generate` ensures; a copy of fewer than 2 positions is not worth it.
        match (best_prefix, best_session) {
            (Some((n, j)), s) if n > own + 1 && s.is_none_or(|(m, _)| n >= m) => {
                let slot = &mut self.slots[i];
                let ok = slot.session.kv.copy_prefix_from(&self.prefixes[j].kv, n);
                debug_assert!(ok);
                slot.session.restore_tokens(&prompt[..n]);
                n
            }
            (_, Some((n, j))) if n > own + 1 => {
                let (a, b) = if i < j {
                    let (lo, hi) = self.slots.split_at_mut(j);
                    (&mut lo[i], &hi[0])
                } else {
                    let (lo, hi) = self.slots.split_at_mut(i);
                    (&mut hi[0], &lo[j])
                };
                let ok = a.session.kv.copy_prefix_from(&b.session.kv, n);
                debug_assert!(ok);
                a.session.restore_tokens(&prompt[..n]);
                n
            }
            _ => 0,
        }
    }
}
