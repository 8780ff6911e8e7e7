//! The engine splits the rows of a matrix product across threads and needs bit-identical
//! results whatever the split. For every path this CPU can run, the matrix-vector and
//! matrix-matrix products are computed over all rows at once and over several splits into
//! ranges of rows (odd starts and lengths, so that rows fall into different tiles and tails),
//! and the results must be equal bit for bit.

mod common;

use common::*;
use kernels_neon::*;

/// Ways to cut `0..rows` into consecutive ranges (given by their ends).
fn splits(rows: usize) -> Vec<Vec<usize>> {
    let mut v = vec![
        vec![1, 5, rows],
        vec![3, rows],
        vec![2, 7, 8, rows],
        vec![rows - 1, rows],
        (1..=rows).collect(), // one row at a time
    ];
    v.retain(|s| s.windows(2).all(|w| w[0] < w[1]) && s[0] > 0);
    v
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn check_format<W: WeightFormat>(k: &Kernels) {
    let p = k.path;
    let name = W::NAME;
    for (rows, nb) in [(13, 1), (19, 3), (37, 18), (23, 33)] {
        let w: Vec<W> = quant(&awkward(rows * nb * 32, (rows * 13 + nb) as u64));

        // Matrix-vector.
        let a: Vec<W::Activation> = quant(&f32_vec(nb * 32, nb as u64 + 5, 1.0));
        let mut whole = vec![f32::NAN; rows];
        W::matvec(k)(&w, &a, &mut whole);
        for split in splits(rows) {
            let mut parts = vec![f32::NAN; rows];
            let mut start = 0;
            for &end in &split {
                W::matvec(k)(&w[start * nb..end * nb], &a, &mut parts[start..end]);
                start = end;
            }
            assert_eq!(
                bits(&parts),
                bits(&whole),
                "{p}/matvec {name} {rows}x{nb}: split {split:?} changes the bits"
            );
        }

        // Matrix-matrix, token counts around any token tile.
        for n_tok in [1, 2, 3, 5, 8] {
            let a: Vec<W::Activation> =
                quant(&f32_vec(n_tok * nb * 32, (n_tok * 7 + nb) as u64, 1.0));
            let mut whole = vec![f32::NAN; rows * n_tok];
            W::matmul(k)(&w, &a, n_tok, &mut whole);
            for split in splits(rows) {
                let mut parts = vec![f32::NAN; rows * n_tok];
                let mut start = 0;
                for &end in &split {
                    W::matmul(k)(
                        &w[start * nb..end * nb],
                        &a,
                        n_tok,
                        &mut parts[start * n_tok..end * n_tok],
                    );
                    start = end;
                }
                assert_eq!(
                    bits(&parts),
                    bits(&whole),
                    "{p}/matmul {name} {rows}x{nb}x{n_tok}: split {split:?} changes the bits"
                );
            }
        }
    }
}

#[test]
fn row_splits_give_bit_identical_products_on_every_path() {
    for p in Path::available() {
        let k = Kernels::for_path(p).expect("available path has a table");
        check_format::<BlockQ4_0>(k);
        check_format::<BlockQ4_1>(k);
        check_format::<BlockQ8_0>(k);
        eprintln!("kernels_neon: path {p} gives the same bits for every row split");
    }
}

/// On aarch64 the NEON, dotprod and i8mm products compute each (row, token) pair in the same
/// pair form (exact integer block sums, fused multiply-adds in block order), so they must agree
/// bit for bit: a device may switch paths (`EDGELLM_KERNELS`) without changing its outputs.
#[cfg(target_arch = "aarch64")]
#[test]
fn arm_paths_agree_bit_for_bit() {
    fn check<W: WeightFormat>(ks: &[&Kernels]) {
        for (rows, nb, n_tok) in [(9, 3, 5), (17, 18, 7), (6, 33, 2)] {
            let w: Vec<W> = quant(&awkward(rows * nb * 32, (rows * 3 + nb) as u64));
            let a: Vec<W::Activation> = quant(&f32_vec(n_tok * nb * 32, (n_tok + nb) as u64, 1.0));
            let run = |k: &Kernels| {
                let mut mv = vec![f32::NAN; rows];
                W::matvec(k)(&w, &a[..nb], &mut mv);
                let mut mm = vec![f32::NAN; rows * n_tok];
                W::matmul(k)(&w, &a, n_tok, &mut mm);
                let dot = W::vec_dot(k)(&w[..nb], &a[..nb]);
                (bits(&mv), bits(&mm), dot.to_bits())
            };
            let base = run(ks[0]);
            for k in &ks[1..] {
                assert!(
                    run(k) == base,
                    "{} and {} differ on {} {rows}x{nb}x{n_tok}",
                    ks[0].path,
                    k.path,
                    W::NAME
                );
            }
        }
    }
    let ks: Vec<&Kernels> = [Path::Neon, Path::Dotprod, Path::I8mm]
        .into_iter()
        .filter(|p| p.is_available())
        .map(|p| Kernels::for_path(p).unwrap())
        .collect();
    check::<BlockQ4_0>(&ks);
    check::<BlockQ4_1>(&ks);
    check::<BlockQ8_0>(&ks);
    eprintln!(
        "kernels_neon: ARM paths [{}] agree bit for bit",
        ks.iter()
            .map(|k| k.path.name())
            .collect::<Vec<_>>()
            .join(" ")
    );
}
