//! A loaded model: hyper-parameters, typed weight views into the mapped GGUF file, tokenizer
//! and chat template. Immutable after load and `Send + Sync`, so sessions share it in an `Arc`.

pub mod forward;
pub mod golden;
mod hparams;
pub mod matrix;
mod packed;
pub mod synth;

pub use hparams::{FfnAct, HParams, RopeType, SlidingWindow};
use matrix::Mat;
pub use packed::{HUGEPAGES_ENV, PACK_K_ENV, Packed, advise_huge_pages};

use crate::gguf::{GgmlType, Gguf, GgufError, OpenOptions, TensorInfo, TensorView};
use crate::kv::{Geometry, KvType};
use crate::tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use std::path::Path;

/// Errors of model loading.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "architecture '{0}' is not supported (edgellm runs {runs} graphs)",
        runs = hparams::supported_arches()
    )]
    UnsupportedArch(String),
    #[error("metadata '{key}' = {value}: {why}")]
    BadHParam {
        key: String,
        value: String,
        why: String,
    },
    #[error("tensor '{name}' is missing")]
    MissingTensor { name: String },
    #[error("tensor '{name}' has shape {found}, expected {expected}")]
    BadShape {
        name: String,
        expected: String,
        found: String,
    },
    #[error("tensor '{name}' is {ty}, which cannot be {role}")]
    BadType {
        name: String,
        ty: String,
        role: &'static str,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// Any of the above, for a named file (the loader's own errors already name it).
    #[error("{path}: {source}")]
    InFile {
        path: String,
        source: Box<ModelError>,
    },
}

/// A tensor resolved at load: its index in the file's tensor table and its matrix shape.
#[derive(Clone, Copy, Debug)]
struct TensorRef {
    index: usize,
    rows: usize,
    cols: usize,
}

struct LayerRefs {
    attn_norm: TensorRef,
    wq: TensorRef,
    wk: TensorRef,
    wv: TensorRef,
    bq: Option<TensorRef>,
    bk: Option<TensorRef>,
    bv: Option<TensorRef>,
    wo: TensorRef,
    ffn_norm: TensorRef,
    w_gate: TensorRef,
    w_up: TensorRef,
    w_down: TensorRef,
    /// Gemma: per-head q/k norms ([head_dim]) and the norms of the block outputs ([d]).
    q_norm: Option<TensorRef>,
    k_norm: Option<TensorRef>,
    post_attn_norm: Option<TensorRef>,
    post_ffn_norm: Option<TensorRef>,
}

/// One layer's weights, viewed in place.
pub struct LayerWeights<'a> {
    pub attn_norm: &'a [f32],
    pub wq: Mat<'a>,
    pub wk: Mat<'a>,
    pub wv: Mat<'a>,
    pub bq: Option<&'a [f32]>,
    pub bk: Option<&'a [f32]>,
    pub bv: Option<&'a [f32]>,
    pub wo: Mat<'a>,
    pub ffn_norm: &'a [f32],
    pub w_gate: Mat<'a>,
    pub w_up: Mat<'a>,
    pub w_down: Mat<'a>,
    /// Present iff [`HParams::qk_norm`].
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    /// Present iff [`HParams::post_norms`].
    pub post_attn_norm: Option<&'a [f32]>,
    pub post_ffn_norm: Option<&'a [f32]>,
    /// q, k and v as one matrix (their rows in turn), when they were packed side by side.
    pub qkv: Option<Mat<'a>>,
    /// gate and up as one matrix, likewise.
    pub gate_up: Option<Mat<'a>>,
}

/// A model ready to run.
pub struct Model {
    gguf: Gguf,
    pub hp: HParams,
    pub tokenizer: Tokenizer,
    tok_embd: TensorRef,
    output_norm: TensorRef,
    output: TensorRef,
    layers: Vec<LayerRefs>,
    /// [`Model::fingerprint`], computed on first use (runs without snapshots never pay for it).
    fingerprint: std::sync::OnceLock<[u8; 32]>,
    /// The matrices in the kernels' interleaved layout, made by the first engine whose kernel
    /// path has products over it ([`Model::pack`]).
    packed: std::sync::OnceLock<Packed>,
    /// Copies of the norm and bias vectors, by tensor index (a few KB each). Read from the
    /// mapping, each would fault in the 64 KB around it (fault-around) after [`Model::pack`]
    /// dropped the file's pages: ~4 MB of RAM for SmolLM2's 61 norms.
    vectors: Vec<Option<Box<[f32]>>>,
}

/// How to open the model file.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Lock the weights in RAM (`mlock`): no page-out mid-answer.
    pub mlock: bool,
}

// Here rather than in `kv`: the cache sits below the model and knows nothing of it.
impl Geometry {
    /// The shape of `model`'s cache with `n_ctx` positions of `dtype`.
    pub fn of(model: &Model, n_ctx: usize, dtype: KvType) -> Geometry {
        Geometry {
            fingerprint: model.fingerprint(),
            n_layer: model.hp.n_layer as u32,
            kv_dim: model.hp.kv_dim() as u32,
            dtype,
            n_ctx: n_ctx as u32,
            window: model.hp.kv_window(),
            version: crate::kv::snapshot::VERSION,
        }
    }
}

impl Model {
    /// Maps and checks a GGUF model: every tensor the graph needs exists with the right shape
    /// and a type the kernels run.
    pub fn load(path: &Path, opts: &LoadOptions) -> Result<Model, ModelError> {
        let gguf = Gguf::open(path, &OpenOptions::new().mlock(opts.mlock))?;
        Model::from_gguf(gguf).map_err(|e| match e {
            ModelError::Gguf(_) => e,
            other => ModelError::InFile {
                path: path.display().to_string(),
                source: Box::new(other),
            },
        })
    }

    /// Builds a model over an already opened file.
    pub fn from_gguf(gguf: Gguf) -> Result<Model, ModelError> {
        let n_vocab = gguf.metadata().get_array("tokenizer.ggml.tokens")?.len();
        let hp = HParams::from_metadata(gguf.metadata(), n_vocab)?;
        let find = |name: &str| -> Result<(usize, &TensorInfo), ModelError> {
            gguf.tensors()
                .iter()
                .enumerate()
                .find(|(_, t)| t.name == name)
                .ok_or_else(|| ModelError::MissingTensor {
                    name: name.to_string(),
                })
        };
        let vector = |name: &str, len: usize| -> Result<TensorRef, ModelError> {
            let (index, t) = find(name)?;
            if t.ty != GgmlType::F32 {
                return Err(ModelError::BadType {
                    name: name.into(),
                    ty: t.ty.name().into(),
                    role: "a norm or bias vector (F32 only)",
                });
            }
            if t.n_elements() != len as u64 {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    expected: format!("[{len}]"),
                    found: t.shape_string(),
                });
            }
            Ok(TensorRef {
                index,
                rows: 1,
                cols: len,
            })
        };
        let matrix = |name: &str, cols: usize, rows: usize| -> Result<TensorRef, ModelError> {
            let (index, t) = find(name)?;
            if t.dims.len() != 2 || t.dims[0] != cols as u64 || t.dims[1] != rows as u64 {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    expected: format!("[{cols}, {rows}]"),
                    found: t.shape_string(),
                });
            }
            // Every type the kernels run is a matrix type; the loader's own error names any
            // other and suggests `edgellm quantize`.
            crate::gguf::tensor::check_runnable(t)?;
            // A row is whole blocks (32 values, 256 for the K-quants): the products take an
            // input's blocks in step with a row's.
            let block = t.ty.block_len() as usize;
            if !cols.is_multiple_of(block) {
                return Err(ModelError::BadShape {
                    name: name.into(),
                    expected: format!("rows of whole {block}-value blocks"),
                    found: t.shape_string(),
                });
            }
            Ok(TensorRef { index, rows, cols })
        };
        let opt_vector = |name: &str, len: usize| -> Result<Option<TensorRef>, ModelError> {
            if gguf.get_tensor_info(name).is_some() {
                vector(name, len).map(Some)
            } else {
                Ok(None)
            }
        };

        let (d, qd, kvd, ff, nv) = (hp.n_embd, hp.q_dim(), hp.kv_dim(), hp.n_ff, hp.n_vocab);
        let tok_embd = matrix("token_embd.weight", d, nv)?;
        let output_norm = vector("output_norm.weight", d)?;
        // Tied embeddings (SmolLM2): no output.weight, the embedding matrix is reused.
        let output = if gguf.get_tensor_info("output.weight").is_some() {
            matrix("output.weight", d, nv)?
        } else {
            tok_embd
        };
        let hd = hp.head_dim;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            let n = |s: &str| format!("blk.{l}.{s}");
            // The graph's own norms are required where the architecture has them (and other
            // files' extra tensors ignored, as llama.cpp does).
            let when = |on: bool, name: &str, len: usize| -> Result<_, ModelError> {
                if on {
                    vector(&n(name), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            layers.push(LayerRefs {
                q_norm: when(hp.qk_norm, "attn_q_norm.weight", hd)?,
                k_norm: when(hp.qk_norm, "attn_k_norm.weight", hd)?,
                post_attn_norm: when(hp.post_norms, "post_attention_norm.weight", d)?,
                post_ffn_norm: when(hp.post_norms, "post_ffw_norm.weight", d)?,
                attn_norm: vector(&n("attn_norm.weight"), d)?,
                wq: matrix(&n("attn_q.weight"), d, qd)?,
                wk: matrix(&n("attn_k.weight"), d, kvd)?,
                wv: matrix(&n("attn_v.weight"), d, kvd)?,
                bq: opt_vector(&n("attn_q.bias"), qd)?,
                bk: opt_vector(&n("attn_k.bias"), kvd)?,
                bv: opt_vector(&n("attn_v.bias"), kvd)?,
                wo: matrix(&n("attn_output.weight"), qd, d)?,
                ffn_norm: vector(&n("ffn_norm.weight"), d)?,
                w_gate: matrix(&n("ffn_gate.weight"), d, ff)?,
                w_up: matrix(&n("ffn_up.weight"), d, ff)?,
                w_down: matrix(&n("ffn_down.weight"), ff, d)?,
            });
        }
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        // The tokenizer holds the vocabulary now; the parsed arrays (~5 MB of small strings for
        // a 49k vocabulary) would only double it in RAM for the life of the process.
        let mut gguf = gguf;
        for key in VOCAB_ARRAYS {
            gguf.metadata_mut().remove(key);
        }
        let model = Model {
            gguf,
            hp,
            tokenizer,
            tok_embd,
            output_norm,
            output,
            layers,
            fingerprint: std::sync::OnceLock::new(),
            packed: std::sync::OnceLock::new(),
            vectors: Vec::new(),
        };
        // View every tensor once now, so that later views cannot fail (alignment, length).
        for t in model.all_refs() {
            model.view(t)?;
        }
        let mut vectors = vec![None; model.gguf.tensors().len()];
        for t in model.all_refs().filter(|t| t.rows == 1) {
            if let Ok(TensorView::F32(v)) = model.view(t) {
                vectors[t.index] = Some(v.into());
            }
        }
        let mut model = model;
        model.vectors = vectors;
        // The fingerprint is the last reader of the metadata bytes: take it now, then let the
        // kernel have those pages back.
        model.fingerprint();
        model.gguf.release_header_pages();
        Ok(model)
    }

    fn all_refs(&self) -> impl Iterator<Item = TensorRef> + '_ {
        let globals = [self.tok_embd, self.output_norm, self.output];
        let per_layer = self.layers.iter().flat_map(|l| {
            [
                l.attn_norm,
                l.wq,
                l.wk,
                l.wv,
                l.wo,
                l.ffn_norm,
                l.w_gate,
                l.w_up,
                l.w_down,
            ]
            .into_iter()
            .chain(
                [
                    l.bq,
                    l.bk,
                    l.bv,
                    l.q_norm,
                    l.k_norm,
                    l.post_attn_norm,
                    l.post_ffn_norm,
                ]
                .into_iter()
                .flatten(),
            )
        });
        globals.into_iter().chain(per_layer)
    }

    fn view(&self, t: TensorRef) -> Result<TensorView<'_>, GgufError> {
        let info = &self.gguf.tensors()[t.index];
        TensorView::new(info, self.gguf.tensor_data(info))
    }

    fn mat(&self, t: TensorRef) -> Mat<'_> {
        self.mat_in(t, None)
    }

    /// Tensor `t` as a matrix: from `packed` if it holds it, else from the file.
    fn mat_in<'a>(&'a self, t: TensorRef, packed: Option<&'a Packed>) -> Mat<'a> {
        let data = match packed.and_then(|p| p.data(t.index)) {
            Some(d) => d,
            None => self
                .view(t)
                .expect("every tensor was viewed successfully at load")
                .into(),
        };
        Mat {
            rows: t.rows,
            cols: t.cols,
            data,
        }
    }

    /// Packs the weight matrices into the kernels' interleaved layout (once; later calls
    /// return at once), in the order the forward pass reads them, and drops the file's pages of
    /// the tensor data from RAM. Not done for a model opened with `mlock` (see `packed.rs`).
    /// `threads` threads share the work. Not done either when the packed copy would not fit
    /// comfortably in the memory available (see `packed::fits`). Returns whether packed
    /// weights exist.
    pub fn pack(&self, threads: usize) -> bool {
        self.pack_within(threads, packed::mem_available())
    }

    /// [`Model::pack`], only the matrices whose packed products `k` has (nothing when it has
    /// none; the first engine to pack a shared model decides).
    pub fn pack_for(&self, k: &kernels_neon::Kernels, threads: usize) -> bool {
        let formats = packed::Formats::of(k);
        formats.any() && self.pack_within_formats(threads, packed::mem_available(), formats)
    }

    /// [`Model::pack`] with the memory available given (`None`: unknown, pack anyway).
    pub fn pack_within(&self, threads: usize, available: Option<u64>) -> bool {
        self.pack_within_formats(threads, available, packed::Formats::ALL)
    }

    fn pack_within_formats(
        &self,
        threads: usize,
        available: Option<u64>,
        formats: packed::Formats,
    ) -> bool {
        if self.gguf.is_locked() {
            return false;
        }
        let mut mats = Vec::with_capacity(self.layers.len() * 7 + 1);
        for r in &self.layers {
            for t in [r.wq, r.wk, r.wv, r.wo, r.w_gate, r.w_up, r.w_down] {
                mats.push((t.index, self.mat(t)));
            }
        }
        mats.push((self.output.index, self.mat(self.output)));
        let want = packed::packed_bytes(&mats, formats);
        // Nothing of these formats to pack: the model stays as it is, for an engine of another
        // path to pack.
        if want == 0 && self.packed.get().is_none() {
            return false;
        }
        let p = self.packed.get_or_init(|| {
            let t0 = std::time::Instant::now();
            // The packed copy is anonymous memory, which (without swap) the kernel cannot evict
            // as it can the file's pages: a model too big for the RAM left runs from the file.
            if let Some(avail) = available
                && !packed::fits(want, avail)
            {
                tracing::info!(
                    "weights not packed: {:.0} MiB would not fit comfortably in the {:.0} MiB \
                     of memory available; running from the file's layout (slower decoding)",
                    want as f64 / (1 << 20) as f64,
                    avail as f64 / (1 << 20) as f64
                );
                return Packed::default();
            }
            let p = Packed::build(self.gguf.tensors().len(), &mats, formats, threads, &|b| {
                self.gguf.release_bytes(b)
            });
            // What the page-aligned steps left at the edges of the pieces.
            self.gguf.release_tensor_data_pages();
            let (n, bytes) = p.stats();
            tracing::debug!(
                "packed {n} weight matrices ({:.1} MiB) on {threads} thread(s) in {:.0} ms",
                bytes as f64 / (1 << 20) as f64,
                t0.elapsed().as_secs_f64() * 1e3
            );
            p
        });
        p.stats().0 > 0
    }

    /// The packed weights, if [`Model::pack`] made them.
    pub fn packed(&self) -> Option<&Packed> {
        self.packed.get()
    }

    fn vec(&self, t: TensorRef) -> &[f32] {
        match self.vectors.get(t.index) {
            Some(Some(v)) => v,
            _ => unreachable!("vectors are checked to be F32 and copied at load"),
        }
    }

    /// The model's own chat template (`tokenizer.chat_template`), compiled; for a file without
    /// one, the built-in template of its family where there is one (Gemma's).
    pub fn chat_template(&self) -> Result<ChatTemplate, TokenizerError> {
        match ChatTemplate::from_gguf(&self.gguf, &self.tokenizer) {
            Err(TokenizerError::NoChatTemplate) => {
                let name = crate::tokenizer::built_in_for(&self.hp.arch)
                    .ok_or(TokenizerError::NoChatTemplate)?;
                Ok(ChatTemplate::built_in(name, &self.tokenizer)?
                    .with_origin(format!("built-in '{name}' (the model file has none)")))
            }
            other => other,
        }
    }

    /// SHA-256 of the GGUF header, metadata and tensor table (every byte before the tensor
    /// data) and of the first 256 bytes of every tensor: another model, quantization or
    /// tokenizer gives another fingerprint. KV snapshots carry it so that one model's cache is
    /// never loaded into another. Computed once, on first use.
    pub fn fingerprint(&self) -> [u8; 32] {
        *self.fingerprint.get_or_init(|| fingerprint_of(&self.gguf))
    }

    /// The underlying file (metadata for the tokenizer, tensor table for `inspect`).
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn tok_embd(&self) -> Mat<'_> {
        self.mat(self.tok_embd)
    }
    /// [`Model::tok_embd`], packed if `packed` holds it (tied embeddings).
    pub fn tok_embd_in<'a>(&'a self, packed: Option<&'a Packed>) -> Mat<'a> {
        self.mat_in(self.tok_embd, packed)
    }
    /// [`Model::output`], packed if `packed` holds it.
    pub fn output_in<'a>(&'a self, packed: Option<&'a Packed>) -> Mat<'a> {
        self.mat_in(self.output, packed)
    }
    pub fn output_norm(&self) -> &[f32] {
        self.vec(self.output_norm)
    }
    pub fn output(&self) -> Mat<'_> {
        self.mat(self.output)
    }

    /// Layer `l`'s weights (no allocation: views into the mapping).
    pub fn layer(&self, l: usize) -> LayerWeights<'_> {
        self.layer_in(l, None)
    }

    /// Layer `l`'s weights, the matrices from `packed` where it holds them.
    pub fn layer_in<'a>(&'a self, l: usize, packed: Option<&'a Packed>) -> LayerWeights<'a> {
        let r = &self.layers[l];
        let mat = |t| self.mat_in(t, packed);
        let fused = |ts: &[TensorRef]| {
            let indices: [usize; 3] = std::array::from_fn(|i| ts[i.min(ts.len() - 1)].index);
            packed?.span(&indices[..ts.len()]).map(|data| Mat {
                rows: ts.iter().map(|t| t.rows).sum(),
                cols: ts[0].cols,
                data,
            })
        };
        LayerWeights {
            qkv: fused(&[r.wq, r.wk, r.wv]),
            gate_up: fused(&[r.w_gate, r.w_up]),
            attn_norm: self.vec(r.attn_norm),
            wq: mat(r.wq),
            wk: mat(r.wk),
            wv: mat(r.wv),
            bq: r.bq.map(|t| self.vec(t)),
            bk: r.bk.map(|t| self.vec(t)),
            bv: r.bv.map(|t| self.vec(t)),
            wo: mat(r.wo),
            ffn_norm: self.vec(r.ffn_norm),
            w_gate: mat(r.w_gate),
            w_up: mat(r.w_up),
            w_down: mat(r.w_down),
            q_norm: r.q_norm.map(|t| self.vec(t)),
            k_norm: r.k_norm.map(|t| self.vec(t)),
            post_attn_norm: r.post_attn_norm.map(|t| self.vec(t)),
            post_ffn_norm: r.post_ffn_norm.map(|t| self.vec(t)),
        }
    }

    /// Bytes of weights one token streams (every matrix once; the embedding row aside).
    pub fn weight_bytes_per_token(&self) -> usize {
        let per_layer: usize = (0..self.hp.n_layer)
            .map(|l| {
                let w = self.layer(l);
                [w.wq, w.wk, w.wv, w.wo, w.w_gate, w.w_up, w.w_down]
                    .iter()
                    .map(|m| m.bytes())
                    .sum::<usize>()
            })
            .sum();
        per_layer + self.output().bytes()
    }
}

/// Metadata arrays that [`Tokenizer::from_gguf`] consumes and [`Model::from_gguf`] drops.
const VOCAB_ARRAYS: [&str; 4] = [
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
];

fn fingerprint_of(gguf: &Gguf) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let bytes = gguf.bytes();
    let end = usize::try_from(gguf.data_offset()).map_or(bytes.len(), |d| d.min(bytes.len()));
    let mut h = Sha256::new();
    h.update(&bytes[..end]);
    // Two files with the same metadata and tensor table but other weights (a retrained or
    // re-quantized model exported with the same keys): a sample of every tensor tells them
    // apart, at the cost of one page read per tensor.
    for t in gguf.tensors() {
        let data = gguf.tensor_data(t);
        h.update(&data[..data.len().min(FINGERPRINT_SAMPLE)]);
    }
    h.finalize().into()
}

/// Bytes of each tensor's data hashed into [`Model::fingerprint`].
const FINGERPRINT_SAMPLE: usize = 256;

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Model>();
};
