//! Per-block integer dot products of the weight formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) for groups of four weight rows
//! against one activation block, behind one trait so that the register tiles in `matmul.rs`
//! are written once.
//!
//! A group's sums come out "half reduced" in a format-specific layout ([`Fmt::isum_group`]);
//! [`Fmt::combine`] merges two groups (or one group with itself) into 8 lanes of exact block
//! sums, lane `k` holding row [`Fmt::LANES`]`[G - 1][k]`. The products go through ggml's
//! `maddubs`; the horizontal reductions are shared between rows (unpacks and adds, no `hadd`:
//! LLVM rewrites it into longer shuffle sequences for a generic x86-64 target). Integer sums
//! are exact, so the order inside them does not matter.

use super::simd::{f16_to_f32, load_i8x32};
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, f16};
use std::arch::x86_64::*;

/// A weight format as the AVX2 tiles see it.
///
/// # Safety
/// The `unsafe fn`s are `#[target_feature(enable = "avx2,fma,f16c")]`: callers must run with
/// those features (every caller is itself such a function, reached from the AVX2 table).
pub(super) trait Fmt {
    /// Weight block.
    type W: Copy + Default;
    /// Activation block.
    type A: Copy;
    /// Four weight blocks (one per row of a group) prepared for [`Fmt::isum_group`].
    type GP: Copy;
    /// An activation block prepared for [`Fmt::isum_group`] (computed once, used for every
    /// group).
    type AP: Copy;
    /// Whether the format has the `m * s` offset term (Q4_1).
    const HAS_MIN: bool;
    /// Whether [`Fmt::as_corr`] must be subtracted from each block's integer sum (Q4_0).
    const HAS_CORR: bool;
    /// The row (within the tile) of each lane of [`Fmt::combine`]'s result, for one group
    /// (`combine(h, h)`, each row twice) and for two groups.
    const LANES: [[usize; 8]; 2];

    unsafe fn prep_group(w: [&Self::W; 4]) -> Self::GP;
    unsafe fn prep_a(a: &Self::A) -> Self::AP;
    /// The group's integer sums, half reduced.
    unsafe fn isum_group(g: &Self::GP, a: &Self::AP) -> __m256i;
    /// [`Fmt::isum_group`] through `vpdpbusd`, with the same result. Callers must also run
    /// on a CPU with avx512vnni and avx512vl (see [`dpbusd`]).
    unsafe fn isum_group_vnni(g: &Self::GP, a: &Self::AP) -> __m256i;
    /// Two groups' half-reduced sums → 8 lanes of block sums in the order of `LANES`.
    unsafe fn combine(h0: __m256i, h1: __m256i) -> __m256i;
    fn w_d(w: &Self::W) -> f16;
    /// The weight offset `m` (0 unless `HAS_MIN`).
    fn w_m(w: &Self::W) -> f16;
    /// What the tiles read of an activation block besides its values, converted once per
    /// call (per chunk of blocks): `d` as f32, and `s` as f32 or the integer correction.
    type AS: Copy;
    unsafe fn a_scalars(a: &Self::A) -> Self::AS;
    fn as_d(s: &Self::AS) -> f32;
    /// The activation sum `s` (0 unless `HAS_MIN`).
    fn as_s(s: &Self::AS) -> f32;
    /// The integer to subtract from the block sums with this activation block (0 unless
    /// `HAS_CORR`).
    fn as_corr(s: &Self::AS) -> i32;
}

/// Q4 weights of two rows side by side: `[A | B]` low nibbles (values 0..16 of each block)
/// and high nibbles (16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles2(a: &[u8; 16], b: &[u8; 16]) -> (__m256i, __m256i) {
    // SAFETY: both references cover 16 readable bytes; `loadu` has no alignment requirement.
    let (qa, qb) = unsafe {
        (
            _mm_loadu_si128(a.as_ptr().cast()),
            _mm_loadu_si128(b.as_ptr().cast()),
        )
    };
    let q = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(qa), qb);
    let m = _mm256_set1_epi8(0x0f);
    (
        _mm256_and_si256(q, m),
        _mm256_and_si256(_mm256_srli_epi16::<4>(q), m),
    )
}

/// The activations as `[y0..16 | y0..16]` and `[y16..32 | y16..32]`, to meet [`nibbles2`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn act_halves(qs: &[i8; 32]) -> (__m256i, __m256i) {
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    let (lo, hi) = unsafe {
        (
            _mm_loadu_si128(qs.as_ptr().cast()),
            _mm_loadu_si128(qs[16..].as_ptr().cast()),
        )
    };
    (
        _mm256_broadcastsi128_si256(lo),
        _mm256_broadcastsi128_si256(hi),
    )
}

/// Four Q4 rows (prepared by [`nibbles2`] in pairs AB, CD) against the activations: products
/// of a row's low and high halves added in i16 (at most 4*15*128 per lane), widened by `madd`
/// and reduced to `[A A C C | B B D D]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn isum_q4(g: &[__m256i; 4], (ylo, yhi): &(__m256i, __m256i)) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let ab = _mm256_add_epi16(
        _mm256_maddubs_epi16(g[0], *ylo),
        _mm256_maddubs_epi16(g[1], *yhi),
    );
    let cd = _mm256_add_epi16(
        _mm256_maddubs_epi16(g[2], *ylo),
        _mm256_maddubs_epi16(g[3], *yhi),
    );
    let (ab, cd) = (_mm256_madd_epi16(ab, ones), _mm256_madd_epi16(cd, ones));
    // [a0 a1 a2 a3 | b..] [c..| d..] → [a0+a2 a1+a3 c0+c2 c1+c3 | b.. d..] → pairs added.
    let t = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b1011_0001>(t))
}

/// An AVX-512 instruction of three 256-bit registers (EVEX-encoded), the first (`acc`) read
/// and written in place, with an optional immediate after them.
///
/// Written as `asm!` because AVX-512 intrinsics and `target_feature`s need Rust 1.89 and the
/// crate builds with 1.88; the register class `ymm_reg` (without avx512f enabled) only hands
/// out ymm0-15, which the EVEX form encodes like VEX registers.
///
/// Each function's safety: the CPU must have avx512vnni and avx512vl (runtime-detected: only
/// the `avx512vnni` table reaches these), besides the features of the enclosing function.
macro_rules! evex_in_place {
    ($(#[$m:meta])* $name:ident, $insn:literal $(, $imm:literal)?) => {
        $(#[$m])*
        ///
        /// # Safety
        /// See [`evex_in_place`].
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            let mut acc = acc;
            // SAFETY: the caller guarantees avx512vnni and avx512vl; the instruction only
            // reads and writes the three registers (no memory, stack or flags).
            unsafe {
                std::arch::asm!(
                    concat!($insn, " {acc}, {a}, {b}" $(, ", ", $imm)?),
                    acc = inout(ymm_reg) acc,
                    a = in(ymm_reg) a,
                    b = in(ymm_reg) b,
                    options(pure, nomem, nostack, preserves_flags)
                )
            };
            acc
        }
    };
}

evex_in_place!(
    /// `acc + sum(u8(a[4k..4k+4]) * i8(b[4k..4k+4]))` in each i32 lane `k`: `vpdpbusd`. Exact,
    /// with no i16 intermediate, so it gives what `madd(maddubs(a, b), 1)` gives wherever
    /// `maddubs` does not saturate, plus `acc`.
    dpbusd,
    "vpdpbusd"
);

evex_in_place!(
    /// `acc + madd(a, b)`: the signed i16 pairs' products summed into each i32 lane, by
    /// `vpdpwssd`; exactly `madd` + `add` where `madd` does not overflow (it cannot but for
    /// `-2^15 · -2^15` twice).
    dpwssd,
    "vpdpwssd"
);

evex_in_place!(
    /// `(acc & a) | b`, bitwise, in one `vpternlogd` (truth table 0xEA: with the inputs' tables
    /// 0xF0, 0xCC and 0xAA, `(0xF0 & 0xCC) | 0xAA`): a masked value merged with bits the mask
    /// leaves clear, one instruction instead of two.
    and_or,
    "vpternlogd",
    "0xEA"
);

/// `vals · y` per lane (exact), minus `*corr` when there is one: [`isum`] with each group of
/// four activation bytes broadcast from memory by the product itself (EVEX embedded broadcast),
/// so a granule costs one instruction instead of a load, a broadcast and the product. Written
/// as `asm!` for the reason [`dpbusd`] is. In a prompt tile the instructions per block, not
/// the products' throughput, bounded the speed.
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn isum_bcast(vals: &[__m256i; 8], y: &[i8; 32], corr: Option<&i32>) -> __m256i {
    let s: __m256i;
    let y = y.as_ptr();
    macro_rules! products {
        ($($tail:literal),*) => {
            // SAFETY: the caller guarantees avx512vnni and avx512vl (EVEX `vpdpbusd`, embedded
            // broadcasts); every load is 4 bytes at `y + 4j` (j < 8) of the 32-byte `y`, or the
            // `i32` behind `corr`; registers only otherwise, no stack, flags untouched.
            unsafe {
                std::arch::asm!(
                    "vpxor {a}, {a}, {a}",
                    "vpxor {b}, {b}, {b}",
                    "vpdpbusd {a}, {v0}, dword ptr [{y}]{{1to8}}",
                    "vpdpbusd {b}, {v1}, dword ptr [{y} + 4]{{1to8}}",
                    "vpdpbusd {a}, {v2}, dword ptr [{y} + 8]{{1to8}}",
                    "vpdpbusd {b}, {v3}, dword ptr [{y} + 12]{{1to8}}",
                    "vpdpbusd {a}, {v4}, dword ptr [{y} + 16]{{1to8}}",
                    "vpdpbusd {b}, {v5}, dword ptr [{y} + 20]{{1to8}}",
                    "vpdpbusd {a}, {v6}, dword ptr [{y} + 24]{{1to8}}",
                    "vpdpbusd {b}, {v7}, dword ptr [{y} + 28]{{1to8}}",
                    "vpaddd {a}, {a}, {b}",
                    $($tail,)*
                    a = out(ymm_reg) s,
                    b = out(ymm_reg) _,
                    v0 = in(ymm_reg) vals[0],
                    v1 = in(ymm_reg) vals[1],
                    v2 = in(ymm_reg) vals[2],
                    v3 = in(ymm_reg) vals[3],
                    v4 = in(ymm_reg) vals[4],
                    v5 = in(ymm_reg) vals[5],
                    v6 = in(ymm_reg) vals[6],
                    v7 = in(ymm_reg) vals[7],
                    y = in(reg) y,
                    c = in(reg) corr.map_or(std::ptr::null(), |c| c as *const i32),
                    options(pure, readonly, nostack, preserves_flags)
                )
            }
        };
    }
    match corr {
        Some(_) => products!("vpsubd {a}, {a}, dword ptr [{c}]{{1to8}}"),
        None => products!("/* no correction: {c} */"),
    }
    s
}

/// [`isum_q4`] through [`dpbusd`]: each row's low and high halves accumulated in i32 lanes
/// directly (`[a0 a1 a2 a3 | b..]`, as `madd` gives them), then the same reduction.
///
/// # Safety
/// As [`dpbusd`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn isum_q4_vnni(g: &[__m256i; 4], (ylo, yhi): &(__m256i, __m256i)) -> __m256i {
    let z = _mm256_setzero_si256();
    // SAFETY: the caller guarantees avx512vnni and avx512vl.
    let (ab, cd) = unsafe {
        (
            dpbusd(dpbusd(z, g[0], *ylo), g[1], *yhi),
            dpbusd(dpbusd(z, g[2], *ylo), g[3], *yhi),
        )
    };
    let t = _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
    _mm256_add_epi32(t, _mm256_shuffle_epi32::<0b1011_0001>(t))
}

/// `[A A C C | B B D D]` of two groups → `[A E C G | B F D H]`.
const Q4_LANES: [[usize; 8]; 2] = [[0, 0, 2, 2, 1, 1, 3, 3], [0, 4, 2, 6, 1, 5, 3, 7]];

/// Two Q4_0 or Q4_1 rows' nibbles ([`nibbles2`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q4<B: Nibbles>(a: &B, b: &B) -> (__m256i, __m256i) {
    nibbles2(a.qs(), b.qs())
}

/// The blocks whose values are 4-bit nibbles, with a fifth bit for Q5.
trait Nibbles {
    fn qs(&self) -> &[u8; 16];
}

macro_rules! nibbles {
    ($($b:ty),*) => {$(
        impl Nibbles for $b {
            #[inline]
            fn qs(&self) -> &[u8; 16] {
                &self.qs
            }
        }
    )*};
}
nibbles!(BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1);

/// The fifth bits of two Q5 rows as `0x10` bytes: `[A | B]` of values 0..16 (bits 0..16 of
/// `qh`) and of 16..32 (bits 16..32), to be or-ed into [`nibbles2`]'s halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bits2(qa: [u8; 4], qb: [u8; 4]) -> (__m256i, __m256i) {
    let h = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_set1_epi32(i32::from_le_bytes(qa))),
        _mm_set1_epi32(i32::from_le_bytes(qb)),
    );
    // Byte k of a lane takes byte k / 8 of its `qh` (2 + k / 8 for the high half), then
    // keeps bit k % 8 of it: equal to the bit's mask exactly when the bit is set.
    let lo_bytes = _mm256_shuffle_epi8(
        h,
        _mm256_set_epi64x(0x0101_0101_0101_0101, 0, 0x0101_0101_0101_0101, 0),
    );
    let hi_bytes = _mm256_shuffle_epi8(
        h,
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
        ),
    );
    (fifth_bit(lo_bytes), fifth_bit(hi_bytes))
}

/// `0x10` in byte `k` where bit `k % 8` of byte `k` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fifth_bit(v: __m256i) -> __m256i {
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// Two Q5_0 or Q5_1 rows' values (0..32): the nibbles with their fifth bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q5<B: Nibbles + FifthBits>(a: &B, b: &B) -> (__m256i, __m256i) {
    let (lo, hi) = nibbles2(a.qs(), b.qs());
    let (h_lo, h_hi) = fifth_bits2(a.qh(), b.qh());
    (_mm256_or_si256(lo, h_lo), _mm256_or_si256(hi, h_hi))
}

/// One Q5_0 block's values (0..32), value `i` in byte `i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_0_values(w: &BlockQ5_0) -> __m256i {
    // `[w | w]` halves of values 0..16 and 16..32: one copy of each.
    let (lo, hi) = unpack_q5(w, w);
    _mm256_permute2x128_si256::<0x20>(lo, hi)
}

/// The Q5 blocks' fifth bits, value `j`'s at bit `j` of the little-endian `qh`.
trait FifthBits {
    fn qh(&self) -> [u8; 4];
}

impl FifthBits for BlockQ5_0 {
    #[inline]
    fn qh(&self) -> [u8; 4] {
        self.qh
    }
}

impl FifthBits for BlockQ5_1 {
    #[inline]
    fn qh(&self) -> [u8; 4] {
        self.qh
    }
}

/// What the 4- and 5-bit formats share: a group is two pairs of rows unpacked by `$unpack`
/// into unsigned values (`[A | B]` of values 0..16 and of 16..32), reduced by [`isum_q4`].
macro_rules! q4_common {
    ($w:ty, $unpack:ident) => {
        type GP = [__m256i; 4];
        type AP = (__m256i, __m256i);
        const LANES: [[usize; 8]; 2] = Q4_LANES;

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn prep_group(w: [&$w; 4]) -> [__m256i; 4] {
            let (ab_lo, ab_hi) = $unpack(w[0], w[1]);
            let (cd_lo, cd_hi) = $unpack(w[2], w[3]);
            [ab_lo, ab_hi, cd_lo, cd_hi]
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn isum_group(g: &[__m256i; 4], a: &(__m256i, __m256i)) -> __m256i {
            isum_q4(g, a)
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn isum_group_vnni(g: &[__m256i; 4], a: &(__m256i, __m256i)) -> __m256i {
            // SAFETY: the caller guarantees avx512vnni and avx512vl (trait contract).
            unsafe { isum_q4_vnni(g, a) }
        }
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn combine(h0: __m256i, h1: __m256i) -> __m256i {
            _mm256_blend_epi32::<0b1010_1010>(h0, h1)
        }
        #[inline]
        fn w_d(w: &$w) -> f16 {
            w.d
        }
    };
}

/// Q4_0 × Q8_0: `sum((q - 8) * y) = sum(q * y) - 8 * sum(y)`, the first through `maddubs` of
/// the unsigned nibbles, the second once per activation block for all rows ([`Fmt::as_corr`]).
pub(super) struct Q4_0;

impl Fmt for Q4_0 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const HAS_CORR: bool = true;
    q4_common!(BlockQ4_0, unpack_q4);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> (__m256i, __m256i) {
        act_halves(&a.qs)
    }
    #[inline]
    fn w_m(_: &BlockQ4_0) -> f16 {
        f16::ZERO
    }
    /// `(d, 8 * sum(y))`.
    type AS = (f32, i32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_0) -> (f32, i32) {
        (
            f16_to_f32(a.d),
            8 * a.qs.iter().map(|&v| i32::from(v)).sum::<i32>(),
        )
    }
    #[inline]
    fn as_d(s: &(f32, i32)) -> f32 {
        s.0
    }
    #[inline]
    fn as_s(_: &(f32, i32)) -> f32 {
        0.0
    }
    #[inline]
    fn as_corr(s: &(f32, i32)) -> i32 {
        s.1
    }
}

/// Q4_1 × Q8_1: `maddubs` of the unsigned nibbles and the activations; `m * s` is added by
/// the tile.
pub(super) struct Q4_1;

impl Fmt for Q4_1 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    const HAS_MIN: bool = true;
    const HAS_CORR: bool = false;
    q4_common!(BlockQ4_1, unpack_q4);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_1) -> (__m256i, __m256i) {
        act_halves(&a.qs)
    }
    #[inline]
    fn w_m(w: &BlockQ4_1) -> f16 {
        w.m
    }
    /// `(d, s)`.
    type AS = (f32, f32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_1) -> (f32, f32) {
        (f16_to_f32(a.d), f16_to_f32(a.s))
    }
    #[inline]
    fn as_d(s: &(f32, f32)) -> f32 {
        s.0
    }
    #[inline]
    fn as_s(s: &(f32, f32)) -> f32 {
        s.1
    }
    #[inline]
    fn as_corr(_: &(f32, f32)) -> i32 {
        0
    }
}

/// Q5_0 × Q8_0: as [`Q4_0`], with the values 0..32 and `16 * sum(y)` subtracted. `maddubs`
/// cannot saturate: a lane of [`isum_q4`]'s i16 sums adds four products of at most 31 * 128.
pub(super) struct Q5_0;

impl Fmt for Q5_0 {
    type W = BlockQ5_0;
    type A = BlockQ8_0;
    const HAS_MIN: bool = false;
    const HAS_CORR: bool = true;
    q4_common!(BlockQ5_0, unpack_q5);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> (__m256i, __m256i) {
        act_halves(&a.qs)
    }
    #[inline]
    fn w_m(_: &BlockQ5_0) -> f16 {
        f16::ZERO
    }
    /// `(d, 16 * sum(y))`.
    type AS = (f32, i32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_0) -> (f32, i32) {
        (
            f16_to_f32(a.d),
            16 * a.qs.iter().map(|&v| i32::from(v)).sum::<i32>(),
        )
    }
    #[inline]
    fn as_d(s: &(f32, i32)) -> f32 {
        s.0
    }
    #[inline]
    fn as_s(_: &(f32, i32)) -> f32 {
        0.0
    }
    #[inline]
    fn as_corr(s: &(f32, i32)) -> i32 {
        s.1
    }
}

/// Q5_1 × Q8_1: as [`Q4_1`], with the values 0..32.
pub(super) struct Q5_1;

impl Fmt for Q5_1 {
    type W = BlockQ5_1;
    type A = BlockQ8_1;
    const HAS_MIN: bool = true;
    const HAS_CORR: bool = false;
    q4_common!(BlockQ5_1, unpack_q5);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_1) -> (__m256i, __m256i) {
        act_halves(&a.qs)
    }
    #[inline]
    fn w_m(w: &BlockQ5_1) -> f16 {
        w.m
    }
    /// `(d, s)`.
    type AS = (f32, f32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_1) -> (f32, f32) {
        (f16_to_f32(a.d), f16_to_f32(a.s))
    }
    #[inline]
    fn as_d(s: &(f32, f32)) -> f32 {
        s.0
    }
    #[inline]
    fn as_s(s: &(f32, f32)) -> f32 {
        s.1
    }
    #[inline]
    fn as_corr(_: &(f32, f32)) -> i32 {
        0
    }
}

/// Q8_0 × Q8_0: ggml's sign trick, `maddubs(|x|, sign(y, x))`, reduced in i32 (pair sums
/// reach 2*128*127). Exact for any weights; an activation of -128 against a negative weight
/// would wrap (`sign` negates it), but the activations come from our quantizer, whose output is
/// within -127..=127 (`|round(v / d)| <= 127`), as in ggml.
pub(super) struct Q8_0;

impl Fmt for Q8_0 {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    type GP = [(__m256i, __m256i); 4];
    type AP = __m256i;
    const HAS_MIN: bool = false;
    const HAS_CORR: bool = false;
    /// `[r0 r1 r2 r3 | r4 r5 r6 r7]`, one group repeated.
    const LANES: [[usize; 8]; 2] = [[0, 1, 2, 3, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 7]];

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_group(w: [&BlockQ8_0; 4]) -> [(__m256i, __m256i); 4] {
        w.map(|b| {
            let x = load_i8x32(&b.qs);
            (_mm256_sign_epi8(x, x), x)
        })
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> __m256i {
        load_i8x32(&a.qs)
    }
    /// `[r0 r1 r2 r3 | r0' r1' r2' r3']`: each row's sums over the two halves of the block.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group(g: &[(__m256i, __m256i); 4], y: &__m256i) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        q8_reduce(g.map(|(ax, x)| {
            _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(*y, x)), ones)
        }))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group_vnni(g: &[(__m256i, __m256i); 4], y: &__m256i) -> __m256i {
        let z = _mm256_setzero_si256();
        // SAFETY: the caller guarantees avx512vnni and avx512vl (trait contract).
        q8_reduce(g.map(|(ax, x)| unsafe { dpbusd(z, ax, _mm256_sign_epi8(*y, x)) }))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn combine(h0: __m256i, h1: __m256i) -> __m256i {
        let lo = _mm256_permute2x128_si256::<0x20>(h0, h1);
        let hi = _mm256_permute2x128_si256::<0x31>(h0, h1);
        _mm256_add_epi32(lo, hi)
    }
    #[inline]
    fn w_d(w: &BlockQ8_0) -> f16 {
        w.d
    }
    #[inline]
    fn w_m(_: &BlockQ8_0) -> f16 {
        f16::ZERO
    }
    /// `d`.
    type AS = f32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_0) -> f32 {
        f16_to_f32(a.d)
    }
    #[inline]
    fn as_d(s: &f32) -> f32 {
        *s
    }
    #[inline]
    fn as_s(_: &f32) -> f32 {
        0.0
    }
    #[inline]
    fn as_corr(_: &f32) -> i32 {
        0
    }
}

/// Q8_0 × Q8_0 through `vpdpbusd`, without the sign trick: the weights offset to unsigned
/// (`x ^ 0x80` is `x + 128` as u8), `sum((x + 128) * y) - 128 * sum(y)`, the correction once
/// per activation block for all rows (as Q4_0's). Exact for any weights and activations
/// (`|sum| <= 32 * 255 * 128`), so the same sums as [`Q8_0`]'s; a group is 4 registers instead
/// of 8, and a token needs no `sign` per row.
///
/// All of this type's `unsafe fn`s (not only [`Fmt::isum_group_vnni`]) need avx512vnni and
/// avx512vl besides the AVX2 set: it is only used by the `avx512vnni` table.
pub(super) struct Q8_0Vnni;

impl Fmt for Q8_0Vnni {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    type GP = [__m256i; 4];
    type AP = __m256i;
    const HAS_MIN: bool = false;
    const HAS_CORR: bool = true;
    const LANES: [[usize; 8]; 2] = Q8_0::LANES;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_group(w: [&BlockQ8_0; 4]) -> [__m256i; 4] {
        let bias = _mm256_set1_epi8(-128);
        w.map(|b| _mm256_xor_si256(load_i8x32(&b.qs), bias))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &BlockQ8_0) -> __m256i {
        load_i8x32(&a.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group(g: &[__m256i; 4], y: &__m256i) -> __m256i {
        // SAFETY: the caller guarantees avx512vnni and avx512vl (this type's contract).
        unsafe { Self::isum_group_vnni(g, y) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group_vnni(g: &[__m256i; 4], y: &__m256i) -> __m256i {
        let z = _mm256_setzero_si256();
        // SAFETY: the caller guarantees avx512vnni and avx512vl (trait contract).
        q8_reduce(g.map(|xu| unsafe { dpbusd(z, xu, *y) }))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn combine(h0: __m256i, h1: __m256i) -> __m256i {
        // SAFETY: same features as this function's.
        unsafe { Q8_0::combine(h0, h1) }
    }
    #[inline]
    fn w_d(w: &BlockQ8_0) -> f16 {
        w.d
    }
    #[inline]
    fn w_m(_: &BlockQ8_0) -> f16 {
        f16::ZERO
    }
    /// `(d, 128 * sum(y))`.
    type AS = (f32, i32);
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &BlockQ8_0) -> (f32, i32) {
        (
            f16_to_f32(a.d),
            128 * a.qs.iter().map(|&v| i32::from(v)).sum::<i32>(),
        )
    }
    #[inline]
    fn as_d(s: &(f32, i32)) -> f32 {
        s.0
    }
    #[inline]
    fn as_s(_: &(f32, i32)) -> f32 {
        0.0
    }
    #[inline]
    fn as_corr(s: &(f32, i32)) -> i32 {
        s.1
    }
}

/// Four rows' i32 partial sums (`[a0 a1 a2 a3 | a4..a7]` each) → `[a b c d | a' b' c' d']`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q8_reduce(p: [__m256i; 4]) -> __m256i {
    // [a0 a1 a2 a3 | ..] x4 → [a0+a2 b0+b2 a1+a3 b1+b3 | ..] → [a b c d | a' b' c' d'].
    let ab = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[0], p[1]),
        _mm256_unpackhi_epi32(p[0], p[1]),
    );
    let cd = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[2], p[3]),
        _mm256_unpackhi_epi32(p[2], p[3]),
    );
    _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd))
}

/// A format with its integer sums through `vpdpbusd` ([`Fmt::isum_group_vnni`]) and
/// everything else as `F`: the same results, for the `avx512vnni` table.
pub(super) struct Vnni<F>(std::marker::PhantomData<F>);

impl<F: Fmt> Fmt for Vnni<F> {
    type W = F::W;
    type A = F::A;
    type GP = F::GP;
    type AP = F::AP;
    const HAS_MIN: bool = F::HAS_MIN;
    const HAS_CORR: bool = F::HAS_CORR;
    const LANES: [[usize; 8]; 2] = F::LANES;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_group(w: [&Self::W; 4]) -> Self::GP {
        // SAFETY: same contract as `F`'s.
        unsafe { F::prep_group(w) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prep_a(a: &Self::A) -> Self::AP {
        // SAFETY: same contract as `F`'s.
        unsafe { F::prep_a(a) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group(g: &Self::GP, a: &Self::AP) -> __m256i {
        // SAFETY: this type's tables run only where avx512vnni and avx512vl were detected.
        unsafe { F::isum_group_vnni(g, a) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn isum_group_vnni(g: &Self::GP, a: &Self::AP) -> __m256i {
        // SAFETY: same contract as `F`'s.
        unsafe { F::isum_group_vnni(g, a) }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn combine(h0: __m256i, h1: __m256i) -> __m256i {
        // SAFETY: same contract as `F`'s.
        unsafe { F::combine(h0, h1) }
    }
    #[inline]
    fn w_d(w: &Self::W) -> f16 {
        F::w_d(w)
    }
    #[inline]
    fn w_m(w: &Self::W) -> f16 {
        F::w_m(w)
    }
    type AS = F::AS;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn a_scalars(a: &Self::A) -> Self::AS {
        // SAFETY: same contract as `F`'s.
        unsafe { F::a_scalars(a) }
    }
    #[inline]
    fn as_d(s: &Self::AS) -> f32 {
        F::as_d(s)
    }
    #[inline]
    fn as_s(s: &Self::AS) -> f32 {
        F::as_s(s)
    }
    #[inline]
    fn as_corr(s: &Self::AS) -> i32 {
        F::as_corr(s)
    }
}
