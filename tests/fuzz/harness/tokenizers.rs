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

/// The tokenizers, built once: (tokenizer, whether decoding gives back the text exactly).
fn tokenizers() -> &'static [(Tokenizer, bool)] {
    static T: OnceLock<Vec<(Tokenizer, bool)>> = OnceLock::new();
    T.get_or_init(|| {
        // `smollm` and `qwen2` do not clean up spaces in decoding, `default` and `llama3` do.
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
        v
    })
}

fn is_control(tok: &Tokenizer, id: u32) -> bool {
    tok.token_type(id) == Some(TokenType::Control)
}

pub fn tokenizer(data: &[u8]) {
    let mut input = Input::new(data);
    let sel = input.u8();
    let (tok, exact) = &tokenizers()[sel as usize % tokenizers().len()];
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
    let raw = tok.encode_bytes(bytes, sel & 0x10 != 0, sel & 0x20 != 0);
    assert!(raw.iter().all(|&i| (i as usize) < n), "{raw:?}");
    // Protected as a whole, even control-token text stays text.
    let whole = tok.encode_protected(&text, false, std::slice::from_ref(&(0..text.len())));
    assert!(!whole.iter().any(|&i| is_control(tok, i)), "{whole:?}");
    // The bytes as ids (any, in range or not): detokenizing and streaming never panic, and a
    // stream of pieces is their bytes, lossily decoded.
    let any: Vec<u32> = bytes
        .chunks(2)
        .map(|c| u32::from(c[0]) + 256 * u32::from(c.len() % 2 == 0 && c[1] & 1 == 1))
        .collect();
    let _ = tok.detokenize(&any, sel & 1 != 0, sel & 2 != 0);
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
