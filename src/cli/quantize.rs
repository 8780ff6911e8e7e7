//! `edgellm quantize IN OUT TYPE`.

use super::CliResult;
use edgellm::quantize::{Progress, QuantType, quantize_file};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// Requantize a GGUF model's 2-D weights with llama.cpp's type choices and reference
/// quantizers, keeping norms in F32 and all metadata; sets general.file_type.
#[derive(clap::Args)]
#[command(after_help = "\
Reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights and writes:
  q4_0 q4_1 q5_0 q5_1 q8_0 q6_k  every matrix in that type
  q4_k_m q5_k_m                   llama.cpp's mixes: Q6_K for attn_v and ffn_down of the first and
                                  last eighth of the layers and every third between
  q4_k q5_k                       every matrix in that type, the output too (llama-quantize --pure)
  f16
The output projection (token_embd.weight when tied) becomes Q6_K (Q8_0 for q8_0), rows that are
not whole blocks fall back as llama.cpp's do (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then
F16), 1-D tensors and norms are copied. Each tensor's type is the one
`llama-quantize --allow-requantize IN OUT TYPE` picks; for q4_0, q4_1 and q8_0 the data is
byte-identical too. The K-quant and Q5 data equal ggml's reference code; a llama.cpp build that
fuses multiply-adds may differ in the last bit of a few scales. OUT is written to OUT.tmp and
renamed when complete.

Example: edgellm quantize smollm2-135m-q4_1.gguf smollm2-135m-q4_0.gguf q4_0")]
pub struct Args {
    /// Input model (.gguf).
    input: PathBuf,
    /// Output model (.gguf); must differ from the input.
    output: PathBuf,
    /// Weight format: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m or f16.
    #[arg(value_name = "TYPE")]
    ty: QuantType,
    /// No progress bar even on a terminal.
    #[arg(long, short)]
    quiet: bool,
}

pub fn run(a: Args) -> CliResult {
    if a.input == a.output
        || a.output
            .canonicalize()
            .ok()
            .is_some_and(|o| a.input.canonicalize().ok() == Some(o))
    {
        return Err(format!("{}: output must differ from the input", a.output.display()).into());
    }
    let show = !a.quiet && std::io::stderr().is_terminal();
    let start = std::time::Instant::now();
    let summary = quantize_file(&a.input, &a.output, a.ty, |p| {
        if show {
            draw(&p);
        }
    })?;
    if show {
        eprint!("\r\x1b[2K");
        eprintln!(
            "{}: {} tensors ({} requantized to {}), {:.1} MiB -> {:.1} MiB in {:.1} s",
            a.output.display(),
            summary.n_tensors,
            summary.n_requantized,
            a.ty,
            mib(summary.bytes_in),
            mib(summary.bytes_out),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn draw(p: &Progress<'_>) {
    const WIDTH: usize = 30;
    let frac = if p.bytes_total == 0 {
        1.0
    } else {
        p.bytes_done as f64 / p.bytes_total as f64
    };
    let filled = ((frac * WIDTH as f64) as usize).min(WIDTH);
    let name: String = p.name.chars().take(40).collect();
    let mut e = std::io::stderr().lock();
    let _ = write!(
        e,
        "\r\x1b[2K[{}{}] {:3.0}% {}/{} {name}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        frac * 100.0,
        p.index + 1,
        p.total
    );
    let _ = e.flush();
}
