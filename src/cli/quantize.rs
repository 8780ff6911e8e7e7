//! `edgellm quantize IN OUT TYPE`.

use super::CliResult;
use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::quantize::{Progress, QuantType, plan, quantize_file, requantized};
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

An input whose weights are already quantized (a Q4_K_M or Q4_1 file, say) is refused unless
--allow-requantize is given: every rounding adds its error to the last one, so a file made that
way answers worse than one quantized once from F16 (measure it: `edgellm perplexity
--kl-divergence`). Quantize from the F16/BF16 original where there is one.

Example: edgellm quantize model-f16.gguf model-q4_0.gguf q4_0")]
pub struct Args {
    /// Input model (.gguf).
    input: PathBuf,
    /// Output model (.gguf); must differ from the input.
    output: PathBuf,
    /// Weight format: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m or f16.
    #[arg(value_name = "TYPE")]
    ty: QuantType,
    /// Quantize weights that are already quantized again (a warning says how many); without
    /// it such an input is refused, as llama-quantize refuses it.
    #[arg(long)]
    allow_requantize: bool,
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
    check_requantization(&a)?;
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

/// Refuses an input whose quantized weights would be rounded again, or with
/// --allow-requantize warns how many are.
fn check_requantization(a: &Args) -> CliResult {
    let src = Gguf::open(&a.input, &OpenOptions::new())?;
    let plan = plan(&src, a.ty);
    let again: Vec<_> = requantized(&plan).collect();
    let Some(first) = again.first() else {
        return Ok(());
    };
    let what = format!(
        "{} of {} tensors are already quantized and would be quantized again (e.g. {} {} -> {})",
        again.len(),
        plan.len(),
        first.name,
        first.from.name(),
        first.to.name()
    );
    if !a.allow_requantize {
        return Err(format!(
            "{}: {what}; this loses quality on top of the first quantization. Quantize from the \
             F16/BF16 original, or pass --allow-requantize to do it anyway",
            a.input.display()
        )
        .into());
    }
    if !a.quiet {
        eprintln!(
            "edgellm: warning: {}: {what}; the output carries both roundings' error",
            a.input.display()
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
