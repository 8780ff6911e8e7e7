//! Writes GGUF files: metadata in insertion order, tensor infos, then the aligned data
//! section. Tensor data can be given up front ([`GgufWriter::add_tensor`]) or streamed at write
//! time ([`GgufWriter::add_tensor_info`] + [`GgufWriter::write_with`]), so the quantizer never
//! holds a whole model's output in memory.

use super::error::{GgufError, Result};
use super::metadata::{Array, Metadata, Value};
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, align_up};
use super::tensor::{GgmlType, MAX_DIMS, TensorInfo};
use std::borrow::Cow;
use std::io::{self, Write};
use std::path::Path;

/// Byte offsets of the sections of a written file, for tests that cut or patch files.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// End of magic, version and the two counts (24).
    pub header_end: u64,
    /// End offset of each metadata entry.
    pub metadata_ends: Vec<u64>,
    /// Start offset of each tensor info.
    pub tensor_info_starts: Vec<u64>,
    /// End offset of each tensor info.
    pub tensor_info_ends: Vec<u64>,
    /// Start of the data section.
    pub data_offset: u64,
    /// Total file size.
    pub file_size: u64,
}

/// Builds a GGUF file.
#[derive(Debug)]
pub struct GgufWriter {
    version: u32,
    alignment: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    data: Vec<Option<Vec<u8>>>,
    next_offset: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    /// An empty version-3 file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Metadata::new(),
            tensors: Vec::new(),
            data: Vec::new(),
            next_offset: 0,
        }
    }

    /// Sets the version written in the header (2 or 3, which share one layout; tests may
    /// write others on purpose).
    pub fn set_version(&mut self, version: u32) -> &mut Self {
        self.version = version;
        self
    }

    /// Sets the data alignment and the `general.alignment` key. Call before adding tensors.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self> {
        if !alignment.is_power_of_two() {
            return Err(GgufError::invalid(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        if !self.tensors.is_empty() {
            return Err(GgufError::invalid("set_alignment after tensors were added"));
        }
        self.alignment = alignment.into();
        self.metadata.set(ALIGNMENT_KEY, Value::U32(alignment));
        Ok(self)
    }

    /// Sets a metadata key (replacing in place if present).
    pub fn set(&mut self, key: &str, value: Value) -> &mut Self {
        if let (ALIGNMENT_KEY, Value::U32(a)) = (key, &value)
            && a.is_power_of_two()
            && self.tensors.is_empty()
        {
            self.alignment = (*a).into();
        }
        self.metadata.set(key, value);
        self
    }

    pub fn set_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.set(key, Value::String(v.to_string()))
    }

    pub fn set_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.set(key, Value::U32(v))
    }

    pub fn set_f32(&mut self, key: &str, v: f32) -> &mut Self {
        self.set(key, Value::F32(v))
    }

    pub fn set_array(&mut self, key: &str, v: Array) -> &mut Self {
        self.set(key, Value::Array(v))
    }

    /// Copies every entry of `m` (in its order), e.g. from a file being rewritten. The
    /// alignment of `m`, if any, is taken too.
    pub fn set_all(&mut self, m: &Metadata) -> &mut Self {
        for (k, v) in m.iter() {
            self.set(k, v.clone());
        }
        self
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// Declares a tensor whose data [`GgufWriter::write_with`] will ask for; returns its info.
    pub fn add_tensor_info(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
    ) -> Result<&TensorInfo> {
        let bad = |message: String| GgufError::BadTensor {
            name: name.to_string(),
            message,
        };
        if dims.len() > MAX_DIMS {
            return Err(bad(format!(
                "has {} dimensions (at most {MAX_DIMS})",
                dims.len()
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::DuplicateTensor(name.to_string()));
        }
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        if dims.first().copied().unwrap_or(1) % ty.block_len() != 0 {
            return Err(bad(format!(
                "row length {} is not a multiple of {}",
                dims[0],
                ty.block_len()
            )));
        }
        let size = ty
            .bytes_for(n)
            .ok_or_else(|| bad("size overflows".into()))?;
        let offset = self.next_offset;
        self.next_offset = align_up(offset + size, self.alignment).expect("file under 2^64 bytes");
        self.tensors.push(TensorInfo {
            name: name.to_string(),
            dims: dims.to_vec(),
            ty,
            offset,
            size,
        });
        self.data.push(None);
        Ok(self.tensors.last().expect("just pushed"))
    }

    /// Adds a tensor with its data (`data.len()` must match the type and dims).
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<()> {
        let size = self.add_tensor_info(name, ty, dims)?.size;
        if data.len() as u64 != size {
            self.tensors.pop();
            self.data.pop();
            self.next_offset = self.tensors.last().map_or(0, |t| {
                align_up(t.offset + t.size, self.alignment).expect("fits")
            });
            return Err(GgufError::BadTensor {
                name: name.to_string(),
                message: format!("data is {} bytes, {ty} {dims:?} needs {size}", data.len()),
            });
        }
        *self.data.last_mut().expect("just pushed") = Some(data);
        Ok(())
    }

    /// Adds an F32 tensor.
    pub fn add_f32(&mut self, name: &str, dims: &[u64], values: &[f32]) -> Result<()> {
        self.add_tensor(
            name,
            GgmlType::F32,
            dims,
            bytemuck::cast_slice(values).to_vec(),
        )
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// Writes the file; tensors added without data get theirs from `data_for(index, info)`.
    pub fn write_with<'d, W: Write>(
        &self,
        mut w: W,
        mut data_for: impl FnMut(usize, &TensorInfo) -> Result<Cow<'d, [u8]>>,
    ) -> Result<Layout> {
        let mut out = Counting { w: &mut w, n: 0 };
        let mut layout = Layout::default();
        out.write_all(&MAGIC)?;
        out.write_all(&self.version.to_le_bytes())?;
        out.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        out.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        layout.header_end = out.n;
        for (k, v) in self.metadata.iter() {
            write_str(&mut out, k)?;
            out.write_all(&(v.value_type() as u32).to_le_bytes())?;
            write_value(&mut out, v)?;
            layout.metadata_ends.push(out.n);
        }
        for t in &self.tensors {
            layout.tensor_info_starts.push(out.n);
            write_str(&mut out, &t.name)?;
            out.write_all(&(t.dims.len() as u32).to_le_bytes())?;
            for d in &t.dims {
                out.write_all(&d.to_le_bytes())?;
            }
            out.write_all(&t.ty.id().to_le_bytes())?;
            out.write_all(&t.offset.to_le_bytes())?;
            layout.tensor_info_ends.push(out.n);
        }
        layout.data_offset = align_up(out.n, self.alignment).expect("small header");
        pad_to(&mut out, layout.data_offset)?;
        for (i, t) in self.tensors.iter().enumerate() {
            pad_to(&mut out, layout.data_offset + t.offset)?;
            let bytes = match &self.data[i] {
                Some(d) => Cow::Borrowed(d.as_slice()),
                None => data_for(i, t)?,
            };
            if bytes.len() as u64 != t.size {
                return Err(GgufError::BadTensor {
                    name: t.name.clone(),
                    message: format!("data is {} bytes, needs {}", bytes.len(), t.size),
                });
            }
            out.write_all(&bytes)?;
        }
        // Pad the last tensor too, as ggml's writer does.
        let end = align_up(out.n, self.alignment).expect("fits");
        if !self.tensors.is_empty() {
            pad_to(&mut out, end)?;
        }
        layout.file_size = out.n;
        out.flush()?;
        Ok(layout)
    }

    /// Writes the file; every tensor must have been added with its data.
    pub fn write_to<W: Write>(&self, w: W) -> Result<Layout> {
        self.write_with(w, |_, t| {
            Err(GgufError::BadTensor {
                name: t.name.clone(),
                message: "has no data".into(),
            })
        })
    }

    /// The file as bytes, with its layout.
    pub fn to_bytes_with_layout(&self) -> Result<(Vec<u8>, Layout)> {
        let mut v = Vec::new();
        let layout = self.write_to(&mut v)?;
        Ok((v, layout))
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(self.to_bytes_with_layout()?.0)
    }

    /// Writes the file to `path` (through a temporary file renamed into place, so a reader
    /// never sees half a file).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<Layout> {
        write_file_atomically(path.as_ref(), |w| self.write_to(w))
    }
}

/// Creates `path` by writing `PATH.tmp` with `f` and renaming it; removes the temporary on error.
pub fn write_file_atomically<T>(
    path: &Path,
    f: impl FnOnce(&mut io::BufWriter<std::fs::File>) -> Result<T>,
) -> Result<T> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let result = (|| {
        let mut w = io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        let r = f(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(r)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(|e: GgufError| e.in_file(path))
}

struct Counting<'a, W: Write> {
    w: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.w.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.w.flush()
    }
}

fn pad_to<W: Write>(out: &mut Counting<'_, W>, to: u64) -> io::Result<()> {
    const ZEROS: [u8; 256] = [0; 256];
    while out.n < to {
        let k = (to - out.n).min(ZEROS.len() as u64) as usize;
        out.write_all(&ZEROS[..k])?;
    }
    Ok(())
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, v: &Value) -> io::Result<()> {
    match v {
        Value::U8(x) => w.write_all(&x.to_le_bytes()),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
    }
}

fn write_array(w: &mut impl Write, a: &Array) -> io::Result<()> {
    w.write_all(&(a.element_type() as u32).to_le_bytes())?;
    w.write_all(&(a.len() as u64).to_le_bytes())?;
    macro_rules! each {
        ($v:expr) => {{
            for x in $v {
                w.write_all(&x.to_le_bytes())?;
            }
            Ok(())
        }};
    }
    match a {
        Array::U8(v) => w.write_all(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::Bool(v) => each!(v.iter().map(|&b| b as u8)),
        Array::String(v) => {
            for s in v {
                write_str(w, s)?;
            }
            Ok(())
        }
        Array::Array(v) => {
            for inner in v {
                write_array(w, inner)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::reader::parse;

    #[test]
    fn round_trip_metadata_and_tensors() {
        let mut w = GgufWriter::new();
        w.set_str("general.architecture", "llama")
            .set_u32("llama.block_count", 2)
            .set_f32("eps", 1e-5)
            .set("b", Value::Bool(true))
            .set_array(
                "toks",
                Array::String(vec!["a".into(), "".into(), "é".into()]),
            )
            .set_array(
                "nested",
                Array::Array(vec![Array::I32(vec![1, -2]), Array::Array(vec![])]),
            );
        w.add_f32("norm", &[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        w.add_tensor("q", GgmlType::Q4_0, &[32, 2], vec![7; 36])
            .unwrap();
        let (bytes, layout) = w.to_bytes_with_layout().unwrap();
        assert_eq!(layout.file_size as usize, bytes.len());
        assert_eq!(layout.data_offset % 32, 0);
        let p = parse(&bytes).unwrap();
        assert_eq!(p.metadata.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(p.metadata.get_array_str("toks").unwrap(), ["a", "", "é"]);
        assert_eq!(p.metadata.get("nested"), w.metadata().get("nested"));
        assert_eq!(p.tensors, w.tensors());
        assert_eq!(p.data_offset, layout.data_offset);
        let q = &p.tensors[1];
        let start = (p.data_offset + q.offset) as usize;
        assert_eq!(&bytes[start..start + 36], &[7; 36]);
    }

    #[test]
    fn rejects_wrong_sizes_and_duplicates() {
        let mut w = GgufWriter::new();
        assert!(
            w.add_tensor("q", GgmlType::Q4_0, &[32], vec![0; 17])
                .is_err()
        );
        assert!(w.tensors().is_empty());
        w.add_tensor("q", GgmlType::Q4_0, &[32], vec![0; 18])
            .unwrap();
        assert!(matches!(
            w.add_tensor("q", GgmlType::Q4_0, &[32], vec![0; 18]),
            Err(GgufError::DuplicateTensor(_))
        ));
        assert!(w.add_tensor_info("r", GgmlType::Q4_0, &[31]).is_err());
        assert!(w.set_alignment(64).is_err(), "alignment after tensors");
    }
}
