//! x86_64 AVX2 + FMA + F16C.

use crate::dispatch::{Kernels, Path, REFERENCE};

pub(crate) const AVX2: Kernels = Kernels { path: Path::Avx2, ..REFERENCE };
