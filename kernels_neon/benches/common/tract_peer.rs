//! tract-linalg's Q4_0 matrix-vector product, driven through its public API the way tract-core
//! drives it for a Q4_0 weight (`ops::einsum::kernel_selection` and `ops::matmul::optimized`
//! in tract-core 0.22):
//!
//! 1. kernel selection: among `tract_linalg::ops().mmm_impls()`, the kernels with an f32
//!    accumulator that store f32, and a packing whose B side takes plain f32 activations and
//!    whose A side is Q4_0 (directly, or through a panel extractor); keep the best
//!    `ImplementationQuality` (+ dynamic boost), then for n = 1 prefer a true GEMV kernel
//!    (`nr == 1`), no extractor, then the widest `mr`. On x86_64 with FMA+F16C this is
//!    `fma_mmm_f32_32x1` (hand-written assembly that unpacks Q4_0 nibbles in its inner loop);
//!    on aarch64 `arm64simd_mmm_f32_32x1_gen`.
//! 2. weights: our `BlockQ4_0` bytes are ggml's layout, which is also tract's unpacked Q4_0
//!    (f16 scale, then 16 bytes: low nibbles = values 0..16, high = 16..32; checked once by
//!    dequantizing through tract), so they are handed as-is to the kernel's
//!    `PackedBlockQuantFormat::pack` (a one-time re-layout into panels of `r` rows, the same
//!    18 bytes per 32 weights: the GB/s figures compare equal byte counts).
//! 3. activations: f32, packed once by the B format (tract's kernel takes f32 activations and
//!    never quantizes them; ours take Q8 activations quantized beforehand, also outside the
//!    timed loop).
//! 4. each call: `run_with_scratch_space(m, 1, [AddMatMul, Store])` with a scratch space
//!    allocated once, as tract-core caches it per session. Single-threaded (tract-linalg's
//!    `multithread-mm` feature is off), like our kernels.
//!
//! The version is tract 0.22: 0.23 declares rust-version 1.91 (tract-data), above the
//! workspace's 1.88.

use kernels_neon::BlockQ4_0;
use std::sync::Arc;
use tract_data::internal::*;
use tract_linalg::WeightType;
use tract_linalg::block_quant::{BlockQuant, PackedBlockQuantFormat, Q4_0};
use tract_linalg::mmm::{
    AsInputValue, EagerPackedInput, FusedSpec, MMMInputFormat, MMMInputValue, MatMatMul,
    OutputStore, PanelExtractInput, PanelExtractor, ScratchSpace,
};

/// The kernel, packing index and optional panel extractor tract picks for Q4_0 x f32, n = 1.
pub struct Choice {
    pub mmm: Box<dyn MatMatMul>,
    pub packing: usize,
    pub extractor: Option<PanelExtractor>,
}

impl Choice {
    /// tract-core's choice for a Q4_0 weight and f32 activations at n = 1.
    pub fn pick() -> TractResult<Choice> {
        let weight = WeightType::from(Q4_0);
        let ops = tract_linalg::ops();
        let mut impls: Vec<Choice> = Vec::new();
        for mmm in ops.mmm_impls() {
            if mmm.internal_type() != DatumType::F32 || !mmm.stores().contains(&DatumType::F32) {
                continue;
            }
            for (ix, (pa, pb)) in mmm.packings().iter().enumerate() {
                if pb.precursor().as_dt() != Some(DatumType::F32) {
                    continue;
                }
                if pa.precursor() == weight {
                    impls.push(Choice {
                        mmm: mmm.clone(),
                        packing: ix,
                        extractor: None,
                    });
                } else if let Some(pe) = ops
                    .panel_extractors()
                    .iter()
                    .find(|pe| pe.from.precursor() == weight && pe.to.same_as(&**pa))
                {
                    impls.push(Choice {
                        mmm: mmm.clone(),
                        packing: ix,
                        extractor: Some(pe.clone()),
                    });
                }
            }
        }
        let score = |m: &dyn MatMatMul| -(m.quality().cost() as isize * 1000) + m.dynamic_boost();
        let best = impls
            .iter()
            .map(|c| score(&*c.mmm))
            .max()
            .context("tract has no Q4_0 x f32 kernel here")?;
        impls.retain(|c| score(&*c.mmm) == best);
        impls
            .into_iter()
            .max_by_key(|c| (c.mmm.nr() == 1, c.extractor.is_none(), c.mmm.mr()))
            .context("no kernel left")
    }

    /// The A-side (weight) format: the kernel's own, or the extractor's source.
    fn weight_format(&self) -> TractResult<PackedBlockQuantFormat> {
        let f = match &self.extractor {
            Some(pe) => &*pe.from,
            None => &*self.mmm.packings()[self.packing].0,
        };
        f.downcast_ref::<PackedBlockQuantFormat>()
            .cloned()
            .context("weight format is not block-quant")
    }

    /// e.g. `fma_mmm_f32_32x1 PackedQ4_0[32]Z16`.
    pub fn describe(&self) -> String {
        let a = self
            .weight_format()
            .map(|f| f.to_string())
            .unwrap_or_default();
        match &self.extractor {
            Some(pe) => format!("{} {a} via {}", self.mmm.name(), pe.name),
            None => format!("{} {a}", self.mmm.name()),
        }
    }
}

/// A Q4_0 `rows x cols` matrix (one or several copies of it) packed for tract, with an f32
/// activation and the output, ready to run.
pub struct TractQ40 {
    pub choice: Choice,
    rows: usize,
    a: Vec<Box<dyn MMMInputValue>>,
    b: Box<dyn MMMInputValue>,
    c: Tensor,
    store: OutputStore,
    scratch: Box<dyn ScratchSpace>,
    /// Bytes of one packed copy of the weights.
    pub packed_bytes: usize,
}

impl TractQ40 {
    /// Packs `w` (`rows` rows of `x.len() / 32` blocks) `copies` times (distinct memory, for
    /// the cold runs) and `x` once.
    pub fn new(w: &[BlockQ4_0], rows: usize, x: &[f32], copies: usize) -> TractResult<TractQ40> {
        let k = x.len();
        ensure!(w.len() * 32 == rows * k, "shape mismatch");
        let choice = Choice::pick()?;
        let format = choice.weight_format()?;
        let bytes: &[u8] = bytemuck::cast_slice(w);

        // Our blocks are ggml's bytes; check that tract reads them as the same numbers.
        let first_rows = &bytes[..(k / 32 * 18) * rows.min(4)];
        let theirs = Q4_0.dequant_f32(first_rows)?;
        let ours = super::dequant(&w[..k / 32 * rows.min(4)]);
        ensure!(
            theirs.as_slice::<f32>()? == &ours[..],
            "tract's Q4_0 layout differs from ggml's"
        );

        let packed: EagerPackedInput = format.pack(bytes, k)?;
        let packed_bytes = packed.packed.len();
        let a = (0..copies.max(1))
            .map(|i| {
                let mut p = packed.clone();
                if i > 0 {
                    // A deep copy: `packed` is an `Arc<Blob>`, and a shared one would stay hot.
                    p.packed = Arc::new((*packed.packed).clone());
                }
                match &choice.extractor {
                    Some(pe) => Box::new(PanelExtractInput {
                        format: pe.clone(),
                        data: p,
                    }) as Box<dyn MMMInputValue>,
                    None => Box::new(p) as Box<dyn MMMInputValue>,
                }
            })
            .collect();
        let b_format = &choice.mmm.packings()[choice.packing].1;
        let b = b_format.prepare_one(&Tensor::from_shape(&[k, 1], x)?, 0, 1)?;
        let mut c = Tensor::zero::<f32>(&[rows, 1])?;
        let store = unsafe { choice.mmm.c_view(Some(0), Some(1)).wrap(&c.view_mut()) };
        let scratch = unsafe { choice.mmm.allocate_scratch_space() };
        Ok(TractQ40 {
            choice,
            rows,
            a,
            b,
            c,
            store,
            scratch,
            packed_bytes,
        })
    }

    pub fn copies(&self) -> usize {
        self.a.len()
    }

    /// One matrix-vector product with copy `i` of the weights.
    #[inline]
    pub fn run(&mut self, i: usize) {
        let uops = [
            FusedSpec::AddMatMul {
                a: AsInputValue::Borrowed(&*self.a[i]),
                b: AsInputValue::Borrowed(&*self.b),
                packing: self.choice.packing,
            },
            FusedSpec::Store(self.store),
        ];
        unsafe {
            self.choice
                .mmm
                .run_with_scratch_space(self.rows, 1, &mut *self.scratch, &uops)
        }
        .expect("tract matmul");
    }

    /// The last result.
    pub fn output(&self) -> &[f32] {
        self.c.as_slice::<f32>().expect("f32 output")
    }
}
