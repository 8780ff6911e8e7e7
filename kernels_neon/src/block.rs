//! ggml block formats, byte for byte (`ggml-common.h`), so that GGUF tensor data can be
//! viewed in place as `&[BlockQ4_0]` etc. and kernels can be held next to upstream.
//!
//! Every block is `#[repr(C)]`, contains only `u8`/`i8`/`f16` fields (alignment 2, no padding)
//! and is `bytemuck::Pod`, so a byte slice from an mmapped file can be cast without a copy once
//! its length and 2-byte alignment have been checked.

use bytemuck::{Pod, Zeroable};
pub use half::f16;
use std::mem::size_of;

/// Weights per Q4_0 block.
pub const QK4_0: usize = 32;
/// Weights per Q4_1 block.
pub const QK4_1: usize = 32;
/// Values per Q8_0 block.
pub const QK8_0: usize = 32;
/// Values per Q8_1 block.
pub const QK8_1: usize = 32;

/// 4-bit symmetric: `x = (q - 8) * d`, `q` in 0..16. Low nibbles hold values 0..16 of the
/// block, high nibbles values 16..32 (ggml's order, not interleaved).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK4_0 / 2],
}

/// 4-bit asymmetric: `x = q * d + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK4_1 / 2],
}

/// 8-bit symmetric: `x = q * d`. Used for weights and for activations paired with Q4_0/Q8_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK8_0],
}

/// 8-bit activations paired with Q4_1: `s = d * sum(qs)` carries the term that the weights'
/// offset `m` multiplies, so the dot product needs no second pass.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK8_1],
}

/// Weights per Q5_0 block.
pub const QK5_0: usize = 32;
/// Weights per Q5_1 block.
pub const QK5_1: usize = 32;
/// Values per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;
/// Bytes of the packed 6-bit scales and mins of Q4_K and Q5_K (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// 5-bit symmetric: `x = (q - 16) * d`; the low four bits as in Q4_0, bit 4 of value `j` in
/// bit `j` of `qh` (little-endian).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_0 / 2],
}

/// 5-bit asymmetric: `x = q * d + m`, bits as in Q5_0. Pairs with Q8_1 activations.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK5_1 / 2],
}

/// 4-bit K-quant: eight sub-blocks of 32 with a 6-bit scale and a 6-bit min each (packed in
/// `scales`, see `get_scale_min_k4`), `x = d * sc * q - dmin * m`. `qs` holds 64 bytes per
/// pair of sub-blocks: the low nibbles are the first sub-block, the high nibbles the second.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// 5-bit K-quant: Q4_K with a fifth bit per value in `qh` (bit `2i` / `2i+1` of `qh[l]` for
/// values `l` of sub-blocks `2i` / `2i+1`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// 6-bit K-quant: sixteen sub-blocks of 16 with an 8-bit signed scale each,
/// `x = d * sc * (q - 32)`; low four bits in `ql`, high two in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// 8-bit activations paired with the K-quants: an f32 scale and the sums of each sixteen
/// values, which the mins of Q4_K/Q5_K multiply. Never read from a file (alignment 4).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);
const _: () = assert!(std::mem::align_of::<BlockQ6K>() == 2);

macro_rules! zeroed_default {
    ($($t:ty),*) => {$(
        impl Default for $t {
            fn default() -> Self {
                Self::zeroed()
            }
        }
    )*};
}
zeroed_default!(BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K);

impl Default for BlockQ8_0 {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl Default for BlockQ8_1 {
    fn default() -> Self {
        Self::zeroed()
    }
}

const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(std::mem::align_of::<BlockQ4_0>() == 2);
const _: () = assert!(std::mem::align_of::<BlockQ8_1>() == 2);

/// A ggml block format: its geometry and the scalar reference that defines it.
///
/// The reference functions are the truth that every SIMD path is tested against; they are
/// written for clarity, and [`crate::dispatch::Kernels`] holds the fast versions.
pub trait BlockFormat: Pod + Default + Send + Sync + 'static {
    /// ggml's name of the type (`"q4_0"`).
    const NAME: &'static str;
    /// Values per block.
    const BLOCK_LEN: usize;
    /// ggml's type id (`GGML_TYPE_*`), as stored in GGUF tensor infos.
    const GGML_TYPE: u32;
    /// The activation format whose blocks this format's dot product pairs with.
    type Activation: BlockFormat;
    /// `quantize_row_*_ref`: `x.len() == y.len() * BLOCK_LEN`.
    fn quantize_row_ref(x: &[f32], y: &mut [Self]);
    /// `dequantize_row_*`: `y.len() == x.len() * BLOCK_LEN`.
    fn dequantize_row(x: &[Self], y: &mut [f32]);
    /// `vec_dot_*_ref`: the scalar dot product against activations, `x.len() == y.len()`.
    fn vec_dot_ref(x: &[Self], y: &[Self::Activation]) -> f32;
}

/// Number of blocks for `n` values, or `None` when `n` is not a whole number of blocks.
pub fn blocks_for<B: BlockFormat>(n: usize) -> Option<usize> {
    n.is_multiple_of(B::BLOCK_LEN).then_some(n / B::BLOCK_LEN)
}

/// f16 → f32, exact.
#[inline]
pub fn f16_to_f32(h: f16) -> f32 {
    h.to_f32()
}

/// f32 → f16 with round-to-nearest-even, as ggml's `GGML_FP32_TO_FP16` (F16C / `fcvt`).
#[inline]
pub fn f32_to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Converts a row of f16 to f32 (scalar; the dispatch table has the fast one).
pub fn f16_to_f32_row(x: &[f16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "f16_to_f32_row: length mismatch");
    for (o, i) in y.iter_mut().zip(x) {
        *o = i.to_f32();
    }
}

/// Converts a row of f32 to f16, round-to-nearest-even.
pub fn f32_to_f16_row(x: &[f32], y: &mut [f16]) {
    assert_eq!(x.len(), y.len(), "f32_to_f16_row: length mismatch");
    for (o, i) in y.iter_mut().zip(x) {
        *o = f16::from_f32(*i);
    }
}

/// Rows per interleaved ("packed") block: eight rows fill the eight i32 lanes of a 256-bit
/// register, one row per lane.
pub const PACK_ROWS: usize = 8;

/// Block `b` of eight Q4_0 rows, interleaved in 4-byte granules: `qs[32 * c + 4 * k + i]` is
/// row `k`'s `qs[4 * c + i]` (`c` in 0..4), `d[k]` row `k`'s scale. One 32-byte load then holds
/// values `4c..4c+4` (low nibbles) and `4c+16..4c+20` (high nibbles) of all eight rows, so an
/// integer dot product four bytes wide (`vpdpbusd`, `sdot`) leaves each row's sum in its own
/// lane with no horizontal reduction, and the eight scales are one 16-byte load. Same bytes
/// as the eight `BlockQ4_0`s (ggml's `block_q4_0x8` has this shape with another interleave).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0x8 {
    pub d: [f16; PACK_ROWS],
    pub qs: [u8; PACK_ROWS * QK4_0 / 2],
}

/// [`BlockQ4_0x8`] for Q4_1: the same interleave, with the eight offsets `m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1x8 {
    pub d: [f16; PACK_ROWS],
    pub m: [f16; PACK_ROWS],
    pub qs: [u8; PACK_ROWS * QK4_1 / 2],
}

/// [`BlockQ4_0x8`] for Q8_0: `qs[32 * c + 4 * k + i]` is row `k`'s `qs[4 * c + i]`, `c` in 0..8.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0x8 {
    pub d: [f16; PACK_ROWS],
    pub qs: [i8; PACK_ROWS * QK8_0],
}

/// [`BlockQ4_0x8`] for Q5_0: the nibbles `qs` in the same granules, and the fifth bits
/// regrouped by the byte of a granule they go with: bit `c` of `qh[4 * k + i]` is the fifth
/// bit of row `k`'s value `4c + i` (granule `c`'s low nibble at that byte), bit `4 + c` that of
/// value `16 + 4c + i` (its high nibble). One 32-byte load of `qh` then serves all four
/// granules: a shift by a constant and a mask put a granule's fifth bits beside its nibbles,
/// with no per-bit shuffles in the product. The same bits as the eight `BlockQ5_0`s, moved.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0x8 {
    pub d: [f16; PACK_ROWS],
    pub qh: [u8; PACK_ROWS * QK5_0 / 8],
    pub qs: [u8; PACK_ROWS * QK5_0 / 2],
}

const _: () = assert!(size_of::<BlockQ4_0x8>() == 8 * size_of::<BlockQ4_0>());
const _: () = assert!(size_of::<BlockQ5_0x8>() == 8 * size_of::<BlockQ5_0>());
const _: () = assert!(size_of::<BlockQ4_1x8>() == 8 * size_of::<BlockQ4_1>());
const _: () = assert!(size_of::<BlockQ8_0x8>() == 8 * size_of::<BlockQ8_0>());

zeroed_default!(BlockQ4_0x8, BlockQ4_1x8, BlockQ5_0x8, BlockQ8_0x8);

/// An interleaved layout of a block format: block `b` of rows `8g..8g+8` in one value.
///
/// A packed matrix is stored group-major (`[group][block]`), so a product streams it front to
/// back. Packing moves bits and nothing else: `unpack(pack(rows), k) == rows[k]`, and a
/// product over packed weights gives the same bits as the same path's product over the rows.
pub trait PackedFormat: Pod + Default + Send + Sync + 'static {
    /// The row format this interleaves.
    type Row: BlockFormat;
    /// Interleaves block `b` of eight rows into `out` (every byte of it written).
    fn pack_into(rows: [&Self::Row; PACK_ROWS], out: &mut Self);
    /// Row `k`'s block.
    fn unpack(&self, k: usize) -> Self::Row;
    /// Interleaves block `b` of eight rows.
    fn pack(rows: [&Self::Row; PACK_ROWS]) -> Self {
        let mut p = Self::zeroed();
        Self::pack_into(rows, &mut p);
        p
    }
}

/// Granules of four bytes: `out[32 * c + 4 * k + i] = rows[k][4 * c + i]`. `N` is a constant
/// so that the loops unroll into word moves (packing runs at load, on the way to the first
/// token).
#[inline(always)]
fn interleave4<const N: usize>(rows: [&[u8; N]; PACK_ROWS], out: &mut [u8]) {
    for c in 0..N / 4 {
        for (k, row) in rows.iter().enumerate() {
            out[32 * c + 4 * k..][..4].copy_from_slice(&row[4 * c..][..4]);
        }
    }
}

fn deinterleave4(packed: &[u8], k: usize, out: &mut [u8]) {
    for c in 0..out.len() / 4 {
        out[4 * c..][..4].copy_from_slice(&packed[32 * c + 4 * k..][..4]);
    }
}

impl PackedFormat for BlockQ4_0x8 {
    type Row = BlockQ4_0;
    #[inline]
    fn pack_into(rows: [&BlockQ4_0; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.qs), &mut out.qs);
        out.d = rows.map(|r| r.d);
    }
    fn unpack(&self, k: usize) -> BlockQ4_0 {
        let mut b = BlockQ4_0 {
            d: self.d[k],
            ..Default::default()
        };
        deinterleave4(&self.qs, k, &mut b.qs);
        b
    }
}

impl PackedFormat for BlockQ4_1x8 {
    type Row = BlockQ4_1;
    #[inline]
    fn pack_into(rows: [&BlockQ4_1; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.qs), &mut out.qs);
        out.d = rows.map(|r| r.d);
        out.m = rows.map(|r| r.m);
    }
    fn unpack(&self, k: usize) -> BlockQ4_1 {
        let mut b = BlockQ4_1 {
            d: self.d[k],
            m: self.m[k],
            ..Default::default()
        };
        deinterleave4(&self.qs, k, &mut b.qs);
        b
    }
}

impl PackedFormat for BlockQ5_0x8 {
    type Row = BlockQ5_0;
    #[inline]
    fn pack_into(rows: [&BlockQ5_0; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.qs), &mut out.qs);
        out.d = rows.map(|r| r.d);
        for (k, r) in rows.iter().enumerate() {
            let qh = u32::from_le_bytes(r.qh);
            for i in 0..4 {
                let mut byte = 0u8;
                for c in 0..4 {
                    byte |= (((qh >> (4 * c + i)) & 1) as u8) << c;
                    byte |= (((qh >> (16 + 4 * c + i)) & 1) as u8) << (4 + c);
                }
                out.qh[4 * k + i] = byte;
            }
        }
    }
    fn unpack(&self, k: usize) -> BlockQ5_0 {
        let mut b = BlockQ5_0 {
            d: self.d[k],
            ..Default::default()
        };
        deinterleave4(&self.qs, k, &mut b.qs);
        let mut qh = 0u32;
        for i in 0..4 {
            let byte = u32::from(self.qh[4 * k + i]);
            for c in 0..4 {
                qh |= ((byte >> c) & 1) << (4 * c + i);
                qh |= ((byte >> (4 + c)) & 1) << (16 + 4 * c + i);
            }
        }
        b.qh = qh.to_le_bytes();
        b
    }
}

impl PackedFormat for BlockQ8_0x8 {
    type Row = BlockQ8_0;
    #[inline]
    fn pack_into(rows: [&BlockQ8_0; PACK_ROWS], out: &mut Self) {
        interleave4(
            rows.map(|r| bytemuck::cast_ref::<[i8; 32], [u8; 32]>(&r.qs)),
            bytemuck::cast_slice_mut(&mut out.qs),
        );
        out.d = rows.map(|r| r.d);
    }
    fn unpack(&self, k: usize) -> BlockQ8_0 {
        let mut b = BlockQ8_0 {
            d: self.d[k],
            ..Default::default()
        };
        deinterleave4(
            bytemuck::cast_slice(&self.qs),
            k,
            bytemuck::cast_slice_mut(&mut b.qs),
        );
        b
    }
}

/// Block `b` of eight Q4_K rows: every byte array of the eight `BlockQ4K`s interleaved in
/// 4-byte granules as [`BlockQ4_0x8`]'s (`qs[32 * c + 4 * k + i]` is row `k`'s `qs[4 * c + i]`,
/// `scales` likewise), the scales `d` and `dmin` side by side. One 32-byte load of `qs` holds
/// four values of one sub-block (low nibbles) and four of the next (high nibbles) of all eight
/// rows; one of `scales` holds word `c` of every row's packed 6-bit scales and mins, which a
/// few lane-wise shifts and masks turn into the eight rows' scales of four sub-blocks at once.
/// The same bytes as the eight rows (ggml's `block_q4_Kx8` holds them with another
/// interleave).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4Kx8 {
    pub d: [f16; PACK_ROWS],
    pub dmin: [f16; PACK_ROWS],
    pub scales: [u8; PACK_ROWS * K_SCALE_SIZE],
    pub qs: [u8; PACK_ROWS * QK_K / 2],
}

/// [`BlockQ4Kx8`] for Q5_K: the fifth bits `qh` interleaved in the same granules.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5Kx8 {
    pub d: [f16; PACK_ROWS],
    pub dmin: [f16; PACK_ROWS],
    pub scales: [u8; PACK_ROWS * K_SCALE_SIZE],
    pub qh: [u8; PACK_ROWS * QK_K / 8],
    pub qs: [u8; PACK_ROWS * QK_K / 2],
}

/// Block `b` of eight Q6_K rows: `ql`, `qh` and the sixteen i8 `scales` each interleaved in
/// 4-byte granules, the eight `d` side by side. A granule of `ql` and the granule of `qh` at
/// the same offset within its half give four values of each of four 32-value runs, as in
/// the row format.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6Kx8 {
    pub d: [f16; PACK_ROWS],
    pub scales: [i8; PACK_ROWS * QK_K / 16],
    pub ql: [u8; PACK_ROWS * QK_K / 2],
    pub qh: [u8; PACK_ROWS * QK_K / 4],
}

const _: () = assert!(size_of::<BlockQ4Kx8>() == 8 * size_of::<BlockQ4K>());
const _: () = assert!(size_of::<BlockQ5Kx8>() == 8 * size_of::<BlockQ5K>());
const _: () = assert!(size_of::<BlockQ6Kx8>() == 8 * size_of::<BlockQ6K>());
zeroed_default!(BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8);

impl PackedFormat for BlockQ4Kx8 {
    type Row = BlockQ4K;
    #[inline]
    fn pack_into(rows: [&BlockQ4K; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.qs), &mut out.qs);
        interleave4(rows.map(|r| &r.scales), &mut out.scales);
        out.d = rows.map(|r| r.d);
        out.dmin = rows.map(|r| r.dmin);
    }
    fn unpack(&self, k: usize) -> BlockQ4K {
        let mut b = BlockQ4K {
            d: self.d[k],
            dmin: self.dmin[k],
            ..Default::default()
        };
        deinterleave4(&self.qs, k, &mut b.qs);
        deinterleave4(&self.scales, k, &mut b.scales);
        b
    }
}

impl PackedFormat for BlockQ5Kx8 {
    type Row = BlockQ5K;
    #[inline]
    fn pack_into(rows: [&BlockQ5K; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.qs), &mut out.qs);
        interleave4(rows.map(|r| &r.qh), &mut out.qh);
        interleave4(rows.map(|r| &r.scales), &mut out.scales);
        out.d = rows.map(|r| r.d);
        out.dmin = rows.map(|r| r.dmin);
    }
    fn unpack(&self, k: usize) -> BlockQ5K {
        let mut b = BlockQ5K {
            d: self.d[k],
            dmin: self.dmin[k],
            ..Default::default()
        };
        deinterleave4(&self.qs, k, &mut b.qs);
        deinterleave4(&self.qh, k, &mut b.qh);
        deinterleave4(&self.scales, k, &mut b.scales);
        b
    }
}

impl PackedFormat for BlockQ6Kx8 {
    type Row = BlockQ6K;
    #[inline]
    fn pack_into(rows: [&BlockQ6K; PACK_ROWS], out: &mut Self) {
        interleave4(rows.map(|r| &r.ql), &mut out.ql);
        interleave4(rows.map(|r| &r.qh), &mut out.qh);
        interleave4(
            rows.map(|r| bytemuck::cast_ref::<[i8; 16], [u8; 16]>(&r.scales)),
            bytemuck::cast_slice_mut(&mut out.scales),
        );
        out.d = rows.map(|r| r.d);
    }
    fn unpack(&self, k: usize) -> BlockQ6K {
        let mut b = BlockQ6K {
            d: self.d[k],
            ..Default::default()
        };
        deinterleave4(&self.ql, k, &mut b.ql);
        deinterleave4(&self.qh, k, &mut b.qh);
        deinterleave4(
            bytemuck::cast_slice(&self.scales),
            k,
            bytemuck::cast_slice_mut(&mut b.scales),
        );
        b
    }
}

/// Packs a row-major matrix of `rows × nb` blocks (`rows` a multiple of [`PACK_ROWS`]) into
/// `out` (`rows / 8 * nb` blocks, group-major).
pub fn pack_matrix<P: PackedFormat>(w: &[P::Row], nb: usize, out: &mut [P]) {
    assert!(
        nb > 0 && w.len().is_multiple_of(nb * PACK_ROWS) && out.len() == w.len() / PACK_ROWS,
        "pack_matrix: {} blocks of rows of {nb} into {}",
        w.len(),
        out.len()
    );
    for (rows, dst) in w.chunks_exact(nb * PACK_ROWS).zip(out.chunks_exact_mut(nb)) {
        for (b, p) in dst.iter_mut().enumerate() {
            P::pack_into(std::array::from_fn(|k| &rows[k * nb + b]), p);
        }
    }
}
