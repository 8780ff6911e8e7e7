//! Options shared by the subcommands that load a model and run it.

use edgellm::engine::{Engine, EngineConfig, default_threads};
use edgellm::kv::KvType;
use edgellm::model::{LoadOptions, Model};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Which model to load and how to size its engine: the flags every subcommand that runs or
/// sizes a model shares, with one set of defaults. `T` is how the threads are given: one count
/// ([`Threads`], to run), a list of counts to measure ([`ThreadList`], `bench`) or none
/// ([`NoThreads`], `inspect`).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs<T: clap::Args = Threads> {
    /// Model file (.gguf: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 or F32 weights).
    #[arg(short = 'm', long, env = "EDGELLM_MODEL")]
    pub model: PathBuf,
    #[command(flatten)]
    pub threads: T,
    /// Context length in tokens: the KV cache is allocated for this many positions.
    #[arg(short = 'c', long = "ctx", default_value_t = 2048)]
    pub ctx: usize,
    /// Prompt tokens processed per forward pass.
    #[arg(long, default_value_t = 64)]
    pub chunk: usize,
    /// KV cache element type: f16 (as llama.cpp) or f32 (twice the memory, more precise).
    #[arg(long, default_value = "f16", value_parser = KvType::parse)]
    pub kv_type: KvType,
    /// Lock the weights in RAM (mlock): no page-out mid-answer. Needs RLIMIT_MEMLOCK.
    #[arg(long)]
    pub mlock: bool,
}

/// One worker thread count.
#[derive(clap::Args, Clone, Debug)]
pub struct Threads {
    /// Worker threads (default: the big cores of a big.LITTLE SoC, else every core we may run on).
    #[arg(short = 't', long = "threads")]
    pub n: Option<usize>,
}

/// Thread counts to measure one after the other.
#[derive(clap::Args, Clone, Debug)]
pub struct ThreadList {
    /// Thread counts to measure, comma-separated.
    #[arg(
        short = 't',
        long = "threads",
        value_delimiter = ',',
        default_value = "1,2"
    )]
    pub list: Vec<usize>,
}

/// No threads: for a subcommand that sizes an engine without running one (`inspect`).
#[derive(clap::Args, Clone, Debug)]
pub struct NoThreads {}

/// The loaded model and engine, with the load time.
pub struct Loaded {
    pub engine: Engine,
    pub load_ms: f64,
}

impl<T: clap::Args> ModelArgs<T> {
    /// Maps the model (mlocked if asked); errors name the file.
    pub fn load_model(&self) -> Result<Model, String> {
        Model::load(&self.model, &LoadOptions { mlock: self.mlock }).map_err(|e| e.to_string())
    }

    /// The engine's sizes with `threads` workers.
    pub fn engine_config(&self, threads: usize) -> EngineConfig {
        EngineConfig {
            n_ctx: self.ctx,
            chunk: self.chunk,
            threads,
            kv_type: self.kv_type,
        }
    }
}

impl ModelArgs {
    pub fn threads(&self) -> usize {
        self.threads.n.unwrap_or_else(default_threads)
    }

    /// Maps the model and allocates the engine; errors name the file.
    pub fn load(&self) -> Result<Loaded, String> {
        let t0 = Instant::now();
        let path = &self.model;
        let model = self.load_model()?;
        let cfg = self.engine_config(self.threads());
        let engine = Engine::new(Arc::new(model), cfg).map_err(|e| e.to_string())?;
        release_freed_heap();
        let load_ms = t0.elapsed().as_secs_f64() * 1000.0;
        tracing::info!(
            model = %path.display(),
            kernels = engine.kernels().name(),
            threads = engine.config().threads,
            ctx = engine.config().n_ctx,
            load_ms = format_args!("{load_ms:.1}"),
            "model loaded"
        );
        Ok(Loaded { engine, load_ms })
    }
}

/// Hands the heap that loading freed (parsing the vocabulary and merges makes many temporary
/// strings) back to the kernel, so the resident size is what the engine keeps.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own heap and returns unused pages; it has no
    // preconditions and is thread-safe.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

/// Byte sizes (`4096`, `64K`, `256M`, `2G`): one parser for flags and configuration keys.
pub use edgellm::daemon::parse_size;
