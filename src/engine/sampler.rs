//! Token sampling: greedy, or repetition penalty → top-k → top-p → min-p → temperature →
//! a draw from a seeded generator (llama.cpp's default chain, in its order).
//!
//! Every buffer is sized once for the vocabulary; sampling a token allocates nothing. The
//! result depends only on the logits, the settings, the seed and the history, never on the
//! thread count (sampling runs on one thread).

use super::constraint::{Constraint, ConstraintError};
use serde::{Deserialize, Serialize};

/// Sampling settings. `temperature <= 0` means greedy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` × the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive / multiply negative logits of recently seen tokens (1.0 = off).
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5eed,
        }
    }
}

/// A sampling setting out of its range; the message names the field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{field} must be {want}, got {got}")]
pub struct SamplingError {
    pub field: &'static str,
    pub want: &'static str,
    pub got: f32,
}

impl SamplingParams {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let fields = [
            ("temperature", self.temperature, 0.0, f32::INFINITY, ">= 0"),
            ("top_p", self.top_p, 0.0, 1.0, "in 0..=1"),
            ("min_p", self.min_p, 0.0, 1.0, "in 0..=1"),
            (
                "repeat_penalty",
                self.repeat_penalty,
                f32::MIN_POSITIVE,
                f32::INFINITY,
                "> 0",
            ),
        ];
        for (field, got, lo, hi, want) in fields {
            if !got.is_finite() {
                return Err(SamplingError {
                    field,
                    want: "a finite number",
                    got,
                });
            }
            if !(lo..=hi).contains(&got) {
                return Err(SamplingError { field, want, got });
            }
        }
        Ok(())
    }
}

/// A small, fast, seedable generator (SplitMix64): the same seed gives the same draws on
/// every machine, which a `rand` default generator does not promise across versions.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Index of the largest value; ties go to the lowest index (as llama.cpp's greedy sampler).
/// NaNs are never chosen over a number.
pub fn argmax(logits: &[f32]) -> usize {
    // The maximum first, in 16 independent lanes the compiler keeps in vector registers (a
    // single running (index, value) pair is a chain of compares and branches: ~40 µs over a
    // 49k vocabulary, 1% of a token), then the first index that holds it.
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let (chunks, tail) = logits.as_chunks::<L>();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut best_v = lanes
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, |m, v| if v > m { v } else { m });
    for &v in tail {
        best_v = if v > best_v { v } else { best_v };
    }
    logits.iter().position(|&v| v == best_v).unwrap_or(0)
}

/// A sampler with its scratch space and generator state.
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// `(logit or probability, token id)`, sized for the vocabulary once.
    cand: Vec<(f32, u32)>,
    /// The shape every token must keep the answer in.
    constraint: Option<Box<Constraint>>,
}

impl Sampler {
    pub fn new(params: SamplingParams, n_vocab: usize) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler {
            params,
            rng,
            cand: Vec::with_capacity(n_vocab),
            constraint: None,
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the generator from the configured seed.
    pub fn reseed(&mut self) {
        self.rng = Rng::new(self.params.seed);
    }

    /// Picks the next token. `logits` is modified in place by the repetition penalty;
    /// `history` is the sequence so far (prompt and generated).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.penalize(logits, history);
        self.pick(logits)
    }

    /// Picks the next token as [`Self::sample`] does, under the sampler's constraint if it has
    /// one (the token is then taken into the constraint's grammar).
    pub fn next(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, ConstraintError> {
        match self.constraint.take() {
            None => Ok(self.sample(logits, history)),
            Some(mut c) => {
                let r = c.pick(self, logits, history);
                self.constraint = Some(c);
                r
            }
        }
    }

    /// From now on every token is picked under `c`.
    pub fn constrain(&mut self, c: Constraint) {
        self.constraint = Some(Box::new(c));
    }

    pub fn constraint(&self) -> Option<&Constraint> {
        self.constraint.as_deref()
    }

    pub fn constraint_mut(&mut self) -> Option<&mut Constraint> {
        self.constraint.as_deref_mut()
    }

    /// Whether a draw is the argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// The repetition penalty, applied to `logits` in place.
    pub(super) fn penalize(&mut self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty != 1.0 && p.repeat_last_n > 0 {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let recent = &history[start..];
            // Each distinct token is penalised once, however often it occurred.
            for (i, &t) in recent.iter().enumerate() {
                if recent[..i].contains(&t) {
                    continue;
                }
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repeat_penalty
                    } else {
                        *l * p.repeat_penalty
                    };
                }
            }
        }
    }

    /// A draw from `logits` as they are (top-k, top-p, min-p, temperature; greedy at 0).
    pub(super) fn pick(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        if p.temperature <= 0.0 || logits.len() < 2 {
            return argmax(logits) as u32;
        }

        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan())
                .map(|(i, &l)| (l, i as u32)),
        );
        if self.cand.is_empty() {
            return 0;
        }
        let by_logit_desc =
            |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, by_logit_desc);
            self.cand.truncate(p.top_k);
        }
        self.cand.sort_unstable_by(by_logit_desc);

        // Softmax with temperature, in place.
        let max = self.cand[0].0;
        let mut sum = 0.0f64;
        for c in self.cand.iter_mut() {
            c.0 = ((c.0 - max) / p.temperature).exp();
            sum += c.0 as f64;
        }
        for c in self.cand.iter_mut() {
            c.0 = (c.0 as f64 / sum) as f32;
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0f32;
            let mut keep = self.cand.len();
            for (i, c) in self.cand.iter().enumerate() {
                acc += c.0;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.cand.truncate(keep.max(1));
        }
        if p.min_p > 0.0 {
            let floor = self.cand[0].0 * p.min_p;
            let keep = self.cand.iter().take_while(|c| c.0 >= floor).count();
            self.cand.truncate(keep.max(1));
        }
        let total: f32 = self.cand.iter().map(|c| c.0).sum();
        let mut r = self.rng.next_f32() * total;
        for c in &self.cand {
            if r < c.0 {
                return c.1;
            }
            r -= c.0;
        }
        self.cand[self.cand.len() - 1].1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: the first index of the largest number, NaNs never chosen, 0 if none.
    fn argmax_plain(v: &[f32]) -> usize {
        let mut best = 0;
        let mut best_v = f32::NEG_INFINITY;
        for (i, &x) in v.iter().enumerate() {
            if x > best_v {
                best_v = x;
                best = i;
            }
        }
        best
    }

    #[test]
    fn argmax_is_the_first_largest_on_awkward_inputs() {
        let mut rng = Rng::new(7);
        for n in [0usize, 1, 2, 15, 16, 17, 31, 33, 100, 49152] {
            for case in 0..6 {
                let mut v: Vec<f32> = (0..n).map(|_| (rng.next_f32() * 8.0).floor()).collect();
                match case {
                    1 => v.iter_mut().step_by(3).for_each(|x| *x = f32::NAN),
                    2 => v.iter_mut().for_each(|x| *x = f32::NAN),
                    3 => v.iter_mut().for_each(|x| *x = f32::NEG_INFINITY),
                    4 if n > 0 => v[n - 1] = 100.0,
                    5 if n > 0 => v[0] = f32::INFINITY,
                    _ => {}
                }
                assert_eq!(argmax(&v), argmax_plain(&v), "n={n} case {case}: {v:?}");
            }
        }
    }

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.5, 3.0, -1.0, 0.5, 2.9, 0.0]
    }

    #[test]
    fn greedy_takes_the_lowest_id_among_ties() {
        let mut s = Sampler::new(SamplingParams::default(), 8);
        assert_eq!(s.sample(&mut logits(), &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_another_seed_differs() {
        let params = SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        let run = |seed| {
            let mut s = Sampler::new(
                SamplingParams {
                    seed,
                    ..params.clone()
                },
                8,
            );
            (0..64)
                .map(|_| s.sample(&mut logits(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let params = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(params, 8);
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits(), &[]), 1);
        }
    }

    #[test]
    fn min_p_and_top_p_cut_unlikely_tokens() {
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        };
        let mut s = Sampler::new(params, 8);
        for _ in 0..200 {
            let t = s.sample(&mut logits(), &[]);
            // p(t)/p(max) >= 0.5 ⇔ logit >= 3 - ln 2 ≈ 2.31: ids 1, 2, 3, 6.
            assert!([1, 2, 3, 6].contains(&t), "{t}");
        }
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.3,
            min_p: 0.0,
            ..Default::default()
        };
        let mut s = Sampler::new(params, 8);
        for _ in 0..200 {
            assert!([1, 3].contains(&s.sample(&mut logits(), &[])));
        }
    }

    #[test]
    fn repetition_penalty_moves_greedy_off_a_repeated_token() {
        let params = SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(params, 8);
        // Ids 1 and 3 (3.0) were seen: 1.5 each, so 6 (2.9) wins.
        assert_eq!(s.sample(&mut logits(), &[1, 3, 1]), 6);
    }

    #[test]
    fn out_of_range_settings_are_rejected_by_name() {
        let p = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().field, "top_p");
        let p = SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        };
        let e = p.validate().unwrap_err();
        assert_eq!((e.field, e.want), ("temperature", "a finite number"));
        for (temperature, repeat_penalty) in [(-0.1, 1.0), (0.0, 0.0), (0.0, -1.0)] {
            let p = SamplingParams {
                temperature,
                repeat_penalty,
                ..Default::default()
            };
            assert!(p.validate().is_err(), "{p:?}");
        }
        let p = SamplingParams {
            temperature: 2.0,
            repeat_penalty: 1e-3,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        };
        assert_eq!(p.validate(), Ok(()));
    }
}
