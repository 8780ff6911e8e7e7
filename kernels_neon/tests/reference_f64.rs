//! The scalar reference held to something other than itself: each of its products, quantizers
//! and f32 operations against plain f64 sums over the dequantized operands (`dispatch_walk`
//! compares every fast path with the reference, so the reference needs a check of its own).
//! The reference table is destructured without `..`, so a kernel added to `Kernels` fails to
//! compile here until it has a check.

mod common;

use common::*;
use kernels_neon::dispatch::REFERENCE;
use kernels_neon::*;

/// `|got - want| <= tol`, `want` a sum kept in f64 (exact for the products below: each term
/// is an f32 times an f32).
#[track_caller]
fn assert_near(what: &str, got: f32, want: f64, tol: f64) {
    let d = (got as f64 - want).abs();
    assert!(
        d <= tol,
        "{what}: got {got}, plain f64 {want} (|diff| {d} > tol {tol})"
    );
}

/// The value of a finite f16 encoding (sign, 5 exponent bits, 10 mantissa bits), decoded by
/// hand; infinities and NaN as infinities.
fn f16_value(bits: u16) -> f64 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let (e, m) = (i32::from((bits >> 10) & 31), f64::from(bits & 1023));
    sign * match e {
        0 => m * 2f64.powi(-24),
        31 => f64::INFINITY,
        _ => (1024.0 + m) * 2f64.powi(e - 25),
    }
}

/// `sum x_i y_i` and `sum |x_i y_i|`, in f64.
fn dot64(x: impl IntoIterator<Item = f32>, y: impl IntoIterator<Item = f32>) -> (f64, f64) {
    x.into_iter().zip(y).fold((0.0, 0.0), |(s, a), (x, y)| {
        let t = x as f64 * y as f64;
        (s + t, a + t.abs())
    })
}

/// The reference's products against the plain dot product of the dequantized operands: its
/// integer sums are exact, so only the f32 scaling and accumulation (a few ulps per block)
/// and, for Q4_1 × Q8_1, the activation's `s` part it from the f64 sum: `s` is `d sum(q)` with
/// the f32 `d`, rounded to f16, where the dequantized activation has the f16 `d`, so the
/// offset term `m s` (`m` the block's minimum) may be off by two halves of an f16 ulp.
fn check_reference_products<W: WeightFormat>() {
    let k = &REFERENCE;
    let (dot, mv, mm) = (W::vec_dot(k), W::matvec(k), W::matmul(k));
    let bl = W::BLOCK_LEN;
    // Superblocks of 256 hold 8 or 16 blocks' worth of accumulated sums each.
    let sums_per_block = bl / 32;
    // Q4_K and Q5_K subtract a sub-block minimum from scaled levels: the two parts may each be
    // larger than their difference (the value), so their rounding is bounded by the row's
    // largest value instead (a level times its scale, and the minimum, are each within about
    // twice that of a value the quantizer made).
    let with_min = matches!(W::NAME, "q4_k" | "q5_k");
    for (rows, nb, n_tok) in [
        (1, 1, 1),
        (3, 2, 2),
        (5, 7, 3),
        (9, 48, 4),
        (2, 1536usize, 1),
    ] {
        let nb = blocks_of::<W>(nb);
        let w: Vec<W> = quant(&awkward(rows * nb * bl, (rows * 5 + nb) as u64));
        let a: Vec<W::Activation> = quant(&f32_vec(n_tok * nb * bl, (nb + n_tok) as u64, 1.0));
        let (wf, af) = (dequant(&w), dequant(&a));
        let (mut got_mv, mut got_mm) = (vec![f32::NAN; rows], vec![f32::NAN; rows * n_tok]);
        mv(&w, &a[..nb], &mut got_mv);
        mm(&w, &a, n_tok, &mut got_mm);
        for r in 0..rows {
            let wr = &wf[r * nb * bl..][..nb * bl];
            for t in 0..n_tok {
                let at = &af[t * nb * bl..][..nb * bl];
                let (want, abs) = dot64(wr.iter().copied(), at.iter().copied());
                let abs = if with_min {
                    let wmax = wr.iter().fold(0.0f64, |m, &x| m.max((x as f64).abs()));
                    abs + 4.0 * wmax * at.iter().map(|&y| (y as f64).abs()).sum::<f64>()
                } else {
                    abs
                };
                let mut tol = DOT_REL as f64 * (nb * sums_per_block + 2) as f64 * abs + 1e-30;
                if W::NAME == "q4_1" || W::NAME == "q5_1" {
                    for (wb, ab) in wr.chunks_exact(32).zip(at.chunks_exact(32)) {
                        let m = wb.iter().fold(f32::MAX, |m, &x| m.min(x)) as f64;
                        let s: f64 = ab.iter().map(|&x| x as f64).sum();
                        tol += (m * s).abs() * 2f64.powi(-10) * 1.01;
                    }
                }
                let what = format!("reference/{} {rows}x{nb}x{n_tok} row {r} tok {t}", W::NAME);
                let wblocks = &w[r * nb..][..nb];
                let ablocks = &a[t * nb..][..nb];
                assert_near(&format!("{what} vec_dot"), dot(wblocks, ablocks), want, tol);
                assert_near(&format!("{what} matmul"), got_mm[r * n_tok + t], want, tol);
                if t == 0 {
                    assert_near(&format!("{what} matvec"), got_mv[r], want, tol);
                }
            }
        }
    }
}

/// A reference quantizer's blocks give back their input within half a step (`d = amax/127`),
/// plus the f16 rounding of `d` (half an ulp, or of the smallest subnormal) over up to 127
/// steps.
fn check_reference_quantizer<B: BlockFormat>(name: &str, fast: fn(&[f32], &mut [B])) {
    for &nb in &BLOCK_COUNTS {
        let x = awkward(nb * 32, nb as u64 + 77);
        let mut q = vec![B::default(); nb];
        fast(&x, &mut q);
        let y = dequant(&q);
        for (b, (xb, yb)) in x.chunks_exact(32).zip(y.chunks_exact(32)).enumerate() {
            let d = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs())) as f64 / 127.0;
            for (i, (&xi, &yi)) in xb.iter().zip(yb).enumerate() {
                let what = format!("reference/{name} nb={nb} block {b} [{i}]");
                let f16_err = (d * 2f64.powi(-11)).max(2f64.powi(-25));
                assert_near(&what, yi, xi as f64, d * (0.5 + 1e-6) + 127.0 * f16_err);
            }
        }
    }
}

/// Q8_K (256 values, an f32 scale, the sums of each 16): the block's value of largest
/// magnitude is level -127, so every value comes back within half a step `|d| = amax / 127`;
/// `bsums` are the exact sums of the levels.
fn check_reference_q8_k(fast: fn(&[f32], &mut [BlockQ8K])) {
    for nb in [1, 2, 5] {
        let x = awkward(nb * 256, nb as u64 + 91);
        let mut q = vec![BlockQ8K::default(); nb];
        fast(&x, &mut q);
        for (b, (blk, xb)) in q.iter().zip(x.chunks_exact(256)).enumerate() {
            let amax = xb.iter().fold(0.0f32, |m, &v| m.max(v.abs())) as f64;
            let step = blk.d.abs() as f64;
            assert_near(
                &format!("reference/q8_k d nb={nb} block {b}"),
                blk.d.abs(),
                amax / 127.0,
                amax * 1e-6,
            );
            for (i, (&xi, &qi)) in xb.iter().zip(&blk.qs).enumerate() {
                let what = format!("reference/q8_k nb={nb} block {b} [{i}]");
                assert_near(
                    &what,
                    blk.d * qi as f32,
                    xi as f64,
                    step * (0.5 + 1e-6) + 1e-30,
                );
            }
            for (j, &s) in blk.bsums.iter().enumerate() {
                let want: i32 = blk.qs[j * 16..][..16].iter().map(|&v| v as i32).sum();
                assert_eq!(
                    s as i32, want,
                    "reference/q8_k nb={nb} block {b} bsums[{j}]"
                );
            }
        }
    }
}

/// The reference's f32 and f16 operations against the same formulas kept in f64.
fn check_reference_ops(k: &Kernels) {
    // No `..`, as in `check_kernels`: a kernel added to `Kernels` needs a check here too.
    let Kernels {
        path,
        quantize_row_q8_0,
        quantize_row_q8_1,
        vec_dot_q4_0_q8_0: _,
        vec_dot_q4_1_q8_1: _,
        vec_dot_q8_0_q8_0: _,
        matvec_q4_0_q8_0: _,
        matvec_q4_1_q8_1: _,
        matvec_q8_0_q8_0: _,
        matmul_q4_0_q8_0: _,
        matmul_q4_1_q8_1: _,
        matmul_q8_0_q8_0: _,
        packed,
        packed_k,
        more,
        rms_norm,
        softmax,
        silu_mul,
        gelu_mul,
        rope_norm,
        rope_neox,
        add,
        scale,
        dot_f32,
        axpy_f32,
        dot_f16,
        axpy_f16,
        scores_f16,
        mix_f16,
        f16_to_f32_row,
        f32_to_f16_row,
    } = *k;
    // The products (the `_` fields above) are `check_reference_products`'.
    assert_eq!(path, Path::Reference);
    assert!(packed.is_none(), "the reference has no packed products");
    assert!(
        packed_k.is_none(),
        "the reference has no packed K-quant products"
    );
    check_reference_q8_k(more.quantize_row_q8_k);
    check_reference_quantizer::<BlockQ8_0>("quantize_row_q8_0", quantize_row_q8_0);
    check_reference_quantizer::<BlockQ8_1>("quantize_row_q8_1", quantize_row_q8_1);
    // Q8_1's `s` is `d sum(q)` (with the f32 `d`; the f16 one differs by half an f16 ulp),
    // rounded to f16.
    for &nb in &BLOCK_COUNTS {
        let x = f32_vec(nb * 32, nb as u64 + 5, 1.0);
        let mut q = vec![BlockQ8_1::default(); nb];
        quantize_row_q8_1(&x, &mut q);
        for (b, blk) in q.iter().enumerate() {
            let s = blk.d.to_f32() as f64 * blk.qs.iter().map(|&v| v as f64).sum::<f64>();
            let tol = s.abs() * 2f64.powi(-10) * 1.01 + 2f64.powi(-24);
            assert_near(
                &format!("reference/q8_1 s nb={nb} block {b}"),
                blk.s.to_f32(),
                s,
                tol,
            );
        }
    }

    let rel = |w: f64| OPS_REL as f64 * w.abs().max(1.0);
    for &n in &LENS {
        let x = f32_vec(n, n as u64 + 1, 2.0);
        let w = f32_vec(n, n as u64 + 2, 1.0);
        let h = f16_vec(n, n as u64 + 3);
        let hf: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        let what = |op: &str, i: usize| format!("reference/{op} n={n} [{i}]");

        let mut out = vec![0.0; n];
        rms_norm(&x, &w, 1e-5, &mut out);
        let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        for i in 0..n {
            let want = x[i] as f64 / (ms + 1e-5).sqrt() * w[i] as f64;
            assert_near(&what("rms_norm", i), out[i], want, rel(want));
        }
        silu_mul(&x, &w, &mut out);
        for i in 0..n {
            let g = x[i] as f64;
            let want = g / (1.0 + (-g).exp()) * w[i] as f64;
            assert_near(&what("silu_mul", i), out[i], want, rel(want));
        }
        gelu_mul(&x, &w, &mut out);
        for i in 0..n {
            let g = x[i] as f64;
            let u = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
            let want = 0.5 * g * (1.0 + u.tanh()) * w[i] as f64;
            assert_near(&what("gelu_mul", i), out[i], want, rel(want));
        }
        let mut sm = x.clone();
        softmax(&mut sm);
        let max = x.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
        let z: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
        for i in 0..n {
            let want = (x[i] as f64 - max).exp() / z;
            assert_near(&what("softmax", i), sm[i], want, rel(want));
        }
        // One correctly rounded f32 operation each: the f64 result, rounded.
        let (mut sum, mut scaled) = (x.clone(), x.clone());
        add(&mut sum, &w);
        scale(&mut scaled, 0.3);
        for i in 0..n {
            assert_eq!(
                sum[i],
                (x[i] as f64 + w[i] as f64) as f32,
                "{}",
                what("add", i)
            );
            assert_eq!(
                scaled[i],
                (x[i] as f64 * 0.3f32 as f64) as f32,
                "{}",
                what("scale", i)
            );
        }
        for (op, dot, y) in [
            ("dot_f32", dot_f32(&x, &w), &x),
            ("dot_f16", dot_f16(&h, &w), &hf),
        ] {
            let (want, abs) = dot64(y.iter().copied(), w.iter().copied());
            assert_near(
                &what(op, 0),
                dot,
                want,
                DOT_REL as f64 * n as f64 * abs + 1e-30,
            );
        }
        let (mut y32, mut y16) = (x.clone(), x.clone());
        axpy_f32(&mut y32, -0.75, &w);
        axpy_f16(&mut y16, 0.3, &h);
        for i in 0..n {
            let want = x[i] as f64 - 0.75 * w[i] as f64;
            assert_near(&what("axpy_f32", i), y32[i], want, rel(want));
            let want = x[i] as f64 + 0.3f32 as f64 * hf[i] as f64;
            assert_near(&what("axpy_f16", i), y16[i], want, rel(want));
        }
        // Conversions, against the f16 encoding decoded by hand: f16 → f32 is exact; f32 →
        // f16 is the nearest of the two f16 around the value.
        let mut back = vec![0.0f32; n];
        f16_to_f32_row(&h, &mut back);
        let mut hx = vec![f16::ZERO; n];
        f32_to_f16_row(&x, &mut hx);
        for i in 0..n {
            let want = f16_value(h[i].to_bits());
            assert_near(&what("f16_to_f32_row", i), back[i], want, 0.0);
            let (b, v) = (hx[i].to_bits(), x[i] as f64);
            let got = f16_value(b);
            for other in [b.wrapping_sub(1), b.wrapping_add(1)] {
                assert!(
                    (got - v).abs() <= (f16_value(other) - v).abs(),
                    "{}: {v} became {got}, {} is nearer",
                    what("f32_to_f16_row", i),
                    f16_value(other)
                );
            }
        }
    }

    // RoPE: each rotated pair `(a, b)` becomes `(a cos - b sin, a sin + b cos)`.
    for (name, rope, neox) in [
        ("rope_norm", rope_norm, false),
        ("rope_neox", rope_neox, true),
    ] {
        let (hd, n_rot) = (8, 6);
        let x = f32_vec(2 * hd, 99, 1.0);
        let cs: Vec<f32> = (0..n_rot / 2)
            .flat_map(|i| [(i as f32 + 0.5).cos(), (i as f32 + 0.5).sin()])
            .collect();
        let mut got = x.clone();
        rope(&mut got, hd, &cs);
        for head in 0..2 {
            let b = head * hd;
            let mut want: Vec<f64> = x[b..b + hd].iter().map(|&v| v as f64).collect();
            for i in 0..n_rot / 2 {
                let (i0, i1) = if neox {
                    (i, i + n_rot / 2)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (c, s) = (cs[2 * i] as f64, cs[2 * i + 1] as f64);
                let (a, bb) = (x[b + i0] as f64, x[b + i1] as f64);
                want[i0] = a * c - bb * s;
                want[i1] = a * s + bb * c;
            }
            for (i, &wv) in want.iter().enumerate() {
                assert_near(
                    &format!("reference/{name} [{}]", b + i),
                    got[b + i],
                    wv,
                    rel(wv),
                );
            }
        }
    }

    // Attention over strided rows: scores `scale q_h · row j`, mix `out_h + sum_j p row j`.
    let (width, stride, n, heads) = (9, 13, 5, 3);
    let rows = f16_vec((n - 1) * stride + width, 123);
    let row = |j: usize| rows[j * stride..][..width].iter().map(|v| v.to_f32());
    let q = f32_vec(heads * width, 124, 1.0);
    let mut sc = vec![0.0f32; heads * n];
    scores_f16(&rows, stride, &q, heads, 0.125, &mut sc);
    let p = f32_vec(heads * n, 125, 1.0);
    let init = f32_vec(heads * width, 126, 1.0);
    let mut mixed = init.clone();
    mix_f16(&rows, stride, &p, heads, &mut mixed);
    for h in 0..heads {
        for j in 0..n {
            let (dot, abs) = dot64(row(j), q[h * width..][..width].iter().copied());
            let tol = DOT_REL as f64 * width as f64 * abs + 1e-30;
            assert_near(
                &format!("reference/scores_f16 [{h}][{j}]"),
                sc[h * n + j],
                dot / 8.0,
                tol,
            );
        }
        for c in 0..width {
            let terms = (0..n).map(|j| p[h * n + j] as f64 * row(j).nth(c).unwrap() as f64);
            let (want, abs) = terms.fold((init[h * width + c] as f64, 0.0), |(s, a), t| {
                (s + t, a + t.abs())
            });
            let tol = DOT_REL as f64 * (n + 1) as f64 * (abs + init[h * width + c].abs() as f64);
            assert_near(
                &format!("reference/mix_f16 [{h}][{c}]"),
                mixed[h * width + c],
                want,
                tol,
            );
        }
    }
}

#[test]
fn the_reference_matches_plain_f64_sums() {
    check_reference_products::<BlockQ4_0>();
    check_reference_products::<BlockQ4_1>();
    check_reference_products::<BlockQ8_0>();
    check_reference_products::<BlockQ5_0>();
    check_reference_products::<BlockQ5_1>();
    check_reference_products::<BlockQ4K>();
    check_reference_products::<BlockQ5K>();
    check_reference_products::<BlockQ6K>();
    check_reference_ops(&REFERENCE);
}
