//! The table for the closing note, in one command:
//!
//! ```text
//! cargo bench -p kernels_neon --bench summary --features tract-peer
//! ```
//!
//! It measures the machine's read bandwidth (sum of a 256 MiB u64 buffer: one thread, and all
//! threads; before and after the kernels, best kept) and every available path's matvec at
//! SmolLM2-135M's shapes (and the K-quants, file layout and packed, at Qwen2.5-Coder-1.5B's),
//! hot (the same matrix every call: the 0.5 MB shapes sit in L2) and
//! cold (cycling through 128 MiB of copies, so the weights come from DRAM as in a decode
//! step), and prints a Markdown table: kernel, path, shape, µs per call, GB/s of weights
//! streamed (1 GB = 1e9 B), % of the one-thread read bandwidth (our kernels run on one
//! thread) and the ratio to tract-linalg's Q4_0 matvec on the same weights and cache state
//! (with `--features tract-peer`).
//!
//! Each figure is the best of 7 rounds of ~30 ms (std::time), the same statistic as the
//! bandwidth probe, so the ratios compare like with like; absolute numbers on a shared VM
//! are noisy, ratios measured in the same run less so. Run without `--bench` (e.g. by
//! `cargo test --benches`) it only smoke-tests itself with tiny rounds.

mod common;

use common::*;
use kernels_neon::*;
use std::hint::black_box;
use std::time::Duration;

struct Row {
    kernel: &'static str,
    path: String,
    shape: (usize, usize),
    cold: bool,
    bytes: usize,
    secs: f64,
}

impl Row {
    fn gbps(&self) -> f64 {
        self.bytes as f64 / self.secs / 1e9
    }
}

struct Timing {
    rounds: usize,
    round: Duration,
    cold_total: usize,
}

impl Timing {
    fn time(&self, f: impl FnMut()) -> f64 {
        time_per_call(f, self.rounds, self.round)
    }
}

/// A peer that adds its rows for a shape: `(weights, f32 activations, timing, table)`.
type Peer<W> = fn(&[W], &[f32], &Timing, &mut Vec<Row>);

/// SmolLM2-135M's matvec shapes (rows, cols).
const SMOL_SHAPES: [(usize, usize); 3] = [
    (MATVEC_SHAPES[0].0, MATVEC_SHAPES[0].1),
    (MATVEC_SHAPES[1].0, MATVEC_SHAPES[1].1),
    (MATVEC_SHAPES[2].0, MATVEC_SHAPES[2].1),
];

/// Qwen2.5-Coder-1.5B's K-quant matvec shapes (rows, cols): ffn gate/up, ffn down, attention
/// q and output, attention k and v.
const K_SHAPES: [(usize, usize); 4] = [(8960, 1536), (1536, 8960), (1536, 1536), (256, 1536)];

/// Prompt tokens per matrix-matrix product (the engine's default chunk).
const MATMUL_TOKENS: usize = 64;

/// A prompt-processing row: multiply-accumulates per second of one matrix-matrix product of
/// `MATMUL_TOKENS` tokens (hot weights: the tile's compute rate, not the memory's).
struct MmRow {
    kernel: &'static str,
    path: String,
    shape: (usize, usize),
    secs: f64,
}

/// Every path's matrix-matrix product of `W` (file layout) and, with `P`, of the same weights
/// packed.
fn matmul_rows<W: WeightFormat, P: PackedWeightFormat<Row = W>>(
    kernel: &'static str,
    packed: bool,
    (rows, cols): (usize, usize),
    t: &Timing,
    rows_out: &mut Vec<MmRow>,
) {
    let w: Vec<W> = weight_matrix(rows, cols, 300);
    let nb = cols / W::BLOCK_LEN;
    let x = f32_vec(cols * MATMUL_TOKENS, 400, 1.0);
    let a: Vec<W::Activation> = x.chunks(cols).flat_map(quant::<W::Activation>).collect();
    let mut out = vec![0.0f32; rows * MATMUL_TOKENS];
    let mut pw = vec![P::default(); w.len() / PACK_ROWS];
    pack_matrix(&w, nb, &mut pw);
    for p in Path::available() {
        let k = Kernels::for_path(p).unwrap();
        if p == Path::Reference {
            continue;
        }
        let (secs, path) = if packed {
            let Some(pk) = P::table(k) else { continue };
            let mm = P::matmul(pk);
            (
                t.time(|| {
                    mm(
                        black_box(&pw),
                        black_box(&a),
                        MATMUL_TOKENS,
                        black_box(&mut out),
                    )
                }),
                format!("{} packed", k.name()),
            )
        } else {
            let mm = W::matmul(k);
            (
                t.time(|| {
                    mm(
                        black_box(&w),
                        black_box(&a),
                        MATMUL_TOKENS,
                        black_box(&mut out),
                    )
                }),
                k.name().to_string(),
            )
        };
        rows_out.push(MmRow {
            kernel,
            path,
            shape: (rows, cols),
            secs,
        });
    }
}

/// The packed layout's rows: every path with packed products of `P`, on the same weights
/// packed.
fn packed_rows<P: PackedWeightFormat>(
    kernel: &'static str,
    shapes: &[(usize, usize)],
    t: &Timing,
    rows_out: &mut Vec<Row>,
) where
    P::Row: WeightFormat,
{
    let paths: Vec<(&Kernels, &P::Table)> = Path::available()
        .into_iter()
        .filter_map(|p| {
            let k = Kernels::for_path(p).unwrap();
            P::table(k).map(|pk| (k, pk))
        })
        .collect();
    if paths.is_empty() {
        return;
    }
    for (s, &(rows, cols)) in shapes.iter().enumerate() {
        let w: Vec<P::Row> = weight_matrix(rows, cols, 100 + s as u64);
        let nb = cols / P::Row::BLOCK_LEN;
        let mut pw = vec![P::default(); w.len() / PACK_ROWS];
        pack_matrix(&w, nb, &mut pw);
        let x = f32_vec(cols, 200 + s as u64, 1.0);
        let a: Vec<<P::Row as BlockFormat>::Activation> = quant(&x);
        let mut out = vec![0.0f32; rows];
        let bytes = bytes_of(&pw);
        let mut cold = ColdSet::with_total(&pw, t.cold_total);
        for (k, pk) in &paths {
            let mv = P::matvec(pk);
            let hot = t.time(|| mv(black_box(&pw), black_box(&a), black_box(&mut out)));
            let cold_s = t.time(|| mv(black_box(cold.next()), black_box(&a), black_box(&mut out)));
            for (is_cold, secs) in [(false, hot), (true, cold_s)] {
                rows_out.push(Row {
                    kernel,
                    path: format!("{} packed", k.name()),
                    shape: (rows, cols),
                    cold: is_cold,
                    bytes,
                    secs,
                });
            }
        }
    }
}

fn matvec_rows<W: WeightFormat>(
    kernel: &'static str,
    shapes: &[(usize, usize)],
    peer: Option<Peer<W>>,
    t: &Timing,
    rows_out: &mut Vec<Row>,
) {
    let paths: Vec<&Kernels> = Path::available()
        .into_iter()
        .map(|p| Kernels::for_path(p).unwrap())
        .collect();
    for (s, &(rows, cols)) in shapes.iter().enumerate() {
        let w: Vec<W> = weight_matrix(rows, cols, 100 + s as u64);
        let x = f32_vec(cols, 200 + s as u64, 1.0);
        let a: Vec<W::Activation> = quant(&x);
        let mut out = vec![0.0f32; rows];
        let bytes = bytes_of(&w);
        let mut cold = ColdSet::with_total(&w, t.cold_total);
        for k in &paths {
            let mv = W::matvec(k);
            let hot = t.time(|| mv(black_box(&w), black_box(&a), black_box(&mut out)));
            let cold_s = t.time(|| mv(black_box(cold.next()), black_box(&a), black_box(&mut out)));
            for (is_cold, secs) in [(false, hot), (true, cold_s)] {
                rows_out.push(Row {
                    kernel,
                    path: k.name().to_string(),
                    shape: (rows, cols),
                    cold: is_cold,
                    bytes,
                    secs,
                });
            }
        }
        drop(cold);
        if let Some(peer) = peer {
            peer(&w, &x, t, rows_out);
        }
    }
}

#[cfg(feature = "tract-peer")]
fn tract_rows(w: &[BlockQ4_0], x: &[f32], t: &Timing, rows_out: &mut Vec<Row>) {
    use common::tract_peer::TractQ40;
    let rows = w.len() * 32 / x.len();
    let copies = copies_for(bytes_of(w), t.cold_total);
    let mut peer = TractQ40::new(w, rows, x, copies).expect("tract peer");

    // Outside the timed loops: tract against the exact product (tight, both f32 activations),
    // ours against tract (loose: ours quantizes activations to Q8_0, ~0.6% on random data).
    peer.run(0);
    let exact = matvec_exact(w, x);
    let e_tract = rel_l2(peer.output(), &exact);
    assert!(
        e_tract < 1e-4,
        "tract's Q4_0 matvec is off the exact product by {e_tract:.2e}"
    );
    let best = Kernels::for_path(Path::best()).unwrap();
    let mut ours = vec![0.0; rows];
    (best.matvec_q4_0_q8_0)(w, &quant::<BlockQ8_0>(x), &mut ours);
    let e_ours = rel_l2(&ours, peer.output());
    assert!(
        e_ours < 0.03,
        "ours ({}) and tract's Q4_0 matvec differ by {e_ours:.2e}",
        best.name()
    );
    eprintln!(
        "tract {rows}x{}: {}; rel. L2 error vs exact {e_tract:.1e}, ours ({}) vs tract {e_ours:.1e}",
        x.len(),
        peer.choice.describe(),
        best.name()
    );

    let bytes = bytes_of(w);
    assert_eq!(
        peer.packed_bytes, bytes,
        "tract's packed Q4_0 should be the same bytes"
    );
    let hot = t.time(|| peer.run(0));
    let mut i = 0;
    let cold = t.time(|| {
        i = if i + 1 == copies { 0 } else { i + 1 };
        peer.run(i)
    });
    for (is_cold, secs) in [(false, hot), (true, cold)] {
        rows_out.push(Row {
            kernel: "matvec_q4_0_q8_0",
            path: "tract".into(),
            shape: (rows, x.len()),
            cold: is_cold,
            bytes,
            secs,
        });
    }
}

/// tract-linalg's Q4_0 matvec, where the `tract-peer` feature brings it.
fn q4_0_peer() -> Option<Peer<BlockQ4_0>> {
    #[cfg(feature = "tract-peer")]
    return Some(tract_rows);
    #[cfg(not(feature = "tract-peer"))]
    None
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let t = if full {
        Timing {
            rounds: 7,
            round: Duration::from_millis(30),
            cold_total: cold_bytes(),
        }
    } else {
        Timing {
            rounds: 1,
            round: Duration::ZERO,
            cold_total: 4 << 20,
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let membw_len = if full { MEMBW_BYTES } else { 16 << 20 };
    let passes = if full { 7 } else { 1 };
    // Probed before and after the kernels, best kept: on a shared machine one probe can land
    // in a burst of someone else's traffic and make every % column look better than it is.
    let probe = || {
        let buf = membw_buffer(membw_len);
        (
            measure_read_bandwidth(&buf, 1, passes),
            measure_read_bandwidth(&buf, threads, passes),
        )
    };
    let (bw1_before, bwn_before) = probe();

    let mut rows = Vec::new();
    let smol = &SMOL_SHAPES[..];
    matvec_rows::<BlockQ4_0>("matvec_q4_0_q8_0", smol, q4_0_peer(), &t, &mut rows);
    matvec_rows::<BlockQ4_1>("matvec_q4_1_q8_1", smol, None, &t, &mut rows);
    matvec_rows::<BlockQ8_0>("matvec_q8_0_q8_0", smol, None, &t, &mut rows);
    packed_rows::<BlockQ4_0x8>("matvec_q4_0x8_q8_0", smol, &t, &mut rows);
    packed_rows::<BlockQ4_1x8>("matvec_q4_1x8_q8_1", smol, &t, &mut rows);
    packed_rows::<BlockQ8_0x8>("matvec_q8_0x8_q8_0", smol, &t, &mut rows);
    // Q5_0: the 896-wide matrices of a Qwen2.5 0.5B Q4_K_M file (too narrow for a K-quant).
    matvec_rows::<BlockQ5_0>("matvec_q5_0_q8_0", smol, None, &t, &mut rows);
    packed_rows::<BlockQ5_0x8>("matvec_q5_0x8_q8_0", smol, &t, &mut rows);
    // The K-quants of a Q4_K_M file, at the 1.5B's shapes (a smoke run takes the smallest).
    let k_shapes = if full { &K_SHAPES[..] } else { &K_SHAPES[3..] };
    matvec_rows::<BlockQ4K>("matvec_q4_k_q8_k", k_shapes, None, &t, &mut rows);
    matvec_rows::<BlockQ6K>("matvec_q6_k_q8_k", k_shapes, None, &t, &mut rows);
    packed_rows::<BlockQ4Kx8>("matvec_q4_kx8_q8_k", k_shapes, &t, &mut rows);
    packed_rows::<BlockQ6Kx8>("matvec_q6_kx8_q8_k", k_shapes, &t, &mut rows);
    let mut mm = Vec::new();
    let mm_shape = if full { (1536, 1536) } else { (256, 1536) };
    matmul_rows::<BlockQ4_0, BlockQ4_0x8>("matmul_q4_0x8_q8_0", true, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ5_0, BlockQ5_0x8>("matmul_q5_0_q8_0", false, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ5_0, BlockQ5_0x8>("matmul_q5_0x8_q8_0", true, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ4K, BlockQ4Kx8>("matmul_q4_k_q8_k", false, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ4K, BlockQ4Kx8>("matmul_q4_kx8_q8_k", true, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ6K, BlockQ6Kx8>("matmul_q6_k_q8_k", false, mm_shape, &t, &mut mm);
    matmul_rows::<BlockQ6K, BlockQ6Kx8>("matmul_q6_kx8_q8_k", true, mm_shape, &t, &mut mm);
    let (bw1_after, bwn_after) = probe();
    let (bw1, bwn) = (bw1_before.max(bw1_after), bwn_before.max(bwn_after));

    println!();
    println!(
        "kernels_neon matvec summary — {} ({}), paths: {}{}",
        std::env::consts::ARCH,
        cpu_features().join(" "),
        Path::available()
            .iter()
            .map(|p| p.name())
            .collect::<Vec<_>>()
            .join(", "),
        if cfg!(feature = "tract-peer") {
            ", peer: tract-linalg 0.22"
        } else {
            ""
        }
    );
    println!(
        "read bandwidth (sum of {} MiB of u64, best of a probe before and after the kernels): \
         {:.1} GB/s on 1 thread ({:.1} / {:.1}), {:.1} GB/s on {threads} threads ({:.1} / {:.1}); \
         cold = cycling through {} MiB of weight copies; hot = the same matrix every call",
        membw_len >> 20,
        bw1 / 1e9,
        bw1_before / 1e9,
        bw1_after / 1e9,
        bwn / 1e9,
        bwn_before / 1e9,
        bwn_after / 1e9,
        t.cold_total >> 20
    );
    println!();
    println!(
        "| kernel | path | rows x cols | weights | cache | µs/call | GB/s | % of 1-thread BW | vs tract |"
    );
    println!("|---|---|---|---|---|---:|---:|---:|---:|");
    for r in &rows {
        let peer = rows.iter().find(|p| {
            p.path == "tract" && p.kernel == r.kernel && p.shape == r.shape && p.cold == r.cold
        });
        let vs = match peer {
            Some(p) => format!("{:.2}x", r.gbps() / p.gbps()),
            None => "—".into(),
        };
        println!(
            "| {} | {} | {}x{} | {:.2} MB | {} | {:.1} | {:.2} | {:.0}% | {} |",
            r.kernel,
            r.path,
            r.shape.0,
            r.shape.1,
            r.bytes as f64 / 1e6,
            if r.cold { "cold" } else { "hot" },
            r.secs * 1e6,
            r.gbps(),
            100.0 * r.gbps() * 1e9 / bw1,
            vs
        );
    }
    println!();
    println!(
        "| kernel | path | rows x cols x tokens | µs/call | GMAC/s |\n|---|---|---|---:|---:|"
    );
    for r in &mm {
        println!(
            "| {} | {} | {}x{}x{MATMUL_TOKENS} | {:.1} | {:.1} |",
            r.kernel,
            r.path,
            r.shape.0,
            r.shape.1,
            r.secs * 1e6,
            (r.shape.0 * r.shape.1 * MATMUL_TOKENS) as f64 / r.secs / 1e9
        );
    }
    println!();
    println!(
        "% of BW over 100 means the weights came from cache (hot rows of the small shapes); \
         \"vs tract\" is GB/s over tract's GB/s at the same shape and cache state."
    );
}
