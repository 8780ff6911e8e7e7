//! Parsing of a GGUF file held in memory (an mmap or a byte vector): header, metadata,
//! tensor infos. No I/O here, so tests can feed any byte slice.
//!
//! Every count, length and offset read from the file is checked against a cap and against the
//! bytes left before anything is allocated for it: a hostile file gives an error, never a
//! panic or a huge allocation.

use super::error::{GgufError, Result};
use super::metadata::{Array, Metadata, Value, ValueType};
use super::tensor::{GgmlType, MAX_DIMS, TensorInfo};
use std::collections::HashSet;

/// `"GGUF"`, the first four bytes of every file.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Caps on what a file may declare (beyond the bytes it actually has).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_metadata_entries: u64,
    pub max_key_len: u64,
    pub max_string_len: u64,
    pub max_tensors: u64,
    pub max_tensor_name_len: u64,
    pub max_array_depth: usize,
    pub max_alignment: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_metadata_entries: 1 << 20,
            max_key_len: 65_535,
            max_string_len: 1 << 20,
            max_tensors: 1 << 16,
            max_tensor_name_len: 256,
            max_array_depth: 8,
            max_alignment: 1 << 16,
        }
    }
}

/// What the header of a GGUF file says, checked against the file's length.
#[derive(Clone, Debug)]
pub struct Parsed {
    pub version: u32,
    pub metadata: Metadata,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute offset of the data section (tensor offsets are relative to it).
    pub data_offset: u64,
}

/// Parses `file` (the whole file) with the default [`Limits`].
pub fn parse(file: &[u8]) -> Result<Parsed> {
    parse_with_limits(file, &Limits::default())
}

/// Parses `file` (the whole file).
pub fn parse_with_limits(file: &[u8], limits: &Limits) -> Result<Parsed> {
    let mut c = Cursor { buf: file, pos: 0 };
    let magic = c.take(4, || "magic".into())?;
    if magic != MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.try_into().expect("4 bytes"),
        });
    }
    let version = c.u32(|| "version".into())?;
    if !(2..=3).contains(&version) {
        if matches!(version.swap_bytes(), 2 | 3) {
            return Err(GgufError::invalid(
                "big-endian GGUF file (version bytes are swapped); edgellm reads little-endian files only",
            ));
        }
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64(|| "tensor count".into())?;
    let n_kv = c.u64(|| "metadata count".into())?;
    cap("tensor count", n_tensors, limits.max_tensors)?;
    cap("metadata count", n_kv, limits.max_metadata_entries)?;
    // Smallest metadata entry: key length (8) + type (4) + a one-byte value.
    c.need_at_least(n_kv, 13, "metadata entries")?;

    let mut metadata = Metadata::new();
    for i in 0..n_kv {
        let key = c.string(limits.max_key_len, || format!("metadata entry {i} key"))?;
        let ty = c.value_type(|| format!("metadata '{key}' type"))?;
        let value = c.value(ty, limits, 0, &key)?;
        metadata.insert(key, value)?;
    }

    let alignment = match metadata.get(ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() && u64::from(*a) <= limits.max_alignment => {
            u64::from(*a)
        }
        Some(v) => {
            return Err(GgufError::invalid(format!(
                "metadata '{ALIGNMENT_KEY}' must be a u32 power of two up to {}, found {} {v}",
                limits.max_alignment,
                v.value_type().name()
            )));
        }
    };

    // Smallest tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
    c.need_at_least(n_tensors, 24, "tensor infos")?;
    let mut tensors = Vec::new();
    let mut names = HashSet::new();
    for i in 0..n_tensors {
        let t = c.tensor_info(i, alignment, limits)?;
        if !names.insert(t.name.clone()) {
            return Err(GgufError::DuplicateTensor(t.name));
        }
        tensors.push(t);
    }

    let end_of_infos = c.pos as u64;
    let data_offset = align_up(end_of_infos, alignment)
        .ok_or_else(|| GgufError::invalid("data section offset overflows"))?;
    check_tensor_ranges(&tensors, data_offset, file.len() as u64)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Rounds `x` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    Some(x.checked_add(align - 1)? & !(align - 1))
}

fn cap(what: &str, value: u64, limit: u64) -> Result<()> {
    if value > limit {
        return Err(GgufError::TooLarge {
            what: what.into(),
            value,
            limit,
        });
    }
    Ok(())
}

/// Every tensor's data lies inside the file, and no two tensors share bytes. An empty tensor
/// too must start inside the file (or at its end): its view is the empty slice there.
fn check_tensor_ranges(tensors: &[TensorInfo], data_offset: u64, file_size: u64) -> Result<()> {
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.size));
        if end.is_none_or(|e| e > file_size) {
            return Err(GgufError::TensorPastEnd {
                name: t.name.clone(),
                offset: start.unwrap_or(u64::MAX),
                size: t.size,
                file_size,
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for w in by_offset.windows(2) {
        // Both ranges were checked to end inside the file, so this cannot overflow.
        if w[0].offset + w[0].size > w[1].offset {
            return Err(GgufError::Overlap {
                a: w[0].name.clone(),
                a_offset: data_offset + w[0].offset,
                a_size: w[0].size,
                b: w[1].name.clone(),
                b_offset: data_offset + w[1].offset,
            });
        }
    }
    Ok(())
}

/// A bounds-checked little-endian reader over the file's bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n,
                available: self.left(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit in what is left.
    fn need_at_least(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        let needed = count.saturating_mul(min_size);
        if needed > self.left() {
            return Err(GgufError::Truncated {
                what: format!("{count} {what}"),
                offset: self.pos as u64,
                needed,
                available: self.left(),
            });
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: impl FnOnce() -> String) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, max_len: u64, what: impl Fn() -> String) -> Result<String> {
        let len = self.u64(|| format!("{} length", what()))?;
        if len > max_len {
            return Err(GgufError::TooLarge {
                what: format!("{} length", what()),
                value: len,
                limit: max_len,
            });
        }
        let bytes = self.take(len, &what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| GgufError::invalid(format!("{} is not valid UTF-8 ({e})", what())))
    }

    fn value_type(&mut self, what: impl Fn() -> String) -> Result<ValueType> {
        let id = self.u32(&what)?;
        ValueType::from_id(id)
            .ok_or_else(|| GgufError::invalid(format!("{} has unknown value type id {id}", what())))
    }

    fn value(&mut self, ty: ValueType, limits: &Limits, depth: usize, key: &str) -> Result<Value> {
        let what = || format!("metadata '{key}' value");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(what)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(what)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(bool_of(self.array::<1>(what)?[0], key)?),
            ValueType::String => Value::String(self.string(limits.max_string_len, what)?),
            ValueType::Array => Value::Array(self.array_value(limits, depth + 1, key)?),
        })
    }

    fn array_value(&mut self, limits: &Limits, depth: usize, key: &str) -> Result<Array> {
        if depth > limits.max_array_depth {
            return Err(GgufError::TooLarge {
                what: format!("metadata '{key}' array nesting depth"),
                value: depth as u64,
                limit: limits.max_array_depth as u64,
            });
        }
        let ety = self.value_type(|| format!("metadata '{key}' array element type"))?;
        let n = self.u64(|| format!("metadata '{key}' array length"))?;
        let what = || format!("metadata '{key}' array of {n} {}", ety.name());
        if n.saturating_mul(ety.min_size() as u64) > self.left() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
                needed: n.saturating_mul(ety.min_size() as u64),
                available: self.left(),
            });
        }
        // From here `n` values of at least one byte each fit in the file: allocating for `n`
        // costs at most a small multiple of the file size.
        let n = n as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                let bytes = self.take((n * size_of::<$t>()) as u64, what)?;
                Array::$variant(
                    bytes
                        .chunks_exact(size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().expect("element size")))
                        .collect(),
                )
            }};
        }
        Ok(match ety {
            ValueType::U8 => Array::U8(self.take(n as u64, what)?.to_vec()),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => Array::Bool(
                self.take(n as u64, what)?
                    .iter()
                    .map(|&b| bool_of(b, key))
                    .collect::<Result<_>>()?,
            ),
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string(limits.max_string_len, || {
                        format!("metadata '{key}' element {i}")
                    })?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(limits, depth + 1, key)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, i: u64, alignment: u64, limits: &Limits) -> Result<TensorInfo> {
        let name = self.string(limits.max_tensor_name_len, || {
            format!("tensor info {i} name")
        })?;
        let bad = |message: String| GgufError::BadTensor {
            name: name.clone(),
            message,
        };
        let n_dims = self.u32(|| format!("tensor '{name}' n_dims"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(bad(format!("has {n_dims} dimensions (at most {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(self.u64(|| format!("tensor '{name}' dim {d}"))?);
        }
        let id = self.u32(|| format!("tensor '{name}' type"))?;
        let offset = self.u64(|| format!("tensor '{name}' offset"))?;
        let ty = GgmlType::from_id(id).ok_or_else(|| GgufError::UnknownType {
            name: name.clone(),
            id,
        })?;
        let n = dims
            .iter()
            .try_fold(1u64, |acc, &d| {
                acc.checked_mul(d).filter(|&p| p <= i64::MAX as u64)
            })
            .ok_or_else(|| bad(format!("dimensions {dims:?} overflow")))?;
        let row = dims.first().copied().unwrap_or(1);
        if row % ty.block_len() != 0 {
            return Err(bad(format!(
                "has row length {row}, not a multiple of the {ty} block size {}",
                ty.block_len()
            )));
        }
        let size = ty
            .bytes_for(n)
            .ok_or_else(|| bad(format!("size of {n} {ty} values overflows")))?;
        if offset % alignment != 0 {
            return Err(bad(format!(
                "offset {offset} is not a multiple of the alignment {alignment}"
            )));
        }
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        })
    }
}

fn bool_of(b: u8, key: &str) -> Result<bool> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::invalid(format!(
            "metadata '{key}' has bool byte {b} (not 0 or 1)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal v3 file: one u32 key, no tensors.
    fn tiny() -> Vec<u8> {
        let mut f = b"GGUF".to_vec();
        f.extend(3u32.to_le_bytes());
        f.extend(0u64.to_le_bytes());
        f.extend(1u64.to_le_bytes());
        f.extend(5u64.to_le_bytes());
        f.extend(b"a.key");
        f.extend(4u32.to_le_bytes());
        f.extend(42u32.to_le_bytes());
        f
    }

    #[test]
    fn parses_a_hand_made_file() {
        let p = parse(&tiny()).unwrap();
        assert_eq!(p.version, 3);
        assert_eq!(p.metadata.get_u32("a.key").unwrap(), 42);
        assert!(p.tensors.is_empty());
        assert_eq!(p.alignment, 32);
    }

    #[test]
    fn every_truncation_is_an_error() {
        let f = tiny();
        for len in 0..f.len() {
            let e = parse(&f[..len]).unwrap_err();
            assert!(
                matches!(e, GgufError::Truncated { .. } | GgufError::BadMagic { .. }),
                "len {len}: {e}"
            );
        }
    }

    #[test]
    fn big_endian_and_old_versions_are_named() {
        let mut f = tiny();
        f[4..8].copy_from_slice(&3u32.to_be_bytes());
        assert!(parse(&f).unwrap_err().to_string().contains("big-endian"));
        f[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(
            parse(&f).unwrap_err().to_string(),
            "unsupported GGUF version 1 (edgellm reads versions 2 and 3)"
        );
    }

    #[test]
    fn align_up_works_and_overflows_cleanly() {
        assert_eq!(align_up(0, 32), Some(0));
        assert_eq!(align_up(33, 32), Some(64));
        assert_eq!(align_up(u64::MAX - 3, 32), None);
    }
}
