//! Constrained decoding: an answer that has the shape a request asked for (a JSON Schema, a
//! regular expression, one of a few strings, a Lark grammar), or ends marked invalid.
//!
//! The grammar engine is llguidance (an Earley parser over derivative-based lexers, so no
//! regular expression backtracks). It sees the model's vocabulary as the bytes each token
//! stands for: control and user-defined tokens carry a marker byte no grammar matches, so a
//! constraint never produces one; the end-of-generation tokens are handled here, allowed
//! exactly when the grammar may end.
//!
//! Per step the cost stays small ([`Constraint::pick`]): the token is sampled unconstrained
//! first and only checked against the grammar; the full mask over the vocabulary is computed
//! only when that token is refused (lazy masking). A refusal then draws from the masked
//! logits, which is the constrained distribution itself. Bytes the grammar forces (`{"name": "`
//! after `{`) come back as tokens from [`Constraint::forced`], which the generate loop feeds
//! as one prompt chunk instead of one forward pass each.

use super::sampler::Sampler;
use crate::tokenizer::{TokenType, Tokenizer};
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;
use std::time::Instant;
use toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// The shape an answer must have.
#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// JSON valid under this schema (the keywords llguidance supports; others are refused by
    /// name).
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text that matches this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this Lark grammar (llguidance's dialect).
    Lark(String),
}

impl Shape {
    /// Its kind as requests name it (`json_schema`, `json_object`, `regex`, `choice`, `lark`).
    pub fn kind(&self) -> &'static str {
        match self {
            Shape::JsonSchema(_) => "json_schema",
            Shape::JsonObject => "json_object",
            Shape::Regex(_) => "regex",
            Shape::Choice(_) => "choice",
            Shape::Lark(_) => "lark",
        }
    }

    /// Whether a valid answer is JSON.
    pub fn is_json(&self) -> bool {
        matches!(self, Shape::JsonSchema(_) | Shape::JsonObject)
    }

    /// The shape as JSON: `{"type": "json_schema", "schema": …}`, `{"type": "regex",
    /// "pattern": …}`, `{"type": "choice", "options": […]}`, `{"type": "lark", "grammar": …}`
    /// or `{"type": "json_object"}` (MQTT's `response_format`, the audit trail's `format`).
    pub fn to_json(&self) -> Value {
        let (field, value) = match self {
            Shape::JsonSchema(v) => ("schema", v.clone()),
            Shape::JsonObject => return serde_json::json!({"type": self.kind()}),
            Shape::Regex(r) => ("pattern", Value::from(r.as_str())),
            Shape::Choice(o) => ("options", Value::from(o.clone())),
            Shape::Lark(g) => ("grammar", Value::from(g.as_str())),
        };
        serde_json::json!({"type": self.kind(), field: value})
    }

    /// The shape [`Self::to_json`] wrote.
    pub fn from_json(v: &Value) -> Result<Shape, String> {
        let text = |field: &str| {
            v[field]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("a {} format needs {field}", v["type"]))
        };
        match v["type"].as_str() {
            Some("json_schema") => Ok(Shape::JsonSchema(v["schema"].clone())),
            Some("json_object") => Ok(Shape::JsonObject),
            Some("regex") => text("pattern").map(Shape::Regex),
            Some("lark") => text("grammar").map(Shape::Lark),
            Some("choice") => serde_json::from_value(v["options"].clone())
                .map(Shape::Choice)
                .map_err(|e| format!("choice options: {e}")),
            _ => Err(format!("not a format: {v}")),
        }
    }

    /// Checks the bounds that do not need the grammar engine: size and nesting.
    pub fn check(&self, limits: &Limits) -> Result<(), ConstraintError> {
        let bytes = match self {
            Shape::JsonSchema(v) => serde_json::to_string(v).map_or(usize::MAX, |s| s.len()),
            Shape::JsonObject => 0,
            Shape::Regex(r) => r.len(),
            Shape::Choice(o) => o.iter().map(|s| s.len() + 1).sum(),
            Shape::Lark(g) => g.len(),
        };
        if bytes > limits.max_bytes {
            return Err(ConstraintError::TooLarge(format!(
                "the {} has {bytes} bytes; at most {} are allowed",
                self.kind(),
                limits.max_bytes
            )));
        }
        if let Shape::Choice(o) = self {
            if o.is_empty() {
                return Err(ConstraintError::Invalid(
                    "a choice needs at least one option".into(),
                ));
            }
            if let Some(i) = o.iter().position(|s| s.is_empty()) {
                return Err(ConstraintError::Invalid(format!(
                    "choice option {} is empty",
                    i + 1
                )));
            }
        }
        if let Shape::JsonSchema(v) = self {
            let depth = depth(v);
            if depth > limits.max_depth {
                return Err(ConstraintError::TooLarge(format!(
                    "the JSON schema nests {depth} deep; at most {} levels are allowed",
                    limits.max_depth
                )));
            }
        }
        Ok(())
    }

    /// What tells two shapes apart (the kept compiled formats are found by it).
    fn key(&self) -> String {
        let body = match self {
            Shape::JsonSchema(v) => v.to_string(),
            Shape::JsonObject => String::new(),
            Shape::Regex(r) => r.clone(),
            Shape::Choice(o) => serde_json::to_string(o).unwrap_or_default(),
            Shape::Lark(g) => g.clone(),
        };
        format!("{}\0{body}", self.kind())
    }

    fn grammar(&self) -> TopLevelGrammar {
        match self {
            Shape::JsonSchema(v) => TopLevelGrammar::from_json_schema(with_layout(v.clone())),
            Shape::JsonObject => TopLevelGrammar::from_json_schema(with_layout(
                serde_json::json!({"type": "object"}),
            )),
            Shape::Regex(r) => TopLevelGrammar::from_regex(r),
            Shape::Choice(o) => {
                let alternatives: Vec<String> = o.iter().map(|s| regex_syntax::escape(s)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            Shape::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        }
    }
}

/// JSON laid out as `json.dumps` writes it (`{"a": 1, "b": 2}`), with no free whitespace: a
/// small model given the choice pads with newlines until `max_tokens` runs out. A schema that
/// sets its own layout (`x-guidance`) keeps it.
fn with_layout(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema
        && !m.contains_key("x-guidance")
    {
        m.insert(
            "x-guidance".into(),
            serde_json::json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

/// Nesting depth of a JSON value (a scalar is 1), without recursion.
fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// What one constraint may cost: checked before compiling, and given to the grammar engine as
/// its fuel and state bounds, so a hostile schema is refused instead of running the appliance
/// out of time or memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of a schema, regular expression, grammar or choice list.
    pub max_bytes: usize,
    /// Deepest nesting of a JSON schema.
    pub max_depth: usize,
    /// Work allowed to build the grammar's lexer (about 50 000 units a millisecond): the
    /// compile-time bound.
    pub compile_fuel: u64,
    /// Work allowed for one token's mask (about 14 000 units a millisecond).
    pub step_fuel: u64,
    /// Most lexer states (1–2 KB each): the memory bound.
    pub max_states: usize,
    /// Most parse items in one position's row. A grammar's rows hold its branching at that
    /// point (tens of items for the JSON schemas people write); an ambiguous grammar's grow
    /// with every token, and each token costs in proportion, so this bounds a hostile
    /// grammar's time (`start: start start | "a"` ends after 63 tokens in 0.7 s on an x86-64
    /// core; the grammar engine's own bound of 2000 let it run 251 tokens, for 59 s).
    pub max_row_items: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: 64 << 10,
            max_depth: 32,
            compile_fuel: 1_000_000,
            step_fuel: 200_000,
            max_states: 20_000,
            max_row_items: 500,
        }
    }
}

/// A constraint that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    /// Over a size, depth or work bound.
    #[error("{0}")]
    TooLarge(String),
    /// Not a usable schema, expression or grammar (an unsupported keyword, a syntax error).
    #[error("{0}")]
    Invalid(String),
    /// The grammar engine failed while answering (a step over its work bound).
    #[error("the constraint failed after {tokens} tokens: {why}")]
    Failed { tokens: usize, why: String },
}

/// The model's vocabulary as the grammar engine sees it.
struct Vocab {
    trie: TokTrie,
    model: Arc<crate::model::Model>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // The model's own tokenizer, so forced bytes become the tokens the model was trained
        // on; control-token text stays text. Where its tokens do not spell the bytes back (a
        // SentencePiece vocabulary reads a literal `▁` as a space), the vocabulary's bytes
        // decide, byte tokens included.
        let ids = self.model.tokenizer.encode_bytes(s, false, false);
        if self.trie.decode(&ids) == s {
            ids
        } else {
            self.trie.greedy_tokenize(s)
        }
    }
}

/// Compiles constraints for one model: its vocabulary's trie, built once (tens of
/// milliseconds for 150 000 tokens) and shared by every request.
///
/// The formats compiled last are kept, each as a fresh parser whose lexer is shared with
/// every answer made from it: a PLC that sends the same schema again finds the lexer states
/// (and the masks they cached) that its earlier answers built, rather than building them again
/// at every token of every answer.
pub struct Grammars {
    factory: ParserFactory,
    eog: Vec<u32>,
    limits: Limits,
    /// Logits per step (the model's output rows), for sizing a constraint's buffer once.
    vocab: usize,
    /// Most recently used last; at most [`KEPT`].
    kept: std::cell::RefCell<Vec<(String, Matcher)>>,
}

/// Likeliest tokens after a refused one a greedy pick checks before it computes the mask:
/// each check is a scan of the logits (~5 µs over 49k), and where the grammar refuses the
/// likeliest token it mostly refuses the next ones too (2 measured better than 8).
const GREEDY_TRIES: usize = 2;

/// Formats kept compiled (each bounded by [`Limits::max_states`]).
const KEPT: usize = 8;

impl Grammars {
    pub fn new(model: &Arc<crate::model::Model>, limits: Limits) -> Result<Grammars, String> {
        let tok = &model.tokenizer;
        let words: Vec<Vec<u8>> = (0..tok.n_vocab() as u32)
            .map(|id| bytes_of(tok, id))
            .collect();
        let eog = tok.eog_ids().to_vec();
        let eos = tok.eos().or(eog.first().copied()).unwrap_or(0);
        let words_len = words.len();
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = tok.bos();
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocab {
            trie,
            model: Arc::clone(model),
        });
        let caps = InferenceCapabilities {
            ff_tokens: true,
            ..Default::default()
        };
        let mut factory = ParserFactory::new(
            &env,
            caps,
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| e.to_string())?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            initial_lexer_fuel: limits.compile_fuel,
            step_lexer_fuel: limits.step_fuel,
            max_lexer_states: limits.max_states,
            max_grammar_size: limits.max_bytes.saturating_mul(8),
            max_items_in_row: limits.max_row_items,
            ..ParserLimits::default()
        };
        Ok(Grammars {
            factory,
            eog,
            limits,
            vocab: model.hp.n_vocab.max(words_len),
            kept: std::cell::RefCell::new(Vec::new()),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// A fresh constraint for one answer of at most `max_tokens` tokens.
    pub fn compile(&self, shape: &Shape, max_tokens: usize) -> Result<Constraint, ConstraintError> {
        shape.check(&self.limits)?;
        let start = Instant::now();
        let key = shape.key();
        let mut kept = self.kept.borrow_mut();
        let matcher = match kept.iter().position(|(k, _)| *k == key) {
            Some(i) => {
                let entry = kept.remove(i);
                let m = entry.1.clone();
                kept.push(entry);
                m
            }
            None => {
                let parser = self
                    .factory
                    .create_parser(shape.grammar())
                    .map_err(|e| classify(shape, e.to_string()))?;
                let matcher = Matcher::new(Ok(parser));
                if let Some(e) = matcher.get_error() {
                    return Err(classify(shape, e));
                }
                if kept.len() == KEPT {
                    kept.remove(0);
                }
                kept.push((key, matcher.clone()));
                matcher
            }
        };
        Ok(Constraint {
            matcher,
            eog: self.eog.clone(),
            forced_in_chunks: true,
            always_mask: false,
            consumed: 0,
            step_ns: Vec::with_capacity(max_tokens.min(1 << 16)),
            ff_tokens: 0,
            ff_ns: 0,
            masks: 0,
            compile_ms: start.elapsed().as_secs_f64() * 1000.0,
            knocked: Vec::with_capacity(GREEDY_TRIES + 1),
            saved: Vec::with_capacity(self.vocab),
        })
    }
}

/// The bytes a token stands for; control, user-defined and unknown tokens (and any that stand
/// for nothing) as the marker byte and their text, which no grammar matches.
fn bytes_of(tok: &Tokenizer, id: u32) -> Vec<u8> {
    let piece = tok.token_to_piece(id);
    match tok.token_type(id) {
        Some(TokenType::Normal | TokenType::Byte) if !piece.is_empty() => piece.to_vec(),
        _ => {
            let mut v = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            v.extend_from_slice(format!("<[{id}]>").as_bytes());
            v
        }
    }
}

/// A limit hit while compiling is the request's size, not a bad grammar.
fn classify(shape: &Shape, why: String) -> ConstraintError {
    let over = ["fuel", "too many", "too large", "limit", "max_"];
    let lower = why.to_ascii_lowercase();
    let what = format!("the {}: {}", shape.kind(), first_line(&why));
    if over.iter().any(|w| lower.contains(w)) {
        ConstraintError::TooLarge(what)
    } else {
        ConstraintError::Invalid(what)
    }
}

/// llguidance's messages can carry the whole grammar after the first line.
fn first_line(s: &str) -> &str {
    let line = s.lines().next().unwrap_or(s);
    match line.char_indices().nth(400) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// One answer's constraint: the grammar's state as the answer grows.
pub struct Constraint {
    matcher: Matcher,
    eog: Vec<u32>,
    /// Forced tokens go through the model as one chunk (the fast path) rather than one step
    /// each; both give the same tokens, which a test checks.
    pub forced_in_chunks: bool,
    /// Compute the full mask at every token instead of checking the sampled one first: the
    /// reference the lazy path must match (for greedy answers, token for token).
    pub always_mask: bool,
    /// Tokens the grammar took.
    consumed: usize,
    /// Nanoseconds the constraint cost at each sampled token (the check, the mask if the token
    /// was refused).
    step_ns: Vec<u32>,
    /// Tokens the grammar forced, and the nanoseconds finding them took (they cost no step).
    ff_tokens: usize,
    ff_ns: u64,
    /// Steps at which the sampled token was refused and the full mask computed.
    masks: usize,
    compile_ms: f64,
    /// Logits the greedy retries set aside (id, value), put back before the mask decides.
    knocked: Vec<(usize, f32)>,
    /// The logits, copied only when the mask decides.
    saved: Vec<f32>,
}

/// What a constraint cost an answer.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ConstraintStats {
    pub compile_ms: f64,
    /// Sampled tokens.
    pub steps: usize,
    /// Of them, how many needed the full mask.
    pub masks: usize,
    pub mean_us: f64,
    pub p99_us: f64,
    /// Tokens the grammar forced (fed with no step of their own), and the microseconds
    /// finding them took in all.
    pub forced: usize,
    pub forced_us: f64,
}

impl Constraint {
    /// Picks the next token: a draw as `sampler` makes it, accepted if the grammar takes it;
    /// otherwise a draw from the logits masked to what the grammar allows. An end-of-generation
    /// token is allowed exactly when the grammar may end. The token is taken into the grammar.
    pub(super) fn pick(
        &mut self,
        sampler: &mut Sampler,
        logits: &mut [f32],
        history: &[u32],
    ) -> Result<u32, ConstraintError> {
        let t0 = Instant::now();
        sampler.penalize(logits, history);
        // Drawing leaves the logits as they are: nothing to save unless the mask decides.
        let tok = sampler.pick(logits);
        let tok = if !self.always_mask && self.allows(tok)? {
            tok
        } else if let Some(tok) = self.next_best(sampler, logits)? {
            tok
        } else {
            self.masks += 1;
            let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
            let end = self.matcher.is_accepting().map_err(|e| self.failed(e))?;
            for (id, v) in self.knocked.drain(..) {
                logits[id] = v;
            }
            // Everything refused, then the allowed ones back: the mask's zero words are
            // skipped whole, where a test per token would cost more than the mask itself.
            self.saved.clear();
            self.saved.extend_from_slice(logits);
            logits.fill(f32::NEG_INFINITY);
            let mut any = false;
            mask.iter_set_entries(|id| {
                if let Some(l) = logits.get_mut(id) {
                    *l = self.saved[id];
                    any = true;
                }
            });
            for &e in &self.eog {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = if end {
                        self.saved[e as usize]
                    } else {
                        f32::NEG_INFINITY
                    };
                }
            }
            any |= end && self.eog.iter().any(|&e| (e as usize) < logits.len());
            if !any {
                return Err(self.failed("no token is allowed"));
            }
            let tok = sampler.pick(logits);
            if !self.is_eog(tok) {
                self.take(&[tok])?;
            }
            tok
        };
        self.record(t0);
        Ok(tok)
    }

    /// Greedy only: the next most likely tokens, checked one at a time. The first the grammar
    /// takes is the argmax of the masked logits, exactly (every likelier one was refused), at a
    /// few microseconds a check instead of a mask over the whole vocabulary. `None` after
    /// [`GREEDY_TRIES`] refusals: the mask decides.
    fn next_best(
        &mut self,
        sampler: &Sampler,
        logits: &mut [f32],
    ) -> Result<Option<u32>, ConstraintError> {
        self.knocked.clear();
        if !sampler.is_greedy() || self.always_mask {
            return Ok(None);
        }
        let mut best = super::sampler::argmax(logits);
        for _ in 0..GREEDY_TRIES {
            self.knocked.push((best, logits[best]));
            logits[best] = f32::NEG_INFINITY;
            best = super::sampler::argmax(logits);
            if logits[best] == f32::NEG_INFINITY {
                return Ok(None);
            }
            if self.allows(best as u32)? {
                for (id, v) in self.knocked.drain(..) {
                    logits[id] = v;
                }
                return Ok(Some(best as u32));
            }
        }
        Ok(None)
    }

    /// Whether the grammar takes `tok` (taking it if so): the lazy check, the same one
    /// [`Self::would_take`] makes.
    fn allows(&mut self, tok: u32) -> Result<bool, ConstraintError> {
        let ok = self.would_take(tok)?;
        if ok && !self.is_eog(tok) {
            self.take(&[tok])?;
        }
        Ok(ok)
    }

    fn take(&mut self, toks: &[u32]) -> Result<(), ConstraintError> {
        self.matcher
            .consume_tokens(toks)
            .map_err(|e| self.failed(e))?;
        self.consumed += toks.len();
        Ok(())
    }

    /// The tokens the grammar now forces, at most `room`, taken into the grammar.
    pub(super) fn forced(&mut self, room: usize) -> Result<Vec<u32>, ConstraintError> {
        if room == 0 || self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let t0 = Instant::now();
        let mut ff = self.matcher.compute_ff_tokens();
        if let Some(e) = self.matcher.get_error() {
            return Err(self.failed(e));
        }
        ff.truncate(room);
        if !ff.is_empty() {
            self.take(&ff)?;
        }
        self.ff_tokens += ff.len();
        self.ff_ns = self
            .ff_ns
            .saturating_add(t0.elapsed().as_nanos().min(u64::MAX as u128) as u64);
        Ok(ff)
    }

    /// The grammar is complete and can take nothing more: the answer ends here.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    fn is_eog(&self, tok: u32) -> bool {
        self.eog.binary_search(&tok).is_ok()
    }

    fn failed(&self, why: impl std::fmt::Display) -> ConstraintError {
        ConstraintError::Failed {
            tokens: self.consumed,
            why: first_line(&why.to_string()).to_owned(),
        }
    }

    fn record(&mut self, t0: Instant) {
        if self.step_ns.len() < self.step_ns.capacity() {
            self.step_ns
                .push(t0.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        }
    }

    /// What the constraint cost so far.
    pub fn stats(&self) -> ConstraintStats {
        let mut ns = self.step_ns.clone();
        ns.sort_unstable();
        let steps = ns.len();
        let mean_us = if steps == 0 {
            0.0
        } else {
            ns.iter().map(|&n| n as f64).sum::<f64>() / steps as f64 / 1000.0
        };
        let p99_us = if steps == 0 {
            0.0
        } else {
            ns[((steps * 99).div_ceil(100)).clamp(1, steps) - 1] as f64 / 1000.0
        };
        ConstraintStats {
            compile_ms: self.compile_ms,
            steps,
            masks: self.masks,
            mean_us,
            p99_us,
            forced: self.ff_tokens,
            forced_us: self.ff_ns as f64 / 1000.0,
        }
    }

    /// The full mask in the current state, end-of-generation ids included when the grammar
    /// may end: the reference the lazy check must agree with.
    pub fn mask(&mut self) -> Result<Vec<bool>, ConstraintError> {
        let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
        let end = self.matcher.is_accepting().map_err(|e| self.failed(e))?;
        let n = self
            .matcher
            .tok_env()
            .map_err(|e| self.failed(e))?
            .tok_trie()
            .vocab_size();
        Ok((0..n as u32)
            .map(|id| {
                if self.is_eog(id) {
                    end
                } else {
                    mask.is_allowed(id)
                }
            })
            .collect())
    }

    /// Whether the grammar would take `tok` now, without taking it (the lazy check).
    pub fn would_take(&mut self, tok: u32) -> Result<bool, ConstraintError> {
        if self.is_eog(tok) {
            return self.matcher.is_accepting().map_err(|e| self.failed(e));
        }
        let n = self
            .matcher
            .validate_tokens(&[tok])
            .map_err(|e| self.failed(e))?;
        Ok(n == 1)
    }

    /// Takes `tok` into the grammar (for tests that walk it).
    pub fn advance(&mut self, tok: u32) -> Result<(), ConstraintError> {
        self.take(&[tok])
    }
}
