//! `edgellm modbus map`: the register map as a PLC programmer needs it, with the
//! configuration's answer formats as `FORMAT` values and a format's typed registers.

use super::CliResult;
use edgellm::daemon::config::Config;
use edgellm::serial::modbus::map::{CHOICE, FORMAT, TYPED, VALID};
use edgellm::serial::modbus::typed::{Layout, Typed};
use std::path::PathBuf;

/// Modbus: the register map and the typed answers of a configuration's formats.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm modbus map --config /etc/edgellm/edgellm.toml
  edgellm modbus map --config /etc/edgellm/edgellm.toml --schema alarm

Addresses are 0-based (mbpoll counts from 1 unless given -0). The whole map, with a worked
example: docs/serial.md, Modbus.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// The register blocks, the FORMAT values of `modbus.formats`, and with --schema the
    /// registers a format's answer is written to.
    Map(MapArgs),
}

#[derive(clap::Args)]
struct MapArgs {
    /// Configuration file (TOML, docs/config.md). Without it: the embedded default, which
    /// configures no formats.
    #[arg(long, env = "EDGELLM_CONFIG")]
    config: Option<PathBuf>,
    /// A format of `modbus.formats` (a [schemas] or [choices] name): its FORMAT value and
    /// where each value of its answer is.
    #[arg(long, value_name = "NAME")]
    schema: Option<String>,
}

const BLOCKS: &str = "\
registers (0-based)
  0-15     status: STATUS, ERROR_CODE, RESPONSE_SEQ, HEARTBEAT, ANSWER_LEN, ... (read)
  16-26    control: REQUEST_SEQ (written last), PROMPT_LEN, MAX_TOKENS, TEMPERATURE, SEED,
           SESSION, MODE, PAGE_SELECT, CANCEL, FORMAT (read/write)
  27       VALID: 0 no format asked, 1 the answer has its shape, 2 it does not
  28       CHOICE: a choice answer's index (0 the first), 0xFFFF none
  32-156   ANSWER_PAGE: 250 bytes of answer text a page
  160-255  TYPED: a schema answer's numbers, booleans and enums
  256-     PROMPT
";

pub fn run(a: Args) -> CliResult {
    let Command::Map(a) = a.command;
    let cfg = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let formats = edgellm::daemon::modbus::typed_formats(&cfg)?;
    let Some(name) = &a.schema else {
        print!("{BLOCKS}\nFORMAT (register {FORMAT}) values, from modbus.formats:\n");
        println!("  0  free text");
        for (i, t) in formats.iter().enumerate() {
            println!("  {}  {}  {}", i + 1, t.name, summary(t));
        }
        if formats.is_empty() {
            println!("  (no formats: list [schemas] or [choices] names in modbus.formats)");
        }
        return Ok(());
    };
    let Some(i) = formats.iter().position(|t| &t.name == name) else {
        let known = cfg.schemas.contains_key(name) || cfg.choices.contains_key(name);
        return Err(if known {
            format!("{name} is a configured format but not in modbus.formats: add it there")
        } else {
            format!("no format {name} in [schemas] or [choices]")
        }
        .into());
    };
    let t = &formats[i];
    println!(
        "format {name}: write FORMAT (register {FORMAT}) = {}",
        i + 1
    );
    println!("VALID (register {VALID}) once done: 1 the answer has the shape, 2 it does not");
    match &t.layout {
        Layout::Choice(_) => println!("CHOICE (register {CHOICE}) holds the answer's index:"),
        Layout::Object { .. } => println!(
            "TYPED (registers {TYPED}-255), 32-bit values high word first; the JSON text is on \
             the answer pages:"
        ),
    }
    print!("{}", t.table(TYPED));
    Ok(())
}

/// One line about a format's registers.
fn summary(t: &Typed) -> String {
    match &t.layout {
        Layout::Choice(o) => format!("choice of {}: its index in CHOICE", o.len()),
        Layout::Object { fields, .. } => format!(
            "schema: {} values in TYPED ({} registers)",
            fields.len(),
            t.registers()
        ),
    }
}
