//! `edgellm board detect | list | show` as a user runs them: on the recorded trees of every
//! board under tests/data/boards/ (tests/data/boards/README.md says where each value comes
//! from), and on hostile trees (a truncated cpuinfo, binary garbage, a part nobody knows, a
//! file far larger than any cpuinfo), which must give a detection or a clean error, never a
//! panic.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn edgellm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(args)
        .output()
        .expect("run edgellm")
}

fn tree(board: &str) -> PathBuf {
    common::data_path(&format!("boards/{board}"))
}

/// `board detect --json --root DIR`, which must succeed.
fn detect(root: &Path) -> Value {
    let o = edgellm(&[
        "board",
        "detect",
        "--json",
        "--root",
        root.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "detect {}: {err}", root.display());
    assert!(!err.contains("panicked"), "{err}");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {o:?}"))
}

fn nums(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn kinds(v: &Value) -> Vec<String> {
    v["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// What each recorded board must be detected as: profile, core kinds, big and little cores,
/// kernel path.
struct Want {
    board: &'static str,
    profile: &'static str,
    kinds: &'static [(&'static str, usize)],
    big: &'static [u64],
    little: &'static [u64],
    kernels: &'static str,
}

const BOARDS: [Want; 6] = [
    Want {
        board: "rpi4b",
        profile: "rpi4b",
        kinds: &[("Cortex-A72", 4)],
        big: &[0, 1, 2, 3],
        little: &[],
        kernels: "neon",
    },
    Want {
        board: "rpi5",
        profile: "rpi5",
        kinds: &[("Cortex-A76", 4)],
        big: &[0, 1, 2, 3],
        little: &[],
        kernels: "dotprod",
    },
    Want {
        board: "rk3588",
        profile: "rk3588",
        kinds: &[("Cortex-A55", 4), ("Cortex-A76", 4)],
        big: &[4, 5, 6, 7],
        little: &[0, 1, 2, 3],
        kernels: "dotprod",
    },
    Want {
        board: "imx8mp",
        profile: "imx8mp",
        kinds: &[("Cortex-A53", 4)],
        big: &[0, 1, 2, 3],
        little: &[],
        kernels: "neon",
    },
    Want {
        board: "generic-aarch64",
        profile: "generic-aarch64",
        kinds: &[("Cortex-A72", 2)],
        big: &[0, 1],
        little: &[],
        kernels: "neon",
    },
    Want {
        board: "x86-64-gateway",
        profile: "x86-64-gateway",
        kinds: &[("Intel(R) N100", 4)],
        big: &[0, 1, 2, 3],
        little: &[],
        kernels: "avx2",
    },
];

#[test]
fn every_recorded_board_is_detected_as_its_profile_with_its_cores_and_kernel_path() {
    for w in &BOARDS {
        let v = detect(&tree(w.board));
        let b = w.board;
        assert_eq!(v["profile"], w.profile, "{b}: {v}");
        let want: Vec<String> = w
            .kinds
            .iter()
            .flat_map(|(k, n)| std::iter::repeat_n(k.to_string(), *n))
            .collect();
        assert_eq!(kinds(&v), want, "{b}: {v}");
        assert_eq!(nums(&v["big"]), w.big, "{b}: {v}");
        assert_eq!(nums(&v["little"]), w.little, "{b}: {v}");
        assert_eq!(v["kernels"], w.kernels, "{b}: {v}");
        // A recorded tree is not this machine: its own features decide.
        assert_eq!(v["hwcaps"], Value::Null, "{b}");
        assert_eq!(v["warnings"], serde_json::json!([]), "{b}: {v}");
    }
}

#[test]
fn the_rk3588_is_split_by_cpu_capacity_and_the_pi_by_nothing() {
    let v = detect(&tree("rk3588"));
    assert_eq!(v["split_by"], "cpu_capacity", "{v}");
    assert_eq!(
        v["matched_by"],
        "device-tree compatible \"rockchip,rk3588\""
    );
    assert_eq!(v["model"], "Radxa ROCK 5B");
    let v = detect(&tree("rpi4b"));
    assert_eq!(v["split_by"], "all alike", "{v}");
    assert_eq!(
        v["matched_by"],
        "device-tree compatible \"raspberrypi,4-model-b\""
    );
}

#[test]
fn the_text_output_names_the_profile_cores_split_and_kernel_path() {
    let o = edgellm(&[
        "board",
        "detect",
        "--root",
        tree("rk3588").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "profile:  rk3588",
        "cores:    8: cpu0-3 Cortex-A55, cpu4-7 Cortex-A76",
        "big:      cpu4-7 (by cpu_capacity)",
        "little:   cpu0-3",
        "kernels:  dotprod (from the cpuinfo features)",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
}

#[test]
fn without_a_device_tree_the_big_little_split_comes_from_the_core_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let proc = dir.path().join("proc");
    std::fs::create_dir_all(&proc).unwrap();
    std::fs::copy(tree("rk3588").join("proc/cpuinfo"), proc.join("cpuinfo")).unwrap();
    let v = detect(dir.path());
    assert_eq!(v["split_by"], "core kinds", "{v}");
    assert_eq!(nums(&v["big"]), [4, 5, 6, 7]);
    assert_eq!(
        v["profile"], "generic-aarch64",
        "no compatible: the generic profile"
    );
}

#[test]
fn this_machine_is_detected_with_its_own_cpu_features() {
    let v = detect(Path::new("/"));
    let caps = v["hwcaps"].as_array().expect("hwcaps for /");
    let expected = kernels_neon::Path::best().name();
    assert_eq!(v["kernels"], expected, "{v}");
    assert!(!v["cores"].as_array().unwrap().is_empty(), "{v}");
    if cfg!(target_arch = "x86_64") {
        assert_eq!(v["profile"], "x86-64-gateway", "{v}");
        assert_eq!(caps.is_empty(), kernels_neon::cpu_features().is_empty());
    }
}

/// A tree whose cpuinfo is `bytes`.
fn hostile(bytes: &[u8]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("proc/device-tree")).unwrap();
    std::fs::write(dir.path().join("proc/cpuinfo"), bytes).unwrap();
    dir
}

#[test]
fn a_truncated_cpuinfo_still_names_the_cores_it_describes() {
    let full = std::fs::read(tree("rpi4b").join("proc/cpuinfo")).unwrap();
    // Cut in the middle of the second processor's Features line.
    let cut = full
        .windows(9)
        .enumerate()
        .filter(|(_, w)| w == b"Features\t")
        .nth(1)
        .map(|(i, _)| i + 14)
        .unwrap();
    let d = hostile(&full[..cut]);
    let v = detect(d.path());
    assert_eq!(v["arch"], "aarch64", "{v}");
    assert_eq!(kinds(&v)[0], "Cortex-A72", "{v}");
    assert_eq!(v["cores"].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn binary_garbage_is_an_unknown_board_not_a_crash() {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let garbage: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let d = hostile(&garbage);
    std::fs::write(
        d.path().join("proc/device-tree/compatible"),
        &garbage[..4096],
    )
    .unwrap();
    std::fs::write(
        d.path().join("proc/device-tree/model"),
        &garbage[4096..9000],
    )
    .unwrap();
    let v = detect(d.path());
    assert_eq!(v["arch"], "unknown", "{v}");
    assert_eq!(v["profile"], Value::Null);
    assert_eq!(v["kernels"], "portable");
    assert!(v["compatible"].as_array().unwrap().len() <= 16);
    let text = edgellm(&["board", "detect", "--root", d.path().to_str().unwrap()]);
    assert!(text.status.success(), "{text:?}");
    assert!(String::from_utf8_lossy(&text.stdout).contains("profile:  none"));
}

#[test]
fn an_unknown_part_is_named_by_its_numbers_and_warned_about() {
    let info = std::fs::read_to_string(tree("imx8mp").join("proc/cpuinfo"))
        .unwrap()
        .replacen("CPU part\t: 0xd03", "CPU part\t: 0xfff", 1);
    let d = hostile(info.as_bytes());
    let v = detect(d.path());
    assert_eq!(
        v["cores"][0]["kind"], "unknown (implementer 0x41, part 0xfff)",
        "{v}"
    );
    assert_eq!(kinds(&v)[1], "Cortex-A53");
    let w = v["warnings"].to_string();
    assert!(w.contains("cpu0") && w.contains("0xfff"), "{w}");
    // An unknown core's rank says nothing: the split is not guessed from it.
    assert_eq!(v["split_by"], "all alike");
}

#[test]
fn a_cpuinfo_far_larger_than_any_real_one_is_read_only_up_to_its_bound() {
    // 5000 processors of 40 MB: more CPUs than the kernel allows, more bytes than the bound.
    let block =
        "processor\t: {n}\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n\n";
    let mut big = String::new();
    for n in 0..5000 {
        big.push_str(&block.replace("{n}", &n.to_string()));
    }
    let line = format!("Features\t: {}\n", "asimd ".repeat(1 << 20));
    big.push_str(&line.repeat(6));
    let d = hostile(big.as_bytes());
    let v = detect(d.path());
    let n = v["cores"].as_array().unwrap().len();
    assert_eq!(n, 1024, "cores are bounded by the kernel's CPU limit");
}

#[test]
fn detect_on_a_missing_root_is_one_clean_error() {
    let o = edgellm(&["board", "detect", "--root", "/nonexistent/board"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.starts_with("edgellm: /nonexistent/board: not a directory"),
        "{e}"
    );
}

#[test]
fn list_names_every_profile_and_show_gives_one_with_its_estimates() {
    let o = edgellm(&["board", "list"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    for w in &BOARDS {
        assert!(out.contains(w.profile), "{} not listed:\n{out}", w.profile);
    }
    let o = edgellm(&["board", "show", "rpi4b"]);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    for want in [
        "/dev/serial0",
        "neon",
        "ESTIMATES",
        "smollm2-135m-q4_0.gguf",
        "tok/s",
    ] {
        assert!(out.contains(want), "{want:?} not in:\n{out}");
    }
    let o = edgellm(&["board", "show", "rpi3"]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("unknown board \"rpi3\"") && e.contains("rk3588"),
        "{e}"
    );
}

/// A copy of a recorded board's tree with its cpuinfo changed by `edit`.
fn edited_tree(board: &str, edit: impl Fn(&str) -> String) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &to.join(e.file_name()));
            } else {
                std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&tree(board), dir.path());
    let info = dir.path().join("proc/cpuinfo");
    let text = std::fs::read_to_string(&info).unwrap();
    let changed = edit(&text);
    assert_ne!(changed, text, "{board}: the edit changed nothing");
    std::fs::write(&info, changed).unwrap();
    dir
}

/// A CPU that runs a faster path than its profile names (the gateway profile's AVX2 on a CPU
/// with AVX-512 VNNI) is no warning; a CPU without the profile's path (a Pi 5 without the dot
/// product) is, naming both.
#[test]
fn only_a_cpu_that_lacks_the_profiles_kernel_path_is_warned_about() {
    let faster = edited_tree("x86-64-gateway", |t| {
        t.replace(" avx2 ", " avx2 avx512_vnni avx512vl ")
    });
    let v = detect(faster.path());
    assert_eq!(v["profile"], "x86-64-gateway", "{v}");
    assert_eq!(v["kernels"], "avx512vnni", "{v}");
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");

    let slower = edited_tree("rpi5", |t| t.replace(" asimddp", ""));
    let v = detect(slower.path());
    assert_eq!(v["profile"], "rpi5", "{v}");
    assert_eq!(v["kernels"], "neon", "{v}");
    let w = v["warnings"].to_string();
    assert!(
        w.contains("profile rpi5 expects kernel path dotprod, this CPU runs only neon"),
        "{w}"
    );
}
