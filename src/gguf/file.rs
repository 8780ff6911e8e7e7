//! [`Gguf`]: a GGUF file mapped read-only into memory, with its parsed header. Tensor data is
//! never copied: views borrow from the mapping, whose pages are shared with the page cache and
//! can be evicted (unless locked with [`OpenOptions::mlock`]).

use super::error::{GgufError, Result};
use super::metadata::Metadata;
use super::reader::{self, Limits, Parsed};
use super::tensor::{TensorElement, TensorInfo, TensorView, cast_tensor};
use memmap2::{Advice, Mmap, MmapOptions};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

/// How the kernel should expect the mapping to be read (`madvise`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AccessHint {
    /// No hint.
    Normal,
    /// Read everything soon: start read-ahead of the whole file (`MADV_WILLNEED`). The default,
    /// as inference reads every weight for every token.
    #[default]
    WillNeed,
    /// Read once front to back (`MADV_SEQUENTIAL`), as `quantize` and hashing do.
    Sequential,
    /// Random access (`MADV_RANDOM`): no read-ahead.
    Random,
}

/// Options of [`Gguf::open`].
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Lock the whole mapping in RAM (`mlock`): weights are read in now and never paged out,
    /// so an answer never stalls on flash. Needs RLIMIT_MEMLOCK (or CAP_IPC_LOCK) for the
    /// file's size; failing that, `open` fails with a message saying so.
    pub mlock: bool,
    /// Pre-fault the pages at map time (`MAP_POPULATE`).
    pub populate: bool,
    /// `madvise` hint for the whole mapping.
    pub hint: AccessHint,
    /// Caps on counts and lengths in the header.
    pub limits: Option<Limits>,
}

impl OpenOptions {
    pub fn new() -> OpenOptions {
        OpenOptions::default()
    }
    pub fn mlock(mut self, yes: bool) -> OpenOptions {
        self.mlock = yes;
        self
    }
    pub fn populate(mut self, yes: bool) -> OpenOptions {
        self.populate = yes;
        self
    }
    pub fn hint(mut self, hint: AccessHint) -> OpenOptions {
        self.hint = hint;
        self
    }
}

enum Storage {
    Mmap(Mmap),
    Bytes(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Bytes(v) => v,
        }
    }
}

/// An open GGUF model file. `Send + Sync`: share it with `Arc<Gguf>`.
pub struct Gguf {
    path: PathBuf,
    storage: Storage,
    parsed: Parsed,
    by_name: HashMap<String, usize>,
    locked: bool,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("path", &self.path)
            .field("version", &self.parsed.version)
            .field("file_size", &self.file_size())
            .field("metadata_entries", &self.parsed.metadata.len())
            .field("tensors", &self.parsed.tensors.len())
            .field("locked", &self.locked)
            .finish()
    }
}

impl Gguf {
    /// Maps and parses the file at `path`. Every error names the file.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Gguf> {
        let path = path.as_ref();
        Self::open_inner(path, opts).map_err(|e| e.in_file(path))
    }

    fn open_inner(path: &Path, opts: &OpenOptions) -> Result<Gguf> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(GgufError::invalid("not a regular file"));
        }
        let len = meta.len();
        if len == 0 {
            // mmap of an empty file fails with EINVAL; say what it is instead.
            return Err(GgufError::Truncated {
                what: "magic".into(),
                offset: 0,
                needed: 4,
                available: 0,
            });
        }
        let mut mo = MmapOptions::new();
        if opts.populate {
            mo.populate();
        }
        // SAFETY: the mapping is read-only and private to this struct. Memory safety of the
        // views relies on the file not being truncated or rewritten while mapped, the same
        // contract as every mmap-based model loader (llama.cpp included); model files are
        // written once (atomically, by rename) and then only read.
        let map = unsafe { mo.map(&file)? };
        let mut g = Gguf::from_storage(path.to_path_buf(), Storage::Mmap(map), opts)?;
        if let Storage::Mmap(m) = &g.storage {
            let advice = match opts.hint {
                AccessHint::Normal => None,
                AccessHint::WillNeed => Some(Advice::WillNeed),
                AccessHint::Sequential => Some(Advice::Sequential),
                AccessHint::Random => Some(Advice::Random),
            };
            if let Some(a) = advice {
                // A hint only: failure (e.g. on a filesystem without read-ahead) is not an error.
                if let Err(e) = m.advise(a) {
                    tracing::debug!("madvise({a:?}) on {}: {e}", path.display());
                }
            }
            if opts.mlock {
                m.lock().map_err(|source| GgufError::Lock {
                    bytes: m.len() as u64,
                    source,
                })?;
                g.locked = true;
            }
        }
        Ok(g)
    }

    /// Parses a file held in memory (tests, or files read from elsewhere). `name` is used in
    /// error messages. Typed views need the vector's data to be suitably aligned, which the
    /// allocator gives for all but tiny vectors; an unaligned view is an error, not UB.
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<Gguf> {
        let name = name.into();
        Gguf::from_storage(name.clone(), Storage::Bytes(bytes), &OpenOptions::default())
            .map_err(|e| e.in_file(name))
    }

    fn from_storage(path: PathBuf, storage: Storage, opts: &OpenOptions) -> Result<Gguf> {
        let limits = opts.limits.unwrap_or_default();
        let parsed = reader::parse_with_limits(storage.bytes(), &limits)?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Gguf {
            path,
            storage,
            parsed,
            by_name,
            locked: false,
        })
    }

    /// The path given to [`Gguf::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.parsed.version
    }

    /// Total bytes of the file.
    pub fn file_size(&self) -> u64 {
        self.storage.bytes().len() as u64
    }

    /// Data alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.parsed.alignment
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.parsed.data_offset
    }

    /// Whether the mapping is locked in RAM.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    pub fn metadata(&self) -> &Metadata {
        &self.parsed.metadata
    }

    /// The metadata, to drop what is no longer needed once parsed into other structures.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.parsed.metadata
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.parsed.tensors
    }

    /// The info of tensor `name`, `None` if absent.
    pub fn get_tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.parsed.tensors[i])
    }

    /// The info of tensor `name`; an error naming the tensor and file if absent.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo> {
        self.get_tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()).in_file(&self.path))
    }

    /// Raw bytes of a tensor (any type, including those edgellm cannot run).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.parsed.data_offset + info.offset) as usize;
        // Checked at parse time to lie inside the file, for every tensor of this file. An info
        // from another file could be out of range: slicing then panics rather than misreads.
        &self.storage.bytes()[start..start + info.size as usize]
    }

    /// Raw bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        Ok(self.tensor_data(self.tensor_info(name)?))
    }

    /// Tensor `name` as `&[T]` (`f32`, `f16`, `BlockQ4_0`, `BlockQ4_1`, `BlockQ8_0`), without a
    /// copy. Fails if the tensor is missing, of another type, of a type edgellm cannot run, or
    /// misaligned.
    pub fn tensor<T: TensorElement>(&self, name: &str) -> Result<&[T]> {
        let info = self.tensor_info(name)?;
        cast_tensor(info, self.tensor_data(info)).map_err(|e| e.in_file(&self.path))
    }

    /// Tensor `name` viewed as its own type.
    pub fn tensor_view(&self, name: &str) -> Result<TensorView<'_>> {
        let info = self.tensor_info(name)?;
        TensorView::new(info, self.tensor_data(info)).map_err(|e| e.in_file(&self.path))
    }

    /// Checks that every tensor is of a type edgellm can run; the first that is not gives an
    /// error naming it (and suggesting `edgellm quantize`).
    pub fn check_all_runnable(&self) -> Result<()> {
        for t in self.tensors() {
            super::tensor::check_runnable(t).map_err(|e| e.in_file(&self.path))?;
        }
        Ok(())
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Drops the mapped pages of the header, metadata and tensor table (everything before the
    /// tensor data, down to a 64 KiB boundary) from this process's resident set, once they
    /// have been parsed: for a 49k-token vocabulary that is ~1.7 MB of RAM for the life of the
    /// process. A later read of those bytes faults them in again from the file.
    pub fn release_header_pages(&self) {
        let Storage::Mmap(m) = &self.storage else {
            return;
        };
        let page = 64 * 1024;
        let end = usize::try_from(self.parsed.data_offset)
            .unwrap_or(0)
            .min(m.len());
        let len = end - end % page;
        if len == 0 {
            return;
        }
        // SAFETY: the mapping is private and read-only; MADV_DONTNEED on it only discards
        // our copies of clean file pages, and a later access reads the same bytes from the
        // file again (the file is not modified while mapped, as for every view of it).
        let r = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, 0, len) };
        if let Err(e) = r {
            tracing::debug!("madvise(DONTNEED) on {}: {e}", self.path.display());
        }
    }

    /// Drops the mapped pages of all tensor data from this process's resident set, once the
    /// model has copied what it needs (weights repacked at load). A later read of a tensor that
    /// was not copied faults its pages in again from the file. Does nothing to a locked
    /// mapping (its pages cannot be dropped) or to a file read into memory.
    pub fn release_tensor_data_pages(&self) {
        let Storage::Mmap(m) = &self.storage else {
            return;
        };
        if self.locked {
            return;
        }
        // The data starts at an alignment (32 bytes by default), not at a page: round up to
        // the next page; the one before it stays resident.
        let page = page_size();
        let start = usize::try_from(self.parsed.data_offset)
            .unwrap_or(usize::MAX)
            .min(m.len())
            .next_multiple_of(page);
        if start >= m.len() {
            return;
        }
        // SAFETY: as in `release_header_pages`: a private, read-only mapping of a file that is
        // not modified while mapped; dropping clean pages only means re-reading them.
        let r = unsafe {
            m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, m.len() - start)
        };
        if let Err(e) = r {
            tracing::debug!("madvise(DONTNEED) on {}: {e}", self.path.display());
        }
    }

    /// Drops the mapped pages that lie wholly inside `bytes` (a piece of [`Gguf::bytes`],
    /// e.g. part of a tensor already copied) from this process's resident set; the pages at
    /// the edges stay. Nothing happens for a locked mapping, a file read into memory or a
    /// slice from elsewhere.
    pub fn release_bytes(&self, bytes: &[u8]) {
        let Storage::Mmap(m) = &self.storage else {
            return;
        };
        let base = m.as_ptr() as usize;
        let start = (bytes.as_ptr() as usize).wrapping_sub(base);
        if self.locked || start > m.len() || bytes.len() > m.len() - start {
            return;
        }
        // The system's page size: 64 KiB steps would keep up to 128 KiB at the edges of each
        // piece, megabytes over a model's 200 matrices.
        let page = page_size();
        let (lo, hi) = (start.next_multiple_of(page), start + bytes.len());
        let hi = hi - hi % page;
        if hi <= lo {
            return;
        }
        // SAFETY: as in `release_header_pages`: a private, read-only mapping of a file that is
        // not modified while mapped; dropping clean pages only means re-reading them.
        let r =
            unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo) };
        if let Err(e) = r {
            tracing::debug!("madvise(DONTNEED) on {}: {e}", self.path.display());
        }
    }

    /// Gives a `madvise` hint for one tensor's pages (e.g. `WillNeed` before a layer runs).
    pub fn advise_tensor(&self, info: &TensorInfo, hint: AccessHint) -> Result<()> {
        let Storage::Mmap(m) = &self.storage else {
            return Ok(());
        };
        let advice = match hint {
            AccessHint::Normal => Advice::Normal,
            AccessHint::WillNeed => Advice::WillNeed,
            AccessHint::Sequential => Advice::Sequential,
            AccessHint::Random => Advice::Random,
        };
        // madvise needs a page-aligned start: widen the range down to a 64 KiB boundary, which
        // is page-aligned for every page size Linux uses (4, 16 and 64 KiB).
        let page = 64 * 1024;
        let start = (self.parsed.data_offset + info.offset) as usize;
        let aligned = start - start % page;
        let len = start + info.size as usize - aligned;
        if len == 0 {
            return Ok(());
        }
        m.advise_range(advice, aligned, len)
            .map_err(|e| GgufError::from(e).in_file(&self.path))
    }
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Gguf>();
};

/// The system's page size, or 64 KiB (page-aligned for every page size Linux uses) if it
/// cannot be read.
fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(64 * 1024)
}
