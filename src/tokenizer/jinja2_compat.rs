//! Where Jinja2, as Hugging Face's `apply_chat_template` sets it up, and minijinja part ways, and
//! the chat templates of real models notice: each item here made a template of llama.cpp's
//! collection render differently or fail (tests/chat_templates_jinja2.rs holds them to Jinja2).
//!
//! - `{% generation %}…{% endgeneration %}`: transformers' tag that marks the assistant's text
//!   for its training mask (LFM2.5, Laguna). Rendering, it is its body in a scope of its own.
//! - `tojson`: transformers replaces Jinja2's with `json.dumps(x, ensure_ascii=False, indent,
//!   separators, sort_keys)`: Python's spacing (`", "`, `": "`), its float spelling, no HTML
//!   escaping. minijinja has none without its `json` feature, and that one writes compactly.
//! - `length` of an undefined value is 0 (Jinja2's `Undefined` has a length); DeepSeek V3.2
//!   takes the length of a message's absent `tool_calls`.
//! - `indent` keeps a trailing newline, as Jinja2's does (minijinja's drops it).
//! - The tests `iterable`, `sequence` and `number` ask what Python asks: `none is iterable` is
//!   false (Qwen3-Coder and Nemotron test `tools is iterable` with `tools` None), a string and
//!   a dict are sequences, a boolean is a number.

use std::borrow::Cow;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// Adds the filters and tests above to `env` (over minijinja's own).
pub(super) fn install(env: &mut Environment<'_>) {
    env.add_filter("tojson", tojson);
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("indent", indent);
    env.add_test("iterable", is_iterable);
    env.add_test("sequence", is_sequence);
    env.add_test("number", is_number);
}

/// `source` with transformers' `{% generation %}` and `{% endgeneration %}` tags spelled
/// `{% with %}` and `{% endwith %}`, which minijinja knows: the body renders as it is, in a
/// scope of its own as in Jinja2's call block (a `set` inside does not leak out), and the tags'
/// whitespace controls (`{%-`, `-%}`) and their lines are kept, so trimming and error lines
/// are unchanged. Only tags are rewritten: text, comments, `{% raw %}` blocks and strings
/// inside expressions stay as they are.
pub(super) fn generation_as_with(source: &str) -> Cow<'_, str> {
    let mut out = String::new();
    let mut copied = 0;
    let mut at = 0;
    while let Some(open) = source[at..].find('{').map(|o| at + o) {
        let rest = &source[open..];
        if rest.starts_with("{#") {
            at = source[open..]
                .find("#}")
                .map_or(source.len(), |c| open + c + 2);
        } else if rest.starts_with("{{") {
            at = close_of(source, open + 2, "}}");
        } else if rest.starts_with("{%") {
            let end = close_of(source, open + 2, "%}");
            let (word, range) = tag_word(source, open, end);
            match word {
                "raw" => at = end_of_raw(source, end),
                "generation" | "endgeneration" => {
                    out.push_str(&source[copied..range.start]);
                    out.push_str(if word == "generation" {
                        "with"
                    } else {
                        "endwith"
                    });
                    copied = range.end;
                    at = end;
                }
                _ => at = end,
            }
        } else {
            at = open + 1;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(source);
    }
    out.push_str(&source[copied..]);
    Cow::Owned(out)
}

/// Where the tag or expression that starts before `from` ends (just past `close`), skipping
/// string literals; the end of `source` when it is never closed.
fn close_of(source: &str, from: usize, close: &str) -> usize {
    let b = source.as_bytes();
    let mut i = from;
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < b.len() && b[i] != q {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            _ if source[i..].starts_with(close) => return i + close.len(),
            _ => i += 1,
        }
    }
    source.len()
}

/// The statement's name of the tag `source[open..end]` (`{%- generation -%}` → `generation`)
/// and where it lies, if the tag is that name alone; `""` otherwise.
fn tag_word(source: &str, open: usize, end: usize) -> (&str, std::ops::Range<usize>) {
    let inner_start = open + 2;
    let inner_end = if source[..end].ends_with("%}") {
        end - 2
    } else {
        end
    };
    let inner = &source[inner_start..inner_end.max(inner_start)];
    let body = inner.strip_prefix(['-', '+']).unwrap_or(inner);
    let lead = inner.len() - body.len();
    let trimmed = body.trim_start();
    let start = inner_start + lead + (body.len() - trimmed.len());
    let len = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(trimmed.len());
    let tail = trimmed[len..].trim();
    if len == 0 || !(tail.is_empty() || tail == "-" || tail == "+") {
        return ("", 0..0);
    }
    (&trimmed[..len], start..start + len)
}

/// Just past the `{% endraw %}` of a raw block whose opening tag ends at `from`.
fn end_of_raw(source: &str, from: usize) -> usize {
    let mut at = from;
    while let Some(open) = source[at..].find("{%").map(|o| at + o) {
        let end = close_of(source, open + 2, "%}");
        if tag_word(source, open, end).0 == "endraw" {
            return end;
        }
        at = open + 2;
    }
    source.len()
}

/// `length` (and `count`): an undefined value has none, as Jinja2's `Undefined` has length 0.
fn length(v: &Value) -> Result<usize, Error> {
    if v.is_undefined() {
        return Ok(0);
    }
    minijinja::filters::length(v)
}

/// Jinja2's `indent(s, width=4, first=False, blank=False)`: every line but the first (and the
/// first too with `first`) gets `width` spaces, or `width` itself when it is a string; blank
/// lines only with `blank`. Lines are split as Python's `splitlines` splits them and joined
/// with `\n`, and a trailing newline stays.
fn indent(s: String, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    const PARAMS: [&str; 3] = ["width", "first", "blank"];
    if args.len() > PARAMS.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(PARAMS[i])?;
        Ok(named.or_else(|| args.get(i).cloned()))
    };
    let prefix = match arg(0)? {
        None => "    ".to_owned(),
        Some(w) => indent_text(&w, "indent: width")?,
    };
    let first = arg(1)?.is_some_and(|v| v.is_true());
    let blank = arg(2)?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    // Jinja2 appends a newline before splitting, so that a trailing one survives.
    let text = format!("{s}\n");
    let lines = python_splitlines(&text);
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank || !line.is_empty() {
                out.push_str(&prefix);
            }
        }
        out.push_str(line);
    }
    if first {
        out.insert_str(0, &prefix);
    }
    Ok(out)
}

/// An indent given as Python takes it: a string as it is, a number as that many spaces (none
/// when negative).
fn indent_text(v: &Value, what: &str) -> Result<String, Error> {
    if let Some(s) = v.as_str() {
        return Ok(s.to_owned());
    }
    let n = i64::try_from(v.clone()).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("{what} must be a number or a string, not {}", v.kind()),
        )
    })?;
    Ok(" ".repeat(usize::try_from(n).unwrap_or(0)))
}

/// Python's `str.splitlines()`: lines end at `\n`, `\r\n`, `\r`, `\v`, `\f`, `\x1c`–`\x1e`,
/// `\x85`, U+2028 and U+2029; the ends are dropped, and so is an empty last line.
fn python_splitlines(s: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut it = s.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        let end = match c {
            '\r' if it.peek().is_some_and(|(_, n)| *n == '\n') => {
                it.next();
                i + 2
            }
            '\n' | '\r' | '\u{b}' | '\u{c}' | '\u{1c}' | '\u{1d}' | '\u{1e}' | '\u{85}'
            | '\u{2028}' | '\u{2029}' => i + c.len_utf8(),
            _ => continue,
        };
        lines.push(&s[start..i]);
        start = end;
    }
    if start < s.len() {
        lines.push(&s[start..]);
    }
    lines
}

/// Python's `iter(value)` succeeds: strings, lists, dicts, and Jinja2's `Undefined`; not None,
/// booleans or numbers.
fn is_iterable(v: &Value) -> bool {
    match v.kind() {
        ValueKind::Undefined => true,
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        _ => v.try_iter().is_ok(),
    }
}

/// Jinja2's test: the value has a length and can be indexed (strings and dicts are sequences).
fn is_sequence(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Undefined
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Seq
            | ValueKind::Map
    )
}

/// Python's `isinstance(value, Number)`: a bool is an int there.
fn is_number(v: &Value) -> bool {
    matches!(v.kind(), ValueKind::Number | ValueKind::Bool)
}

/// How `json.dumps` is asked to write.
struct Dumps {
    ensure_ascii: bool,
    /// `None`: everything on one line.
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// by position or by name.
fn tojson(value: &Value, args: Rest<Value>, kwargs: Kwargs) -> Result<String, Error> {
    const PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > PARAMS.len() {
        return Err(Error::from(ErrorKind::TooManyArguments));
    }
    let arg = |name: &str| -> Result<Option<Value>, Error> {
        let pos = PARAMS
            .iter()
            .position(|p| *p == name)
            .and_then(|i| args.get(i));
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named
            .or_else(|| pos.cloned())
            .filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = arg("ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = arg("sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match arg("indent")? {
        None => None,
        Some(v) => Some(indent_text(&v, "tojson: indent")?),
    };
    let (item_sep, key_sep) = match arg("separators")? {
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
        Some(v) => {
            let parts: Vec<Value> = v.try_iter().map(Iterator::collect).unwrap_or_default();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.to_string(), b.to_string())
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings (item, key)",
                    ));
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    let d = Dumps {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    d.value(&mut out, value, 0)?;
    Ok(out)
}

fn not_serializable(v: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: a value of type {} is not JSON serializable",
            v.kind()
        ),
    )
}

impl Dumps {
    fn value(&self, out: &mut String, v: &Value, depth: usize) -> Result<(), Error> {
        match v.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number if v.is_integer() => {
                let _ = write!(out, "{v}");
            }
            ValueKind::Number => {
                let f = f64::try_from(v.clone()).map_err(|_| not_serializable(v))?;
                out.push_str(&python_float(f));
            }
            ValueKind::String => self.string(out, v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter().map_err(|_| not_serializable(v))?.collect();
                self.container(out, ('[', ']'), items.len(), depth, |out, i, depth| {
                    self.value(out, &items[i], depth)
                })?;
            }
            ValueKind::Map => {
                let mut pairs = Vec::new();
                for k in v.try_iter().map_err(|_| not_serializable(v))? {
                    let val = v.get_item(&k)?;
                    pairs.push((key_text(&k)?, val));
                }
                if self.sort_keys {
                    pairs.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, ('{', '}'), pairs.len(), depth, |out, i, depth| {
                    self.string(out, &pairs[i].0);
                    out.push_str(&self.key_sep);
                    self.value(out, &pairs[i].1, depth)
                })?;
            }
            _ => return Err(not_serializable(v)),
        }
        Ok(())
    }

    /// `[` items `]` as json.dumps lays them out: on one line, or one per line under `indent`.
    fn container(
        &self,
        out: &mut String,
        (open, close): (char, char),
        n: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if n > 0 {
            let newline = |out: &mut String, level: usize| {
                if let Some(ind) = &self.indent {
                    out.push('\n');
                    for _ in 0..level {
                        out.push_str(ind);
                    }
                }
            };
            for i in 0..n {
                if i > 0 {
                    out.push_str(&self.item_sep);
                }
                newline(out, depth + 1);
                item(out, i, depth + 1)?;
            }
            newline(out, depth);
        }
        out.push(close);
        Ok(())
    }

    /// A JSON string as Python writes it: the short escapes, `\u00XX` for other control
    /// characters, and with `ensure_ascii` every character outside printable ASCII as
    /// `\uXXXX` (UTF-16 surrogate pairs beyond the BMP).
    fn string(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{u:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// A dict key as json.dumps turns it into a string: strings as they are, numbers and
/// constants spelled as JSON would spell them.
fn key_text(k: &Value) -> Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if k.is_integer() => k.to_string(),
        ValueKind::Number => {
            python_float(f64::try_from(k.clone()).map_err(|_| not_serializable(k))?)
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: keys must be str, int, float, bool or None, not {}",
                    k.kind()
                ),
            ));
        }
    })
}

/// Python's `repr(float)`: the shortest digits that read back as `f` (Rust's and Python's
/// shortest forms agree), fixed-point from 1e-4 up to 1e16 with at least one decimal, else
/// `d.ddde+XX`; `NaN` and `Infinity` as json.dumps writes them.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let (int, frac) = if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                (format!("{digits:0<int_len$}"), "0".to_owned())
            } else {
                (digits[..int_len].to_owned(), digits[int_len..].to_owned())
            }
        } else {
            let zeros = "0".repeat((-exp - 1) as usize);
            ("0".to_owned(), format!("{zeros}{digits}"))
        };
        format!("{sign}{int}.{frac}")
    } else {
        let m = if digits.len() == 1 {
            digits
        } else {
            format!("{}.{}", &digits[..1], &digits[1..])
        };
        let s = if exp < 0 { '-' } else { '+' };
        format!("{sign}{m}e{s}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_spelled_as_python_repr_spells_them() {
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.5, "1.5"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e20, "1.5e+20"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (-2.5e-7, "-2.5e-07"),
            (1e100, "1e+100"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float(f), want, "{f:e}");
        }
    }

    fn render(src: &str) -> String {
        let mut env = Environment::new();
        install(&mut env);
        env.render_str(src, ()).unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        assert_eq!(
            render("{{ {'b': [1, 2.5, none, true], 'a': 'é\\n\"'}|tojson }}"),
            r#"{"b": [1, 2.5, null, true], "a": "é\n\""}"#
        );
        assert_eq!(
            render("{{ {'b': 1, 'a': {'c': []}}|tojson(indent=2, sort_keys=true) }}"),
            "{\n  \"a\": {\n    \"c\": []\n  },\n  \"b\": 1\n}"
        );
        assert_eq!(
            render("{{ ['é', '😀']|tojson(true, separators=(',', ':')) }}"),
            r#"["\u00e9","\ud83d\ude00"]"#
        );
        let mut env = Environment::new();
        install(&mut env);
        assert!(env.render_str("{{ x|tojson }}", ()).is_err(), "undefined");
        assert!(env.render_str("{{ 1|tojson(bogus=1) }}", ()).is_err());
    }

    #[test]
    fn indent_keeps_a_trailing_newline_and_splits_lines_as_python() {
        assert_eq!(render("{{ 'a\\nb\\n'|indent(2) }}"), "a\n  b\n");
        assert_eq!(render("{{ 'a\\r\\n\\nb'|indent(2, true) }}"), "  a\n\n  b");
        assert_eq!(
            render("{{ 'a\\n\\nb'|indent('>', blank=true) }}"),
            "a\n>\n>b"
        );
        assert_eq!(python_splitlines("a\u{2028}b\r\rc\n"), ["a", "b", "", "c"]);
    }

    #[test]
    fn python_tests_and_the_length_of_undefined() {
        assert_eq!(
            render(
                "{{ none is iterable }} {{ x is iterable }} {{ 's' is sequence }} \
                    {{ {} is sequence }} {{ true is number }} {{ x|length }}"
            ),
            "False True True True True 0"
        );
    }

    #[test]
    fn generation_tags_become_with_blocks_and_nothing_else_changes() {
        let src =
            "{% for m in messages %}{%- generation -%}\n{{ m }}{%+ endgeneration %}{% endfor %}";
        assert_eq!(
            generation_as_with(src),
            "{% for m in messages %}{%- with -%}\n{{ m }}{%+ endwith %}{% endfor %}"
        );
        // Text, comments, strings and raw blocks are left alone, and so is a source without tags.
        let kept = "generation {# {% generation %} #}{{ '{% generation %}' }}\
                    {% raw %}{% generation %}{% endraw %}{% set x = 'generation' %}";
        assert!(matches!(generation_as_with(kept), Cow::Borrowed(_)));
        assert_eq!(generation_as_with("{% generationx %}"), "{% generationx %}");
        // An unterminated tag at the end does not panic.
        assert_eq!(generation_as_with("a {% gener"), "a {% gener");
        assert_eq!(generation_as_with("{{ 'x"), "{{ 'x");
    }
}
