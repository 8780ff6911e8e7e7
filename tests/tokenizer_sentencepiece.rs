//! The SentencePiece path against the `sentencepiece` library itself: a 360-piece BPE model
//! with byte fallback was trained on a few English sentences (`model_type=bpe`,
//! `byte_fallback`, `normalization_rule_name=identity`, `add_dummy_prefix`,
//! `remove_extra_whitespaces=false`); its pieces and scores, and the ids
//! `SentencePieceProcessor.encode` gives for each string below, are inlined here. No
//! Llama-2-family model ships with this project, so this is the reference for that path.
//! Ids: `<unk>` 0, `<s>` 1, `</s>` 2, `<0x00>`..`<0xFF>` 3..=258, then `PIECES` from 259.

use edgellm::tokenizer::{TokenType, Tokenizer, Vocab, VocabKind};

const PIECES: &[(&str, f32)] = &[
    ("re", -0.0),
    ("he", -1.0),
    ("▁t", -2.0),
    ("▁the", -3.0),
    ("en", -4.0),
    ("in", -5.0),
    ("▁a", -6.0),
    ("▁b", -7.0),
    ("li", -8.0),
    ("ve", -9.0),
    ("▁d", -10.0),
    ("▁o", -11.0),
    ("▁s", -12.0),
    ("ure", -13.0),
    ("▁re", -14.0),
    ("al", -15.0),
    ("ce", -16.0),
    ("ch", -17.0),
    ("ef", -18.0),
    ("el", -19.0),
    ("ic", -20.0),
    ("it", -21.0),
    ("mp", -22.0),
    ("or", -23.0),
    ("ra", -24.0),
    ("rn", -25.0),
    ("▁T", -26.0),
    ("▁l", -27.0),
    ("ens", -28.0),
    ("ing", -29.0),
    ("▁do", -30.0),
    ("▁they", -31.0),
    ("):", -32.0),
    ("Ma", -33.0),
    ("ad", -34.0),
    ("av", -35.0),
    ("az", -36.0),
    ("dd", -37.0),
    ("ds", -38.0),
    ("ea", -39.0),
    ("ee", -40.0),
    ("ex", -41.0),
    ("fo", -42.0),
    ("if", -43.0),
    ("is", -44.0),
    ("ju", -45.0),
    ("ld", -46.0),
    ("ll", -47.0),
    ("lo", -48.0),
    ("ne", -49.0),
    ("ou", -50.0),
    ("ow", -51.0),
    ("qu", -52.0),
    ("rt", -53.0),
    ("ss", -54.0),
    ("tu", -55.0),
    ("▁+", -56.0),
    ("▁H", -57.0),
    ("▁I", -58.0),
    ("▁h", -59.0),
    ("▁", -60.0),
    ("e", -61.0),
    ("r", -62.0),
    ("a", -63.0),
    ("i", -64.0),
    ("l", -65.0),
    ("n", -66.0),
    ("t", -67.0),
    ("o", -68.0),
    ("s", -69.0),
    ("h", -70.0),
    ("d", -71.0),
    ("u", -72.0),
    ("c", -73.0),
    ("f", -74.0),
    ("v", -75.0),
    ("'", -76.0),
    (".", -77.0),
    ("b", -78.0),
    ("g", -79.0),
    ("m", -80.0),
    ("p", -81.0),
    ("y", -82.0),
    (",", -83.0),
    ("T", -84.0),
    ("w", -85.0),
    ("x", -86.0),
    ("!", -87.0),
    ("(", -88.0),
    (")", -89.0),
    ("+", -90.0),
    (":", -91.0),
    (";", -92.0),
    ("?", -93.0),
    ("H", -94.0),
    ("I", -95.0),
    ("M", -96.0),
    ("j", -97.0),
    ("k", -98.0),
    ("q", -99.0),
    ("z", -100.0),
];

const CASES: &[(&str, &[u32])] = &[
    ("Hello world", &[316, 278, 307, 319, 344, 282, 305]),
    (" Hello world", &[319, 316, 278, 307, 319, 344, 282, 305]),
    (
        "The quick brown fox jumps over the lazy dog.",
        &[
            285, 260, 319, 311, 279, 357, 266, 321, 310, 325, 319, 301, 345, 319, 304, 281, 328,
            270, 268, 321, 262, 286, 295, 341, 289, 338, 336,
        ],
    ),
    (
        "I'm sure you'll see they've done it, haven't they?",
        &[
            317, 335, 339, 271, 272, 319, 341, 309, 335, 306, 271, 299, 290, 335, 268, 289, 308,
            319, 280, 342, 318, 294, 263, 335, 326, 290, 352,
        ],
    ),
    (
        "def add(a, b):\n    return a + b\n",
        &[
            269, 277, 265, 296, 347, 322, 342, 266, 291, 13, 319, 319, 319, 273, 314, 284, 265,
            315, 266, 13,
        ],
    ),
    (
        "  leading and trailing spaces  ",
        &[
            319, 319, 286, 320, 293, 288, 265, 325, 330, 261, 283, 323, 324, 288, 271, 340, 322,
            275, 328, 319, 319,
        ],
    ),
    (
        "Temperature 85.3°C exceeds the limit (80°C).",
        &[
            285, 320, 281, 320, 283, 326, 272, 319, 59, 56, 336, 54, 197, 179, 70, 319, 300, 275,
            320, 297, 262, 319, 267, 339, 280, 319, 347, 59, 51, 197, 179, 70, 348, 336,
        ],
    ),
    (
        "naïve café — 你好 😀",
        &[
            319, 325, 322, 198, 178, 268, 319, 332, 322, 333, 198, 172, 319, 229, 131, 151, 319,
            231, 192, 163, 232, 168, 192, 319, 243, 162, 155, 131,
        ],
    ),
    (
        "machine learning is a branch of artificial intelligence",
        &[
            319, 339, 322, 276, 264, 320, 286, 298, 284, 288, 319, 303, 265, 266, 283, 325, 276,
            270, 333, 265, 312, 302, 279, 323, 274, 319, 264, 326, 278, 267, 338, 263, 275,
        ],
    ),
    (
        "pressure relief valve",
        &[319, 340, 259, 313, 272, 273, 267, 277, 319, 334, 274, 268],
    ),
    ("", &[]),
    ("x", &[319, 345]),
    ("\t\n", &[319, 12, 13]),
    (
        "ÀÉÎÕÜ",
        &[319, 198, 131, 198, 140, 198, 145, 198, 152, 198, 159],
    ),
    ("the the the the", &[262, 262, 262, 262]),
    (
        "Hello\nworld\n\n",
        &[316, 278, 307, 13, 344, 282, 305, 13, 13],
    ),
    (
        "a  b   c    d",
        &[265, 319, 266, 319, 319, 319, 332, 319, 319, 319, 269],
    ),
];

fn trained() -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![
        TokenType::Unknown as i32,
        TokenType::Control as i32,
        TokenType::Control as i32,
    ];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(TokenType::Byte as i32);
    }
    let mut scores = vec![0.0; tokens.len()];
    for &(p, s) in PIECES {
        tokens.push(p.to_string());
        types.push(TokenType::Normal as i32);
        scores.push(s);
    }
    Tokenizer::new(Vocab {
        kind: VocabKind::Spm,
        tokens,
        scores,
        types,
        ..Vocab::default()
    })
    .expect("trained SentencePiece vocabulary")
}

#[test]
fn sentencepiece_ids_match_the_sentencepiece_library() {
    let t = trained();
    for &(text, want) in CASES {
        assert_eq!(t.encode(text, false, false), want, "{text:?}");
    }
}

#[test]
fn sentencepiece_ids_decode_back_to_the_text() {
    let t = trained();
    for &(text, want) in CASES {
        assert_eq!(t.decode(want), text.as_bytes(), "{text:?}");
        let with_bos: Vec<u32> = std::iter::once(1).chain(want.iter().copied()).collect();
        assert_eq!(
            t.encode(text, true, false),
            with_bos,
            "BOS added by default: {text:?}"
        );
    }
}

#[test]
fn a_megabyte_of_text_tokenizes_in_well_under_a_second() {
    let t = trained();
    for text in [
        "the ".repeat(1 << 18),
        " ".repeat(1 << 20),
        "a".repeat(1 << 20),
    ] {
        let start = std::time::Instant::now();
        let ids = t.encode(&text, false, false);
        let took = start.elapsed();
        assert!(t.decode(&ids) == text.as_bytes());
        assert!(took.as_secs_f64() < 1.0, "1 MiB took {took:?}");
    }
}
