//! The generate loop: reuse the session's cached prefix, process the rest of the prompt in
//! chunks, then sample and decode one token at a time.

use super::{Engine, EngineError, Sampler, Session};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenParams {
    /// Most tokens to generate (the end-of-generation token included).
    pub max_tokens: usize,
    /// Also return the `top_logits` best `(id, logit)` after the prompt.
    pub top_logits: usize,
}

/// Why an answer ended: the one vocabulary of the engine, the service and every front end
/// (MQTT's `finish_reason`, the serial `END`, the audit trail), so nothing maps it by hand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its answer (an end-of-generation token, the last generated id).
    Eog,
    /// The request's `max_tokens` was reached.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller stopped it: cancelled, or nobody listens any more. The generate loop says
    /// this whenever its `on_token` callback returns `false`.
    Cancelled,
    /// The request's deadline passed. The generate loop never says it (it knows no deadline):
    /// the service, whose callback stopped the loop for that reason, does.
    Timeout,
}

impl FinishReason {
    /// Its name as the serial line, the console and the audit trail show it (serde's too).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eog => "eog",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context_full",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Timeout => "timeout",
        }
    }
}

/// Timings of one request, in milliseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timings {
    /// Prompt tokens taken from the session's cache instead of being computed.
    pub restored_tokens: usize,
    /// Prompt tokens computed.
    pub prompt_tokens: usize,
    pub prompt_ms: f64,
    /// From the call to the first generated token.
    pub ttft_ms: f64,
    pub decode_ms: f64,
    /// Generated tokens per second after the first.
    pub decode_tps: f64,
}

/// The result of [`Engine::generate`].
#[derive(Clone, Debug)]
pub struct GenOutput {
    pub generated: Vec<u32>,
    pub finish: FinishReason,
    /// Under a constraint: whether the answer has the asked-for shape (it ended where the
    /// grammar may end, not at `max_tokens`, the context's end or a cancel).
    pub valid: Option<bool>,
    /// Under a constraint: what it cost.
    pub constraint: Option<super::constraint::ConstraintStats>,
    pub top_logits: Vec<(u32, f32)>,
    pub timings: Timings,
}

/// The `k` best `(id, logit)`, by logit descending, ties to the lower id.
pub fn top_k_logits(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    let k = k.min(v.len());
    let cmp = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k > 0 && k < v.len() {
        v.select_nth_unstable_by(k - 1, cmp);
    }
    v.truncate(k);
    v.sort_by(cmp);
    v
}

impl Engine {
    /// Generates after `prompt`. Tokens the session already holds as a prefix of `prompt` are
    /// reused (at least the last prompt token is recomputed, to get its logits), unless the
    /// sliding-window rings no longer hold that prefix's window ([`Session::truncate`]). `on_token`
    /// sees each generated id and returns `false` to stop. The decode loop allocates nothing.
    pub fn generate(
        &mut self,
        s: &mut Session,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenOutput, EngineError> {
        let start = Instant::now();
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() > s.kv.n_ctx() {
            return Err(EngineError::ContextFull {
                needed: prompt.len(),
                n_ctx: s.kv.n_ctx(),
            });
        }
        let common = s
            .tokens()
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let reuse = s.truncate(common.min(prompt.len() - 1));
        let mut generated = Vec::with_capacity(params.max_tokens.min(s.kv.n_ctx()));
        let mut timings = Timings {
            restored_tokens: reuse,
            prompt_tokens: prompt.len() - reuse,
            ..Default::default()
        };

        // What a constraint forces before the model has said anything (`{"severity": ` of a
        // schema's first key) goes in with the prompt: answer tokens, but no step each.
        let mut finish = FinishReason::Length;
        let mut decode_start = None;
        let mut fed: Vec<u32> = Vec::new();
        let mut complete = false;
        if let Some(c) = sampler.constraint_mut() {
            let room = params
                .max_tokens
                .min(s.kv.n_ctx().saturating_sub(prompt.len() + 1));
            let forced = c.forced(room).map_err(EngineError::Constraint)?;
            complete = c.is_complete();
            if !forced.is_empty() {
                for &f in &forced {
                    generated.push(f);
                    if !on_token(f) {
                        finish = FinishReason::Cancelled;
                        complete = true;
                        break;
                    }
                }
                fed = [&prompt[reuse..], &forced[..]].concat();
            }
        }
        let logits = if fed.is_empty() {
            self.feed(s, &prompt[reuse..])?
        } else {
            self.feed(s, &fed)?
        };
        timings.prompt_ms = ms(start);
        // Tokens out before the first sampled one (forced with the prompt): not decode steps.
        let before_decode = generated.len() + 1;
        if !generated.is_empty() {
            timings.ttft_ms = timings.prompt_ms;
        }
        let top_logits = if params.top_logits > 0 {
            top_k_logits(logits, params.top_logits)
        } else {
            Vec::new()
        };
        if complete && finish != FinishReason::Cancelled {
            finish = FinishReason::Eog;
        }

        // The token sampled last and the tokens a constraint forced after it: one chunk.
        let mut chunk: Vec<u32> = Vec::with_capacity(if sampler.constraint().is_some() {
            params.max_tokens.min(s.kv.n_ctx())
        } else {
            1
        });
        'decode: while !complete && generated.len() < params.max_tokens {
            let t0 = self.arena.prof.start();
            let logits = &mut self.arena.logits;
            let tok = sampler
                .next(logits, s.tokens())
                .map_err(EngineError::Constraint)?;
            if let Some(t0) = t0 {
                let ns = t0.elapsed().as_nanos() as u64;
                self.arena.prof.record_outside(super::Op::Sample, ns);
            }
            generated.push(tok);
            if decode_start.is_none() {
                if generated.len() == 1 {
                    timings.ttft_ms = ms(start);
                }
                decode_start = Some(Instant::now());
            }
            let go_on = on_token(tok);
            if is_eog(tok) {
                finish = FinishReason::Eog;
                break;
            }
            if !go_on {
                finish = FinishReason::Cancelled;
                break;
            }
            chunk.clear();
            chunk.push(tok);
            if let Some(c) = sampler.constraint_mut() {
                if c.is_complete() {
                    // The grammar can take nothing more: the answer is whole.
                    finish = FinishReason::Eog;
                    break;
                }
                let room = (params.max_tokens - generated.len())
                    .min(s.kv.n_ctx().saturating_sub(s.tokens().len() + 1));
                let forced = c.forced(room).map_err(EngineError::Constraint)?;
                let one_by_one = !c.forced_in_chunks;
                for f in forced {
                    generated.push(f);
                    if !on_token(f) {
                        finish = FinishReason::Cancelled;
                        break 'decode;
                    }
                    if one_by_one {
                        self.feed(s, &chunk)?;
                        chunk.clear();
                    }
                    chunk.push(f);
                }
                if sampler.constraint().is_some_and(|c| c.is_complete()) {
                    finish = FinishReason::Eog;
                    break;
                }
            }
            if generated.len() >= params.max_tokens {
                break;
            }
            if s.tokens().len() + chunk.len() > s.kv.n_ctx() {
                finish = FinishReason::ContextFull;
                break;
            }
            self.feed(s, &chunk)?;
        }
        if let Some(t0) = decode_start {
            timings.decode_ms = ms(t0);
            let n = generated.len().saturating_sub(before_decode);
            if n > 0 && timings.decode_ms > 0.0 {
                timings.decode_tps = n as f64 / (timings.decode_ms / 1000.0);
            }
        }
        let constraint = sampler.constraint().map(|c| c.stats());
        Ok(GenOutput {
            generated,
            finish,
            // Only an answer the grammar saw through to an end: never one cut short.
            valid: constraint.as_ref().map(|_| finish == FinishReason::Eog),
            constraint,
            top_logits,
            timings,
        })
    }
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::FinishReason;

    #[test]
    fn a_finish_reason_has_one_name_on_every_front_end_and_in_json() {
        use FinishReason::*;
        for r in [Eog, Length, ContextFull, Cancelled, Timeout] {
            let json = serde_json::to_string(&r).unwrap();
            assert_eq!(json, format!("\"{}\"", r.as_str()));
            assert_eq!(serde_json::from_str::<FinishReason>(&json).unwrap(), r);
        }
    }
}
