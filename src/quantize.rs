//! `edgellm quantize`: rewrites a GGUF model with its 2-D weights in another format, with
//! llama.cpp's choices and its reference quantizers, so the output's tensor data is
//! byte-identical to `llama-quantize --allow-requantize IN OUT TYPE`:
//!
//! - A tensor is quantized if its name ends in `weight`, it has at least 2 dimensions and is
//!   not a norm (or another tensor llama.cpp keeps as is); everything else is copied.
//! - The output projection (`output.weight`, or `token_embd.weight` when the embeddings are
//!   tied) gets Q8_0 (F16 when the target is f16): llama.cpp gives it Q6_K when its rows are a
//!   multiple of 256 and Q8_0 otherwise; edgellm does not run K-quants, so Q8_0 always.
//! - A tensor already of its new type is copied byte for byte; any other is dequantized to f32
//!   (`dequantize_row_*`) and quantized with `quantize_row_*_ref`, row by row.
//! - A row length that is not a multiple of the block size falls back to F16.
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
use std::str::FromStr;

/// Formats `edgellm quantize` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Q4_0,
    Q4_1,
    Q8_0,
    F16,
}

impl QuantType {
    pub const ALL: [QuantType; 4] = [
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q8_0,
        QuantType::F16,
    ];

    /// The ggml type of the quantized weights.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            QuantType::Q4_0 => GgmlType::Q4_0,
            QuantType::Q4_1 => GgmlType::Q4_1,
            QuantType::Q8_0 => GgmlType::Q8_0,
            QuantType::F16 => GgmlType::F16,
        }
    }

    /// llama.cpp's `llama_ftype`, stored as `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q8_0 => 7,
        }
    }

    /// Lower-case name as given on the command line.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::Q4_0 => "q4_0",
            QuantType::Q4_1 => "q4_1",
            QuantType::Q8_0 => "q8_0",
            QuantType::F16 => "f16",
        }
    }
}

impl FromStr for QuantType {
    type Err = String;
    fn from_str(s: &str) -> Result<QuantType, String> {
        QuantType::ALL
            .into_iter()
            .find(|q| q.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown type '{s}' (expected q4_0, q4_1, q8_0 or f16)"))
    }
}

impl std::fmt::Display for QuantType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `GGML_QNT_VERSION`, stored as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// What happens to one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub from: GgmlType,
    pub to: GgmlType,
}

impl TensorPlan {
    /// Whether the data is copied unchanged.
    pub fn is_copy(&self) -> bool {
        self.from == self.to
    }
}

/// Whether llama.cpp would quantize this tensor at all.
pub fn is_quantizable(t: &TensorInfo) -> bool {
    // ggml_n_dims: trailing dimensions of 1 do not count.
    let n_dims = t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    const KEEP: [&str; 5] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "pos_embd.weight",
        "token_types.weight",
        "ssm_conv1d.weight",
    ];
    t.name.ends_with("weight") && n_dims >= 2 && !KEEP.iter().any(|k| t.name.contains(k))
}

/// The type tensor `t` gets when the file is quantized to `target`.
pub fn target_type(t: &TensorInfo, target: QuantType, has_output: bool) -> GgmlType {
    if !is_quantizable(t) {
        return t.ty;
    }
    let is_output = t.name == "output.weight" || (!has_output && t.name == "token_embd.weight");
    let ty = match target {
        QuantType::F16 => GgmlType::F16,
        _ if is_output => GgmlType::Q8_0,
        q => q.ggml_type(),
    };
    if !t.row_len().is_multiple_of(ty.block_len()) {
        GgmlType::F16
    } else {
        ty
    }
}

/// The plan for every tensor of `src`, in file order.
pub fn plan(src: &Gguf, target: QuantType) -> Vec<TensorPlan> {
    let has_output = src.get_tensor_info("output.weight").is_some();
    src.tensors()
        .iter()
        .map(|t| TensorPlan {
            name: t.name.clone(),
            from: t.ty,
            to: target_type(t, target, has_output),
        })
        .collect()
}

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
            "has type {ty}, which edgellm quantize cannot convert (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and writes Q4_0, Q4_1, Q8_0, F16)"
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
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, ty: GgmlType, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            offset: 0,
            size: 0,
        }
    }

    #[test]
    fn llama_cpp_type_choices() {
        let q = QuantType::Q4_0;
        assert_eq!(
            target_type(
                &info("blk.0.attn_q.weight", GgmlType::Q4_1, &[576, 576]),
                q,
                false
            ),
            GgmlType::Q4_0
        );
        assert_eq!(
            target_type(
                &info("blk.0.attn_norm.weight", GgmlType::F32, &[576]),
                q,
                false
            ),
            GgmlType::F32
        );
        assert_eq!(
            target_type(
                &info("token_embd.weight", GgmlType::Q8_0, &[576, 49152]),
                q,
                false
            ),
            GgmlType::Q8_0
        );
        // Untied: the embedding follows the file type, the output gets Q8_0.
        assert_eq!(
            target_type(
                &info("token_embd.weight", GgmlType::F16, &[576, 49152]),
                q,
                true
            ),
            GgmlType::Q4_0
        );
        assert_eq!(
            target_type(
                &info("output.weight", GgmlType::F16, &[576, 49152]),
                q,
                true
            ),
            GgmlType::Q8_0
        );
        assert_eq!(
            target_type(
                &info("blk.0.ffn_up.weight", GgmlType::F32, &[48, 4]),
                q,
                false
            ),
            GgmlType::F16
        );
        assert_eq!(
            target_type(
                &info("blk.0.ffn_up.weight", GgmlType::F32, &[64, 1]),
                q,
                false
            ),
            GgmlType::F32,
            "1-D after trailing 1s"
        );
        assert_eq!(
            target_type(
                &info("output.weight", GgmlType::F32, &[64, 4]),
                QuantType::F16,
                true
            ),
            GgmlType::F16
        );
        assert_eq!("Q8_0".parse::<QuantType>().unwrap(), QuantType::Q8_0);
        assert!("q6_k".parse::<QuantType>().unwrap_err().contains("q4_0"));
    }

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
        assert!(quantize(GgmlType::Q6_K, &x, &mut buf).is_none());
    }
}
