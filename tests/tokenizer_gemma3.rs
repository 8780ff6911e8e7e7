//! The tokenizer on Gemma 3's 262144-token SentencePiece vocabulary against llama.cpp's own
//! output (tests/data/gemma3/tokenize.json, copied from the shared reference set): byte
//! fallback, the 165 user-defined tokens (runs of newlines, spaces and tabs, HTML tags) that are
//! always split out, no space prefix, BOS added.

mod common;

use std::sync::OnceLock;

use common::tokens::ids;
use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::tokenizer::{TokenType, Tokenizer};

fn gemma3() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = common::model_path(common::GEMMA3);
        let gguf = Gguf::open(&path, &OpenOptions::default()).expect("open Gemma 3 GGUF");
        Tokenizer::from_gguf(&gguf).expect("Gemma 3 tokenizer")
    })
}

#[test]
fn gemma3_vocabulary_is_read_as_llama_cpp_reads_it() {
    let t = gemma3();
    let r = common::read_json("gemma3/tokenize.json");
    let info = &r["tokenizer"];
    assert_eq!(t.n_vocab() as u64, info["n_vocab"].as_u64().unwrap());
    assert_eq!(t.bos(), Some(info["bos_id"].as_u64().unwrap() as u32));
    assert_eq!(t.eos(), Some(info["eos_id"].as_u64().unwrap() as u32));
    assert!(t.add_bos());
    assert_eq!(t.token_type(106), Some(TokenType::Control), "<end_of_turn>");
    assert_eq!(t.token_type(107), Some(TokenType::UserDefined), "\"\\n\"");
    assert_eq!(t.token_to_piece(238), b"\x00", "<0x00> is a byte token");
}

#[test]
fn gemma3_matches_llama_cpp_ids_pieces_and_text_on_every_reference_string() {
    let t = gemma3();
    let r = common::read_json("gemma3/tokenize.json");
    let cases = r["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 30, "the reference file has its cases");
    // add_bos_token is true: add_special puts <bos> (2) in front, nothing else changes.
    let failures = common::tokens::reference_mismatches(t, cases, Some(2));
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// llama.cpp ends generation at `<eos>` (1), `<end_of_turn>` (106) and `</s>` (212), which the
/// file types USER_DEFINED and llama.cpp re-types as control.
#[test]
fn gemma3_end_of_generation_tokens_are_llama_cpps() {
    let t = gemma3();
    let r = common::read_json("gemma3/model.json");
    let want = ids(&r["metadata"]["llama_cpp_eog_ids"]);
    assert_eq!(t.eog_ids(), want.as_slice());
}
