//! Portable SIMD through `wide`: the path on any target without a hand-written one.

use crate::dispatch::{Kernels, Path, REFERENCE};

pub(crate) const TABLE: Kernels = Kernels { path: Path::Portable, ..REFERENCE };
