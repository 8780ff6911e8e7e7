//! The in-RAM KV cache, allocated once for the configured context. f16 by default (as
//! llama.cpp), f32 on request.
//!
//! Laid out `(layer, kv head, position, head_dim)`: the keys (or values) one head attends over
//! are one contiguous run, which the hardware prefetchers stream. (Position-major rows made a
//! head's reads a stride of `kv_dim` with 1/`n_head_kv` of each row used: latency-bound.)
//! Snapshots keep position-major rows (`kv_dim` elements in head order), so their format does
//! not depend on this choice.

use kernels_neon::{Kernels, f16, hint};
use std::fmt;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    F16,
    F32,
}

impl KvType {
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
        }
    }
    pub fn parse(s: &str) -> Result<KvType, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            _ => Err(format!("unknown KV cache type '{s}' (expected f16 or f32)")),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
        })
    }
}

enum Store {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// Keys and values of every layer for positions `0..n_ctx`.
pub struct KvCache {
    n_layer: usize,
    n_ctx: usize,
    n_head_kv: usize,
    head_dim: usize,
    store: Store,
}

impl KvCache {
    /// Allocates (zeroed) `2 × n_layer × n_ctx × n_head_kv × head_dim` elements.
    pub fn new(
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        ty: KvType,
    ) -> KvCache {
        let kv_dim = n_head_kv * head_dim;
        let n = n_layer * n_ctx * kv_dim;
        // Zeroed allocations (calloc): the kernel backs pages on first write, so a cache sized
        // for a long context costs RAM only for the positions a conversation reaches.
        let store = match ty {
            KvType::F16 => Store::F16 {
                k: bytemuck::allocation::zeroed_vec(n),
                v: bytemuck::allocation::zeroed_vec(n),
            },
            KvType::F32 => Store::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
        };
        KvCache {
            n_layer,
            n_ctx,
            n_head_kv,
            head_dim,
            store,
        }
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
    pub fn ty(&self) -> KvType {
        match self.store {
            Store::F16 { .. } => KvType::F16,
            Store::F32 { .. } => KvType::F32,
        }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        2 * self.n_layer * self.n_ctx * self.kv_dim() * self.ty().bytes()
    }

    /// Where head `g` of layer `l` at position `pos` starts.
    fn at(&self, l: usize, g: usize, pos: usize) -> usize {
        ((l * self.n_head_kv + g) * self.n_ctx + pos) * self.head_dim
    }

    /// The element ranges of positions `pos0..pos0 + n` of layer `l`, head by head, each with
    /// its offset in those positions' `kv_dim`-wide rows (the snapshot's order).
    fn head_runs(&self, l: usize, pos0: usize, n: usize) -> HeadRuns {
        HeadRuns {
            base: self.at(l, 0, pos0),
            n_ctx: self.n_ctx,
            n_head_kv: self.n_head_kv,
            hd: self.head_dim,
            i: 0,
            n: n * self.n_head_kv,
        }
    }

    /// Appends the little-endian bytes of positions `range` in the snapshot record order: for
    /// each layer, its K rows then its V rows. `range` must lie within `0..n_ctx`.
    pub fn write_rows(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        assert!(range.start <= range.end && range.end <= self.n_ctx);
        out.reserve(self.rows_bytes(range.len()));
        for l in 0..self.n_layer {
            match &self.store {
                Store::F16 { k, v } => {
                    for x in [k, v] {
                        for (_, r) in self.head_runs(l, range.start, range.len()) {
                            out.extend_from_slice(&le_bytes(&x[r]));
                        }
                    }
                }
                Store::F32 { k, v } => {
                    for x in [k, v] {
                        for (_, r) in self.head_runs(l, range.start, range.len()) {
                            out.extend_from_slice(&le_bytes(&x[r]));
                        }
                    }
                }
            }
        }
    }

    /// Bytes [`KvCache::write_rows`] produces for `n` positions.
    pub fn rows_bytes(&self, n: usize) -> usize {
        2 * self.n_layer * n * self.kv_dim() * self.ty().bytes()
    }

    /// The inverse of [`KvCache::write_rows`]: stores `bytes` as positions `first..first + n`.
    /// Returns `false` (and changes nothing) when the length does not match whole positions
    /// or the positions do not fit the context.
    pub fn read_rows(&mut self, first: usize, bytes: &[u8]) -> bool {
        let per_pos = self.rows_bytes(1);
        if per_pos == 0 || !bytes.len().is_multiple_of(per_pos) {
            return false;
        }
        let n = bytes.len() / per_pos;
        if first.checked_add(n).is_none_or(|end| end > self.n_ctx) {
            return false;
        }
        let eb = self.ty().bytes();
        let layer_bytes = n * self.kv_dim() * eb;
        for l in 0..self.n_layer {
            let kb = &bytes[2 * l * layer_bytes..(2 * l + 1) * layer_bytes];
            let vb = &bytes[(2 * l + 1) * layer_bytes..(2 * l + 2) * layer_bytes];
            let runs = self.head_runs(l, first, n);
            match &mut self.store {
                Store::F16 { k, v } => {
                    for (x, b) in [(k, kb), (v, vb)] {
                        for (at, r) in runs.clone() {
                            set_from_le(&mut x[r.clone()], &b[at * eb..(at + r.len()) * eb]);
                        }
                    }
                }
                Store::F32 { k, v } => {
                    for (x, b) in [(k, kb), (v, vb)] {
                        for (at, r) in runs.clone() {
                            set_from_le(&mut x[r.clone()], &b[at * eb..(at + r.len()) * eb]);
                        }
                    }
                }
            }
        }
        true
    }

    /// Copies positions `0..n` of every layer from `src`, a cache of the same layers, width and
    /// type (its context may differ): how a cached prefix is handed to a session. Returns
    /// `false` (and changes nothing) when the shapes differ or `n` exceeds either context.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> bool {
        if (src.n_layer, src.n_head_kv, src.head_dim, src.ty())
            != (self.n_layer, self.n_head_kv, self.head_dim, self.ty())
            || n > src.n_ctx
            || n > self.n_ctx
        {
            return false;
        }
        let len = n * self.head_dim;
        for l in 0..self.n_layer {
            for g in 0..self.n_head_kv {
                let (d, s) = (self.at(l, g, 0), src.at(l, g, 0));
                match (&mut self.store, &src.store) {
                    (Store::F16 { k, v }, Store::F16 { k: sk, v: sv }) => {
                        k[d..d + len].copy_from_slice(&sk[s..s + len]);
                        v[d..d + len].copy_from_slice(&sv[s..s + len]);
                    }
                    (Store::F32 { k, v }, Store::F32 { k: sk, v: sv }) => {
                        k[d..d + len].copy_from_slice(&sk[s..s + len]);
                        v[d..d + len].copy_from_slice(&sv[s..s + len]);
                    }
                    _ => unreachable!("types compared above"),
                }
            }
        }
        true
    }

    /// Writes the key and value rows of layer `l` at `pos`.
    pub fn store(&mut self, k: &Kernels, l: usize, pos: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        for g in 0..self.n_head_kv {
            let a = self.at(l, g, pos);
            let (kh, vh) = (&key[g * hd..(g + 1) * hd], &value[g * hd..(g + 1) * hd]);
            match &mut self.store {
                Store::F16 { k: kc, v: vc } => {
                    (k.f32_to_f16_row)(kh, &mut kc[a..a + hd]);
                    (k.f32_to_f16_row)(vh, &mut vc[a..a + hd]);
                }
                Store::F32 { k: kc, v: vc } => {
                    kc[a..a + hd].copy_from_slice(kh);
                    vc[a..a + hd].copy_from_slice(vh);
                }
            }
        }
    }

    /// Starts loading, for every KV head of layer `l`, the keys and values attention will read
    /// for a token at `pos` (positions `0..=pos`, at most `max_bytes` of each run: the
    /// hardware prefetchers follow from there) and the row the token's own K/V will be stored
    /// into. A hint: called before the layer's first product, the memory latency of these
    /// scattered starts overlaps that product's streaming.
    pub fn prefetch(&self, l: usize, pos: usize, max_bytes: usize) {
        for (run, own) in self.prefetch_runs(l, pos) {
            match &self.store {
                Store::F16 { k, v } => {
                    for x in [k, v] {
                        hint::prefetch(&x[run.clone()], max_bytes);
                        hint::prefetch(&x[own.clone()], usize::MAX);
                    }
                }
                Store::F32 { k, v } => {
                    for x in [k, v] {
                        hint::prefetch(&x[run.clone()], max_bytes);
                        hint::prefetch(&x[own.clone()], usize::MAX);
                    }
                }
            }
        }
    }

    /// The element ranges [`KvCache::prefetch`] hints, head by head: positions `0..=pos` of
    /// the head's run, and position `pos` alone. None for a layer or position outside the
    /// cache.
    fn prefetch_runs(
        &self,
        l: usize,
        pos: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> + '_ {
        let heads = if l < self.n_layer && pos < self.n_ctx {
            0..self.n_head_kv
        } else {
            0..0
        };
        heads.map(move |g| {
            let own = self.at(l, g, pos)..self.at(l, g, pos) + self.head_dim;
            (self.at(l, g, 0)..own.end, own)
        })
    }

    /// The scores of the query heads `q` (`heads × head_dim`) that share KV head `g`:
    /// `out[h·n + j] = scale · q_h · K[l][first + j][g]` for `j in 0..n`,
    /// `n = out.len() / heads` (`first` > 0: a sliding window's oldest position).
    #[allow(clippy::too_many_arguments)] // a kernel's operands
    pub fn scores(
        &self,
        k: &Kernels,
        l: usize,
        g: usize,
        first: usize,
        q: &[f32],
        scale: f32,
        out: &mut [f32],
    ) {
        let hd = self.head_dim;
        let heads = q.len() / hd;
        let n = out.len() / heads.max(1);
        let a = self.at(l, g, first);
        let r = a..a + n * hd;
        match &self.store {
            Store::F16 { k: kc, .. } => (k.scores_f16)(&kc[r], hd, q, heads, scale, out),
            Store::F32 { k: kc, .. } => {
                for (qh, oh) in q.chunks_exact(hd).zip(out.chunks_exact_mut(n.max(1))) {
                    for (s, row) in oh.iter_mut().zip(kc[r.clone()].chunks_exact(hd)) {
                        *s = (k.dot_f32)(row, qh) * scale;
                    }
                }
            }
        }
    }

    /// `out_h += Σ_j p[h·n + j] · V[l][first + j][g]` for the query heads sharing KV head `g`
    /// (`out`: `heads × head_dim`, `n = p.len() / heads`).
    pub fn mix_values(
        &self,
        k: &Kernels,
        l: usize,
        g: usize,
        first: usize,
        p: &[f32],
        out: &mut [f32],
    ) {
        let hd = self.head_dim;
        let heads = out.len() / hd;
        let n = p.len() / heads.max(1);
        let a = self.at(l, g, first);
        let r = a..a + n * hd;
        match &self.store {
            Store::F16 { v: vc, .. } => (k.mix_f16)(&vc[r], hd, p, heads, out),
            Store::F32 { v: vc, .. } => {
                for (ph, oh) in p.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(hd)) {
                    for (&w, row) in ph.iter().zip(vc[r.clone()].chunks_exact(hd)) {
                        (k.axpy_f32)(oh, w, row);
                    }
                }
            }
        }
    }
}

/// See [`KvCache::head_runs`]: an iterator that borrows nothing, so the store can be written
/// while it runs.
#[derive(Clone)]
struct HeadRuns {
    base: usize,
    n_ctx: usize,
    n_head_kv: usize,
    hd: usize,
    i: usize,
    n: usize,
}

impl Iterator for HeadRuns {
    type Item = (usize, std::ops::Range<usize>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.i == self.n {
            return None;
        }
        let (j, g) = (self.i / self.n_head_kv, self.i % self.n_head_kv);
        self.i += 1;
        let a = self.base + (g * self.n_ctx + j) * self.hd;
        Some(((self.i - 1) * self.hd, a..a + self.hd))
    }
}

/// An element of the cache, stored little-endian in snapshots.
trait LeElem: bytemuck::Pod {
    fn swap_bytes(self) -> Self;
}
impl LeElem for f16 {
    fn swap_bytes(self) -> f16 {
        f16::from_bits(self.to_bits().swap_bytes())
    }
}
impl LeElem for f32 {
    fn swap_bytes(self) -> f32 {
        f32::from_bits(self.to_bits().swap_bytes())
    }
}

/// The little-endian bytes of `xs`: the memory itself on a little-endian CPU (every target
/// we ship), a swapped copy elsewhere. A restart restores 23 MB of rows for a 1000-token
/// prompt, so this is a copy, not a loop over elements.
fn le_bytes<T: LeElem>(xs: &[T]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(xs))
    } else {
        let swapped: Vec<T> = xs.iter().map(|x| x.swap_bytes()).collect();
        std::borrow::Cow::Owned(bytemuck::cast_slice(&swapped).to_vec())
    }
}

/// The inverse of [`le_bytes`]: `xs` from `bytes` (`size_of_val(xs)` long).
fn set_from_le<T: LeElem>(xs: &mut [T], bytes: &[u8]) {
    // Cast the destination (always aligned), not the source (a byte buffer of any alignment).
    bytemuck::cast_slice_mut::<T, u8>(xs).copy_from_slice(bytes);
    if cfg!(target_endian = "big") {
        for x in xs {
            *x = x.swap_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kernels_neon::dispatch::REFERENCE;

    const L: usize = 2;
    const HKV: usize = 3;
    const HD: usize = 4;

    /// Key or value element `c` of position `pos` in layer `l`: distinct, exact in f16.
    fn val(kv: usize, l: usize, pos: usize, c: usize) -> f32 {
        (kv * 1000 + l * 100 + pos * 10 + c) as f32 / 8.0
    }

    fn filled(ty: KvType, n_ctx: usize, n: usize) -> KvCache {
        let mut c = KvCache::new(L, n_ctx, HKV, HD, ty);
        for l in 0..L {
            for pos in 0..n {
                let key: Vec<f32> = (0..HKV * HD).map(|i| val(0, l, pos, i)).collect();
                let value: Vec<f32> = (0..HKV * HD).map(|i| val(1, l, pos, i)).collect();
                c.store(&REFERENCE, l, pos, &key, &value);
            }
        }
        c
    }

    /// A prefetch hints, for every layer, position and head, exactly the keys and values
    /// attention reads for a token there (positions `0..=pos` of that head) and the token's
    /// own row, and nothing for a layer or position outside the cache. Checked through the
    /// contents: every element hinted must be the value `filled` stored for that head and
    /// position, so a range one row long or short, or in another head's run, fails. (That a
    /// prefetch changes nothing is the borrow checker's: it takes `&self`.)
    #[test]
    fn prefetch_hints_the_rows_attention_reads_and_nothing_else() {
        for ty in [KvType::F32, KvType::F16] {
            let n_ctx = 7;
            let c = filled(ty, n_ctx, n_ctx);
            let (k, v): (Vec<f32>, Vec<f32>) = match &c.store {
                Store::F16 { k, v } => (
                    k.iter().map(|x| x.to_f32()).collect(),
                    v.iter().map(|x| x.to_f32()).collect(),
                ),
                Store::F32 { k, v } => (k.clone(), v.clone()),
            };
            for l in 0..L + 2 {
                for pos in 0..n_ctx + 2 {
                    for cap in [0, 1, 63, 64, 8 << 10, usize::MAX] {
                        c.prefetch(l, pos, cap);
                    }
                    let runs: Vec<_> = c.prefetch_runs(l, pos).collect();
                    if l >= L || pos >= n_ctx {
                        assert!(runs.is_empty(), "{ty} l={l} pos={pos}: outside the cache");
                        continue;
                    }
                    assert_eq!(runs.len(), HKV, "{ty} l={l} pos={pos}: one run per head");
                    for (g, (run, own)) in runs.into_iter().enumerate() {
                        let what = format!("{ty} l={l} pos={pos} head {g}");
                        let want = |kv, positions: std::ops::RangeInclusive<usize>| {
                            positions
                                .flat_map(|j| (0..HD).map(move |i| val(kv, l, j, g * HD + i)))
                                .collect::<Vec<f32>>()
                        };
                        assert_eq!(k[run.clone()], want(0, 0..=pos), "{what}: keys read");
                        assert_eq!(v[run], want(1, 0..=pos), "{what}: values read");
                        assert_eq!(k[own.clone()], want(0, pos..=pos), "{what}: own key row");
                        assert_eq!(v[own], want(1, pos..=pos), "{what}: own value row");
                    }
                }
            }
        }
    }

    /// The snapshot's rows stay position-major whatever the layout in RAM: per layer, the K
    /// rows of the range (each `kv_dim` wide, heads in order), then its V rows.
    #[test]
    fn snapshot_rows_are_position_major_per_layer() {
        for ty in [KvType::F32, KvType::F16] {
            let c = filled(ty, 6, 5);
            let mut got = Vec::new();
            c.write_rows(1..4, &mut got);
            let mut want = Vec::new();
            for l in 0..L {
                for kv in 0..2 {
                    for pos in 1..4 {
                        for i in 0..HKV * HD {
                            let x = val(kv, l, pos, i);
                            match ty {
                                KvType::F32 => want.extend_from_slice(&x.to_le_bytes()),
                                KvType::F16 => {
                                    want.extend_from_slice(&f16::from_f32(x).to_le_bytes())
                                }
                            }
                        }
                    }
                }
            }
            assert_eq!(got, want, "{ty}");
            assert_eq!(got.len(), c.rows_bytes(3));

            // Read back at another offset of a cache with another context: the same rows.
            let mut d = KvCache::new(L, 9, HKV, HD, ty);
            assert!(d.read_rows(4, &got));
            let mut again = Vec::new();
            d.write_rows(4..7, &mut again);
            assert_eq!(again, want, "{ty} after read_rows");
            assert!(!d.read_rows(7, &got), "positions past the context");
            assert!(!d.read_rows(0, &got[1..]), "not whole positions");
        }
    }

    /// A head attends over its own keys and values, position by position.
    #[test]
    fn scores_and_mix_read_the_head_they_are_asked_for() {
        // `first` > 0 is a sliding window: positions first..5 only.
        for (ty, first) in [
            (KvType::F32, 0),
            (KvType::F16, 0),
            (KvType::F32, 2),
            (KvType::F16, 3),
        ] {
            let c = filled(ty, 7, 5);
            let n = 5 - first;
            let q = [1.0, -2.0, 0.5, 0.25];
            let p = &[0.1, 0.2, 0.3, 0.15, 0.25][..n];
            for l in 0..L {
                for g in 0..HKV {
                    let mut s = vec![0.0f32; n];
                    c.scores(&REFERENCE, l, g, first, &q, 0.5, &mut s);
                    let mut o = [0.0f32; HD];
                    c.mix_values(&REFERENCE, l, g, first, p, &mut o);
                    for (j, &sp) in s.iter().enumerate() {
                        let pos = first + j;
                        let k: Vec<f32> = (0..HD).map(|i| val(0, l, pos, g * HD + i)).collect();
                        let dot: f32 = k.iter().zip(&q).map(|(a, b)| a * b).sum();
                        assert_eq!(sp, dot * 0.5, "{ty} l={l} g={g} pos={pos}");
                    }
                    // Two query heads of a group at once: each gets what it gets alone.
                    let q2: Vec<f32> = q.iter().chain(&q.map(|x| -3.0 * x)).copied().collect();
                    let mut s2 = vec![0.0f32; 2 * n];
                    c.scores(&REFERENCE, l, g, first, &q2, 0.5, &mut s2);
                    let mut alone = vec![0.0f32; n];
                    c.scores(&REFERENCE, l, g, first, &q2[HD..], 0.5, &mut alone);
                    assert_eq!((&s2[..n], &s2[n..]), (&s[..], &alone[..]), "{ty} scores x2");
                    let p2: Vec<f32> = p
                        .iter()
                        .chain(&p.iter().map(|x| x / 2.0).collect::<Vec<_>>())
                        .copied()
                        .collect();
                    let mut o2 = [0.0f32; 2 * HD];
                    c.mix_values(&REFERENCE, l, g, first, &p2, &mut o2);
                    let mut alone = [0.0f32; HD];
                    c.mix_values(&REFERENCE, l, g, first, &p2[n..], &mut alone);
                    assert_eq!((&o2[..HD], &o2[HD..]), (&o[..], &alone[..]), "{ty} mix x2");
                    for (i, &oi) in o.iter().enumerate() {
                        let mut want = 0.0f32;
                        for (j, &w) in p.iter().enumerate() {
                            want += w * val(1, l, first + j, g * HD + i);
                        }
                        assert_eq!(oi, want, "{ty} l={l} g={g} [{i}]");
                    }
                }
            }
        }
    }

    /// A prefix handed to a cache of another context keeps every head's rows.
    #[test]
    fn copy_prefix_keeps_rows_across_contexts() {
        let src = filled(KvType::F16, 5, 5);
        let mut dst = KvCache::new(L, 8, HKV, HD, KvType::F16);
        assert!(dst.copy_prefix_from(&src, 4));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        src.write_rows(0..4, &mut a);
        dst.write_rows(0..4, &mut b);
        assert_eq!(a, b);
        assert!(!dst.copy_prefix_from(&src, 6), "more than the source holds");
        let other = KvCache::new(L, 8, HKV + 1, HD, KvType::F16);
        assert!(!dst.copy_prefix_from(&other, 1), "another width");
    }
}
