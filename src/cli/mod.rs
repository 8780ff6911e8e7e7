//! Command-line front end. Each subcommand is a file with an `Args` struct and a `run`
//! returning a [`CliResult`] whose error `main` prints once.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod inspect;
mod kernels;
mod quantize;

/// edgellm: offline LLM inference for ARM SoCs (Q4_0/Q4_1/Q8_0 GGUF models).
#[derive(Parser)]
#[command(name = "edgellm", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the CPU features and the kernel path that would be used (EDGELLM_KERNELS overrides).
    Kernels(kernels::Args),
    /// Show a GGUF model's architecture, sizes, quant types, tokenizer and memory needs.
    Inspect(inspect::Args),
    /// Requantize a GGUF model to q4_0, q4_1, q8_0 or f16 (llama.cpp-identical tensor bytes).
    Quantize(quantize::Args),
}

/// Parses the command line, runs the subcommand, prints an error as `edgellm: …` on failure.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Kernels(a) => kernels::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Quantize(a) => quantize::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgellm: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A user-facing error: one line, already carrying its context (file, key, field).
pub type CliResult = Result<(), Box<dyn std::error::Error>>;
