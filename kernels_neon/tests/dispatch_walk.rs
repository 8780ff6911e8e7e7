//! Walks the dispatch table of every path this CPU can run and checks each kernel against
//! its scalar reference; the reference itself (which the walk would only compare with itself)
//! is checked against plain f64 sums over the dequantized operands. Both tables are
//! destructured without `..`, so a kernel added to `Kernels` fails to compile here until it
//! has a check.
//!
//! Tolerances (stated once, used everywhere):
//! - quantizers: byte-identical to the reference;
//! - integer parts of dot products: exact (checked through the reference on integer-valued
//!   scales, where f32 is exact);
//! - dot products / matrix products: `|fast - ref| <= DOT_REL * n_blocks * sum|terms|`, i.e. a
//!   few ulps per accumulated block, for the differently ordered f32 accumulation;
//! - f32 ops: `|fast - ref| <= OPS_REL * max(1, |ref|)`.

mod common;

use common::*;
use kernels_neon::dispatch::{MixFn, REFERENCE, ScoresFn};
use kernels_neon::reference as r;
use kernels_neon::*;

const DOT_REL: f32 = 4.0 * f32::EPSILON;
const OPS_REL: f32 = 2e-6;
const BLOCK_COUNTS: [usize; 8] = [1, 2, 3, 7, 18, 33, 48, 1536];

fn dequant<B: BlockFormat>(x: &[B]) -> Vec<f32> {
    let mut y = vec![0.0; x.len() * B::BLOCK_LEN];
    B::dequantize_row(x, &mut y);
    y
}

/// `sum |x_i y_i|` of the dequantized operands: the scale of a dot product's rounding error.
fn abs_dot<W: BlockFormat>(w: &[W], a: &[W::Activation]) -> f32 {
    let (x, y) = (dequant(w), dequant(a));
    x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum::<f32>() + 1e-30
}

/// Blocks of `W` for a case written in blocks of 32: as many values, rounded up, for the
/// superblocks of 256 (the K-quants' quantizers are slow enough to make the walk minutes).
fn blocks_of<W: BlockFormat>(nb32: usize) -> usize {
    (nb32 * 32).div_ceil(W::BLOCK_LEN)
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

fn check_matvec<W: WeightFormat>(
    path: Path,
    name: &str,
    fast: dispatch::MatVecFn<W, W::Activation>,
) {
    for (rows, nb) in matvec_shapes(W::BLOCK_LEN) {
        let nb = blocks_of::<W>(nb);
        let n = nb * W::BLOCK_LEN;
        let w: Vec<W> = quant(&awkward(rows * n, (rows * 31 + nb) as u64));
        let a: Vec<W::Activation> = quant(&f32_vec(n, nb as u64, 1.0));
        let mut want = vec![0.0; rows];
        r::matvec_ref(&w, &a, &mut want);
        let mut got = vec![f32::NAN; rows];
        fast(&w, &a, &mut got);
        for (i, row) in w.chunks_exact(nb).enumerate() {
            let tol = DOT_REL * nb as f32 * abs_dot(row, &a);
            assert_close(
                &format!("{path}/{name} {rows}x{nb} row {i}"),
                got[i],
                want[i],
                tol,
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
        matmul_q4_0x8_q8_0,
        matmul_q4_1x8_q8_1,
        matmul_q8_0x8_q8_0,
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
    check_packed::<BlockQ4_0x8>(p, "matmul_q4_0x8_q8_0", &matmul_q4_0x8_q8_0, false);
    check_packed::<BlockQ4_1x8>(p, "matmul_q4_1x8_q8_1", &matmul_q4_1x8_q8_1, false);
    check_packed::<BlockQ8_0x8>(p, "matmul_q8_0x8_q8_0", &matmul_q8_0x8_q8_0, false);
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
        let w: Vec<P::Row> = quant(&awkward(rows * nb * 32, (rows * 3 + nb) as u64));
        let mut pw = vec![P::default(); w.len() / PACK_ROWS];
        pack_matrix(&w, nb, &mut pw);
        let a: Vec<<P::Row as BlockFormat>::Activation> =
            quant(&f32_vec(n_tok * nb * 32, (n_tok + nb) as u64, 1.0));
        let mut got = vec![f32::NAN; rows * n_tok];
        fast(&pw, &a, n_tok, &mut got);
        assert_matmul_close(&format!("{path}/{name}"), &w, &a, n_tok, &got);
    }
}

const LENS: [usize; 12] = [1, 2, 3, 4, 7, 8, 15, 16, 17, 64, 576, 1539];

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
