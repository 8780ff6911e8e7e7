//! Command-line front end. Each subcommand is a file with an `Args` struct and a `run`
//! returning a [`CliResult`] whose error `main` prints once.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod ask;
mod audit;
mod bench;
mod bench_batch;
mod bench_bw;
mod bench_grammar;
mod bench_restore;
mod board;
mod common;
mod inspect;
mod kernels;
mod kv;
mod load;
mod logring;
mod modbus;
mod perplexity;
mod profile;
mod quantize;
mod run;
mod serve;
mod sessions;
mod tokenize;

/// edgellm: offline LLM inference for ARM SoCs (Q4_0/Q4_1/Q8_0 GGUF models).
#[derive(Parser)]
#[command(name = "edgellm", version, about, long_about = None)]
struct Cli {
    /// More log output on stderr (-v: info, -vv: debug). EDGELLM_LOG=<filter> overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show the CPU features and the kernel path that would be used (EDGELLM_KERNELS overrides).
    Kernels(kernels::Args),
    /// Show a GGUF model's architecture, sizes, quant types, tokenizer and memory needs.
    Inspect(inspect::Args),
    /// Generate a completion for a prompt (raw text, or a chat message with --chat).
    Run(run::Args),
    /// Measure prompt-processing and generation speed (tokens/s), like llama-bench.
    Bench(bench::Args),
    /// Measure a model's perplexity over a text, or its KL divergence from a reference model's
    /// saved logits, like llama-perplexity.
    Perplexity(perplexity::Args),
    /// Tokenize standard input with a model's tokenizer and print the ids.
    Tokenize(tokenize::Args),
    /// Inspect or verify a KV snapshot file (`run --session-file`).
    Kv(kv::Args),
    /// Requantize a GGUF model (q4_0 … q8_0, q4_k_m, q5_k_m, f16) with llama.cpp's type choices.
    Quantize(quantize::Args),
    /// Run the appliance daemon: answer requests over MQTT (embedded broker by default).
    Serve(serve::Args),
    /// Ask a running daemon a question over MQTT and stream the answer.
    Ask(ask::Args),
    /// Board profiles: list them, show one with its estimates, detect this machine's.
    Board(board::Args),
    /// The daemon's audit trail: list and show entries, verify the chain, replay an answer.
    Audit(audit::Args),
    /// The named sessions of a state directory: list them, show a conversation, delete one.
    Sessions(sessions::Args),
    /// Modbus: the register map, the FORMAT values and a format's typed registers.
    Modbus(modbus::Args),
}

/// Parses the command line, runs the subcommand, prints an error as `edgellm: …` on failure.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon sets up its logs itself, at its configuration's level.
    if !matches!(cli.command, Command::Serve(_)) {
        init_logging(cli.verbose, "warn");
    }
    let result = match cli.command {
        Command::Serve(a) => serve::run(a, cli.verbose),
        Command::Ask(a) => ask::run(a),
        Command::Run(a) => run::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Kernels(a) => kernels::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Kv(a) => kv::run(a),
        Command::Board(a) => board::run(a),
        Command::Audit(a) => audit::run(a),
        Command::Sessions(a) => sessions::run(a),
        Command::Modbus(a) => modbus::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgellm: {e}");
            if e.is::<Refused>() {
                ExitCode::from(Refused::EXIT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Logs go to stderr (stdout carries the answers): `default` (a tracing filter) unless -v asks
/// for more, or as `EDGELLM_LOG` says (a filter such as `edgellm=debug`).
fn init_logging(verbose: u8, default: &str) {
    let _ = init_reloadable_logging(verbose, default, None);
}

/// Sets a new filter for the logs installed by [`init_reloadable_logging`].
type SetFilter = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// As [`init_logging`], and returns what sets another filter later (the daemon's SIGHUP). It
/// refuses while `EDGELLM_LOG` or `-v` decide the filter: they win over the file.
/// With `ring`, each line is also kept there (the daemon's last lines, for its console).
fn init_reloadable_logging(
    verbose: u8,
    default: &str,
    ring: Option<std::sync::Arc<logring::LogRing>>,
) -> SetFilter {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let default = match verbose {
        0 => default,
        1 => "info",
        _ => "debug",
    };
    let from_env = EnvFilter::try_from_env("EDGELLM_LOG").ok();
    let fixed = from_env.is_some() || verbose > 0;
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(default));
    // The filter is the log writer's own, not the whole subscriber's: the embedded broker's
    // watcher below must see rumqttd's events that the filter turns off.
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let writer = tracing_subscriber::fmt::layer()
        .with_writer(logring::Tee(ring))
        .with_target(false)
        // Colours only on a terminal: journald and log files get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    let subscriber = tracing_subscriber::registry().with(writer);
    // Last: it logs from within rumqttd's events, after the writer has seen them.
    #[cfg(feature = "embedded-broker")]
    let subscriber = subscriber.with(edgellm::daemon::embedded_log::layer());
    let _ = subscriber.try_init();
    Box::new(move |level: &str| {
        if fixed {
            return Err("EDGELLM_LOG or -v sets the log filter, and wins over log.level".into());
        }
        let f = EnvFilter::try_new(level).map_err(|e| format!("{level:?}: {e}"))?;
        handle.reload(f).map_err(|e| e.to_string())
    })
}

/// A user-facing error: one line, already carrying its context (file, key, field).
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// The daemon will not start as it is set up (a refused configuration, a model that does not
/// load): starting it again cannot help. It exits with 78 (`EX_CONFIG` of sysexits.h), which
/// the systemd unit names in `RestartPreventExitStatus=`, so a corrupt model is not retried in
/// a loop that would rewrite the flash.
#[derive(Debug)]
pub struct Refused(pub String);

impl Refused {
    pub const EXIT: u8 = 78;
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}
