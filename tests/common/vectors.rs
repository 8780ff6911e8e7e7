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

/// Greedy generation of up to `n` tokens after `prompt` (a new session), stopping after a
/// token `is_eog` accepts; returns the ids and each step's top-1 margin (the runner-up's
/// distance, where another implementation may legitimately branch).
pub fn greedy(
    e: &mut edgellm::engine::Engine,
    prompt: &[u32],
    n: usize,
    is_eog: impl Fn(u32) -> bool,
) -> (Vec<u32>, Vec<f32>) {
    let mut s = e.new_session();
    let mut logits = e.feed(&mut s, prompt).unwrap().to_vec();
    let (mut out, mut margins) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let top = edgellm::engine::top_k_logits(&logits, 2);
        out.push(top[0].0);
        margins.push(top[0].1 - top[1].1);
        if is_eog(top[0].0) {
            break;
        }
        logits = e.feed(&mut s, &[top[0].0]).unwrap().to_vec();
    }
    (out, margins)
}

/// One case of a `logits.json`: the logits of llama.cpp's top-10 tokens for `quant` are within
/// the tolerance of its default or precise path (`tol = max(1.25 · its own spread, floor)`), and
/// our top-1 is theirs unless theirs is a near-tie (margin < tol). Returns whether our top-1 is
/// one of theirs and the largest difference.
pub fn check_top_logits(case: &Value, quant: &str, logits: &[f32], floor: f32) -> (bool, f32) {
    let id = &case["id"];
    let default = pairs(&case["top10"][quant]);
    let precise = pairs(&case["top10_kv_f32_fa_off"][quant]);
    let spread = case["max_abs_logit_diff_default_vs_kv_f32_fa_off"][quant]
        .as_f64()
        .unwrap() as f32;
    let tol = (1.25 * spread).max(floor);
    assert!(default.len() >= 2, "{quant} {id}: no top-10");
    let mut worst = 0.0f32;
    for (tok, want) in &default {
        let alt = precise.iter().find(|p| p.0 == *tok).map_or(*want, |p| p.1);
        let got = logits[*tok as usize];
        let err = (got - want).abs().min((got - alt).abs());
        worst = worst.max(err);
        assert!(
            err <= tol,
            "{quant} {id}: logit of {tok} is {got}, llama.cpp {want} / {alt} (tol {tol})"
        );
    }
    let ours = edgellm::engine::top_k_logits(logits, 1)[0].0;
    let theirs = ours == default[0].0 || ours == precise[0].0;
    let margin = default[0].1 - default[1].1;
    assert!(
        theirs || margin < tol,
        "{quant} {id}: top-1 {ours}, llama.cpp {} by a margin of {margin}",
        default[0].0
    );
    (theirs, worst)
}

/// Greedy runs of this architecture (`all`: `{"id", "ids", "margins"}` per case) against the
/// other architecture's file at `path`: the same cases in the same order, and identical ids up
/// to the first step the other run saw as a near-exact tie (margin < 1e-3; the two
/// architectures' kernels may round differently). Returns the largest difference of a step's
/// margin between the two, for the log.
pub fn compare_with_other_architecture(all: &[Value], path: &std::ffi::OsStr) -> f32 {
    let shown = path.to_string_lossy();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{shown}: {e}"));
    let other: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{shown}: {e}"));
    // The same cases, in the same order: an empty or shorter file compares nothing.
    let names = |v: &[Value]| v.iter().map(|c| c["id"].clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&other),
        names(all),
        "{shown}: the other architecture's cases"
    );
    let mut gap = 0.0f32;
    for (mine, theirs) in all.iter().zip(&other) {
        let id = &mine["id"];
        let (a, b) = (ids(&mine["ids"]), ids(&theirs["ids"]));
        let m = floats(&theirs["margins"]);
        assert!(!b.is_empty(), "{id}: no ids from the other architecture");
        assert_eq!(m.len(), b.len(), "{id}: a margin per id");
        let upto = m
            .iter()
            .position(|&x| x < 1e-3)
            .map_or(a.len().max(b.len()), |i| i + 1);
        assert_eq!(
            a[..upto.min(a.len())],
            b[..upto.min(b.len())],
            "{id} on {} vs the other architecture",
            std::env::consts::ARCH
        );
        for (x, y) in floats(&mine["margins"]).into_iter().zip(m) {
            gap = gap.max((x - y).abs());
        }
    }
    gap
}
