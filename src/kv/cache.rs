//! The in-RAM KV cache, laid out flat as `(layer, position, kv_dim)` and allocated once for
//! the configured context. f16 by default (as llama.cpp), f32 on request.

use kernels_neon::{Kernels, f16};
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
    kv_dim: usize,
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
            kv_dim,
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
        self.kv_dim
    }
    pub fn ty(&self) -> KvType {
        match self.store {
            Store::F16 { .. } => KvType::F16,
            Store::F32 { .. } => KvType::F32,
        }
    }

    /// Bytes held by the cache.
    pub fn bytes(&self) -> usize {
        2 * self.n_layer * self.n_ctx * self.kv_dim * self.ty().bytes()
    }

    fn row(&self, l: usize, pos: usize) -> std::ops::Range<usize> {
        let start = (l * self.n_ctx + pos) * self.kv_dim;
        start..start + self.kv_dim
    }

    /// Appends the little-endian bytes of positions `range` in the snapshot record order: for
    /// each layer, its K rows then its V rows. `range` must lie within `0..n_ctx`.
    pub fn write_rows(&self, range: std::ops::Range<usize>, out: &mut Vec<u8>) {
        assert!(range.start <= range.end && range.end <= self.n_ctx);
        out.reserve(self.rows_bytes(range.len()));
        for l in 0..self.n_layer {
            let a = self.row(l, range.start).start;
            let b = a + range.len() * self.kv_dim;
            match &self.store {
                Store::F16 { k, v } => {
                    out.extend_from_slice(&le_bytes(&k[a..b]));
                    out.extend_from_slice(&le_bytes(&v[a..b]));
                }
                Store::F32 { k, v } => {
                    out.extend_from_slice(&le_bytes(&k[a..b]));
                    out.extend_from_slice(&le_bytes(&v[a..b]));
                }
            }
        }
    }

    /// Bytes [`KvCache::write_rows`] produces for `n` positions.
    pub fn rows_bytes(&self, n: usize) -> usize {
        2 * self.n_layer * n * self.kv_dim * self.ty().bytes()
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
        let layer_bytes = n * self.kv_dim * eb;
        for l in 0..self.n_layer {
            let a = self.row(l, first).start;
            let b = a + n * self.kv_dim;
            let kb = &bytes[2 * l * layer_bytes..(2 * l + 1) * layer_bytes];
            let vb = &bytes[(2 * l + 1) * layer_bytes..(2 * l + 2) * layer_bytes];
            match &mut self.store {
                Store::F16 { k, v } => {
                    set_from_le(&mut k[a..b], kb);
                    set_from_le(&mut v[a..b], vb);
                }
                Store::F32 { k, v } => {
                    set_from_le(&mut k[a..b], kb);
                    set_from_le(&mut v[a..b], vb);
                }
            }
        }
        true
    }

    /// Copies positions `0..n` of every layer from `src`, a cache of the same layers, width and
    /// type (its context may differ): how a cached prefix is handed to a session. Returns
    /// `false` (and changes nothing) when the shapes differ or `n` exceeds either context.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> bool {
        if (src.n_layer, src.kv_dim, src.ty()) != (self.n_layer, self.kv_dim, self.ty())
            || n > src.n_ctx
            || n > self.n_ctx
        {
            return false;
        }
        for l in 0..self.n_layer {
            let (d, s) = (self.row(l, 0).start, src.row(l, 0).start);
            let len = n * self.kv_dim;
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
        true
    }

    /// Writes the key and value rows of layer `l` at `pos`.
    pub fn store(&mut self, k: &Kernels, l: usize, pos: usize, key: &[f32], value: &[f32]) {
        let r = self.row(l, pos);
        match &mut self.store {
            Store::F16 { k: kc, v: vc } => {
                (k.f32_to_f16_row)(key, &mut kc[r.clone()]);
                (k.f32_to_f16_row)(value, &mut vc[r]);
            }
            Store::F32 { k: kc, v: vc } => {
                kc[r.clone()].copy_from_slice(key);
                vc[r].copy_from_slice(value);
            }
        }
    }

    /// `out[j] = scale · q · K[l][j][head g]` for positions `j in 0..out.len()`.
    pub fn scores(&self, k: &Kernels, l: usize, g: usize, q: &[f32], scale: f32, out: &mut [f32]) {
        let hd = self.head_dim;
        let off = g * hd;
        for (j, s) in out.iter_mut().enumerate() {
            let r = self.row(l, j);
            let d = match &self.store {
                Store::F16 { k: kc, .. } => (k.dot_f16)(&kc[r.start + off..r.start + off + hd], q),
                Store::F32 { k: kc, .. } => (k.dot_f32)(&kc[r.start + off..r.start + off + hd], q),
            };
            *s = d * scale;
        }
    }

    /// `out += Σ_j p[j] · V[l][j][head g]`.
    pub fn mix_values(&self, k: &Kernels, l: usize, g: usize, p: &[f32], out: &mut [f32]) {
        let hd = self.head_dim;
        let off = g * hd;
        for (j, &w) in p.iter().enumerate() {
            let r = self.row(l, j);
            match &self.store {
                Store::F16 { v: vc, .. } => {
                    (k.axpy_f16)(out, w, &vc[r.start + off..r.start + off + hd])
                }
                Store::F32 { v: vc, .. } => {
                    (k.axpy_f32)(out, w, &vc[r.start + off..r.start + off + hd])
                }
            }
        }
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
