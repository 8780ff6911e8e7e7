//! Where each key of a configuration file is written, so that errors found after parsing
//! (a range, a combination of keys) name the line as the parser's own errors do.

/// Where each key (`mqtt.keepalive_s`, `serial[1].baud`, and each table: `serial[1]`) is
/// written in the file: 1-based lines. Not part of what a configuration says, so two
/// configurations that differ only in layout are equal (a reload compares them).
#[derive(Clone, Debug, Default)]
pub(super) struct KeyLines(Vec<(String, usize)>);

impl PartialEq for KeyLines {
    fn eq(&self, _: &KeyLines) -> bool {
        true
    }
}

impl KeyLines {
    pub(super) fn of(text: &str) -> KeyLines {
        use toml::de::{DeTable, DeValue};
        fn walk(text: &str, path: &str, t: &DeTable<'_>, out: &mut Vec<(String, usize)>) {
            for (k, v) in t {
                let key = if path.is_empty() {
                    k.get_ref().to_string()
                } else {
                    format!("{path}.{}", k.get_ref())
                };
                out.push((key.clone(), line_at(text, k.span().start)));
                match v.get_ref() {
                    DeValue::Table(inner) => walk(text, &key, inner, out),
                    DeValue::Array(items) => {
                        for (i, item) in items.iter().enumerate() {
                            let at = format!("{key}[{i}]");
                            out.push((at.clone(), line_at(text, item.span().start)));
                            if let DeValue::Table(inner) = item.get_ref() {
                                walk(text, &at, inner, out);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        if let Ok(doc) = DeTable::parse(text) {
            walk(text, "", doc.get_ref(), &mut out);
        }
        KeyLines(out)
    }

    /// The line of `key`, else of the nearest table that holds it (a key that is missing).
    pub(super) fn line(&self, key: &str) -> Option<usize> {
        let mut k = key;
        loop {
            if let Some((_, l)) = self.0.iter().find(|(name, _)| name == k) {
                return Some(*l);
            }
            k = &k[..k.rfind(['.', '['])?];
        }
    }
}

/// The 1-based line of byte `at` of `text`.
pub(super) fn line_at(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
