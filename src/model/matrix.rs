//! Typed, zero-copy views of weight matrices and the products the forward pass needs.

use crate::gguf::TensorView;
use crate::runtime::Pool;
use kernels_neon::{
    BlockFormat, BlockQ4_0, BlockQ4_0x8, BlockQ4_1, BlockQ4_1x8, BlockQ4K, BlockQ4Kx8, BlockQ5_0,
    BlockQ5_0x8, BlockQ5_1, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8_0, BlockQ8_0x8,
    BlockQ8_1, BlockQ8K, Kernels, PACK_ROWS, PackedWeightFormat, QK_K, WeightFormat, f16,
};

/// The data of a weight matrix: as stored in the GGUF file (row-major, `rows × cols`), or
/// packed at load eight rows at a time (`*x8`, group-major; see `model::packed`).
#[derive(Clone, Copy, Debug)]
pub enum MatData<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    Q4_0(&'a [BlockQ4_0]),
    Q4_1(&'a [BlockQ4_1]),
    Q8_0(&'a [BlockQ8_0]),
    Q5_0(&'a [BlockQ5_0]),
    Q5_1(&'a [BlockQ5_1]),
    Q4K(&'a [BlockQ4K]),
    Q5K(&'a [BlockQ5K]),
    Q6K(&'a [BlockQ6K]),
    Q4_0x8(&'a [BlockQ4_0x8]),
    Q4_1x8(&'a [BlockQ4_1x8]),
    Q8_0x8(&'a [BlockQ8_0x8]),
    Q5_0x8(&'a [BlockQ5_0x8]),
    Q4Kx8(&'a [BlockQ4Kx8]),
    Q5Kx8(&'a [BlockQ5Kx8]),
    Q6Kx8(&'a [BlockQ6Kx8]),
}

impl<'a> From<TensorView<'a>> for MatData<'a> {
    fn from(v: TensorView<'a>) -> MatData<'a> {
        match v {
            TensorView::F32(w) => MatData::F32(w),
            TensorView::F16(w) => MatData::F16(w),
            TensorView::Q4_0(w) => MatData::Q4_0(w),
            TensorView::Q4_1(w) => MatData::Q4_1(w),
            TensorView::Q8_0(w) => MatData::Q8_0(w),
            TensorView::Q5_0(w) => MatData::Q5_0(w),
            TensorView::Q5_1(w) => MatData::Q5_1(w),
            TensorView::Q4K(w) => MatData::Q4K(w),
            TensorView::Q5K(w) => MatData::Q5K(w),
            TensorView::Q6K(w) => MatData::Q6K(w),
        }
    }
}

/// A weight matrix: `rows` outputs of `cols` inputs each.
#[derive(Clone, Copy, Debug)]
pub struct Mat<'a> {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData<'a>,
}

/// Which quantized activation rows a matrix consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActKind {
    Q8_0,
    Q8_1,
    /// Blocks of 256 (the K-quants' activations).
    Q8K,
    F32,
}

impl Mat<'_> {
    pub fn act_kind(&self) -> ActKind {
        match self.data {
            MatData::Q4_0(_)
            | MatData::Q8_0(_)
            | MatData::Q5_0(_)
            | MatData::Q4_0x8(_)
            | MatData::Q8_0x8(_)
            | MatData::Q5_0x8(_) => ActKind::Q8_0,
            MatData::Q4_1(_) | MatData::Q5_1(_) | MatData::Q4_1x8(_) => ActKind::Q8_1,
            MatData::Q4K(_)
            | MatData::Q5K(_)
            | MatData::Q6K(_)
            | MatData::Q4Kx8(_)
            | MatData::Q5Kx8(_)
            | MatData::Q6Kx8(_) => ActKind::Q8K,
            MatData::F16(_) | MatData::F32(_) => ActKind::F32,
        }
    }

    /// Bytes of weights one product streams.
    pub fn bytes(&self) -> usize {
        match self.data {
            MatData::Q4_0(w) => std::mem::size_of_val(w),
            MatData::Q4_1(w) => std::mem::size_of_val(w),
            MatData::Q8_0(w) => std::mem::size_of_val(w),
            MatData::Q5_0(w) => std::mem::size_of_val(w),
            MatData::Q5_1(w) => std::mem::size_of_val(w),
            MatData::Q4K(w) => std::mem::size_of_val(w),
            MatData::Q5K(w) => std::mem::size_of_val(w),
            MatData::Q6K(w) => std::mem::size_of_val(w),
            MatData::F16(w) => std::mem::size_of_val(w),
            MatData::F32(w) => std::mem::size_of_val(w),
            MatData::Q4_0x8(w) => std::mem::size_of_val(w),
            MatData::Q4_1x8(w) => std::mem::size_of_val(w),
            MatData::Q8_0x8(w) => std::mem::size_of_val(w),
            MatData::Q5_0x8(w) => std::mem::size_of_val(w),
            MatData::Q4Kx8(w) => std::mem::size_of_val(w),
            MatData::Q5Kx8(w) => std::mem::size_of_val(w),
            MatData::Q6Kx8(w) => std::mem::size_of_val(w),
        }
    }

    /// Copies row `r`, dequantized, into `out` (`cols` values): embedding lookup.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        match self.data {
            MatData::Q4_0(w) => {
                kernels_neon::reference::dequantize_row_q4_0(&w[r * c / 32..(r + 1) * c / 32], out)
            }
            MatData::Q4_1(w) => {
                kernels_neon::reference::dequantize_row_q4_1(&w[r * c / 32..(r + 1) * c / 32], out)
            }
            MatData::Q8_0(w) => {
                kernels_neon::reference::dequantize_row_q8_0(&w[r * c / 32..(r + 1) * c / 32], out)
            }
            MatData::Q5_0(w) => dequantize_row(w, c, r, out),
            MatData::Q5_1(w) => dequantize_row(w, c, r, out),
            MatData::Q4K(w) => dequantize_row(w, c, r, out),
            MatData::Q5K(w) => dequantize_row(w, c, r, out),
            MatData::Q6K(w) => dequantize_row(w, c, r, out),
            MatData::F16(w) => kernels_neon::f16_to_f32_row(&w[r * c..(r + 1) * c], out),
            MatData::F32(w) => out.copy_from_slice(&w[r * c..(r + 1) * c]),
            MatData::Q4_0x8(w) => super::packed::packed_row_f32(w, c / 32, r, out),
            MatData::Q4_1x8(w) => super::packed::packed_row_f32(w, c / 32, r, out),
            MatData::Q8_0x8(w) => super::packed::packed_row_f32(w, c / 32, r, out),
            MatData::Q5_0x8(w) => super::packed::packed_row_f32(w, c / 32, r, out),
            MatData::Q4Kx8(w) => super::packed::packed_row_f32(w, c / QK_K, r, out),
            MatData::Q5Kx8(w) => super::packed::packed_row_f32(w, c / QK_K, r, out),
            MatData::Q6Kx8(w) => super::packed::packed_row_f32(w, c / QK_K, r, out),
        }
    }
}

impl<'a> Mat<'a> {
    /// Rows `r0..r1` as a matrix of their own (a packed matrix in whole groups of
    /// [`PACK_ROWS`]): a product over it gives the bits of the same rows of the whole product,
    /// as a thread's share of the rows does.
    pub fn row_slice(&self, r0: usize, r1: usize) -> Mat<'a> {
        assert!(
            r0 <= r1 && r1 <= self.rows,
            "rows {r0}..{r1} of {}",
            self.rows
        );
        let c = self.cols;
        // Blocks per row, and the slice of `w` holding rows r0..r1 (packed: groups r0/8..r1/8).
        fn rows_of<B>(w: &[B], per_row: usize, r0: usize, r1: usize) -> &[B] {
            &w[r0 * per_row..r1 * per_row]
        }
        fn groups_of<B>(w: &[B], nb: usize, r0: usize, r1: usize) -> &[B] {
            assert!(
                r0.is_multiple_of(PACK_ROWS) && r1.is_multiple_of(PACK_ROWS),
                "a packed matrix slices in whole groups of {PACK_ROWS} rows"
            );
            &w[r0 / PACK_ROWS * nb..r1 / PACK_ROWS * nb]
        }
        let (nb, nk) = (c / 32, c / QK_K);
        let data = match self.data {
            MatData::F32(w) => MatData::F32(rows_of(w, c, r0, r1)),
            MatData::F16(w) => MatData::F16(rows_of(w, c, r0, r1)),
            MatData::Q4_0(w) => MatData::Q4_0(rows_of(w, nb, r0, r1)),
            MatData::Q4_1(w) => MatData::Q4_1(rows_of(w, nb, r0, r1)),
            MatData::Q8_0(w) => MatData::Q8_0(rows_of(w, nb, r0, r1)),
            MatData::Q5_0(w) => MatData::Q5_0(rows_of(w, nb, r0, r1)),
            MatData::Q5_1(w) => MatData::Q5_1(rows_of(w, nb, r0, r1)),
            MatData::Q4K(w) => MatData::Q4K(rows_of(w, nk, r0, r1)),
            MatData::Q5K(w) => MatData::Q5K(rows_of(w, nk, r0, r1)),
            MatData::Q6K(w) => MatData::Q6K(rows_of(w, nk, r0, r1)),
            MatData::Q4_0x8(w) => MatData::Q4_0x8(groups_of(w, nb, r0, r1)),
            MatData::Q4_1x8(w) => MatData::Q4_1x8(groups_of(w, nb, r0, r1)),
            MatData::Q8_0x8(w) => MatData::Q8_0x8(groups_of(w, nb, r0, r1)),
            MatData::Q5_0x8(w) => MatData::Q5_0x8(groups_of(w, nb, r0, r1)),
            MatData::Q4Kx8(w) => MatData::Q4Kx8(groups_of(w, nk, r0, r1)),
            MatData::Q5Kx8(w) => MatData::Q5Kx8(groups_of(w, nk, r0, r1)),
            MatData::Q6Kx8(w) => MatData::Q6Kx8(groups_of(w, nk, r0, r1)),
        };
        Mat {
            rows: r1 - r0,
            cols: c,
            data,
        }
    }

    /// Whether the matrix is packed in groups of [`PACK_ROWS`] rows (which a row slice keeps
    /// whole).
    pub fn is_packed(&self) -> bool {
        matches!(
            self.data,
            MatData::Q4_0x8(_)
                | MatData::Q4_1x8(_)
                | MatData::Q8_0x8(_)
                | MatData::Q5_0x8(_)
                | MatData::Q4Kx8(_)
                | MatData::Q5Kx8(_)
                | MatData::Q6Kx8(_)
        )
    }
}

/// Row `r` of a `cols`-wide matrix of `B` blocks, dequantized into `out`.
fn dequantize_row<B: BlockFormat>(w: &[B], cols: usize, r: usize, out: &mut [f32]) {
    let nb = cols / B::BLOCK_LEN;
    B::dequantize_row(&w[r * nb..(r + 1) * nb], out)
}

/// Activations of a batch of tokens, quantized once per input and shared by every matrix that
/// reads that input (q/k/v share one, gate/up share one).
pub struct Acts<'s> {
    /// `[tok][cols]` f32 (for F16/F32 weights).
    pub f32: &'s [f32],
    pub q8_0: &'s [BlockQ8_0],
    pub q8_1: &'s [BlockQ8_1],
    /// Empty unless a K-quant matrix reads this input (whose width is then whole 256-value
    /// blocks: the loader checks the matrices).
    pub q8_k: &'s [BlockQ8K],
    pub n_tok: usize,
}

/// Scratch to quantize activations into, sized for the largest input at load.
pub struct ActScratch {
    pub q8_0: Vec<BlockQ8_0>,
    pub q8_1: Vec<BlockQ8_1>,
    pub q8_k: Vec<BlockQ8K>,
}

/// Which activation formats an input must be quantized into: `[Q8_0, Q8_1, Q8_K]`.
pub type ActNeed = [bool; 3];

impl ActScratch {
    /// Room for `max_tok` inputs of up to `max_cols` values in every format. (Q8_K's is
    /// allocated whether or not the model has K-quant matrices: it is about the size of the
    /// Q8_0 scratch, 292 bytes per 256 values against 34 per 32, and
    /// [`ActScratch::bytes_for`] counts it.)
    pub fn new(max_tok: usize, max_cols: usize) -> ActScratch {
        let (blocks, k_blocks) = Self::blocks(max_tok, max_cols);
        ActScratch {
            q8_0: vec![BlockQ8_0::default(); blocks],
            q8_1: vec![BlockQ8_1::default(); blocks],
            q8_k: vec![BlockQ8K::default(); k_blocks],
        }
    }

    fn blocks(max_tok: usize, max_cols: usize) -> (usize, usize) {
        (
            max_tok * max_cols.div_ceil(32),
            max_tok * max_cols.div_ceil(QK_K),
        )
    }

    /// Bytes [`ActScratch::new`] allocates.
    pub fn bytes_for(max_tok: usize, max_cols: usize) -> usize {
        let (blocks, k_blocks) = Self::blocks(max_tok, max_cols);
        blocks * (size_of::<BlockQ8_0>() + size_of::<BlockQ8_1>())
            + k_blocks * size_of::<BlockQ8K>()
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        size_of_val(&self.q8_0[..]) + size_of_val(&self.q8_1[..]) + size_of_val(&self.q8_k[..])
    }

    /// Quantizes `x` (`n_tok × cols`, token-major) into the formats in `need`. A K-quant
    /// input's width is a whole number of 256-value blocks (the loader checks its matrices).
    pub fn quantize<'s>(
        &'s mut self,
        k: &Kernels,
        pool: &Pool,
        x: &'s [f32],
        n_tok: usize,
        need: ActNeed,
    ) -> Acts<'s> {
        let nb = x.len() / 32;
        let nk = if need[2] { x.len() / QK_K } else { 0 };
        if need[0] {
            by_token(pool, x, n_tok, &mut self.q8_0[..nb], &k.quantize_row_q8_0);
        }
        if need[1] {
            by_token(pool, x, n_tok, &mut self.q8_1[..nb], &k.quantize_row_q8_1);
        }
        if need[2] {
            by_token(
                pool,
                x,
                n_tok,
                &mut self.q8_k[..nk],
                &k.more.quantize_row_q8_k,
            );
        }
        Acts {
            f32: x,
            q8_0: &self.q8_0[..nb],
            q8_1: &self.q8_1[..nb],
            q8_k: &self.q8_k[..nk],
            n_tok,
        }
    }
}

/// `f(x, out)` over `n_tok` token-major inputs, a prompt's tokens split between the pool's
/// threads (for work where each output depends on its own token's inputs only, so the bits
/// are the same however the tokens are split); a single token runs on the caller's thread.
pub(super) fn by_token<B: Send>(
    pool: &Pool,
    x: &[f32],
    n_tok: usize,
    out: &mut [B],
    f: &(dyn Fn(&[f32], &mut [B]) + Sync),
) {
    if n_tok <= 1 {
        f(x, out);
        return;
    }
    let (cols, unit) = (x.len() / n_tok, out.len() / n_tok);
    pool.run_split(out, unit, &|_, toks, piece| {
        f(&x[toks.start * cols..toks.end * cols], piece);
    });
}

fn product<W: WeightFormat>(
    k: &Kernels,
    pool: &Pool,
    w: &[W],
    a: &[W::Activation],
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = a.len() / n_tok;
    if n_tok == 1 {
        let mv = W::matvec(k);
        pool.run_split(out, 1, &|_, rows, o| {
            mv(&w[rows.start * nb..rows.end * nb], a, o)
        });
    } else {
        let mm = W::matmul(k);
        pool.run_split_coarse(out, n_tok, &|_, rows, o| {
            mm(&w[rows.start * nb..rows.end * nb], a, n_tok, o)
        });
    }
}

/// [`product`] over packed weights: the pool splits whole groups of 8 rows. A table without
/// the format's packed products (a model packed for another engine's path) uses the packed
/// reference.
fn product_packed<P: PackedWeightFormat>(
    k: &Kernels,
    pool: &Pool,
    w: &[P],
    a: &[<P::Row as kernels_neon::BlockFormat>::Activation],
    n_tok: usize,
    out: &mut [f32],
) {
    let nb = a.len() / n_tok;
    let pk = P::table(k).unwrap_or(P::REFERENCE);
    let unit = PACK_ROWS * n_tok;
    if n_tok == 1 {
        let mv = P::matvec(pk);
        pool.run_split(out, unit, &|_, groups, o| {
            mv(&w[groups.start * nb..groups.end * nb], a, o)
        });
    } else {
        let mm = P::matmul(pk);
        pool.run_split_coarse(out, unit, &|_, groups, o| {
            mm(&w[groups.start * nb..groups.end * nb], a, n_tok, o)
        });
    }
}

fn product_float(k: &Kernels, pool: &Pool, m: &Mat<'_>, x: &[f32], n_tok: usize, out: &mut [f32]) {
    let c = m.cols;
    pool.run_split(out, n_tok, &|_, rows, o| {
        for (ri, r) in rows.enumerate() {
            for t in 0..n_tok {
                let xt = &x[t * c..(t + 1) * c];
                o[ri * n_tok + t] = match m.data {
                    MatData::F16(w) => (k.dot_f16)(&w[r * c..(r + 1) * c], xt),
                    MatData::F32(w) => (k.dot_f32)(&w[r * c..(r + 1) * c], xt),
                    _ => unreachable!("quantized matrices take the block paths"),
                };
            }
        }
    });
}

/// `out[r * n_tok + t] = W[r] · x[t]` (`[row][tok]`, as the kernels write it), rows split over
/// the pool's threads. Each row is computed whole by one thread, so the result does not
/// depend on the thread count.
pub fn matmul(k: &Kernels, pool: &Pool, m: &Mat<'_>, a: &Acts<'_>, out: &mut [f32]) {
    let n = a.n_tok;
    let out = &mut out[..m.rows * n];
    let nb = m.cols / 32;
    let nk = m.cols / QK_K;
    match m.data {
        MatData::Q4_0(w) => product(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q4_1(w) => product(k, pool, w, &a.q8_1[..n * nb], n, out),
        MatData::Q8_0(w) => product(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q5_0(w) => product(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q5_1(w) => product(k, pool, w, &a.q8_1[..n * nb], n, out),
        MatData::Q4K(w) => product(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::Q5K(w) => product(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::Q6K(w) => product(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::Q4_0x8(w) => product_packed(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q4_1x8(w) => product_packed(k, pool, w, &a.q8_1[..n * nb], n, out),
        MatData::Q8_0x8(w) => product_packed(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q5_0x8(w) => product_packed(k, pool, w, &a.q8_0[..n * nb], n, out),
        MatData::Q4Kx8(w) => product_packed(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::Q5Kx8(w) => product_packed(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::Q6Kx8(w) => product_packed(k, pool, w, &a.q8_k[..n * nk], n, out),
        MatData::F16(_) | MatData::F32(_) => {
            product_float(k, pool, m, &a.f32[..n * m.cols], n, out)
        }
    }
}

/// `[row][tok]` → `[tok][row]` (the kernels write `[row][tok]`), the tokens split between the
/// pool's threads: done by one thread while the others waited, the transpositions took ~8 %
/// of a prompt's processing at two threads.
pub fn transpose_into(pool: &Pool, src: &[f32], rows: usize, n_tok: usize, dst: &mut [f32]) {
    transpose_into_lines(pool, src, rows, n_tok, &mut dst[..rows * n_tok], rows, 0);
}

/// As [`transpose_into`], into `n_tok` lines of `stride` (`dst`), token `t`'s values going to
/// `dst[t * stride + col0..][..rows]`: a slice of rows transposed into its columns of wider
/// lines (a slice of the vocabulary's logits).
pub fn transpose_into_lines(
    pool: &Pool,
    src: &[f32],
    rows: usize,
    n_tok: usize,
    dst: &mut [f32],
    stride: usize,
    col0: usize,
) {
    assert!(col0 + rows <= stride && dst.len() == n_tok * stride);
    let src = &src[..rows * n_tok];
    pool.run_split(dst, stride, &|_, toks, lines| {
        transpose_tokens(src, (rows, n_tok), toks, lines, (stride, col0));
    });
}

/// Tokens `toks` of [`transpose_into_lines`], into their own lines: along 16-row tiles, each
/// written one output line at a time (the plain double loop, and tiles walked along the
/// input, stored to a new line per element and took ~7 % of prompt processing; with 1536 rows
/// the lines of a tile also fell into two L1 sets).
fn transpose_tokens(
    src: &[f32],
    (rows, n_tok): (usize, usize),
    toks: std::ops::Range<usize>,
    lines: &mut [f32],
    (stride, col0): (usize, usize),
) {
    const TILE: usize = 16;
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for (i, t) in toks.clone().enumerate() {
            let d = &mut lines[i * stride + col0 + r0..i * stride + col0 + r1];
            for (r, o) in (r0..r1).zip(d) {
                *o = src[r * n_tok + t];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{transpose_into, transpose_into_lines};
    use crate::runtime::Pool;

    /// One thread and two: the tokens split between threads write the same lines.
    fn pools() -> [Pool; 2] {
        [Pool::new(1).unwrap(), Pool::new(2).unwrap()]
    }

    #[test]
    fn a_slice_of_rows_transposes_into_its_columns_of_wider_lines() {
        for pool in pools() {
            for (rows, n_tok, stride, col0) in [(37, 5, 100, 40), (16, 9, 16, 0), (3, 1, 8, 5)] {
                lines_case(&pool, rows, n_tok, stride, col0);
            }
        }
    }

    fn lines_case(pool: &Pool, rows: usize, n_tok: usize, stride: usize, col0: usize) {
        let src: Vec<f32> = (0..rows * n_tok).map(|i| i as f32).collect();
        let mut dst = vec![-1.0; n_tok * stride];
        transpose_into_lines(pool, &src, rows, n_tok, &mut dst, stride, col0);
        for t in 0..n_tok {
            for c in 0..stride {
                let want = match c.checked_sub(col0) {
                    Some(r) if r < rows => src[r * n_tok + t],
                    _ => -1.0,
                };
                assert_eq!(dst[t * stride + c], want, "{rows}x{n_tok} t{t} c{c}");
            }
        }
    }

    #[test]
    fn transpose_matches_the_definition_on_ragged_shapes() {
        for pool in pools() {
            ragged_shapes(&pool);
        }
    }

    fn ragged_shapes(pool: &Pool) {
        for (rows, n_tok) in [
            (1, 1),
            (1, 37),
            (37, 1),
            (16, 16),
            (17, 33),
            (576, 64),
            (5, 130),
        ] {
            let src: Vec<f32> = (0..rows * n_tok).map(|i| i as f32).collect();
            let mut dst = vec![-1.0; rows * n_tok];
            transpose_into(pool, &src, rows, n_tok, &mut dst);
            for r in 0..rows {
                for t in 0..n_tok {
                    assert_eq!(
                        dst[t * rows + r],
                        src[r * n_tok + t],
                        "{rows}x{n_tok} r{r} t{t}"
                    );
                }
            }
        }
    }
}
