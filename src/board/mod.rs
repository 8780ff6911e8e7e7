//! Board profiles: what edgellm expects of a board (threads, the CPUs they run on, the kernel
//! path, a memory budget, the serial port, the DRAM bandwidth and the decode speed it bounds),
//! and [`detect`]ing which board a machine is.
//!
//! The profiles are the `board/*.toml` files of the repository, compiled into the binary, so
//! `--board rpi4b` needs no file on the device. Their decode figures are estimates, bandwidth
//! ÷ weight bytes read per token, until measured on the board (`tests/board_profiles.rs`
//! recomputes them from the model files so they cannot go stale).
//!
//! A layer of its own beside `runtime`: it uses nothing of ours but `kernels_neon` (for the
//! kernel path names), and only the daemon and the CLI use it. It knows no engine: the daemon
//! applies a profile (threads, affinity, the budget check) through the engine's own settings.

pub mod cpu;
pub mod detect;

pub use detect::{Detection, Tree, detect};

use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// Why a profile could not be had.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("unknown board {name:?}: known boards are {}", known.join(", "))]
    Unknown { name: String, known: Vec<String> },
}

/// The serial port a board's UART is normally found at.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SerialDefaults {
    pub path: String,
    pub baud: u32,
    pub note: String,
}

/// The board's DRAM bandwidth: a typical sustained figure (what the estimates use) and the
/// interface's peak, each with where it comes from.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Bandwidth {
    /// Sustained read bandwidth, GB/s (10⁹ bytes per second).
    pub gbs: f64,
    pub source: String,
    /// The memory interface's peak, GB/s.
    pub peak_gbs: f64,
    pub peak_source: String,
}

/// The decode speed bound of one model on the board.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Estimate {
    /// The model file, as named in `models/models.toml`.
    pub file: String,
    /// Bytes of weights one decoded token reads (every matrix once).
    pub weight_bytes: u64,
    /// `bandwidth.gbs × 10⁹ ÷ weight_bytes`, one decimal: an upper bound, not a measurement.
    pub decode_tps: f64,
}

/// One board profile (`board/NAME.toml`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub description: String,
    /// `aarch64` or `x86_64`.
    pub arch: String,
    /// The fallback for its architecture when no board-specific profile matches.
    #[serde(default)]
    pub generic: bool,
    /// Device-tree `compatible` strings that name this board or its SoC.
    #[serde(default)]
    pub compatible: Vec<String>,
    /// The kernel path its CPU runs (a `kernels_neon::Path` name: neon, dotprod, avx2, …).
    pub kernels: String,
    /// Worker threads; unset: every core the daemon may run on (the big ones of a
    /// big.LITTLE SoC).
    pub threads: Option<usize>,
    /// Answers decoded together in one step; unset: the daemon's default.
    #[serde(default)]
    pub max_batch: Option<usize>,
    /// The CPUs the worker threads are pinned to (`0-3`); unset: not pinned.
    pub cpus: Option<String>,
    /// RAM the daemon may take (weights + KV caches + activations), MiB.
    pub memory_budget_mib: u64,
    pub memory_note: String,
    pub serial: SerialDefaults,
    pub bandwidth: Bandwidth,
    /// The model `edgellm serve` runs when none is given, a `file` of `models/models.toml`:
    /// of the models shipped as published (none made by requantizing), the best answer-quality
    /// score that fits `memory_budget_mib` at ctx 2048 and whose decode estimate here is at
    /// least [`MIN_DEFAULT_TPS`] (`tests/board_profiles.rs` checks the choice).
    pub default_model: String,
    /// One per model of `models/models.toml`.
    pub estimate: Vec<Estimate>,
}

impl Profile {
    /// The pinned CPUs, parsed (empty: not pinned).
    pub fn cpu_list(&self) -> Vec<usize> {
        self.cpus
            .as_deref()
            .and_then(|c| cpu::parse_cpu_list(c).ok())
            .unwrap_or_default()
    }

    /// The memory budget in bytes.
    pub fn memory_budget(&self) -> u64 {
        self.memory_budget_mib.saturating_mul(1 << 20)
    }

    /// The estimate for a model file (by file name), if the profile has one.
    pub fn estimate_for(&self, file: &str) -> Option<&Estimate> {
        self.estimate.iter().find(|e| e.file == file)
    }
}

/// The slowest decode estimate, tokens/s, a board's default model may have: slower than this
/// an answer of a few sentences takes longer than a technician or a PLC's timeout waits.
pub const MIN_DEFAULT_TPS: f64 = 5.0;

/// The profiles' sources, compiled in: (name, TOML).
pub const SOURCES: [(&str, &str); 6] = [
    ("rpi4b", include_str!("../../board/rpi4b.toml")),
    ("rpi5", include_str!("../../board/rpi5.toml")),
    ("rk3588", include_str!("../../board/rk3588.toml")),
    ("imx8mp", include_str!("../../board/imx8mp.toml")),
    (
        "generic-aarch64",
        include_str!("../../board/generic-aarch64.toml"),
    ),
    (
        "x86-64-gateway",
        include_str!("../../board/x86-64-gateway.toml"),
    ),
];

/// Parses one profile's TOML and checks what the type cannot: the name, the kernel path, the
/// CPU list and the thread count against it.
pub fn parse(text: &str) -> Result<Profile, String> {
    let p: Profile = toml::from_str(text).map_err(|e| e.to_string())?;
    kernels_neon::Path::parse(&p.kernels).map_err(|e| format!("kernels: {e}"))?;
    if let Some(c) = &p.cpus {
        let cpus = cpu::parse_cpu_list(c).map_err(|e| format!("cpus: {e}"))?;
        if let Some(t) = p.threads
            && t > cpus.len()
        {
            return Err(format!("threads {t} > the {} CPUs of cpus", cpus.len()));
        }
    }
    if p.estimate_for(&p.default_model).is_none() {
        return Err(format!(
            "default_model {:?} has no [[estimate]]",
            p.default_model
        ));
    }
    // The engine's bound (16) is checked where the daemon sizes the engine.
    if p.max_batch == Some(0) {
        return Err("max_batch must be positive".into());
    }
    let gbs_ok = p.bandwidth.gbs.is_finite() && p.bandwidth.gbs > 0.0;
    if p.threads == Some(0) || p.memory_budget_mib == 0 || !gbs_ok {
        return Err("threads, memory_budget_mib and bandwidth.gbs must be positive".into());
    }
    Ok(p)
}

/// Every profile, in [`SOURCES`] order.
pub fn profiles() -> &'static [Profile] {
    static ALL: OnceLock<Vec<Profile>> = OnceLock::new();
    ALL.get_or_init(|| {
        SOURCES
            .iter()
            .map(|(name, text)| {
                // Our own files, checked by this module's tests: not input.
                parse(text).unwrap_or_else(|e| panic!("board/{name}.toml: {e}"))
            })
            .collect()
    })
}

/// The names of the profiles.
pub fn names() -> Vec<String> {
    profiles().iter().map(|p| p.name.clone()).collect()
}

/// The profile called `name`.
pub fn get(name: &str) -> Result<&'static Profile, BoardError> {
    profiles()
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| BoardError::Unknown {
            name: name.to_owned(),
            known: names(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_profile_parses_under_its_own_name() {
        for (name, text) in SOURCES {
            let p = parse(text).unwrap_or_else(|e| panic!("board/{name}.toml: {e}"));
            assert_eq!(p.name, name, "board/{name}.toml names itself {}", p.name);
        }
        assert_eq!(profiles().len(), SOURCES.len());
    }

    #[test]
    fn an_unknown_board_lists_the_known_ones() {
        let e = get("rpi3").unwrap_err().to_string();
        for n in names() {
            assert!(e.contains(&n), "{e}");
        }
        assert!(e.contains("\"rpi3\""), "{e}");
    }

    #[test]
    fn a_profile_with_more_threads_than_cpus_or_a_bad_path_is_refused() {
        let good = SOURCES[2].1;
        assert!(parse(good).is_ok());
        let more = good.replace("threads = 4", "threads = 5");
        assert!(parse(&more).unwrap_err().contains("threads 5"));
        let path = good.replace("kernels = \"dotprod\"", "kernels = \"sve9\"");
        assert!(parse(&path).unwrap_err().contains("kernels"));
    }

    #[test]
    fn each_architecture_has_exactly_one_generic_profile() {
        for arch in ["aarch64", "x86_64"] {
            let n = profiles()
                .iter()
                .filter(|p| p.generic && p.arch == arch)
                .count();
            assert_eq!(n, 1, "{arch}");
        }
    }
}
