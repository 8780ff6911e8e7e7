//! The tokenizer against llama.cpp's own tokenizer suite: the vocabulary-only GGUF files
//! `models/ggml-vocab-*.gguf` of llama.cpp's source, each with `.inp` (cases separated by a
//! `__ggml_vocab_test__` line) and `.out` (one line of space-separated ids per case), as
//! llama.cpp's `tests/test-tokenizer-0.cpp` reads them. That test tokenizes with
//! `add_special = false, parse_special = false`; so does this one, and every case must match.
//!
//! The source comes from `bench/build-llamacpp.sh --source-only` (scripts/test.sh runs it);
//! `EDGELLM_LLAMACPP_SRC` names another llama.cpp tree. A missing tree fails the test: the
//! suite is never skipped. Vocabularies edgellm does not support yet are listed below with the
//! reason, and must be refused with that error, so the list cannot go stale.

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::tokenizer::Tokenizer;

/// Vocabularies with cases that edgellm must tokenize exactly as llama.cpp does.
const SUPPORTED: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Vocabularies with cases that edgellm refuses today: (name, why, a piece of the load error).
const UNSUPPORTED: &[(&str, &str, &str)] = &[
    // None today. An entry: ("name", "why it is refused", "a piece of the load error").
];

/// `models/` of the llama.cpp tree; panics saying how to get it when it is missing.
fn models_dir() -> PathBuf {
    let dir = common::llama_cpp_src().join("models");
    assert!(
        dir.join("ggml-vocab-gpt-2.gguf.inp").is_file(),
        "{} has no llama.cpp vocab test files: run `bench/build-llamacpp.sh --source-only` \
         (or set EDGELLM_LLAMACPP_SRC to a llama.cpp source tree)",
        dir.display()
    );
    dir
}

/// Every vocabulary name `ggml-vocab-NAME.gguf` of `dir` that has both case files, sorted.
fn vocabs_with_cases(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|f| {
            Some(
                f.strip_prefix("ggml-vocab-")?
                    .strip_suffix(".gguf.inp")?
                    .to_string(),
            )
        })
        .filter(|n| dir.join(format!("ggml-vocab-{n}.gguf.out")).is_file())
        .collect();
    names.sort();
    names
}

/// One case: the input bytes and llama.cpp's ids.
struct Case {
    text: Vec<u8>,
    ids: Vec<u32>,
}

/// Splits the case files as test-tokenizer-0.cpp's `read_tests` does: inputs at each
/// "\n__ggml_vocab_test__\n" (a text after the last marker is a case too), outputs one per
/// line, whitespace-trimmed.
fn parse_cases(inp: &[u8], out: &str) -> Result<Vec<Case>, String> {
    const SEP: &[u8] = b"\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].windows(SEP.len()).position(|w| w == SEP) {
            Some(n) => {
                texts.push(inp[pos..pos + n].to_vec());
                pos += n + SEP.len();
            }
            None => {
                texts.push(inp[pos..].to_vec());
                break;
            }
        }
    }
    let lines: Vec<&str> = out.lines().collect();
    if texts.len() != lines.len() {
        return Err(format!(
            "{} inputs but {} output lines",
            texts.len(),
            lines.len()
        ));
    }
    texts
        .into_iter()
        .zip(lines)
        .map(|(text, line)| {
            let ids = line
                .split_whitespace()
                .map(|s| s.parse().map_err(|e| format!("id {s:?}: {e}")))
                .collect::<Result<_, _>>()?;
            Ok(Case { text, ids })
        })
        .collect()
}

/// The tokenizer of a vocabulary, loaded once for all tests (a 262k-token vocabulary takes a
/// while to build in a test build).
fn loaded(dir: &Path, name: &str) -> &'static Result<Tokenizer, String> {
    static ALL: OnceLock<Vec<(&'static str, Result<Tokenizer, String>)>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        let names = SUPPORTED
            .iter()
            .copied()
            .chain(UNSUPPORTED.iter().map(|u| u.0));
        names.map(|n| (n, load(dir, n))).collect()
    });
    &all.iter()
        .find(|(n, _)| *n == name)
        .expect("a listed vocab")
        .1
}

fn load(dir: &Path, name: &str) -> Result<Tokenizer, String> {
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let gguf = Gguf::open(&path, &OpenOptions::default()).map_err(|e| format!("open: {e}"))?;
    Tokenizer::from_gguf(&gguf).map_err(|e| e.to_string())
}

fn cases(dir: &Path, name: &str) -> Vec<Case> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let read = |ext: &str| {
        let p = base.with_extension(format!("gguf.{ext}"));
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let out = String::from_utf8(read("out")).expect(".out is ASCII");
    parse_cases(&read("inp"), &out).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Failing cases shown per vocabulary and case set (a broken vocabulary fails all of them).
const SHOWN_FAILURES: usize = 5;

/// Our own texts with llama.cpp's ids for each supported vocabulary
/// (tests/data/llama_vocab_cases.json, made by bench/llama-vocab-cases.sh): llama.cpp's .inp
/// cases let real differences through (Qwen 3.5 without combining marks passed all 50).
fn extra_cases() -> Vec<(String, Vec<Case>)> {
    let d = common::read_json("llama_vocab_cases.json");
    let texts: Vec<&str> = d["texts"]
        .as_array()
        .expect("texts")
        .iter()
        .map(|t| t.as_str().expect("text"))
        .collect();
    let ids = d["ids"].as_object().expect("ids");
    ids.iter()
        .map(|(vocab, cases)| {
            let cases = cases.as_array().expect("ids per text");
            assert_eq!(cases.len(), texts.len(), "{vocab}: one id list per text");
            let cases = texts
                .iter()
                .zip(cases)
                .map(|(t, ids)| Case {
                    text: t.as_bytes().to_vec(),
                    ids: ids
                        .as_array()
                        .expect("ids")
                        .iter()
                        .map(|i| i.as_u64().expect("id") as u32)
                        .collect(),
                })
                .collect();
            (vocab.clone(), cases)
        })
        .collect()
}

/// Checks `cases` on `t`: the pass count, and up to [`SHOWN_FAILURES`] failures in `failures`.
fn check(t: &Tokenizer, what: &str, cases: &[Case], failures: &mut String) -> usize {
    let mut failed = 0;
    for c in cases {
        let got = t.encode_bytes(&c.text, false, false);
        if got == c.ids {
            continue;
        }
        failed += 1;
        if failed <= SHOWN_FAILURES {
            writeln!(
                failures,
                "{what}: case {:?}\n  expected {:?}\n  actual   {:?}",
                String::from_utf8_lossy(&c.text),
                c.ids,
                got
            )
            .unwrap();
        }
    }
    if failed > SHOWN_FAILURES {
        let more = failed - SHOWN_FAILURES;
        writeln!(failures, "{what}: and {more} more failing cases").unwrap();
    }
    cases.len() - failed
}

#[test]
fn every_case_of_the_supported_vocabs_matches_llama_cpp() {
    let dir = models_dir();
    let mut extra = extra_cases();
    let mut listed: Vec<&str> = extra.iter().map(|e| e.0.as_str()).collect();
    listed.sort();
    assert_eq!(
        listed, SUPPORTED,
        "tests/data/llama_vocab_cases.json must have ids for every supported vocab \
         (add it to \"ids\" and run bench/llama-vocab-cases.sh)"
    );
    let mut report = String::new();
    let mut failures = String::new();
    for &name in SUPPORTED {
        let t = match loaded(&dir, name) {
            Ok(t) => t,
            Err(e) => {
                writeln!(report, "{name:>16}: does not load").unwrap();
                writeln!(failures, "{name}: does not load: {e}").unwrap();
                continue;
            }
        };
        let suite = cases(&dir, name);
        let ours = extra
            .iter_mut()
            .find(|e| e.0 == name)
            .map(|e| std::mem::take(&mut e.1))
            .unwrap_or_default();
        let a = check(t, name, &suite, &mut failures);
        let b = check(
            t,
            &format!("{name} (llama_vocab_cases.json)"),
            &ours,
            &mut failures,
        );
        writeln!(
            report,
            "{name:>16}: {a}/{} llama.cpp cases, {b}/{} of ours",
            suite.len(),
            ours.len()
        )
        .unwrap();
    }
    println!("{report}");
    assert!(failures.is_empty(), "{report}\n{failures}");
}

/// Hostile input on every supported vocabulary: no panic, and every id in range. Long words
/// stay cheap (Gemma 4 merges a whole line as one word).
#[test]
fn hostile_input_never_panics_on_any_supported_vocab() {
    let dir = models_dir();
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    let mut mixed = Vec::new();
    for i in 0..4000u32 {
        let c = char::from_u32(i * 37 % 0x3_0000).unwrap_or('\u{fffd}');
        mixed.extend_from_slice(c.to_string().as_bytes());
        mixed.extend_from_slice(&[b' ', 0xFF, b'\n', 0xE4, 0xBD][..(i % 6) as usize]);
    }
    let inputs: [Vec<u8>; 6] = [
        all_bytes,
        b"\xff\xfe\xc3\xe4\xbd\xf0\x9f\x98\xed\xa0\x80\xf4\x90\x80\x80".to_vec(),
        "a".repeat(20_000).into_bytes(),
        " ".repeat(20_000).into_bytes(),
        "\n".repeat(20_000).into_bytes(),
        mixed,
    ];
    for &name in SUPPORTED {
        let t = match loaded(&dir, name) {
            Ok(t) => t,
            Err(e) => panic!("{name}: {e}"),
        };
        for input in &inputs {
            let start = std::time::Instant::now();
            let ids = t.encode_bytes(input, true, true);
            assert!(
                ids.iter().all(|&i| (i as usize) < t.n_vocab()),
                "{name}: id out of range"
            );
            let _ = t.decode(&ids);
            assert!(
                start.elapsed().as_secs() < 10,
                "{name}: {} input bytes took {:?}",
                input.len(),
                start.elapsed()
            );
        }
    }
}

#[test]
fn unsupported_vocabs_are_refused_with_a_clear_error() {
    let dir = models_dir();
    let mut stale = String::new();
    for &(name, why, error) in UNSUPPORTED {
        match loaded(&dir, name) {
            Ok(_) => writeln!(
                stale,
                "{name} loads now (was: {why}): move it from UNSUPPORTED to SUPPORTED"
            )
            .unwrap(),
            Err(e) if !e.contains(error) => writeln!(
                stale,
                "{name}: expected an error containing {error:?}, got {e:?}"
            )
            .unwrap(),
            Err(_) => {}
        }
    }
    assert!(stale.is_empty(), "{stale}");
}

#[test]
fn every_vocab_with_cases_is_listed_once() {
    let found = vocabs_with_cases(&models_dir());
    let mut listed: Vec<&str> = SUPPORTED
        .iter()
        .copied()
        .chain(UNSUPPORTED.iter().map(|u| u.0))
        .collect();
    listed.sort();
    assert_eq!(
        found, listed,
        "llama.cpp's vocabularies with cases vs SUPPORTED + UNSUPPORTED"
    );
}

#[test]
fn case_files_split_like_test_tokenizer_0() {
    let inp = b"a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\n b\n";
    let c = parse_cases(inp, "1 2\n\n 3 \n").unwrap();
    let texts: Vec<&[u8]> = c.iter().map(|c| &c.text[..]).collect();
    assert_eq!(texts, [&b"a"[..], b"", b" b\n"]);
    assert_eq!(
        c.iter().map(|c| c.ids.clone()).collect::<Vec<_>>(),
        [vec![1, 2], vec![], vec![3]]
    );
    // A trailing marker ends the last case: no empty case after it.
    let c = parse_cases(b"a\n__ggml_vocab_test__\n", "7\n").unwrap();
    assert_eq!(c.len(), 1);
    assert!(parse_cases(b"a", "1\n2\n").is_err());
}
