//! The arrows of `src/lib.rs` hold: no module of the library names a layer above its own
//! (`crate::engine` inside `model`, `edgellm::model` inside `kv`, …). A text scan, so a new
//! upward `use` fails here before a reviewer has to spot it.

use std::path::Path;

/// What a front end (MQTT, serial) may use: the service and all below it, not each other.
const FRONT_END: &[&str] = &[
    "gguf",
    "kv",
    "tokenizer",
    "runtime",
    "model",
    "engine",
    "service",
];

/// Each layer with the modules of ours it may use (kernels_neon is a separate crate that
/// cannot depend on us, so it is not listed).
const LAYERS: [(&str, &[&str]); 15] = [
    ("gguf", &[]),
    ("kv", &["gguf"]),
    ("tokenizer", &["gguf"]),
    ("quantize", &["gguf"]),
    ("runtime", &[]),
    // Board profiles and detection: pure data and parsing, for the daemon and the CLI only
    // (the engine gets the profile's CPUs and threads as plain numbers).
    ("board", &[]),
    // Perplexity and KL-divergence arithmetic, the saved-reference file: for the CLI, which
    // feeds the engine and hands each position's logits over.
    ("eval", &[]),
    ("model", &["gguf", "kv", "tokenizer", "runtime"]),
    ("engine", &["gguf", "kv", "tokenizer", "runtime", "model"]),
    (
        "service",
        &["gguf", "kv", "tokenizer", "runtime", "model", "engine"],
    ),
    // The audit trail: written by the service's worker through its `Recorder`, read by the CLI.
    (
        "audit",
        &[
            "gguf",
            "kv",
            "tokenizer",
            "runtime",
            "model",
            "engine",
            "service",
        ],
    ),
    ("mqtt", FRONT_END),
    ("serial", FRONT_END),
    (
        "daemon",
        &[
            "gguf",
            "kv",
            "tokenizer",
            "runtime",
            "board",
            "model",
            "engine",
            "service",
            "audit",
            "mqtt",
            "serial",
        ],
    ),
    (
        "cli",
        &[
            "gguf",
            "kv",
            "tokenizer",
            "quantize",
            "runtime",
            "board",
            "eval",
            "model",
            "engine",
            "service",
            "audit",
            "mqtt",
            "serial",
            "daemon",
        ],
    ),
];

fn rust_files(p: &Path, out: &mut Vec<std::path::PathBuf>) {
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            rust_files(&e.unwrap().path(), out);
        }
    } else if p.is_file() && p.extension().is_some_and(|e| e == "rs") {
        out.push(p.to_path_buf());
    }
}

/// Whether `line` names module `m` of ours as a path (`crate::m::…`, `edgellm::m;`), not as a
/// prefix of another name (`crate::model` is not `crate::mod`).
fn names(line: &str, m: &str) -> bool {
    ["crate::", "edgellm::"].iter().any(|root| {
        let path = format!("{root}{m}");
        line.match_indices(&path).any(|(at, _)| {
            let next = line[at + path.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn no_module_uses_a_layer_above_its_own() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    for (layer, may_use) in LAYERS {
        let mut files = Vec::new();
        rust_files(&src.join(layer), &mut files);
        rust_files(&src.join(format!("{layer}.rs")), &mut files);
        assert!(!files.is_empty(), "layer {layer} has no source under src/");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for (n, line) in text.lines().enumerate() {
                for (other, _) in LAYERS {
                    if other != layer && names(line, other) && !may_use.contains(&other) {
                        bad.push(format!("{}:{}: {layer} uses {other}", f.display(), n + 1));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "arrows pointing up:\n{}", bad.join("\n"));
}

/// No shell-outs: nothing under src/ starts a program (the appliance's attack surface is its
/// own code; a PLC's bytes can never reach a shell).
#[test]
fn no_module_starts_a_program() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if ["process::Command", "Command::new", "libc::system", "execv"]
                .iter()
                .any(|p| code.contains(p))
            {
                bad.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(bad.is_empty(), "programs started:\n{}", bad.join("\n"));
}
