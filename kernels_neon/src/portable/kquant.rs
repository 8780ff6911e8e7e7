//! K-quant products (Q4_K, Q5_K, Q6_K against Q8_K activations) on `wide` vectors.
//!
//! The f32 work is the other fast paths' sequence (`kseq::finish_block`, documented in
//! `x86/kquant.rs`), so that `tests/kquant_sequence.rs` holds for this path too and a row's
//! result has the same bits here as on AVX2 and NEON, through `vec_dot`, `matvec` and `matmul`
//! and whatever the tiling. Only the block's exact integer sum `sumi` is computed differently:
//!
//! - A super-block is unpacked once per tile into 32 `i16x8` of levels already multiplied by
//!   their 16-value scale (`level · scale` fits an i16: at most 31 · 63 for Q5_K, 63 · 128 for
//!   Q6_K), so a token needs no multiply by the scale (SSE2 has no 32-bit `mullo`).
//! - Each 16 values are read as 16-bit lanes and split into even and odd bytes with shifts, on
//!   weights and activations alike (as `dot.rs`), so the pairs of `i16x8::dot` (`pmaddwd`)
//!   stay within one 16-value group, which has one scale, on either endianness.
//! - `dot` of a scaled level and an activation pair is at most 2 · 8064 · 128, and the 256
//!   values of a block at most 256 · 8064 · 128 < 2^31: the i32 lanes never wrap.
//!
//! Packed K-quant matrices (`BlockQ4Kx8`, …) run the same tiles on each group's eight rows,
//! taken out of the interleave block by block: the same bits, without the horizontal
//! bookkeeping of eight rows in one vector that the hand-written paths do.
//!
//! Tiles of `RM` rows × `RN` tokens share the unpacking of a row's block between tokens and
//! the splitting of a token's block between rows; every (row, token) pair still runs its own
//! block-by-block sequence, so the tile shape does not reach the result.

use super::simd::f16_to_f32;
use crate::block::{
    BlockQ4K, BlockQ4Kx8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8K, PACK_ROWS,
    PackedFormat, QK_K, f16,
};
use crate::kseq::{finish_block_off, scales_mins};
use crate::reference::{check_matmul, check_matvec};
use bytemuck::cast;
use wide::{i16x8, i32x4, u16x8};

/// Weight rows per pass of a matrix-vector product (they share each activation block's split).
const MV_ROWS: usize = 4;
/// Register tile of a matrix-matrix product (rows × tokens).
const MM_ROWS: usize = 4;
const MM_TOKS: usize = 4;

/// A super-block unpacked: `q[2g]` / `q[2g + 1]` are the even / odd values of the 16-value
/// group `g` (values `16g..16g + 16`), as level · scale; `bsum_mul` and `dmin` as in
/// `kseq::finish_block` (the mins with `dmin`, or Q6_K's offset `32 · scale` without).
#[derive(Clone, Copy)]
struct Unpacked {
    q: [i16x8; 32],
    d: f32,
    /// As i16 lanes for `i16x8::dot` with the activations' `bsums` (i16): the mins are at most
    /// 63, Q6_K's `32 · scale` within ±4096, so each product is within 2^27 and the 16-term
    /// sum equals `finish_block`'s wrapping one.
    bsum_mul: [i16x8; 2],
    dmin: Option<f32>,
}

impl Unpacked {
    const ZERO: Self = Self {
        q: [i16x8::ZERO; 32],
        d: 0.0,
        bsum_mul: [i16x8::ZERO; 2],
        dmin: None,
    };
}

trait KFormat {
    type W;
    fn unpack(w: &Self::W) -> Unpacked;
}

/// 16 bytes as eight 16-bit lanes: byte `2k` is the low half of lane `k` on little-endian
/// targets (the high half on big-endian, where the activations swap the same way).
#[inline(always)]
fn u16s(x: &[u8]) -> u16x8 {
    let x: [u8; 16] = x[..16].try_into().expect("16 bytes");
    cast(x)
}

/// The levels of a Q4_K (`qh = None`) or Q5_K block times their scales: sub-block `2p` is the
/// low nibbles of `qs[32p..32p + 32]`, `2p + 1` the high ones; bit `2p` / `2p + 1` of `qh[l]`
/// is the fifth bit of value `l` of them.
#[inline(always)]
fn q4_q5(qs: &[u8; 128], qh: Option<&[u8; 32]>, scales: &[u8; 12], d: f16, dmin: f16) -> Unpacked {
    let (sc, mins) = scales_mins(scales);
    let m4 = u16x8::splat(0x0f);
    let bit4 = u16x8::splat(0x10);
    let mut q = [i16x8::ZERO; 32];
    for p in 0..4 {
        for h in 0..2 {
            let b = u16s(&qs[32 * p + 16 * h..]);
            // Even and odd values of the low nibbles (group 4p + h), then of the high ones
            // (group 4p + 2 + h).
            let mut v = [b & m4, (b >> 8) & m4, (b >> 4) & m4, b >> 12];
            if let Some(qh) = qh {
                // Bits 2p and 2p + 1 of each byte, moved to bit 4 (the level's 16).
                let hb = u16s(&qh[16 * h..]) >> (2 * p as u16);
                v[0] |= (hb << 4) & bit4;
                v[1] |= (hb >> 4) & bit4;
                v[2] |= (hb << 3) & bit4;
                v[3] |= (hb >> 5) & bit4;
            }
            let (glo, ghi) = (4 * p + h, 4 * p + 2 + h);
            q[2 * glo] = cast::<_, i16x8>(v[0]) * i16x8::splat(sc[glo] as i16);
            q[2 * glo + 1] = cast::<_, i16x8>(v[1]) * i16x8::splat(sc[glo] as i16);
            q[2 * ghi] = cast::<_, i16x8>(v[2]) * i16x8::splat(sc[ghi] as i16);
            q[2 * ghi + 1] = cast::<_, i16x8>(v[3]) * i16x8::splat(sc[ghi] as i16);
        }
    }
    Unpacked {
        q,
        d: f16_to_f32(d),
        bsum_mul: i16s(&mins),
        dmin: Some(f16_to_f32(dmin)),
    }
}

struct Q4K;
impl KFormat for Q4K {
    type W = BlockQ4K;
    #[inline(always)]
    fn unpack(w: &BlockQ4K) -> Unpacked {
        q4_q5(&w.qs, None, &w.scales, w.d, w.dmin)
    }
}

struct Q5K;
impl KFormat for Q5K {
    type W = BlockQ5K;
    #[inline(always)]
    fn unpack(w: &BlockQ5K) -> Unpacked {
        q4_q5(&w.qs, Some(&w.qh), &w.scales, w.d, w.dmin)
    }
}

struct Q6K;
impl KFormat for Q6K {
    type W = BlockQ6K;
    /// Values `128n + 32k + l` (`l` in 0..32) take the low (`k` = 0, 1) or high (2, 3) nibble
    /// of `ql[64n + 32(k & 1) + l]` and bits `2k, 2k + 1` of `qh[32n + l]` (`q6_values`);
    /// group `8n + 2k + h` is `l` in `16h..16h + 16`, with scale `scales[8n + 2k + h]`.
    #[inline(always)]
    fn unpack(w: &BlockQ6K) -> Unpacked {
        // Both bytes of a lane at once (masks per byte, shifts that keep within one), then
        // split into even and odd bytes: fewer operations than assembling each half alone.
        let (m4, m30, lo8) = (
            u16x8::splat(0x0f0f),
            u16x8::splat(0x3030),
            u16x8::splat(0x00ff),
        );
        let mut q = [i16x8::ZERO; 32];
        let mut bsum_mul = [0i32; 16];
        for n in 0..2 {
            for h in 0..2 {
                let ql0 = u16s(&w.ql[64 * n + 16 * h..]);
                let ql1 = u16s(&w.ql[64 * n + 32 + 16 * h..]);
                let qh = u16s(&w.qh[32 * n + 16 * h..]);
                // Bits 2k, 2k + 1 of each qh byte moved to bits 4, 5 of its level byte.
                let lv = [
                    (ql0 & m4) | ((qh << 4) & m30),
                    (ql1 & m4) | ((qh << 2) & m30),
                    ((ql0 >> 4) & m4) | (qh & m30),
                    ((ql1 >> 4) & m4) | ((qh >> 2) & m30),
                ];
                for (k, v) in lv.into_iter().enumerate() {
                    let g = 8 * n + 2 * k + h;
                    let s = i16x8::splat(w.scales[g] as i16);
                    q[2 * g] = cast::<_, i16x8>(v & lo8) * s;
                    q[2 * g + 1] = cast::<_, i16x8>(v >> 8) * s;
                    bsum_mul[g] = 32 * w.scales[g] as i32;
                }
            }
        }
        Unpacked {
            q,
            d: f16_to_f32(w.d),
            bsum_mul: i16s(&bsum_mul),
            dmin: None,
        }
    }
}

/// Sixteen multipliers of `bsums` as i16 lanes (they fit: see [`Unpacked::bsum_mul`]).
#[inline(always)]
fn i16s(m: &[i32; 16]) -> [i16x8; 2] {
    cast(m.map(|v| v as i16))
}

/// A token's block split as the weights are: even and odd bytes of each 16, sign-extended.
#[inline(always)]
fn split_a(a: &BlockQ8K) -> [i16x8; 32] {
    let v: [i16x8; 16] = cast(a.qs);
    let mut out = [i16x8::ZERO; 32];
    for (g, x) in v.into_iter().enumerate() {
        out[2 * g] = (x << 8) >> 8;
        out[2 * g + 1] = x >> 8;
    }
    out
}

/// The block's exact integer sum `Σ scale · level · activation` (see the module doc for why no
/// lane wraps). Two accumulators for the adds' latency; integer, so their order is free.
#[inline(always)]
fn sumi(q: &[i16x8; 32], a: &[i16x8; 32]) -> i32 {
    let (mut s0, mut s1) = (i32x4::ZERO, i32x4::ZERO);
    for i in (0..32).step_by(2) {
        s0 += q[i].dot(a[i]);
        s1 += q[i + 1].dot(a[i + 1]);
    }
    (s0 + s1).reduce_add()
}

/// Rows `r..r + RM` × tokens `t..t + RN` of `nb` blocks each, into `out` (`[row][tok]`).
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the problem's slices and shape, and the tile's corner
fn tile<F: KFormat, const RM: usize, const RN: usize>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    r: usize,
    t: usize,
    out: &mut [f32],
) {
    let (mut acc, mut mins) = ([[0.0f32; RN]; RM], [[0.0f32; RN]; RM]);
    // One buffer reused for every block: `array::from_fn` here was left out of line with a
    // 2 KiB copy per call.
    let mut u = [Unpacked::ZERO; RM];
    for b in 0..nb {
        for (i, ui) in u.iter_mut().enumerate() {
            *ui = F::unpack(&w[(r + i) * nb + b]);
        }
        for j in 0..RN {
            let ab = &a[(t + j) * nb + b];
            let ap = split_a(ab);
            let bs: [i16x8; 2] = cast(ab.bsums);
            for (i, ui) in u.iter().enumerate() {
                let s = sumi(&ui.q, &ap);
                // `kseq::finish_block`'s offset, exact, in two `pmaddwd` instead of 16 scalar
                // multiply-adds per (row, token) pair.
                let off = (ui.bsum_mul[0].dot(bs[0]) + ui.bsum_mul[1].dot(bs[1])).reduce_add();
                finish_block_off(s, off, ui.d, ui.dmin, ab.d, &mut acc[i][j], &mut mins[i][j]);
            }
        }
    }
    for i in 0..RM {
        for j in 0..RN {
            out[(r + i) * n_tok + t + j] = acc[i][j] - mins[i][j];
        }
    }
}

/// Picks the tile instance for `rm` rows (1..=4) × `rn` tokens (1..=4).
#[allow(clippy::too_many_arguments)] // `tile`'s, and the edge's shape
fn tile_dyn<F: KFormat>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    (r, t): (usize, usize),
    (rm, rn): (usize, usize),
    out: &mut [f32],
) {
    macro_rules! pick {
        ($($m:literal),*) => {
            match (rm, rn) {
                $((1, $m) => tile::<F, 1, $m>(w, a, nb, n_tok, r, t, out),
                  (2, $m) => tile::<F, 2, $m>(w, a, nb, n_tok, r, t, out),
                  (3, $m) => tile::<F, 3, $m>(w, a, nb, n_tok, r, t, out),
                  (4, $m) => tile::<F, 4, $m>(w, a, nb, n_tok, r, t, out),)*
                _ => unreachable!("tile {rm}x{rn}"),
            }
        };
    }
    pick!(1, 2, 3, 4);
}

/// Walks `rows × n_tok` in tiles of `RM × RN` (smaller ones at the edges).
fn run<F: KFormat, const RM: usize, const RN: usize>(
    w: &[F::W],
    a: &[BlockQ8K],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    const { assert!(RM >= 1 && RM <= 4 && RN >= 1 && RN <= 4) };
    let rows = out.len() / n_tok;
    super::for_each_tile(rows, n_tok, RM, RN, |r, t, rm, rn| {
        if rm == RM && rn == RN {
            tile::<F, RM, RN>(w, a, nb, n_tok, r, t, out);
        } else {
            tile_dyn::<F>(w, a, nb, n_tok, (r, t), (rm, rn), out);
        }
    });
}

/// The row format of a packed K-quant layout, as this file's tiles take it.
trait PkRow: PackedFormat {
    type F: KFormat<W = Self::Row>;
}
impl PkRow for BlockQ4Kx8 {
    type F = Q4K;
}
impl PkRow for BlockQ5Kx8 {
    type F = Q5K;
}
impl PkRow for BlockQ6Kx8 {
    type F = Q6K;
}

/// Group `g` of a packed matrix (its blocks `wg`) × tokens `t..t + RN`: each of the eight
/// rows' blocks taken out of the interleave and unpacked as [`tile`] unpacks a row's, so every
/// (row, token) pair runs [`tile`]'s sequence and the results are its bits.
#[inline(always)]
fn packed_group<P: PkRow, const RN: usize>(
    wg: &[P],
    a: &[BlockQ8K],
    n_tok: usize,
    g: usize,
    t: usize,
    out: &mut [f32],
) {
    let nb = wg.len();
    let (mut acc, mut mins) = ([[0.0f32; RN]; PACK_ROWS], [[0.0f32; RN]; PACK_ROWS]);
    let mut u = [Unpacked::ZERO; PACK_ROWS];
    for (b, p) in wg.iter().enumerate() {
        for (k, uk) in u.iter_mut().enumerate() {
            *uk = P::F::unpack(&p.unpack(k));
        }
        for j in 0..RN {
            let ab = &a[(t + j) * nb + b];
            let ap = split_a(ab);
            let bs: [i16x8; 2] = cast(ab.bsums);
            for (i, ui) in u.iter().enumerate() {
                let s = sumi(&ui.q, &ap);
                let off = (ui.bsum_mul[0].dot(bs[0]) + ui.bsum_mul[1].dot(bs[1])).reduce_add();
                finish_block_off(s, off, ui.d, ui.dmin, ab.d, &mut acc[i][j], &mut mins[i][j]);
            }
        }
    }
    for i in 0..PACK_ROWS {
        for j in 0..RN {
            out[(g * PACK_ROWS + i) * n_tok + t + j] = acc[i][j] - mins[i][j];
        }
    }
}

/// Every group × token of a product over packed weights (shapes as `check_packed` checks
/// them), a group at a time.
fn run_packed<P: PkRow>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    let groups = out.len() / n_tok / PACK_ROWS;
    for g in 0..groups {
        let wg = &w[g * nb..(g + 1) * nb];
        let mut t = 0;
        while t + 2 <= n_tok {
            packed_group::<P, 2>(wg, a, n_tok, g, t, out);
            t += 2;
        }
        if t < n_tok {
            packed_group::<P, 1>(wg, a, n_tok, g, t, out);
        }
    }
}

packed_k_table!(safe "the portable path", run_packed);

macro_rules! k_kernels {
    ($fmt:ty, $w:ty, $dot:ident, $mv:ident, $mm:ident) => {
        #[doc = concat!("`vec_dot` of ", stringify!($w), " × Q8_K (portable).")]
        pub(crate) fn $dot(x: &[$w], y: &[BlockQ8K]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            if x.is_empty() {
                return 0.0;
            }
            let mut out = [0.0f32];
            run::<$fmt, 1, 1>(x, y, x.len(), 1, &mut out);
            out[0]
        }

        #[doc = concat!("Matrix-vector product of ", stringify!($w), " × Q8_K (portable).")]
        pub(crate) fn $mv(w: &[$w], a: &[BlockQ8K], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            run::<$fmt, MV_ROWS, 1>(w, a, nb, 1, out);
        }

        #[doc = concat!("Matrix-matrix product of ", stringify!($w), " × Q8_K (portable).")]
        pub(crate) fn $mm(w: &[$w], a: &[BlockQ8K], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            run::<$fmt, MM_ROWS, MM_TOKS>(w, a, nb, n_tok, out);
        }
    };
}

k_kernels!(
    Q4K,
    BlockQ4K,
    vec_dot_q4_k_q8_k,
    matvec_q4_k_q8_k,
    matmul_q4_k_q8_k
);
k_kernels!(
    Q5K,
    BlockQ5K,
    vec_dot_q5_k_q8_k,
    matvec_q5_k_q8_k,
    matmul_q5_k_q8_k
);
k_kernels!(
    Q6K,
    BlockQ6K,
    vec_dot_q6_k_q8_k,
    matvec_q6_k_q8_k,
    matmul_q6_k_q8_k
);

const _: () = assert!(QK_K == 256);
