//! Continuous batching: the worker decodes the answers of several requests in one forward step
//! ([`Engine::decode`]), which streams the weights once for all of them.
//!
//! A request joins the batch at the next step and leaves it when it ends (finished, cancelled,
//! past its deadline). Its prompt goes in a chunk per step, between the decode steps of the
//! others, so a long prompt does not stall the answers already streaming. Every answer is a
//! [`Generation`] advanced step by step, in a scratch session of its own, and the engine's
//! batched step gives each session the bits it gets alone: an answer has the same tokens
//! whatever runs beside it.
//!
//! A request that continues a session (a named one, or the single session file) or asks for
//! a session's reset or history is answered alone: it waits until the batch has drained, and
//! no request is admitted past it, so the queue's order and fairness hold.

use super::answer::{Ended, OpenSessions, Prepared, TextStream, Worker, ms};
use super::worker::Job;
use super::{Event, Prompt, Request, ServiceError};
use crate::engine::{Generation, MAX_BATCH, Session};
use crate::runtime::Profile;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One request in the batch.
struct Active {
    job: Job,
    /// Its scratch session.
    slot: usize,
    generation: Generation,
    prepared: Prepared,
    stream: TextStream,
    started: Instant,
    queue_ms: f64,
    gen_start: Instant,
    /// Tokens of `generation.pending()` already fed (a prompt goes in a chunk per step).
    fed: usize,
}

impl Worker {
    /// The worker's loop when the engine decodes several sessions at once.
    pub(super) fn run_batched(&mut self) {
        let max = self.engine.config().max_batch;
        let mut active: Vec<Active> = Vec::with_capacity(max);
        let mut held: Option<Job> = None;
        loop {
            if active.is_empty() {
                if let Some(job) = held.take() {
                    self.answer_alone(job);
                    continue;
                }
                // Idle: asleep until a request comes.
                match self.next(true) {
                    Some(job) => self.admit(job, &mut active, &mut held),
                    None => break,
                }
            }
            while held.is_none() && active.len() < max {
                match self.next(false) {
                    Some(job) => self.admit(job, &mut active, &mut held),
                    None => break,
                }
            }
            if !active.is_empty() {
                self.step(&mut active);
            }
        }
        tracing::debug!("worker stopped");
    }

    /// Whether `req` can join a batch: a prompt answered in a scratch session.
    fn batchable(&self, req: &Request) -> bool {
        req.session.is_none()
            && !matches!(req.prompt, Prompt::Forget | Prompt::History)
            && matches!(
                self.sessions,
                OpenSessions::Scratch(_) | OpenSessions::Dir(..)
            )
    }

    /// Starts `job` in the batch, or holds it to be answered alone, or refuses it.
    fn admit(&mut self, job: Job, active: &mut Vec<Active>, held: &mut Option<Job>) {
        if !self.batchable(&job.req) {
            *held = Some(job);
            return;
        }
        match self.begin(&job, active) {
            Ok((slot, generation, prepared, stream, (started, queue_ms))) => {
                active.push(Active {
                    job,
                    slot,
                    generation,
                    prepared,
                    stream,
                    started,
                    queue_ms,
                    gen_start: Instant::now(),
                    fed: 0,
                });
            }
            Err(e) => self.conclude(&job.req, &job.channel, Event::Error(e)),
        }
    }

    #[allow(clippy::type_complexity)]
    fn begin(
        &mut self,
        job: &Job,
        active: &[Active],
    ) -> Result<(usize, Generation, Prepared, TextStream, (Instant, f64)), ServiceError> {
        let start = self.start(&job.req, &job.channel, job.submitted)?;
        let mut prepared = self.prepare(&job.req)?;
        let model = Arc::clone(self.engine.model());
        let n_ctx = self.engine.config().n_ctx;
        let pool = scratch(&mut self.sessions);
        // The free session that holds the longest prefix of this prompt: a prompt that
        // repeats a system prompt or a PLC's fixed preamble reuses its positions.
        let common = |s: &Session| {
            s.tokens()
                .iter()
                .zip(&prepared.built.ids)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let slot = (0..pool.len())
            .filter(|i| active.iter().all(|a| a.slot != *i))
            .max_by_key(|&i| (common(&pool[i]), std::cmp::Reverse(i)))
            .ok_or_else(|| {
                ServiceError::new(super::ErrorCode::Internal, "no free scratch session")
            })?;
        let mut stream = TextStream::new(job.req.max_tokens.min(n_ctx));
        let shared = &self.shared;
        let generation = Generation::begin(
            &mut pool[slot],
            &prepared.built.ids,
            &prepared.params,
            &mut prepared.sampler,
            &mut |t| stream.token(t, &model.tokenizer, &job.channel, job.req.deadline, shared),
        )?;
        Ok((slot, generation, prepared, stream, start))
    }

    /// One step: a chunk of one prompt (the oldest still being fed), then one token of every
    /// answer that is decoding, all in one forward pass; the answers that ended leave.
    fn step(&mut self, active: &mut Vec<Active>) {
        self.shared.progress();
        let chunk = self.engine.config().chunk;
        let model = Arc::clone(self.engine.model());
        let tok = &model.tokenizer;
        let is_eog = |t: u32| tok.is_eog(t);
        let mut prof = Profile::default();
        let mut failed: Vec<(usize, ServiceError)> = Vec::new();
        {
            let Worker {
                engine,
                sessions,
                shared,
                ..
            } = self;
            let pool = scratch(sessions);

            // A prompt cancelled or timed out while it is fed stops here: no token says so.
            for a in active.iter_mut() {
                if a.generation.pending().len() > 1
                    && let Some(why) = TextStream::should_stop(&a.job.channel, a.job.req.deadline)
                {
                    a.stream.stop(why);
                    a.generation.stop();
                }
            }

            if let Some((i, a)) = active
                .iter_mut()
                .enumerate()
                .find(|(_, a)| !a.generation.is_finished() && a.generation.pending().len() > 1)
            {
                let pending = a.generation.pending();
                // Pieces as `Engine::generate` cuts them (the chunk's multiples from the start),
                // so the prompt is computed as it is alone.
                let n = if a.generation.feed_one_by_one() {
                    1
                } else {
                    chunk
                };
                let end = (a.fed + n).min(pending.len());
                let s = &mut pool[a.slot];
                match engine.feed(s, &pending[a.fed..end]) {
                    Ok(logits) => {
                        a.fed = end;
                        if end == pending.len() {
                            a.fed = 0;
                            let (ch, dl) = (&a.job.channel, a.job.req.deadline);
                            let stream = &mut a.stream;
                            let r = a.generation.advance(
                                logits,
                                &mut prof,
                                s,
                                &mut a.prepared.sampler,
                                &is_eog,
                                &mut |t| stream.token(t, tok, ch, dl, shared),
                            );
                            if let Err(e) = r {
                                failed.push((i, e.into()));
                            }
                        }
                    }
                    Err(e) => failed.push((i, e.into())),
                }
            }

            // Every answer with one token to feed: one forward pass for all of them.
            let decoding =
                |a: &Active| !a.generation.is_finished() && a.generation.pending().len() == 1;
            let mut rows: heapless::Vec<usize, MAX_BATCH> = heapless::Vec::new();
            let mut tokens: heapless::Vec<u32, MAX_BATCH> = heapless::Vec::new();
            let mut batch: heapless::Vec<&mut Session, MAX_BATCH> = heapless::Vec::new();
            for (slot, s) in pool.iter_mut().enumerate() {
                if let Some(i) = active.iter().position(|a| a.slot == slot && decoding(a))
                    && !failed.iter().any(|(f, _)| *f == i)
                {
                    // Within MAX_BATCH: the pool has `max_batch` sessions.
                    let _ = rows.push(i);
                    let _ = tokens.push(active[i].generation.pending()[0]);
                    let _ = batch.push(s);
                }
            }
            if !rows.is_empty() {
                let n_vocab = model.hp.n_vocab;
                match engine.decode(&mut batch, &tokens) {
                    Ok(logits) => {
                        drop(batch);
                        if rows.len() > 1 {
                            shared
                                .counters
                                .batched_steps
                                .fetch_add(1, Ordering::Relaxed);
                        }
                        for (r, &i) in rows.iter().enumerate() {
                            let a = &mut active[i];
                            let (ch, dl) = (&a.job.channel, a.job.req.deadline);
                            let stream = &mut a.stream;
                            let res = a.generation.advance(
                                &mut logits[r * n_vocab..(r + 1) * n_vocab],
                                &mut prof,
                                &pool[a.slot],
                                &mut a.prepared.sampler,
                                &is_eog,
                                &mut |t| stream.token(t, tok, ch, dl, shared),
                            );
                            if let Err(e) = res {
                                failed.push((i, e.into()));
                            }
                        }
                    }
                    Err(e) => {
                        let e: ServiceError = e.into();
                        failed.extend(rows.iter().map(|&i| (i, e.clone())));
                    }
                }
            }
        }

        // The answers that ended leave, in order (the oldest prompt is fed first).
        let mut i = 0;
        let mut index = 0;
        while i < active.len() {
            let err = failed
                .iter()
                .position(|(f, _)| *f == index)
                .map(|k| failed.swap_remove(k).1);
            index += 1;
            if err.is_none() && !active[i].generation.is_finished() {
                i += 1;
                continue;
            }
            let a = active.remove(i);
            let req = &a.job.req;
            let ev = match err {
                Some(e) => Event::Error(e),
                None => {
                    let out = a.generation.finish(&a.prepared.sampler);
                    let (text, stop) = a.stream.end(&a.job.channel, req.deadline, &self.shared);
                    let Prepared {
                        built, turn, shape, ..
                    } = a.prepared;
                    let ended = Ended {
                        built,
                        turn,
                        shape,
                        out,
                        report: None,
                        text,
                        stop,
                        before_gen_ms: ms(a.started, a.gen_start),
                    };
                    let mut done = self.finalize(req, ended);
                    done.timings.queue_ms = a.queue_ms;
                    Event::Done(Box::new(done))
                }
            };
            self.conclude(req, &a.job.channel, ev);
        }
    }
}

/// The scratch sessions (only asked for when requests are batchable).
fn scratch(sessions: &mut OpenSessions) -> &mut [Session] {
    match sessions {
        OpenSessions::Scratch(pool) | OpenSessions::Dir(_, pool) => pool,
        OpenSessions::File(_) => &mut [],
    }
}
