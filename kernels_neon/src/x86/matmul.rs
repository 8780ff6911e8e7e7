//! Dot products, matrix-vector and matrix-matrix products (AVX2).
//!
//! Everything goes through one register tile, [`tile`]: `G` groups of 4 weight rows × `RN`
//! tokens. Each (row, token) pair owns one f32 lane that receives, block by block,
//! `fma(f32(sumi), d_w * d_a, acc)` (`sumi` the block's exact integer dot product, `d_w * d_a`
//! rounded to f32), then `fma(m, s, acc)` for Q4_1: the reference's sequence with fused
//! multiply-adds. It is the same for every pair whatever the tile shape, so a row's result
//! does not depend on how many rows a caller passes, where the row falls in a tile, or whether
//! it came through `vec_dot`, `matvec` or `matmul`: edges use smaller instances of the same
//! tile (a group padded with zero rows, fewer tokens).

use super::dot::{Fmt, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_0Vnni, Vnni, isum_bcast, q5_0_values};
use super::simd::{load_i8x32, load_ps, store_ps};
use crate::block::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use crate::reference::{check_matmul, check_matvec};
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Groups of 4 rows per pass of a matrix-vector product (they share each activation block).
const MV_GROUPS: usize = 2;
/// Register tile of a matrix-matrix product: `MM_GROUPS` groups of 4 rows × `MM_TOKS` tokens.
const MM_GROUPS: usize = 2;
const MM_TOKS: usize = 3;
const VNNI_MM_GROUPS: usize = 2;
const VNNI_MM_TOKS: usize = 4;
/// Tokens per tile of the `avx512vnni` repacked products (8 rows each).
const VNNI_RP_TOKS: usize = 4;
/// How far ahead (in bytes) the weights are prefetched: 4-16 KiB measured best for the LM
/// head matrix-vector product (16 MB) on Zen 4, more thrashes L1.
const PREFETCH_BYTES: usize = 8192;
/// Activation blocks whose scalars (`Fmt::AS`) a matrix product converts at a time, on the
/// stack (the engine allocates nothing per token): all blocks of up to `SCRATCH / nb` tokens,
/// or `SCRATCH` blocks of one token when a row is longer.
const SCRATCH: usize = 4096;
/// The same for `vec_dot`, which is called on short rows.
const SCRATCH_DOT: usize = 64;

/// Weights and activations of a product, and the chunk of them being worked on: blocks
/// `k0..k0+kb` of every row and token, tokens `t0..` with their scalars in `sc`
/// (`sc[(t - t0) * kb + b]`).
struct Chunk<'a, F: Fmt> {
    w: &'a [F::W],
    a: &'a [F::A],
    sc: &'a [F::AS],
    nb: usize,
    n_tok: usize,
    k0: usize,
    kb: usize,
    t0: usize,
}

/// The scalars of activation blocks `k0..k0 + kb` of tokens `t0..t0 + tcn` (`nb` blocks per
/// token), converted into `scratch` and returned as `[tok][block]`: what each tile reads per
/// block besides the values, converted once per chunk rather than once per row group.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn chunk_scalars<'s, F: Fmt>(
    a: &[F::A],
    (nb, t0, tcn, k0, kb): (usize, usize, usize, usize, usize),
    scratch: &'s mut [MaybeUninit<F::AS>],
) -> &'s [F::AS] {
    let n = tcn * kb;
    assert!(
        n <= scratch.len(),
        "chunk_scalars: {n} scalars for a scratch of {}",
        scratch.len()
    );
    for j in 0..tcn {
        let blocks = &a[(t0 + j) * nb + k0..][..kb];
        for (s, blk) in scratch[j * kb..][..kb].iter_mut().zip(blocks) {
            // SAFETY: `a_scalars` needs avx2, fma and f16c, which this function runs with.
            s.write(unsafe { F::a_scalars(blk) });
        }
    }
    // SAFETY: the first `n <= scratch.len()` entries were initialised just above.
    unsafe { std::slice::from_raw_parts(scratch.as_ptr().cast::<F::AS>(), n) }
}

/// Rows `r..r+RV` (`G` groups of 4, the last one possibly padded) × tokens `t..t+RN`, over the
/// chunk's blocks, accumulated into `out` (`[row][tok]`; read back unless it is the first
/// chunk, which is exact: a pair's state is that one f32).
///
/// The accumulators hold the rows in the lane order of [`Fmt::LANES`]; with `G == 1` every row
/// appears twice, which keeps the code 8 lanes wide. Rows past `RV` are zero blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<F: Fmt, const G: usize, const RV: usize, const RN: usize>(
    c: &Chunk<'_, F>,
    r: usize,
    t: usize,
    out: &mut [f32],
) {
    const { assert!((G == 1 || G == 2) && RV >= 1 && RV <= 4 * G && RV > 4 * (G - 1) && RN >= 1) };
    let (nb, kb, k0) = (c.nb, c.kb, c.k0);
    // Plain loops rather than `array::from_fn`: its closures are not always inlined here.
    let mut rows: [&[F::W]; RV] = [&[]; RV];
    for (i, row) in rows.iter_mut().enumerate() {
        *row = &c.w[(r + i) * nb + k0..][..kb];
    }
    let mut toks: [&[F::A]; RN] = [&[]; RN];
    let mut tsc: [&[F::AS]; RN] = [&[]; RN];
    for j in 0..RN {
        toks[j] = &c.a[(t + j) * nb + k0..][..kb];
        tsc[j] = &c.sc[(t - c.t0 + j) * kb..][..kb];
    }
    let lanes = F::LANES[G - 1];
    let mut acc = [_mm256_setzero_ps(); RN];
    if k0 > 0 {
        for (j, a) in acc.iter_mut().enumerate() {
            let mut l = [0.0f32; 8];
            for (k, &row) in lanes.iter().enumerate() {
                if row < RV {
                    l[k] = out[(r + row) * c.n_tok + t + j];
                }
            }
            *a = load_ps(&l);
        }
    }
    // With the whole rows in this chunk, the tile's weights are `RV * kb` contiguous blocks
    // and block `b` of all rows is on average `b * RV` blocks in: the first token tile, which
    // streams the weights from memory, prefetches as far into them `PREFETCH_BYTES` ahead.
    let prefetch = t == 0 && kb == nb;
    let wbase = rows[0].as_ptr().cast::<u8>();
    let wsz = std::mem::size_of::<F::W>();
    let zero = F::W::default();
    for b in 0..kb {
        if prefetch {
            let at = wbase.wrapping_add(PREFETCH_BYTES + b * RV * wsz);
            for k in 0..(RV * wsz).div_ceil(64) {
                // SAFETY: a prefetch is a hint that never faults and has no effect on memory
                // as the program sees it; the address is computed with `wrapping_add`. (Newer
                // compilers treat the intrinsic as safe, hence the `allow`.)
                #[allow(unused_unsafe)]
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64 * k).cast())
                };
            }
        }
        let blk = |i: usize| if i < RV { &rows[i][b] } else { &zero };
        // SAFETY: `Fmt`'s functions need avx2, fma and f16c, which this function runs with.
        let (g0, g1) = unsafe {
            let g0 = F::prep_group([blk(0), blk(1), blk(2), blk(3)]);
            let g1 = if G == 2 {
                F::prep_group([blk(4), blk(5), blk(6), blk(7)])
            } else {
                g0
            };
            (g0, g1)
        };
        // The rows' f16 `d` (and `m`) in lane order, gathered in general registers (cheaper
        // than a chain of `pinsrw`) and widened in one go.
        let mut dbits = [0u64; 2];
        let mut mbits = [0u64; 2];
        for (k, &row) in lanes.iter().enumerate() {
            let blk = blk(row);
            dbits[k / 4] |= u64::from(F::w_d(blk).to_bits()) << (16 * (k % 4));
            if F::HAS_MIN {
                mbits[k / 4] |= u64::from(F::w_m(blk).to_bits()) << (16 * (k % 4));
            }
        }
        let wd = _mm256_cvtph_ps(_mm_set_epi64x(dbits[1] as i64, dbits[0] as i64));
        let wm = if F::HAS_MIN {
            _mm256_cvtph_ps(_mm_set_epi64x(mbits[1] as i64, mbits[0] as i64))
        } else {
            _mm256_setzero_ps()
        };
        for j in 0..RN {
            let sc = &tsc[j][b];
            // SAFETY: `Fmt`'s functions need avx2, fma and f16c, which this function runs with.
            let mut sumi = unsafe {
                let ap = F::prep_a(&toks[j][b]);
                let h0 = F::isum_group(&g0, &ap);
                let h1 = if G == 2 { F::isum_group(&g1, &ap) } else { h0 };
                F::combine(h0, h1)
            };
            if F::HAS_CORR {
                sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(F::as_corr(sc)));
            }
            let scale = _mm256_mul_ps(wd, _mm256_set1_ps(F::as_d(sc)));
            acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, acc[j]);
            if F::HAS_MIN {
                acc[j] = _mm256_fmadd_ps(wm, _mm256_set1_ps(F::as_s(sc)), acc[j]);
            }
        }
    }
    for j in 0..RN {
        let mut l = [0.0f32; 8];
        store_ps(&mut l, acc[j]);
        for (k, &row) in lanes.iter().enumerate() {
            if row < RV {
                out[(r + row) * c.n_tok + t + j] = l[k];
            }
        }
    }
}

/// Picks the tile instance for `rv` rows (1..=4) × `rn` tokens (1..=4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_dyn<F: Fmt>(c: &Chunk<'_, F>, r: usize, t: usize, rv: usize, rn: usize, out: &mut [f32]) {
    macro_rules! by_rn {
        ($rv:literal) => {
            match rn {
                1 => tile::<F, 1, $rv, 1>(c, r, t, out),
                2 => tile::<F, 1, $rv, 2>(c, r, t, out),
                3 => tile::<F, 1, $rv, 3>(c, r, t, out),
                _ => tile::<F, 1, $rv, 4>(c, r, t, out),
            }
        };
    }
    match rv {
        1 => by_rn!(1),
        2 => by_rn!(2),
        3 => by_rn!(3),
        _ => by_rn!(4),
    }
}

/// Computes `out` (`[row][tok]`) chunk by chunk of activations (see [`SCRATCH`]); within a
/// chunk, rows in tiles of `G` groups (`GR = 4 * G` rows) × `RN` tokens, then single groups and
/// a padded group at the edges.
#[target_feature(enable = "avx2,fma,f16c")]
fn run<F: Fmt, const G: usize, const GR: usize, const RN: usize, const S: usize>(
    w: &[F::W],
    a: &[F::A],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    const { assert!(GR == 4 * G && RN >= 1 && RN <= 4 && S >= 4 * RN) };
    let rows = out.len() / n_tok;
    let kb_max = nb.clamp(1, S);
    // Tokens per chunk, a multiple of the tile's when possible.
    let tc = match S / kb_max {
        n if n >= RN => n - n % RN,
        n => n,
    };
    let mut scratch = [const { MaybeUninit::<F::AS>::uninit() }; S];
    let mut t0 = 0;
    while t0 < n_tok {
        let tcn = tc.min(n_tok - t0);
        let mut k0 = 0;
        while k0 < nb {
            let kb = kb_max.min(nb - k0);
            let sc = chunk_scalars::<F>(a, (nb, t0, tcn, k0, kb), &mut scratch);
            let c = Chunk::<F> {
                w,
                a,
                sc,
                nb,
                n_tok,
                k0,
                kb,
                t0,
            };
            let mut r = 0;
            while r < rows {
                let rm = if rows - r >= GR { GR } else { 4.min(rows - r) };
                let mut t = t0;
                while t < t0 + tcn {
                    let rn = RN.min(t0 + tcn - t);
                    if rm == GR {
                        match rn {
                            n if n == RN => tile::<F, G, GR, RN>(&c, r, t, out),
                            1 => tile::<F, G, GR, 1>(&c, r, t, out),
                            2 => tile::<F, G, GR, 2>(&c, r, t, out),
                            _ => tile::<F, G, GR, 3>(&c, r, t, out),
                        }
                    } else {
                        tile_dyn::<F>(&c, r, t, rm, rn, out);
                    }
                    t += rn;
                }
                r += rm;
            }
            k0 += kb;
        }
        t0 += tcn;
    }
}

/// Weight formats whose blocks the `avx512vnni` matrix products repack (activations Q8_0):
/// a block as 32 unsigned bytes, value `i` in byte `i`, whose `vpdpbusd` sums against the
/// activations minus [`Fmt::as_corr`] are the block's exact integer dot product.
pub(super) trait Repack: Fmt<A = BlockQ8_0> {
    /// # Safety
    /// Needs avx2, fma and f16c (as the `Fmt` functions).
    unsafe fn values(w: &Self::W) -> __m256i;
    /// Where the activation block's correction ([`Fmt::as_corr`]) lies.
    fn corr(s: &Self::AS) -> &i32;
}

impl Repack for Vnni<Q4_0> {
    /// Low nibbles (values 0..16) in the low half, high nibbles (16..32) in the high half.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(w: &BlockQ4_0) -> __m256i {
        // SAFETY: `qs` is 16 readable bytes; `loadu` has no alignment requirement.
        let q = unsafe { _mm_loadu_si128(w.qs.as_ptr().cast()) };
        let m = _mm_set1_epi8(0x0f);
        let (lo, hi) = (
            _mm_and_si128(q, m),
            _mm_and_si128(_mm_srli_epi16::<4>(q), m),
        );
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi)
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> &i32 {
        &s.1
    }
}

impl Repack for Vnni<Q5_0> {
    /// Values 0..16 (low nibbles and their fifth bits) in the low half, 16..32 in the high.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(w: &BlockQ5_0) -> __m256i {
        q5_0_values(w)
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> &i32 {
        &s.1
    }
}

impl Repack for Q8_0Vnni {
    /// `x ^ 0x80`, i.e. `x + 128` as u8 (see [`Q8_0Vnni`]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values(w: &BlockQ8_0) -> __m256i {
        _mm256_xor_si256(load_i8x32(&w.qs), _mm256_set1_epi8(-128))
    }
    #[inline]
    fn corr(s: &(f32, i32)) -> &i32 {
        &s.1
    }
}

/// Block `b` of 8 rows, interleaved for `vpdpbusd`: `q[j]` holds values `4j..4j+4` of row `k`
/// in bytes `4k..4k+4`, so that one `vpdpbusd` per `j` against the activations' bytes
/// `4j..4j+4` (broadcast) leaves each row's block sum in its own lane, with no reduction;
/// `d` the rows' scales as f32.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Packed {
    q: [[u8; 32]; 8],
    d: [f32; 8],
}

/// Blocks per repacked chunk (18 KiB on the stack).
const RP_BLOCKS: usize = 64;

/// Rows `r..r + rv` (`rv <= 8`; the rest zero blocks), blocks `k0..k0 + pk.len()`, into `pk`:
/// per block, the 8 rows' values as 8 × 8 dwords, transposed.
#[target_feature(enable = "avx2,fma,f16c")]
fn repack<F: Repack>(w: &[F::W], nb: usize, r: usize, rv: usize, k0: usize, pk: &mut [Packed]) {
    let kb = pk.len();
    let rows: [&[F::W]; 8] = std::array::from_fn(|k| {
        if k < rv {
            &w[(r + k) * nb + k0..][..kb]
        } else {
            &[]
        }
    });
    for (b, p) in pk.iter_mut().enumerate() {
        let mut v = [_mm256_setzero_si256(); 8];
        let mut dbits = [0u16; 8];
        for k in 0..rv {
            let blk = &rows[k][b];
            // SAFETY: `values` needs avx2, fma and f16c, which this function runs with.
            v[k] = unsafe { F::values(blk) };
            dbits[k] = F::w_d(blk).to_bits();
        }
        // 8x8 transpose of dwords: row k's dword j to `q[j]`'s lane k.
        let t: [__m256i; 8] = std::array::from_fn(|i| {
            let (x, y) = (v[i & !1], v[i | 1]);
            if i % 2 == 0 {
                _mm256_unpacklo_epi32(x, y)
            } else {
                _mm256_unpackhi_epi32(x, y)
            }
        });
        // t[0] = r0r1 cols 0,1 | 4,5; t[1] = r0r1 cols 2,3 | 6,7; t[2], t[3] rows 2,3; ...
        let u: [__m256i; 8] = std::array::from_fn(|i| {
            // u[0..4] rows 0-3, u[4..8] rows 4-7; u[c] (c = 0..4) holds cols c | c + 4.
            let base = (i / 4) * 4;
            let c = i % 4;
            let (x, y) = (t[base + c / 2], t[base + 2 + c / 2]);
            if c % 2 == 0 {
                _mm256_unpacklo_epi64(x, y)
            } else {
                _mm256_unpackhi_epi64(x, y)
            }
        });
        for c in 0..4 {
            let lo = _mm256_permute2x128_si256::<0x20>(u[c], u[4 + c]);
            let hi = _mm256_permute2x128_si256::<0x31>(u[c], u[4 + c]);
            // SAFETY: `p.q[_]` is 32 writable bytes; `storeu` has no alignment requirement.
            unsafe {
                _mm256_storeu_si256(p.q[c].as_mut_ptr().cast(), lo);
                _mm256_storeu_si256(p.q[c + 4].as_mut_ptr().cast(), hi);
            }
        }
        // SAFETY: `dbits` is 16 readable bytes, `p.d` 32 writable ones; no alignment needed.
        unsafe {
            let d = _mm256_cvtph_ps(_mm_loadu_si128(dbits.as_ptr().cast()));
            _mm256_storeu_ps(p.d.as_mut_ptr(), d);
        }
    }
}

/// The repacked rows × tokens `t..t + RN`: per pair and block the same
/// `fma(f32(sumi), d_w * d_a, acc)` as [`tile`] (so the same bits), `out` read back unless
/// `k0 == 0`.
///
/// # Safety
/// avx512vnni and avx512vl (for `vpdpbusd`) besides this function's features.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn rtile<F: Repack, const RN: usize>(
    pk: &[Packed],
    a: &[BlockQ8_0],
    sc: &[F::AS],
    nb: usize,
    n_tok: usize,
    (r, rv, k0, t, t0): (usize, usize, usize, usize, usize),
    out: &mut [f32],
) {
    const { assert!(RN >= 1 && RN <= 4) };
    let kb = pk.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    if k0 > 0 {
        for (j, acc) in acc.iter_mut().enumerate().take(RN) {
            let mut l = [0.0f32; 8];
            for (k, l) in l.iter_mut().enumerate().take(rv) {
                *l = out[(r + k) * n_tok + t + j];
            }
            *acc = load_ps(&l);
        }
    }
    // The tile's tokens, written out one by one below so that their accumulators stay in
    // registers (the ones past `RN` repeat the last token and are never used).
    let tok = |j: usize| -> (&[BlockQ8_0], &[F::AS]) {
        let j = j.min(RN - 1);
        (
            &a[(t + j) * nb + k0..][..kb],
            &sc[(t - t0 + j) * kb..][..kb],
        )
    };
    let toks = [tok(0), tok(1), tok(2), tok(3)];
    for (b, p) in pk.iter().enumerate() {
        // SAFETY: `p.d` is 8 readable f32; `loadu` has no alignment requirement.
        let wd = unsafe { _mm256_loadu_ps(p.d.as_ptr()) };
        let q: [__m256i; 8] = std::array::from_fn(|i| {
            // SAFETY: `p.q[i]` is 32 readable bytes; `loadu` has no alignment requirement.
            unsafe { _mm256_loadu_si256(p.q[i].as_ptr().cast()) }
        });
        let token = |acc: &mut __m256, (y, s): (&[BlockQ8_0], &[F::AS])| {
            let s = &s[b];
            // SAFETY: the caller guarantees avx512vnni and avx512vl.
            let sumi = unsafe { isum_bcast(&q, &y[b].qs, Some(F::corr(s))) };
            let scale = _mm256_mul_ps(wd, _mm256_set1_ps(F::as_d(s)));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, *acc);
        };
        token(&mut acc[0], toks[0]);
        if RN > 1 {
            token(&mut acc[1], toks[1]);
        }
        if RN > 2 {
            token(&mut acc[2], toks[2]);
        }
        if RN > 3 {
            token(&mut acc[3], toks[3]);
        }
    }
    for (j, acc) in acc.iter().enumerate().take(RN) {
        let mut l = [0.0f32; 8];
        store_ps(&mut l, *acc);
        for (k, l) in l.iter().enumerate().take(rv) {
            out[(r + k) * n_tok + t + j] = *l;
        }
    }
}

/// Matrix-matrix product through repacked weights (see [`Packed`]): for each chunk of tokens
/// and of blocks, each group of 8 rows is repacked once and swept over all the chunk's tokens,
/// `RN` at a time.
///
/// # Safety
/// avx512vnni and avx512vl besides this function's features; `w.len() == rows * nb`,
/// `a.len() == n_tok * nb`, `out.len() == rows * n_tok`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_repacked<F: Repack, const RN: usize>(
    w: &[F::W],
    a: &[BlockQ8_0],
    nb: usize,
    n_tok: usize,
    out: &mut [f32],
) {
    const { assert!(RN >= 1 && RN <= 4 && SCRATCH >= RP_BLOCKS * 4) };
    let rows = out.len() / n_tok;
    let kb_max = nb.clamp(1, RP_BLOCKS);
    let tc = SCRATCH / kb_max;
    let mut scratch = [const { MaybeUninit::<F::AS>::uninit() }; SCRATCH];
    let mut pk = [Packed {
        q: [[0; 32]; 8],
        d: [0.0; 8],
    }; RP_BLOCKS];
    let mut t0 = 0;
    while t0 < n_tok {
        let tcn = tc.min(n_tok - t0);
        let mut k0 = 0;
        while k0 < nb {
            let kb = kb_max.min(nb - k0);
            let sc = chunk_scalars::<F>(a, (nb, t0, tcn, k0, kb), &mut scratch);
            let pk = &mut pk[..kb];
            let mut r = 0;
            while r < rows {
                let rv = 8.min(rows - r);
                // The next group's weights, from memory in a forward pass, are prefetched
                // while this one is swept over the tokens (the repack's loads would otherwise
                // wait on each line).
                for row in (r + 8)..(r + 16).min(rows) {
                    let p = w[row * nb + k0..][..kb].as_ptr().cast::<u8>();
                    for off in (0..kb * std::mem::size_of::<F::W>()).step_by(64) {
                        // SAFETY: a prefetch is a hint that never faults and has no effect on
                        // memory as the program sees it (newer compilers treat it as safe).
                        #[allow(unused_unsafe)]
                        unsafe {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off).cast())
                        };
                    }
                }
                repack::<F>(w, nb, r, rv, k0, pk);
                let mut t = t0;
                while t < t0 + tcn {
                    let rn = RN.min(t0 + tcn - t);
                    let at = (r, rv, k0, t, t0);
                    // SAFETY: the caller guarantees avx512vnni and avx512vl.
                    unsafe {
                        match rn {
                            n if n == RN => rtile::<F, RN>(pk, a, sc, nb, n_tok, at, out),
                            1 => rtile::<F, 1>(pk, a, sc, nb, n_tok, at, out),
                            2 => rtile::<F, 2>(pk, a, sc, nb, n_tok, at, out),
                            _ => rtile::<F, 3>(pk, a, sc, nb, n_tok, at, out),
                        }
                    }
                    t += rn;
                }
                r += rv;
            }
            k0 += kb;
        }
        t0 += tcn;
    }
}

macro_rules! kernels {
    ($what:literal, $fmt:ty, $w:ty, $a:ty, $dot:ident, $mv:ident, $mm:ident) => {
        kernels!($what, $fmt, $w, $a, $dot, $mv, $mm, MM_GROUPS, MM_TOKS);
    };
    ($what:literal, $fmt:ty, $w:ty, $a:ty, $dot:ident, $mv:ident, $mm:ident, $mmg:expr, $mmt:expr) => {
        kernels!(@dot_mv $what, $fmt, $w, $a, $dot, $mv);
        kernels!(@mm $what, $fmt, $w, $a, $mm, $mmg, $mmt);
    };
    (@mm $what:literal, $fmt:ty, $w:ty, $a:ty, $mm:ident, $mmg:expr, $mmt:expr) => {
        #[doc = concat!("Matrix-matrix product (", $what, "), tiles of `4 * MM_GROUPS` rows × `MM_TOKS` tokens.")]
        pub(crate) fn $mm(w: &[$w], a: &[$a], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through the table of this path (its features detected at
            // runtime, as above); `check_matmul` guarantees the shapes.
            unsafe {
                run::<$fmt, { $mmg }, { 4 * $mmg }, { $mmt }, SCRATCH>(w, a, nb, n_tok, out)
            }
        }
    };
    (repacked $what:literal, $fmt:ty, $w:ty, $a:ty, $mm:ident, $mmt:expr) => {
        #[doc = concat!("Matrix-matrix product (", $what, "), weights repacked 8 rows at a time.")]
        pub(crate) fn $mm(w: &[$w], a: &[$a], n_tok: usize, out: &mut [f32]) {
            let (nb, rows) = check_matmul(w, a, n_tok, out);
            if nb == 0 || rows == 0 {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through the `avx512vnni` table (avx2, fma, f16c,
            // avx512vnni and avx512vl detected at runtime); `check_matmul` guarantees the shapes.
            unsafe { run_repacked::<$fmt, { $mmt }>(w, a, nb, n_tok, out) }
        }
    };
    (@dot_mv $what:literal, $fmt:ty, $w:ty, $a:ty, $dot:ident, $mv:ident) => {
        #[doc = concat!("`vec_dot` (", $what, "): the same per-block sequence as one pair of a tile.")]
        pub(crate) fn $dot(x: &[$w], y: &[$a]) -> f32 {
            assert_eq!(
                x.len(),
                y.len(),
                concat!(stringify!($dot), ": length mismatch")
            );
            let mut out = [0.0f32];
            // SAFETY: only reachable through the table of this path, which `dispatch` hands
            // out after `is_x86_feature_detected!` confirmed its features (avx2, fma and f16c;
            // plus avx512vnni and avx512vl for `Vnni` formats); shapes checked above.
            unsafe { run::<$fmt, 1, 4, 1, SCRATCH_DOT>(x, y, x.len(), 1, &mut out) };
            out[0]
        }

        #[doc = concat!("Matrix-vector product (", $what, "), `4 * MV_GROUPS` rows per pass.")]
        pub(crate) fn $mv(w: &[$w], a: &[$a], out: &mut [f32]) {
            let nb = check_matvec(w, a, out);
            if nb == 0 || out.is_empty() {
                out.fill(0.0);
                return;
            }
            // SAFETY: only reachable through the table of this path (its features detected at
            // runtime, as above); `check_matvec` guarantees `w.len() == out.len() * nb`.
            unsafe { run::<$fmt, MV_GROUPS, { 4 * MV_GROUPS }, 1, SCRATCH>(w, a, nb, 1, out) }
        }
    };
}

kernels!(
    "AVX2",
    Q4_0,
    BlockQ4_0,
    BlockQ8_0,
    vec_dot_q4_0_q8_0,
    matvec_q4_0_q8_0,
    matmul_q4_0_q8_0
);
kernels!(
    "AVX2",
    Q4_1,
    BlockQ4_1,
    BlockQ8_1,
    vec_dot_q4_1_q8_1,
    matvec_q4_1_q8_1,
    matmul_q4_1_q8_1
);
kernels!(
    "AVX2",
    Q5_0,
    BlockQ5_0,
    BlockQ8_0,
    vec_dot_q5_0_q8_0,
    matvec_q5_0_q8_0,
    matmul_q5_0_q8_0
);
kernels!(
    "AVX2",
    Q5_1,
    BlockQ5_1,
    BlockQ8_1,
    vec_dot_q5_1_q8_1,
    matvec_q5_1_q8_1,
    matmul_q5_1_q8_1
);
kernels!(
    "AVX2",
    Q8_0,
    BlockQ8_0,
    BlockQ8_0,
    vec_dot_q8_0_q8_0,
    matvec_q8_0_q8_0,
    matmul_q8_0_q8_0
);

/// The matrix-matrix products with the integer sums through `vpdpbusd`, for the
/// `avx512vnni` table: Q4_0's, Q5_0's and Q8_0's on repacked weights ([`run_repacked`]),
/// Q4_1's and Q5_1's on the tile. (`vec_dot` and `matvec` stay AVX2's: decoding is bound by memory, and the
/// `vpdpbusd` chain measured no faster there.)
pub(crate) mod vnni {
    use super::*;

    kernels!(
        repacked "AVX2 + AVX512-VNNI",
        Vnni<Q4_0>,
        BlockQ4_0,
        BlockQ8_0,
        matmul_q4_0_q8_0,
        VNNI_RP_TOKS
    );
    kernels!(
        @mm "AVX2 + AVX512-VNNI",
        Vnni<Q4_1>,
        BlockQ4_1,
        BlockQ8_1,
        matmul_q4_1_q8_1,
        VNNI_MM_GROUPS,
        VNNI_MM_TOKS
    );
    kernels!(
        repacked "AVX2 + AVX512-VNNI",
        Vnni<Q5_0>,
        BlockQ5_0,
        BlockQ8_0,
        matmul_q5_0_q8_0,
        VNNI_RP_TOKS
    );
    kernels!(
        @mm "AVX2 + AVX512-VNNI",
        Vnni<Q5_1>,
        BlockQ5_1,
        BlockQ8_1,
        matmul_q5_1_q8_1,
        VNNI_MM_GROUPS,
        VNNI_MM_TOKS
    );
    kernels!(
        repacked "AVX2 + AVX512-VNNI",
        Q8_0Vnni,
        BlockQ8_0,
        BlockQ8_0,
        matmul_q8_0_q8_0,
        VNNI_RP_TOKS
    );
}
