//! `edgellm kv inspect FILE` / `edgellm kv verify FILE...`: look into a KV snapshot
//! (`run --session-file`) and check snapshots.

use super::CliResult;
use edgellm::kv::snapshot::{Geometry, KvError, Parsed, hex};
use edgellm::kv::{KvType, file};
use edgellm::model::{LoadOptions, Model};
use std::path::{Path, PathBuf};

/// Inspect or verify a KV snapshot file.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm kv inspect session.kv
  edgellm kv verify session.kv -m smollm2-135m-q4_0.gguf --ctx 2048
  edgellm kv verify /var/lib/edgellm/sessions/*.kv -m model.gguf

The files given on their own are snapshots; the model, when one is checked, comes with -m.
verify prints one line per file, \"FILE: ok (...)\" or \"FILE: \" and the fault (section and
offset): a bad header, checksum or length, a torn last record, another model, context or
cache type. It checks every file given and exits with status 1 if any of them is faulty.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print the header, the records and the sizes of a snapshot.
    Inspect(InspectArgs),
    /// Check every checksum and length (and the model, with -m); exit 1 on any fault.
    Verify(VerifyArgs),
}

#[derive(clap::Args)]
struct InspectArgs {
    /// The snapshot file.
    file: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
}

#[derive(clap::Args)]
struct VerifyArgs {
    /// The snapshot files (the model, with -m, is loaded once for all of them).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    model: ModelArgs,
}

#[derive(clap::Args)]
struct ModelArgs {
    /// Check that the snapshot belongs to this model (.gguf).
    #[arg(short = 'm', long)]
    model: Option<PathBuf>,
    /// With -m: the context the snapshot must have been made with.
    #[arg(short = 'c', long = "ctx", requires = "model")]
    ctx: Option<usize>,
    /// With -m: the KV cache type the snapshot must hold.
    #[arg(long, requires = "model", value_parser = KvType::parse)]
    kv_type: Option<KvType>,
}

pub fn run(a: Args) -> CliResult {
    match a.command {
        Command::Inspect(f) => inspect(&f),
        Command::Verify(f) => verify(&f),
    }
}

impl ModelArgs {
    /// The model of `-m`, loaded (once: on a board a load is seconds of work).
    fn load(&self) -> Result<Option<Model>, String> {
        self.model
            .as_ref()
            .map(|path| Model::load(path, &LoadOptions::default()).map_err(|e| e.to_string()))
            .transpose()
    }

    /// The geometry asked for: the model's, with the file's context and type unless given.
    fn wanted(&self, model: &Model, file_g: &Geometry) -> Geometry {
        let ctx = self.ctx.unwrap_or(file_g.n_ctx as usize);
        Geometry::of(model, ctx, self.kv_type.unwrap_or(file_g.dtype))
    }
}

fn read(path: &Path) -> Result<(u64, Parsed), String> {
    // I/O errors already name the file; format errors say where in it. A model given where a
    // snapshot goes (as llama.cpp's tools take a model on its own) is told where it belongs.
    let (bytes, parsed) = file::read(path).map_err(|e| match e {
        KvError::Io { .. } => e.to_string(),
        KvError::BadMagic { offset: 0, .. } if is_gguf(path) => format!(
            "{} is a GGUF model, not a KV snapshot: give the model with -m",
            path.display()
        ),
        e => format!("{}: {e}", path.display()),
    })?;
    Ok((bytes.len() as u64, parsed))
}

/// Whether `path` begins with GGUF's magic.
fn is_gguf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"GGUF")
}

fn inspect(f: &InspectArgs) -> CliResult {
    let (size, p) = read(&f.file)?;
    let g = &p.geometry;
    println!("file:         {}", f.file.display());
    println!("size:         {size} bytes ({} valid)", p.valid_len);
    println!("version:      {}", g.version);
    println!("fingerprint:  {}", hex(&g.fingerprint));
    println!("n_layer:      {}", g.n_layer);
    println!("kv_dim:       {}", g.kv_dim);
    println!("cache type:   {}", g.dtype);
    println!("n_ctx:        {}", g.n_ctx);
    match g.window {
        Some(w) => println!(
            "window:       {} positions on {} of {} layers (rows from position {})",
            w.size,
            g.sliding_layers(),
            g.n_layer,
            p.window_from
        ),
        None => println!("window:       none"),
    }
    println!("tokens:       {}", p.tokens.len());
    println!("records:      {}", p.records.len());
    for (i, r) in p.records.iter().enumerate() {
        println!(
            "  #{i:<4} offset {:>10}  positions {:>6}..{:<6} {:>10} bytes{}",
            r.offset,
            r.first,
            r.first + r.count,
            r.len(),
            if r.window_rows < r.count {
                format!("  (window rows: last {})", r.window_rows)
            } else {
                String::new()
            }
        );
    }
    if let Some(t) = &p.torn {
        println!("torn tail:    {t}");
    }
    if let (Some(model), Some(path)) = (f.model.load()?, &f.model.model) {
        match g.check_matches(&f.model.wanted(&model, g)) {
            Ok(()) => println!("model:        matches {}", path.display()),
            Err(e) => println!("model:        does not match: {e}"),
        }
    }
    Ok(())
}

fn verify(f: &VerifyArgs) -> CliResult {
    let model = f.model.load()?;
    let mut faulty = 0;
    for path in &f.files {
        match verify_one(path, &f.model, model.as_ref()) {
            Ok(summary) => println!("{}: ok ({summary})", path.display()),
            Err(why) => {
                faulty += 1;
                println!("{why}");
            }
        }
    }
    match faulty {
        0 => Ok(()),
        n => Err(format!("{n} of {} snapshot files are faulty (above)", f.files.len()).into()),
    }
}

/// One file's verdict: its summary, or the fault (the file's name first).
fn verify_one(path: &Path, m: &ModelArgs, model: Option<&Model>) -> Result<String, String> {
    let (_, p) = read(path)?;
    let name = path.display();
    if let Some(t) = &p.torn {
        return Err(format!(
            "{name}: {t} (a load recovers the first {} tokens)",
            p.tokens.len()
        ));
    }
    if let Some(model) = model {
        p.geometry
            .check_matches(&m.wanted(model, &p.geometry))
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(format!(
        "{} tokens in {} records",
        p.tokens.len(),
        p.records.len()
    ))
}
