//! Options shared by the subcommands that load a model and run it, and by those that read the
//! daemon's state directory.

use edgellm::engine::{Engine, EngineConfig, default_threads};
use edgellm::kv::KvType;
use edgellm::model::{LoadOptions, Model};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Which model to load and how to size its engine: the flags every subcommand that runs or
/// sizes a model shares, with one set of defaults. `T` is how the threads are given: one count
/// ([`Threads`], to run), a list of counts to measure ([`ThreadList`], `bench`) or none
/// ([`NoThreads`], `inspect`). `M` is how the model file is given: with `-m` ([`ModelFlag`])
/// or, where it is the only argument, also on its own ([`ModelFile`], `inspect`).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs<T: clap::Args = Threads, M: clap::Args + ModelPath = ModelFlag> {
    #[command(flatten)]
    pub model: M,
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

/// Where a subcommand's model file was given.
pub trait ModelPath {
    fn path(&self) -> &Path;
}

/// The model file with `-m` (or `EDGELLM_MODEL`).
#[derive(clap::Args, Clone, Debug)]
pub struct ModelFlag {
    /// Model file (.gguf: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16 or F32 weights).
    #[arg(short = 'm', long, env = "EDGELLM_MODEL")]
    model: PathBuf,
}

impl ModelPath for ModelFlag {
    fn path(&self) -> &Path {
        &self.model
    }
}

/// The model file of a subcommand that takes nothing else: on its own (`edgellm inspect
/// model.gguf`, as llama.cpp's tools take it), with `-m`, or from `EDGELLM_MODEL`. On its own
/// and with `-m` is refused (which one was meant?); either wins over the environment.
/// Written by hand, not derived: clap counts a value from the environment as given on the
/// command line, and would refuse the file on its own whenever `EDGELLM_MODEL` is set.
#[derive(Clone, Debug)]
pub struct ModelFile(PathBuf);

impl ModelPath for ModelFile {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl ModelFile {
    const POSITIONAL: &str = "model_file";
    const FLAG: &str = "model";
    const ENV: &str = "EDGELLM_MODEL";

    fn from_env() -> Option<PathBuf> {
        std::env::var_os(Self::ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    }
}

impl clap::FromArgMatches for ModelFile {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        m.get_one::<PathBuf>(Self::POSITIONAL)
            .or_else(|| m.get_one::<PathBuf>(Self::FLAG))
            .cloned()
            .or_else(Self::from_env)
            .map(ModelFile)
            .ok_or_else(|| {
                clap::Error::raw(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "no model file: give it as MODEL, with -m MODEL, or in EDGELLM_MODEL\n",
                )
            })
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Args for ModelFile {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, value_parser};
        let alone = Arg::new(Self::POSITIONAL)
            .value_name("MODEL")
            .value_parser(value_parser!(PathBuf))
            .conflicts_with(Self::FLAG)
            .help("Model file (.gguf), on its own or with -m [env: EDGELLM_MODEL]");
        // Required unless the environment names one: clap then says what is missing, in the
        // subcommand's own usage.
        let alone = match Self::from_env() {
            Some(_) => alone,
            None => alone.required_unless_present(Self::FLAG),
        };
        cmd.arg(alone).arg(
            Arg::new(Self::FLAG)
                .short('m')
                .long("model")
                .value_name("MODEL")
                .value_parser(value_parser!(PathBuf))
                .help("Model file (.gguf), as MODEL: one or the other, not both"),
        )
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
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

impl<T: clap::Args, M: clap::Args + ModelPath> ModelArgs<T, M> {
    /// The model file.
    pub fn path(&self) -> &Path {
        self.model.path()
    }

    /// Maps the model (mlocked if asked); errors name the file.
    pub fn load_model(&self) -> Result<Model, String> {
        Model::load(self.path(), &LoadOptions { mlock: self.mlock }).map_err(|e| e.to_string())
    }

    /// The engine's sizes with `threads` workers.
    pub fn engine_config(&self, threads: usize) -> EngineConfig {
        EngineConfig {
            n_ctx: self.ctx,
            chunk: self.chunk,
            threads,
            kv_type: self.kv_type,
            max_batch: 1,
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
        let path = self.path();
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

/// The daemon's state directory, for the subcommands that read it (`audit`, `sessions`).
#[derive(clap::Args)]
pub struct StateDirArgs {
    /// The daemon's state directory (state.dir; the unit's is /var/lib/edgellm).
    #[arg(long, env = "EDGELLM_STATE_DIR", default_value = "/var/lib/edgellm")]
    pub state_dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The shape an answer must have: the flags `run` and `ask` share.
#[derive(clap::Args, Clone, Debug, Default)]
#[group(id = "answer_format", multiple = false)]
pub struct FormatArgs {
    /// The answer is JSON valid under this JSON Schema (a file). Keywords the grammar cannot
    /// enforce (e.g. uniqueItems) are refused by name.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// The answer is a JSON object of any shape.
    #[arg(long)]
    pub json_object: bool,
    /// The answer matches this regular expression, whole (no backtracking: any pattern runs
    /// in bounded time).
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    /// The answer is exactly one of these, comma-separated (e.g. low,high,critical).
    #[arg(long, value_name = "A,B,C", value_delimiter = ',')]
    pub choice: Option<Vec<String>>,
    /// The answer follows this Lark grammar (a file, llguidance's dialect).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

/// Largest schema or grammar file read (the service bounds what it compiles further).
const MAX_FORMAT_FILE: u64 = 16 << 20;

impl FormatArgs {
    /// The shape asked for, if any, with its file read.
    pub fn shape(&self) -> Result<Option<edgellm::service::Shape>, String> {
        use edgellm::service::Shape;
        let read = |flag: &str, p: &Path| -> Result<String, String> {
            let meta = std::fs::metadata(p).map_err(|e| format!("{flag} {}: {e}", p.display()))?;
            if meta.len() > MAX_FORMAT_FILE {
                return Err(format!("{flag} {}: larger than 16 MiB", p.display()));
            }
            std::fs::read_to_string(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
        };
        Ok(if let Some(p) = &self.json_schema {
            let text = read("--json-schema", p)?;
            let v = serde_json::from_str(&text)
                .map_err(|e| format!("--json-schema {}: not JSON: {e}", p.display()))?;
            Some(Shape::JsonSchema(v))
        } else if self.json_object {
            Some(Shape::JsonObject)
        } else if let Some(r) = &self.regex {
            Some(Shape::Regex(r.clone()))
        } else if let Some(c) = &self.choice {
            Some(Shape::Choice(c.clone()))
        } else if let Some(p) = &self.grammar {
            Some(Shape::Lark(read("--grammar", p)?))
        } else {
            None
        })
    }
}
