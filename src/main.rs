//! The `edgellm` binary: subcommands live in `cli/`, one file each.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
