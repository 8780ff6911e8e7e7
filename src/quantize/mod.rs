//! `edgellm quantize`: rewrites a GGUF model with its 2-D weights in another format, with
//! llama.cpp's choices and its reference quantizers, so the output's tensor data is
//! byte-identical to `llama-quantize --allow-requantize IN OUT TYPE`:
//!
//! - A tensor is quantized if its name ends in `weight`, it has at least 2 dimensions and is
//!   not a norm (or another tensor llama.cpp keeps as is); everything else is copied.
//! - Each tensor's type is llama.cpp's choice for the file type (`plan.rs`): the output
//!   projection Q6_K (or Q8_0), more bits for some `attn_v` and `ffn_down` in the K mixes,
//!   and llama.cpp's fallbacks for rows that are not whole blocks.
//! - A tensor already of its new type is copied byte for byte; any other is dequantized to f32
//!   (`dequantize_row_*`) and quantized with `quantize_row_*_ref`, row by row.
//! - Metadata is kept, with `general.file_type` (llama.cpp's `LLAMA_FTYPE_*`) and
//!   `general.quantization_version` set.

use crate::gguf::writer::write_file_atomically;
use crate::gguf::{
    AccessHint, GgmlType, Gguf, GgufError, GgufWriter, OpenOptions, TensorInfo, Value,
};
use kernels_neon::reference as r;
use kernels_neon::{
    BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, f16,
};
use std::borrow::Cow;
use std::path::Path;

mod plan;
pub use plan::{QUANTIZATION_VERSION, QuantType, TensorPlan, is_quantizable, plan, target_type};

/// Progress of [`quantize_file`], given after each tensor.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub index: usize,
    pub total: usize,
    pub name: &'a str,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What [`quantize_file`] did.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub n_tensors: usize,
    pub n_requantized: usize,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

/// The tensors `plan` would quantize again from an already quantized format (Q4_0, Q4_K, …),
/// not from F32, F16 or BF16. Each rounding loses precision on top of the last one, so
/// `llama-quantize` refuses this without `--allow-requantize`, and so does `edgellm quantize`.
pub fn requantized<'a>(plan: &'a [TensorPlan]) -> impl Iterator<Item = &'a TensorPlan> {
    plan.iter().filter(|p| {
        !p.is_copy() && !matches!(p.from, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    })
}

/// Quantizes `input` into `output` (written atomically: a temporary file renamed into place).
pub fn quantize_file(
    input: &Path,
    output: &Path,
    target: QuantType,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Summary, GgufError> {
    let src = Gguf::open(input, &OpenOptions::new().hint(AccessHint::Sequential))?;
    let plan = plan(&src, target);
    let mut w = GgufWriter::new();
    w.set_all(src.metadata());
    w.set("general.file_type", Value::U32(target.file_type()));
    w.set(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    for (t, p) in src.tensors().iter().zip(&plan) {
        w.add_tensor_info(&t.name, p.to, &t.dims)?;
    }
    let bytes_total: u64 = src.tensors().iter().map(|t| t.size).sum();
    let mut summary = Summary {
        n_tensors: plan.len(),
        bytes_in: src.file_size(),
        ..Summary::default()
    };
    let mut bytes_done = 0;
    let layout = write_file_atomically(output, |out| {
        w.write_with(out, |i, _| {
            let t = &src.tensors()[i];
            let data = convert(&src, t, plan[i].to).map_err(|e| e.in_file(input))?;
            if !plan[i].is_copy() {
                summary.n_requantized += 1;
            }
            bytes_done += t.size;
            progress(Progress {
                index: i,
                total: plan.len(),
                name: &t.name,
                bytes_done,
                bytes_total,
            });
            Ok(data)
        })
    })?;
    summary.bytes_out = layout.file_size;
    Ok(summary)
}

/// Rows converted per step: bounds the f32 scratch to a few MiB whatever the tensor size.
const CHUNK_VALUES: usize = 1 << 20;

/// The data of `t` (from `src`) in type `to`.
pub fn convert<'a>(
    src: &'a Gguf,
    t: &TensorInfo,
    to: GgmlType,
) -> Result<Cow<'a, [u8]>, GgufError> {
    let bytes = src.tensor_data(t);
    if t.ty == to {
        return Ok(Cow::Borrowed(bytes));
    }
    let unsupported = |ty: GgmlType| GgufError::BadTensor {
        name: t.name.clone(),
        message: format!(
            "has type {ty}, which edgellm quantize cannot convert (it reads and writes F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K, and reads BF16)"
        ),
    };
    if t.n_elements() == 0 {
        return Ok(Cow::Owned(Vec::new()));
    }
    let row = t.row_len() as usize;
    // Whole rows per chunk, at least one.
    let rows_per_chunk = (CHUNK_VALUES / row.max(1)).max(1);
    let n_rows = t.n_rows() as usize;
    let out_row_bytes = to.bytes_for(row as u64).ok_or_else(|| unsupported(to))? as usize;
    let in_row_bytes =
        t.ty.bytes_for(row as u64)
            .ok_or_else(|| unsupported(t.ty))? as usize;
    let mut out = vec![0u8; out_row_bytes * n_rows];
    let mut scratch = vec![0f32; row * rows_per_chunk.min(n_rows)];
    for (ci, oc) in out.chunks_mut(out_row_bytes * rows_per_chunk).enumerate() {
        let nr = oc.len() / out_row_bytes;
        let ic = &bytes[ci * rows_per_chunk * in_row_bytes..][..nr * in_row_bytes];
        let x = &mut scratch[..nr * row];
        dequantize(t.ty, ic, x).ok_or_else(|| unsupported(t.ty))?;
        quantize(to, x, oc).ok_or_else(|| unsupported(to))?;
    }
    Ok(Cow::Owned(out))
}

/// `bytes` of type `ty` → f32; `None` for types it cannot read.
fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Option<()> {
    // The source may not be aligned for a zero-copy view (e.g. an odd general.alignment):
    // unaligned reads copy the blocks.
    fn blocks<T: bytemuck::Pod>(b: &[u8]) -> Cow<'_, [T]> {
        match bytemuck::try_cast_slice(b) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => {
                let mut v = vec![T::zeroed(); b.len() / size_of::<T>()];
                bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(b);
                Cow::Owned(v)
            }
        }
    }
    match ty {
        GgmlType::F32 => out.copy_from_slice(&blocks::<f32>(bytes)),
        GgmlType::F16 => kernels_neon::f16_to_f32_row(&blocks::<f16>(bytes), out),
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        GgmlType::Q4_0 => r::dequantize_row_q4_0(&blocks::<BlockQ4_0>(bytes), out),
        GgmlType::Q4_1 => r::dequantize_row_q4_1(&blocks::<BlockQ4_1>(bytes), out),
        GgmlType::Q8_0 => r::dequantize_row_q8_0(&blocks::<BlockQ8_0>(bytes), out),
        GgmlType::Q5_0 => r::dequantize_row_q5_0(&blocks::<BlockQ5_0>(bytes), out),
        GgmlType::Q5_1 => r::dequantize_row_q5_1(&blocks::<BlockQ5_1>(bytes), out),
        GgmlType::Q4_K => r::dequantize_row_q4_k(&blocks::<BlockQ4K>(bytes), out),
        GgmlType::Q5_K => r::dequantize_row_q5_k(&blocks::<BlockQ5K>(bytes), out),
        GgmlType::Q6_K => r::dequantize_row_q6_k(&blocks::<BlockQ6K>(bytes), out),
        _ => return None,
    }
    Some(())
}

/// f32 → `out` of type `ty` (reference quantizers); `None` for types it cannot write.
fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Option<()> {
    // `out` comes from a `Vec<u8>`: cast when aligned, else go through an aligned buffer.
    fn with<T: bytemuck::Pod + Default>(out: &mut [u8], f: impl FnOnce(&mut [T])) {
        match bytemuck::try_cast_slice_mut::<u8, T>(out) {
            Ok(s) => f(s),
            Err(_) => {
                let mut tmp = vec![T::default(); out.len() / size_of::<T>()];
                f(&mut tmp);
                out.copy_from_slice(bytemuck::cast_slice(&tmp));
            }
        }
    }
    match ty {
        GgmlType::F32 => with::<f32>(out, |o| o.copy_from_slice(x)),
        GgmlType::F16 => with::<f16>(out, |o| kernels_neon::f32_to_f16_row(x, o)),
        GgmlType::Q4_0 => with::<BlockQ4_0>(out, |o| r::quantize_row_q4_0_ref(x, o)),
        GgmlType::Q4_1 => with::<BlockQ4_1>(out, |o| r::quantize_row_q4_1_ref(x, o)),
        GgmlType::Q8_0 => with::<BlockQ8_0>(out, |o| r::quantize_row_q8_0_ref(x, o)),
        GgmlType::Q5_0 => with::<BlockQ5_0>(out, |o| r::quantize_row_q5_0_ref(x, o)),
        GgmlType::Q5_1 => with::<BlockQ5_1>(out, |o| r::quantize_row_q5_1_ref(x, o)),
        GgmlType::Q4_K => with::<BlockQ4K>(out, |o| r::quantize_row_q4_k_ref(x, o)),
        GgmlType::Q5_K => with::<BlockQ5K>(out, |o| r::quantize_row_q5_k_ref(x, o)),
        GgmlType::Q6_K => with::<BlockQ6K>(out, |o| r::quantize_row_q6_k_ref(x, o)),
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_matches_the_reference_on_unaligned_buffers() {
        let x: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut want = vec![BlockQ4_0::default(); 2];
        r::quantize_row_q4_0_ref(&x, &mut want);
        let mut buf = vec![0u8; 37];
        quantize(GgmlType::Q4_0, &x, &mut buf[1..]).unwrap();
        assert_eq!(&buf[1..], bytemuck::cast_slice::<BlockQ4_0, u8>(&want));
        let mut back = vec![0f32; 64];
        dequantize(GgmlType::Q4_0, &buf[1..], &mut back).unwrap();
        let mut want_back = vec![0f32; 64];
        r::dequantize_row_q4_0(&want, &mut want_back);
        assert_eq!(back, want_back);
        assert!(quantize(GgmlType::Q2_K, &x, &mut buf).is_none());
    }
}
