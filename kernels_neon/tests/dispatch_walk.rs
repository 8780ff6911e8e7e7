//! Walks the dispatch table of every path this CPU can run and checks each kernel against
//! its scalar reference; the reference itself (which the walk would only compare with itself)
//! is checked against plain f64 sums over the dequantized operands in `reference_f64.rs`.
//! Both tables are destructured without `..`, so a kernel added to `Kernels` fails to compile
//! here or there until it has a check.
//!
//! Tolerances (stated once, used everywhere):
//! - quantizers: byte-identical to the reference;
//! - integer parts of dot products: exact (checked through the reference on integer-valued
//!   scales, where f32 is exact);
//! - dot products / matrix products: `|fast - ref| <= DOT_REL * n_blocks * sum|terms|`, i.e. a
//!   few ulps per accumulated block, for the differently ordered f32 accumulation;
//! - f32 ops: `|fast - ref| <= OPS_REL * max(1, |ref|)`.
//!
//! (`DOT_REL`, `OPS_REL` and the awkward lengths are in `common.rs`, shared with
//! `reference_f64.rs`.)

mod common;

use common::*;
use kernels_neon::dispatch::{MixFn, REFERENCE, ScoresFn};
use kernels_neon::reference as r;
use kernels_neon::*;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// `sum |x_i y_i|` of the dequantized operands: the scale of a dot product's rounding error.
fn abs_dot<W: BlockFormat>(w: &[W], a: &[W::Activation]) -> f32 {
    let (x, y) = (dequant(w), dequant(a));
    x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum::<f32>() + 1e-30
}

fn check_quantizer<B: BlockFormat + PartialEq + std::fmt::Debug>(
    path: Path,
    name: &str,
    fast: fn(&[f32], &mut [B]),
) {
    for &nb in &BLOCK_COUNTS {
        for seed in 0..3u64 {
            let x = awkward(nb * B::BLOCK_LEN, seed * 1000 + nb as u64);
            let want = quant::<B>(&x);
            let mut got = vec![B::default(); nb];
            fast(&x, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g, w,
                    "{path}/{name}: block {i} of {nb} differs from the reference"
                );
            }
        }
    }
}

fn check_vec_dot<W: BlockFormat>(path: Path, name: &str, fast: fn(&[W], &[W::Activation]) -> f32) {
    for &nb in &BLOCK_COUNTS {
        let nb = blocks_of::<W>(nb);
        let n = nb * W::BLOCK_LEN;
        let w: Vec<W> = quant(&awkward(n, 7 + nb as u64));
        let a: Vec<W::Activation> = quant(&f32_vec(n, 11 + nb as u64, 1.0));
        let want = W::vec_dot_ref(&w, &a);
        let got = fast(&w, &a);
        let tol = DOT_REL * nb as f32 * abs_dot(&w, &a);
        assert_close(&format!("{path}/{name} nb={nb}"), got, want, tol);
    }
}

fn matvec_shapes(block_len: usize) -> Vec<(usize, usize)> {
    // (rows, blocks of 32 per row): odd row counts around any multi-row tile, and the real
    // models' shapes: SmolLM2's for the 32-value formats; for the K-quants Gemma 3's ffn_down
    // (2048 columns), as their quantizers are slow under qemu (SmolLM2's LM head in a K-quant
    // cost six emulated minutes per walk).
    let mut v = vec![
        (1, 1),
        (2, 3),
        (3, 18),
        (4, 1),
        (5, 7),
        (7, 2),
        (8, 18),
        (9, 48),
        (17, 33),
        (31, 5),
        (64, 18),
    ];
    if block_len == 32 {
        v.extend([(1536, 18), (576, 48), (49152, 18)]);
    } else {
        v.extend([(640, 64), (1024, 32)]);
    }
    v
}

/// A matrix-vector case: weights, activation, the reference product and each row's tolerance.
struct MatVecCase<W: BlockFormat> {
    w: Vec<W>,
    a: Vec<W::Activation>,
    want: Vec<f32>,
    tol: Vec<f32>,
}

/// The case of one format and shape, built once and shared by every path's walk: under qemu,
/// quantizing and summing SmolLM2's LM head again for each path was most of the walk's time.
fn matvec_case<W: WeightFormat>(rows: usize, nb: usize) -> Rc<MatVecCase<W>> {
    /// Cases by (format, rows, blocks per row).
    type Cases = HashMap<(TypeId, usize, usize), Rc<dyn Any>>;
    thread_local! {
        static CASES: RefCell<Cases> = RefCell::default();
    }
    let key = (TypeId::of::<W>(), rows, nb);
    if let Some(case) = CASES.with(|c| c.borrow().get(&key).cloned()) {
        return case.downcast().expect("cases are keyed by their format");
    }
    let n = nb * W::BLOCK_LEN;
    let w: Vec<W> = quant(&awkward(rows * n, (rows * 31 + nb) as u64));
    let a: Vec<W::Activation> = quant(&f32_vec(n, nb as u64, 1.0));
    let mut want = vec![0.0; rows];
    r::matvec_ref(&w, &a, &mut want);
    let tol = w
        .chunks_exact(nb)
        .map(|row| DOT_REL * nb as f32 * abs_dot(row, &a))
        .collect();
    let case = Rc::new(MatVecCase { w, a, want, tol });
    CASES.with(|c| c.borrow_mut().insert(key, case.clone()));
    case
}

fn check_matvec<W: WeightFormat>(
    path: Path,
    name: &str,
    fast: dispatch::MatVecFn<W, W::Activation>,
) {
    for (rows, nb) in matvec_shapes(W::BLOCK_LEN) {
        let nb = blocks_of::<W>(nb);
        let case = matvec_case::<W>(rows, nb);
        let mut got = vec![f32::NAN; rows];
        fast(&case.w, &case.a, &mut got);
        for (i, (&g, &want)) in got.iter().zip(&case.want).enumerate() {
            assert_close(
                &format!("{path}/{name} {rows}x{nb} row {i}"),
                g,
                want,
                case.tol[i],
            );
        }
    }
}

fn check_matmul<W: WeightFormat>(
    path: Path,
    name: &str,
    fast: dispatch::MatMulFn<W, W::Activation>,
) {
    for (rows, nb, n_tok) in [
        (1, 1, 1),
        (3, 2, 2),
        (5, 7, 3),
        (8, 18, 4),
        (17, 3, 7),
        (33, 18, 13),
        (64, 48, 16),
        (576, 18, 33),
    ] {
        let nb = blocks_of::<W>(nb);
        let n = nb * W::BLOCK_LEN;
        let w: Vec<W> = quant(&awkward(rows * n, (rows + nb * 7) as u64));
        let a: Vec<W::Activation> = quant(&f32_vec(n_tok * n, (n_tok * 3 + nb) as u64, 1.0));
        let mut got = vec![f32::NAN; rows * n_tok];
        fast(&w, &a, n_tok, &mut got);
        assert_matmul_close(&format!("{path}/{name}"), &w, &a, n_tok, &got);
    }
}

/// `got` (`[row][tok]`) against the reference product of `w` and `a`, each pair within the
/// dot-product tolerance.
fn assert_matmul_close<W: BlockFormat>(
    what: &str,
    w: &[W],
    a: &[W::Activation],
    n_tok: usize,
    got: &[f32],
) {
    let nb = a.len() / n_tok;
    let rows = w.len() / nb;
    let mut want = vec![0.0; rows * n_tok];
    r::matmul_ref(w, a, n_tok, &mut want);
    for (ri, row) in w.chunks_exact(nb).enumerate() {
        for (t, act) in a.chunks_exact(nb).enumerate() {
            let tol = DOT_REL * nb as f32 * abs_dot(row, act);
            let i = ri * n_tok + t;
            assert_close(
                &format!("{what} {rows}x{nb}x{n_tok} row {ri} tok {t}"),
                got[i],
                want[i],
                tol,
            );
        }
    }
}

/// The Q5_0, Q5_1 and K-quant products and the Q8_K quantizer of a path's table.
fn check_more_formats(p: Path, m: &MoreFormats) {
    // No `..`: a kernel added to `MoreFormats` breaks this line until it is checked below.
    let MoreFormats {
        quantize_row_q8_k,
        vec_dot_q5_0_q8_0,
        vec_dot_q5_1_q8_1,
        vec_dot_q4_k_q8_k,
        vec_dot_q5_k_q8_k,
        vec_dot_q6_k_q8_k,
        matvec_q5_0_q8_0,
        matvec_q5_1_q8_1,
        matvec_q4_k_q8_k,
        matvec_q5_k_q8_k,
        matvec_q6_k_q8_k,
        matmul_q5_0_q8_0,
        matmul_q5_1_q8_1,
        matmul_q4_k_q8_k,
        matmul_q5_k_q8_k,
        matmul_q6_k_q8_k,
    } = *m;
    // A path whose entry is the reference itself has nothing to compare (and the K-quants'
    // quantizers make the walk minutes longer under qemu).
    // (The reference table as the crate hands it out: a generic function's address is only
    // comparable within the crate that instantiated it.)
    let r = &Kernels::for_path(Path::Reference).unwrap().more;
    macro_rules! walk {
        ($check:ident::<$b:ty>, $f:ident) => {
            if std::ptr::fn_addr_eq($f, r.$f) {
                eprintln!("kernels_neon: {p}/{} is the reference", stringify!($f));
            } else {
                $check::<$b>(p, stringify!($f), $f);
            }
        };
    }
    walk!(check_quantizer::<BlockQ8K>, quantize_row_q8_k);

    walk!(check_vec_dot::<BlockQ5_0>, vec_dot_q5_0_q8_0);
    walk!(check_vec_dot::<BlockQ5_1>, vec_dot_q5_1_q8_1);
    walk!(check_vec_dot::<BlockQ4K>, vec_dot_q4_k_q8_k);
    walk!(check_vec_dot::<BlockQ5K>, vec_dot_q5_k_q8_k);
    walk!(check_vec_dot::<BlockQ6K>, vec_dot_q6_k_q8_k);

    walk!(check_matvec::<BlockQ5_0>, matvec_q5_0_q8_0);
    walk!(check_matvec::<BlockQ5_1>, matvec_q5_1_q8_1);
    walk!(check_matvec::<BlockQ4K>, matvec_q4_k_q8_k);
    walk!(check_matvec::<BlockQ5K>, matvec_q5_k_q8_k);
    walk!(check_matvec::<BlockQ6K>, matvec_q6_k_q8_k);

    walk!(check_matmul::<BlockQ5_0>, matmul_q5_0_q8_0);
    walk!(check_matmul::<BlockQ5_1>, matmul_q5_1_q8_1);
    walk!(check_matmul::<BlockQ4K>, matmul_q4_k_q8_k);
    walk!(check_matmul::<BlockQ5K>, matmul_q5_k_q8_k);
    walk!(check_matmul::<BlockQ6K>, matmul_q6_k_q8_k);
}

/// The packed products against the reference, with the matrix products' tolerance (their
/// bit-identity with the path's own unpacked products is `tests/packed.rs`).
fn check_packed_kernels(p: Path, pk: &PackedKernels) {
    // No `..`, as above.
    let PackedKernels {
        matvec_q4_0x8_q8_0,
        matvec_q4_1x8_q8_1,
        matvec_q8_0x8_q8_0,
        matvec_q5_0x8_q8_0,
        matmul_q4_0x8_q8_0,
        matmul_q4_1x8_q8_1,
        matmul_q8_0x8_q8_0,
        matmul_q5_0x8_q8_0,
    } = *pk;
    check_packed::<BlockQ4_0x8>(
        p,
        "matvec_q4_0x8_q8_0",
        &|w, a, _, o| matvec_q4_0x8_q8_0(w, a, o),
        true,
    );
    check_packed::<BlockQ4_1x8>(
        p,
        "matvec_q4_1x8_q8_1",
        &|w, a, _, o| matvec_q4_1x8_q8_1(w, a, o),
        true,
    );
    check_packed::<BlockQ8_0x8>(
        p,
        "matvec_q8_0x8_q8_0",
        &|w, a, _, o| matvec_q8_0x8_q8_0(w, a, o),
        true,
    );
    check_packed::<BlockQ5_0x8>(
        p,
        "matvec_q5_0x8_q8_0",
        &|w, a, _, o| matvec_q5_0x8_q8_0(w, a, o),
        true,
    );
    check_packed::<BlockQ4_0x8>(p, "matmul_q4_0x8_q8_0", &matmul_q4_0x8_q8_0, false);
    check_packed::<BlockQ4_1x8>(p, "matmul_q4_1x8_q8_1", &matmul_q4_1x8_q8_1, false);
    check_packed::<BlockQ8_0x8>(p, "matmul_q8_0x8_q8_0", &matmul_q8_0x8_q8_0, false);
    check_packed::<BlockQ5_0x8>(p, "matmul_q5_0x8_q8_0", &matmul_q5_0x8_q8_0, false);
}

/// The packed K-quant products against the reference, as [`check_packed_kernels`].
fn check_packed_k_kernels(p: Path, pk: &PackedKQuants) {
    // No `..`, as above.
    let PackedKQuants {
        matvec_q4_kx8_q8_k,
        matvec_q5_kx8_q8_k,
        matvec_q6_kx8_q8_k,
        matmul_q4_kx8_q8_k,
        matmul_q5_kx8_q8_k,
        matmul_q6_kx8_q8_k,
    } = *pk;
    check_packed::<BlockQ4Kx8>(
        p,
        "matvec_q4_kx8_q8_k",
        &|w, a, _, o| matvec_q4_kx8_q8_k(w, a, o),
        true,
    );
    check_packed::<BlockQ5Kx8>(
        p,
        "matvec_q5_kx8_q8_k",
        &|w, a, _, o| matvec_q5_kx8_q8_k(w, a, o),
        true,
    );
    check_packed::<BlockQ6Kx8>(
        p,
        "matvec_q6_kx8_q8_k",
        &|w, a, _, o| matvec_q6_kx8_q8_k(w, a, o),
        true,
    );
    check_packed::<BlockQ4Kx8>(p, "matmul_q4_kx8_q8_k", &matmul_q4_kx8_q8_k, false);
    check_packed::<BlockQ5Kx8>(p, "matmul_q5_kx8_q8_k", &matmul_q5_kx8_q8_k, false);
    check_packed::<BlockQ6Kx8>(p, "matmul_q6_kx8_q8_k", &matmul_q6_kx8_q8_k, false);
}

type PackedProduct<'f, P> =
    &'f dyn Fn(&[P], &[<<P as PackedFormat>::Row as BlockFormat>::Activation], usize, &mut [f32]);

fn check_packed<P: PackedFormat>(
    path: Path,
    name: &str,
    fast: PackedProduct<'_, P>,
    one_token: bool,
) {
    for (rows, nb, n_tok) in [
        (8, 1, 3),
        (16, 7, 5),
        (24, 18, 2),
        (64, 48, 9),
        (576, 18, 4),
    ] {
        let n_tok = if one_token { 1 } else { n_tok };
        let nb = blocks_of::<P::Row>(nb);
        let n = nb * P::Row::BLOCK_LEN;
        let w: Vec<P::Row> = quant(&awkward(rows * n, (rows * 3 + nb) as u64));
        let mut pw = vec![P::default(); w.len() / PACK_ROWS];
        pack_matrix(&w, nb, &mut pw);
        let a: Vec<<P::Row as BlockFormat>::Activation> =
            quant(&f32_vec(n_tok * n, (n_tok + nb) as u64, 1.0));
        let mut got = vec![f32::NAN; rows * n_tok];
        fast(&pw, &a, n_tok, &mut got);
        assert_matmul_close(&format!("{path}/{name}"), &w, &a, n_tok, &got);
    }
}

fn check_unary(
    path: Path,
    name: &str,
    fast: fn(&mut [f32]),
    reference: fn(&mut [f32]),
    sigma: f32,
) {
    for &n in &LENS {
        let x = f32_vec(n, n as u64, sigma);
        let (mut got, mut want) = (x.clone(), x);
        fast(&mut got);
        reference(&mut want);
        assert_all_close(&format!("{path}/{name} n={n}"), &got, &want, OPS_REL);
    }
}

fn check_kernels(k: &Kernels) {
    // No `..`: adding a field to `Kernels` breaks this line until the field is checked below.
    let Kernels {
        path,
        quantize_row_q8_0,
        quantize_row_q8_1,
        vec_dot_q4_0_q8_0,
        vec_dot_q4_1_q8_1,
        vec_dot_q8_0_q8_0,
        matvec_q4_0_q8_0,
        matvec_q4_1_q8_1,
        matvec_q8_0_q8_0,
        matmul_q4_0_q8_0,
        matmul_q4_1_q8_1,
        matmul_q8_0_q8_0,
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
    let p = path;

    check_quantizer::<BlockQ8_0>(p, "quantize_row_q8_0", quantize_row_q8_0);
    check_quantizer::<BlockQ8_1>(p, "quantize_row_q8_1", quantize_row_q8_1);

    check_vec_dot::<BlockQ4_0>(p, "vec_dot_q4_0_q8_0", vec_dot_q4_0_q8_0);
    check_vec_dot::<BlockQ4_1>(p, "vec_dot_q4_1_q8_1", vec_dot_q4_1_q8_1);
    check_vec_dot::<BlockQ8_0>(p, "vec_dot_q8_0_q8_0", vec_dot_q8_0_q8_0);

    check_matvec::<BlockQ4_0>(p, "matvec_q4_0_q8_0", matvec_q4_0_q8_0);
    check_matvec::<BlockQ4_1>(p, "matvec_q4_1_q8_1", matvec_q4_1_q8_1);
    check_matvec::<BlockQ8_0>(p, "matvec_q8_0_q8_0", matvec_q8_0_q8_0);

    check_matmul::<BlockQ4_0>(p, "matmul_q4_0_q8_0", matmul_q4_0_q8_0);
    check_matmul::<BlockQ4_1>(p, "matmul_q4_1_q8_1", matmul_q4_1_q8_1);
    check_matmul::<BlockQ8_0>(p, "matmul_q8_0_q8_0", matmul_q8_0_q8_0);

    if let Some(pk) = packed {
        check_packed_kernels(p, &pk);
    }
    if let Some(pk) = packed_k {
        check_packed_k_kernels(p, &pk);
    }
    check_more_formats(p, &more);

    // The gated units far out on both sides, where `exp` overflows or underflows (a lane of
    // each chunk and of the tail): finite, and as the reference.
    let far = [
        -1e4, -100.0, -20.0, -10.0, -1e-30, 0.0, 1e-30, 10.0, 20.0, 100.0, 1e4, -88.0, 88.0,
    ];
    let ones = [1.0; 13];
    for (name, f, reference) in [
        (
            "silu_mul",
            silu_mul,
            r::silu_mul_ref as fn(&[f32], &[f32], &mut [f32]),
        ),
        ("gelu_mul", gelu_mul, r::gelu_mul_ref),
    ] {
        let (mut got, mut want) = ([0.0; 13], [0.0; 13]);
        f(&far, &ones, &mut got);
        reference(&far, &ones, &mut want);
        assert!(got.iter().all(|v| v.is_finite()), "{p}/{name} far: {got:?}");
        assert_all_close(&format!("{p}/{name} far"), &got, &want, OPS_REL);
    }

    for &n in &LENS {
        let x = f32_vec(n, n as u64 + 1, 2.0);
        let w = f32_vec(n, n as u64 + 2, 1.0);
        let (mut got, mut want) = (vec![0.0; n], vec![0.0; n]);
        rms_norm(&x, &w, 1e-5, &mut got);
        r::rms_norm_ref(&x, &w, 1e-5, &mut want);
        assert_all_close(&format!("{p}/rms_norm n={n}"), &got, &want, OPS_REL);

        silu_mul(&x, &w, &mut got);
        r::silu_mul_ref(&x, &w, &mut want);
        assert_all_close(&format!("{p}/silu_mul n={n}"), &got, &want, OPS_REL);
        gelu_mul(&x, &w, &mut got);
        r::gelu_mul_ref(&x, &w, &mut want);
        assert_all_close(&format!("{p}/gelu_mul n={n}"), &got, &want, OPS_REL);

        let (mut got, mut want) = (x.clone(), x.clone());
        add(&mut got, &w);
        r::add_ref(&mut want, &w);
        assert_all_close(&format!("{p}/add n={n}"), &got, &want, 0.0);
        scale(&mut got, 0.125);
        r::scale_ref(&mut want, 0.125);
        assert_all_close(&format!("{p}/scale n={n}"), &got, &want, 0.0);

        let abs: f32 = x.iter().zip(&w).map(|(a, b)| (a * b).abs()).sum();
        let tol = DOT_REL * n as f32 * abs + 1e-30;
        assert_close(
            &format!("{p}/dot_f32 n={n}"),
            dot_f32(&x, &w),
            r::dot_f32_ref(&x, &w),
            tol,
        );
        let h = f16_vec(n, n as u64 + 3);
        let habs: f32 = h.iter().zip(&w).map(|(a, b)| (a.to_f32() * b).abs()).sum();
        let htol = DOT_REL * n as f32 * habs + 1e-30;
        assert_close(
            &format!("{p}/dot_f16 n={n}"),
            dot_f16(&h, &w),
            r::dot_f16_ref(&h, &w),
            htol,
        );

        let (mut got, mut want) = (x.clone(), x.clone());
        axpy_f32(&mut got, -0.75, &w);
        r::axpy_f32_ref(&mut want, -0.75, &w);
        assert_all_close(&format!("{p}/axpy_f32 n={n}"), &got, &want, OPS_REL);
        let (mut got, mut want) = (x.clone(), x.clone());
        axpy_f16(&mut got, 0.3, &h);
        r::axpy_f16_ref(&mut want, 0.3, &h);
        assert_all_close(&format!("{p}/axpy_f16 n={n}"), &got, &want, OPS_REL);

        // Conversions are exact (f32 → f16 rounds to nearest even on every path).
        let (mut got, mut want) = (vec![0.0f32; n], vec![0.0f32; n]);
        f16_to_f32_row(&h, &mut got);
        block::f16_to_f32_row(&h, &mut want);
        assert_all_close(&format!("{p}/f16_to_f32_row n={n}"), &got, &want, 0.0);
        let mut xs = x.clone();
        xs.extend([
            65504.0,
            65520.0,
            1e9,
            -1e9,
            6e-8,
            2.98e-8,
            -0.0,
            f32::INFINITY,
        ]);
        let (mut got, mut want) = (vec![f16::ZERO; xs.len()], vec![f16::ZERO; xs.len()]);
        f32_to_f16_row(&xs, &mut got);
        block::f32_to_f16_row(&xs, &mut want);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{p}/f32_to_f16_row n={n} [{i}] from {}",
                xs[i]
            );
        }
    }

    check_attention_rows(p, (scores_f16, mix_f16), axpy_f16);

    check_unary(p, "softmax", softmax, r::softmax_ref, 3.0);
    // Also softmax over masked scores (-inf) as attention produces them.
    let mut x = f32_vec(37, 5, 4.0);
    x[3] = f32::NEG_INFINITY;
    x[36] = f32::NEG_INFINITY;
    let (mut got, mut want) = (x.clone(), x);
    softmax(&mut got);
    r::softmax_ref(&mut want);
    assert_all_close(&format!("{p}/softmax masked"), &got, &want, OPS_REL);

    for (head_dim, n_heads, n_rot) in [
        (64, 9, 64),
        (64, 3, 64),
        (128, 2, 128),
        (8, 1, 8),
        (64, 2, 32),
        (6, 5, 4),
    ] {
        let x = f32_vec(head_dim * n_heads, head_dim as u64, 1.0);
        let cs: Vec<f32> = (0..n_rot / 2)
            .flat_map(|i| {
                let theta = 17.0 * 10000f32.powf(-2.0 * i as f32 / n_rot as f32);
                [theta.cos(), theta.sin()]
            })
            .collect();
        for (name, fast, reference) in [
            (
                "rope_norm",
                rope_norm,
                r::rope_norm_ref as fn(&mut [f32], usize, &[f32]),
            ),
            ("rope_neox", rope_neox, r::rope_neox_ref),
        ] {
            let (mut got, mut want) = (x.clone(), x.clone());
            fast(&mut got, head_dim, &cs);
            reference(&mut want, head_dim, &cs);
            assert_all_close(
                &format!("{p}/{name} d={head_dim} h={n_heads} rot={n_rot}"),
                &got,
                &want,
                OPS_REL,
            );
        }
    }
}

/// `scores_f16` and `mix_f16` over strided rows for groups of query heads, close to the
/// reference, and per head and row the same bits however the heads are grouped and the rows
/// tiled (a score equals that head's score over that row alone; a mix equals one of the
/// path's `axpy_f16` per row), so attention's bits depend on neither the model's group size
/// nor the context's length modulo a tile. The elements between rows are NaN, and the slice
/// ends where the last row does, so a kernel that reads outside its rows fails (NaN) or
/// panics.
type AxpyFn = fn(&mut [f32], f32, &[f16]);

/// The SIMD paths of both architectures, whose attention must give the same bits as each other
/// (so that greedy decoding agrees between an x86 host and an ARM device): their scores follow
/// [`score_in_lane_order`], their mix [`mix_step_fused`].
fn same_attention_on_x86_and_arm(p: Path) -> bool {
    matches!(
        p,
        Path::Avx2 | Path::Avx512Vnni | Path::Neon | Path::Dotprod | Path::I8mm
    )
}

/// A score as x86 and ARM compute it: eight lanes, each a chain of fused multiply-adds over the
/// 8-element chunks; the lanes summed `((0 + 4) + (1 + 5)) + ((2 + 6) + (3 + 7))`; the tail
/// fused in order; then the scale.
fn score_in_lane_order(row: &[f16], q: &[f32], scale: f32) -> f32 {
    let whole = row.len() / 8 * 8;
    let mut l = [0.0f32; 8];
    for c in (0..whole).step_by(8) {
        for (i, l) in l.iter_mut().enumerate() {
            *l = row[c + i].to_f32().mul_add(q[c + i], *l);
        }
    }
    let mut sum = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
    for i in whole..row.len() {
        sum = row[i].to_f32().mul_add(q[i], sum);
    }
    sum * scale
}

/// One step of a mix as x86 and ARM compute it: `out + p·v`, fused.
fn mix_step_fused(out: &mut [f32], p: f32, v: &[f16]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o = p.mul_add(x.to_f32(), *o);
    }
}

fn check_attention_rows(p: Path, (scores_f16, mix_f16): (ScoresFn, MixFn), axpy_f16: AxpyFn) {
    let across = same_attention_on_x86_and_arm(p);
    for width in [1, 7, 8, 9, 31, 64, 65, 72, 130] {
        for gap in [0, 5] {
            let stride = width + gap;
            for n in [0, 1, 3, 17, 70] {
                let len = if n == 0 { 0 } else { (n - 1) * stride + width };
                let mut rows = f16_vec(len, (width * 31 + n + gap) as u64);
                for (i, x) in rows.iter_mut().enumerate() {
                    if i % stride >= width {
                        *x = f16::from_f32(f32::NAN);
                    }
                }
                let row = |j: usize| &rows[j * stride..j * stride + width];
                // Groups of 1..7 query heads: every tile size and a remainder after full tiles.
                for heads in [1, 2, 3, 4, 5, 7] {
                    let what = format!("{p} width={width} stride={stride} n={n} heads={heads}");
                    let q = f32_vec(heads * width, (heads * width) as u64 + 7, 1.0);
                    let mut got = vec![0.0f32; heads * n];
                    scores_f16(&rows, stride, &q, heads, 0.125, &mut got);
                    let mut want = vec![0.0f32; heads * n];
                    r::scores_f16_ref(&rows, stride, &q, heads, 0.125, &mut want);
                    for h in 0..heads {
                        let qh = &q[h * width..(h + 1) * width];
                        for j in 0..n {
                            let (g, w) = (got[h * n + j], want[h * n + j]);
                            let mut own = [0.0f32];
                            scores_f16(row(j), width, qh, 1, 0.125, &mut own);
                            assert_eq!(g.to_bits(), own[0].to_bits(), "{what}: scores[{h}][{j}]");
                            if across {
                                let lanes = score_in_lane_order(row(j), qh, 0.125);
                                assert_eq!(
                                    g.to_bits(),
                                    lanes.to_bits(),
                                    "{what}: scores[{h}][{j}] not in the x86/ARM order"
                                );
                            }
                            let abs: f32 = row(j)
                                .iter()
                                .zip(qh)
                                .map(|(a, b)| (a.to_f32() * b).abs())
                                .sum();
                            let tol = DOT_REL * width as f32 * abs * 0.125 + 1e-30;
                            assert_close(&format!("{what}: scores[{h}][{j}]"), g, w, tol);
                        }
                    }

                    let pr = f32_vec(heads * n, (heads * n) as u64 + 11, 1.0);
                    let init = f32_vec(heads * width, width as u64 + 13, 1.0);
                    let mut got = init.clone();
                    mix_f16(&rows, stride, &pr, heads, &mut got);
                    let mut own = init.clone();
                    for h in 0..heads {
                        for j in 0..n {
                            axpy_f16(&mut own[h * width..(h + 1) * width], pr[h * n + j], row(j));
                        }
                    }
                    if across {
                        let mut fused = init.clone();
                        for h in 0..heads {
                            for j in 0..n {
                                let o = &mut fused[h * width..(h + 1) * width];
                                mix_step_fused(o, pr[h * n + j], row(j));
                            }
                        }
                        for c in 0..heads * width {
                            assert_eq!(
                                got[c].to_bits(),
                                fused[c].to_bits(),
                                "{what}: mix[{c}] not the x86/ARM fused steps"
                            );
                        }
                    }
                    let mut want = init.clone();
                    r::mix_f16_ref(&rows, stride, &pr, heads, &mut want);
                    for c in 0..heads * width {
                        assert_eq!(got[c].to_bits(), own[c].to_bits(), "{what}: mix[{c}]");
                        // Paths may fuse each step (one rounding, not two): a sum of n + 1
                        // terms, bounded as a dot product's.
                        let (h, col) = (c / width, c % width);
                        let abs: f32 = init[c].abs()
                            + (0..n)
                                .map(|j| (pr[h * n + j] * row(j)[col].to_f32()).abs())
                                .sum::<f32>();
                        let tol = DOT_REL * (n + 1) as f32 * abs + 1e-30;
                        assert_close(&format!("{what}: mix[{c}]"), got[c], want[c], tol);
                    }
                }
            }
        }
    }
}

#[test]
fn every_available_path_matches_the_reference() {
    let avail = Path::available();
    eprintln!(
        "kernels_neon: arch={} cpu features=[{}] paths run=[{}]",
        std::env::consts::ARCH,
        cpu_features().join(" "),
        avail.iter().map(|p| p.name()).collect::<Vec<_>>().join(" ")
    );
    // The reference is what the others are compared with: walked, it would meet only itself
    // (`the_reference_matches_plain_f64_sums` holds it to something else).
    let fast: Vec<Path> = avail
        .into_iter()
        .filter(|&p| p != Path::Reference)
        .collect();
    assert!(
        fast.contains(&Path::Portable),
        "portable runs anywhere, so the walk always compares a path: {fast:?}"
    );
    for p in fast {
        let k = Kernels::for_path(p).expect("available path has a table");
        assert_eq!(k.path, p, "table of {p} says it is {}", k.path);
        check_kernels(k);
        eprintln!("kernels_neon: path {p} matches the reference");
    }
}

/// CI sets `EDGELLM_EXPECT_PATHS` per qemu CPU (e.g. `neon,dotprod` for cortex-a76) so that a
/// CPU model that silently lost a feature cannot turn the ARM paths' tests into no-ops.
#[test]
fn expected_paths_are_detected_on_this_cpu() {
    // Unset (a developer's run): at least the path dispatch picks must really be there.
    let expect = std::env::var("EDGELLM_EXPECT_PATHS").unwrap_or_else(|_| {
        eprintln!(
            "kernels_neon: EDGELLM_EXPECT_PATHS not set; checking the best path here, {}",
            Path::best()
        );
        Path::best().to_string()
    });
    for name in expect.split(',').filter(|s| !s.is_empty()) {
        let p = Path::parse(name).expect("EDGELLM_EXPECT_PATHS names a known path");
        assert!(
            p.is_available(),
            "path {p} expected on this CPU but missing {:?}",
            p.missing_feature()
        );
    }
    if let Ok(not) = std::env::var("EDGELLM_EXPECT_NOT_PATHS") {
        for name in not.split(',').filter(|s| !s.is_empty()) {
            let p = Path::parse(name).expect("EDGELLM_EXPECT_NOT_PATHS names a known path");
            assert!(
                !p.is_available(),
                "path {p} should not be available on this CPU"
            );
        }
    }
}

#[test]
fn forcing_an_unknown_or_unavailable_path_is_a_clear_error() {
    let e = Path::parse("sse9").unwrap_err();
    assert!(e.to_string().contains("unknown kernel path 'sse9'"), "{e}");
    let foreign = if cfg!(target_arch = "aarch64") {
        Path::Avx2
    } else {
        Path::Neon
    };
    let e = Kernels::for_path(foreign).unwrap_err();
    assert!(e.to_string().contains("needs CPU feature"), "{e}");
    assert_eq!(
        Kernels::for_path(Path::Reference).unwrap().path,
        Path::Reference
    );
    assert_eq!(REFERENCE.path, Path::Reference);
}

/// A CPU's best path runs the slower paths of its own family and the portable ones, never a
/// faster one or another architecture's.
#[test]
fn a_path_includes_the_slower_paths_of_its_family() {
    use kernels_neon::Path::*;
    assert!(I8mm.includes(Neon) && I8mm.includes(Dotprod) && I8mm.includes(I8mm));
    assert!(Avx512Vnni.includes(Avx2) && Avx2.includes(Portable) && Neon.includes(Reference));
    assert!(!Neon.includes(Dotprod) && !Avx2.includes(Avx512Vnni));
    assert!(!Avx512Vnni.includes(Neon) && !I8mm.includes(Avx2) && !Portable.includes(Neon));
}
