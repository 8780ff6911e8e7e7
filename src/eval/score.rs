//! The arithmetic of perplexity and KL divergence over a scored position's logits, in
//! llama-perplexity's precision: the maximum logit in f32, `exp(l - max)` in f32 summed in f64,
//! the negative log-likelihoods summed in f64.
//!
//! KL divergence is computed against a reference saved as its top-k tokens (see [`super::topk`]
//! for the file): with `S` the reference's `k` most likely tokens, `P` the reference and `Q`
//! ours,
//! ```text
//! KLD = Σ_{i∈S} p_i · (ln p_i − ln q_i) + p_rest · (ln p_rest − ln q_rest)
//! p_rest = 1 − Σ_{i∈S} p_i,  q_rest = 1 − Σ_{i∈S} q_i   (each summed over the tokens outside S)
//! ```
//! the divergence of the two distributions with every token outside `S` merged into one bucket.
//! Merging can only lose divergence (the log-sum inequality), so this is a lower bound of the full
//! KL divergence, short by `p_rest · KL(P_rest ‖ Q_rest)`, the divergence inside the tail (how
//! much that is on a real model: [`super::topk::TOP_K`]). It is 0 exactly when a model is
//! compared with its own saved logits: both sides are computed by the same functions and
//! rounded to the file's f32. Top-1 agreement and both perplexities are exact whatever `k`.

/// The log-softmax of one position's logits.
#[derive(Clone, Copy, Debug)]
pub struct LogSoftmax {
    max: f32,
    /// `ln Σ exp(l − max)`.
    ln_sum: f64,
}

impl LogSoftmax {
    pub fn of(logits: &[f32]) -> LogSoftmax {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum_exp: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
        LogSoftmax {
            max,
            ln_sum: sum_exp.ln(),
        }
    }

    /// ln p of a token whose logit is `l` (llama-perplexity: `logits[tok] - max - log(sum_exp)`).
    pub fn log_prob(&self, l: f32) -> f64 {
        f64::from(l - self.max) - self.ln_sum
    }

    /// `ln Σ e^l`: the logits are `ln p + log_sum_exp`.
    pub fn log_sum_exp(&self) -> f64 {
        f64::from(self.max) + self.ln_sum
    }

    /// ln of the probability of the tokens not in `sorted_ids` (ascending), summed over them
    /// (not `1 − Σ p_i`, which loses the tail to rounding when the listed tokens hold nearly
    /// all the mass); −∞ when no mass is left.
    fn rest_log_prob(&self, logits: &[f32], sorted_ids: &[u32]) -> f64 {
        let mut next = sorted_ids.iter().copied().peekable();
        let mut rest = 0.0f64;
        for (i, &l) in logits.iter().enumerate() {
            let mut listed = false;
            while next.next_if(|&id| id as usize == i).is_some() {
                listed = true;
            }
            if !listed {
                rest += f64::from((l - self.max).exp());
            }
        }
        rest.ln() - self.ln_sum
    }
}

/// Index of the largest logit, the first of equals (llama-perplexity's `imax`).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best
}

/// Negative log-likelihoods of the scored tokens, summed as llama-perplexity sums them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Nll {
    sum: f64,
    sum2: f64,
    count: u64,
}

impl Nll {
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean negative log-likelihood (ln of the perplexity).
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// `exp(mean nll)`.
    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// The perplexity's standard error, as llama-perplexity's final estimate gives it: the
    /// standard error of the mean nll (`sqrt(var / (count − 1))`), times the perplexity (the
    /// derivative of `exp`). `None` when there is no spread to measure (fewer than two tokens,
    /// or all scored the same).
    pub fn ppl_err(&self) -> Option<f64> {
        let n = self.count as f64;
        let mean = self.mean();
        let var = self.sum2 / n - mean * mean;
        (self.count > 1 && var > 0.0).then(|| (var / (n - 1.0)).sqrt() * self.ppl())
    }
}

/// A reference model's distribution at one scored position, as the saved file holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RefPoint {
    /// ln p of the token that came next in the text (for the reference's perplexity).
    pub target_lp: f32,
    /// `ln Σ e^logit`: the reference's raw logits of the top tokens are `lp + lse`. Not needed
    /// by the scores; kept so that a tool reading the file can rebuild them.
    pub lse: f32,
    /// ln of the probability of every token outside `top` (−∞ if none is left).
    pub rest_lp: f32,
    /// `(token, ln p)`, the `k` most likely tokens, most likely first, ties by lower id.
    pub top: Vec<(u32, f32)>,
}

/// Scores positions; holds the scratch a position needs so that scoring allocates nothing.
#[derive(Default)]
pub struct Scorer {
    /// The reference's top-k ids, ascending.
    sorted: Vec<u32>,
}

/// One position scored against a reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Compared {
    /// Our negative log-likelihood of the next token.
    pub nll: f64,
    /// The reference's.
    pub nll_base: f64,
    /// KL(reference ‖ ours) over the reference's top-k and the rest as one bucket.
    pub kld: f64,
    /// Both models' most likely token is the same.
    pub same_top: bool,
}

/// Log-probability taken for a bucket to which our model gives no mass at all (every logit
/// outside the reference's top-k underflowed): a bound, so that one position cannot make the
/// mean infinite.
const FLOOR_LP: f64 = -100.0;

impl Scorer {
    /// Our negative log-likelihood of `target` after `logits`.
    pub fn nll(logits: &[f32], target: u32) -> f64 {
        -LogSoftmax::of(logits).log_prob(logits[target as usize])
    }

    /// The reference record of `logits` (the reference model's) with `target` next: its `k`
    /// most likely tokens and the rest as one bucket. Returns the nll of `target`.
    pub fn reference(&mut self, logits: &[f32], target: u32, k: usize, out: &mut RefPoint) -> f64 {
        let sm = LogSoftmax::of(logits);
        top_k(logits, k, &mut out.top);
        for (id, lp) in &mut out.top {
            *lp = sm.log_prob(logits[*id as usize]) as f32;
        }
        self.sort_ids(&out.top);
        let target_lp = sm.log_prob(logits[target as usize]);
        out.target_lp = target_lp as f32;
        out.lse = sm.log_sum_exp() as f32;
        out.rest_lp = sm.rest_log_prob(logits, &self.sorted) as f32;
        -target_lp
    }

    /// `logits` (ours) with `target` next, against the reference's record `r` of the same
    /// position. The ids in `r` are below `logits.len()` (the file reader checks them).
    pub fn compare(&mut self, logits: &[f32], target: u32, r: &RefPoint) -> Compared {
        let sm = LogSoftmax::of(logits);
        self.sort_ids(&r.top);
        let mut kld = 0.0;
        for &(id, lp) in &r.top {
            // Our side rounded to f32 like the file's, so a model against itself gives 0.
            let lq = sm.log_prob(logits[id as usize]) as f32;
            kld += f64::from(lp).exp() * (f64::from(lp) - f64::from(lq));
        }
        let p_rest = f64::from(r.rest_lp).exp();
        if p_rest > 0.0 {
            let lq = f64::from(sm.rest_log_prob(logits, &self.sorted) as f32);
            let lq = if lq.is_finite() { lq } else { FLOOR_LP };
            kld += p_rest * (f64::from(r.rest_lp) - lq);
        }
        Compared {
            nll: -sm.log_prob(logits[target as usize]),
            nll_base: -f64::from(r.target_lp),
            kld,
            same_top: r.top.first().map(|t| t.0 as usize) == Some(argmax(logits)),
        }
    }

    fn sort_ids(&mut self, top: &[(u32, f32)]) {
        self.sorted.clear();
        self.sorted.extend(top.iter().map(|t| t.0));
        self.sorted.sort_unstable();
    }
}

/// The `k` largest logits into `out` as `(id, logit)`, largest first, ties by lower id (so the
/// first is [`argmax`]'s).
pub fn top_k(logits: &[f32], k: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    let k = k.min(logits.len());
    if k == 0 {
        return;
    }
    for (i, &l) in logits.iter().enumerate() {
        // Strictly larger than the last kept: an equal later id ranks below it.
        if out.len() == k && out[k - 1].1 >= l {
            continue;
        }
        let at = out.partition_point(|&(_, v)| v >= l);
        if out.len() == k {
            out.pop();
        }
        out.insert(at, (i as u32, l));
    }
}

/// What `--kl-divergence` reports, accumulated over the scored positions.
#[derive(Clone, Debug, Default)]
pub struct KlStats {
    pub ours: Nll,
    pub base: Nll,
    kld_sum: f64,
    kld_sum2: f64,
    same_top: u64,
    /// Every position's divergence, for the percentiles.
    klds: Vec<f32>,
}

/// The summary llama-perplexity's KL-divergence mode prints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlSummary {
    pub count: u64,
    pub ppl: f64,
    pub ppl_base: f64,
    /// `ppl − ppl_base`.
    pub delta_ppl: f64,
    pub kld_mean: f64,
    /// Standard error of the mean (0 for ten positions or fewer, as llama.cpp).
    pub kld_err: f64,
    pub kld_median: f64,
    pub kld_p99: f64,
    pub kld_max: f64,
    /// Fraction of positions where both models' most likely token is the same.
    pub same_top: f64,
    pub same_top_err: f64,
}

impl KlStats {
    pub fn add(&mut self, c: Compared) {
        self.ours.add(c.nll);
        self.base.add(c.nll_base);
        self.kld_sum += c.kld;
        self.kld_sum2 += c.kld * c.kld;
        self.same_top += u64::from(c.same_top);
        self.klds.push(c.kld as f32);
    }

    /// The summary so far; `None` before the first position.
    pub fn summary(&self) -> Option<KlSummary> {
        let count = self.ours.count();
        if count == 0 {
            return None;
        }
        let n = count as f64;
        let (kld_mean, kld_err) = mean_and_uncertainty(self.kld_sum, self.kld_sum2, count);
        let mut sorted = self.klds.clone();
        sorted.sort_unstable_by(f32::total_cmp);
        let same_top = self.same_top as f64 / n;
        let same_top_err = if count > 1 {
            (same_top * (1.0 - same_top) / (n - 1.0)).sqrt()
        } else {
            0.0
        };
        Some(KlSummary {
            count,
            ppl: self.ours.ppl(),
            ppl_base: self.base.ppl(),
            delta_ppl: self.ours.ppl() - self.base.ppl(),
            kld_mean,
            kld_err,
            kld_median: percentile(&sorted, 0.5),
            kld_p99: percentile(&sorted, 0.99),
            kld_max: f64::from(*sorted.last().expect("count > 0")),
            same_top,
            same_top_err,
        })
    }
}

/// llama-perplexity's `mean_and_uncertainty`: the mean, and its standard error when there are
/// more than ten values.
fn mean_and_uncertainty(sum: f64, sum2: f64, count: u64) -> (f64, f64) {
    let n = count as f64;
    let mean = sum / n;
    let var = sum2 / n - mean * mean;
    let err = if var > 0.0 && count > 10 {
        (var / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (mean, err)
}

/// The `fraction` percentile of ascending `values`, interpolated between neighbours as
/// llama-perplexity's `percentile`.
pub fn percentile(values: &[f32], fraction: f64) -> f64 {
    let (first, last) = (values[0], values[values.len() - 1]);
    if fraction <= 0.0 {
        return f64::from(first);
    }
    if fraction >= 1.0 {
        return f64::from(last);
    }
    let p = fraction * (values.len() - 1) as f64;
    let i = p as usize;
    let w = p - i as f64;
    (1.0 - w) * f64::from(values[i]) + w * f64::from(values[(i + 1).min(values.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    /// Logits ln 1, ln 2, ln 3, ln 4 (+ any constant): p = 0.1, 0.2, 0.3, 0.4.
    fn four() -> Vec<f32> {
        [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .map(|x| x.ln() + 7.0)
            .collect()
    }

    #[test]
    fn perplexity_of_a_hand_computed_case() {
        // Targets of probability 0.4 and 0.1: nll = −ln 0.4, −ln 0.1; ppl = exp(mean) =
        // 1 / sqrt(0.04) = 5.
        let logits = four();
        let mut nll = Nll::default();
        nll.add(Scorer::nll(&logits, 3));
        nll.add(Scorer::nll(&logits, 0));
        assert!(close(nll.ppl(), 5.0, 1e-5), "{}", nll.ppl());
        // var = ((ln 0.4 − ln 0.1) / 2)² = (ln 2)²; err = sqrt(var / 1) · ppl = 5 ln 2.
        let err = nll.ppl_err().unwrap();
        assert!(close(err, 5.0 * 2f64.ln(), 1e-5), "{err}");
    }

    #[test]
    fn no_spread_gives_no_error_estimate() {
        let mut nll = Nll::default();
        nll.add(1.0);
        assert_eq!(nll.ppl_err(), None);
        nll.add(1.0);
        assert_eq!(nll.ppl_err(), None);
    }

    #[test]
    fn top_k_keeps_the_largest_most_likely_first_ties_by_lower_id() {
        let mut out = Vec::new();
        top_k(&[1.0, 5.0, 3.0, 5.0, -2.0, 4.0], 3, &mut out);
        assert_eq!(out, [(1, 5.0), (3, 5.0), (5, 4.0)]);
        top_k(&[1.0, 2.0], 5, &mut out);
        assert_eq!(out, [(1, 2.0), (0, 1.0)]);
        assert_eq!(argmax(&[1.0, 5.0, 3.0, 5.0]), 1);
    }

    #[test]
    fn the_reference_record_holds_the_top_k_and_the_rest_as_one_bucket() {
        let logits = four();
        let mut s = Scorer::default();
        let mut r = RefPoint::default();
        let nll = s.reference(&logits, 1, 2, &mut r);
        assert!(close(nll, -(0.2f64).ln(), 1e-6));
        let ids: Vec<u32> = r.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [3, 2]);
        assert!(close(f64::from(r.top[0].1), 0.4f64.ln(), 1e-6));
        assert!(close(f64::from(r.top[1].1), 0.3f64.ln(), 1e-6));
        assert!(
            close(f64::from(r.rest_lp), 0.3f64.ln(), 1e-6),
            "0.1 + 0.2 outside"
        );
        assert!(close(f64::from(r.lse), 10f64.ln() + 7.0, 1e-5));
        assert!(close(f64::from(r.target_lp), 0.2f64.ln(), 1e-6));
    }

    #[test]
    fn kl_divergence_of_a_hand_computed_case() {
        // Reference P = (0.1, 0.2, 0.3, 0.4), ours Q = (0.25, 0.25, 0.25, 0.25), top-2 {3, 2}:
        // KLD = 0.4 ln(0.4/0.25) + 0.3 ln(0.3/0.25) + 0.3 ln(0.3/0.5) (the bucket {0, 1}).
        let mut s = Scorer::default();
        let mut r = RefPoint::default();
        s.reference(&four(), 0, 2, &mut r);
        let c = s.compare(&[0.5; 4], 0, &r);
        let want = 0.4 * (1.6f64).ln() + 0.3 * (1.2f64).ln() + 0.3 * (0.6f64).ln();
        assert!(close(c.kld, want, 1e-6), "{} vs {want}", c.kld);
        assert!(c.kld > 0.0);
        // The full KLD is larger: the bucket hides 0.1 ln 0.4 + 0.2 ln 0.8 of it.
        let full = [0.1f64, 0.2, 0.3, 0.4]
            .iter()
            .map(|p| p * (p / 0.25).ln())
            .sum::<f64>();
        assert!(c.kld < full);
        assert!(close(c.nll, 4f64.ln(), 1e-6));
        assert!(close(c.nll_base, 10f64.ln(), 1e-6));
        // Our argmax of equal logits is token 0; the reference's is 3.
        assert!(!c.same_top);
    }

    #[test]
    fn a_model_against_its_own_record_diverges_by_exactly_zero() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 997) as f32 / 50.0)
            .collect();
        let mut s = Scorer::default();
        let mut r = RefPoint::default();
        for k in [1, 8, 64, 1000] {
            s.reference(&logits, 17, k, &mut r);
            let c = s.compare(&logits, 17, &r);
            assert_eq!(c.kld, 0.0, "k = {k}");
            assert!(c.same_top);
            assert!(close(c.nll, c.nll_base, 1e-6));
        }
        // k = the vocabulary: nothing left outside, the bucket is empty.
        assert_eq!(r.rest_lp, f32::NEG_INFINITY);
    }

    #[test]
    fn statistics_are_summarised_as_llama_perplexity_does() {
        let mut st = KlStats::default();
        assert!(st.summary().is_none());
        for (i, kld) in [0.0, 0.1, 0.2, 0.3, 0.4].into_iter().enumerate() {
            st.add(Compared {
                nll: 1.0,
                nll_base: 0.5,
                kld,
                same_top: i % 2 == 0,
            });
        }
        let s = st.summary().unwrap();
        assert_eq!(s.count, 5);
        assert!(close(s.kld_mean, 0.2, 1e-12));
        assert_eq!(s.kld_err, 0.0, "ten values or fewer: no uncertainty");
        assert!(close(s.kld_median, 0.2, 1e-7));
        assert!(close(s.kld_p99, 0.396, 1e-6), "{}", s.kld_p99);
        assert!(close(s.kld_max, 0.4, 1e-7));
        assert!(close(s.same_top, 0.6, 1e-12));
        assert!(close(s.delta_ppl, 1f64.exp() - 0.5f64.exp(), 1e-12));
    }
}
