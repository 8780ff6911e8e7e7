//! edgellm: an offline LLM appliance for ARM SoCs.
//!
//! Layers, bottom up (an arrow never points up): `kernels_neon` (separate crate) →
//! [`gguf`] (mmapped model files) → `model` → `engine` → front ends → CLI/daemon.

pub mod daemon;
pub mod engine;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod mqtt;
pub mod quantize;
pub mod service;
pub mod tokenizer;
