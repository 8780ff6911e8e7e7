//! GGUF metadata: typed values (arrays hold typed vectors, so a 100k-entry token list is one
//! `Vec<String>` and a score list one `Vec<f32>`), kept in file order, with getters whose
//! errors name the key.

use super::error::{GgufError, Result};
use std::collections::HashMap;
use std::fmt;

/// GGUF value type ids (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    /// The type for a GGUF type id, if valid.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of one value of a fixed-size type; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Fewest bytes one value of this type takes in a file (for caps against bytes left).
    pub fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    /// Lower-case name (`"u32"`, `"string"`, …).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A GGUF array: all elements of one type. Arrays of arrays hold each inner array with its own
/// element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description for error messages: `u32`, `array of 3 string`, …
    pub fn describe(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an `i128` if it is an integer of any width (for range-checked getters).
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl Array {
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Display for Value {
    /// Short form for `inspect`: strings quoted and cut at 60 chars, arrays as `[type; n]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::String(s) => {
                let cut: String = s.chars().take(60).collect();
                let more = if cut.len() < s.len() { "…" } else { "" };
                write!(f, "{cut:?}{more}")
            }
            Value::Array(a) => write!(f, "[{}; {}]", a.element_type().name(), a.len()),
        }
    }
}

/// The metadata of a GGUF file: key/value pairs in file order, looked up by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

macro_rules! int_getters {
    ($($get:ident, $opt:ident, $t:ty);* $(;)?) => {$(
        #[doc = concat!("The integer at `key` as `", stringify!($t), "` (any stored integer type whose value fits).")]
        pub fn $get(&self, key: &str) -> Result<$t> {
            self.$opt(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
        }

        #[doc = concat!("Like [`Self::", stringify!($get), "`], `None` if the key is absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$t>> {
            let Some(v) = self.get(key) else { return Ok(None) };
            let i = v.as_integer().ok_or_else(|| wrong_type(key, "an integer", v))?;
            <$t>::try_from(i).map(Some).map_err(|_| GgufError::OutOfRange {
                key: key.to_string(),
                value: i.to_string(),
                target: stringify!($t),
            })
        }
    )*};
}

macro_rules! array_getters {
    ($($get:ident, $opt:ident, $variant:ident, $t:ty);* $(;)?) => {$(
        #[doc = concat!("The array at `key`, which must hold `", stringify!($t), "`.")]
        pub fn $get(&self, key: &str) -> Result<&[$t]> {
            self.$opt(key)?.ok_or_else(|| GgufError::MissingKey(key.to_string()))
        }

        #[doc = concat!("Like [`Self::", stringify!($get), "`], `None` if the key is absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<&[$t]>> {
            match self.get(key) {
                None => Ok(None),
                Some(Value::Array(Array::$variant(v))) => Ok(Some(v)),
                Some(v) => Err(wrong_type(key, concat!("an array of ", stringify!($t)), v)),
            }
        }
    )*};
}

fn wrong_type(key: &str, expected: &str, found: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected: expected.to_string(),
        found: found.describe(),
    }
}

impl Metadata {
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// Adds a key, or fails if it is already there.
    pub fn insert(&mut self, key: String, value: Value) -> Result<()> {
        if self.index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        Ok(())
    }

    /// Sets a key: replaces the value in place if present, appends otherwise.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.index.get(key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.to_string(), self.entries.len());
                self.entries.push((key.to_string(), value));
            }
        }
    }

    /// Removes a key, keeping the order of the others; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, v) = self.entries.remove(i);
        for (k, _) in &self.entries[i..] {
            *self.index.get_mut(k).expect("indexed key") -= 1;
        }
        Some(v)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    int_getters! {
        get_u8, opt_u8, u8;
        get_u16, opt_u16, u16;
        get_u32, opt_u32, u32;
        get_u64, opt_u64, u64;
        get_i32, opt_i32, i32;
        get_i64, opt_i64, i64;
        get_usize, opt_usize, usize;
    }

    /// The float at `key` as `f32` (stored as f32, or f64 converted).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.opt_f32(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    /// Like [`Self::get_f32`], `None` if the key is absent.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(Value::F64(v)) => Ok(Some(*v as f32)),
            Some(v) => Err(wrong_type(key, "a float", v)),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.opt_bool(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(v) => Err(wrong_type(key, "a bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.opt_str(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "a string", v)),
        }
    }

    /// The array at `key`, of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array> {
        self.opt_array(key)?
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong_type(key, "an array", v)),
        }
    }

    array_getters! {
        get_array_str, opt_array_str, String, String;
        get_array_i32, opt_array_i32, I32, i32;
        get_array_u32, opt_array_u32, U32, u32;
        get_array_f32, opt_array_f32, F32, f32;
        get_array_u8, opt_array_u8, U8, u8;
    }

    /// The model architecture (`general.architecture`, e.g. `"llama"`).
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md() -> Metadata {
        let mut m = Metadata::new();
        m.insert("a.u32".into(), Value::U32(7)).unwrap();
        m.insert("a.i64".into(), Value::I64(-1)).unwrap();
        m.insert("a.big".into(), Value::U64(1 << 40)).unwrap();
        m.insert("a.f".into(), Value::F64(0.5)).unwrap();
        m.insert("a.s".into(), Value::String("hi".into())).unwrap();
        m.insert(
            "a.toks".into(),
            Value::Array(Array::String(vec!["x".into(), "y".into()])),
        )
        .unwrap();
        m
    }

    #[test]
    fn getters_convert_and_name_the_key() {
        let m = md();
        assert_eq!(m.get_u32("a.u32").unwrap(), 7);
        assert_eq!(m.get_u64("a.u32").unwrap(), 7);
        assert_eq!(m.get_i32("a.i64").unwrap(), -1);
        assert_eq!(m.get_f32("a.f").unwrap(), 0.5);
        assert_eq!(m.get_str("a.s").unwrap(), "hi");
        assert_eq!(m.get_array_str("a.toks").unwrap(), ["x", "y"]);
        assert_eq!(m.opt_u32("nope").unwrap(), None);
        let e = m.get_u32("a.i64").unwrap_err().to_string();
        assert!(e.contains("'a.i64'") && e.contains("u32"), "{e}");
        let e = m.get_u32("a.big").unwrap_err().to_string();
        assert!(e.contains("'a.big'") && e.contains("1099511627776"), "{e}");
        let e = m.get_str("a.u32").unwrap_err().to_string();
        assert!(e.contains("'a.u32' is u32, expected a string"), "{e}");
        let e = m.get_array_i32("a.toks").unwrap_err().to_string();
        assert!(e.contains("array of 2 string"), "{e}");
        let e = m.get_u32("missing.key").unwrap_err().to_string();
        assert_eq!(e, "metadata key 'missing.key' is missing");
    }

    #[test]
    fn set_remove_keep_order() {
        let mut m = md();
        assert!(matches!(
            m.insert("a.s".into(), Value::Bool(true)),
            Err(GgufError::DuplicateKey(_))
        ));
        m.set("a.s", Value::String("new".into()));
        m.remove("a.i64");
        m.set("z", Value::Bool(true));
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a.u32", "a.big", "a.f", "a.s", "a.toks", "z"]);
        assert_eq!(m.get_str("a.s").unwrap(), "new");
        assert_eq!(m.get_f32("a.f").unwrap(), 0.5);
        assert!(m.get("a.i64").is_none());
    }
}
