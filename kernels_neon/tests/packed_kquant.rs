//! The packed K-quant layouts (`BlockQ4Kx8`, `BlockQ5Kx8`, `BlockQ6Kx8`): packing only moves
//! bytes, the packed reference is the row reference bit for bit, and every path's packed
//! products give that same path's unpacked K-quant products' bits, which are the one `kseq`
//! sequence on every path (`kquant_sequence.rs`): packing a Q4_K_M model's weights at load
//! changes no answer, on x86 or aarch64, at any thread count.

mod common;

use common::*;
use kernels_neon::dispatch::{PACKED_K_REFERENCE, PackedKQuants};
use kernels_neon::reference as r;
use kernels_neon::*;

/// `(rows, blocks of 256 per row, tokens)`: single groups, every tile width and its tails,
/// and the 1.5B model's widths (1536 and 8960 columns).
const SHAPES: [(usize, usize, usize); 10] = [
    (8, 1, 1),
    (8, 2, 2),
    (16, 3, 3),
    (24, 2, 5),
    (40, 1, 4),
    (64, 6, 1),
    (8, 35, 1),
    (16, 6, 9),
    (256, 6, 1),
    (8, 35, 6),
];

fn packed<P: PackedFormat>(w: &[P::Row], nb: usize) -> Vec<P> {
    let mut p = vec![P::default(); w.len() / PACK_ROWS];
    pack_matrix(w, nb, &mut p);
    p
}

fn same_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{what} at {i}: {g} vs {w}");
    }
}

fn weights<W: BlockFormat>(rows: usize, nb: usize, seed: u64) -> Vec<W> {
    quant(&awkward(rows * nb * W::BLOCK_LEN, seed))
}

fn acts(n_tok: usize, nb: usize, seed: u64) -> Vec<BlockQ8K> {
    quant(&f32_vec(n_tok * nb * QK_K, seed, 1.0))
}

fn roundtrip<P: PackedFormat>()
where
    P::Row: PartialEq + std::fmt::Debug,
{
    for (rows, nb, _) in SHAPES {
        let w: Vec<P::Row> = weights(rows, nb, (rows + nb) as u64);
        let p = packed::<P>(&w, nb);
        for r in 0..rows {
            for b in 0..nb {
                let got = p[(r / PACK_ROWS) * nb + b].unpack(r % PACK_ROWS);
                assert_eq!(got, w[r * nb + b], "{} row {r} block {b}", P::Row::NAME);
            }
        }
    }
}

#[test]
fn packing_k_quants_moves_bytes_and_unpacking_gives_them_back() {
    roundtrip::<BlockQ4Kx8>();
    roundtrip::<BlockQ5Kx8>();
    roundtrip::<BlockQ6Kx8>();
    // The documented interleave: row k's scales[4c + i] at scales[32c + 4k + i].
    let rows: [BlockQ4K; 8] = std::array::from_fn(|k| BlockQ4K {
        d: f16::from_f32(k as f32),
        dmin: f16::from_f32(-(k as f32)),
        scales: std::array::from_fn(|i| (12 * k + i) as u8),
        qs: std::array::from_fn(|i| (k + i) as u8),
    });
    let p = BlockQ4Kx8::pack(std::array::from_fn(|k| &rows[k]));
    assert_eq!(p.scales[64 + 4 * 5 + 3], rows[5].scales[8 + 3]);
    assert_eq!(p.qs[32 * 31 + 4 * 7 + 1], rows[7].qs[124 + 1]);
    assert_eq!((p.d[6], p.dmin[6]), (rows[6].d, rows[6].dmin));
}

fn reference_is_the_row_reference<P: PackedFormat<Row: BlockFormat<Activation = BlockQ8K>>>() {
    for (rows, nb, n_tok) in SHAPES {
        let w: Vec<P::Row> = weights(rows, nb, (rows * 5 + nb) as u64);
        let a = acts(n_tok, nb, (n_tok + nb) as u64);
        let p = packed::<P>(&w, nb);
        let (mut want, mut got) = (vec![0.0; rows * n_tok], vec![f32::NAN; rows * n_tok]);
        r::matmul_ref(&w, &a, n_tok, &mut want);
        r::matmul_packed_ref(&p, &a, n_tok, &mut got);
        let what = format!("{} ref {rows}x{nb}x{n_tok}", P::Row::NAME);
        same_bits(&what, &got, &want);
    }
}

#[test]
fn the_packed_k_quant_reference_gives_the_row_reference_bits() {
    reference_is_the_row_reference::<BlockQ4Kx8>();
    reference_is_the_row_reference::<BlockQ5Kx8>();
    reference_is_the_row_reference::<BlockQ6Kx8>();
}

/// A path's packed product against its own unpacked product on `w` and `a`.
fn check_same<P>(
    k: &Kernels,
    pk: &PackedKQuants,
    w: &[P::Row],
    a: &[BlockQ8K],
    (rows, nb, n_tok): (usize, usize, usize),
) where
    P: PackedWeightFormat<Table = PackedKQuants, Row: WeightFormat<Activation = BlockQ8K>>,
{
    let p = packed::<P>(w, nb);
    let what = format!("{} {} {rows}x{nb}x{n_tok}", k.path, P::Row::NAME);
    let (mut want, mut got) = (vec![f32::NAN; rows * n_tok], vec![f32::NAN; rows * n_tok]);
    if n_tok == 1 {
        <P::Row as WeightFormat>::matvec(k)(w, a, &mut want);
        P::matvec(pk)(&p, a, &mut got);
        same_bits(&format!("{what} matvec"), &got, &want);
    }
    <P::Row as WeightFormat>::matmul(k)(w, a, n_tok, &mut want);
    got.fill(f32::NAN);
    P::matmul(pk)(&p, a, n_tok, &mut got);
    same_bits(&format!("{what} matmul"), &got, &want);
    // Rows split into whole groups (as the engine's threads take them) give the same bits.
    if rows > PACK_ROWS {
        let split = rows / PACK_ROWS / 2 * PACK_ROWS;
        let mut parts = vec![f32::NAN; rows * n_tok];
        let (o1, o2) = parts.split_at_mut(split * n_tok);
        P::matmul(pk)(&p[..split / PACK_ROWS * nb], a, n_tok, o1);
        P::matmul(pk)(&p[split / PACK_ROWS * nb..], a, n_tok, o2);
        same_bits(&format!("{what} split at row {split}"), &parts, &want);
    }
}

fn packed_equals_unpacked<P>(k: &Kernels, pk: &PackedKQuants)
where
    P: PackedWeightFormat<Table = PackedKQuants, Row: WeightFormat<Activation = BlockQ8K>>,
{
    for (rows, nb, n_tok) in SHAPES {
        let w: Vec<P::Row> = weights(rows, nb, (rows * 7 + nb) as u64);
        let a = acts(n_tok, nb, (n_tok * 3 + nb) as u64);
        check_same::<P>(k, pk, &w, &a, (rows, nb, n_tok));
    }
}

/// A Q8_K block of `qs` with its true 16-value sums.
fn act_block(qs: [i8; 256]) -> BlockQ8K {
    let bsums = std::array::from_fn(|i| qs[16 * i..16 * i + 16].iter().map(|&v| v as i16).sum());
    BlockQ8K { d: 1.0, qs, bsums }
}

/// Extreme integers with unit scales: every level at its top (or zero), the largest scales
/// and mins (Q6_K's ±128), activations at -128 and 127. The packed sums must be exact where
/// the unpacked ones are, however many products share an i16 lane before they are scaled.
fn extremes(k: &Kernels, pk: &PackedKQuants) {
    let one = f16::ONE;
    let a: Vec<BlockQ8K> = [
        [-128i8; 256],
        [127; 256],
        std::array::from_fn(|i| if i % 2 == 0 { -128 } else { 127 }),
    ]
    .map(act_block)
    .into_iter()
    .flat_map(|b| [b, b])
    .collect();
    let shape = (16, 2, 3);
    for (nib, sc) in [(0xffu8, 0xffu8), (0x00, 0xff), (0xf0, 0x3f), (0xff, 0x80)] {
        let w4 = vec![
            BlockQ4K {
                d: one,
                dmin: one,
                scales: [sc; 12],
                qs: [nib; 128],
            };
            32
        ];
        check_same::<BlockQ4Kx8>(k, pk, &w4, &a, shape);
        let w5 = vec![
            BlockQ5K {
                d: one,
                dmin: one,
                scales: [sc; 12],
                qh: [nib; 32],
                qs: [nib; 128],
            };
            32
        ];
        check_same::<BlockQ5Kx8>(k, pk, &w5, &a, shape);
    }
    for (bits, sc) in [(0xffu8, -128i8), (0xff, 127), (0x00, -128), (0xaa, 1)] {
        let w6 = vec![
            BlockQ6K {
                ql: [bits; 128],
                qh: [bits; 64],
                scales: [sc; 16],
                d: one,
            };
            32
        ];
        check_same::<BlockQ6Kx8>(k, pk, &w6, &a, shape);
    }
}

#[test]
fn every_path_with_packed_k_quant_products_gives_its_unpacked_bits() {
    let mut checked = Vec::new();
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        let Some(pk) = k.packed_k else { continue };
        packed_equals_unpacked::<BlockQ4Kx8>(k, &pk);
        packed_equals_unpacked::<BlockQ5Kx8>(k, &pk);
        packed_equals_unpacked::<BlockQ6Kx8>(k, &pk);
        extremes(k, &pk);
        checked.push(p.name());
    }
    eprintln!(
        "kernels_neon: packed K-quant products checked on [{}]",
        checked.join(" ")
    );
    // Every fast path packs K-quants.
    for p in Path::available() {
        if p != Path::Reference {
            assert!(
                checked.contains(&p.name()),
                "{p} has no packed K-quant products"
            );
        }
    }
}

#[test]
#[should_panic(expected = "groups of 8 rows")]
fn a_k_quant_row_count_that_is_not_whole_groups_is_refused() {
    let w = vec![BlockQ6Kx8::default(); 2];
    let a = vec![BlockQ8K::default(); 2];
    let mut out = vec![0.0; 12];
    (PACKED_K_REFERENCE.matvec_q6_kx8_q8_k)(&w, &a, &mut out);
}
