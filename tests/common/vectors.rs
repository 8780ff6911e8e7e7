//! Reading llama.cpp's reference vectors (`logits.json`, `greedy.json` and Gemma's): the
//! cases of a file, id lists, floats and `[id, logit]` pairs.

use serde_json::Value;

pub use super::tokens::ids;

/// The cases of a vectors file: never none, or every loop over them would pass unasked.
pub fn cases<'a>(data: &'a Value, file: &str) -> &'a [Value] {
    let cases = data["cases"].as_array().map_or(&[][..], |v| v.as_slice());
    assert!(!cases.is_empty(), "{file}: no cases");
    cases
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

/// `[[id, logit], …]`.
pub fn pairs(v: &Value) -> Vec<(u32, f32)> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_f64().unwrap() as f32))
        .collect()
}
