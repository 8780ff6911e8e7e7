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
    ///
    /// The loop is [`Generation`]'s steps, run to the end on this session alone.
    pub fn generate(
        &mut self,
        s: &mut Session,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenOutput, EngineError> {
        let mut g = Generation::begin(s, prompt, params, sampler, on_token)?;
        while !g.is_finished() {
            if g.feed_one_by_one() {
                for &t in g.pending() {
                    self.feed(s, &[t])?;
                }
            } else {
                self.feed(s, g.pending())?;
            }
            let (logits, prof) = (&mut self.arena.logits, &mut self.arena.prof);
            g.advance(logits, prof, s, sampler, is_eog, on_token)?;
        }
        Ok(g.finish(sampler))
    }
}

/// One answer being generated, a step at a time: feed [`Generation::pending`] to the session,
/// then [`Generation::advance`] with the logits after it, until [`Generation::is_finished`].
/// [`Engine::generate`] runs these steps for one session; a scheduler that decodes several
/// sessions in one forward pass ([`Engine::decode`]) advances each of its answers the same way,
/// so an answer has the same tokens whoever it is computed beside.
pub struct Generation {
    max_tokens: usize,
    top_k: usize,
    generated: Vec<u32>,
    /// What to feed before the next logits: the rest of the prompt (and what a constraint
    /// forces before the model says anything), then the token sampled last and the tokens a
    /// constraint forced after it. Empty once finished.
    pending: Vec<u32>,
    /// Feed `pending` a token at a time (a constraint asked for it) rather than as a chunk.
    one_by_one: bool,
    finish: FinishReason,
    /// No more steps: `finish` says why.
    finished: bool,
    /// A constraint is complete before the prompt is even fed.
    complete_at_start: bool,
    /// The logits after the prompt have been seen.
    prompt_done: bool,
    start: Instant,
    decode_start: Option<Instant>,
    /// Tokens out before the first sampled one (forced with the prompt), plus one.
    before_decode: usize,
    top_logits: Vec<(u32, f32)>,
    timings: Timings,
}

impl Generation {
    /// Checks the prompt, rewinds the session to the prefix it shares with `prompt`, and takes
    /// what a constraint forces before the model has said anything (`{"severity": ` of a
    /// schema's first key: answer tokens, but no step each): they go in with the prompt.
    pub fn begin(
        s: &mut Session,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
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
        let mut g = Generation {
            max_tokens: params.max_tokens,
            top_k: params.top_logits,
            generated: Vec::with_capacity(params.max_tokens.min(s.kv.n_ctx())),
            // The prompt's rest now; later the sampled token and what a constraint forces.
            pending: Vec::with_capacity(if sampler.constraint().is_some() {
                s.kv.n_ctx()
            } else {
                prompt.len() - reuse
            }),
            one_by_one: false,
            finish: FinishReason::Length,
            finished: false,
            complete_at_start: false,
            prompt_done: false,
            start,
            decode_start: None,
            before_decode: 1,
            top_logits: Vec::new(),
            timings: Timings {
                restored_tokens: reuse,
                prompt_tokens: prompt.len() - reuse,
                ..Default::default()
            },
        };
        g.pending.extend_from_slice(&prompt[reuse..]);
        if let Some(c) = sampler.constraint_mut() {
            let room = params
                .max_tokens
                .min(s.kv.n_ctx().saturating_sub(prompt.len() + 1));
            let forced = c.forced(room).map_err(EngineError::Constraint)?;
            g.complete_at_start = c.is_complete();
            for &f in &forced {
                g.generated.push(f);
                if !on_token(f) {
                    g.finish = FinishReason::Cancelled;
                    g.complete_at_start = true;
                    break;
                }
            }
            g.pending.extend_from_slice(&forced);
        }
        Ok(g)
    }

    /// The tokens to feed to the session before the next [`Generation::advance`].
    pub fn pending(&self) -> &[u32] {
        &self.pending
    }

    /// Whether [`Generation::pending`] goes in a token at a time rather than as one chunk.
    pub fn feed_one_by_one(&self) -> bool {
        self.one_by_one
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Takes the step after `pending` was fed: `logits` are those after its last token,
    /// `s` the session holding it. Samples the next token (and takes what a constraint forces
    /// after it), or ends the answer. `prof` gets the sampling time when it is on.
    pub fn advance(
        &mut self,
        logits: &mut [f32],
        prof: &mut crate::runtime::Profile,
        s: &Session,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(), EngineError> {
        debug_assert!(!self.finished, "a finished answer takes no step");
        self.pending.clear();
        if !self.prompt_done {
            self.prompt_done = true;
            self.timings.prompt_ms = ms(self.start);
            self.before_decode = self.generated.len() + 1;
            if !self.generated.is_empty() {
                self.timings.ttft_ms = self.timings.prompt_ms;
            }
            if self.top_k > 0 {
                self.top_logits = top_k_logits(logits, self.top_k);
            }
            if self.complete_at_start {
                if self.finish != FinishReason::Cancelled {
                    self.finish = FinishReason::Eog;
                }
                return Ok(self.end());
            }
        }
        if self.generated.len() >= self.max_tokens {
            return Ok(self.end());
        }
        let t0 = prof.start();
        let tok = sampler
            .next(logits, s.tokens())
            .map_err(EngineError::Constraint)?;
        if let Some(t0) = t0 {
            prof.record_outside(super::Op::Sample, t0.elapsed().as_nanos() as u64);
        }
        self.generated.push(tok);
        if self.decode_start.is_none() {
            if self.generated.len() == 1 {
                self.timings.ttft_ms = ms(self.start);
            }
            self.decode_start = Some(Instant::now());
        }
        let go_on = on_token(tok);
        if is_eog(tok) {
            self.finish = FinishReason::Eog;
            return Ok(self.end());
        }
        if !go_on {
            self.finish = FinishReason::Cancelled;
            return Ok(self.end());
        }
        self.pending.push(tok);
        if let Some(c) = sampler.constraint_mut() {
            if c.is_complete() {
                // The grammar can take nothing more: the answer is whole.
                self.finish = FinishReason::Eog;
                return Ok(self.end());
            }
            let room = (self.max_tokens - self.generated.len())
                .min(s.kv.n_ctx().saturating_sub(s.tokens().len() + 1));
            let forced = c.forced(room).map_err(EngineError::Constraint)?;
            self.one_by_one = !c.forced_in_chunks;
            for f in forced {
                self.generated.push(f);
                if !on_token(f) {
                    self.finish = FinishReason::Cancelled;
                    return Ok(self.end());
                }
                self.pending.push(f);
            }
            if c.is_complete() {
                self.finish = FinishReason::Eog;
                return Ok(self.end());
            }
        }
        if self.generated.len() >= self.max_tokens {
            return Ok(self.end());
        }
        if s.tokens().len() + self.pending.len() > s.kv.n_ctx() {
            self.finish = FinishReason::ContextFull;
            return Ok(self.end());
        }
        Ok(())
    }

    fn end(&mut self) {
        self.pending.clear();
        self.finished = true;
    }

    /// Ends the answer between steps (its caller cancelled it while its prompt was being fed):
    /// it finishes `cancelled`, as when `on_token` says stop.
    pub fn stop(&mut self) {
        if !self.finished {
            self.finish = FinishReason::Cancelled;
            self.end();
        }
    }

    /// The answer, once finished (or as far as it went).
    pub fn finish(self, sampler: &Sampler) -> GenOutput {
        let mut timings = self.timings;
        if let Some(t0) = self.decode_start {
            timings.decode_ms = ms(t0);
            let n = self.generated.len().saturating_sub(self.before_decode);
            if n > 0 && timings.decode_ms > 0.0 {
                timings.decode_tps = n as f64 / (timings.decode_ms / 1000.0);
            }
        }
        let constraint = sampler.constraint().map(|c| c.stats());
        let finish = self.finish;
        GenOutput {
            generated: self.generated,
            finish,
            // Only an answer the grammar saw through to an end: never one cut short.
            valid: constraint.as_ref().map(|_| finish == FinishReason::Eog),
            constraint,
            top_logits: self.top_logits,
            timings,
        }
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
