//! The schema corpus: 70 JSON Schemas of plants and medical devices (alarms, tickets, sensor
//! readings with ranges and units, enums, nested objects, bounded arrays, optional fields,
//! patterns and formats, anyOf/oneOf/allOf and `$ref`), each answered greedily and with three
//! seeds on SmolLM2 and Qwen2.5-Coder 0.5B. Every answer the engine marks valid must validate
//! with Python's jsonschema (tests/validate_answers.py), which shares nothing with the grammar
//! engine.

mod common;

use edgellm::engine::constraint::{Grammars, Limits, Shape};
use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::kv::KvType;
use edgellm::model::{LoadOptions, Model};
use edgellm::tokenizer::ChatMessage;
use std::io::Write;
use std::sync::Arc;

const MAX_TOKENS: usize = 128;

#[test]
fn every_answer_marked_valid_validates_with_an_independent_validator() {
    let corpus_path = common::data_path("format_schemas.json");
    let corpus = common::read_json("format_schemas.json");
    let corpus = corpus.as_array().unwrap();
    assert!(corpus.len() >= 60, "{} schemas", corpus.len());
    let dir = tempfile::tempdir().unwrap();
    let answers_path = dir.path().join("answers.jsonl");
    let mut answers = std::fs::File::create(&answers_path).unwrap();
    let (mut total, mut valid) = (0, 0);
    for name in ["q4_0", "qwen2.5-0.5b"] {
        let model =
            Arc::new(Model::load(&common::model_path(name), &LoadOptions::default()).unwrap());
        let tok = &model.tokenizer;
        let template = model.chat_template().unwrap();
        let g = Grammars::new(&model, Limits::default()).unwrap();
        let cfg = EngineConfig {
            n_ctx: 512,
            chunk: 64,
            threads: 2,
            kv_type: KvType::F16,
            max_batch: 1,
        };
        let mut e = Engine::new(Arc::clone(&model), cfg).unwrap();
        let mut model_valid = 0;
        for case in corpus {
            let schema_name = case["name"].as_str().unwrap();
            let question = format!(
                "{} Answer with JSON only.",
                case["prompt"].as_str().unwrap()
            );
            let r = template
                .render_protected(None, &[ChatMessage::new("user", question)], true)
                .unwrap();
            let prompt = tok.encode_protected(&r.text, true, &r.ranges());
            let shape = Shape::JsonSchema(case["schema"].clone());
            // One session for the four answers: each reuses the prompt the one before left in
            // the cache (prefix reuse), so the prompt is processed once, not four times.
            let mut s = e.new_session();
            for seed in [None, Some(1u64), Some(2), Some(3)] {
                let sampling = match seed {
                    None => SamplingParams::default(),
                    Some(seed) => SamplingParams {
                        temperature: 0.7,
                        seed,
                        ..Default::default()
                    },
                };
                let mut sampler = Sampler::new(sampling, model.hp.n_vocab);
                let c = g
                    .compile(&shape, MAX_TOKENS)
                    .unwrap_or_else(|err| panic!("{schema_name}: {err}"));
                sampler.constrain(c);
                let params = GenParams {
                    max_tokens: MAX_TOKENS,
                    top_logits: 0,
                };
                let out = e
                    .generate(
                        &mut s,
                        &prompt,
                        &params,
                        &mut sampler,
                        &|t| tok.is_eog(t),
                        &mut |_| true,
                    )
                    .unwrap();
                if seed.is_some() {
                    assert_eq!(
                        out.timings.restored_tokens,
                        prompt.len() - 1,
                        "{schema_name}"
                    );
                }
                let bytes: Vec<u8> = out
                    .generated
                    .iter()
                    .filter(|t| !tok.is_eog(**t))
                    .flat_map(|&t| tok.token_to_piece(t).to_vec())
                    .collect();
                let text = String::from_utf8_lossy(&bytes);
                let is_valid = out.valid == Some(true);
                total += 1;
                valid += usize::from(is_valid);
                model_valid += usize::from(is_valid);
                let line = serde_json::json!({
                    "name": schema_name, "model": name, "seed": seed,
                    "valid": is_valid, "text": text,
                });
                writeln!(answers, "{line}").unwrap();
            }
        }
        eprintln!(
            "{name}: {model_valid} of {} answers valid",
            corpus.len() * 4
        );
    }
    drop(answers);
    let out = std::process::Command::new("/usr/bin/python3")
        .arg(common::repo_root().join("tests/validate_answers.py"))
        .arg(&corpus_path)
        .arg(&answers_path)
        .output()
        .expect("run /usr/bin/python3 (scripts/setup.sh installs python3-jsonschema)");
    let report = String::from_utf8_lossy(&out.stdout);
    eprintln!("{report}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "an answer marked valid does not validate:\n{report}"
    );
    // The corpus is answerable: most answers end inside MAX_TOKENS, so the check above is
    // about many answers, not a few.
    assert!(
        valid * 10 >= total * 7,
        "only {valid} of {total} answers are valid: the check covers too few"
    );
    assert!(
        report.contains(&format!("{valid} answers marked valid, {valid} validate")),
        "{report}"
    );
}
