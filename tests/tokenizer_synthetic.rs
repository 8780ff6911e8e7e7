//! Tokenizer paths no shipped model exercises, on small synthetic vocabularies whose results
//! are worked out by hand in the comments: SentencePiece BPE (Llama 2 family: scores, `▁`,
//! dummy prefix, byte fallback) and byte-level BPE options (Llama 3's whole-word lookup,
//! end-of-generation heuristics).

use edgellm::tokenizer::{TokenType, Tokenizer, Vocab, VocabKind};

/// `<unk>` 0, `<s>` 1, `</s>` 2, `<0x00>`..`<0xFF>` 3..=258, then pieces with scores.
fn spm_vocab() -> Vocab {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![
        TokenType::Unknown as i32,
        TokenType::Control as i32,
        TokenType::Control as i32,
    ];
    let mut scores = vec![0.0, 0.0, 0.0];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte as i32);
        scores.push(0.0);
    }
    let pieces: [(&str, f32, TokenType); 18] = [
        ("▁", -5.0, TokenType::Normal),          // 259
        ("H", -4.0, TokenType::Normal),          // 260
        ("e", -4.0, TokenType::Normal),          // 261
        ("l", -4.0, TokenType::Normal),          // 262
        ("o", -4.0, TokenType::Normal),          // 263
        ("w", -4.0, TokenType::Normal),          // 264
        ("r", -4.0, TokenType::Normal),          // 265
        ("d", -4.0, TokenType::Normal),          // 266
        ("ll", -1.0, TokenType::Normal),         // 267
        ("llo", -1.5, TokenType::Normal),        // 268
        ("▁w", -2.0, TokenType::Normal),         // 269
        ("or", -2.5, TokenType::Normal),         // 270
        ("▁wor", -3.0, TokenType::Normal),       // 271
        ("He", -2.0, TokenType::Normal),         // 272
        ("Hello", -1.0, TokenType::Normal),      // 273
        ("▁Hello", -0.5, TokenType::Normal),     // 274
        ("ld", -3.5, TokenType::Normal),         // 275
        ("<tool>", 0.0, TokenType::UserDefined), // 276
    ];
    for (p, s, t) in pieces {
        tokens.push(p.to_string());
        scores.push(s);
        types.push(t as i32);
    }
    Vocab {
        kind: VocabKind::Spm,
        tokens,
        scores,
        types,
        ..Vocab::default()
    }
}

fn spm() -> Tokenizer {
    Tokenizer::new(spm_vocab()).expect("synthetic SentencePiece vocabulary")
}

#[test]
fn sentencepiece_merges_by_score_with_a_dummy_prefix_space() {
    // "▁Hello▁world": ll(-1), llo(-1.5), He(-2, left of ▁w's tie), Hello(-1), ▁Hello(-0.5),
    // ▁w(-2), or(-2.5), ▁wor(-3), ld(-3.5) → ▁Hello ▁wor ld.
    let t = spm();
    assert_eq!(t.encode("Hello world", false, false), [274, 271, 275]);
    // Llama-family defaults: BOS added, no EOS.
    assert_eq!(t.encode("Hello world", true, false), [1, 274, 271, 275]);
    assert!(t.add_bos() && !t.add_eos());
}

#[test]
fn sentencepiece_falls_back_to_byte_tokens_for_unknown_characters() {
    // "▁é": ▁ is a token, é is not: its UTF-8 bytes C3 A9 are <0xC3> (3+0xC3) and <0xA9>.
    let t = spm();
    assert_eq!(t.encode("é", false, false), [259, 3 + 0xC3, 3 + 0xA9]);
    assert_eq!(
        t.decode(&[259, 3 + 0xC3, 3 + 0xA9]),
        "é".as_bytes(),
        "dummy space removed"
    );
}

#[test]
fn sentencepiece_prefixes_a_space_after_each_special_token() {
    let t = spm();
    // Special: "Hello" | </s> | "world", each text fragment gets its own ▁.
    assert_eq!(t.encode("Hello</s>world", false, true), [274, 2, 271, 275]);
    // Plain: "</s>" is four bytes without tokens, "world" has no ▁ inside the fragment
    // (w, or, ld).
    let plain = [
        274,
        3 + b'<' as u32,
        3 + b'/' as u32,
        3 + b's' as u32,
        3 + b'>' as u32,
        264,
        270,
        275,
    ];
    assert_eq!(t.encode("Hello</s>world", false, false), plain);
    // User-defined tokens are split out even without parse_special.
    assert_eq!(t.encode("Hello<tool>", false, false), [274, 276]);
}

#[test]
fn sentencepiece_detokenizes_like_llama_cpp() {
    let t = spm();
    assert_eq!(t.decode(&[274, 271, 275]), b"Hello world");
    // The BOS is the first token, so its (empty) piece is the one stripped of a space.
    assert_eq!(t.decode(&[1, 274, 271, 275]), b" Hello world");
    // remove_special drops the BOS and, as in llama.cpp, keeps the space then.
    assert_eq!(
        t.detokenize(&[1, 274, 271, 275], true, false),
        b" Hello world"
    );
    assert_eq!(t.detokenize(&[1, 274, 2], false, true), b"<s> Hello</s>");
    assert_eq!(t.token_to_piece(3 + 0x0A), b"\n");
}

#[test]
fn sentencepiece_without_add_space_prefix_starts_with_the_bare_word() {
    let v = Vocab {
        add_space_prefix: Some(false),
        ..spm_vocab()
    };
    let t = Tokenizer::new(v).unwrap();
    // H e l l o → ll → llo → He → Hello.
    assert_eq!(t.encode("Hello", false, false), [273]);
}

/// Byte-level BPE in GPT-2 characters: `Ġ` is the space.
fn bpe_vocab(pre: &str) -> Vocab {
    let tokens = [
        "a",
        "b",
        "c",
        "Ġ",
        "ab",
        "abc",
        "Ġa",
        "<|eot_id|>",
        "<|begin_of_text|>",
        "<|im_end|>",
    ];
    let types = [1, 1, 1, 1, 1, 1, 1, 3, 3, 1];
    Vocab {
        kind: VocabKind::Bpe,
        pre: Some(pre.to_string()),
        tokens: tokens.iter().map(|s| s.to_string()).collect(),
        types: types.to_vec(),
        merges: vec!["a b".into(), "Ġ a".into()],
        bos: Some(8),
        ..Vocab::default()
    }
}

#[test]
fn llama3_takes_a_word_that_is_a_token_whole_and_gpt2_merges_it() {
    // No merge makes "abc", but the vocabulary has it: Llama 3 ignores merges for such words.
    let llama3 = Tokenizer::new(bpe_vocab("llama-bpe")).unwrap();
    assert_eq!(llama3.encode("abc", false, false), [5]);
    // "Ġabc" is no token: merge "a b" (rank 0) goes before "Ġ a" (rank 1), which then no
    // longer applies → Ġ ab c, after the BOS Llama 3 adds by default.
    assert_eq!(llama3.encode(" abc", true, false), [8, 3, 4, 2]);
    let gpt2 = Tokenizer::new(bpe_vocab("gpt-2")).unwrap();
    assert_eq!(gpt2.encode("abc", false, false), [4, 2]);
    assert_eq!(gpt2.encode("abc", true, false), [4, 2], "no BOS by default");
}

#[test]
fn end_of_generation_tokens_come_from_texts_when_the_file_names_none() {
    let t = Tokenizer::new(bpe_vocab("gpt-2")).unwrap();
    // <|eot_id|> becomes EOT; <|im_end|> is also an end of turn and is promoted to control.
    assert_eq!(t.eog_ids(), [7, 9]);
    assert_eq!(t.special_ids().eot, Some(7));
    assert_eq!(t.token_type(9), Some(TokenType::Control));
    assert_eq!(t.encode("a<|im_end|>", false, true), [0, 9]);
}

#[test]
fn inconsistent_vocabularies_are_errors_not_panics() {
    assert!(Tokenizer::new(Vocab::default()).is_err(), "empty");
    let dup = Vocab {
        tokens: vec!["a".into(), "a".into()],
        add_bos: Some(false),
        ..Vocab::default()
    };
    assert!(Tokenizer::new(dup).is_err(), "duplicate token");
    let short = Vocab {
        scores: vec![0.0],
        ..bpe_vocab("gpt-2")
    };
    assert!(Tokenizer::new(short).is_err(), "scores shorter than tokens");
    let unknown = bpe_vocab("no-such-pre");
    assert!(Tokenizer::new(unknown).is_err(), "unknown pre-tokenizer");
    let no_bos = Vocab {
        bos: None,
        ..bpe_vocab("llama3")
    };
    assert!(
        Tokenizer::new(no_bos).is_err(),
        "add_bos without a BOS token"
    );
}

/// A deterministic xorshift generator for the hostile-input test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One to four pieces that tokenizers treat specially: byte-level and SentencePiece
    /// spaces, special-token brackets, multi-byte characters, the empty string.
    fn word(&mut self) -> String {
        const PIECES: [&str; 14] = [
            "a", "b", "Ġ", "▁", " ", "<", "|", ">", "é", "你", "<0x41>", "", "\n", "1",
        ];
        let n = 1 + self.below(4);
        (0..n)
            .map(|_| PIECES[self.below(PIECES.len() as u64) as usize])
            .collect()
    }
}

#[test]
fn hostile_vocabularies_and_inputs_never_panic() {
    let mut r = Rng(0x2545_F491_4F6C_DD1D);
    let pres = [
        "smollm",
        "llama-bpe",
        "qwen2",
        "default",
        "gpt-2",
        "qwen35",
        "falcon",
        "deepseek-llm",
        "deepseek-coder",
    ];
    let kinds = [
        VocabKind::Bpe,
        VocabKind::Spm,
        VocabKind::Gemma4,
        VocabKind::Wpm,
    ];
    let mut loaded = 0;
    for round in 0..400u64 {
        // Distinct texts (duplicates are a load error, tested elsewhere).
        let mut tokens: Vec<String> = (0..1 + r.below(40)).map(|_| r.word()).collect();
        let mut seen = std::collections::HashSet::new();
        tokens.retain(|t| seen.insert(t.clone()));
        let n_tokens = tokens.len() as u64;
        let v = Vocab {
            kind: kinds[(round % 4) as usize],
            pre: Some(pres[(round / 4 % 9) as usize].to_string()),
            tokens,
            types: (0..n_tokens).map(|_| r.below(8) as i32).collect(),
            scores: (0..n_tokens)
                .map(|i| {
                    if i % 7 == 3 {
                        f32::NAN
                    } else {
                        -(r.below(50) as f32)
                    }
                })
                .collect(),
            merges: (0..r.below(30))
                .map(|_| format!("{} {}", r.word(), r.word()))
                .collect(),
            bos: Some(r.below(50) as u32),
            eos: Some(r.below(50) as u32),
            add_bos: Some(r.below(2) == 0),
            add_eos: Some(r.below(2) == 0),
            ..Vocab::default()
        };
        // A BOS/EOS asked for but out of range is an error; everything else must load.
        let Ok(t) = Tokenizer::new(v) else { continue };
        loaded += 1;
        let bytes: Vec<u8> = (0..r.below(200)).map(|_| r.next() as u8).collect();
        let words: String = (0..20).map(|_| r.word()).collect();
        for input in [&bytes[..], words.as_bytes()] {
            for (add, parse) in [(false, false), (true, true)] {
                let ids = t.encode_bytes(input, add, parse);
                assert!(ids.iter().all(|&i| (i as usize) < t.n_vocab()));
                let _ = t.detokenize(&ids, add, parse);
            }
        }
    }
    assert!(loaded > 100, "only {loaded} of 400 vocabularies loaded");
}
