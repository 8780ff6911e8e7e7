//! edgellm: an offline LLM appliance for ARM SoCs.
//!
//! # Layers
//!
//! Bottom up; a layer may use the layers below it and never one above (an arrow never points
//! up), so each can be built and tested without what sits on it:
//!
//! | layer | what | may use |
//! |---|---|---|
//! | `kernels_neon` (crate) | block formats, scalar references, SIMD kernels, dispatch | nothing of ours |
//! | [`gguf`] | mmapped, bounds-checked model files; writer | `kernels_neon` |
//! | [`kv`], [`tokenizer`], [`quantize`] | KV cache and its snapshots; tokenizers and chat templates; requantization | `gguf`, `kernels_neon` |
//! | [`runtime`] | thread pool, per-op profiler | nothing of ours but `kernels_neon` |
//! | [`eval`] | perplexity and KL-divergence arithmetic; saved reference logits | nothing of ours |
//! | [`board`] | board profiles (compiled in), detecting the board from `/proc` and `/sys` | nothing of ours but `kernels_neon` |
//! | [`model`] | hyper-parameters, weight views, the forward pass | all of the above |
//! | [`engine`] | sessions, sampler, generate loop, session store | `model` and below |
//! | [`service`] | requests and events, prompt rules, the worker that owns an engine, its queue | `engine` and below |
//! | [`audit`] | the hash-chained record of every answer, its check and its replay | `service` and below |
//! | front ends ([`mqtt`], [`serial`]) | translate bytes to requests and events back | `service` and below |
//! | [`daemon`], CLI (`src/cli/`, the binary) | configuration, wiring, subcommands | anything |
//!
//! `kv` and `tokenizer` are side by side: neither uses the other; nor do `runtime` and `board`,
//! which only the daemon and the CLI use. Code that joins two layers
//! lives in the upper one (so `kv::Geometry::of`, the shape of a model's cache, is defined in
//! `model`).

pub mod audit;
pub mod board;
pub mod daemon;
pub mod engine;
pub mod eval;
pub mod gguf;
pub mod kv;
pub mod model;
pub mod mqtt;
pub mod quantize;
pub mod runtime;
pub mod serial;
pub mod service;
pub mod tokenizer;
