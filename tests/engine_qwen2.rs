//! Qwen2.5-Coder 0.5B and 1.5B Instruct (Q4_K_M, as published) against llama.cpp's vectors in
//! `tests/data/qwen2.5-{0.5b,1.5b}/` (made by `bench/llamacpp-vectors.sh` from the same files):
//! the qwen2 pre-tokenizer and its 151,936-token vocabulary, the file's ChatML template as
//! Python's jinja2 renders it, and the forward pass (q/k/v biases, rope base 1e6, GQA 14:2 with
//! head dim 64 on the 0.5B, 12:2 with head dim 128 on the 1.5B).
//!
//! The 0.5B is held to the whole set (tokenization, top-10 logits and 32 greedy tokens of raw
//! and chat prompts, 1 and 2 threads, x86 against aarch64); the 1.5B, three times the bytes,
//! to its tokenization and 8 greedy tokens of three prompts.

mod common;

use common::vectors::{cases, check_top_logits, floats, ids};
use edgellm::engine::{Engine, EngineConfig};
use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::kv::KvType;
use edgellm::model::{LoadOptions, Model};
use edgellm::tokenizer::{ChatMessage, ChatTemplate};
use serde_json::Value;
use std::sync::Arc;

/// The vectors' quant key: one file per model, llama.cpp's default path.
const PATH: &str = "default";

fn load(name: &str) -> Arc<Model> {
    let p = common::model_path(name);
    Arc::new(
        Model::load(&p, &LoadOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", p.display())),
    )
}

fn engine(model: &Arc<Model>, threads: usize) -> Engine {
    let cfg = EngineConfig {
        n_ctx: 512,
        chunk: 64,
        threads,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).unwrap()
}

fn greedy(model: &Model, e: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    common::vectors::greedy(e, prompt, n, |t| model.tokenizer.is_eog(t))
}

/// The vectors of one model (`qwen2.5-0.5b/greedy.json`, …).
fn data(name: &str, file: &str) -> Value {
    common::read_json(&format!("{name}/{file}"))
}

/// Ids, pieces and detokenized text of every string (code, Chinese, emoji, runs of spaces,
/// tabs and newlines, typed control tokens) are llama.cpp's, on both files; no BOS is added
/// (the files say `add_bos_token = false`), and llama.cpp's end-of-generation ids are ours.
#[test]
fn tokenizer_matches_llama_cpp_on_both_files() {
    for name in [common::QWEN_05B, common::QWEN_15B] {
        let model = load(name);
        let t = &model.tokenizer;
        let r = data(name, "tokenize.json");
        assert_eq!(t.n_vocab(), 151_936, "{name}");
        assert_eq!(t.eog_ids(), ids(&r["eog"]).as_slice(), "{name}: eog ids");
        let cases = cases(&r, "tokenize.json");
        assert!(cases.len() >= 20, "{name}: {} strings", cases.len());
        let failures = common::tokens::reference_mismatches(t, cases, None);
        assert!(
            failures.is_empty(),
            "{name}: {} mismatches:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// Each chat prompt of the vectors is the file's own template rendered by Python's jinja2 (as
/// Hugging Face's `apply_chat_template` does): ours renders the same text, with and without a
/// system message (Qwen's template puts in its default one), and tokenizes it to the same ids.
#[test]
fn chat_template_renders_as_jinja2_and_tokenizes_as_llama_cpp() {
    let name = common::QWEN_05B;
    let path = common::model_path(name);
    let model = load(name);
    let gguf = Gguf::open(&path, &OpenOptions::default()).unwrap();
    let tmpl = ChatTemplate::from_gguf(&gguf, &model.tokenizer).unwrap();
    let r = data(name, "greedy.json");
    let mut n = 0;
    for case in cases(&r, "greedy.json") {
        if case["kind"] != "chat" {
            continue;
        }
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let text = tmpl.render(&messages, true).unwrap();
        assert_eq!(text, case["prompt"].as_str().unwrap(), "{}", case["id"]);
        let got = model.tokenizer.encode(&text, true, true);
        assert_eq!(got, ids(&case["prompt_ids"]), "{}: ids", case["id"]);
        n += 1;
    }
    assert!(n >= 5, "only {n} chat cases");
}

/// After each prompt, llama.cpp's top-10 logits are within the tolerance of its default or
/// precise path, and our top-1 is theirs unless theirs is a near-tie.
#[test]
fn top_logits_match_llama_cpp() {
    let model = load(common::QWEN_05B);
    let r = data(common::QWEN_05B, "logits.json");
    let mut e = engine(&model, 2);
    let (mut top1, mut worst, mut n) = (0, 0.0f32, 0);
    for case in cases(&r, "logits.json") {
        let mut s = e.new_session();
        let logits = e.feed(&mut s, &ids(&case["prompt_ids"])).unwrap().to_vec();
        let (theirs, w) = check_top_logits(case, PATH, &logits, 0.5);
        top1 += usize::from(theirs);
        worst = worst.max(w);
        n += 1;
    }
    assert!(n >= 10, "only {n} prompts");
    eprintln!("engine_qwen2: 0.5B top-1 {top1}/{n}, worst |logit diff| {worst:.3}");
}

/// Ids of `got` and llama.cpp's `case` agree up to where llama.cpp's precise path parts from
/// its default one, stopping before the first near-tie (margin < 0.5); returns how many were
/// compared.
fn compare_greedy(case: &Value, got: &[u32], limit: usize) -> usize {
    let want = ids(&case["generated_ids"]);
    let margins = floats(&case["top1_margin"]);
    assert!(
        !want.is_empty() && margins.len() == want.len(),
        "{}",
        case["id"]
    );
    let agree = case["agree_prefix_with_kv_f32_fa_off"].as_u64().unwrap() as usize;
    let end = agree.min(want.len()).min(limit);
    let upto = margins[..end].iter().position(|&m| m < 0.5).unwrap_or(end);
    assert_eq!(
        got[..upto.min(got.len())],
        want[..upto],
        "{}: the first {upto} ids",
        case["id"]
    );
    upto
}

/// Greedy continuations of raw and chat prompts equal llama.cpp's (up to its own near-ties),
/// and are the same bits with 1 and 2 threads (on three prompts: the 2-core CI machine pays
/// for each).
#[test]
fn greedy_continuations_match_llama_cpp_on_any_thread_count() {
    let model = load(common::QWEN_05B);
    let r = data(common::QWEN_05B, "greedy.json");
    let mut two = engine(&model, 2);
    let mut one = engine(&model, 1);
    let (mut steps, mut compared, mut n) = (0, 0, 0);
    for (i, case) in cases(&r, "greedy.json").iter().enumerate() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated_ids"]);
        let (got, _) = greedy(&model, &mut two, &prompt, want.len());
        let upto = compare_greedy(case, &got, want.len());
        steps += upto;
        compared += usize::from(upto > 0);
        n += 1;
        if i % 4 == 0 {
            let (single, _) = greedy(&model, &mut one, &prompt, want.len());
            assert_eq!(single, got, "{}: 1 vs 2 threads", case["id"]);
        }
    }
    assert!(n >= 10, "only {n} prompts");
    // Not a vacuous pass: the file's prompts hold 65 ids in 10 cases before llama.cpp's first
    // near-tie (or its two paths parting); a near-tie at the first step leaves a case out.
    assert!(
        compared >= 9 && steps >= 60,
        "only {steps} ids in {compared} cases compared"
    );
    eprintln!("engine_qwen2: 0.5B greedy: {steps} ids compared in {compared} of {n} cases");
}

/// The 1.5B (head dim 128, GQA 12:2): 8 greedy tokens of three prompts, raw and chat.
#[test]
fn the_1_5b_continues_three_prompts_as_llama_cpp_does() {
    let model = load(common::QWEN_15B);
    let r = data(common::QWEN_15B, "greedy.json");
    let mut e = engine(&model, 2);
    let mut steps = 0;
    let all = cases(&r, "greedy.json");
    assert!(all.len() >= 3, "{} prompts", all.len());
    for case in all {
        let (got, _) = greedy(&model, &mut e, &ids(&case["prompt_ids"]), 8);
        steps += compare_greedy(case, &got, 8);
    }
    assert!(steps >= 12, "only {steps} ids compared");
    eprintln!("engine_qwen2: 1.5B greedy: {steps} ids compared");
}

/// Greedy ids of two prompts are the same on x86 and aarch64: with `EDGELLM_QWEN_IDS_OUT` this
/// run's ids and margins are written out; with `EDGELLM_QWEN_IDS_EXPECT` (the x86 run's file,
/// read under qemu) compared, up to the first step the other run saw as a near-exact tie.
#[test]
fn greedy_ids_are_identical_across_architectures() {
    let model = load(common::QWEN_05B);
    let r = data(common::QWEN_05B, "greedy.json");
    let mut e = engine(&model, 2);
    let mut all = Vec::new();
    // A raw and a chat prompt; 8 tokens each keeps the emulated run short.
    for id in ["raw-02", "chat-00"] {
        let case = cases(&r, "greedy.json")
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no case {id}"));
        let (got, margins) = greedy(&model, &mut e, &ids(&case["prompt_ids"]), 8);
        assert!(compare_greedy(case, &got, 8) >= 4, "{id} vs llama.cpp");
        all.push(serde_json::json!({"id": id, "ids": got, "margins": margins}));
    }
    if let Some(path) = std::env::var_os("EDGELLM_QWEN_IDS_OUT") {
        std::fs::write(&path, serde_json::to_string(&all).unwrap()).unwrap();
    }
    if let Some(path) = std::env::var_os("EDGELLM_QWEN_IDS_EXPECT") {
        let gap = common::vectors::compare_with_other_architecture(&all, &path);
        eprintln!(
            "engine_qwen2: {} greedy ids identical to the other architecture's (largest margin \
             difference {gap:e})",
            std::env::consts::ARCH
        );
    }
}
