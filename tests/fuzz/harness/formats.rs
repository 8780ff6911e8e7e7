//! Answer formats from untrusted requests: any bytes as a JSON schema, a regular expression, a
//! Lark grammar or a choice list, compiled against a small vocabulary of printable ASCII and
//! walked a few tokens. A refusal is the expected answer to most inputs; a panic, a hang or a
//! huge allocation is a bug.

use edgellm::engine::constraint::{Grammars, Limits, Shape};
use edgellm::gguf::{Array, Gguf, GgufWriter};
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model_bytes};
use std::sync::Arc;

/// A synthetic model whose tokens 3..97 are the printable ASCII characters and 97..99 a space
/// and a newline: every format a request could ask for is spellable.
fn model() -> Arc<Model> {
    let spec = SynthSpec::default();
    let g = Gguf::from_bytes("synth.gguf", synth_model_bytes(&spec)).unwrap();
    let mut w = GgufWriter::new();
    w.set_all(g.metadata());
    let tokens: Vec<String> = (0..spec.n_vocab)
        .map(|i| match i {
            0..3 => ["<|endoftext|>", "<|im_start|>", "<|im_end|>"][i].to_string(),
            3..97 => char::from(b'!' + (i - 3) as u8).to_string(),
            97 => "\u{120}".to_string(),
            98 => "\u{10A}".to_string(),
            _ => format!("x{i}"),
        })
        .collect();
    w.set_array("tokenizer.ggml.tokens", Array::String(tokens));
    for t in g.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, g.tensor_data(t).to_vec())
            .unwrap();
    }
    let g = Gguf::from_bytes("ascii.gguf", w.to_bytes().unwrap()).unwrap();
    Arc::new(Model::from_gguf(g).unwrap())
}

thread_local! {
    // The grammar tables keep compiled formats in a cell: one set per thread.
    static GRAMMARS: Grammars = Grammars::new(&model(), Limits::default()).unwrap();
}

/// The first byte picks the kind; the rest is the format's text.
pub fn answer_format(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest).into_owned();
    let shape = match kind % 5 {
        0 => match serde_json::from_str(&text) {
            Ok(v) => Shape::JsonSchema(v),
            Err(_) => return,
        },
        1 => Shape::Regex(text),
        2 => Shape::Lark(text),
        3 => Shape::Choice(text.split('|').map(str::to_owned).collect()),
        _ => Shape::JsonObject,
    };
    GRAMMARS.with(|g| {
        let Ok(mut c) = g.compile(&shape, 16) else {
            return;
        };
        // Walk it: the first allowed token each step, until it ends or refuses.
        for _ in 0..8 {
            if c.is_complete() {
                break;
            }
            let Ok(mask) = c.mask() else { break };
            let Some(t) = (3..99u32).find(|&t| mask[t as usize]) else {
                break;
            };
            assert!(
                c.would_take(t).unwrap_or(true),
                "the mask allows {t}, the check not"
            );
            if c.advance(t).is_err() {
                break;
            }
        }
    });
}
