//! The KV cache: in RAM as `(layer, position, kv_dim)`, and (later) its snapshots on flash.

mod cache;

pub use cache::{KvCache, KvType};
