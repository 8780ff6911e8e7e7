//! aarch64 NEON: base (ARMv8.0), dotprod (`sdot`), i8mm (`smmla`).

use crate::dispatch::{Kernels, Path, REFERENCE};

pub(crate) const NEON: Kernels = Kernels { path: Path::Neon, ..REFERENCE };
pub(crate) const DOTPROD: Kernels = Kernels { path: Path::Dotprod, ..NEON };
pub(crate) const I8MM: Kernels = Kernels { path: Path::I8mm, ..DOTPROD };
