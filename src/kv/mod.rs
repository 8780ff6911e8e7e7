//! The KV cache in RAM (its layout is stated once, where it is defined: `cache.rs`), and its
//! checksummed, append-only snapshots on flash (`docs/kv-format.md`).

mod cache;
mod elem;
pub mod file;
pub mod snapshot;

pub use cache::{KvCache, KvType, Window, ring_shape};
pub use file::{SaveKind, SnapshotFile};
pub use snapshot::{Geometry, KvError};
