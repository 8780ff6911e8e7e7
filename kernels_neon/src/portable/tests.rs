//! Properties of the portable products beyond `tests/dispatch_walk.rs`: `vec_dot`, `matvec` and
//! `matmul` give the same bits for a (row, token) pair whatever the tile it falls in, and the
//! integer parts are exact at the extremes of the value ranges.

use super::matmul::*;
use crate::block::*;
use crate::reference as r;

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
    check_agree::<BlockQ4_0>((vec_dot_q4_0_q8_0, matvec_q4_0_q8_0, matmul_q4_0_q8_0));
    check_agree::<BlockQ4_1>((vec_dot_q4_1_q8_1, matvec_q4_1_q8_1, matmul_q4_1_q8_1));
    check_agree::<BlockQ8_0>((vec_dot_q8_0_q8_0, matvec_q8_0_q8_0, matmul_q8_0_q8_0));
}

#[test]
fn integer_sums_are_exact_at_the_extremes() {
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
