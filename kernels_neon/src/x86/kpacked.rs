//! Products over K-quant weights interleaved eight rows at a time ([`BlockQ4Kx8`],
//! [`BlockQ5Kx8`], [`BlockQ6Kx8`]), for the `avx2` and `avx512vnni` tables: the layout the
//! engine packs K-quant matrices into at load.
//!
//! One 32-byte load holds four levels of one sub-block of each of the eight rows, so an
//! integer product against four broadcast activation bytes leaves each row's partial sum in its
//! own lane: a sub-block's sum for eight rows comes out of eight (Q4_K, Q5_K) or four (Q6_K)
//! such products, and its scale is applied to the eight rows by one lane-wise multiply with a
//! vector of their scales. The scales themselves are decoded for eight rows at once: a row's
//! 6-bit scales and mins are three 32-bit words, which lane-wise shifts and masks turn into four
//! bytes of scales or mins per lane, and a byte shuffle spreads one of them per lane. No
//! horizontal reduction, no scalar scale decoding per row, one sequential stream of weights.
//!
//! Exactness: every row's block sum `sumi` and mins sum `Σ min · bsum` are exact integers,
//! whatever the order, and the float steps per (row, token) and block are `kseq`'s,
//! lane by lane: `mins = fma(f32(off), dmin · d_a, mins)`, `acc = fma(f32(sumi), d · d_a,
//! acc)` (Q6_K's offset `off` taken from `sumi` instead), `acc - mins` at the end. So the
//! results are the unpacked kernels' bits (`x86/kquant.rs`), and NEON's.
//!
//! - AVX2 ([`Avx2`]): `maddubs` products summed in i16 lanes for as many granules as cannot
//!   overflow (`2 · level · 128` each: eight for Q4_K, four for Q5_K, two for Q6_K), then one
//!   `madd` with the scale in both halves of each row's lane.
//! - AVX-512 VNNI ([`Vnni`]): `vpdpbusd` straight into i32 lanes for a whole sub-block, then
//!   one `vpmulld` by the scales; the mins through `vpdpwssd`.

use super::dot::{and_or, dpbusd, dpwssd};
use super::simd::{load_ph, store_ps};
use crate::block::{BlockQ4Kx8, BlockQ5Kx8, BlockQ6Kx8, BlockQ8K, PACK_ROWS};
use crate::hint::prefetch_ahead;
use std::arch::x86_64::*;

/// Tokens per tile of a matrix-matrix product (one group of 8 rows): each granule's levels are
/// extracted once for them.
const TOKS: usize = 4;

/// How a path sums the granule products of a sub-block and applies its scale.
trait Isa {
    /// Granules a partial sum may take, for levels up to `max_level`, before it must be
    /// scaled into the block's sum.
    fn flush_every(max_level: i32) -> usize;
    /// The scale of byte `j` (0..4) of each lane of `sc`, in the form [`Isa::scale_add`] takes;
    /// `signed`: the bytes are i8 (Q6_K).
    ///
    /// # Safety
    /// avx2 (the enclosing bodies'), and the table's own features.
    unsafe fn scale(sc: __m256i, j: usize, signed: bool) -> __m256i;
    /// `part` plus the products of the u8 levels `q` and i8 activations `y`, four per lane.
    ///
    /// # Safety
    /// As [`Isa::scale`].
    unsafe fn acc(part: __m256i, q: __m256i, y: __m256i) -> __m256i;
    /// `sumi + part · scale` per lane.
    ///
    /// # Safety
    /// As [`Isa::scale`].
    unsafe fn scale_add(sumi: __m256i, part: __m256i, scale: __m256i) -> __m256i;
    /// `acc + madd(a, b)`.
    ///
    /// # Safety
    /// As [`Isa::scale`].
    unsafe fn madd_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// Two partial sums as one (together within [`Isa::flush_every`]'s granules).
    ///
    /// # Safety
    /// As [`Isa::scale`].
    unsafe fn add_parts(a: __m256i, b: __m256i) -> __m256i;
    /// `(a & mask) | high`: levels' low bits merged with their high bits.
    ///
    /// # Safety
    /// As [`Isa::scale`].
    unsafe fn merge(a: __m256i, mask: __m256i, high: __m256i) -> __m256i;
}

/// Independent partial sums per token and sub-block: one token alone would otherwise wait on
/// one chain of products (`vpdpbusd`'s latency, not the memory, would bound a decode step);
/// several tokens are chains enough.
const fn chains(tokens: usize) -> usize {
    if tokens == 1 { 2 } else { 1 }
}

/// The 32 bytes of a byte-shuffle mask taking `src[i]` (0..4, or 0x80 for a zero byte) of
/// each 32-bit lane into byte `i` of it.
const fn lane_mask_bytes(src: [u8; 4]) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let b = src[i % 4];
        out[i] = if b & 0x80 != 0 {
            0x80
        } else {
            b + 4 * ((i / 4) % 4) as u8
        };
        i += 1;
    }
    out
}

/// The shuffles of byte `j` of each lane (the tables keep them out of the loops: built from
/// integers where a loop is not unrolled, they cost more than the products they feed).
/// As the two i16 halves of the lane (unsigned; signed in the high bytes, for `srai`).
static PAIR_U: [[u8; 32]; 4] = [
    lane_mask_bytes([0, 0x80, 0, 0x80]),
    lane_mask_bytes([1, 0x80, 1, 0x80]),
    lane_mask_bytes([2, 0x80, 2, 0x80]),
    lane_mask_bytes([3, 0x80, 3, 0x80]),
];
static PAIR_S: [[u8; 32]; 4] = [
    lane_mask_bytes([0x80, 0, 0x80, 0]),
    lane_mask_bytes([0x80, 1, 0x80, 1]),
    lane_mask_bytes([0x80, 2, 0x80, 2]),
    lane_mask_bytes([0x80, 3, 0x80, 3]),
];
/// As the whole lane (unsigned; signed in the top byte, for `srai`).
static LANE_U: [[u8; 32]; 4] = [
    lane_mask_bytes([0, 0x80, 0x80, 0x80]),
    lane_mask_bytes([1, 0x80, 0x80, 0x80]),
    lane_mask_bytes([2, 0x80, 0x80, 0x80]),
    lane_mask_bytes([3, 0x80, 0x80, 0x80]),
];
static LANE_S: [[u8; 32]; 4] = [
    lane_mask_bytes([0x80, 0x80, 0x80, 0]),
    lane_mask_bytes([0x80, 0x80, 0x80, 1]),
    lane_mask_bytes([0x80, 0x80, 0x80, 2]),
    lane_mask_bytes([0x80, 0x80, 0x80, 3]),
];
/// Bytes `2q` and `2q + 1` (`q` = 0, 1) as the high bytes of the lane's two i16 halves.
static TWO_S: [[u8; 32]; 2] = [
    lane_mask_bytes([0x80, 0, 0x80, 1]),
    lane_mask_bytes([0x80, 2, 0x80, 3]),
];

/// `sc` shuffled by `mask`.
#[inline(always)]
fn shuffle(sc: __m256i, mask: &[u8; 32]) -> __m256i {
    // SAFETY: `mask` covers 32 readable bytes and `loadu` has no alignment requirement; avx2,
    // which every caller's body has.
    unsafe { _mm256_shuffle_epi8(sc, _mm256_loadu_si256(mask.as_ptr().cast())) }
}

/// AVX2: `maddubs` into i16 lanes, `madd` with the scale as an i16 pair per row.
pub(super) struct Avx2;
impl Isa for Avx2 {
    #[inline(always)]
    fn flush_every(max_level: i32) -> usize {
        // Each `maddubs` lane adds two products of at most `max_level · 128`.
        (i16::MAX as i32 / (2 * max_level * 128)) as usize
    }
    #[inline(always)]
    unsafe fn scale(sc: __m256i, j: usize, signed: bool) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe {
            if signed {
                _mm256_srai_epi16::<8>(shuffle(sc, &PAIR_S[j]))
            } else {
                shuffle(sc, &PAIR_U[j])
            }
        }
    }
    #[inline(always)]
    unsafe fn acc(part: __m256i, q: __m256i, y: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi16(part, _mm256_maddubs_epi16(q, y)) }
    }
    #[inline(always)]
    unsafe fn scale_add(sumi: __m256i, part: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi32(sumi, _mm256_madd_epi16(part, scale)) }
    }
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn add_parts(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi16(a, b) }
    }
    #[inline(always)]
    unsafe fn merge(a: __m256i, mask: __m256i, high: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_or_si256(_mm256_and_si256(a, mask), high) }
    }
}

/// AVX-512 VNNI: `vpdpbusd` into i32 lanes, `vpmulld` by the scale, `vpdpwssd` for the mins.
pub(super) struct Vnni;
impl Isa for Vnni {
    #[inline(always)]
    fn flush_every(_max_level: i32) -> usize {
        // |sum| of a whole sub-block is below 32 · 63 · 128 < 2^31.
        usize::MAX
    }
    #[inline(always)]
    unsafe fn scale(sc: __m256i, j: usize, signed: bool) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe {
            if signed {
                _mm256_srai_epi32::<24>(shuffle(sc, &LANE_S[j]))
            } else {
                shuffle(sc, &LANE_U[j])
            }
        }
    }
    #[inline(always)]
    unsafe fn acc(part: __m256i, q: __m256i, y: __m256i) -> __m256i {
        // SAFETY: the caller guarantees avx512vnni and avx512vl (the `avx512vnni` table).
        unsafe { dpbusd(part, q, y) }
    }
    #[inline(always)]
    unsafe fn scale_add(sumi: __m256i, part: __m256i, scale: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi32(sumi, _mm256_mullo_epi32(part, scale)) }
    }
    #[inline(always)]
    unsafe fn madd_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: as `acc`.
        unsafe { dpwssd(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn add_parts(a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: avx2, as the caller guarantees.
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn merge(a: __m256i, mask: __m256i, high: __m256i) -> __m256i {
        // SAFETY: avx512vl, as the caller guarantees (the `avx512vnni` table).
        unsafe { and_or(a, mask, high) }
    }
}

/// 32 bytes at `x[at..]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(x: &[u8], at: usize) -> __m256i {
    let x: &[u8; 32] = x[at..at + 32].try_into().expect("32 bytes");
    // SAFETY: the reference covers 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(x.as_ptr().cast()) }
}

/// Activation bytes `at..at + 4` of `y`, broadcast to every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn y4(y: &BlockQ8K, at: usize) -> __m256i {
    let q = &y.qs[at..at + 4];
    _mm256_set1_epi32(i32::from_le_bytes([
        q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8,
    ]))
}

/// The activation's `bsums[2j]` and `bsums[2j + 1]` as one 32-bit lane, broadcast.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bsum_pair(y: &BlockQ8K, j: usize) -> __m256i {
    let (lo, hi) = (
        y.bsums[2 * j] as u16 as u32,
        y.bsums[2 * j + 1] as u16 as u32,
    );
    _mm256_set1_epi32((lo | hi << 16) as i32)
}

/// A packed K-quant block's integer sums for `T` tokens.
trait PkK: Copy {
    /// Whether the block has mins (`dmin`), else the offset comes off the integer sum.
    const HAS_MIN: bool;
    /// `([sumi; T], [off; T])`: each row's exact block sum and `Σ bsum_mul · bsums`.
    ///
    /// # Safety
    /// As [`Isa::scale`] for `I`.
    unsafe fn sums<I: Isa, const T: usize>(
        p: &Self,
        ys: &[&BlockQ8K; T],
    ) -> ([__m256i; T], [__m256i; T]);
    /// `(d, dmin)` of the eight rows (`dmin` zero without mins).
    ///
    /// # Safety
    /// avx2, fma and f16c.
    unsafe fn d(p: &Self) -> (__m256, __m256);
}

/// Each row's 6-bit scales of sub-blocks 0..4 and 4..8 and mins of 0..4 and 4..8, a byte each
/// in its lane: `get_scale_min_k4` for eight rows at once, on their three words of `scales`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q45_scales(scales: &[u8; 96]) -> [__m256i; 4] {
    let (w0, w1, w2) = (load32(scales, 0), load32(scales, 32), load32(scales, 64));
    let m6 = _mm256_set1_epi8(0x3f);
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    // The top two bits of each byte of `w`, moved to bits 4 and 5.
    let top = |w: __m256i| _mm256_slli_epi32::<4>(_mm256_and_si256(_mm256_srli_epi32::<6>(w), m2));
    [
        _mm256_and_si256(w0, m6),
        _mm256_or_si256(_mm256_and_si256(w2, m4), top(w0)),
        _mm256_and_si256(w1, m6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32::<4>(w2), m4), top(w1)),
    ]
}

/// Q4_K (`qh = None`) or Q5_K: granule `8p + c` of `qs` holds values `4c..4c + 4` of
/// sub-blocks `2p` (low nibbles) and `2p + 1` (high) of every row, granule `c` of `qh` their
/// fifth bits (bits `2p`, `2p + 1`).
///
/// # Safety
/// As [`Isa::scale`] for `I`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q45_sums<I: Isa, const T: usize>(
    qs: &[u8; 1024],
    qh: Option<&[u8; 256]>,
    scales: &[u8; 96],
    ys: &[&BlockQ8K; T],
) -> ([__m256i; T], [__m256i; T]) {
    let [sc_lo, sc_hi, mn_lo, mn_hi] = q45_scales(scales);
    let every = I::flush_every(if qh.is_some() { 31 } else { 15 });
    let m4 = _mm256_set1_epi8(0x0f);
    let sixteen = _mm256_set1_epi8(16);
    let zero = _mm256_setzero_si256();
    let mut sumi = [zero; T];
    for p in 0..4 {
        let sc = if p < 2 { sc_lo } else { sc_hi };
        // SAFETY (every `I::` call of this function): passed on from the caller.
        let (s_lo, s_hi) = unsafe {
            (
                I::scale(sc, (2 * p) % 4, false),
                I::scale(sc, (2 * p + 1) % 4, false),
            )
        };
        let (mut plo, mut phi) = ([[zero; 2]; T], [[zero; 2]; T]);
        for c in 0..8 {
            let ch = c % chains(T);
            let v = load32(qs, 32 * (8 * p + c));
            let v_hi = _mm256_srli_epi16::<4>(v);
            let (lo, hi) = match qh {
                None => (_mm256_and_si256(v, m4), _mm256_and_si256(v_hi, m4)),
                Some(qh) => {
                    let h = load32(qh, 32 * c);
                    let bit = |k: usize| {
                        let m = _mm256_set1_epi8((1u8 << k) as i8);
                        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, m), m), sixteen)
                    };
                    // SAFETY: passed on from the caller.
                    unsafe {
                        (
                            I::merge(v, m4, bit(2 * p)),
                            I::merge(v_hi, m4, bit(2 * p + 1)),
                        )
                    }
                }
            };
            for t in 0..T {
                unsafe {
                    plo[t][ch] = I::acc(plo[t][ch], lo, y4(ys[t], 64 * p + 4 * c));
                    phi[t][ch] = I::acc(phi[t][ch], hi, y4(ys[t], 64 * p + 32 + 4 * c));
                }
            }
            if (c + 1) % every.min(8) == 0 {
                for t in 0..T {
                    unsafe {
                        let (lo, hi) = if chains(T) == 1 {
                            (plo[t][0], phi[t][0])
                        } else {
                            (
                                I::add_parts(plo[t][0], plo[t][1]),
                                I::add_parts(phi[t][0], phi[t][1]),
                            )
                        };
                        sumi[t] = I::scale_add(sumi[t], lo, s_lo);
                        sumi[t] = I::scale_add(sumi[t], hi, s_hi);
                    }
                    (plo[t], phi[t]) = ([zero; 2], [zero; 2]);
                }
            }
        }
    }
    // Mins: `Σ_j min_j · (bsums[2j] + bsums[2j + 1])`, the pair of bsums against the min in
    // both halves of each row's lane.
    let pairs: [__m256i; 8] = std::array::from_fn(|j| {
        let mn = if j < 4 { mn_lo } else { mn_hi };
        shuffle(mn, &PAIR_U[j % 4])
    });
    let off = std::array::from_fn(|t| {
        let mut o = zero;
        for (j, &m) in pairs.iter().enumerate() {
            o = unsafe { I::madd_add(o, m, bsum_pair(ys[t], j)) };
        }
        o
    });
    (sumi, off)
}

impl PkK for BlockQ4Kx8 {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(
        p: &Self,
        ys: &[&BlockQ8K; T],
    ) -> ([__m256i; T], [__m256i; T]) {
        // SAFETY: passed on from the caller.
        unsafe { q45_sums::<I, T>(&p.qs, None, &p.scales, ys) }
    }
    #[inline(always)]
    unsafe fn d(p: &Self) -> (__m256, __m256) {
        // SAFETY: passed on from the caller.
        unsafe { (load_ph(&p.d), load_ph(&p.dmin)) }
    }
}

impl PkK for BlockQ5Kx8 {
    const HAS_MIN: bool = true;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(
        p: &Self,
        ys: &[&BlockQ8K; T],
    ) -> ([__m256i; T], [__m256i; T]) {
        // SAFETY: passed on from the caller.
        unsafe { q45_sums::<I, T>(&p.qs, Some(&p.qh), &p.scales, ys) }
    }
    #[inline(always)]
    unsafe fn d(p: &Self) -> (__m256, __m256) {
        // SAFETY: passed on from the caller.
        unsafe { (load_ph(&p.d), load_ph(&p.dmin)) }
    }
}

impl PkK for BlockQ6Kx8 {
    const HAS_MIN: bool = false;
    #[inline(always)]
    unsafe fn sums<I: Isa, const T: usize>(
        p: &Self,
        ys: &[&BlockQ8K; T],
    ) -> ([__m256i; T], [__m256i; T]) {
        // SAFETY: passed on from the caller.
        unsafe { q6_sums::<I, T>(p, ys) }
    }
    #[inline(always)]
    unsafe fn d(p: &Self) -> (__m256, __m256) {
        // SAFETY: passed on from the caller.
        unsafe { (load_ph(&p.d), _mm256_setzero_ps()) }
    }
}

/// Q6_K: value `128n + 32k + l` of a row takes the low (`k` = 0, 1) or high (2, 3) nibble of
/// `ql[64n + 32(k & 1) + l]` and bits `2k, 2k + 1` of `qh[32n + l]`; in 4-byte granules,
/// `ql` granule `16n + 8(k & 1) + l / 4` and `qh` granule `8n + l / 4`. Sub-block
/// `8n + 2k + l / 16` (16 values) has scale byte `i % 4` of granule `i / 4` of `scales`.
///
/// # Safety
/// As [`Isa::scale`] for `I`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_sums<I: Isa, const T: usize>(
    p: &BlockQ6Kx8,
    ys: &[&BlockQ8K; T],
) -> ([__m256i; T], [__m256i; T]) {
    let scales: &[u8; 128] = bytemuck::cast_ref(&p.scales);
    let sc: [__m256i; 4] = std::array::from_fn(|c| load32(scales, 32 * c));
    let every = I::flush_every(63).min(4);
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let zero = _mm256_setzero_si256();
    let mut sumi = [zero; T];
    for n in 0..2 {
        for h in 0..2 {
            // The four sub-blocks `8n + 2k + h` (k = 0..4) share their granules of `qh` and,
            // in pairs, of `ql`: loaded once, and four independent chains per token.
            // SAFETY (every `I::` call of this function): passed on from the caller.
            let s: [__m256i; 4] = std::array::from_fn(|k| {
                let i = 8 * n + 2 * k + h;
                unsafe { I::scale(sc[i / 4], i % 4, true) }
            });
            let mut part = [[zero; T]; 4];
            for c in 0..4 {
                let l4 = 4 * h + c; // granule of l within the 32-value run
                let ql0 = load32(&p.ql, 32 * (16 * n + l4));
                let ql1 = load32(&p.ql, 32 * (16 * n + 8 + l4));
                let qh = load32(&p.qh, 32 * (8 * n + l4));
                // Bits 2k, 2k + 1 of each byte of `qh` moved to bits 4, 5 (a 16-bit shift
                // moves bits across the byte boundary only outside the mask).
                let high = [
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                    _mm256_and_si256(qh, m30),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                ];
                // SAFETY: passed on from the caller.
                let q = unsafe {
                    [
                        I::merge(ql0, m4, high[0]),
                        I::merge(ql1, m4, high[1]),
                        I::merge(_mm256_srli_epi16::<4>(ql0), m4, high[2]),
                        I::merge(_mm256_srli_epi16::<4>(ql1), m4, high[3]),
                    ]
                };
                for k in 0..4 {
                    for t in 0..T {
                        let at = 128 * n + 32 * k + 4 * l4;
                        unsafe { part[k][t] = I::acc(part[k][t], q[k], y4(ys[t], at)) };
                    }
                }
                if (c + 1) % every == 0 {
                    for k in 0..4 {
                        for t in 0..T {
                            unsafe { sumi[t] = I::scale_add(sumi[t], part[k][t], s[k]) };
                            part[k][t] = zero;
                        }
                    }
                }
            }
        }
    }
    // The levels' offset: `Σ_i 32 · scale_i · bsums[i]`, scales `2q` and `2q + 1` (i8, times
    // 32 within ±4096) as the two i16 halves of each row's lane against the pair of bsums.
    let pairs: [__m256i; 8] = std::array::from_fn(|q| {
        let v = shuffle(sc[q / 2], &TWO_S[q % 2]);
        _mm256_slli_epi16::<5>(_mm256_srai_epi16::<8>(v))
    });
    let off = std::array::from_fn(|t| {
        let mut o = zero;
        for (q, &m) in pairs.iter().enumerate() {
            o = unsafe { I::madd_add(o, m, bsum_pair(ys[t], q)) };
        }
        o
    });
    (sumi, off)
}

/// Group `g` (rows `8g..8g + 8`, blocks `g · nb..` of `w`) × tokens `t0..t0 + T`, into `out` (`[row][tok]`).
///
/// # Safety
/// As [`Isa::scale`] for `I`; `w` holds group `g`, `a` `n_tok` tokens of `nb` blocks, `out`
/// the group's rows × `n_tok`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<P: PkK, I: Isa, const T: usize>(
    w: &[P],
    nb: usize,
    a: &[BlockQ8K],
    n_tok: usize,
    g: usize,
    t0: usize,
    out: &mut [f32],
) {
    let zero = _mm256_setzero_ps();
    let (mut acc, mut mins) = ([zero; T], [zero; T]);
    let wg = &w[g * nb..(g + 1) * nb];
    for (b, p) in wg.iter().enumerate() {
        if t0 == 0 {
            // The first token tile streams the weights from memory: a block's granules are
            // read out of order, which the hardware's stream detection follows poorly.
            prefetch_ahead(w, g * nb + b);
        }
        let ys: [&BlockQ8K; T] = std::array::from_fn(|j| &a[(t0 + j) * nb + b]);
        // SAFETY: passed on from the caller.
        let ((sumi, off), (d, dmin)) = unsafe { (P::sums::<I, T>(p, &ys), P::d(p)) };
        for j in 0..T {
            let da = _mm256_set1_ps(ys[j].d);
            let sumi = if P::HAS_MIN {
                let dm = _mm256_mul_ps(dmin, da);
                mins[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(off[j]), dm, mins[j]);
                sumi[j]
            } else {
                _mm256_sub_epi32(sumi[j], off[j])
            };
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d, da), acc[j]);
        }
    }
    for j in 0..T {
        let mut l = [0.0f32; PACK_ROWS];
        store_ps(&mut l, _mm256_sub_ps(acc[j], mins[j]));
        for (k, v) in l.iter().enumerate() {
            out[(g * PACK_ROWS + k) * n_tok + t0 + j] = *v;
        }
    }
}

/// Every group × token of a product, a group at a time (one sequential stream of weights).
///
/// # Safety
/// As [`Isa::scale`] for `I`; shapes as `check_packed` checks them, `nb > 0`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<P: PkK, I: Isa>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    let groups = out.len() / n_tok / PACK_ROWS;
    for g in 0..groups {
        let mut t = 0;
        // SAFETY (every call): passed on from the caller.
        unsafe {
            while t + TOKS <= n_tok {
                tile::<P, I, TOKS>(w, nb, a, n_tok, g, t, out);
                t += TOKS;
            }
            match n_tok - t {
                0 => {}
                1 => tile::<P, I, 1>(w, nb, a, n_tok, g, t, out),
                2 => tile::<P, I, 2>(w, nb, a, n_tok, g, t, out),
                _ => tile::<P, I, 3>(w, nb, a, n_tok, g, t, out),
            }
        }
    }
}

/// [`run`] with AVX2's sums.
///
/// # Safety
/// avx2, fma and f16c; shapes as [`run`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<P: PkK>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
    // SAFETY: passed on from the caller.
    unsafe { run::<P, Avx2>(w, a, nb, n_tok, out) }
}

packed_k_table!("AVX2", "avx2, fma, f16c", run_avx2);

/// The `avx512vnni` table's packed K-quant products.
pub(super) mod vnni {
    use super::*;

    /// [`run`] with AVX-512 VNNI's sums.
    ///
    /// # Safety
    /// avx2, fma, f16c, avx512vnni and avx512vl; shapes as [`run`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn run_vnni<P: PkK>(w: &[P], a: &[BlockQ8K], nb: usize, n_tok: usize, out: &mut [f32]) {
        // SAFETY: passed on from the caller.
        unsafe { run::<P, Vnni>(w, a, nb, n_tok, out) }
    }

    packed_k_table!(
        "AVX2 + AVX512-VNNI",
        "avx2, fma, f16c, avx512vnni, avx512vl",
        run_vnni
    );
}
