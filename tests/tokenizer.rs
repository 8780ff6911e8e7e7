//! The tokenizer against llama.cpp's own output on SmolLM2-135M-Instruct
//! (tests/data/tokenize.json, copied from the shared reference set), plus the properties
//! untrusted input needs: no panic, bounded time, exact round trips.

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::tokenizer::{PreTokenizer, StreamDecoder, TokenType, Tokenizer};
use serde_json::Value;

fn smollm2() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = common::model_path("q4_1");
        let gguf = Gguf::open(&path, &OpenOptions::default()).expect("open SmolLM2 GGUF");
        Tokenizer::from_gguf(&gguf).expect("SmolLM2 tokenizer")
    })
}

fn reference() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tokenize.json"
    ))
    .expect("tests/data/tokenize.json");
    serde_json::from_str(&text).expect("valid JSON")
}

#[test]
fn smollm2_vocabulary_is_read_as_llama_cpp_reads_it() {
    let t = smollm2();
    let r = reference();
    let info = &r["tokenizer"];
    assert_eq!(t.n_vocab() as u64, info["n_vocab"].as_u64().unwrap());
    assert_eq!(t.bos(), Some(info["bos_id"].as_u64().unwrap() as u32));
    assert_eq!(t.eos(), Some(info["eos_id"].as_u64().unwrap() as u32));
    assert_eq!(t.add_bos(), info["add_bos_token"].as_bool().unwrap());
    assert_eq!(
        t.pre_tokenizer(),
        PreTokenizer::DigitsThenGpt2,
        "pre = smollm"
    );
    assert_eq!(t.token_type(1), Some(TokenType::Control));
}

#[test]
fn smollm2_matches_llama_cpp_ids_pieces_and_text_on_every_reference_string() {
    let t = smollm2();
    let r = reference();
    let cases = r["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "the reference file has its cases");
    // add_bos_token is false: add_special changes nothing.
    let failures = common::tokens::reference_mismatches(t, cases, None);
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_and_chat_template_can_be_shared_across_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Tokenizer>();
    shared::<edgellm::tokenizer::ChatTemplate>();
}

#[test]
fn smollm2_end_of_generation_tokens_are_endoftext_im_end_and_reponame() {
    let t = smollm2();
    assert_eq!(t.eog_ids(), [0, 2, 4]);
    assert!(t.is_eog(2) && !t.is_eog(1) && !t.is_eog(3) && !t.is_eog(u32::MAX));
}

#[test]
fn control_tokens_in_text_are_plain_text_unless_parse_special() {
    let t = smollm2();
    let text = "<|im_start|>user\nhi<|im_end|>";
    assert_eq!(t.encode(text, false, true), [1, 4093, 198, 6004, 2]);
    assert!(!t.encode(text, false, false).contains(&1));
    // Detokenizing drops control tokens unless asked to render them.
    assert_eq!(t.decode(&[1, 4093, 2]), b"user");
    assert_eq!(
        t.detokenize(&[1, 4093, 2], false, true),
        b"<|im_start|>user<|im_end|>"
    );
    assert_eq!(t.token_to_piece_special(1, false), b"");
}

#[test]
fn smollm_splits_digits_one_by_one() {
    let t = smollm2();
    let got = t.encode("2024", false, false);
    let digits: Vec<u32> = "2024"
        .chars()
        .map(|c| t.encode(&c.to_string(), false, false)[0])
        .collect();
    assert_eq!(got, digits);
}

#[test]
fn pieces_of_split_characters_stream_back_to_whole_text() {
    let t = smollm2();
    let text = "你好，世界 — naïve café 😀";
    let mut d = StreamDecoder::new();
    let mut out = String::new();
    for id in t.encode(text, false, false) {
        out += &d.push(t.token_to_piece(id));
    }
    out += &d.finish();
    assert_eq!(out, text);
}

#[test]
fn any_bytes_tokenize_without_panic_and_valid_text_round_trips() {
    let t = smollm2();
    // A deterministic pseudo-random byte soup, including invalid UTF-8 and control bytes.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut soup = Vec::new();
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        soup.push((x >> 24) as u8);
    }
    let ids = t.encode_bytes(&soup, true, true);
    assert!(ids.iter().all(|&i| (i as usize) < t.n_vocab()));
    // SmolLM2 has no token for a few bytes (\x04, \x06, the lead byte \xF1 of planes 4-7, …)
    // and llama.cpp drops them; on text made of the other characters the round trip is exact.
    let lossy = String::from_utf8_lossy(&soup);
    let text: String = lossy
        .chars()
        .filter(|c| {
            let s = c.to_string();
            t.decode(&t.encode(&s, false, false)) == s.as_bytes()
        })
        .collect();
    assert!(
        text.chars().count() * 10 > lossy.chars().count() * 9,
        "only a few characters lack tokens"
    );
    let back = t.decode(&t.encode(&text, false, false));
    assert!(
        back == text.as_bytes(),
        "smollm has no space clean-up: the round trip is exact"
    );
    assert!(t.encode("", true, true).is_empty());
    assert!(
        t.decode(&[u32::MAX, 49_152]).is_empty(),
        "ids past the vocabulary decode to nothing"
    );
}

#[test]
fn a_megabyte_of_one_letter_tokenizes_in_well_under_a_second() {
    let t = smollm2();
    for text in [
        "a".repeat(1 << 20),
        " ".repeat(1 << 20),
        "ab1 ".repeat(1 << 18),
    ] {
        let start = Instant::now();
        let ids = t.encode(&text, false, true);
        let took = start.elapsed();
        assert!(!ids.is_empty());
        assert!(t.decode(&ids) == text.as_bytes());
        // Release builds take a fraction of this; the bound leaves room for a busy CI core.
        assert!(took.as_secs_f64() < 1.0, "1 MiB took {took:?}");
    }
}
