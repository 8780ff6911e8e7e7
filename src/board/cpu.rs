//! What a CPU is, from what Linux says about it: the core behind an ARM `CPU part` number,
//! the kernel path a `Features` (aarch64) or `flags` (x86) line allows, CPU lists (`0-3,6`).
//! Pure functions over strings.

use kernels_neon::Path;

/// Highest CPU number a list may name (the kernel's `CpuSet` holds 1024).
pub const MAX_CPU: usize = 1023;

/// An ARM core design, by its MIDR implementer and part number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub name: &'static str,
    /// Rough single-thread rank within a SoC: a bigger number is a bigger core. Only used to
    /// tell the clusters of a big.LITTLE SoC apart where `cpu_capacity` is missing.
    pub rank: u8,
}

/// Arm Ltd's (implementer 0x41) parts, from the Cortex-A technical reference manuals (the
/// MIDR_EL1 "PartNum" field of each) and Linux's `arch/arm64/include/asm/cputype.h`.
const ARM_PARTS: &[(u32, Kind)] = &[
    (0xd03, kind("Cortex-A53", 1)),
    (0xd04, kind("Cortex-A35", 0)),
    (0xd05, kind("Cortex-A55", 1)),
    (0xd07, kind("Cortex-A57", 2)),
    (0xd08, kind("Cortex-A72", 3)),
    (0xd09, kind("Cortex-A73", 3)),
    (0xd0a, kind("Cortex-A75", 4)),
    (0xd0b, kind("Cortex-A76", 5)),
    (0xd0c, kind("Neoverse-N1", 5)),
    (0xd0d, kind("Cortex-A77", 6)),
    (0xd41, kind("Cortex-A78", 7)),
    (0xd44, kind("Cortex-X1", 8)),
    (0xd46, kind("Cortex-A510", 1)),
    (0xd47, kind("Cortex-A710", 7)),
    (0xd48, kind("Cortex-X2", 8)),
    (0xd49, kind("Neoverse-N2", 7)),
    (0xd4d, kind("Cortex-A715", 7)),
    (0xd4e, kind("Cortex-X3", 9)),
    (0xd80, kind("Cortex-A520", 1)),
    (0xd81, kind("Cortex-A720", 8)),
    (0xd82, kind("Cortex-X4", 10)),
];

const fn kind(name: &'static str, rank: u8) -> Kind {
    Kind { name, rank }
}

/// The core design of an (implementer, part) pair, if we know it.
pub fn kind_of(implementer: u32, part: u32) -> Option<Kind> {
    if implementer != 0x41 {
        return None;
    }
    ARM_PARTS.iter().find(|(p, _)| *p == part).map(|(_, k)| *k)
}

/// The kernel path a CPU with these features runs (names as `Path::name`): what
/// `Kernels::detect` would pick on it. `arch` is `aarch64` or `x86_64`; any other arch, or a
/// CPU without the base SIMD, gets the portable path.
pub fn path_for(arch: &str, features: &[String]) -> Path {
    let has = |f: &str| features.iter().any(|x| x == f);
    match arch {
        // `asimd` is base NEON, `asimddp` the ARMv8.2 dot product (`sdot`), `i8mm` the
        // ARMv8.6 int8 matrix multiply (`smmla`): the Features names of Linux's hwcaps.
        "aarch64" if has("asimd") && has("asimddp") && has("i8mm") => Path::I8mm,
        "aarch64" if has("asimd") && has("asimddp") => Path::Dotprod,
        "aarch64" if has("asimd") => Path::Neon,
        "x86_64" if has("avx2") && has("fma") && has("f16c") => {
            if has("avx512_vnni") && has("avx512vl") {
                Path::Avx512Vnni
            } else {
                Path::Avx2
            }
        }
        _ => Path::Portable,
    }
}

/// Parses a CPU list as Linux writes them (`0-3`, `4-7`, `0,2,4-5`); sorted, no duplicates,
/// every CPU at most [`MAX_CPU`].
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    let s = s.trim();
    if s.is_empty() {
        return Ok(out);
    }
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n <= MAX_CPU)
            .ok_or_else(|| format!("{t:?} is not a CPU number 0..={MAX_CPU}"))
    };
    for part in s.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let n = num(part)?;
                (n, n)
            }
        };
        if a > b {
            return Err(format!("{part:?}: a range goes up"));
        }
        out.extend(a..=b);
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// A CPU list written back the short way: `[0, 1, 2, 3, 6]` is `0-3,6`.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn features_choose_the_path_the_runtime_would() {
        let pi4 = feats("fp asimd evtstrm crc32 cpuid");
        assert_eq!(path_for("aarch64", &pi4), Path::Neon);
        let a76 = feats("fp asimd aes crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc asimddp");
        assert_eq!(path_for("aarch64", &a76), Path::Dotprod);
        let v9 = feats("fp asimd asimddp i8mm bf16 sve");
        assert_eq!(path_for("aarch64", &v9), Path::I8mm);
        assert_eq!(path_for("aarch64", &feats("fp")), Path::Portable);
        let n100 = feats("fpu sse sse2 avx avx2 fma f16c bmi2");
        assert_eq!(path_for("x86_64", &n100), Path::Avx2);
        let zen4 = feats("avx2 fma f16c avx512f avx512vl avx512_vnni");
        assert_eq!(path_for("x86_64", &zen4), Path::Avx512Vnni);
        assert_eq!(path_for("x86_64", &feats("sse2")), Path::Portable);
        assert_eq!(path_for("riscv64", &a76), Path::Portable);
    }

    #[test]
    fn cpu_lists_round_trip_and_refuse_nonsense() {
        assert_eq!(parse_cpu_list("0-3").unwrap(), vec![0, 1, 2, 3]);
        assert_eq!(parse_cpu_list("4-7,0").unwrap(), vec![0, 4, 5, 6, 7]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        for bad in ["3-1", "x", "0-", "1024", "0-99999999999999999999", ","] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn part_numbers_name_the_cores_of_our_boards() {
        assert_eq!(kind_of(0x41, 0xd08).unwrap().name, "Cortex-A72");
        assert_eq!(kind_of(0x41, 0xd0b).unwrap().name, "Cortex-A76");
        assert_eq!(kind_of(0x41, 0xd05).unwrap().name, "Cortex-A55");
        assert_eq!(kind_of(0x41, 0xd03).unwrap().name, "Cortex-A53");
        assert_eq!(kind_of(0x41, 0xfff), None);
        assert_eq!(kind_of(0x51, 0xd08), None, "another implementer's part");
    }
}
