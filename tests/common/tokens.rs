//! llama.cpp's tokenizer reference cases (`tokenize.json`: text, ids, pieces, detokenized text)
//! checked against our tokenizer, shared by each model's tokenizer test.

use edgellm::tokenizer::Tokenizer;
use serde_json::Value;

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every way `t` differs from llama.cpp on `cases`: ids without and with `add_special` (which
/// puts `bos` in front, when the vocabulary adds one), with `parse_special`, the pieces and
/// the detokenized text.
pub fn reference_mismatches(t: &Tokenizer, cases: &[Value], bos: Option<u32>) -> Vec<String> {
    let mut failures = Vec::new();
    for c in cases {
        let id = c["id"].as_str().unwrap();
        let text = c["text"].as_str().unwrap();
        let want = ids(&c["ids"]);
        let got = t.encode(text, false, false);
        if got != want {
            failures.push(format!("{id} ids: got {got:?}, want {want:?}"));
        }
        let with_special: Vec<u32> = bos.into_iter().chain(want.iter().copied()).collect();
        if t.encode(text, true, false) != with_special {
            failures.push(format!("{id} ids with add_special"));
        }
        let want_special = c.get("ids_parse_special").map_or(want.clone(), ids);
        let got_special = t.encode(text, false, true);
        if got_special != want_special {
            failures.push(format!(
                "{id} parse_special: got {got_special:?}, want {want_special:?}"
            ));
        }
        let pieces: Vec<String> = want.iter().map(|&i| hex(t.token_to_piece(i))).collect();
        let want_pieces: Vec<String> = c["pieces_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        if pieces != want_pieces {
            failures.push(format!("{id} pieces: got {pieces:?}, want {want_pieces:?}"));
        }
        let detok = t.decode(&want);
        if detok != c["detokenized"].as_str().unwrap().as_bytes() {
            failures.push(format!(
                "{id} detokenized: got {:?}",
                String::from_utf8_lossy(&detok)
            ));
        }
    }
    failures
}
