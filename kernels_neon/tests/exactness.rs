//! For every path this CPU runs: `vec_dot`, `matvec` and `matmul` give the same bits for a
//! (row, token) pair whatever the tile it falls in (so a prompt processed in a batch and the
//! same tokens fed one by one agree exactly), integer parts are exact at the extremes of the
//! value ranges, and the quantizers equal the reference on special values.

mod common;

use common::*;
use kernels_neon::reference as r;
use kernels_neon::*;

fn check_agree<W: WeightFormat>(k: &Kernels) {
    let (dot, mv, mm) = (W::vec_dot(k), W::matvec(k), W::matmul(k));
    let p = k.path;
    // Long rows also cross the AVX2 path's chunking of activation scales: a few tokens per
    // chunk (700 blocks), blocks split across chunks (4100 blocks).
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
            let w: Vec<W> = quant(&awkward(rows * nb * 32, (rows * 7 + nb) as u64));
            let a: Vec<W::Activation> =
                quant(&f32_vec(n_tok * nb * 32, (n_tok + 100 * nb) as u64, 1.0));
            let mut out_mm = vec![f32::NAN; rows * n_tok];
            mm(&w, &a, n_tok, &mut out_mm);
            for t in 0..n_tok {
                let act = &a[t * nb..][..nb];
                let mut out_mv = vec![f32::NAN; rows];
                mv(&w, act, &mut out_mv);
                for (i, row) in w.chunks_exact(nb).enumerate() {
                    let d = dot(row, act);
                    let what = format!("{p}/{} {rows}x{nb}x{n_tok} row {i} tok {t}", W::NAME);
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
                }
            }
        }
    }
}

fn check_integer_extremes(k: &Kernels) {
    // Unit scales keep every sum an exact integer in f32, so fast and reference must be equal.
    let p = k.path;
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
            let got = (k.vec_dot_q4_0_q8_0)(&w0, &a0);
            assert_eq!(got, r::vec_dot_q4_0_q8_0_ref(&w0, &a0), "{p}/q4_0 {nib:#x}");
            let w1 = [BlockQ4_1 {
                d: one,
                m: one,
                qs: [nib; 16],
            }; 2];
            let got = (k.vec_dot_q4_1_q8_1)(&w1, &a1);
            assert_eq!(got, r::vec_dot_q4_1_q8_1_ref(&w1, &a1), "{p}/q4_1 {nib:#x}");
        }
        // Q8_0: any weights, activations as our quantizer makes them (-127..=127; the AVX2
        // sign trick would wrap on -128 against a negative weight).
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
                (k.vec_dot_q8_0_q8_0)(&w, &a8),
                r::vec_dot_q8_0_q8_0_ref(&w, &a8),
                "{p}/q8_0"
            );
        }
    }
}

fn check_quantizer_special_values(k: &Kernels) {
    let p = k.path;
    let mut x = f32_vec(32 * 12, 9, 1.0);
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    x[70] = f32::NEG_INFINITY;
    x[100] = -f32::NAN;
    x[130] = 3e38;
    x[160..192].iter_mut().for_each(|v| *v *= 1e-38); // tiny block: 1/d overflows
    x[192..224].iter_mut().for_each(|v| *v = -0.0);
    // Values landing exactly on rounding ties.
    x[224..256]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = (i as f32 - 16.0) * 0.5 / 127.0 * 16.0);
    x[256..288].iter_mut().for_each(|v| *v = f32::NAN);
    let n = x.len() / 32;
    let (mut got0, mut want0) = (vec![BlockQ8_0::default(); n], vec![BlockQ8_0::default(); n]);
    (k.quantize_row_q8_0)(&x, &mut got0);
    r::quantize_row_q8_0_ref(&x, &mut want0);
    let (mut got1, mut want1) = (vec![BlockQ8_1::default(); n], vec![BlockQ8_1::default(); n]);
    (k.quantize_row_q8_1)(&x, &mut got1);
    r::quantize_row_q8_1_ref(&x, &mut want1);
    for i in 0..n {
        assert_eq!(
            bytemuck::bytes_of(&got0[i]),
            bytemuck::bytes_of(&want0[i]),
            "{p}/q8_0 block {i}"
        );
        assert_eq!(
            bytemuck::bytes_of(&got1[i]),
            bytemuck::bytes_of(&want1[i]),
            "{p}/q8_1 block {i}"
        );
    }
}

/// The Q8_K quantizer (ggml's: the signed value of largest magnitude, the first of equals, and
/// `nearest_int`'s magic-number rounding) on super-blocks of special values.
fn check_q8_k_special_values(k: &Kernels) {
    let p = k.path;
    let mut x = f32_vec(256 * 8, 19, 1.0);
    let b = |i: usize| 256 * i..256 * (i + 1);
    // 0: NaN, infinities, a huge value. 1: all NaN. 2: -0.0 and subnormals.
    x[3] = f32::NAN;
    x[40] = f32::INFINITY;
    x[70] = f32::NEG_INFINITY;
    x[100] = -f32::NAN;
    x[130] = 3e38;
    x[b(1)].iter_mut().for_each(|v| *v = f32::NAN);
    x[b(2)].iter_mut().enumerate().for_each(|(i, v)| {
        *v = if i % 2 == 0 {
            -0.0
        } else {
            f32::from_bits(i as u32)
        }
    });
    // 3, 4: equal magnitudes of both signs, the negative one first, then the positive one.
    x[256 * 3 + 17] = -5.0;
    x[256 * 3 + 200] = 5.0;
    x[256 * 4 + 9] = 5.0;
    x[256 * 4 + 10] = -5.0;
    // 5: every value on a rounding tie of `iscale * v` (max -127 → iscale 1).
    x[b(5)].iter_mut().enumerate().for_each(|(i, v)| {
        *v = if i == 0 {
            -127.0
        } else {
            (i as f32 - 128.0) * 0.5
        }
    });
    // 6: all zeros. 7: one huge value beside tiny ones (most levels round to 0).
    x[b(6)].fill(0.0);
    x[b(7)].iter_mut().for_each(|v| *v *= 1e-30);
    x[256 * 7 + 255] = -1e30;
    let n = x.len() / 256;
    let (mut got, mut want) = (vec![BlockQ8K::default(); n], vec![BlockQ8K::default(); n]);
    (k.more.quantize_row_q8_k)(&x, &mut got);
    r::quantize_row_q8_k_ref(&x, &mut want);
    for i in 0..n {
        assert_eq!(
            bytemuck::bytes_of(&got[i]),
            bytemuck::bytes_of(&want[i]),
            "{p}/q8_k block {i}"
        );
    }
}

#[test]
fn products_agree_bit_for_bit_whatever_the_tile_on_every_path() {
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        check_agree::<BlockQ4_0>(k);
        check_agree::<BlockQ4_1>(k);
        check_agree::<BlockQ8_0>(k);
        eprintln!("kernels_neon: path {p}: vec_dot, matvec and matmul agree bit for bit");
    }
}

#[test]
fn integer_sums_are_exact_at_the_extremes_on_every_path() {
    for p in Path::available() {
        check_integer_extremes(Kernels::for_path(p).unwrap());
    }
}

#[test]
fn quantizers_match_the_reference_on_special_values_on_every_path() {
    for p in Path::available() {
        check_quantizer_special_values(Kernels::for_path(p).unwrap());
        check_q8_k_special_values(Kernels::for_path(p).unwrap());
    }
}

/// A path that only changes how the integer block sums are computed (`avx512vnni` over
/// `avx2`) must give its base path's bits, on the shapes of `check_agree`.
fn check_same_bits<W: WeightFormat>(a: &Kernels, b: &Kernels) {
    for (rows, nb, n_tok) in [
        (1, 1, 1),
        (13, 3, 7),
        (19, 37, 5),
        (33, 18, 64),
        (9, 700, 13),
        // More tokens than the repacked products take per chunk of 64 blocks.
        (9, 130, 70),
    ] {
        let w: Vec<W> = quant(&awkward(rows * nb * 32, (rows * 3 + nb) as u64));
        let x: Vec<W::Activation> = quant(&f32_vec(n_tok * nb * 32, (n_tok + nb) as u64, 1.0));
        let (mut oa, mut ob) = (vec![f32::NAN; rows * n_tok], vec![f32::NAN; rows * n_tok]);
        W::matmul(a)(&w, &x, n_tok, &mut oa);
        W::matmul(b)(&w, &x, n_tok, &mut ob);
        let (pa, pb) = (a.path, b.path);
        for (i, (u, v)) in oa.iter().zip(&ob).enumerate() {
            assert_eq!(
                u.to_bits(),
                v.to_bits(),
                "{pa} vs {pb}, {} {rows}x{nb}x{n_tok} at {i}",
                W::NAME
            );
        }
    }
}

/// Runs wherever the CPU has both paths; where CI's `EDGELLM_EXPECT_PATHS` says this CPU has
/// avx512vnni, its absence fails the test instead of skipping the comparison.
#[test]
fn avx512vnni_gives_the_bits_of_avx2() {
    let pair = (
        Kernels::for_path(Path::Avx2),
        Kernels::for_path(Path::Avx512Vnni),
    );
    if let (Ok(a), Ok(b)) = pair {
        check_same_bits::<BlockQ4_0>(a, b);
        check_same_bits::<BlockQ4_1>(a, b);
        check_same_bits::<BlockQ8_0>(a, b);
        check_same_bits::<BlockQ5_0>(a, b);
        check_same_bits::<BlockQ5_1>(a, b);
    } else {
        let expected = std::env::var("EDGELLM_EXPECT_PATHS")
            .is_ok_and(|v| v.split(',').any(|p| p == "avx512vnni"));
        assert!(
            !expected,
            "avx512vnni is expected on this CPU (EDGELLM_EXPECT_PATHS) but not available"
        );
        eprintln!("kernels_neon: avx512vnni not available here; nothing to compare");
    }
}
