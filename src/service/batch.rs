//! Continuous batching: the worker decodes the answers of several requests in one forward step
//! ([`Engine::decode`]), which streams the weights once for all of them.
//!
//! A request joins the batch at the next step and leaves it when it ends (finished, cancelled,
//! past its deadline). Its prompt goes in a piece per step, between the decode steps of the
//! others, each piece sized to take a share of a step ([`Pace`]), so a long prompt does not
//! stall the answers already streaming. Every answer is a [`Generation`] advanced step by
//! step in a session of its own: a scratch session, or a named
//! session the store lends it ([`Lease`]) until the answer ends. The engine's batched step
//! gives each session the bits it gets alone: an answer has the same tokens whatever runs
//! beside it.
//!
//! A request in a named session that another answer of the batch holds, or for which the store
//! has no room in RAM while the batch holds the rest, waits until it can join. A request that
//! continues the single session file, or asks for a session's reset or history, is answered
//! alone once the batch has drained. No request is admitted past a waiting one, so the queue's
//! order and fairness hold.

use super::answer::{
    Ended, OpenSessions, Prepared, TextStream, Worker, cache_system_prompt, ms, named_report,
};
use super::pace::Pace;
use super::worker::Job;
use super::{Event, Prompt, Request, ServiceError, SessionReport};
use crate::engine::store::{Lease, PrefixReport, SessionStore};
use crate::engine::{Generation, MAX_BATCH, Session};
use crate::runtime::Profile;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Where an answer of the batch is decoded.
enum Place {
    /// A scratch session of the pool, by index.
    Scratch(usize),
    /// A named session, lent by the store until the answer ends.
    Named {
        lease: Lease,
        /// The system prompt cached for it, for the answer's report.
        system: Option<PrefixReport>,
    },
}

/// A session of either kind, as a batched step finds it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Key {
    Scratch(usize),
    Named(usize),
}

impl Place {
    fn key(&self) -> Key {
        match self {
            Place::Scratch(i) => Key::Scratch(*i),
            Place::Named { lease, .. } => Key::Named(lease.slot()),
        }
    }
}

/// One request in the batch.
struct Active {
    job: Job,
    place: Place,
    generation: Generation,
    prepared: Prepared,
    stream: TextStream,
    started: Instant,
    queue_ms: f64,
    gen_start: Instant,
    /// Tokens of `generation.pending()` already fed (a prompt goes in a piece per step).
    fed: usize,
}

/// The sessions a batch decodes in: the scratch pool and the store's lent sessions.
struct Places<'a> {
    pool: &'a mut [Session],
    store: Option<&'a mut SessionStore>,
}

impl<'a> Places<'a> {
    fn of(sessions: &'a mut OpenSessions) -> Places<'a> {
        match sessions {
            OpenSessions::Scratch(pool) => Places { pool, store: None },
            OpenSessions::Dir(store, pool) => Places {
                pool,
                store: Some(store),
            },
            OpenSessions::File(_) => Places {
                pool: &mut [],
                store: None,
            },
        }
    }

    fn get(&mut self, place: &Place) -> &mut Session {
        match (place, &mut self.store) {
            (Place::Scratch(i), _) => &mut self.pool[*i],
            (Place::Named { lease, .. }, Some(store)) => store.session(lease),
            // A lease comes only from a store.
            (Place::Named { .. }, None) => unreachable!("a named session without a store"),
        }
    }

    /// Every session, scratch then lent, with its key.
    fn all(&mut self) -> impl Iterator<Item = (Key, &mut Session)> {
        let named = self
            .store
            .iter_mut()
            .flat_map(|st| st.leased_sessions().map(|(i, s)| (Key::Named(i), s)));
        self.pool
            .iter_mut()
            .enumerate()
            .map(|(i, s)| (Key::Scratch(i), s))
            .chain(named)
    }
}

impl Worker {
    /// The worker's loop when the engine decodes several sessions at once.
    pub(super) fn run_batched(&mut self) {
        let max = self.engine.config().max_batch;
        let mut active: Vec<Active> = Vec::with_capacity(max);
        let mut held: Option<Job> = None;
        let mut pace = Pace::default();
        loop {
            if let Some(job) = held.take() {
                if self.joins_now(&job.req) {
                    self.admit(job, &mut active, &mut held);
                } else if active.is_empty() {
                    self.answer_alone(job);
                    continue;
                } else {
                    held = Some(job);
                }
            }
            if active.is_empty() && held.is_none() {
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
                self.step(&mut active, &mut pace);
            }
        }
        tracing::debug!("worker stopped");
    }

    /// Whether `req` can join a batch: a prompt answered in a scratch session, or in a named
    /// session of the state directory.
    fn batchable(&self, req: &Request) -> bool {
        !matches!(req.prompt, Prompt::Forget | Prompt::History)
            && matches!(
                (&self.sessions, &req.session),
                (OpenSessions::Dir(..), _) | (OpenSessions::Scratch(_), None)
            )
    }

    /// Whether `req` can join the batch now: batchable, and its named session (if any) is not
    /// held by an answer of the batch and has room in RAM.
    fn joins_now(&self, req: &Request) -> bool {
        self.batchable(req)
            && match (&self.sessions, &req.session) {
                (OpenSessions::Dir(store, _), Some(id)) => store.can_lease(id),
                _ => true,
            }
    }

    /// Starts `job` in the batch, or holds it until it can join or be answered alone, or
    /// refuses it.
    fn admit(&mut self, job: Job, active: &mut Vec<Active>, held: &mut Option<Job>) {
        if !self.joins_now(&job.req) {
            *held = Some(job);
            return;
        }
        match self.begin(&job, active) {
            Ok((place, generation, prepared, stream, (started, queue_ms))) => {
                active.push(Active {
                    job,
                    place,
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
    ) -> Result<(Place, Generation, Prepared, TextStream, (Instant, f64)), ServiceError> {
        let start = self.start(&job.req, &job.channel, job.submitted)?;
        let mut prepared = self.prepare(&job.req)?;
        let model = Arc::clone(self.engine.model());
        let n_ctx = self.engine.config().n_ctx;
        let place = match (&mut self.sessions, &job.req.session) {
            (OpenSessions::Dir(store, _), Some(id)) => {
                let system = cache_system_prompt(store, &mut self.engine, &prepared.built);
                let lease = store.lease(&mut self.engine, id, &prepared.built.ids)?;
                Place::Named { lease, system }
            }
            (sessions, _) => {
                let pool = Places::of(sessions).pool;
                // The free session that holds the longest prefix of this prompt: a prompt
                // that repeats a system prompt or a PLC's fixed preamble reuses its positions.
                let common = |s: &Session| {
                    s.tokens()
                        .iter()
                        .zip(&prepared.built.ids)
                        .take_while(|(a, b)| a == b)
                        .count()
                };
                let free = |i: &usize| active.iter().all(|a| a.place.key() != Key::Scratch(*i));
                let slot = (0..pool.len())
                    .filter(free)
                    .max_by_key(|&i| (common(&pool[i]), std::cmp::Reverse(i)))
                    .ok_or_else(|| {
                        ServiceError::new(super::ErrorCode::Internal, "no free scratch session")
                    })?;
                Place::Scratch(slot)
            }
        };
        let mut stream = TextStream::new(job.req.max_tokens.min(n_ctx));
        let shared = &self.shared;
        let mut places = Places::of(&mut self.sessions);
        let generation = Generation::begin(
            places.get(&place),
            &prepared.built.ids,
            &prepared.params,
            &mut prepared.sampler,
            &mut |t| stream.token(t, &model.tokenizer, &job.channel, job.req.deadline, shared),
        );
        match generation {
            Ok(generation) => Ok((place, generation, prepared, stream, start)),
            Err(e) => {
                self.give_back(place, false);
                Err(e.into())
            }
        }
    }

    /// Returns an ended answer's named session to the store (saved when the answer was given,
    /// as is when it failed), and says what the turn did. `None` for a scratch session.
    fn give_back(&mut self, place: Place, answered: bool) -> Option<SessionReport> {
        let (Place::Named { lease, system }, OpenSessions::Dir(store, _)) =
            (place, &mut self.sessions)
        else {
            return None;
        };
        if !answered {
            store.release(lease);
            return None;
        }
        let id = lease.id().clone();
        let turn = store.give_back(lease);
        Some(named_report(store, &id, turn, system))
    }

    /// One step: a piece of one prompt (the oldest still being fed), then one token of every
    /// answer that is decoding, all in one forward pass; the answers that ended leave.
    fn step(&mut self, active: &mut Vec<Active>, pace: &mut Pace) {
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
            let mut places = Places::of(sessions);

            // A prompt cancelled or timed out while it is fed stops here: no token says so.
            for a in active.iter_mut() {
                if a.generation.pending().len() > 1
                    && let Some(why) = TextStream::should_stop(&a.job.channel, a.job.req.deadline)
                {
                    a.stream.stop(why);
                    a.generation.stop();
                }
            }

            // An answer decoding has one token to feed; while any does, a long prompt is paced.
            let decoding =
                |a: &Active| !a.generation.is_finished() && a.generation.pending().len() == 1;
            let streaming = active.iter().any(decoding);
            if let Some((i, a)) = active
                .iter_mut()
                .enumerate()
                .find(|(_, a)| !a.generation.is_finished() && a.generation.pending().len() > 1)
            {
                let pending = a.generation.pending();
                let n = if a.generation.feed_one_by_one() {
                    1
                } else {
                    // A prompt of one chunk goes whole: it delays the others' next token
                    // once, by a chunk's time. A longer one is paced.
                    pace.piece(chunk, streaming && pending.len() > chunk)
                };
                let end = (a.fed + n).min(pending.len());
                let s = places.get(&a.place);
                let t0 = Instant::now();
                match engine.feed(s, &pending[a.fed..end]) {
                    Ok(logits) => {
                        if end < pending.len() {
                            pace.fed(end - a.fed, t0.elapsed());
                        }
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
            let mut rows: heapless::Vec<usize, MAX_BATCH> = heapless::Vec::new();
            let mut tokens: heapless::Vec<u32, MAX_BATCH> = heapless::Vec::new();
            let mut batch: heapless::Vec<&mut Session, MAX_BATCH> = heapless::Vec::new();
            for (key, s) in places.all() {
                if let Some(i) = active
                    .iter()
                    .position(|a| a.place.key() == key && decoding(a))
                    && !failed.iter().any(|(f, _)| *f == i)
                {
                    // Within MAX_BATCH: the batch has at most `max_batch` answers.
                    let _ = rows.push(i);
                    let _ = tokens.push(active[i].generation.pending()[0]);
                    let _ = batch.push(s);
                }
            }
            if !rows.is_empty() {
                let n_vocab = model.hp.n_vocab;
                let t0 = Instant::now();
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
                                places.get(&a.place),
                                &mut a.prepared.sampler,
                                &is_eog,
                                &mut |t| stream.token(t, tok, ch, dl, shared),
                            );
                            if let Err(e) = res {
                                failed.push((i, e.into()));
                            }
                        }
                        pace.stepped(t0.elapsed());
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
            let report = self.give_back(a.place, err.is_none());
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
                        report,
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
