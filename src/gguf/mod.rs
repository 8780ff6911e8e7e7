//! GGUF (v2 and v3), the model format of the llama.cpp ecosystem: a memory-mapped, zero-copy
//! reader, and a writer.
//!
//! - [`Gguf::open`] maps a file and parses its header; tensors are then viewed in place as
//!   `&[f32]`, `&[f16]`, `&[BlockQ4_0]`, `&[BlockQ4_1]` or `&[BlockQ8_0]` ([`Gguf::tensor`]).
//! - [`Metadata`] holds the key/value pairs with typed getters whose errors name the key
//!   (`get_u32("llama.block_count")`, `get_array_str("tokenizer.ggml.tokens")`, …).
//! - [`reader::parse`] parses from a byte slice (no I/O); every count, length and offset is
//!   checked, so hostile files give a [`GgufError`], never a panic or a huge allocation.
//! - [`GgufWriter`] writes files (tests' synthetic models, `edgellm quantize`).
//!
//! ```no_run
//! use edgellm::gguf::{Gguf, OpenOptions};
//! use kernels_neon::BlockQ4_0;
//! let g = Gguf::open("model.gguf", &OpenOptions::default())?;
//! let n_layer = g.metadata().get_u32("llama.block_count")?;
//! let tokens: &[String] = g.metadata().get_array_str("tokenizer.ggml.tokens")?;
//! let wq: &[BlockQ4_0] = g.tensor("blk.0.attn_q.weight")?;
//! # Ok::<(), edgellm::gguf::GgufError>(())
//! ```

mod error;
mod file;
pub mod metadata;
pub mod reader;
pub mod tensor;
pub mod writer;

pub use error::{GgufError, Result};
pub use file::{AccessHint, Gguf, OpenOptions};
pub use metadata::{Array, Metadata, Value, ValueType};
pub use reader::{Limits, Parsed, parse};
pub use tensor::{GgmlType, TensorElement, TensorInfo, TensorView};
pub use writer::{GgufWriter, Layout};
