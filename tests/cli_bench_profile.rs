//! `edgellm bench --profile [--svg FILE] [--json]` on a synthetic model written to a tempdir:
//! the table names every op, the SVG is a complete document with a bar per op, and the JSON
//! gains a "profile" field only when asked.

use edgellm::model::synth::{SynthSpec, synth_model_bytes};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn write_model(dir: &Path) -> PathBuf {
    let path = dir.join("synth.gguf");
    std::fs::write(&path, synth_model_bytes(&SynthSpec::default())).unwrap();
    path
}

fn bench(model: &Path, extra: &[&str]) -> Output {
    bench_reps(model, 1, extra)
}

fn bench_reps(model: &Path, reps: usize, extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(["bench", "-m", model.to_str().unwrap()])
        .args([
            "-p",
            "20",
            "-n",
            "6",
            "-r",
            &reps.to_string(),
            "--chunk",
            "8",
        ])
        .args(extra)
        .output()
        .expect("spawn edgellm");
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

const FORWARD_OPS: [&str; 16] = [
    "embed",
    "rms_norm",
    "quantize_act",
    "attn_q",
    "attn_k",
    "attn_v",
    "rope",
    "kv_store",
    "attention",
    "attn_output",
    "residual_add",
    "ffn_gate",
    "ffn_up",
    "glu",
    "ffn_down",
    "output",
];

#[test]
fn profile_prints_a_table_per_phase_and_writes_a_bar_chart() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let svg_path = dir.path().join("profile.svg");
    let out = bench(
        &model,
        &[
            "-t",
            "1,2",
            "--profile",
            "--svg",
            svg_path.to_str().unwrap(),
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // The speed table is still there, then one profile per (threads, phase).
    assert!(text.contains("| threads | kernels |"), "{text}");
    for head in [
        "profile pp20, 1 thread:",
        "profile tg6, 1 thread:",
        "profile pp20, 2 threads:",
        "profile tg6, 2 threads:",
    ] {
        assert!(text.contains(head), "missing {head:?} in:\n{text}");
    }
    let row = |name: &str| format!("| {name:<12} |");
    for op in FORWARD_OPS.iter().chain(&["other", "total"]) {
        assert_eq!(text.matches(&row(op)).count(), 4, "{op} row:\n{text}");
    }
    // Sampling happens in tg only.
    assert_eq!(text.matches(&row("sample")).count(), 2, "{text}");
    // 2 layers × 20 tokens in chunks of 8 = 6 calls of each layer matrix in pp.
    let pp1 = &text[text.find("profile pp20, 1 thread:").unwrap()..];
    assert!(
        pp1.contains("| attn_q       |      6 |"),
        "attn_q calls in pp:\n{pp1}"
    );

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
    // One bar per op and "other" in each of the 4 charts, plus the background.
    let bars_per_chart = FORWARD_OPS.len() + 1;
    assert_eq!(
        svg.matches("<rect").count(),
        1 + 4 * bars_per_chart + 2,
        "bars (tg charts also have sample)"
    );
    for op in FORWARD_OPS {
        assert!(svg.contains(&format!(">{op}</text>")), "no {op} label");
    }
    assert!(svg.contains("ms/token"));
    // Every element that opens closes: a crude well-formedness check without an XML crate.
    assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count());
    assert_eq!(svg.matches("<svg").count(), 1);
}

#[test]
fn profile_json_adds_ops_as_objects_and_plain_json_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());

    let plain: Value =
        serde_json::from_slice(&bench(&model, &["-t", "1", "--json"]).stdout).expect("plain JSON");
    let row = &plain[0];
    let mut keys: Vec<&str> = row
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "kernels", "n_depth", "n_gen", "n_prompt", "pp_sd", "pp_tps", "tg_sd", "tg_tps",
            "threads"
        ]
    );

    let v: Value =
        serde_json::from_slice(&bench(&model, &["-t", "1", "--json", "--profile"]).stdout)
            .expect("profile JSON");
    let prof = &v[0]["profile"];
    for (phase, tokens) in [("pp", 20), ("tg", 6)] {
        let p = &prof[phase];
        assert_eq!(p["tokens"], tokens, "{p}");
        let ops = p["ops"].as_array().unwrap();
        let names: Vec<&str> = ops.iter().map(|o| o["op"].as_str().unwrap()).collect();
        for op in FORWARD_OPS.iter().chain(&["other"]) {
            assert!(names.contains(op), "{phase}: no {op} in {names:?}");
        }
        let pct: f64 = ops.iter().map(|o| o["pct"].as_f64().unwrap()).sum();
        assert!((pct - 100.0).abs() < 0.01, "{phase}: shares sum to {pct}");
        let ms: f64 = ops.iter().map(|o| o["total_ms"].as_f64().unwrap()).sum();
        let wall = p["wall_ms"].as_f64().unwrap();
        assert!(
            (ms - wall).abs() < 1e-3,
            "{phase}: ops {ms} ms, wall {wall} ms"
        );
        let down = ops.iter().find(|o| o["op"] == "ffn_down").unwrap();
        assert!(down["gbps"].as_f64().unwrap() > 0.0, "{down}");
        assert!(ops.iter().find(|o| o["op"] == "rope").unwrap()["gbps"].is_null());
    }
}

/// `-d N` runs pp and tg after N cached positions, labelled as llama-bench labels them; the
/// context grows to fit (here from 8 to 30 + 20 + 1).
#[test]
fn depth_runs_after_cached_positions_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let out = bench(&model, &["-t", "1", "-d", "30", "-c", "8", "--profile"]);
    let text = String::from_utf8(out.stdout).unwrap();
    for label in [
        "| pp20 @ d30 |",
        "| tg6 @ d30 |",
        "profile pp20 @ d30, 1 thread:",
    ] {
        assert!(text.contains(label), "missing {label:?} in:\n{text}");
    }
    let v: Value =
        serde_json::from_slice(&bench(&model, &["-t", "1", "-d", "30", "--json"]).stdout)
            .expect("JSON");
    assert_eq!(v[0]["n_depth"], 30, "{v}");
    assert!(v[0]["tg_tps"].as_f64().unwrap() > 0.0, "{v}");
}

/// A depth past the largest context is refused up front, with the reason, not attempted.
#[test]
fn a_depth_beyond_any_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(["bench", "-m", model.to_str().unwrap(), "-t", "1"])
        .args(["-d", "18446744073709551615"])
        .output()
        .expect("spawn edgellm");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exceeds the largest context"), "{err}");
}

/// `--bandwidth`: the bound and both shares in the JSON, one paired share per tg run (each
/// against the probes beside it), and the text line that reports them.
#[test]
fn bandwidth_reports_the_bound_and_a_paired_share_per_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = write_model(dir.path());
    let out = bench_reps(&model, 3, &["-t", "1", "--bandwidth", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = &v[0];
    let num = |k: &str| row[k].as_f64().unwrap_or_else(|| panic!("{k} in {row}"));
    assert!(num("bw_gbps") > 0.0, "{row}");
    let bound = num("tg_bound_tps");
    assert!(
        (num("tg_of_bound") - num("tg_tps") / bound).abs() < 1e-9,
        "{row}"
    );
    let shares: Vec<f64> = row["tg_paired_shares"]
        .as_array()
        .unwrap_or_else(|| panic!("tg_paired_shares in {row}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(shares.len(), 3, "{row}");
    assert!(shares.iter().all(|&s| s > 0.0), "{row}");
    let mut sorted = shares.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(num("tg_of_bound_paired"), sorted[1], "{row}");

    let out = bench_reps(&model, 2, &["-t", "1", "--bandwidth"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("decoding is bounded near") && text.contains("% of it (each run against"),
        "{text}"
    );
}
