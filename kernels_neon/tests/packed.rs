//! The packed layouts (`BlockQ4_0x8`, …): packing only moves bits, the packed reference is
//! the row reference bit for bit, and every path's packed products give that same path's
//! unpacked products' bits, so packing weights at load changes no answer.

mod common;

use common::*;
use kernels_neon::reference as r;
use kernels_neon::*;

/// `(rows, blocks per row, tokens)`: single groups, SmolLM2's shapes, a row longer than the
/// kernels' scratch of activation scalars (2048 blocks), and more tokens than one chunk of
/// scalars holds.
const SHAPES: [(usize, usize, usize); 12] = [
    (8, 1, 1),
    (8, 2, 2),
    (16, 3, 3),
    (24, 7, 5),
    (40, 18, 1),
    (64, 33, 4),
    (8, 48, 9),
    (576, 18, 1),
    (1536, 18, 2),
    (576, 48, 7),
    (8, 2100, 2),
    (16, 48, 45),
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

fn roundtrip<P: PackedFormat>()
where
    P::Row: PartialEq + std::fmt::Debug,
{
    for (rows, nb, _) in SHAPES {
        let w: Vec<P::Row> = quant(&awkward(rows * nb * 32, (rows + nb) as u64));
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
fn packing_moves_bits_and_unpacking_gives_them_back() {
    roundtrip::<BlockQ4_0x8>();
    roundtrip::<BlockQ4_1x8>();
    roundtrip::<BlockQ8_0x8>();
    roundtrip::<BlockQ5_0x8>();
    // The documented interleave, on one block: row k's qs[4c + i] at qs[32c + 4k + i].
    let rows: [BlockQ4_0; 8] = std::array::from_fn(|k| BlockQ4_0 {
        d: f16::from_f32(k as f32),
        qs: std::array::from_fn(|i| (16 * k + i) as u8),
    });
    let p = BlockQ4_0x8::pack(std::array::from_fn(|k| &rows[k]));
    assert_eq!(p.qs[32 + 4 * 3 + 2], rows[3].qs[4 + 2]);
    assert_eq!(p.qs[96 + 4 * 7 + 3], rows[7].qs[12 + 3]);
    assert_eq!(p.d[5], rows[5].d);
    // Q5_0's fifth bits by granule byte: bit c of qh[4k + i] is row k's bit 4c + i, bit 4 + c
    // its bit 16 + 4c + i.
    let rows: [BlockQ5_0; 8] = std::array::from_fn(|k| BlockQ5_0 {
        d: f16::from_f32(k as f32),
        qh: (1u32 << (4 * 2 + 1) | 1 << (16 + 4 * 3 + k % 4)).to_le_bytes(),
        qs: [0; 16],
    });
    let p = BlockQ5_0x8::pack(std::array::from_fn(|k| &rows[k]));
    for k in 0..8 {
        for i in 0..4 {
            let want = u8::from(i == 1) << 2 | u8::from(i == k % 4) << 7;
            assert_eq!(p.qh[4 * k + i], want, "row {k} byte {i}");
        }
    }
}

fn reference_is_the_row_reference<P: PackedFormat>() {
    for (rows, nb, n_tok) in SHAPES {
        let w: Vec<P::Row> = quant(&awkward(rows * nb * 32, (rows * 5 + nb) as u64));
        let a: Vec<<P::Row as BlockFormat>::Activation> =
            quant(&f32_vec(n_tok * nb * 32, (n_tok + nb) as u64, 1.0));
        let p = packed::<P>(&w, nb);
        let (mut want, mut got) = (vec![0.0; rows * n_tok], vec![f32::NAN; rows * n_tok]);
        r::matmul_ref(&w, &a, n_tok, &mut want);
        r::matmul_packed_ref(&p, &a, n_tok, &mut got);
        same_bits(
            &format!("{} ref {rows}x{nb}x{n_tok}", P::Row::NAME),
            &got,
            &want,
        );
        if n_tok == 1 {
            r::matvec_packed_ref(&p, &a, &mut got);
            same_bits(
                &format!("{} matvec ref {rows}x{nb}", P::Row::NAME),
                &got,
                &want,
            );
        }
    }
}

#[test]
fn the_packed_reference_gives_the_row_reference_bits() {
    reference_is_the_row_reference::<BlockQ4_0x8>();
    reference_is_the_row_reference::<BlockQ4_1x8>();
    reference_is_the_row_reference::<BlockQ8_0x8>();
    reference_is_the_row_reference::<BlockQ5_0x8>();
}

/// A path's packed product against its own unpacked product on `w` and `a`.
fn check_same<P: PackedWeightFormat<Table = PackedKernels>>(
    k: &Kernels,
    pk: &PackedKernels,
    w: &[P::Row],
    a: &[<P::Row as BlockFormat>::Activation],
    (rows, nb, n_tok): (usize, usize, usize),
) where
    P::Row: WeightFormat,
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
}

fn packed_equals_unpacked<P: PackedWeightFormat<Table = PackedKernels>>(
    k: &Kernels,
    pk: &PackedKernels,
) where
    P::Row: WeightFormat,
{
    for (rows, nb, n_tok) in SHAPES {
        let w: Vec<P::Row> = quant(&awkward(rows * nb * 32, (rows * 7 + nb) as u64));
        let a = quant(&f32_vec(n_tok * nb * 32, (n_tok * 3 + nb) as u64, 1.0));
        check_same::<P>(k, pk, &w, &a, (rows, nb, n_tok));
    }
}

/// Extreme integer values (every nibble 0 or 15, Q5_0's fifth bits all, none or mixed,
/// weights ±127/-128, activations ±127) with unit scales: the packed integer sums must be exact
/// where the unpacked ones are.
fn extremes(k: &Kernels, pk: &PackedKernels) {
    let one = f16::ONE;
    let acts: [[i8; 32]; 3] = [
        [-127; 32],
        [127; 32],
        std::array::from_fn(|i| if i % 2 == 0 { -127 } else { 127 }),
    ];
    let shape = (16, 2, 3);
    for qs in acts {
        let a0 = vec![BlockQ8_0 { d: one, qs }; 6];
        let a1 = vec![BlockQ8_1 { d: one, s: one, qs }; 6];
        for nib in [0x00u8, 0xff, 0x0f, 0xf0, 0x8f] {
            let w0 = vec![
                BlockQ4_0 {
                    d: one,
                    qs: [nib; 16]
                };
                32
            ];
            check_same::<BlockQ4_0x8>(k, pk, &w0, &a0, shape);
            let w1 = vec![
                BlockQ4_1 {
                    d: one,
                    m: one,
                    qs: [nib; 16]
                };
                32
            ];
            check_same::<BlockQ4_1x8>(k, pk, &w1, &a1, shape);
            for qh in [[0u8; 4], [0xff; 4], [0x0f, 0xf0, 0x55, 0xaa]] {
                let w5 = vec![
                    BlockQ5_0 {
                        d: one,
                        qh,
                        qs: [nib; 16]
                    };
                    32
                ];
                check_same::<BlockQ5_0x8>(k, pk, &w5, &a0, shape);
            }
        }
        for wq in [[127i8; 32], [-128; 32]] {
            let w8 = vec![BlockQ8_0 { d: one, qs: wq }; 32];
            check_same::<BlockQ8_0x8>(k, pk, &w8, &a0, shape);
        }
    }
}

#[test]
fn every_path_with_packed_products_gives_its_unpacked_bits() {
    let mut checked = Vec::new();
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        let Some(pk) = k.packed else { continue };
        packed_equals_unpacked::<BlockQ4_0x8>(k, &pk);
        packed_equals_unpacked::<BlockQ4_1x8>(k, &pk);
        packed_equals_unpacked::<BlockQ8_0x8>(k, &pk);
        packed_equals_unpacked::<BlockQ5_0x8>(k, &pk);
        extremes(k, &pk);
        checked.push(p.name());
    }
    eprintln!(
        "kernels_neon: packed products checked on [{}]",
        checked.join(" ")
    );
    // On a CPU with the features, the paths that pack must have been among them.
    for p in [Path::Avx512Vnni, Path::Dotprod, Path::I8mm] {
        if p.is_available() {
            assert!(checked.contains(&p.name()), "{p} has no packed products");
        }
    }
}

#[test]
#[should_panic(expected = "groups of 8 rows")]
fn a_row_count_that_is_not_whole_groups_is_refused() {
    let pk = kernels_neon::dispatch::PACKED_REFERENCE;
    let w = vec![BlockQ4_0x8::default(); 2];
    let a = vec![BlockQ8_0::default(); 2];
    let mut out = vec![0.0; 12];
    (pk.matvec_q4_0x8_q8_0)(&w, &a, &mut out);
}
