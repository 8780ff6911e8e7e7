//! The in-RAM KV cache, allocated once for the configured context. f16 by default (as
//! llama.cpp), f32 on request.
//!
//! Laid out `(layer, kv head, position, head_dim)`: the keys (or values) one head attends over
//! are one contiguous run, which the hardware prefetchers stream. (Position-major rows made a
//! head's reads a stride of `kv_dim` with 1/`n_head_kv` of each row used: latency-bound.)
//! Snapshots keep position-major rows (`kv_dim` elements in head order), so their format does
//! not depend on this choice. Sliding-window layers hold a ring of their recent positions
//! (see [`KvCache`]).

pub use super::elem::KvType;
use super::elem::{HeadRuns, le_bytes, set_from_le};
use kernels_neon::{Kernels, f16, hint};

/// The cache's K and V elements, in the type the configuration chose.
enum KvBuffers {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// Sliding-window attention as the cache sees it: which layers attend only to their last
/// `size` positions (the query's own included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub size: usize,
    /// Layer `l` slides iff `l % pattern < pattern - 1` (ggml's standard pattern: one global
    /// layer in every `pattern`).
    pub pattern: usize,
}

impl Window {
    pub fn slides(&self, l: usize) -> bool {
        self.pattern > 0 && l % self.pattern < self.pattern - 1
    }

    /// How many of `n_layer` layers slide (0 without a window).
    pub fn sliding_layers(window: Option<Window>, n_layer: usize) -> usize {
        window.map_or(0, |w| (0..n_layer).filter(|&l| w.slides(l)).count())
    }
}

/// Slots of a sliding layer's ring and the positions a shift keeps, for a context of `n_ctx`
/// and batches of at most `max_batch` positions. `keep` is the window minus one (what the
/// next token attends to) plus a window of slack, so that a session rewound by up to a window
/// (a chat template rendered again) goes on without recomputing; the gap above it, at least
/// one batch, is how often the ring shifts. Without a window (or when the ring would be no
/// shorter), `n_ctx` slots: a position's slot is the position.
pub fn ring_shape(n_ctx: usize, window: Option<Window>, max_batch: usize) -> (usize, usize) {
    match window {
        Some(w) if w.size > 0 => {
            let keep = w.size.saturating_mul(2) - 1;
            let gap = max_batch.max(w.size / 2).max(1);
            let ring = n_ctx.min(keep.saturating_add(gap));
            (ring, keep.min(ring))
        }
        _ => (n_ctx, n_ctx),
    }
}

/// Keys and values of every layer for positions `0..n_ctx`; a sliding-window layer holds only
/// a ring of its most recent positions.
///
/// The ring: slot = position − `base`, one `base` for every sliding layer (they are written
/// by the same forward passes). When a batch would run past the ring's end, the last `keep`
/// positions move to its start, one `memmove` per head every `ring − keep` positions, so
/// attention still reads one contiguous run in position order and gives bit for bit what a
/// cache of every position gives. (A modulo ring would split the run in two and sum in
/// another order.) Gemma 3 270M at 32k positions: 15 of its 18 layers hold 1279 slots, not
/// 32768.
pub struct KvCache {
    n_layer: usize,
    n_ctx: usize,
    n_head_kv: usize,
    head_dim: usize,
    window: Option<Window>,
    /// Slots of a sliding layer (`n_ctx` without a window).
    ring: usize,
    /// Positions kept when the ring shifts.
    keep: usize,
    /// The position in slot 0 of every sliding layer: the oldest one they hold.
    base: usize,
    /// Element offset of each layer's run, and the total.
    offsets: Vec<usize>,
    buffers: KvBuffers,
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
        KvCache::with_window(n_layer, n_ctx, n_head_kv, head_dim, ty, None, 1)
    }

    /// As [`KvCache::new`], with the sliding layers of `window` in rings (see
    /// [`ring_shape`]) for forward passes of at most `max_batch` positions.
    pub fn with_window(
        n_layer: usize,
        n_ctx: usize,
        n_head_kv: usize,
        head_dim: usize,
        ty: KvType,
        window: Option<Window>,
        max_batch: usize,
    ) -> KvCache {
        let (ring, keep) = ring_shape(n_ctx, window, max_batch);
        let kv_dim = n_head_kv * head_dim;
        let mut offsets = Vec::with_capacity(n_layer + 1);
        let mut n = 0;
        for l in 0..n_layer {
            offsets.push(n);
            let slides = window.is_some_and(|w| w.slides(l));
            n += if slides { ring } else { n_ctx } * kv_dim;
        }
        offsets.push(n);
        // Zeroed allocations (calloc): the kernel backs pages on first write, so a cache sized
        // for a long context costs RAM only for the positions a conversation reaches.
        let buffers = match ty {
            KvType::F16 => KvBuffers::F16 {
                k: bytemuck::allocation::zeroed_vec(n),
                v: bytemuck::allocation::zeroed_vec(n),
            },
            KvType::F32 => KvBuffers::F32 {
                k: vec![0.0; n],
                v: vec![0.0; n],
            },
        };
        KvCache {
            n_layer,
            n_ctx,
            n_head_kv,
            head_dim,
            window,
            ring,
            keep,
            base: 0,
            offsets,
            buffers,
        }
    }

    /// Bytes [`KvCache::with_window`] would allocate, without allocating them; `None` on
    /// overflow.
    pub fn bytes_for(
        n_layer: usize,
        n_ctx: usize,
        kv_dim: usize,
        ty: KvType,
        window: Option<Window>,
        max_batch: usize,
    ) -> Option<u64> {
        let (ring, _) = ring_shape(n_ctx, window, max_batch);
        let sliding = Window::sliding_layers(window, n_layer);
        let slots = ((n_layer - sliding) as u64)
            .checked_mul(n_ctx as u64)?
            .checked_add((sliding as u64).checked_mul(ring as u64)?)?;
        slots
            .checked_mul(2 * kv_dim as u64)?
            .checked_mul(ty.bytes() as u64)
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
        match self.buffers {
            KvBuffers::F16 { .. } => KvType::F16,
            KvBuffers::F32 { .. } => KvType::F32,
        }
    }
    pub fn window(&self) -> Option<Window> {
        self.window
    }
    /// Slots of a sliding layer's ring (`n_ctx` without a window).
    pub fn ring(&self) -> usize {
        self.ring
    }
    /// The oldest position the sliding layers hold (0 without a window).
    pub fn window_base(&self) -> usize {
        self.base
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        2 * self.offsets[self.n_layer] * self.ty().bytes()
    }

    fn slides(&self, l: usize) -> bool {
        self.window.is_some_and(|w| w.slides(l))
    }

    /// Slots of layer `l`.
    fn slots(&self, l: usize) -> usize {
        if self.slides(l) {
            self.ring
        } else {
            self.n_ctx
        }
    }

    /// Where head `g` of layer `l` at position `pos` starts.
    fn at(&self, l: usize, g: usize, pos: usize) -> usize {
        let (slots, slot) = if self.slides(l) {
            (self.ring, pos - self.base)
        } else {
            (self.n_ctx, pos)
        };
        debug_assert!(slot < slots, "layer {l} position {pos}: outside the cache");
        self.offsets[l] + (g * slots + slot) * self.head_dim
    }

    /// Whether a session can keep its first `m` positions and go on from there: always,
    /// except when the sliding layers no longer hold the positions the token at `m` attends
    /// to (they were shifted out of the ring). Then only starting again from 0 is right.
    pub fn can_keep(&self, m: usize) -> bool {
        match self.window {
            Some(w) if m > 0 && self.base > 0 => self.base + w.size <= m + 1,
            _ => true,
        }
    }

    /// Makes room for a forward pass writing positions `p0..p0 + n` after positions
    /// `0..p0` (which [`KvCache::can_keep`] allows): shifts the rings when they would overflow.
    /// From position 0 the rings start again empty.
    pub fn make_room(&mut self, p0: usize, n: usize) {
        if p0 == 0 {
            self.base = 0;
        }
        debug_assert!(self.can_keep(p0), "position {p0} is no longer in the ring");
        self.shift_for(p0, n);
    }

    /// The shift of [`KvCache::make_room`], also for rows read from a snapshot (which
    /// [`KvCache::can_keep`] checks only once they are all read).
    fn shift_for(&mut self, p0: usize, n: usize) {
        if self.window.is_none() || p0 + n <= self.base + self.ring {
            return;
        }
        assert!(
            n <= self.ring,
            "a batch of {n} positions overflows the ring"
        );
        let keep = self.keep.min(self.ring - n).min(p0 - self.base);
        let from = p0 - keep - self.base;
        let len = keep * self.head_dim;
        let w = self.window;
        for l in (0..self.n_layer).filter(|&l| w.is_some_and(|w| w.slides(l))) {
            for g in 0..self.n_head_kv {
                let a = self.offsets[l] + g * self.ring * self.head_dim;
                let src = a + from * self.head_dim..a + from * self.head_dim + len;
                match &mut self.buffers {
                    KvBuffers::F16 { k, v } => {
                        k.copy_within(src.clone(), a);
                        v.copy_within(src, a);
                    }
                    KvBuffers::F32 { k, v } => {
                        k.copy_within(src.clone(), a);
                        v.copy_within(src, a);
                    }
                }
            }
        }
        self.base = p0 - keep;
    }

    /// The element ranges of positions `pos0..pos0 + n` of layer `l`, head by head, each with
    /// its offset in those positions' `kv_dim`-wide rows (the snapshot's order).
    fn head_runs(&self, l: usize, pos0: usize, n: usize) -> HeadRuns {
        HeadRuns {
            // An empty run may start one past the last slot.
            base: if n == 0 { 0 } else { self.at(l, 0, pos0) },
            slots: self.slots(l),
            n_head_kv: self.n_head_kv,
            hd: self.head_dim,
            i: 0,
            n: n * self.n_head_kv,
        }
    }

    /// The positions of `range` whose rows layer `l` holds: all of them, or on a sliding
    /// layer those from the ring's base.
    fn held(&self, l: usize, range: &std::ops::Range<usize>) -> std::ops::Range<usize> {
        if self.slides(l) {
            range.start.max(self.base).min(range.end)..range.end
        } else {
            range.clone()
        }
    }

    /// Appends the little-endian bytes of positions `range` in the snapshot record order: for
    /// each layer, its K rows then its V rows; a sliding layer's rows only from its ring's base
    /// on. Returns how many positions the sliding layers wrote (the record's window rows).
    /// `range` must lie within `0..n_ctx` and its positions must have been computed.
    pub fn write_rows(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) -> usize {
        assert!(range.start <= range.end && range.end <= self.n_ctx);
        let window_rows = range.end - range.start.max(self.base).min(range.end);
        out.reserve(self.rows_bytes(range.len(), window_rows));
        for l in 0..self.n_layer {
            let r = self.held(l, &range);
            match &self.buffers {
                KvBuffers::F16 { k, v } => {
                    for x in [k, v] {
                        for (_, h) in self.head_runs(l, r.start, r.len()) {
                            out.extend_from_slice(&le_bytes(&x[h]));
                        }
                    }
                }
                KvBuffers::F32 { k, v } => {
                    for x in [k, v] {
                        for (_, h) in self.head_runs(l, r.start, r.len()) {
                            out.extend_from_slice(&le_bytes(&x[h]));
                        }
                    }
                }
            }
        }
        window_rows
    }

    /// Bytes [`KvCache::write_rows`] produces for `n` positions of which the sliding layers
    /// hold the last `window_rows`.
    pub fn rows_bytes(&self, n: usize, window_rows: usize) -> usize {
        let per_row = self.kv_dim() * self.ty().bytes();
        (0..self.n_layer)
            .map(|l| 2 * per_row * if self.slides(l) { window_rows } else { n })
            .sum()
    }

    /// The inverse of [`KvCache::write_rows`]: stores `bytes` as positions `first..first + n`
    /// (the sliding layers' rows: the last `window_rows` of them), after positions
    /// `0..first` stored the same way. A sliding layer keeps what fits its ring. Returns
    /// `false` (and changes nothing) when the length does not match or the positions do not
    /// fit the context.
    pub fn read_rows(&mut self, first: usize, n: usize, window_rows: usize, bytes: &[u8]) -> bool {
        if n == 0
            || window_rows > n
            || bytes.len() != self.rows_bytes(n, window_rows)
            || first.checked_add(n).is_none_or(|end| end > self.n_ctx)
        {
            return false;
        }
        let end = first + n;
        // The sliding layers: rows of positions `w0..end`, of which the ring takes the last.
        let w0 = end - window_rows;
        let skip = window_rows.saturating_sub(self.ring);
        if self.window.is_some() {
            if first == 0 || window_rows < n || skip > 0 {
                // Nothing held before connects to these rows: the ring starts with them.
                self.base = w0 + skip;
            } else {
                self.shift_for(w0, window_rows);
            }
        }
        let eb = self.ty().bytes();
        let row = self.kv_dim() * eb;
        let mut at = 0;
        for l in 0..self.n_layer {
            let (p0, rows, skipped) = if self.slides(l) {
                (w0 + skip, window_rows - skip, skip)
            } else {
                (first, n, 0)
            };
            let len = (rows + skipped) * row;
            let kb = &bytes[at + skipped * row..at + len];
            let vb = &bytes[at + len + skipped * row..at + 2 * len];
            at += 2 * len;
            let runs = self.head_runs(l, p0, rows);
            match &mut self.buffers {
                KvBuffers::F16 { k, v } => {
                    for (x, b) in [(k, kb), (v, vb)] {
                        for (o, r) in runs.clone() {
                            set_from_le(&mut x[r.clone()], &b[o * eb..(o + r.len()) * eb]);
                        }
                    }
                }
                KvBuffers::F32 { k, v } => {
                    for (x, b) in [(k, kb), (v, vb)] {
                        for (o, r) in runs.clone() {
                            set_from_le(&mut x[r.clone()], &b[o * eb..(o + r.len()) * eb]);
                        }
                    }
                }
            }
        }
        true
    }

    /// Copies positions `0..n` of every layer from `src`, a cache of the same layers, width,
    /// type and window (its context may differ): how a cached prefix is handed to a session.
    /// Returns `false` (and changes nothing) when the shapes differ, `n` exceeds either context,
    /// or `src` cannot go on from `n` ([`KvCache::can_keep`]).
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> bool {
        if (
            src.n_layer,
            src.n_head_kv,
            src.head_dim,
            src.ty(),
            src.window,
        ) != (
            self.n_layer,
            self.n_head_kv,
            self.head_dim,
            self.ty(),
            self.window,
        ) || n > src.n_ctx
            || n > self.n_ctx
            || !src.can_keep(n)
        {
            return false;
        }
        // The sliding layers take what `src` holds of the positions, as much as fits.
        let lo = src.base.max(n.saturating_sub(self.ring)).min(n);
        self.base = if self.window.is_some() { lo } else { 0 };
        for l in 0..self.n_layer {
            let r = self.held(l, &(0..n));
            let len = r.len() * self.head_dim;
            if len == 0 {
                continue;
            }
            for g in 0..self.n_head_kv {
                let (d, s) = (self.at(l, g, r.start), src.at(l, g, r.start));
                match (&mut self.buffers, &src.buffers) {
                    (KvBuffers::F16 { k, v }, KvBuffers::F16 { k: sk, v: sv }) => {
                        k[d..d + len].copy_from_slice(&sk[s..s + len]);
                        v[d..d + len].copy_from_slice(&sv[s..s + len]);
                    }
                    (KvBuffers::F32 { k, v }, KvBuffers::F32 { k: sk, v: sv }) => {
                        k[d..d + len].copy_from_slice(&sk[s..s + len]);
                        v[d..d + len].copy_from_slice(&sv[s..s + len]);
                    }
                    _ => unreachable!("types compared above"),
                }
            }
        }
        true
    }

    /// Writes the key and value rows of layer `l` at `pos` (after [`KvCache::make_room`]).
    pub fn store(&mut self, k: &Kernels, l: usize, pos: usize, key: &[f32], value: &[f32]) {
        let hd = self.head_dim;
        for g in 0..self.n_head_kv {
            let a = self.at(l, g, pos);
            let (kh, vh) = (&key[g * hd..(g + 1) * hd], &value[g * hd..(g + 1) * hd]);
            match &mut self.buffers {
                KvBuffers::F16 { k: kc, v: vc } => {
                    (k.f32_to_f16_row)(kh, &mut kc[a..a + hd]);
                    (k.f32_to_f16_row)(vh, &mut vc[a..a + hd]);
                }
                KvBuffers::F32 { k: kc, v: vc } => {
                    kc[a..a + hd].copy_from_slice(kh);
                    vc[a..a + hd].copy_from_slice(vh);
                }
            }
        }
    }

    /// Starts loading, for every KV head of layer `l`, the keys and values attention will read
    /// for a token at `pos` (the positions it sees up to `pos`, at most `max_bytes` of each
    /// run: the hardware prefetchers follow from there) and the row the token's own K/V will
    /// be stored into. A hint: called before the layer's first product, the memory latency of
    /// these scattered starts overlaps that product's streaming.
    pub fn prefetch(&self, l: usize, pos: usize, max_bytes: usize) {
        for (run, own) in self.prefetch_runs(l, pos) {
            match &self.buffers {
                KvBuffers::F16 { k, v } => {
                    for x in [k, v] {
                        hint::prefetch(&x[run.clone()], max_bytes);
                        hint::prefetch(&x[own.clone()], usize::MAX);
                    }
                }
                KvBuffers::F32 { k, v } => {
                    for x in [k, v] {
                        hint::prefetch(&x[run.clone()], max_bytes);
                        hint::prefetch(&x[own.clone()], usize::MAX);
                    }
                }
            }
        }
    }

    /// The element ranges [`KvCache::prefetch`] hints, head by head: the positions a token at
    /// `pos` attends to (`0..=pos`, or its window on a sliding layer), and position `pos`
    /// alone. None for a layer or position outside the cache (or the ring).
    fn prefetch_runs(
        &self,
        l: usize,
        pos: usize,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> + '_ {
        let first = match self.window {
            Some(w) if self.slides(l) => (pos + 1).saturating_sub(w.size),
            _ => 0,
        };
        let inside = l < self.n_layer
            && pos < self.n_ctx
            && (!self.slides(l) || (first >= self.base && pos - self.base < self.ring));
        let heads = if inside { 0..self.n_head_kv } else { 0..0 };
        heads.map(move |g| {
            let own = self.at(l, g, pos)..self.at(l, g, pos) + self.head_dim;
            (self.at(l, g, first)..own.end, own)
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
        match &self.buffers {
            KvBuffers::F16 { k: kc, .. } => (k.scores_f16)(&kc[r], hd, q, heads, scale, out),
            KvBuffers::F32 { k: kc, .. } => {
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
        match &self.buffers {
            KvBuffers::F16 { v: vc, .. } => (k.mix_f16)(&vc[r], hd, p, heads, out),
            KvBuffers::F32 { v: vc, .. } => {
                for (ph, oh) in p.chunks_exact(n.max(1)).zip(out.chunks_exact_mut(hd)) {
                    for (&w, row) in ph.iter().zip(vc[r.clone()].chunks_exact(hd)) {
                        (k.axpy_f32)(oh, w, row);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
