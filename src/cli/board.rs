//! `edgellm board list | show NAME | detect [--root DIR] [--json]`: the compiled-in board
//! profiles, and which one this machine (or a recorded tree of another) is.

use super::CliResult;
use edgellm::board::{self, Detection, Profile, Tree, cpu::format_cpu_list};
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm board list
  edgellm board show rpi4b
  edgellm board detect                # this machine
  edgellm board detect --root /mnt/sd # a board's root file system, mounted here

The decode figures of `show` are estimates (the board's DRAM bandwidth / the weight bytes one \
token reads), not measurements: board/README.md says where each bandwidth comes from.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// The profiles compiled into this binary.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One profile, with its decode estimates.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Which board this is: cores, big/little split, the kernel path, the profile.
    Detect {
        /// Read DIR/proc/cpuinfo, DIR/proc/device-tree and DIR/sys instead of this machine's
        /// (with `/`, the process's own CPU features decide the kernel path too).
        #[arg(long, value_name = "DIR", default_value = "/")]
        root: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> CliResult {
    match a.command {
        Command::List { json } => {
            if json {
                println!("{}", serde_json::to_string(board::profiles())?);
            } else {
                for p in board::profiles() {
                    println!("{:<16} {}", p.name, p.description);
                }
            }
        }
        Command::Show { name, json } => {
            let p = board::get(&name)?;
            if json {
                println!("{}", serde_json::to_string(p)?);
            } else {
                print!("{}", show(p));
            }
        }
        Command::Detect { root, json } => {
            if !root.is_dir() {
                return Err(format!("{}: not a directory", root.display()).into());
            }
            let tree = Tree::read(&root);
            let this_machine = root
                .canonicalize()
                .is_ok_and(|r| r == std::path::Path::new("/"));
            let caps = this_machine.then(kernels_neon::cpu_features);
            let d = board::detect(&tree, caps.as_deref());
            if json {
                println!("{}", serde_json::to_string(&d)?);
            } else {
                print!("{}", detected(&d));
            }
        }
    }
    Ok(())
}

fn show(p: &Profile) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<14}{v}\n"));
    line("board:", format!("{} ({})", p.name, p.description));
    line("arch:", p.arch.clone());
    if !p.compatible.is_empty() {
        line("matches:", p.compatible.join(", "));
    }
    line("kernels:", p.kernels.clone());
    line("default:", p.default_model.clone());
    line(
        "threads:",
        p.threads
            .map_or("every core the daemon may use".into(), |t| t.to_string()),
    );
    line(
        "cpus:",
        p.cpus.clone().unwrap_or_else(|| "not pinned".into()),
    );
    line(
        "memory:",
        format!("{} MiB budget ({})", p.memory_budget_mib, p.memory_note),
    );
    line(
        "serial:",
        format!(
            "{} at {} baud: {}",
            p.serial.path, p.serial.baud, p.serial.note
        ),
    );
    line(
        "bandwidth:",
        format!("{} GB/s: {}", p.bandwidth.gbs, p.bandwidth.source),
    );
    line(
        "peak:",
        format!("{} GB/s: {}", p.bandwidth.peak_gbs, p.bandwidth.peak_source),
    );
    line(
        "decode bound:",
        "ESTIMATES (bandwidth / weight bytes per token), not measured on the board".into(),
    );
    for e in &p.estimate {
        let default = if e.file == p.default_model {
            "  default"
        } else {
            ""
        };
        line(
            "",
            format!(
                "{:<40} {:>7.1} tok/s  ({:.1} MiB read per token){default}",
                e.file,
                e.decode_tps,
                e.weight_bytes as f64 / (1u64 << 20) as f64
            ),
        );
    }
    s
}

/// Cores grouped by kind in CPU order: `cpu0-3 Cortex-A55, cpu4-7 Cortex-A76`.
fn cores(d: &Detection) -> String {
    let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
    for c in &d.cores {
        match groups.last_mut() {
            Some((k, cpus)) if *k == c.kind => cpus.push(c.cpu),
            _ => groups.push((c.kind.clone(), vec![c.cpu])),
        }
    }
    if groups.is_empty() {
        return "none found".into();
    }
    groups
        .iter()
        .map(|(k, cpus)| format!("cpu{} {k}", format_cpu_list(cpus)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_or(cpus: &[usize], none: &str) -> String {
    if cpus.is_empty() {
        none.to_owned()
    } else {
        format!("cpu{}", format_cpu_list(cpus))
    }
}

fn detected(d: &Detection) -> String {
    let mut s = String::new();
    let mut line = |k: &str, v: String| s.push_str(&format!("{k:<10}{v}\n"));
    line(
        "profile:",
        match (&d.profile, &d.matched_by) {
            (Some(p), Some(why)) => format!("{p} (by {why})"),
            _ => "none (unknown architecture)".into(),
        },
    );
    if let Some(m) = &d.default_model {
        line(
            "default:",
            format!("{m} (the model serve runs when given none)"),
        );
    }
    line(
        "model:",
        d.model.clone().unwrap_or_else(|| "unknown".into()),
    );
    line("arch:", d.arch.clone());
    line("cores:", format!("{}: {}", d.cores.len(), cores(d)));
    let caps: Vec<String> = d
        .cores
        .iter()
        .filter_map(|c| c.capacity.map(|v| format!("{v}")))
        .collect();
    if !caps.is_empty() {
        line("capacity:", caps.join(" "));
    }
    line(
        "big:",
        format!("{} (by {})", list_or(&d.big, "none"), d.split_by),
    );
    line("little:", list_or(&d.little, "none"));
    line("features:", d.features.join(" "));
    line(
        "kernels:",
        match &d.hwcaps {
            Some(h) => format!(
                "{} (this process's CPU features: {})",
                d.kernels,
                h.join(" ")
            ),
            None => format!("{} (from the cpuinfo features)", d.kernels),
        },
    );
    for w in &d.warnings {
        line("warning:", w.clone());
    }
    s
}
