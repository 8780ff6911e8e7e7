//! The K-quant products of every fast path (portable, AVX2, AVX-512 VNNI, NEON, dotprod, i8mm)
//! follow one arithmetic sequence, bit for bit, so that x86 and aarch64 give a model the same
//! logits: per super-block the exact integer sum `sumi` of scale × level × activation (Q6_K's
//! levels -32..32), then `acc = fma(d_w · d_a, f32(sumi), acc)` and, for Q4_K/Q5_K, the mins
//! `mins = fma(dmin_w · d_a, f32(Σ min · bsum), mins)`; the result `acc - mins`. Written here
//! from the block layouts, apart from the kernels; run natively and under qemu.

mod common;

use common::*;
use kernels_neon::reference as r;
use kernels_neon::*;

/// The levels of a Q4_K (`qh = None`) or Q5_K block, value by value.
fn levels_q4_q5(qs: &[u8; 128], qh: Option<&[u8; 32]>) -> [i32; 256] {
    std::array::from_fn(|v| {
        let (p, i) = (v / 64, v % 64);
        let nib = if i < 32 {
            qs[32 * p + i] & 0x0f
        } else {
            qs[32 * p + i - 32] >> 4
        };
        // The fifth bit of value v: bit v / 32 of qh[v % 32].
        let fifth = qh.map_or(0, |qh| ((qh[v % 32] >> (v / 32)) & 1) << 4);
        (nib | fifth) as i32
    })
}

/// A block as the sequence reads it: levels, a scale per 16 values, d, and the mins per 16
/// values with dmin (none for Q6_K).
type Block = ([i32; 256], [i32; 16], f32, Option<([i32; 16], f32)>);

/// The sequence over `blocks` and the activations `a`.
fn sequence(blocks: &[Block], a: &[BlockQ8K]) -> f32 {
    let (mut acc, mut mins) = (0.0f32, 0.0f32);
    for ((lv, sc, d, m), y) in blocks.iter().zip(a) {
        let mut sumi = 0i32;
        for v in 0..256 {
            sumi += sc[v / 16] * lv[v] * y.qs[v] as i32;
        }
        if let Some((mv, dmin)) = m {
            let off: i32 = (0..16).map(|i| mv[i] * y.bsums[i] as i32).sum();
            mins = (dmin * y.d).mul_add(off as f32, mins);
        }
        acc = (d * y.d).mul_add(sumi as f32, acc);
    }
    acc - mins
}

fn q4_5_blocks<'a>(
    it: impl Iterator<Item = (&'a [u8; 128], Option<&'a [u8; 32]>, &'a [u8; 12], f16, f16)>,
) -> Vec<Block> {
    it.map(|(qs, qh, scales, d, dmin)| {
        let sm: [(u8, u8); 8] = std::array::from_fn(|j| r::get_scale_min_k4(j, scales));
        let sc = std::array::from_fn(|i| sm[i / 2].0 as i32);
        let mv = std::array::from_fn(|i| sm[i / 2].1 as i32);
        (
            levels_q4_q5(qs, qh),
            sc,
            d.to_f32(),
            Some((mv, dmin.to_f32())),
        )
    })
    .collect()
}

fn seq_q4k(w: &[BlockQ4K], a: &[BlockQ8K]) -> f32 {
    sequence(
        &q4_5_blocks(w.iter().map(|b| (&b.qs, None, &b.scales, b.d, b.dmin))),
        a,
    )
}

fn seq_q5k(w: &[BlockQ5K], a: &[BlockQ8K]) -> f32 {
    sequence(
        &q4_5_blocks(
            w.iter()
                .map(|b| (&b.qs, Some(&b.qh), &b.scales, b.d, b.dmin)),
        ),
        a,
    )
}

fn seq_q6k(w: &[BlockQ6K], a: &[BlockQ8K]) -> f32 {
    let blocks: Vec<_> = w
        .iter()
        .map(|b| {
            let mut lv = [0i32; 256];
            for n in 0..2 {
                for l in 0..32 {
                    let q = r::q6_values(&b.ql[64 * n..], &b.qh[32 * n..], l);
                    for (k, &qk) in q.iter().enumerate() {
                        lv[128 * n + 32 * k + l] = qk as i32;
                    }
                }
            }
            (lv, b.scales.map(|s| s as i32), b.d.to_f32(), None)
        })
        .collect();
    sequence(&blocks, a)
}

/// The same bits, or both NaN (the bits of a NaN an operation makes are the CPU's).
fn same(got: f32, want: f32, what: &str) {
    assert!(
        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
        "{what}: {got:e} ({:#x}), the sequence gives {want:e} ({:#x})",
        got.to_bits(),
        want.to_bits()
    );
}

/// `n` blocks of random bytes (xorshift from `seed`).
fn random_blocks<W: WeightFormat>(n: usize, seed: u64) -> Vec<W> {
    let mut v = vec![W::default(); n];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for b in bytemuck::cast_slice_mut::<W, u8>(&mut v) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 32) as u8;
    }
    v
}

/// Every fast path's vec_dot, matvec and matmul of format `W` give `seq`'s bits.
fn check<W: WeightFormat<Activation = BlockQ8K>>(name: &str, seq: fn(&[W], &[BlockQ8K]) -> f32) {
    let reference = Kernels::for_path(Path::Reference).unwrap();
    let mut checked = 0;
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        if std::ptr::fn_addr_eq(W::vec_dot(k), W::vec_dot(reference)) {
            continue; // the reference (ggml's order), walked against itself elsewhere
        }
        // The last shape's weights are random bytes, as a hostile file's: scales NaN, infinite
        // or huge; the kernels must not panic and still follow the sequence (NaN as NaN).
        for (rows, nb, n_tok, hostile) in [
            (1, 1, 1, false),
            (3, 2, 5, false),
            (5, 8, 4, false),
            (2, 3, 9, false),
            (3, 2, 19, false),
            (7, 4, 17, true),
        ] {
            let n = nb * 256;
            let w: Vec<W> = if hostile {
                random_blocks(rows * nb, rows as u64)
            } else {
                quant(&awkward(rows * n, (rows * 7 + nb) as u64))
            };
            let a: Vec<BlockQ8K> = quant(&f32_vec(n_tok * n, (n_tok + nb) as u64, 1.0));
            let want: Vec<f32> = w
                .chunks_exact(nb)
                .flat_map(|row| a.chunks_exact(nb).map(move |t| seq(row, t)))
                .collect();
            let mut mm = vec![f32::NAN; rows * n_tok];
            W::matmul(k)(&w, &a, n_tok, &mut mm);
            let mut mv = vec![f32::NAN; rows];
            W::matvec(k)(&w, &a[..nb], &mut mv);
            for (ri, row) in w.chunks_exact(nb).enumerate() {
                let dot = W::vec_dot(k)(row, &a[..nb]);
                let what = format!("{p}/{name} {rows}x{nb}x{n_tok} row {ri}");
                same(dot, want[ri * n_tok], &format!("{what}: vec_dot"));
                same(mv[ri], want[ri * n_tok], &format!("{what}: matvec"));
                for t in 0..n_tok {
                    let i = ri * n_tok + t;
                    same(mm[i], want[i], &format!("{what} tok {t}: matmul"));
                }
            }
        }
        checked += 1;
    }
    // Not a pass by default: the portable path, which every target runs, has K-quant kernels.
    assert!(checked > 0, "{name}: no fast path checked");
    eprintln!("kquant_sequence: {name} on {checked} fast path(s)");
}

#[test]
fn k_quant_products_of_every_fast_path_follow_the_shared_sequence() {
    check::<BlockQ4K>("q4_k", seq_q4k);
    check::<BlockQ5K>("q5_k", seq_q5k);
    check::<BlockQ6K>("q6_k", seq_q6k);
}
