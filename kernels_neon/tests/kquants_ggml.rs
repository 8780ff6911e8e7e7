//! Our Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and Q8_K references against ggml itself: the files in
//! `data/kquants/` were written by ggml's own code (`data/gen_kquants.c`, which says how) from
//! the row rebuilt here, so blocks must match byte for byte, dequantized floats and dot
//! products bit for bit.

use kernels_neon::reference::*;
use kernels_neon::{BlockFormat, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8K};
use kernels_neon::{BlockQ8_0, BlockQ8_1};

const N: usize = 4096;
/// Segment starts, as `seg` in gen_kquants.c.
const SEGMENTS: [usize; 10] = [0, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840, 4096];

/// gen_kquants.c's `lcg`: the same u64 LCG, the same f32 operations.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as u32) as f32 / 16777216.0 * 2.0 - 1.0
    }
}

/// gen_kquants.c's `weights`.
fn weights() -> Vec<f32> {
    let mut r = Lcg(1);
    let mut x = vec![0.0f32; N];
    for v in &mut x[..2048] {
        let a = r.next();
        let b = r.next();
        *v = (a + b) * 0.75;
    }
    x[2304..2560].fill(0.37);
    for v in &mut x[2560..2816] {
        *v = r.next() * 0.01;
    }
    x[2560 + 77] = 50.0;
    x[2560 + 200] = -30.0;
    for v in &mut x[2816..3072] {
        *v = r.next() * 1e-20;
    }
    for v in &mut x[3072..3328] {
        *v = r.next() * 1e30;
    }
    for (i, v) in x.iter_mut().enumerate().take(3584).skip(3328) {
        let a = r.next();
        *v = if (i / 32) % 2 == 1 {
            a * 10.0
        } else {
            a * 1e-3
        };
    }
    for v in &mut x[3584..3840] {
        *v = (r.next() * 16.0) as i32 as f32 / 8.0;
    }
    for v in &mut x[3840..] {
        *v = -r.next().abs() * 3.0 + 0.1;
    }
    x
}

/// gen_kquants.c's `activations`.
fn activations() -> Vec<f32> {
    let mut r = Lcg(2);
    (0..N)
        .map(|_| {
            let a = r.next();
            let b = r.next();
            (a + b) * 2.0
        })
        .collect()
}

fn data(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/data/kquants/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn blocks<B: bytemuck::Pod>(name: &str) -> Vec<B> {
    let bytes = data(name);
    let sz = std::mem::size_of::<B>();
    assert_eq!(bytes.len() % sz, 0, "{name}: not whole blocks");
    bytes
        .chunks_exact(sz)
        .map(bytemuck::pod_read_unaligned)
        .collect()
}

fn floats(name: &str) -> Vec<f32> {
    data(name)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Bit-identical, except that any NaN equals any NaN. The huge segment makes `inf * 0` and
/// NaN scales, and the NaN an operation makes is the CPU's: x86 gives 0xffc00000 (the bits in
/// the data, from an x86 ggml), aarch64 0x7fc00000. A NaN's bits carry no meaning here;
/// that a value is NaN where ggml's is NaN does.
fn same_bits(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// Our quantizer gives ggml's bytes, our dequantizer ggml's floats.
fn check_format<B: BlockFormat>(file: &str) -> Vec<B> {
    let x = weights();
    let mut ours = vec![B::default(); N / B::BLOCK_LEN];
    B::quantize_row_ref(&x, &mut ours);
    let want = data(&format!("{file}.bin"));
    let got: &[u8] = bytemuck::cast_slice(&ours);
    assert_eq!(got.len(), want.len(), "{file}: size");
    if let Some(i) = first_diff(got, &want) {
        let bs = std::mem::size_of::<B>();
        panic!(
            "{file}: byte {i} (block {}, offset {}) is {:#04x}, ggml {:#04x}",
            i / bs,
            i % bs,
            got[i],
            want[i]
        );
    }
    // Dequantize ggml's blocks (not ours), so this checks the dequantizer on its own.
    let theirs: Vec<B> = blocks(&format!("{file}.bin"));
    let mut y = vec![0.0f32; N];
    B::dequantize_row(&theirs, &mut y);
    for (i, (&a, &b)) in y
        .iter()
        .zip(&floats(&format!("{file}.deq.bin")))
        .enumerate()
    {
        assert!(
            same_bits(a, b),
            "{file}: dequantized value {i} is {a:e}, ggml {b:e}"
        );
    }
    theirs
}

/// Our dot product of ggml's blocks gives ggml's generic result per segment and whole row.
fn check_dot<W: BlockFormat>(t: usize, w: &[W], act: &[W::Activation]) {
    let dots = floats("dots.bin");
    for s in 0..SEGMENTS.len() {
        let (b, e) = if s + 1 < SEGMENTS.len() {
            (SEGMENTS[s], SEGMENTS[s + 1])
        } else {
            (0, N)
        };
        let (b, e) = (b / W::BLOCK_LEN, e / W::BLOCK_LEN);
        let got = W::vec_dot_ref(&w[b..e], &act[b..e]);
        let want = dots[t * SEGMENTS.len() + s];
        assert!(
            same_bits(got, want),
            "{}: dot of segment {s} is {got:e}, ggml {want:e}",
            W::NAME
        );
    }
}

#[test]
fn activations_match_ggml() {
    let a = activations();
    let mut q80 = vec![BlockQ8_0::default(); N / 32];
    quantize_row_q8_0_ref(&a, &mut q80);
    assert_eq!(bytemuck::cast_slice::<_, u8>(&q80), data("act_q8_0.bin"));
    let mut q81 = vec![BlockQ8_1::default(); N / 32];
    quantize_row_q8_1_ref(&a, &mut q81);
    assert_eq!(bytemuck::cast_slice::<_, u8>(&q81), data("act_q8_1.bin"));
    let mut q8k = vec![BlockQ8K::default(); N / 256];
    quantize_row_q8_k_ref(&a, &mut q8k);
    assert_eq!(bytemuck::cast_slice::<_, u8>(&q8k), data("act_q8_k.bin"));
}

#[test]
fn q8_k_matches_ggml() {
    check_format::<BlockQ8K>("q8_k");
}

#[test]
fn q5_0_matches_ggml() {
    let w = check_format::<BlockQ5_0>("q5_0");
    check_dot(0, &w, &blocks::<BlockQ8_0>("act_q8_0.bin"));
}

#[test]
fn q5_1_matches_ggml() {
    let w = check_format::<BlockQ5_1>("q5_1");
    check_dot(1, &w, &blocks::<BlockQ8_1>("act_q8_1.bin"));
}

#[test]
fn q4_k_matches_ggml() {
    let w = check_format::<BlockQ4K>("q4_k");
    check_dot(2, &w, &blocks::<BlockQ8K>("act_q8_k.bin"));
}

#[test]
fn q5_k_matches_ggml() {
    let w = check_format::<BlockQ5K>("q5_k");
    check_dot(3, &w, &blocks::<BlockQ8K>("act_q8_k.bin"));
}

#[test]
fn q6_k_matches_ggml() {
    let w = check_format::<BlockQ6K>("q6_k");
    check_dot(4, &w, &blocks::<BlockQ8K>("act_q8_k.bin"));
}

/// Hostile data: any bytes as blocks, and NaN/inf/huge inputs to the quantizers, give floats
/// (finite or not) and never a panic or an overflow.
#[test]
fn hostile_data_does_not_panic() {
    fn run<B: BlockFormat>(bytes: &[u8], x: &[f32]) {
        let n = bytes.len() / std::mem::size_of::<B>();
        let w: Vec<B> = bytes
            .chunks_exact(std::mem::size_of::<B>())
            .map(bytemuck::pod_read_unaligned)
            .collect();
        let mut y = vec![0.0f32; n * B::BLOCK_LEN];
        B::dequantize_row(&w, &mut y);
        let mut q = vec![B::default(); x.len() / B::BLOCK_LEN];
        B::quantize_row_ref(x, &mut q);
        let a_bytes: Vec<u8> = bytes.iter().rev().copied().collect();
        let act: Vec<B::Activation> = a_bytes
            .chunks_exact(std::mem::size_of::<B::Activation>())
            .map(bytemuck::pod_read_unaligned)
            .collect();
        let m = w.len().min(act.len());
        let _ = B::vec_dot_ref(&w[..m], &act[..m]);
    }
    let mut r = Lcg(7);
    let bytes: Vec<u8> = (0..292 * 16)
        .map(|_| (r.next().to_bits() >> 7) as u8)
        .collect();
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        1e-45,
        0.0,
    ];
    let x: Vec<f32> = (0..2048).map(|i| specials[(i * 7 + i / 3) % 8]).collect();
    let mut x2 = x.clone();
    x2.iter_mut().step_by(3).for_each(|v| *v = 1e38);
    for x in [&x, &x2] {
        run::<BlockQ5_0>(&bytes, x);
        run::<BlockQ5_1>(&bytes, x);
        run::<BlockQ4K>(&bytes, x);
        run::<BlockQ5K>(&bytes, x);
        run::<BlockQ6K>(&bytes, x);
        run::<BlockQ8K>(&bytes, x);
    }
}
