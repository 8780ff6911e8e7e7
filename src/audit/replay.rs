//! Replaying an entry: the same model (checked by its SHA-256), the same engine sizes and
//! sampling settings, the prompt ids the model saw, from an empty cache; the answer must hash
//! as the entry says, bit for bit. The thread count is the caller's: the engine's output does
//! not depend on it, and a replay on other threads shows that it does not.

use super::{AuditError, Entry, Kind, ids_sha256, sha256_hex};
use crate::engine::constraint::{Grammars, Limits, Shape};
use crate::engine::{Engine, EngineConfig, GenParams, Sampler};
use crate::model::Model;
use crate::tokenizer::StreamDecoder;
use serde::Serialize;
use std::sync::Arc;

/// What a replay gave.
#[derive(Debug, Serialize)]
pub struct Replayed {
    pub seq: u64,
    pub threads: usize,
    pub kernels: String,
    /// Tokens generated again.
    pub tokens: usize,
    pub answer_sha256: String,
    pub answer_ids_sha256: String,
    /// Both hashes are the entry's.
    pub matches: bool,
    /// The first generated token that differs, when one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<usize>,
}

/// What a replay needs of `e`, or why it cannot be replayed.
fn replayable(e: &Entry) -> Result<(&[u32], &[u32]), AuditError> {
    if e.kind != Kind::Answer {
        return Err(AuditError::Bad(format!(
            "entry {} is a refused request: there is no answer to replay",
            e.seq
        )));
    }
    match (&e.prompt_ids, &e.answer_ids) {
        (Some(p), Some(a)) => Ok((p, a)),
        _ => Err(AuditError::Bad(format!(
            "entry {} keeps only hashes (the daemon's audit.texts is off): its prompt ids are \
             not on record to replay",
            e.seq
        ))),
    }
}

/// Checks that `model` is the entry's model: the same file, by its SHA-256.
pub fn check_model(e: &Entry, model_sha256: &str) -> Result<(), AuditError> {
    if model_sha256 != e.model.sha256 {
        return Err(AuditError::Bad(format!(
            "entry {} was answered by model {} (sha256 {}); this model file's sha256 is {}",
            e.seq, e.model.name, e.model.sha256, model_sha256
        )));
    }
    Ok(())
}

/// Replays `e` with `model` on `threads` threads. `model` must be the entry's model (see
/// [`check_model`]).
pub fn replay(e: &Entry, model: Arc<Model>, threads: usize) -> Result<Replayed, AuditError> {
    let (prompt, answer) = replayable(e)?;
    if Some(ids_sha256(prompt)) != e.prompt_ids_sha256 {
        return Err(AuditError::Bad(format!(
            "entry {}: its prompt ids do not hash to its prompt_ids_sha256",
            e.seq
        )));
    }
    let cfg = EngineConfig {
        n_ctx: e.engine.ctx,
        chunk: e.engine.chunk,
        threads,
        kv_type: e.engine.kv_type,
        max_batch: 1,
    };
    let mut engine = Engine::new(Arc::clone(&model), cfg)
        .map_err(|err| AuditError::Bad(format!("entry {}: {err}", e.seq)))?;
    let tok = &model.tokenizer;
    let mut session = engine.new_session();
    let mut sampler = Sampler::new(e.sampling.clone(), model.hp.n_vocab);
    if let Some(f) = &e.format {
        let bad = |why: String| AuditError::Bad(format!("entry {}: its format: {why}", e.seq));
        let shape = Shape::from_json(f).map_err(bad)?;
        let grammars = Grammars::new(&model, Limits::default()).map_err(bad)?;
        let c = grammars
            .compile(&shape, answer.len())
            .map_err(|err| bad(err.to_string()))?;
        sampler.constrain(c);
    }
    // As many tokens as the answer had: a cancelled or timed-out answer stopped there.
    let params = GenParams {
        max_tokens: answer.len(),
        top_logits: 0,
    };
    let mut text = String::new();
    let mut stream = StreamDecoder::new();
    let out = engine
        .generate(
            &mut session,
            prompt,
            &params,
            &mut sampler,
            &|t| tok.is_eog(t),
            // The service's text: each piece but the end token's, as the worker joins them.
            &mut |t| {
                if !tok.is_eog(t) {
                    stream.push_into(tok.token_to_piece(t), &mut text);
                }
                true
            },
        )
        .map_err(|err| AuditError::Bad(format!("entry {}: {err}", e.seq)))?;
    text.push_str(&stream.finish());
    let answer_sha256 = sha256_hex(text.as_bytes());
    let answer_ids_sha256 = ids_sha256(&out.generated);
    let matches = Some(&answer_sha256) == e.answer_sha256.as_ref()
        && Some(&answer_ids_sha256) == e.answer_ids_sha256.as_ref();
    let first_difference = (out.generated != answer).then(|| {
        out.generated
            .iter()
            .zip(answer)
            .take_while(|(a, b)| a == b)
            .count()
    });
    Ok(Replayed {
        seq: e.seq,
        threads,
        kernels: engine.kernels().name().to_owned(),
        tokens: out.generated.len(),
        answer_sha256,
        answer_ids_sha256,
        matches,
        first_difference,
    })
}
