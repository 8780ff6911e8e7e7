//! The inference engine: buffers sized once at load, a persistent thread pool, sessions that
//! own their KV cache, and the generate loop.

pub mod constraint;
mod generate;
pub mod sampler;
pub mod store;

pub use generate::{FinishReason, GenOutput, GenParams, Generation, Timings, top_k_logits};
pub use sampler::{Sampler, SamplingError, SamplingParams};

use crate::kv::{KvCache, KvType};
use crate::model::Model;
use crate::model::forward::{Arena, Seqs, forward, logits_rows};
use crate::runtime::pool::{self, Pool};
use crate::runtime::profile::{Op, Profile};
use kernels_neon::{KernelError, Kernels};
use std::sync::Arc;

/// Errors of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the prompt needs {needed} positions but the context holds {n_ctx}")]
    ContextFull { needed: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    #[error("nothing to process: the prompt is empty")]
    EmptyPrompt,
    #[error("bad configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Constraint(#[from] constraint::ConstraintError),
    #[error(transparent)]
    Kernels(#[from] KernelError),
    #[error("cannot start worker threads: {0}")]
    Threads(#[from] std::io::Error),
}

/// Sizes fixed at load.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Positions in the KV cache (prompt + generated).
    pub n_ctx: usize,
    /// Tokens per prompt chunk (the batch of one forward pass).
    pub chunk: usize,
    pub threads: usize,
    pub kv_type: KvType,
    /// Most sessions one decoding step runs over ([`Engine::decode`]); 1: one at a time.
    pub max_batch: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            n_ctx: 2048,
            chunk: 64,
            threads: default_threads(),
            kv_type: KvType::F16,
            max_batch: 1,
        }
    }
}

/// The default thread count: on a big.LITTLE SoC (RK3588: 4×A76 + 4×A55) the big cores only,
/// since a matrix product split evenly waits for its slowest thread; elsewhere every core this
/// process may run on.
pub fn default_threads() -> usize {
    let allowed = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let big = big_cores(std::path::Path::new("/sys/devices/system/cpu"));
    big.map_or(allowed, |b| b.min(allowed)).max(1)
}

/// Number of CPUs with the highest `cpu_capacity` (Linux publishes it on heterogeneous ARM
/// SoCs), or `None` where the capacities are absent or all equal.
fn big_cores(sys_cpu: &std::path::Path) -> Option<usize> {
    let mut caps = Vec::new();
    for cpu in 0..1024 {
        match std::fs::read_to_string(sys_cpu.join(format!("cpu{cpu}/cpu_capacity"))) {
            Ok(s) => caps.push(s.trim().parse::<u32>().ok()?),
            Err(_) if cpu == 0 => return None,
            Err(_) => break,
        }
    }
    let max = *caps.iter().max()?;
    let big = caps.iter().filter(|&&c| c == max).count();
    (big < caps.len()).then_some(big)
}

/// Largest context accepted (bounds the KV allocation; 128k positions).
pub const MAX_CTX: usize = 1 << 17;
/// Largest prompt chunk.
pub const MAX_CHUNK: usize = 512;
/// Most sessions in one decoding step (their caches are listed on the stack).
pub const MAX_BATCH: usize = 16;

/// A conversation's state: its KV cache and the tokens whose keys and values it holds.
pub struct Session {
    pub kv: KvCache,
    tokens: Vec<u32>,
}

impl Session {
    /// Tokens whose K/V rows are in the cache, in position order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    /// Forgets every position from `n` on and returns how many positions are kept: `n`, or 0
    /// when the sliding-window layers no longer hold what position `n` attends to (a rewind
    /// deeper than their ring keeps: the session starts again, as llama.cpp's does).
    pub fn truncate(&mut self, n: usize) -> usize {
        let n = n.min(self.tokens.len());
        let n = if self.kv.can_keep(n) { n } else { 0 };
        self.tokens.truncate(n);
        n
    }
    /// Declares that the cache holds the K/V rows of `tokens` at positions `0..tokens.len()`
    /// (after restoring them from a snapshot with [`KvCache::read_rows`]). Panics if they do
    /// not fit the context, or the sliding-window layers do not hold the positions the next
    /// token attends to.
    pub fn restore_tokens(&mut self, tokens: &[u32]) {
        assert!(
            tokens.len() <= self.kv.n_ctx() && self.kv.can_keep(tokens.len()),
            "restored tokens exceed the context or the window"
        );
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
    }
}

/// What an engine holds in RAM, known before it is built: the weights (the mapped file, or
/// the packed copy that replaces its pages), one session's KV cache, the activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub weights: u64,
    pub kv_per_session: u64,
    pub arena: u64,
}

impl Footprint {
    /// The footprint of an engine of `cfg` on `model`; `None` if a size overflows.
    pub fn of(model: &Model, cfg: &EngineConfig) -> Option<Footprint> {
        let kv = session_kv_bytes(model, cfg)?;
        Some(Footprint {
            weights: model.gguf().file_size(),
            kv_per_session: kv,
            arena: Arena::bytes_for(&model.hp, cfg.chunk, cfg.n_ctx, cfg.threads, cfg.max_batch)
                as u64,
        })
    }
}

/// Bytes of one session's KV cache (its sliding-window layers in rings); `None` on overflow.
pub fn session_kv_bytes(model: &Model, cfg: &EngineConfig) -> Option<u64> {
    let hp = &model.hp;
    KvCache::bytes_for(
        hp.n_layer,
        cfg.n_ctx,
        hp.kv_dim(),
        cfg.kv_type,
        hp.kv_window(),
        cfg.chunk,
    )
}

/// One model, its kernels, its thread pool and its activation buffers.
pub struct Engine {
    model: Arc<Model>,
    kernels: &'static Kernels,
    pool: Pool,
    arena: Arena,
    cfg: EngineConfig,
    /// The CPUs its threads are pinned to (empty: not pinned).
    cpus: Vec<usize>,
}

impl Engine {
    /// Allocates every buffer for `cfg` and starts the worker threads.
    pub fn new(model: Arc<Model>, cfg: EngineConfig) -> Result<Engine, EngineError> {
        Engine::with_kernels(model, cfg, Kernels::detect()?)
    }

    /// As [`Engine::new`], the worker threads pinned to the CPUs `cpus` (a board profile's big
    /// cores); the thread that calls [`Engine::feed`] pins itself with
    /// [`Engine::pin_current_thread`].
    pub fn pinned(
        model: Arc<Model>,
        cfg: EngineConfig,
        cpus: &[usize],
    ) -> Result<Engine, EngineError> {
        Engine::build(model, cfg, Kernels::detect()?, cpus)
    }

    /// As [`Engine::new`] with an explicit kernel table.
    pub fn with_kernels(
        model: Arc<Model>,
        cfg: EngineConfig,
        kernels: &'static Kernels,
    ) -> Result<Engine, EngineError> {
        Engine::build(model, cfg, kernels, &[])
    }

    fn build(
        model: Arc<Model>,
        cfg: EngineConfig,
        kernels: &'static Kernels,
        cpus: &[usize],
    ) -> Result<Engine, EngineError> {
        if cfg.n_ctx == 0 || cfg.n_ctx > MAX_CTX {
            return Err(EngineError::Config(format!(
                "context {} must be in 1..={MAX_CTX}",
                cfg.n_ctx
            )));
        }
        if cfg.chunk == 0 || cfg.chunk > MAX_CHUNK {
            return Err(EngineError::Config(format!(
                "chunk {} must be in 1..={MAX_CHUNK}",
                cfg.chunk
            )));
        }
        if cfg.threads == 0 || cfg.threads > pool::MAX_THREADS {
            return Err(EngineError::Config(format!(
                "threads {} must be in 1..={}",
                cfg.threads,
                pool::MAX_THREADS
            )));
        }
        if cfg.max_batch == 0 || cfg.max_batch > MAX_BATCH.min(cfg.chunk) {
            return Err(EngineError::Config(format!(
                "batch {} must be in 1..={} (at most {MAX_BATCH}, and at most the chunk)",
                cfg.max_batch,
                MAX_BATCH.min(cfg.chunk)
            )));
        }
        model.pack_for(kernels, cfg.threads);
        let pool = Pool::pinned(cfg.threads, cpus)?;
        let arena = Arena::new(&model.hp, cfg.chunk, cfg.n_ctx, cfg.threads, cfg.max_batch);
        Ok(Engine {
            model,
            kernels,
            pool,
            arena,
            cfg,
            cpus: cpus.to_vec(),
        })
    }

    /// Pins the calling thread, the pool's thread 0 (the one that calls [`Engine::feed`]), to
    /// the engine's CPUs; does nothing for an engine that is not pinned.
    pub fn pin_current_thread(&self) -> std::io::Result<()> {
        Pool::pin_caller(&self.cpus)
    }

    /// The CPUs the engine's threads are pinned to (empty: not pinned).
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }
    pub fn kernels(&self) -> &'static Kernels {
        self.kernels
    }

    /// A new, empty session with its own KV cache (allocated here, once).
    pub fn new_session(&self) -> Session {
        Session {
            kv: self.new_cache(self.cfg.n_ctx),
            tokens: Vec::with_capacity(self.cfg.n_ctx),
        }
    }

    /// A KV cache of `n_ctx` positions for this engine's model, type and batches.
    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        let hp = &self.model.hp;
        KvCache::with_window(
            hp.n_layer,
            n_ctx,
            hp.n_head_kv,
            hp.head_dim,
            self.cfg.kv_type,
            hp.kv_window(),
            self.cfg.chunk,
        )
    }

    /// Turns per-op timing on or off (off at load). The counters keep accumulating across
    /// calls until [`Profile::reset`] through [`Engine::profile_mut`].
    pub fn set_profiling(&mut self, on: bool) {
        self.arena.prof.set_enabled(on);
    }

    /// Per-op times accumulated while profiling was on.
    pub fn profile(&self) -> &Profile {
        &self.arena.prof
    }

    /// To reset the counters, or record work done outside the engine (sampling).
    pub fn profile_mut(&mut self) -> &mut Profile {
        &mut self.arena.prof
    }

    /// Bytes of the activation buffers.
    pub fn arena_bytes(&self) -> usize {
        self.arena.bytes()
    }

    /// Refuses tokens that are none, outside the vocabulary or beyond the session's context.
    fn check_feed(&self, s: &Session, tokens: &[u32]) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let n_vocab = self.model.hp.n_vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::BadToken { id, n_vocab });
        }
        let needed = s.tokens.len() + tokens.len();
        if needed > s.kv.n_ctx() {
            return Err(EngineError::ContextFull {
                needed,
                n_ctx: s.kv.n_ctx(),
            });
        }
        Ok(())
    }

    /// Appends `tokens` to the session (in chunks) and returns the logits after the last one.
    /// Allocates nothing.
    pub fn feed(&mut self, s: &mut Session, tokens: &[u32]) -> Result<&mut [f32], EngineError> {
        self.check_feed(s, tokens)?;
        let t0 = self.arena.prof.start();
        let n_chunks = tokens.len().div_ceil(self.cfg.chunk);
        for (i, chunk) in tokens.chunks(self.cfg.chunk).enumerate() {
            self.forward_chunk(s, chunk, i + 1 == n_chunks);
        }
        self.count_fed(t0, tokens.len());
        Ok(&mut self.arena.logits)
    }

    /// One forward pass over `chunk` at the session's next position, its tokens appended;
    /// `logits`: compute the last position's logits into the arena.
    fn forward_chunk(&mut self, s: &mut Session, chunk: &[u32], logits: bool) {
        let pos0 = s.tokens.len();
        let seqs = Seqs::One {
            kv: &mut s.kv,
            pos0,
        };
        forward(
            self.kernels,
            &self.pool,
            &self.model,
            &mut self.arena,
            seqs,
            chunk,
            logits,
        );
        s.tokens.extend_from_slice(chunk);
    }

    /// Appends `tokens[i]` to `sessions[i]`, all in one forward pass, and returns the logits
    /// after each, `[sessions.len()][n_vocab]`: one step of decoding several sessions, which
    /// streams the weights once for all of them. A session's logits have the bits
    /// [`Engine::feed`] of its token alone gives, whatever the sessions beside it (the batch
    /// tests hold it to that). At most [`EngineConfig::max_batch`] sessions. Allocates nothing.
    pub fn decode(
        &mut self,
        sessions: &mut [&mut Session],
        tokens: &[u32],
    ) -> Result<&mut [f32], EngineError> {
        let b = sessions.len();
        if b == 0 || b != tokens.len() {
            return Err(EngineError::Config(format!(
                "a step needs one token a session, got {} tokens for {b} sessions",
                tokens.len()
            )));
        }
        if b > self.cfg.max_batch {
            return Err(EngineError::Config(format!(
                "{b} sessions in one step, the engine was sized for {}",
                self.cfg.max_batch
            )));
        }
        for (s, t) in sessions.iter().zip(tokens) {
            self.check_feed(s, std::slice::from_ref(t))?;
            if s.kv.n_ctx() > self.cfg.n_ctx {
                return Err(EngineError::Config(format!(
                    "a session of {} positions in an engine of {}",
                    s.kv.n_ctx(),
                    self.cfg.n_ctx
                )));
            }
        }
        if b == 1 {
            return self.feed(sessions[0], tokens);
        }
        let t0 = self.arena.prof.start();
        let mut pos: heapless::Vec<usize, MAX_BATCH> = heapless::Vec::new();
        let mut kvs: heapless::Vec<&mut KvCache, MAX_BATCH> = heapless::Vec::new();
        for s in sessions.iter_mut() {
            // Within MAX_BATCH: checked above.
            let _ = pos.push(s.tokens.len());
            let _ = kvs.push(&mut s.kv);
        }
        let seqs = Seqs::Each {
            kvs: &mut kvs,
            pos: &pos,
        };
        let (k, pool, model) = (self.kernels, &self.pool, &*self.model);
        forward(k, pool, model, &mut self.arena, seqs, tokens, false);
        drop(kvs);
        let out = b * model.hp.n_vocab;
        let mut room = std::mem::take(&mut self.arena.batch_logits);
        logits_rows(k, pool, model, &mut self.arena, 0..b, &mut room[..out]);
        self.arena.batch_logits = room;
        for (s, &t) in sessions.iter_mut().zip(tokens) {
            s.tokens.push(t);
        }
        self.count_fed(t0, b);
        Ok(&mut self.arena.batch_logits[..out])
    }

    /// Adds a feed of `n` tokens begun at `t0` to the profile (when profiling is on).
    fn count_fed(&mut self, t0: Option<std::time::Instant>, n: usize) {
        if let Some(t0) = t0 {
            let p = &mut self.arena.prof;
            p.wall_ns += t0.elapsed().as_nanos() as u64;
            p.tokens += n as u64;
        }
    }

    /// Floats of the `room` that [`Engine::feed_each`] needs: one pass's logits, `chunk ×
    /// n_vocab`.
    pub fn logits_room(&self) -> usize {
        self.cfg.chunk * self.model.hp.n_vocab
    }

    /// Appends `tokens` to the session as [`Engine::feed`] does, and calls `each(i, logits)`
    /// with the logits after `tokens[i]` for every `i` in `from..tokens.len()`, in order: what
    /// scoring a text needs (perplexity, KL divergence), where `feed` keeps the last only.
    ///
    /// `room` is the caller's, at least [`Engine::logits_room`] floats, allocated once: a
    /// pass's logits land there before `each` reads them. Decoding never needs it, so the
    /// engine does not hold it. Each position's logits have the bits `feed` returns after that
    /// token (see [`logits_rows`](crate::model::forward::logits_rows)). Allocates nothing.
    pub fn feed_each(
        &mut self,
        s: &mut Session,
        tokens: &[u32],
        from: usize,
        room: &mut [f32],
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.check_feed(s, tokens)?;
        if room.len() < self.logits_room() {
            return Err(EngineError::Config(format!(
                "the logits room holds {} floats, {} needed",
                room.len(),
                self.logits_room()
            )));
        }
        let n_vocab = self.model.hp.n_vocab;
        let t0 = self.arena.prof.start();
        for (c, chunk) in tokens.chunks(self.cfg.chunk).enumerate() {
            let i0 = c * self.cfg.chunk;
            self.forward_chunk(s, chunk, false);
            // This chunk's tokens from `from` on.
            let first = from.max(i0).min(i0 + chunk.len()) - i0;
            if first == chunk.len() {
                continue;
            }
            let rows = first..chunk.len();
            let out = &mut room[..rows.len() * n_vocab];
            logits_rows(
                self.kernels,
                &self.pool,
                &self.model,
                &mut self.arena,
                rows,
                out,
            );
            for (j, logits) in out.chunks_exact(n_vocab).enumerate() {
                each(i0 + first + j, logits);
            }
        }
        self.count_fed(t0, tokens.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::big_cores;

    #[test]
    fn big_cores_counts_the_fastest_cluster_of_a_big_little_soc() {
        let dir = tempfile::tempdir().unwrap();
        let write = |caps: &[u32]| {
            for (i, c) in caps.iter().enumerate() {
                let d = dir.path().join(format!("cpu{i}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join("cpu_capacity"), format!("{c}\n")).unwrap();
            }
        };
        assert_eq!(big_cores(dir.path()), None, "no capacity files");
        write(&[414, 414, 414, 414, 1024, 1024, 1024, 1024]); // RK3588
        assert_eq!(big_cores(dir.path()), Some(4));
        write(&[1024; 8]); // all equal: not big.LITTLE
        assert_eq!(big_cores(dir.path()), None);
    }
}
