//! One error type for everything GGUF: every message names what it is about (the key, the
//! tensor, the byte offset) so that `edgellm: model.gguf: …` is enough to act on.

use std::path::{Path, PathBuf};

/// Errors of the GGUF reader, writer and tensor views.
///
/// Parsing works on byte slices and does not know the file name; [`crate::gguf::Gguf::open`]
/// wraps its errors in [`GgufError::File`], whose message starts with the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// An error about a file: displays as `path: inner`.
    #[error("{}: {inner}", path.display())]
    File {
        path: PathBuf,
        inner: Box<GgufError>,
    },

    #[error("{0}")]
    Io(#[from] std::io::Error),

    #[error("not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },

    #[error("unsupported GGUF version {0} (edgellm reads versions 2 and 3)")]
    UnsupportedVersion(u32),

    /// The file ends before a field that must be there.
    #[error(
        "truncated file: {what} needs {needed} bytes at offset {offset}, only {available} left"
    )]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    /// A count or length is larger than the cap edgellm puts on it, or than the bytes left.
    #[error("{what} is {value}, more than the limit of {limit}")]
    TooLarge {
        what: String,
        value: u64,
        limit: u64,
    },

    /// A structurally invalid field (bad type id, invalid UTF-8, zero alignment, …).
    #[error("{0}")]
    Invalid(String),

    #[error("metadata key '{0}' appears twice")]
    DuplicateKey(String),

    #[error("tensor '{0}' appears twice")]
    DuplicateTensor(String),

    #[error("metadata key '{0}' is missing")]
    MissingKey(String),

    #[error("metadata key '{key}' is {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: String,
        found: String,
    },

    #[error("metadata key '{key}' = {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },

    #[error("tensor '{0}' not found")]
    MissingTensor(String),

    /// A tensor whose ggml type id is not one edgellm knows at all.
    #[error("tensor '{name}' has unknown ggml type id {id}")]
    UnknownType { name: String, id: u32 },

    /// A known ggml type that edgellm's kernels cannot run (Q2_K, Q3_K, IQ…, BF16).
    #[error(
        "tensor '{name}' has type {ty}, which edgellm cannot run (supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K); \
         convert the model with `edgellm quantize IN OUT q4_0` (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K) \
         or with llama.cpp's `llama-quantize --allow-requantize IN OUT Q4_0`"
    )]
    UnsupportedType { name: String, ty: String },

    /// The tensor is of a supported type but not the one asked for.
    #[error("tensor '{name}' has type {found}, asked for {expected}")]
    TypeMismatch {
        name: String,
        expected: String,
        found: String,
    },

    #[error("tensor '{name}' {message}")]
    BadTensor { name: String, message: String },

    #[error(
        "tensor '{name}' data runs past end of file (offset {offset}, size {size}, file {file_size})"
    )]
    TensorPastEnd {
        name: String,
        offset: u64,
        size: u64,
        file_size: u64,
    },

    #[error("tensors '{a}' and '{b}' overlap (offset {a_offset} size {a_size}, offset {b_offset})")]
    Overlap {
        a: String,
        a_offset: u64,
        a_size: u64,
        b: String,
        b_offset: u64,
    },

    /// `mlock` failed: usually RLIMIT_MEMLOCK.
    #[error(
        "cannot lock {bytes} bytes of model in memory ({source}); raise the limit \
         (`ulimit -l unlimited`, or LimitMEMLOCK=infinity in the systemd unit) or do not lock the model (mlock off)"
    )]
    Lock { bytes: u64, source: std::io::Error },
}

impl GgufError {
    /// Wraps the error with the file it is about (once: an error already naming a file is kept).
    pub fn in_file(self, path: impl AsRef<Path>) -> GgufError {
        match self {
            e @ GgufError::File { .. } => e,
            e => GgufError::File {
                path: path.as_ref().to_path_buf(),
                inner: Box::new(e),
            },
        }
    }

    /// The error without its file wrapper, for matching on the kind.
    pub fn kind(&self) -> &GgufError {
        match self {
            GgufError::File { inner, .. } => inner.kind(),
            e => e,
        }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> GgufError {
        GgufError::Invalid(msg.into())
    }
}

/// Result of GGUF operations.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;
