//! Tensor infos, ggml types and typed zero-copy views of tensor data.

use super::error::{GgufError, Result};
use kernels_neon::{
    BlockFormat, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, f16,
};

/// Most dimensions a GGUF tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

macro_rules! ggml_types {
    ($($v:ident = $id:literal, $name:literal, $blck:literal, $size:literal;)*) => {
        /// ggml tensor types (`enum ggml_type`), including those edgellm cannot run, so that
        /// their files still parse and errors can name them.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[allow(non_camel_case_types)]
        #[repr(u32)]
        pub enum GgmlType { $($v = $id,)* }

        impl GgmlType {
            /// The type for a ggml type id; `None` for ids that ggml does not (or no longer) define.
            pub fn from_id(id: u32) -> Option<GgmlType> {
                match id { $($id => Some(GgmlType::$v),)* _ => None }
            }

            /// ggml's name (`"Q4_0"`, as llama.cpp prints it).
            pub fn name(self) -> &'static str {
                match self { $(GgmlType::$v => $name,)* }
            }

            /// Values per block (1 for plain float/int types).
            pub fn block_len(self) -> u64 {
                match self { $(GgmlType::$v => $blck,)* }
            }

            /// Bytes per block.
            pub fn block_bytes(self) -> u64 {
                match self { $(GgmlType::$v => $size,)* }
            }

            /// Every known type.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$v,)*];
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2_K = 10, "Q2_K", 256, 84;
    Q3_K = 11, "Q3_K", 256, 110;
    Q4_K = 12, "Q4_K", 256, 144;
    Q5_K = 13, "Q5_K", 256, 176;
    Q6_K = 14, "Q6_K", 256, 210;
    Q8_K = 15, "Q8_K", 256, 292;
    IQ2_XXS = 16, "IQ2_XXS", 256, 66;
    IQ2_XS = 17, "IQ2_XS", 256, 74;
    IQ3_XXS = 18, "IQ3_XXS", 256, 98;
    IQ1_S = 19, "IQ1_S", 256, 50;
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    IQ3_S = 21, "IQ3_S", 256, 110;
    IQ2_S = 22, "IQ2_S", 256, 82;
    IQ4_XS = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", 256, 56;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", 256, 54;
    TQ2_0 = 35, "TQ2_0", 256, 66;
    MXFP4 = 39, "MXFP4", 32, 17;
}

impl GgmlType {
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Whether edgellm's kernels run this type (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
    /// Q5_K, Q6_K: the formats of the Q4_K_M and Q5_K_M files people download).
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            GgmlType::F32
                | GgmlType::F16
                | GgmlType::Q4_0
                | GgmlType::Q4_1
                | GgmlType::Q8_0
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q4_K
                | GgmlType::Q5_K
                | GgmlType::Q6_K
        )
    }

    /// Bytes of `n` values of this type, `None` if `n` is not a whole number of blocks or the
    /// size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_len()) {
            return None;
        }
        (n / self.block_len()).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One tensor's entry in the GGUF header, checked: its byte range lies inside the data section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (contiguous), `dims[1]` the number of rows.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Number of values (product of the dims).
    pub fn n_elements(&self) -> u64 {
        // Checked when parsed; cannot overflow.
        self.dims.iter().product()
    }

    /// Row length (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Shape as `[576, 49152]`.
    pub fn shape_string(&self) -> String {
        format!("{:?}", self.dims)
    }
}

/// Element types a tensor's bytes can be viewed as, without a copy: `f32`, `f16`, and the
/// block formats `BlockQ4_0`, `BlockQ4_1`, `BlockQ8_0`.
pub trait TensorElement: bytemuck::Pod + sealed::Sealed {
    /// The ggml type whose data is a sequence of `Self`.
    const GGML_TYPE: GgmlType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $g:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl TensorElement for $t {
            const GGML_TYPE: GgmlType = GgmlType::$g;
        }
    )*};
}
element!(
    f32 => F32, f16 => F16, BlockQ4_0 => Q4_0, BlockQ4_1 => Q4_1, BlockQ8_0 => Q8_0,
    BlockQ5_0 => Q5_0, BlockQ5_1 => Q5_1, BlockQ4K => Q4_K, BlockQ5K => Q5_K, BlockQ6K => Q6_K
);

/// Views `bytes` (the data of tensor `info`) as `&[T]` after checking type, length and
/// alignment.
pub fn cast_tensor<'a, T: TensorElement>(info: &TensorInfo, bytes: &'a [u8]) -> Result<&'a [T]> {
    check_runnable(info)?;
    if info.ty != T::GGML_TYPE {
        return Err(GgufError::TypeMismatch {
            name: info.name.clone(),
            expected: T::GGML_TYPE.name().to_string(),
            found: info.ty.name().to_string(),
        });
    }
    bytemuck::try_cast_slice(bytes).map_err(|e| GgufError::BadTensor {
        name: info.name.clone(),
        message: format!(
            "data cannot be viewed as {} ({e:?}: {} bytes at address {:#x}, alignment {} needed)",
            T::GGML_TYPE,
            bytes.len(),
            bytes.as_ptr() as usize,
            std::mem::align_of::<T>()
        ),
    })
}

/// Fails with [`GgufError::UnsupportedType`] if edgellm cannot run the tensor's type.
pub fn check_runnable(info: &TensorInfo) -> Result<()> {
    if info.ty.is_supported() {
        Ok(())
    } else {
        Err(GgufError::UnsupportedType {
            name: info.name.clone(),
            ty: info.ty.name().to_string(),
        })
    }
}

/// A tensor's data viewed according to its type.
#[derive(Clone, Copy, Debug)]
pub enum TensorView<'a> {
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
}

impl<'a> TensorView<'a> {
    /// Views the data of `info` as its own type; errors for types edgellm cannot run.
    pub fn new(info: &TensorInfo, bytes: &'a [u8]) -> Result<TensorView<'a>> {
        check_runnable(info)?;
        Ok(match info.ty {
            GgmlType::F32 => TensorView::F32(cast_tensor(info, bytes)?),
            GgmlType::F16 => TensorView::F16(cast_tensor(info, bytes)?),
            GgmlType::Q4_0 => TensorView::Q4_0(cast_tensor(info, bytes)?),
            GgmlType::Q4_1 => TensorView::Q4_1(cast_tensor(info, bytes)?),
            GgmlType::Q8_0 => TensorView::Q8_0(cast_tensor(info, bytes)?),
            GgmlType::Q5_0 => TensorView::Q5_0(cast_tensor(info, bytes)?),
            GgmlType::Q5_1 => TensorView::Q5_1(cast_tensor(info, bytes)?),
            GgmlType::Q4_K => TensorView::Q4K(cast_tensor(info, bytes)?),
            GgmlType::Q5_K => TensorView::Q5K(cast_tensor(info, bytes)?),
            GgmlType::Q6_K => TensorView::Q6K(cast_tensor(info, bytes)?),
            _ => unreachable!("check_runnable admits only the types above"),
        })
    }

    pub fn ggml_type(&self) -> GgmlType {
        match self {
            TensorView::F32(_) => GgmlType::F32,
            TensorView::F16(_) => GgmlType::F16,
            TensorView::Q4_0(_) => GgmlType::Q4_0,
            TensorView::Q4_1(_) => GgmlType::Q4_1,
            TensorView::Q8_0(_) => GgmlType::Q8_0,
            TensorView::Q5_0(_) => GgmlType::Q5_0,
            TensorView::Q5_1(_) => GgmlType::Q5_1,
            TensorView::Q4K(_) => GgmlType::Q4_K,
            TensorView::Q5K(_) => GgmlType::Q5_K,
            TensorView::Q6K(_) => GgmlType::Q6_K,
        }
    }

    /// Dequantizes (or converts) the whole view to f32 with the reference kernels.
    pub fn to_f32(&self, out: &mut [f32]) {
        use kernels_neon::reference as r;
        match *self {
            TensorView::F32(x) => out.copy_from_slice(x),
            TensorView::F16(x) => kernels_neon::f16_to_f32_row(x, out),
            TensorView::Q4_0(x) => r::dequantize_row_q4_0(x, out),
            TensorView::Q4_1(x) => r::dequantize_row_q4_1(x, out),
            TensorView::Q8_0(x) => r::dequantize_row_q8_0(x, out),
            TensorView::Q5_0(x) => BlockFormat::dequantize_row(x, out),
            TensorView::Q5_1(x) => BlockFormat::dequantize_row(x, out),
            TensorView::Q4K(x) => BlockFormat::dequantize_row(x, out),
            TensorView::Q5K(x) => BlockFormat::dequantize_row(x, out),
            TensorView::Q6K(x) => BlockFormat::dequantize_row(x, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: GgmlType, dims: &[u64]) -> TensorInfo {
        let n: u64 = dims.iter().product();
        TensorInfo {
            name: "t".into(),
            dims: dims.to_vec(),
            ty,
            offset: 0,
            size: ty.bytes_for(n).unwrap(),
        }
    }

    #[test]
    fn type_table_matches_ggml() {
        assert_eq!(GgmlType::Q4_0.bytes_for(64), Some(36));
        assert_eq!(GgmlType::Q4_0.bytes_for(33), None);
        assert_eq!(GgmlType::Q6_K.bytes_for(256), Some(210));
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(30), Some(GgmlType::BF16));
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(*t));
        }
        use kernels_neon::BlockFormat;
        assert_eq!(GgmlType::Q4_0.id(), <BlockQ4_0 as BlockFormat>::GGML_TYPE);
        assert_eq!(GgmlType::Q4_1.id(), <BlockQ4_1 as BlockFormat>::GGML_TYPE);
        assert_eq!(GgmlType::Q8_0.id(), <BlockQ8_0 as BlockFormat>::GGML_TYPE);
        assert_eq!(
            GgmlType::Q8_0.block_bytes() as usize,
            size_of::<BlockQ8_0>()
        );
        assert_eq!(
            GgmlType::Q4_1.block_bytes() as usize,
            size_of::<BlockQ4_1>()
        );
    }

    #[test]
    fn views_check_type_and_alignment() {
        let buf = vec![0u32; 64]; // 4-aligned storage
        let bytes: &[u8] = bytemuck::cast_slice(&buf);
        let i = info(GgmlType::Q4_0, &[32, 2]);
        let v: &[BlockQ4_0] = cast_tensor(&i, &bytes[..36]).unwrap();
        assert_eq!(v.len(), 2);
        let e = cast_tensor::<BlockQ8_0>(&i, &bytes[..36])
            .unwrap_err()
            .to_string();
        assert_eq!(e, "tensor 't' has type Q4_0, asked for Q8_0");
        let f = info(GgmlType::F32, &[4]);
        let e = cast_tensor::<f32>(&f, &bytes[1..17])
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be viewed as F32"), "{e}");
        let k = info(GgmlType::Q2_K, &[256]);
        let e = TensorView::new(&k, &bytes[..84]).unwrap_err().to_string();
        assert!(
            e.contains("'t' has type Q2_K") && e.contains("edgellm quantize"),
            "{e}"
        );
        // The K-quants edgellm runs view as their blocks.
        let k = info(GgmlType::Q4_K, &[256]);
        let v = TensorView::new(&k, &bytes[..144]).unwrap();
        assert!(matches!(v, TensorView::Q4K(b) if b.len() == 1), "{v:?}");
    }
}
