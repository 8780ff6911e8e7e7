//! The cache's element type and the byte order of its rows in snapshots: split from
//! `cache.rs`.

use kernels_neon::f16;
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

/// See [`KvCache::head_runs`]: an iterator that borrows nothing, so the store can be written
/// while it runs.
#[derive(Clone)]
pub(super) struct HeadRuns {
    pub(super) base: usize,
    /// Slots of the layer: one head's run.
    pub(super) slots: usize,
    pub(super) n_head_kv: usize,
    pub(super) hd: usize,
    pub(super) i: usize,
    pub(super) n: usize,
}

impl Iterator for HeadRuns {
    type Item = (usize, std::ops::Range<usize>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.i == self.n {
            return None;
        }
        let (j, g) = (self.i / self.n_head_kv, self.i % self.n_head_kv);
        self.i += 1;
        let a = self.base + (g * self.slots + j) * self.hd;
        Some(((self.i - 1) * self.hd, a..a + self.hd))
    }
}

/// An element of the cache, stored little-endian in snapshots.
pub(super) trait LeElem: bytemuck::Pod {
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
pub(super) fn le_bytes<T: LeElem>(xs: &[T]) -> std::borrow::Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        std::borrow::Cow::Borrowed(bytemuck::cast_slice(xs))
    } else {
        let swapped: Vec<T> = xs.iter().map(|x| x.swap_bytes()).collect();
        std::borrow::Cow::Owned(bytemuck::cast_slice(&swapped).to_vec())
    }
}

/// The inverse of [`le_bytes`]: `xs` from `bytes` (`size_of_val(xs)` long).
pub(super) fn set_from_le<T: LeElem>(xs: &mut [T], bytes: &[u8]) {
    // Cast the destination (always aligned), not the source (a byte buffer of any alignment).
    bytemuck::cast_slice_mut::<T, u8>(xs).copy_from_slice(bytes);
    if cfg!(target_endian = "big") {
        for x in xs {
            *x = x.swap_bytes();
        }
    }
}
