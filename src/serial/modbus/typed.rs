//! Typed answers: a configured answer format as registers a PLC reads without parsing text.
//!
//! Pure: a format's shape in, a register layout out; an answer's JSON in, register values out.
//!
//! A choice answer is its option's index (0 for the first). A JSON-Schema answer's top-level
//! properties that are enums, booleans or numbers each have a fixed place in the typed block,
//! in the order the schema lists them:
//!
//! | property's schema | register type | registers | no value |
//! |---|---|---|---|
//! | `enum` (or `const`) | uint16: the value's index in the list | 1 | `0xFFFF` |
//! | `"type": "boolean"` | uint16: 0 or 1 | 1 | `0xFFFF` |
//! | `"type": "integer"`, bounds within 0…65535 | uint16 | 1 | `0xFFFF` |
//! | `"type": "integer"`, bounds within −32768…32767 | int16 | 1 | `0x8000` |
//! | `"type": "integer"`, otherwise | int32, high word first | 2 | `0x8000 0x0000` |
//! | `"type": "number"` | float32 (IEEE 754), high word first | 2 | `0x7FC0 0x0000` (NaN) |
//!
//! Bounds are `minimum`/`maximum` (or their exclusive forms); an integer without both is an
//! int32. A `type` list with `"null"` beside one type is that type. "No value" — SunSpec's
//! "not implemented" values, which SCADA software already knows — is what a register holds
//! when the property is absent (an optional one), null, beyond what its type holds, or the
//! answer is not valid. Strings, arrays, objects and anything else have no registers: they
//! are in the answer's text (the JSON) on the answer pages.

use crate::engine::constraint::Shape;
use serde_json::Value;

/// Registers of the typed block.
pub const TYPED_REGS: usize = 96;
/// Most values an enum may list: an index is a uint16 and `0xFFFF` means "no value".
const MAX_ENUM: usize = 0xFFFF;

/// How one property is held in registers.
#[derive(Clone, Debug, PartialEq)]
pub enum RegType {
    /// The index of the value in the list.
    Enum(Vec<Value>),
    Bool,
    U16,
    I16,
    I32,
    F32,
}

impl RegType {
    pub fn width(&self) -> usize {
        match self {
            RegType::I32 | RegType::F32 => 2,
            _ => 1,
        }
    }

    /// The registers that mean "no value".
    fn none(&self) -> [u16; 2] {
        match self {
            RegType::Enum(_) | RegType::Bool | RegType::U16 => [0xFFFF, 0],
            RegType::I16 | RegType::I32 => [0x8000, 0],
            RegType::F32 => [0x7FC0, 0],
        }
    }

    /// The registers of `v`, or `None` when this type cannot hold it.
    fn encode(&self, v: &Value) -> Option<[u16; 2]> {
        let int = || {
            v.as_i64().or_else(|| {
                let f = v.as_f64()?;
                (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)
            })
        };
        let one = |x: u16| Some([x, 0]);
        match self {
            RegType::Enum(values) => one(values.iter().position(|e| e == v)? as u16),
            RegType::Bool => one(v.as_bool()? as u16),
            RegType::U16 => one(u16::try_from(int()?).ok()?),
            RegType::I16 => one(i16::try_from(int()?).ok()? as u16),
            RegType::I32 => {
                let x = i32::try_from(int()?).ok()? as u32;
                Some([(x >> 16) as u16, x as u16])
            }
            RegType::F32 => {
                let x = v.as_f64()? as f32;
                let bits = x.is_finite().then_some(x.to_bits())?;
                Some([(bits >> 16) as u16, bits as u16])
            }
        }
    }

    fn name(&self) -> &'static str {
        match self {
            RegType::Enum(_) => "uint16 (enum index)",
            RegType::Bool => "uint16 (0/1)",
            RegType::U16 => "uint16",
            RegType::I16 => "int16",
            RegType::I32 => "int32",
            RegType::F32 => "float32",
        }
    }
}

/// A property with registers: at `at` within the typed block.
#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: String,
    pub at: usize,
    pub ty: RegType,
}

/// What a format puts into registers.
#[derive(Clone, Debug, PartialEq)]
pub enum Layout {
    /// A choice: the option's index.
    Choice(Vec<String>),
    /// A JSON object: its typed properties; `text` names the ones only in the text.
    Object {
        fields: Vec<Field>,
        text: Vec<String>,
    },
}

/// A configured format as a Modbus master selects and reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct Typed {
    pub name: String,
    pub layout: Layout,
}

impl Typed {
    /// The layout of format `name`. Refused: a schema whose typed properties do not fit the
    /// typed block, or an enum too long for an index.
    pub fn of(name: &str, shape: &Shape) -> Result<Typed, String> {
        let layout = match shape {
            Shape::Choice(options) if options.len() > MAX_ENUM => {
                return Err(format!(
                    "format {name}: {} options, an index holds {MAX_ENUM}",
                    options.len()
                ));
            }
            Shape::Choice(options) => Layout::Choice(options.clone()),
            Shape::JsonSchema(schema) => object(name, schema)?,
            _ => Layout::Object {
                fields: Vec::new(),
                text: Vec::new(),
            },
        };
        Ok(Typed {
            name: name.to_owned(),
            layout,
        })
    }

    /// Registers the typed block uses.
    pub fn registers(&self) -> usize {
        match &self.layout {
            Layout::Choice(_) => 0,
            Layout::Object { fields, .. } => fields.last().map_or(0, |f| f.at + f.ty.width()),
        }
    }

    /// The index of a choice answer's option (`0xFFFF`: not a choice, or no option).
    pub fn choice_index(&self, answer: &str) -> u16 {
        match &self.layout {
            Layout::Choice(options) => options
                .iter()
                .position(|o| o == answer)
                .map_or(0xFFFF, |i| i as u16),
            Layout::Object { .. } => 0xFFFF,
        }
    }

    /// The typed block for `answer` (a valid answer's JSON; `None`: no value anywhere).
    /// Registers no property uses are 0.
    pub fn fill(&self, answer: Option<&Value>, block: &mut [u16; TYPED_REGS]) {
        block.fill(0);
        let Layout::Object { fields, .. } = &self.layout else {
            return;
        };
        for f in fields {
            let v = answer.and_then(|a| a.get(&f.name));
            let regs = v.and_then(|v| f.ty.encode(v)).unwrap_or(f.ty.none());
            block[f.at..f.at + f.ty.width()].copy_from_slice(&regs[..f.ty.width()]);
        }
    }

    /// The layout as a table: a choice's options by index, or the address of each property
    /// (`base`: the typed block's first register), its type and what it holds.
    pub fn table(&self, base: u16) -> String {
        let mut out = String::new();
        match &self.layout {
            Layout::Choice(options) => {
                for (i, o) in options.iter().enumerate() {
                    out.push_str(&format!("  {i:>5}  {o}\n"));
                }
            }
            Layout::Object { fields, text } => {
                if fields.is_empty() {
                    out.push_str("no property has registers: the answer is text only\n");
                }
                for f in fields {
                    let addr = base as usize + f.at;
                    let at = match f.ty.width() {
                        1 => format!("{addr}"),
                        _ => format!("{addr}-{}", addr + 1),
                    };
                    out.push_str(&format!("  {at:<9} {:<20} {}", f.ty.name(), f.name));
                    if let RegType::Enum(values) = &f.ty {
                        let list: Vec<String> = values
                            .iter()
                            .enumerate()
                            .map(|(i, v)| format!("{i} {v}"))
                            .collect();
                        out.push_str(&format!(": {}", list.join(", ")));
                    }
                    out.push('\n');
                }
                if !text.is_empty() {
                    out.push_str(&format!("in the text only: {}\n", text.join(", ")));
                }
            }
        }
        out
    }
}

/// The typed properties of an object schema, in its order.
fn object(name: &str, schema: &Value) -> Result<Layout, String> {
    let mut fields = Vec::new();
    let mut text = Vec::new();
    let mut at = 0;
    let props = schema.get("properties").and_then(Value::as_object);
    for (prop, s) in props.into_iter().flatten() {
        let Some(ty) = reg_type(s) else {
            text.push(prop.clone());
            continue;
        };
        if let RegType::Enum(v) = &ty
            && v.len() > MAX_ENUM
        {
            return Err(format!(
                "format {name}: property {prop:?} lists {} values, an index holds {MAX_ENUM}",
                v.len()
            ));
        }
        let width = ty.width();
        fields.push(Field {
            name: prop.clone(),
            at,
            ty,
        });
        at += width;
    }
    if at > TYPED_REGS {
        return Err(format!(
            "format {name}: its numbers, booleans and enums need {at} registers, the typed \
             block has {TYPED_REGS}"
        ));
    }
    Ok(Layout::Object { fields, text })
}

/// How a property's schema is held in registers, if it is.
fn reg_type(s: &Value) -> Option<RegType> {
    if let Some(values) = s.get("enum").and_then(Value::as_array) {
        return Some(RegType::Enum(values.clone()));
    }
    if let Some(v) = s.get("const") {
        return Some(RegType::Enum(vec![v.clone()]));
    }
    let ty = match s.get("type")? {
        Value::String(t) => t.as_str(),
        Value::Array(list) => {
            let mut not_null = list.iter().filter(|t| t.as_str() != Some("null"));
            let one = not_null.next()?.as_str()?;
            if not_null.next().is_some() {
                return None;
            }
            one
        }
        _ => return None,
    };
    match ty {
        "boolean" => Some(RegType::Bool),
        "number" => Some(RegType::F32),
        "integer" => Some(integer(s)),
        _ => None,
    }
}

/// The narrowest register type the integer's bounds fit.
fn integer(s: &Value) -> RegType {
    let bound = |inclusive: &str, exclusive: &str, step: f64| {
        let inc = s.get(inclusive).and_then(Value::as_f64);
        let exc = s.get(exclusive).and_then(Value::as_f64).map(|x| x + step);
        match (inc, exc) {
            (Some(a), Some(b)) if step > 0.0 => Some(a.max(b)),
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    };
    let (Some(lo), Some(hi)) = (
        bound("minimum", "exclusiveMinimum", 1.0),
        bound("maximum", "exclusiveMaximum", -1.0),
    ) else {
        return RegType::I32;
    };
    if lo >= 0.0 && hi <= 65535.0 {
        RegType::U16
    } else if lo >= -32768.0 && hi <= 32767.0 {
        RegType::I16
    } else {
        RegType::I32
    }
}

#[cfg(test)]
#[path = "typed_tests.rs"]
mod tests;
