//! Tokenizers over synthetic vocabularies, and SmolLM2's chat template over untrusted
//! messages: the text paths every prompt takes, whatever interface it came in by.

use super::{Input, text};
use edgellm::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, TokenType, Tokenizer};
use edgellm::tokenizer::{Vocab, VocabKind};
use std::sync::OnceLock;

/// SmolLM2's `tokenizer.chat_template`, as `tests/data/model.json` has it (the regression test
/// checks they are the same text).
pub const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-character table: the byte-level alphabet of a `gpt2` vocabulary.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let n = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + n).expect("below U+0200")
}

/// A byte-level BPE vocabulary with ChatML control tokens, every byte, a few merges and a
/// user-defined token; `pre` is its pre-tokenizer.
fn bpe_vocab(pre: &str) -> Vocab {
    let mut tokens: Vec<String> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        .map(String::from)
        .into();
    let mut types = vec![TokenType::Control as i32; 3];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    let merges = [
        "Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "< |", "Ċ Ċ", "Ã ¤",
    ];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    types.resize(tokens.len(), TokenType::Normal as i32);
    tokens.push("<tool>".into());
    types.push(TokenType::UserDefined as i32);
    Vocab {
        kind: VocabKind::Bpe,
        pre: Some(pre.into()),
        tokens,
        types,
        merges: merges.map(String::from).into(),
        bos: Some(1),
        eos: Some(2),
        ..Vocab::default()
    }
}

/// A SentencePiece vocabulary with byte fallback (`<0xNN>` for every byte).
fn spm_vocab() -> Vocab {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).into();
    let mut types = vec![
        TokenType::Unknown as i32,
        TokenType::Control as i32,
        TokenType::Control as i32,
    ];
    let mut scores = vec![0.0; 3];
    tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), TokenType::Byte as i32);
    scores.resize(tokens.len(), 0.0);
    for (i, p) in [
        "▁", "H", "e", "l", "o", "ll", "llo", "▁w", "or", "▁wor", "He", "▁Hello",
    ]
    .iter()
    .enumerate()
    {
        tokens.push(p.to_string());
        types.push(TokenType::Normal as i32);
        scores.push(-(i as f32) / 4.0);
    }
    Vocab {
        kind: VocabKind::Spm,
        tokens,
        scores,
        types,
        ..Vocab::default()
    }
}

/// A Gemma 4 vocabulary (`gemma4` model): BPE over raw UTF-8 with `▁` for spaces, `<0xNN>`
/// byte tokens for what no token covers, and merges written in those characters. The file
/// names its special tokens (Gemma 4 has no defaults); `<|tool_response>` is there so that
/// loading takes the branch that turns `</s>` next to it into a plain token.
fn gemma4_vocab() -> Vocab {
    let specials = [
        ("<pad>", TokenType::Control),
        ("<eos>", TokenType::Control),
        ("<bos>", TokenType::Control),
        ("<unk>", TokenType::Unknown),
        ("<start_of_turn>", TokenType::Control),
        ("<end_of_turn>", TokenType::Control),
        ("<|tool_response>", TokenType::Control),
        ("</s>", TokenType::Control),
    ];
    let mut tokens: Vec<String> = specials.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = specials.iter().map(|&(_, k)| k as i32).collect();
    tokens.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    types.resize(tokens.len(), TokenType::Byte as i32);
    // Characters (`é` two bytes; `▁`, `你` and `好` three), then what the merges make.
    let chars = [
        "▁", "\n", "H", "t", "h", "e", "l", "o", "w", "r", "d", "a", "1", "é", "你", "好",
    ];
    let merges = [
        "▁ t", "h e", "▁t he", "l l", "e ll", "▁ w", "o r", "\n \n", "你 好", "▁ ▁", "▁ é",
    ];
    tokens.extend(chars.map(String::from));
    tokens.extend(merges.map(|m| m.replacen(' ', "", 1)));
    types.resize(tokens.len(), TokenType::Normal as i32);
    tokens.push("<tool>".into());
    types.push(TokenType::UserDefined as i32);
    Vocab {
        kind: VocabKind::Gemma4,
        tokens,
        types,
        merges: merges.map(String::from).into(),
        bos: Some(2),
        eos: Some(1),
        unk: Some(3),
        ..Vocab::default()
    }
}

/// A WordPiece vocabulary (`bert` model): BERT's five special tokens, every lower-case ASCII
/// letter and digit both as a word start (`▁x`) and a continuation (`x`), so that most ASCII
/// words have a cover and the rest are `[UNK]`, a few whole words and punctuation, and two CJK
/// ideographs (each a word of its own). `cased` keeps case and accents, as a cased BERT does,
/// and adds the capitals.
fn wpm_vocab(cased: bool) -> Vocab {
    let specials = [
        ("[PAD]", TokenType::Control),
        ("[UNK]", TokenType::Unknown),
        ("[CLS]", TokenType::Control),
        ("[SEP]", TokenType::Control),
        ("[MASK]", TokenType::Control),
    ];
    let mut tokens: Vec<String> = specials.iter().map(|(t, _)| t.to_string()).collect();
    let mut types: Vec<i32> = specials.iter().map(|&(_, k)| k as i32).collect();
    let mut alphabet: Vec<char> = ('a'..='z').chain('0'..='9').collect();
    if cased {
        alphabet.extend('A'..='Z');
    }
    for c in alphabet {
        tokens.push(format!("▁{c}"));
        tokens.push(c.to_string());
    }
    for w in [
        "▁hello", "▁the", "▁wor", "ld", "ing", "▁,", "▁.", "▁!", "▁$", "▁中", "▁文", "▁é", "é",
    ] {
        tokens.push(w.into());
    }
    types.resize(tokens.len(), TokenType::Normal as i32);
    Vocab {
        kind: VocabKind::Wpm,
        tokens,
        types,
        // BERT's default ids (101, 100, 102, 0) are past this small vocabulary: name them.
        bos: Some(2),
        unk: Some(1),
        sep: Some(3),
        pad: Some(0),
        lowercase: Some(!cased),
        strip_accents: Some(!cased),
        ..Vocab::default()
    }
}

/// The tokenizers, built once: (tokenizer, whether decoding gives back the text exactly). The
/// target picks one by the low four bits of its first byte, wrapping past the end; new kinds
/// go at the end, so that an index keeps naming the same tokenizer (`chat_template` uses 0).
fn tokenizers() -> &'static [(Tokenizer, bool)] {
    static T: OnceLock<Vec<(Tokenizer, bool)>> = OnceLock::new();
    T.get_or_init(|| {
        // Byte-level BPE round-trips exactly unless its pre-tokenizer's model cleans up
        // spaces in decoding (`default`, `llama3`, `gpt-2`, `falcon` do; the others do not).
        let bpe = [
            ("smollm", true),
            ("qwen2", true),
            ("default", false),
            ("llama3", false),
        ];
        let mut v: Vec<_> = bpe
            .iter()
            .map(|&(p, exact)| (Tokenizer::new(bpe_vocab(p)).expect(p), exact))
            .collect();
        v.push((Tokenizer::new(spm_vocab()).expect("spm"), false));
        let more_bpe = [
            ("gpt-2", false),
            ("qwen35", true),
            ("falcon", false),
            ("deepseek-llm", true),
            ("deepseek-coder", true),
        ];
        v.extend(
            more_bpe
                .iter()
                .map(|&(p, exact)| (Tokenizer::new(bpe_vocab(p)).expect(p), exact)),
        );
        // Gemma 4 cleans up spaces; WordPiece normalizes and loses the spaces between words.
        v.push((Tokenizer::new(gemma4_vocab()).expect("gemma4"), false));
        v.push((Tokenizer::new(wpm_vocab(false)).expect("bert"), false));
        v.push((Tokenizer::new(wpm_vocab(true)).expect("bert, cased"), false));
        v
    })
}

fn is_control(tok: &Tokenizer, id: u32) -> bool {
    tok.token_type(id) == Some(TokenType::Control)
}

/// The first byte picks the tokenizer (low four bits) and the flags (high four: `0x10`
/// add_special and `0x20` parse_special for `encode_bytes`, `0x40` remove_special and `0x80`
/// unparse_special for `detokenize`); the rest is the text. Kind and flags have bits of their
/// own, so every pairing of the two is reachable.
pub fn tokenizer(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let (tok, exact) = &tokenizers()[(sel & 0xF) as usize % tokenizers().len()];
    let bytes = input.rest();
    let n = tok.n_vocab();
    let text = String::from_utf8_lossy(bytes);
    let ids = tok.encode(&text, false, false);
    assert!(ids.iter().all(|&i| (i as usize) < n), "{ids:?}");
    assert!(
        !ids.iter().any(|&i| is_control(tok, i)),
        "text became control tokens: {ids:?}"
    );
    if *exact {
        assert_eq!(String::from_utf8_lossy(&tok.decode(&ids)), text, "{ids:?}");
    }
    let add_special = sel & 0x10 != 0;
    let raw = tok.encode_bytes(bytes, add_special, sel & 0x20 != 0);
    assert!(raw.iter().all(|&i| (i as usize) < n), "{raw:?}");
    if add_special && tok.add_bos() {
        assert_eq!(raw.first(), tok.bos().as_ref(), "BOS first: {raw:?}");
    }
    // Protected as a whole, even control-token text stays text.
    let whole = tok.encode_protected(&text, false, std::slice::from_ref(&(0..text.len())));
    assert!(!whole.iter().any(|&i| is_control(tok, i)), "{whole:?}");
    // The bytes as ids (any, in range or not): detokenizing and streaming never panic, and a
    // stream of pieces is their bytes, lossily decoded.
    let any: Vec<u32> = bytes
        .chunks(2)
        .map(|c| u32::from(c[0]) + 256 * u32::from(c.len() % 2 == 0 && c[1] & 1 == 1))
        .collect();
    let _ = tok.detokenize(&any, sel & 0x40 != 0, sel & 0x80 != 0);
    let mut stream = StreamDecoder::new();
    let (mut out, mut all) = (String::new(), Vec::new());
    for &id in &any {
        let piece = tok.token_to_piece(id);
        all.extend_from_slice(piece);
        stream.push_into(piece, &mut out);
        assert!(stream.pending().len() <= 3);
    }
    out.push_str(&stream.finish());
    assert_eq!(out, String::from_utf8_lossy(&all));
}

fn chat() -> &'static ChatTemplate {
    static C: OnceLock<ChatTemplate> = OnceLock::new();
    C.get_or_init(|| {
        ChatTemplate::new(SMOLLM2_TEMPLATE, "<|im_start|>", "<|im_end|>").expect("template")
    })
}

/// Messages from the input: a selector byte (system override, generation prompt), then
/// role and content runs.
pub fn chat_template(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let system = (sel & 1 != 0).then(|| text(input.run(), 255));
    let mut messages = Vec::new();
    while !input.is_empty() && messages.len() < 8 {
        let role = match input.u8() % 4 {
            0 => "user".to_string(),
            1 => "assistant".to_string(),
            2 => "system".to_string(),
            _ => text(input.run(), 32), // MQTT takes the role from the client too
        };
        messages.push(ChatMessage::new(role, text(input.run(), 255)));
    }
    let tok = &tokenizers()[0].0;
    let Ok(r) = chat().render_protected(system.as_deref(), &messages, sel & 2 != 0) else {
        return;
    };
    assert_eq!(
        r.text,
        chat()
            .render_with_system(system.as_deref(), &messages, sel & 2 != 0)
            .expect("renders")
    );
    let ids = tok.encode_protected(&r.text, true, &r.ranges());
    assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()));
    // The control tokens are the template's own: as many as with harmless contents and roles.
    let plain: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(if m.role == "system" { "system" } else { "user" }, "x"))
        .collect();
    let layout = chat()
        .render_with_system(system.as_ref().map(|_| "x"), &plain, sel & 2 != 0)
        .expect("renders");
    let controls = |ids: &[u32]| ids.iter().filter(|&&i| is_control(tok, i)).count();
    let want = controls(&tok.encode(&layout, true, true));
    assert_eq!(
        controls(&ids),
        want,
        "user text became control tokens: {:?}",
        r.text
    );
    for (_, range) in &r.contents {
        assert!(r.text.is_char_boundary(range.start) && r.text.is_char_boundary(range.end));
    }
}
