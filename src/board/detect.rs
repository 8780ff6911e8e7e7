//! Which board this is, from what Linux publishes about it: `/proc/cpuinfo`, the device
//! tree's `model` and `compatible`, and each CPU's `cpu_capacity`.
//!
//! [`detect`] is pure (file contents in, a [`Detection`] out) so recorded trees of every board
//! test it; [`Tree::read`] is the only I/O, and it reads at most [`MAX_FILE`] bytes of each
//! file and [`MAX_CPUS`] capacity files, so a huge or endless file (a FUSE mount, a crafted
//! tree) costs a bounded read. Nothing in the input is trusted: garbage gives an "unknown"
//! detection, never a panic.

use super::cpu::{self, MAX_CPU};
use super::{Profile, profiles};
use serde::Serialize;
use std::io::Read;
use std::path::Path;

/// Most bytes read of one file (a 1024-CPU cpuinfo is ~1 MiB on aarch64, ~2 MiB on x86 with
/// its flags; past this the tail is ignored, which only loses CPUs beyond it).
pub const MAX_FILE: usize = 4 << 20;
/// Most CPUs described.
pub const MAX_CPUS: usize = MAX_CPU + 1;
/// Longest line looked at (a flags line of a current x86 CPU is ~1.5 KB).
const MAX_LINE: usize = 8192;
/// Most device-tree `compatible` strings kept.
const MAX_COMPATIBLE: usize = 16;
/// Longest device-tree string kept.
const MAX_DT_STRING: usize = 256;

/// The files a detection reads, as bytes (they need not be UTF-8).
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub cpuinfo: Option<Vec<u8>>,
    pub dt_model: Option<Vec<u8>>,
    pub dt_compatible: Option<Vec<u8>>,
    /// `cpuN/cpu_capacity` for N = 0, 1, …, until the first missing one.
    pub capacities: Vec<Vec<u8>>,
}

impl Tree {
    /// Reads the files under `root` (`/` for this machine); missing files are `None`.
    pub fn read(root: &Path) -> Tree {
        let get = |rel: &str| read_bounded(&root.join(rel), MAX_FILE);
        let mut capacities = Vec::new();
        for n in 0..MAX_CPUS {
            match get(&format!("sys/devices/system/cpu/cpu{n}/cpu_capacity")) {
                Some(b) => capacities.push(b),
                None => break,
            }
        }
        Tree {
            cpuinfo: get("proc/cpuinfo"),
            dt_model: get("proc/device-tree/model"),
            dt_compatible: get("proc/device-tree/compatible"),
            capacities,
        }
    }
}

fn read_bounded(path: &Path, max: usize) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    f.take(max as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// One CPU as cpuinfo and sysfs describe it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Core {
    pub cpu: usize,
    /// `0x41` (Arm), as written.
    pub implementer: Option<String>,
    pub part: Option<String>,
    /// `Cortex-A72`, or `unknown` (an x86 core: its `model name`).
    pub kind: String,
    pub capacity: Option<u32>,
    #[serde(skip)]
    rank: u8,
}

/// What [`detect`] found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Detection {
    /// The profile this board gets, if any fits.
    pub profile: Option<String>,
    /// That profile's default model (`Profile::default_model`).
    pub default_model: Option<String>,
    /// Why that profile: `device-tree compatible "brcm,bcm2711"`, `arch x86_64`.
    pub matched_by: Option<String>,
    /// The device tree's model (or cpuinfo's `Model`/`model name` line).
    pub model: Option<String>,
    pub compatible: Vec<String>,
    /// `aarch64`, `x86_64` or `unknown`.
    pub arch: String,
    pub cores: Vec<Core>,
    /// The fastest cores (all of them on a SoC whose cores are alike).
    pub big: Vec<usize>,
    pub little: Vec<usize>,
    /// How big and little were told apart: `cpu_capacity`, `core kinds`, or `all alike`.
    pub split_by: String,
    /// The kernel-relevant CPU features every core has (cpuinfo `Features` or `flags`).
    pub features: Vec<String>,
    /// The kernel path these features allow.
    pub kernels: String,
    /// The process's own hardware capabilities (`std::arch` detection, the auxiliary vector's
    /// HWCAPs on aarch64) when the tree is this machine's.
    pub hwcaps: Option<Vec<String>>,
    /// Things that do not add up (a profile expecting another kernel path, garbage lines).
    pub warnings: Vec<String>,
}

/// Features that matter to the kernel paths (the rest of a flags line is noise here).
const KERNEL_FEATURES: &[&str] = &[
    "fp",
    "asimd",
    "asimdhp",
    "asimddp",
    "i8mm",
    "bf16",
    "sve",
    "sse4_1",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512vl",
    "avx512_vnni",
];

/// A processor block of cpuinfo: the keys we use.
#[derive(Default)]
struct Block {
    processor: Option<usize>,
    implementer: Option<String>,
    part: Option<String>,
    features: Option<Vec<String>>,
    model_name: Option<String>,
}

fn parse_hex(s: &str) -> Option<u32> {
    u32::from_str_radix(s.trim().strip_prefix("0x")?, 16).ok()
}

/// The device tree's strings: NUL-separated, trimmed, printable ASCII only, bounded.
fn dt_strings(b: &[u8]) -> Vec<String> {
    b.split(|&c| c == 0)
        .filter(|s| !s.is_empty())
        .take(MAX_COMPATIBLE)
        .map(|s| {
            let s = &s[..s.len().min(MAX_DT_STRING)];
            String::from_utf8_lossy(s)
                .chars()
                .filter(|c| c.is_ascii_graphic() || *c == ' ')
                .collect::<String>()
                .trim()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// Identifies the board of `tree`. `hwcaps`: this process's own CPU features, when `tree` is
/// this machine's (they decide the kernel path then, as they do for the runtime).
pub fn detect(tree: &Tree, hwcaps: Option<&[&str]>) -> Detection {
    let mut warnings = Vec::new();
    let text = tree
        .cpuinfo
        .as_deref()
        .map(String::from_utf8_lossy)
        .unwrap_or_default();
    let mut blocks: Vec<Block> = Vec::new();
    let mut cur = Block::default();
    let mut soc_features: Option<Vec<String>> = None;
    let mut cpuinfo_model = None;
    let mut odd_lines = 0usize;
    for line in text.lines() {
        let line = if line.len() > MAX_LINE {
            // Cut at a character boundary: lossy decoding made this valid UTF-8.
            let mut end = MAX_LINE;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            &line[..end]
        } else {
            line
        };
        if line.trim().is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            odd_lines += 1;
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => {
                if cur.processor.is_some() && blocks.len() < MAX_CPUS {
                    blocks.push(std::mem::take(&mut cur));
                }
                cur = Block {
                    processor: value.parse().ok().filter(|&n| n <= MAX_CPU),
                    ..Block::default()
                };
                if cur.processor.is_none() {
                    odd_lines += 1;
                }
            }
            "CPU implementer" => cur.implementer = Some(value.to_owned()),
            "CPU part" => cur.part = Some(value.to_owned()),
            "Features" | "flags" => {
                let f: Vec<String> = value
                    .split_whitespace()
                    .filter(|f| KERNEL_FEATURES.contains(f))
                    .map(str::to_owned)
                    .collect();
                // Old 32-bit kernels print one Features line for the whole SoC, after the
                // last processor block.
                if cur.processor.is_some() {
                    cur.features = Some(f);
                } else {
                    soc_features = Some(f);
                }
            }
            "model name" => cur.model_name = Some(value.chars().take(MAX_DT_STRING).collect()),
            // The Raspberry Pi kernel's board line.
            "Model" => cpuinfo_model = Some(value.chars().take(MAX_DT_STRING).collect()),
            _ => {}
        }
    }
    if cur.processor.is_some() && blocks.len() < MAX_CPUS {
        blocks.push(cur);
    }
    if odd_lines > 0 {
        warnings.push(format!(
            "cpuinfo: {odd_lines} line(s) are not `key: value` (truncated or not cpuinfo)"
        ));
    }
    let is_arm = blocks
        .iter()
        .any(|b| b.implementer.is_some() || b.part.is_some());
    let is_x86 = !is_arm && blocks.iter().any(|b| b.model_name.is_some());
    let arch = if is_arm {
        "aarch64"
    } else if is_x86 {
        "x86_64"
    } else {
        "unknown"
    };

    // Cores, in processor order, one per number.
    blocks.sort_by_key(|b| b.processor);
    blocks.dedup_by_key(|b| b.processor);
    let capacity = |n: usize| -> Option<u32> {
        let b = tree.capacities.get(n)?;
        String::from_utf8_lossy(&b[..b.len().min(32)])
            .trim()
            .parse()
            .ok()
    };
    let cores: Vec<Core> = blocks
        .iter()
        .filter_map(|b| {
            let cpu = b.processor?;
            let known = match (b.implementer.as_deref(), b.part.as_deref()) {
                (Some(i), Some(p)) => parse_hex(i)
                    .zip(parse_hex(p))
                    .and_then(|(i, p)| cpu::kind_of(i, p)),
                _ => None,
            };
            let kind = match (known, &b.model_name) {
                (Some(k), _) => k.name.to_owned(),
                (None, Some(m)) => m.clone(),
                (None, None) => format!(
                    "unknown (implementer {}, part {})",
                    b.implementer.as_deref().unwrap_or("?"),
                    b.part.as_deref().unwrap_or("?")
                ),
            };
            Some(Core {
                cpu,
                implementer: b.implementer.clone(),
                part: b.part.clone(),
                kind,
                capacity: capacity(cpu),
                rank: known.map_or(0, |k| k.rank),
            })
        })
        .collect();
    for c in cores.iter().filter(|c| c.kind.starts_with("unknown")) {
        warnings.push(format!(
            "cpu{}: core {} is not one we know",
            c.cpu,
            c.kind.trim_start_matches("unknown ")
        ));
    }

    let (big, little, split_by) = split(&cores);

    // The features every core has: a path must run on whichever core a thread lands on.
    let mut features: Option<Vec<String>> = None;
    for b in &blocks {
        if let Some(f) = &b.features {
            features = Some(match features {
                None => f.clone(),
                Some(acc) => acc.into_iter().filter(|x| f.contains(x)).collect(),
            });
        }
    }
    let features = features.or(soc_features).unwrap_or_default();
    let from_cpuinfo = cpu::path_for(arch, &features);
    let (kernels, hwcaps) = match hwcaps {
        Some(h) => {
            let caps: Vec<String> = h.iter().map(|s| (*s).to_owned()).collect();
            let best = kernels_neon::Path::best();
            if best != from_cpuinfo && arch != "unknown" {
                warnings.push(format!(
                    "cpuinfo allows kernel path {from_cpuinfo}, this process detects {best}"
                ));
            }
            (best, Some(caps))
        }
        None => (from_cpuinfo, None),
    };

    let compatible = tree
        .dt_compatible
        .as_deref()
        .map(dt_strings)
        .unwrap_or_default();
    let model = tree
        .dt_model
        .as_deref()
        .and_then(|m| dt_strings(m).into_iter().next())
        .or(cpuinfo_model)
        .or_else(|| blocks.iter().find_map(|b| b.model_name.clone()));

    let (profile, default_model, matched_by) = match choose(profiles(), &compatible, arch) {
        Some((p, why)) => {
            // A faster path of the same family is the CPU doing better than the board's:
            // worth knowing (`kernels` says it), not a warning.
            let runs = kernels_neon::Path::parse(&p.kernels).is_ok_and(|k| kernels.includes(k));
            if !runs {
                warnings.push(format!(
                    "profile {} expects kernel path {}, this CPU runs only {kernels}",
                    p.name, p.kernels
                ));
            }
            (
                Some(p.name.clone()),
                Some(p.default_model.clone()),
                Some(why),
            )
        }
        None => (None, None, None),
    };
    Detection {
        profile,
        default_model,
        matched_by,
        model,
        compatible,
        arch: arch.to_owned(),
        cores,
        big,
        little,
        split_by: split_by.to_owned(),
        features,
        kernels: kernels.name().to_owned(),
        hwcaps,
        warnings,
    }
}

/// Big and little cores: by `cpu_capacity` where Linux gives differing ones (it does on
/// heterogeneous SoCs), else by core kind, else all cores are big.
fn split(cores: &[Core]) -> (Vec<usize>, Vec<usize>, &'static str) {
    let caps: Vec<u32> = cores.iter().filter_map(|c| c.capacity).collect();
    let all: Vec<usize> = cores.iter().map(|c| c.cpu).collect();
    if caps.len() == cores.len() && !caps.is_empty() {
        let max = caps.iter().copied().max().unwrap_or(0);
        if caps.iter().any(|&c| c != max) {
            let (big, little) = cores
                .iter()
                .partition::<Vec<&Core>, _>(|c| c.capacity == Some(max));
            return (
                big.iter().map(|c| c.cpu).collect(),
                little.iter().map(|c| c.cpu).collect(),
                "cpu_capacity",
            );
        }
    }
    let max = cores.iter().map(|c| c.rank).max().unwrap_or(0);
    if cores.iter().any(|c| c.rank != max) && cores.iter().all(|c| c.rank > 0) {
        let (big, little) = cores.iter().partition::<Vec<&Core>, _>(|c| c.rank == max);
        return (
            big.iter().map(|c| c.cpu).collect(),
            little.iter().map(|c| c.cpu).collect(),
            "core kinds",
        );
    }
    (all, Vec::new(), "all alike")
}

/// The profile for a board: the first whose device-tree `compatible` strings name one of the
/// board's (most specific first, as the device tree lists them), else the generic profile of
/// its architecture.
fn choose<'p>(
    profiles: &'p [Profile],
    compatible: &[String],
    arch: &str,
) -> Option<(&'p Profile, String)> {
    for c in compatible {
        if let Some(p) = profiles.iter().find(|p| p.compatible.contains(c)) {
            return Some((p, format!("device-tree compatible {c:?}")));
        }
    }
    profiles
        .iter()
        .find(|p| p.generic && p.arch == arch)
        .map(|p| {
            (
                p,
                format!("arch {arch} (no board-specific profile matched)"),
            )
        })
}
