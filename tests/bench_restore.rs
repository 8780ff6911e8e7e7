//! `edgellm bench --restore` on a tiny synthetic model: it reports both times to first token
//! and what each turn wrote, and the bytes are exactly the snapshot format's record sizes.

mod common;

use edgellm::model::synth::{SynthSpec, synth_model_bytes};
use std::process::Command;

#[test]
fn bench_restore_reports_ttft_and_the_exact_bytes_each_turn_writes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        n_vocab: 400,
        ..Default::default()
    };
    let m = dir.path().join("synth.gguf");
    std::fs::write(&m, synth_model_bytes(&spec)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args([
            "bench",
            "-m",
            m.to_str().unwrap(),
            "--restore",
            "--restore-prompt",
            "40",
        ])
        .args(["-r", "1", "-t", "1", "--json", "--restore-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let v = common::json_of(&out);
    assert_eq!(v["system_tokens"], 40);
    assert_eq!(v["prompt_tokens"], 56);
    for k in ["cold_ttft_ms", "restored_ttft_ms", "speedup"] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {v}");
    }
    // n_layer 2, kv_dim 2 heads × 16, f16: 2 × 2 × 32 × 2 bytes of K/V per position.
    let per_pos = 2 * 2 * 32 * 2;
    assert_eq!(v["kv_bytes_per_position"], per_pos);
    // A record: its header, token ids, their CRC, the rows, their CRC.
    use edgellm::kv::snapshot::{HEADER_LEN, RECORD_HEADER_LEN};
    let record = |n: u64| RECORD_HEADER_LEN as u64 + 4 * n + 4 + n * per_pos + 4;
    let turns = v["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 3);
    // The first save writes the whole session (the file header + one record) ...
    let n0 = turns[0]["positions"].as_u64().unwrap();
    assert_eq!(n0, 56 + 16 - 1, "{v}");
    assert_eq!(
        turns[0]["bytes"].as_u64().unwrap(),
        HEADER_LEN as u64 + record(n0)
    );
    // ... each later turn only its new positions: the question and the answer.
    for t in &turns[1..] {
        assert_eq!(t["positions"], 32, "{v}");
        assert_eq!(t["bytes"].as_u64().unwrap(), record(32));
    }
    assert_eq!(
        v["snapshot_bytes"].as_u64().unwrap(),
        HEADER_LEN as u64 + record(40)
    );
    // The scratch directory is removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
