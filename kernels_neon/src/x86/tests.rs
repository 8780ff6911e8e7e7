//! Properties of the AVX2 products beyond `tests/dispatch_walk.rs`: `vec_dot`, `matvec` and
//! `matmul` give the same bits for a (row, token) pair whatever the tile it falls in, and the
//! integer parts are exact at the extremes of the value ranges.

use super::matmul::*;
use crate::block::*;
use crate::reference as r;

fn avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

fn signal(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn quant<B: BlockFormat>(x: &[f32]) -> Vec<B> {
    let mut y = vec![B::default(); x.len() / B::BLOCK_LEN];
    B::quantize_row_ref(x, &mut y);
    y
}

type Kernels3<W, A> = (
    fn(&[W], &[A]) -> f32,
    fn(&[W], &[A], &mut [f32]),
    fn(&[W], &[A], usize, &mut [f32]),
);

fn check_agree<W: BlockFormat>(k: Kernels3<W, W::Activation>) {
    let (dot, mv, mm) = k;
    // The long rows also cross the AVX2 path's chunking of activation scalars: a few tokens
    // per chunk (700 blocks), blocks split across chunks (4100 blocks).
    for (rows, nb, toks) in [
        (1, 1, &[1, 2, 3, 4, 7][..]),
        (3, 2, &[1, 2, 3, 4, 7]),
        (8, 5, &[1, 2, 3, 4, 7]),
        (13, 3, &[1, 2, 3, 4, 7]),
        (19, 37, &[1, 2, 3, 4, 7]),
        (33, 1, &[1, 2, 3, 4, 7]),
        (9, 700, &[7, 13]),
        (5, 4100, &[1, 2]),
    ] {
        for &n_tok in toks {
            let w: Vec<W> = quant(&signal(rows * nb * 32, (rows * 7 + nb) as u64));
            let a: Vec<W::Activation> = quant(&signal(n_tok * nb * 32, (n_tok + 100 * nb) as u64));
            let mut out_mm = vec![f32::NAN; rows * n_tok];
            mm(&w, &a, n_tok, &mut out_mm);
            for t in 0..n_tok {
                let act = &a[t * nb..][..nb];
                let mut out_mv = vec![f32::NAN; rows];
                mv(&w, act, &mut out_mv);
                for (i, row) in w.chunks_exact(nb).enumerate() {
                    let d = dot(row, act);
                    let what = format!("{} {rows}x{nb}x{n_tok} row {i} tok {t}", W::NAME);
                    assert_eq!(
                        out_mv[i].to_bits(),
                        d.to_bits(),
                        "matvec vs vec_dot, {what}"
                    );
                    assert_eq!(
                        out_mm[i * n_tok + t].to_bits(),
                        d.to_bits(),
                        "matmul vs vec_dot, {what}"
                    );
                    // The tolerance of tests/dispatch_walk.rs: a few ulps per accumulated block.
                    let want = W::vec_dot_ref(row, act);
                    let (mut x, mut y) = (vec![0.0; nb * 32], vec![0.0; nb * 32]);
                    W::dequantize_row(row, &mut x);
                    W::Activation::dequantize_row(act, &mut y);
                    let abs: f32 = x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum();
                    let tol = 4.0 * f32::EPSILON * nb as f32 * abs + 1e-30;
                    assert!((d - want).abs() <= tol, "{what}: {d} vs reference {want}");
                }
            }
        }
    }
}

#[test]
fn vec_dot_matvec_and_matmul_agree_bit_for_bit() {
    if !avx2() {
        return;
    }
    check_agree::<BlockQ4_0>((vec_dot_q4_0_q8_0, matvec_q4_0_q8_0, matmul_q4_0_q8_0));
    check_agree::<BlockQ4_1>((vec_dot_q4_1_q8_1, matvec_q4_1_q8_1, matmul_q4_1_q8_1));
    check_agree::<BlockQ8_0>((vec_dot_q8_0_q8_0, matvec_q8_0_q8_0, matmul_q8_0_q8_0));
}

#[test]
fn integer_sums_are_exact_at_the_extremes() {
    if !avx2() {
        return;
    }
    // Unit scales keep every sum an exact integer in f32, so fast and reference must be equal.
    let one = f16::ONE;
    let acts: Vec<[i8; 32]> = vec![
        [-128; 32],
        [127; 32],
        std::array::from_fn(|i| if i % 2 == 0 { -128 } else { 127 }),
    ];
    for qs in &acts {
        let a0 = [BlockQ8_0 { d: one, qs: *qs }; 2];
        let a1 = [BlockQ8_1 {
            d: one,
            s: one,
            qs: *qs,
        }; 2];
        for nib in [0x00u8, 0xff, 0x0f, 0xf0, 0x8f] {
            let w0 = [BlockQ4_0 {
                d: one,
                qs: [nib; 16],
            }; 2];
            assert_eq!(
                vec_dot_q4_0_q8_0(&w0, &a0),
                r::vec_dot_q4_0_q8_0_ref(&w0, &a0),
                "q4_0 {nib:#x}"
            );
            let w1 = [BlockQ4_1 {
                d: one,
                m: one,
                qs: [nib; 16],
            }; 2];
            assert_eq!(
                vec_dot_q4_1_q8_1(&w1, &a1),
                r::vec_dot_q4_1_q8_1_ref(&w1, &a1),
                "q4_1 {nib:#x}"
            );
        }
        // Q8_0: any weights, activations as our quantizer makes them (-127..=127).
        let a8 = [BlockQ8_0 {
            d: one,
            qs: qs.map(|v| v.max(-127)),
        }; 2];
        for wq in [
            [127i8; 32],
            [-128; 32],
            std::array::from_fn(|i| if i % 3 == 0 { -128 } else { 127 }),
        ] {
            let w = [BlockQ8_0 { d: one, qs: wq }; 2];
            assert_eq!(
                vec_dot_q8_0_q8_0(&w, &a8),
                r::vec_dot_q8_0_q8_0_ref(&w, &a8),
                "q8_0"
            );
        }
    }
}

#[test]
fn quantizers_match_the_reference_on_special_values() {
    if !avx2() {
        return;
    }
    let mut x = signal(32 * 12, 9);
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    x[70] = f32::NEG_INFINITY;
    x[100] = -f32::NAN;
    x[130] = 3e38;
    x[160..192].iter_mut().for_each(|v| *v *= 1e-38); // tiny block: 1/d overflows
    x[192..224].iter_mut().for_each(|v| *v = -0.0);
    x[224..256]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5 / 127.0 * 16.0);
    x[256..288].iter_mut().for_each(|v| *v = f32::NAN);
    let n = x.len() / 32;
    let (mut got0, mut want0) = (vec![BlockQ8_0::default(); n], vec![BlockQ8_0::default(); n]);
    super::quant::quantize_row_q8_0(&x, &mut got0);
    r::quantize_row_q8_0_ref(&x, &mut want0);
    let (mut got1, mut want1) = (vec![BlockQ8_1::default(); n], vec![BlockQ8_1::default(); n]);
    super::quant::quantize_row_q8_1(&x, &mut got1);
    r::quantize_row_q8_1_ref(&x, &mut want1);
    for i in 0..n {
        assert_eq!(
            bytemuck::bytes_of(&got0[i]),
            bytemuck::bytes_of(&want0[i]),
            "q8_0 block {i}"
        );
        assert_eq!(
            bytemuck::bytes_of(&got1[i]),
            bytemuck::bytes_of(&want1[i]),
            "q8_1 block {i}"
        );
    }
}

#[test]
fn exp_is_within_a_few_ulp() {
    if !avx2() {
        return;
    }
    use super::simd::{exp_ps, load_ps, store_ps};
    use std::arch::x86_64::__m256;
    // SAFETY: avx2, fma and f16c were detected above.
    let exp8 = |v: [f32; 8]| unsafe {
        let e: __m256 = exp_ps(load_ps(&v));
        let mut o = [0.0f32; 8];
        store_ps(&mut o, e);
        o
    };
    let mut x = -110.0f32;
    while x < 90.0 {
        let v = std::array::from_fn(|k| x + 0.01 * k as f32);
        let got = exp8(v);
        for k in 0..8 {
            let want = v[k].exp();
            let tol = 4.0 * f32::EPSILON * want + 2.0 * f32::from_bits(1);
            assert!(
                got[k] == want || (got[k] - want).abs() <= tol,
                "exp({}) = {} want {}",
                v[k],
                got[k],
                want
            );
        }
        x += 0.08;
    }
    let s = exp8([
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        1.0,
        89.0,
        -200.0,
    ]);
    assert_eq!(
        (s[0], s[1], s[3], s[4], s[6], s[7]),
        (0.0, f32::INFINITY, 1.0, 1.0, f32::INFINITY, 0.0)
    );
    assert!(s[2].is_nan());
}

#[test]
fn f16_conversions_match_half_everywhere() {
    if !avx2() {
        return;
    }
    let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
    let mut got = vec![0.0f32; all.len()];
    super::ops::f16_to_f32_row(&all, &mut got);
    for (h, g) in all.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            h.to_f32().to_bits(),
            "f16 {:#06x}",
            h.to_bits()
        );
    }
    // Around every f16: neighbours and midpoints (ties), both signs, and a sweep of all
    // exponents; an odd length exercises the tail.
    let mut xs = Vec::new();
    for bits in 0..0x7c00u16 {
        let (lo, hi) = (
            f16::from_bits(bits).to_f32(),
            f16::from_bits(bits + 1).to_f32(),
        );
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        for f in [lo, mid, hi] {
            for d in [-1i32, 0, 1] {
                let b = f32::from_bits((f.to_bits() as i32 + d).max(0) as u32);
                xs.extend([b, -b]);
            }
        }
    }
    xs.extend((0..=u32::MAX / 9973).map(|i| f32::from_bits(i.wrapping_mul(9973))));
    xs.extend([f32::NAN, f32::INFINITY, 65519.99, 65520.0, 1e-45]);
    let mut got = vec![f16::ZERO; xs.len()];
    super::ops::f32_to_f16_row(&xs, &mut got);
    for (x, g) in xs.iter().zip(&got) {
        assert_eq!(
            g.to_bits(),
            f16::from_f32(*x).to_bits(),
            "f32 {x:e} ({:#010x})",
            x.to_bits()
        );
    }
}
