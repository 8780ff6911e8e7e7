//! The KV cache in RAM (its layout is stated once, where it is defined: `cache.rs`), and its
//! checksummed, append-only snapshots on flash (`docs/kv-format.md`).

mod cache;
pub mod file;
pub mod snapshot;

pub use cache::{KvCache, KvType};
pub use file::{SaveKind, SnapshotFile};
pub use snapshot::{Geometry, KvError};

impl Geometry {
    /// The shape of `model`'s cache with `n_ctx` positions of `dtype`.
    pub fn of(model: &crate::model::Model, n_ctx: usize, dtype: KvType) -> Geometry {
        Geometry {
            fingerprint: model.fingerprint(),
            n_layer: model.hp.n_layer as u32,
            kv_dim: model.hp.kv_dim() as u32,
            dtype,
            n_ctx: n_ctx as u32,
        }
    }
}
