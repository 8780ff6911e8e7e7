//! `edgellm kv inspect|verify FILE`: look into a KV snapshot (`run --session-file`) and check it.

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

verify exits with status 1 and prints the reason (section and offset) on any fault: a bad
header, checksum or length, a torn last record, another model, context or cache type.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Print the header, the records and the sizes of a snapshot.
    Inspect(FileArgs),
    /// Check every checksum and length (and the model, with -m); exit 1 on any fault.
    Verify(FileArgs),
}

#[derive(clap::Args)]
struct FileArgs {
    /// The snapshot file.
    file: PathBuf,
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

/// The geometry `f` asks for: the model's, with the file's context and type unless given.
fn wanted(f: &FileArgs, file_g: &Geometry) -> Result<Option<Geometry>, String> {
    let Some(path) = &f.model else {
        return Ok(None);
    };
    let model = Model::load(path, &LoadOptions::default()).map_err(|e| e.to_string())?;
    let ctx = f.ctx.unwrap_or(file_g.n_ctx as usize);
    Ok(Some(Geometry::of(
        &model,
        ctx,
        f.kv_type.unwrap_or(file_g.dtype),
    )))
}

fn read(path: &Path) -> Result<(u64, Parsed), String> {
    // I/O errors already name the file; format errors say where in it.
    let (bytes, parsed) = file::read(path).map_err(|e| match e {
        KvError::Io { .. } => e.to_string(),
        e => format!("{}: {e}", path.display()),
    })?;
    Ok((bytes.len() as u64, parsed))
}

fn inspect(f: &FileArgs) -> CliResult {
    let (size, p) = read(&f.file)?;
    let g = &p.geometry;
    println!("file:         {}", f.file.display());
    println!("size:         {size} bytes ({} valid)", p.valid_len);
    println!("version:      {}", edgellm::kv::snapshot::VERSION);
    println!("fingerprint:  {}", hex(&g.fingerprint));
    println!("n_layer:      {}", g.n_layer);
    println!("kv_dim:       {}", g.kv_dim);
    println!("cache type:   {}", g.dtype);
    println!("n_ctx:        {}", g.n_ctx);
    println!("tokens:       {}", p.tokens.len());
    println!("records:      {}", p.records.len());
    for (i, r) in p.records.iter().enumerate() {
        println!(
            "  #{i:<4} offset {:>10}  positions {:>6}..{:<6} {:>10} bytes",
            r.offset,
            r.first,
            r.first + r.count,
            r.len()
        );
    }
    if let Some(t) = &p.torn {
        println!("torn tail:    {t}");
    }
    if let Some(want) = wanted(f, g)? {
        match g.check_matches(&want) {
            Ok(()) => println!(
                "model:        matches {}",
                f.model.as_ref().unwrap().display()
            ),
            Err(e) => println!("model:        does not match: {e}"),
        }
    }
    Ok(())
}

fn verify(f: &FileArgs) -> CliResult {
    let (_, p) = read(&f.file)?;
    let name = f.file.display();
    if let Some(t) = &p.torn {
        return Err(format!(
            "{name}: {t} (a load recovers the first {} tokens)",
            p.tokens.len()
        )
        .into());
    }
    if let Some(want) = wanted(f, &p.geometry)? {
        p.geometry
            .check_matches(&want)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    println!(
        "{name}: ok ({} tokens in {} records)",
        p.tokens.len(),
        p.records.len()
    );
    Ok(())
}
