//! Criterion benches per kernel, for every code path this CPU runs (`Path::available()`).
//!
//! ```text
//! cargo bench -p kernels_neon --bench kernels [--features tract-peer] [-- FILTER]
//! ```
//!
//! Groups (filter with a regex on `group/path/param`):
//! - `membw/*`: the machine's read bandwidth (sum of a 256 MiB u64 buffer, one thread and all
//!   threads), the ceiling for the matvecs below.
//! - `matvec_<w>_<a>/<rows>x<cols>/<path>/{hot,cold}` at SmolLM2-135M's shapes, throughput in
//!   GB/s of *weights* streamed (`Throughput::BytesDecimal`, so criterion prints GB/s = 1e9 B/s,
//!   the unit of the summary bench). `hot` calls the same matrix again and again: the two
//!   0.5 MB shapes then live in L2, and the 15.9 MB LM head in a large L3. `cold` cycles
//!   through distinct copies of the matrix adding up to 128 MiB (`EDGELLM_BENCH_COLD_MB`), so
//!   each call streams its weights from DRAM, as a decode step does. With `--features
//!   tract-peer`, `matvec_q4_0_q8_0/*/tract/*` is tract-linalg's Q4_0 x f32 product on the
//!   same weights (benches/common/tract_peer.rs).
//! - `matmul_<w>_<a>/64x<rows>x<cols>`: a 64-token prompt batch, in MAC/s (elements).
//! - `matvec_q{4,5,6}_k_q8_k/640x2048/<path>/hot` and `matmul_q{4,5,6}_k_q8_k/64x640x2048`:
//!   the K-quants at Gemma 3 270M's FFN shape, the reference included.
//! - `vec_dot_*`, `quantize_row_*`, and the f32 ops, in values/s.
//!
//! The reference path is the baseline: it is benched on the small hot matvecs and on every
//! cheap kernel, and left out of the LM head, the cold runs and the matmul, where one call
//! takes tens of milliseconds and adds minutes to the run without telling anything new.
//!
//! Defaults are short (0.5 s warm-up, 1 s measurement, 20 samples) for a shared 2-core
//! machine; criterion's flags (`--warm-up-time`, `--measurement-time`, `--sample-size`)
//! override them. For the one table of GB/s, % of bandwidth and ratio to tract, run the
//! `summary` bench.

mod common;

use common::*;
use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main,
};
use kernels_neon::*;
use std::hint::black_box;
use std::time::Duration;

fn paths() -> Vec<&'static Kernels> {
    Path::available()
        .into_iter()
        .map(|p| Kernels::for_path(p).expect("available path"))
        .collect()
}

fn membw(c: &mut Criterion) {
    let buf = membw_buffer(MEMBW_BYTES);
    let mut g = c.benchmark_group("membw");
    g.sample_size(10);
    g.throughput(Throughput::BytesDecimal(bytes_of(&buf) as u64));
    g.bench_function("read_sum_u64_256MiB/1thread", |b| {
        b.iter(|| read_sum(black_box(&buf)))
    });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads > 1 {
        let chunk = buf.len().div_ceil(threads);
        g.bench_function(format!("read_sum_u64_256MiB/{threads}threads"), |b| {
            b.iter(|| {
                std::thread::scope(|s| {
                    for part in buf.chunks(chunk) {
                        s.spawn(move || black_box(read_sum(black_box(part))));
                    }
                })
            })
        });
    }
    g.finish();
}

/// A hook that adds a peer's benches to a matvec group: `(group, weights, f32 activations)`.
type Peer<'a, W> = &'a dyn Fn(&mut BenchmarkGroup<WallTime>, &[W], &[f32]);

fn matvec<W: WeightFormat>(c: &mut Criterion, name: &str, peer: Option<Peer<W>>) {
    for (s, &(rows, cols, _)) in MATVEC_SHAPES.iter().enumerate() {
        let w: Vec<W> = weight_matrix(rows, cols, 100 + s as u64);
        let x = f32_vec(cols, 200 + s as u64, 1.0);
        let a: Vec<W::Activation> = quant(&x);
        let mut out = vec![0.0f32; rows];
        let mut g = c.benchmark_group(format!("{name}/{rows}x{cols}"));
        g.throughput(Throughput::BytesDecimal(bytes_of(&w) as u64));
        let big = bytes_of(&w) > 4 << 20;
        for k in paths() {
            if k.path == Path::Reference && big {
                continue;
            }
            let mv = W::matvec(k);
            g.bench_function(BenchmarkId::new(k.name(), "hot"), |b| {
                b.iter(|| mv(black_box(&w), black_box(&a), black_box(&mut out)))
            });
        }
        let mut cold = ColdSet::new(&w);
        for k in paths() {
            if k.path == Path::Reference {
                continue;
            }
            let mv = W::matvec(k);
            g.bench_function(BenchmarkId::new(k.name(), "cold"), |b| {
                b.iter(|| mv(black_box(cold.next()), black_box(&a), black_box(&mut out)))
            });
        }
        drop(cold);
        if let Some(peer) = peer {
            peer(&mut g, &w, &x);
        }
        g.finish();
    }
}

/// tract-linalg's Q4_0 matvec on the same weights, hot and cold, after checking once that it
/// computes what ours does.
#[cfg(feature = "tract-peer")]
fn tract_matvec(g: &mut BenchmarkGroup<WallTime>, w: &[BlockQ4_0], x: &[f32]) {
    let rows = w.len() * 32 / x.len();
    let copies = copies_for(bytes_of(w), cold_bytes());
    let mut t = common::tract_peer::TractQ40::new(w, rows, x, copies).expect("tract peer");
    check_tract(&mut t, w, x);
    g.bench_function(BenchmarkId::new("tract", "hot"), |b| b.iter(|| t.run(0)));
    let mut i = 0;
    g.bench_function(BenchmarkId::new("tract", "cold"), |b| {
        b.iter(|| {
            i = if i + 1 == copies { 0 } else { i + 1 };
            t.run(i)
        })
    });
}

/// Outside the timed loops: tract's result against the exact product (tight: both use f32
/// activations) and ours against tract's (loose: ours quantizes activations to Q8_0, about
/// 0.6% relative error on random data).
#[cfg(feature = "tract-peer")]
fn check_tract(t: &mut common::tract_peer::TractQ40, w: &[BlockQ4_0], x: &[f32]) {
    t.run(0);
    let exact = matvec_exact(w, x);
    let e = rel_l2(t.output(), &exact);
    assert!(
        e < 1e-4,
        "tract's Q4_0 matvec is off the exact product by {e:.2e}"
    );
    let k = Kernels::for_path(Path::best()).expect("best path");
    let a: Vec<BlockQ8_0> = quant(x);
    let mut ours = vec![0.0; exact.len()];
    (k.matvec_q4_0_q8_0)(w, &a, &mut ours);
    let e = rel_l2(&ours, t.output());
    assert!(
        e < 0.03,
        "ours ({}) and tract's Q4_0 matvec differ by {e:.2e}",
        k.name()
    );
}

fn matvecs(c: &mut Criterion) {
    #[cfg(feature = "tract-peer")]
    matvec::<BlockQ4_0>(c, "matvec_q4_0_q8_0", Some(&tract_matvec));
    #[cfg(not(feature = "tract-peer"))]
    matvec::<BlockQ4_0>(c, "matvec_q4_0_q8_0", None);
    matvec::<BlockQ4_1>(c, "matvec_q4_1_q8_1", None);
    matvec::<BlockQ8_0>(c, "matvec_q8_0_q8_0", None);
}

fn matmul_one<W: WeightFormat>(c: &mut Criterion, name: &str) {
    let (rows, cols) = MATMUL_SHAPE;
    let n_tok = MATMUL_TOKENS;
    let w: Vec<W> = weight_matrix(rows, cols, 300);
    let a: Vec<W::Activation> = quant(&f32_vec(cols * n_tok, 301, 1.0));
    let mut out = vec![0.0f32; rows * n_tok];
    let mut g = c.benchmark_group(format!("{name}/{n_tok}x{rows}x{cols}"));
    g.throughput(Throughput::Elements((rows * cols * n_tok) as u64));
    for k in paths() {
        if k.path == Path::Reference {
            continue;
        }
        let mm = W::matmul(k);
        g.bench_function(k.name(), |b| {
            b.iter(|| mm(black_box(&w), black_box(&a), n_tok, black_box(&mut out)))
        });
    }
    g.finish();
}

fn matmuls(c: &mut Criterion) {
    matmul_one::<BlockQ4_0>(c, "matmul_q4_0_q8_0");
    matmul_one::<BlockQ4_1>(c, "matmul_q4_1_q8_1");
    matmul_one::<BlockQ8_0>(c, "matmul_q8_0_q8_0");
}

/// The K-quant matvec (hot) and 64-token matmul at Gemma 3 270M's FFN shape (2048 → 640;
/// the K-quants' 256-value blocks do not divide SmolLM2's 576 columns), every path including
/// the reference: a path's K-quant kernel is kept only if it beats the reference.
fn kquant_one<W: WeightFormat>(c: &mut Criterion, name: &str) {
    let (rows, cols) = (640, 2048);
    let w: Vec<W> = weight_matrix(rows, cols, 500);
    let a: Vec<W::Activation> = quant(&f32_vec(cols * MATMUL_TOKENS, 501, 1.0));
    let mut out = vec![0.0f32; rows * MATMUL_TOKENS];
    let mut g = c.benchmark_group(format!("matvec_{name}/{rows}x{cols}"));
    g.throughput(Throughput::BytesDecimal(bytes_of(&w) as u64));
    let nb = cols / W::BLOCK_LEN;
    for k in paths() {
        let mv = W::matvec(k);
        g.bench_function(BenchmarkId::new(k.name(), "hot"), |b| {
            b.iter(|| {
                mv(
                    black_box(&w),
                    black_box(&a[..nb]),
                    black_box(&mut out[..rows]),
                )
            })
        });
    }
    g.finish();
    let mut g = c.benchmark_group(format!("matmul_{name}/{MATMUL_TOKENS}x{rows}x{cols}"));
    g.throughput(Throughput::Elements((rows * cols * MATMUL_TOKENS) as u64));
    for k in paths() {
        let mm = W::matmul(k);
        g.bench_function(k.name(), |b| {
            b.iter(|| {
                mm(
                    black_box(&w),
                    black_box(&a),
                    MATMUL_TOKENS,
                    black_box(&mut out),
                )
            })
        });
    }
    g.finish();
}

fn kquants(c: &mut Criterion) {
    kquant_one::<BlockQ4K>(c, "q4_k_q8_k");
    kquant_one::<BlockQ6K>(c, "q6_k_q8_k");
    kquant_one::<BlockQ5K>(c, "q5_k_q8_k");
}

fn vec_dot_one<W: WeightFormat>(c: &mut Criterion, name: &str) {
    let mut g = c.benchmark_group(name);
    for n in [576, 1536] {
        let w: Vec<W> = weight_matrix(1, n, 400 + n as u64);
        let a: Vec<W::Activation> = quant(&f32_vec(n, 401, 1.0));
        g.throughput(Throughput::Elements(n as u64));
        for k in paths() {
            let dot = W::vec_dot(k);
            g.bench_function(BenchmarkId::new(k.name(), n), |b| {
                b.iter(|| dot(black_box(&w), black_box(&a)))
            });
        }
    }
    g.finish();
}

fn vec_dots(c: &mut Criterion) {
    vec_dot_one::<BlockQ4_0>(c, "vec_dot_q4_0_q8_0");
    vec_dot_one::<BlockQ4_1>(c, "vec_dot_q4_1_q8_1");
    vec_dot_one::<BlockQ8_0>(c, "vec_dot_q8_0_q8_0");
}

fn quantizers(c: &mut Criterion) {
    for name in ["quantize_row_q8_0", "quantize_row_q8_1"] {
        let mut g = c.benchmark_group(name);
        for n in [576, 1536] {
            let x = f32_vec(n, 500 + n as u64, 1.0);
            let mut y0 = vec![BlockQ8_0::default(); n / 32];
            let mut y1 = vec![BlockQ8_1::default(); n / 32];
            g.throughput(Throughput::Elements(n as u64));
            for k in paths() {
                let id = BenchmarkId::new(k.name(), n);
                if name.ends_with("q8_0") {
                    let q = k.quantize_row_q8_0;
                    g.bench_function(id, |b| b.iter(|| q(black_box(&x), black_box(&mut y0))));
                } else {
                    let q = k.quantize_row_q8_1;
                    g.bench_function(id, |b| b.iter(|| q(black_box(&x), black_box(&mut y1))));
                }
            }
        }
        g.finish();
    }
}

fn f32_ops(c: &mut Criterion) {
    let ks = paths();
    let bench =
        |c: &mut Criterion, name: &str, n: usize, f: &dyn Fn(&mut criterion::Bencher, &Kernels)| {
            let mut g = c.benchmark_group(name);
            g.throughput(Throughput::Elements(n as u64));
            for k in &ks {
                g.bench_function(k.name(), |b| f(b, k));
            }
            g.finish();
        };

    let x = f32_vec(576, 600, 1.0);
    let nw = f32_vec(576, 601, 0.2);
    bench(c, "rms_norm/576", 576, &|b, k| {
        let mut out = vec![0.0f32; 576];
        b.iter(|| (k.rms_norm)(black_box(&x), black_box(&nw), 1e-5, black_box(&mut out)))
    });

    let logits = f32_vec(1024, 602, 3.0);
    bench(c, "softmax/1024", 1024, &|b, k| {
        b.iter_batched_ref(
            || logits.clone(),
            |v| (k.softmax)(black_box(v)),
            BatchSize::SmallInput,
        )
    });

    let gate = f32_vec(1536, 603, 1.0);
    let up = f32_vec(1536, 604, 1.0);
    bench(c, "silu_mul/1536", 1536, &|b, k| {
        let mut out = vec![0.0f32; 1536];
        b.iter(|| (k.silu_mul)(black_box(&gate), black_box(&up), black_box(&mut out)))
    });

    // SmolLM2-135M's query: 9 heads of 64, fully rotated (a (cos, sin) pair per 2 dims).
    let (heads, head_dim) = (9, 64);
    let q = f32_vec(heads * head_dim, 605, 1.0);
    let cs: Vec<f32> = (0..head_dim / 2)
        .flat_map(|i| {
            let theta = 37.0 * 100000f32.powf(-2.0 * i as f32 / head_dim as f32);
            [theta.cos(), theta.sin()]
        })
        .collect();
    for (name, pick) in [
        (
            "rope_norm/9x64",
            (|k: &Kernels| k.rope_norm) as fn(&Kernels) -> fn(&mut [f32], usize, &[f32]),
        ),
        ("rope_neox/9x64", |k: &Kernels| k.rope_neox),
    ] {
        bench(c, name, heads * head_dim, &|b, k| {
            let rope = pick(k);
            b.iter_batched_ref(
                || q.clone(),
                |v| rope(black_box(v), head_dim, black_box(&cs)),
                BatchSize::SmallInput,
            )
        });
    }

    // A group of 3 query heads (SmolLM2's) over one KV head of the f16 cache, 256 positions
    // (as the cache lays a head out: one contiguous run): their scores, and the weighted sums
    // of the values.
    let kv = f16_vec(64 * 256, 606);
    let qg = f32_vec(3 * 64, 607, 1.0);
    let p = f32_vec(3 * 256, 608, 1.0);
    bench(c, "scores_f16/3x64x256", 3 * 64 * 256, &|b, k| {
        let mut s = vec![0.0f32; 3 * 256];
        b.iter(|| (k.scores_f16)(black_box(&kv), 64, black_box(&qg), 3, 0.125, &mut s))
    });
    bench(c, "mix_f16/3x64x256", 3 * 64 * 256, &|b, k| {
        let mut acc = vec![0.0f32; 3 * 64];
        b.iter(|| (k.mix_f16)(black_box(&kv), 64, black_box(&p), 3, black_box(&mut acc)))
    });
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = config();
    targets = membw, matvecs, matmuls, kquants, vec_dots, quantizers, f32_ops
}
criterion_main!(benches);
