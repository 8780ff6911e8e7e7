//! `edgellm inspect` and `edgellm quantize` as a user runs them: on all three quants of the real
//! model, and on bad files, whose errors must be one `edgellm: <file>: …` line, never a panic.

mod common;

use common::{model_path, read_json};
use edgellm::gguf::{GgmlType, GgufWriter};
use std::path::Path;
use std::process::{Command, Output};

fn edgellm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_edgellm"))
        .args(args)
        .output()
        .expect("run edgellm")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Fails unless `o` is a clean one-line error starting with `edgellm: `.
fn assert_clean_error(o: &Output) -> String {
    let e = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success: {}",
        stdout(o)
    );
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.starts_with("edgellm: "), "{e}");
    assert!(
        !e.contains("panicked") && !e.contains("RUST_BACKTRACE"),
        "{e}"
    );
    assert_eq!(e.trim_end().lines().count(), 1, "one line: {e}");
    e
}

#[test]
fn inspect_json_on_all_three_quants() {
    let model = read_json("model.json");
    for (quant, key) in [("q4_1", "Q4_1"), ("q4_0", "Q4_0"), ("q8_0", "Q8_0")] {
        let p = model_path(quant);
        let o = edgellm(&[
            "inspect",
            "-m",
            p.to_str().unwrap(),
            "--json",
            "--ctx",
            "4096",
            "--chunk",
            "1",
        ]);
        assert!(o.status.success(), "{quant}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let want = &model["files"][key];
        assert_eq!(v["architecture"], "llama");
        assert_eq!(v["n_tensors"], 272);
        assert_eq!(v["n_params"], model["metadata"]["n_params"]);
        assert_eq!(v["file_type"], want["general.file_type"]);
        assert_eq!(v["tensor_bytes"], want["tensor_bytes_total"]);
        assert_eq!(v["runnable"], true);
        for (ty, t) in want["tensor_types"].as_object().unwrap() {
            assert_eq!(
                v["tensor_types"][ty]["n_tensors"], t["n_tensors"],
                "{quant} {ty}"
            );
            assert_eq!(v["tensor_types"][ty]["bytes"], t["bytes"], "{quant} {ty}");
        }
        assert_eq!(
            v["tensor_types"].as_object().unwrap().len(),
            want["tensor_types"].as_object().unwrap().len()
        );
        assert_eq!(v["tokenizer"]["model"], "gpt2");
        assert_eq!(v["tokenizer"]["n_tokens"], 49152);
        assert_eq!(v["tokenizer"]["n_merges"], 48900);
        assert_eq!(v["tokenizer"]["eos"][1], "<|im_end|>");
        assert_eq!(v["chat_template"], true);
        assert_eq!(v["hparams"]["n_head_kv"], 3);
        assert_eq!(v["hparams"]["head_dim"], 64);
        let mem = &v["memory"];
        assert_eq!(mem["kv_cache"], 2 * 30 * 4096 * 3 * 64 * 2);
        assert_eq!(mem["weights"], want["tensor_bytes_total"]);
        assert_eq!(mem["logits"], 4 * 49152);
        let sum = ["weights", "kv_cache", "activations", "logits"]
            .iter()
            .map(|k| mem[k].as_u64().unwrap())
            .sum::<u64>();
        assert_eq!(mem["total"], sum);
    }
}

/// `--batch B`: a KV cache and a row of logits for each answer decoded together, and what one
/// more slot costs.
#[test]
fn inspect_counts_a_kv_cache_and_logits_for_each_answer_of_a_batch() {
    let p = model_path("q4_0");
    let json = |batch: &str| {
        let o = edgellm(&[
            "inspect",
            p.to_str().unwrap(),
            "--json",
            "--ctx",
            "2048",
            "--batch",
            batch,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap()["memory"].clone()
    };
    let (one, four) = (json("1"), json("4"));
    let kv = 2 * 30 * 2048 * 3 * 64 * 2u64;
    assert_eq!(four["batch"], 4);
    assert_eq!(four["kv_cache"], kv);
    assert_eq!(four["per_extra_slot"], kv + 4 * 49152);
    let total = |m: &serde_json::Value| m["total"].as_u64().unwrap();
    assert_eq!(total(&four) - total(&one), 3 * (kv + 4 * 49152));
    let o = edgellm(&[
        "inspect",
        p.to_str().unwrap(),
        "--ctx",
        "2048",
        "--batch",
        "4",
    ]);
    let out = stdout(&o);
    assert!(
        out.contains("memory at ctx 2048 (chunk 64, batch 4):"),
        "{out}"
    );
    assert!(
        out.contains("per extra batch slot 45.2 MiB (its KV cache 45.0 MiB + its logits 0.2 MiB)"),
        "{out}"
    );
    let o = edgellm(&["inspect", p.to_str().unwrap(), "--batch", "17"]);
    assert!(!o.status.success());
}

#[test]
fn inspect_text_says_what_it_counts() {
    let p = model_path("q4_0");
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for want in [
        "architecture:  llama (Smollm2 135M 8k Lc100K Mix1 Ep2)",
        "file type:     mostly Q4_0 (general.file_type 2)",
        "30 layers, embd 576, heads 9 (kv 3), head dim 64, ffn 1536, vocab 49152",
        "Q4_0       210 tensors",
        "Q8_0         1 tensor ",
        "F32         61 tensors",
        "runnable:      yes",
        "gpt2 (pre smollm), 49152 tokens, 48900 merges, bos 1 \"<|im_start|>\", eos 2 \"<|im_end|>\"",
        "chat template: present (368 bytes)",
        "memory at ctx 2048 (chunk 64):",
        "KV cache         45.0 MiB  (f16: 2 x 30 layers x 2048 ctx x 3 kv heads x 64 head dim x 2 B)",
        "total",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
    let o = edgellm(&[
        "inspect",
        "-m",
        p.to_str().unwrap(),
        "--metadata",
        "--tensors",
    ]);
    let s = stdout(&o);
    assert!(s.contains("tokenizer.ggml.tokens = [string; 49152]"), "{s}");
    assert!(s.contains("blk.29.ffn_down.weight"), "{s}");
}

/// As llama.cpp's tools take it: `edgellm inspect model.gguf`, `edgellm tokenize model.gguf`.
/// The file on its own wins over `EDGELLM_MODEL`; on its own and with `-m` is refused.
#[test]
fn the_model_is_taken_on_its_own_or_with_m_but_not_both() {
    let p = model_path("q4_1");
    let m = p.to_str().unwrap();
    let run = |args: &[&str], env: Option<&str>, stdin: &str| {
        use std::io::Write;
        let mut c = Command::new(env!("CARGO_BIN_EXE_edgellm"));
        c.args(args)
            .env_remove("EDGELLM_MODEL")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(v) = env {
            c.env("EDGELLM_MODEL", v);
        }
        let mut child = c.spawn().expect("run edgellm");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    for cmd in ["inspect", "tokenize"] {
        let flag = run(&[cmd, "-m", m, "--json"], None, "Hello world");
        assert!(flag.status.success(), "{cmd} -m: {}", stderr(&flag));
        let alone = run(&[cmd, m, "--json"], None, "Hello world");
        assert!(alone.status.success(), "{cmd} MODEL: {}", stderr(&alone));
        assert_eq!(stdout(&alone), stdout(&flag), "{cmd}");
        let env = run(
            &[cmd, m, "--json"],
            Some("/nonexistent.gguf"),
            "Hello world",
        );
        assert!(
            env.status.success(),
            "{cmd} MODEL over EDGELLM_MODEL: {}",
            stderr(&env)
        );
        assert_eq!(stdout(&env), stdout(&flag), "{cmd}");
        let from_env = run(&[cmd, "--json"], Some(m), "Hello world");
        assert!(
            from_env.status.success(),
            "{cmd} EDGELLM_MODEL: {}",
            stderr(&from_env)
        );

        for env in [None, Some(m)] {
            let both = run(&[cmd, m, "-m", m], env, "");
            let e = stderr(&both);
            assert_eq!(both.status.code(), Some(2), "{cmd}: {e}");
            assert!(
                e.contains("'[MODEL]' cannot be used with '--model <MODEL>'")
                    && e.contains(&format!("Usage: edgellm {cmd} ")),
                "{cmd}: {e}"
            );
        }
        let flag_over_env = run(
            &[cmd, "-m", m, "--json"],
            Some("/nonexistent.gguf"),
            "Hello world",
        );
        assert_eq!(stdout(&flag_over_env), stdout(&flag), "{cmd}");
        let none = run(&[cmd], None, "");
        let e = stderr(&none);
        assert_eq!(none.status.code(), Some(2), "{cmd}: {e}");
        assert!(
            e.contains("required arguments were not provided") && e.contains("<MODEL>"),
            "{cmd}: {e}"
        );

        let help = stdout(&run(&[cmd, "--help"], None, ""));
        assert!(
            help.contains(&format!("edgellm {cmd} smollm2-135m-q4_0.gguf")),
            "{help}"
        );
    }
}

/// Gemma 3's sliding-window layers hold a ring, not the context: at 32k positions its KV cache
/// is 3 layers x 32768 + 15 layers x 1279 (2·512 − 1 + 256) positions, not 18 x 32768.
#[test]
fn inspect_counts_the_sliding_window_rings() {
    let p = model_path(common::GEMMA3);
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap(), "--ctx", "32768"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let want = "KV cache        114.7 MiB  (f16: 2 x (3 layers x 32768 ctx + 15 sliding-window \
                layers x 1279) x 1 kv heads x 256 head dim x 2 B)";
    assert!(s.contains(want), "missing {want:?} in:\n{s}");
    let o = edgellm(&[
        "inspect",
        "-m",
        p.to_str().unwrap(),
        "--ctx",
        "32768",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let positions = 3 * 32768 + 15 * 1279;
    assert_eq!(v["memory"]["kv_cache"], positions * 2 * 256 * 2);
}

#[test]
fn inspect_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let e = assert_clean_error(&edgellm(&["inspect", "-m", missing.to_str().unwrap()]));
    assert!(
        e.contains(&format!("edgellm: {}: ", missing.display())),
        "{e}"
    );

    // A real-model-sized header with its data cut off.
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.add_f32("blk.0.attn_norm.weight", &[64], &[1.0; 64])
        .unwrap();
    w.add_tensor(
        "blk.3.ffn_up.weight",
        GgmlType::Q4_0,
        &[64, 4],
        vec![0; 144],
    )
    .unwrap();
    let (bytes, layout) = w.to_bytes_with_layout().unwrap();
    let cut = dir.path().join("model.gguf");
    let len = (layout.data_offset + 256 + 144 - 10) as usize;
    std::fs::write(&cut, &bytes[..len]).unwrap();
    let e = assert_clean_error(&edgellm(&["inspect", "-m", cut.to_str().unwrap()]));
    let off = layout.data_offset + 256;
    assert_eq!(
        e.trim_end(),
        format!(
            "edgellm: {}: tensor 'blk.3.ffn_up.weight' data runs past end of file (offset {off}, size 144, file {})",
            cut.display(),
            len
        )
    );

    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"PK\x03\x04 not a model").unwrap();
    let e = assert_clean_error(&edgellm(&["inspect", "-m", junk.to_str().unwrap()]));
    assert!(e.contains("junk.gguf: not a GGUF file"), "{e}");
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert_clean_error(&edgellm(&["inspect", "-m", empty.to_str().unwrap()]));
    assert_clean_error(&edgellm(&["inspect", "-m", dir.path().to_str().unwrap()]));
}

#[test]
fn inspect_reports_unrunnable_types() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.add_tensor(
        "blk.0.ffn_up.weight",
        GgmlType::Q3_K,
        &[256, 2],
        vec![0; 220],
    )
    .unwrap();
    let p = dir.path().join("k.gguf");
    w.write_file(&p).unwrap();
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains("Q3_K         1 tensor"), "{s}");
    assert!(
        s.contains("runnable:      no:")
            && s.contains("'blk.0.ffn_up.weight' has type Q3_K")
            && s.contains("edgellm quantize"),
        "{s}"
    );
    assert!(
        s.contains("shape:         unknown (metadata key 'llama.block_count' is missing)"),
        "{s}"
    );
}

/// A header-only model file with `arch`'s shape keys set to `v` and a 4-token vocabulary.
fn shape_only(dir: &Path, arch: &str, v: u32) -> std::path::PathBuf {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", arch);
    for key in [
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "context_length",
    ] {
        w.set_u32(&format!("{arch}.{key}"), v);
    }
    let tokens = ["a", "b", "c", "d"].map(String::from).to_vec();
    w.set_array(
        "tokenizer.ggml.tokens",
        edgellm::gguf::Array::String(tokens),
    );
    let p = dir.join(format!("{arch}-{v}.gguf"));
    w.write_file(&p).unwrap();
    p
}

#[test]
fn inspect_answers_metadata_whose_sizes_would_overflow_without_panicking() {
    let dir = tempfile::tempdir().unwrap();
    // Every count u32::MAX: 2 x layers x ctx x kv heads x head dim x 2 B overflows 64 bits.
    let p = shape_only(dir.path(), "llama", u32::MAX);
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains("shape:         unknown (metadata 'llama.block_count' = 4294967295: must be in 1..=1024)"),
        "{s}"
    );
    assert!(
        !s.contains("memory at"),
        "no estimate from an unknown shape: {s}"
    );

    // A sane shape with a context that no memory holds: the estimate says it overflows.
    let p = shape_only(dir.path(), "llama", 64);
    let huge = u64::MAX.to_string();
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap(), "--ctx", &huge]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.contains(&format!("memory at ctx {huge} (chunk 64): overflow")),
        "{s}"
    );
    let o = edgellm(&[
        "inspect",
        "-m",
        p.to_str().unwrap(),
        "--json",
        "--ctx",
        &huge,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(
        v["memory"]["error"]
            .as_str()
            .unwrap()
            .starts_with("overflow"),
        "{v}"
    );
    assert!(v["memory"]["total"].is_null(), "{v}");
    // Large but representable: the exact figure.
    let o = edgellm(&[
        "inspect",
        "-m",
        p.to_str().unwrap(),
        "--json",
        "--ctx",
        "1048576",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        v["memory"]["kv_cache"],
        2u64 * 64 * 1048576 * 64 * 64 * 2,
        "{v}"
    );
}

#[test]
fn inspect_describes_an_architecture_it_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = shape_only(dir.path(), "phi3", 64);
    let o = edgellm(&["inspect", "-m", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    for want in [
        "64 layers, embd 64, heads 64 (kv 64), head dim 64, ffn 64, vocab 4",
        "train context: 64",
        "runnable:      no: architecture 'phi3' is not supported (edgellm runs llama, qwen2, mistral, gemma3 graphs)",
        "memory at ctx 2048 (chunk 64):",
    ] {
        assert!(s.contains(want), "missing {want:?} in:\n{s}");
    }
}

#[test]
fn quantize_cli() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f32.gguf");
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.add_f32("blk.0.attn_q.weight", &[32, 2], &[0.5; 64])
        .unwrap();
    w.write_file(&src).unwrap();
    let out = dir.path().join("q8.gguf");
    let (s, o) = (src.to_str().unwrap(), out.to_str().unwrap());
    let r = edgellm(&["quantize", s, o, "q8_0"]);
    assert!(r.status.success(), "{}", stderr(&r));
    // Not a terminal: no progress bar, nothing printed.
    assert_eq!(stderr(&r), "");
    assert_eq!(stdout(&r), "");
    let r = edgellm(&["inspect", "-m", o, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&r)).unwrap();
    assert_eq!(v["file_type"], 7);
    assert_eq!(v["tensor_types"]["Q8_0"]["n_tensors"], 1);

    let r = edgellm(&["quantize", s, o, "q2_k"]);
    assert!(!r.status.success());
    assert!(
        stderr(&r).contains("unknown type 'q2_k' (expected one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m, f16)"),
        "{}",
        stderr(&r)
    );
    let e = assert_clean_error(&edgellm(&["quantize", s, s, "q4_0"]));
    assert!(e.contains("output must differ from the input"), "{e}");
    let e = assert_clean_error(&edgellm(&[
        "quantize",
        dir.path().join("nope.gguf").to_str().unwrap(),
        o,
        "q4_0",
    ]));
    assert!(e.contains("nope.gguf: "), "{e}");
    let bad_dir = Path::new(o).join("sub/x.gguf");
    let e = assert_clean_error(&edgellm(&[
        "quantize",
        s,
        bad_dir.to_str().unwrap(),
        "q4_0",
    ]));
    assert!(e.contains("x.gguf"), "{e}");

    // The Q8_0 output is already quantized: quantizing it again is refused unless asked for,
    // and then warned about.
    let q4 = dir.path().join("q4.gguf");
    let q4s = q4.to_str().unwrap();
    let e = assert_clean_error(&edgellm(&["quantize", o, q4s, "q4_0"]));
    assert!(
        e.contains("1 of 1 tensors are already quantized")
            && e.contains("blk.0.attn_q.weight Q8_0 -> Q4_0")
            && e.contains("--allow-requantize"),
        "{e}"
    );
    assert!(!q4.exists(), "nothing written when refused");
    let r = edgellm(&["quantize", "--allow-requantize", o, q4s, "q4_0"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(stderr(&r).contains("warning:"), "{}", stderr(&r));
    assert!(q4.exists());

    let help = stdout(&edgellm(&["quantize", "--help"]));
    assert!(
        help.contains("q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m or f16")
            && help.contains("llama-quantize"),
        "{help}"
    );
    let help = stdout(&edgellm(&["inspect", "--help"]));
    assert!(
        help.contains("-m, --model") && help.contains("--chunk") && help.contains("KV cache"),
        "{help}"
    );
}
