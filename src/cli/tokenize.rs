//! `edgellm tokenize MODEL`: text from stdin to token ids, as the model's tokenizer sees it.

use super::CliResult;
use super::common::{ModelFile, ModelPath};
use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::tokenizer::Tokenizer;
use std::io::Read;

/// Tokenize standard input with the model's tokenizer and print the ids (no BOS unless the
/// model asks for one with tokenizer.ggml.add_bos_token). Only the model's vocabulary is read.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  echo 'Hello world' | edgellm tokenize smollm2-135m-q4_0.gguf
  edgellm tokenize -m model.gguf --special --json < prompt.txt")]
pub struct Args {
    #[command(flatten)]
    model: ModelFile,
    /// Recognise special tokens written in the text (e.g. <|im_start|>).
    #[arg(long)]
    special: bool,
    /// Print {"ids":[…]} instead of space-separated ids.
    #[arg(long)]
    json: bool,
}

/// Largest input accepted (a tokenizer is no place for a disk image).
const MAX_INPUT: u64 = 64 << 20;

pub fn run(a: Args) -> CliResult {
    let path = a.model.path();
    let g =
        Gguf::open(path, &OpenOptions::new()).map_err(|e| format!("{}: {e}", path.display()))?;
    let tok = Tokenizer::from_gguf(&g).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = Vec::new();
    std::io::stdin()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut text)?;
    if text.len() as u64 > MAX_INPUT {
        return Err(format!("standard input is larger than {} MiB", MAX_INPUT >> 20).into());
    }
    let ids = tok.encode_bytes(&text, true, a.special);
    if a.json {
        println!("{}", serde_json::json!({ "ids": ids }));
    } else {
        let s: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        println!("{}", s.join(" "));
    }
    Ok(())
}
