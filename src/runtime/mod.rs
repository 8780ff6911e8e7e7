//! What the forward pass runs on, below the model: the persistent thread pool that splits a
//! matrix product by rows, and the per-op profiler whose fixed table lives in the arena.
//!
//! Used by `model` (the forward pass) and `engine` (which owns the pool and exposes the
//! profile); uses nothing of ours but `kernels_neon`, so either can be tested on its own.

pub mod pool;
pub mod profile;

pub use pool::{MAX_THREADS, Pool};
pub use profile::{Op, OpStat, Profile};
