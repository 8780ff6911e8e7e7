//! The Chinese operator's references (`docs/zh-CN/`) say what their English twins say: each
//! links to its twin and back, and both have the same code blocks (comments aside, which are
//! translated), the same tables (rows, columns, and in every cell the same code and numbers),
//! and, over the whole page, the same code spans and the same numbers. A register, a default,
//! a byte or a command changed in one language and not in the other fails here.

use std::collections::BTreeMap;
use std::path::Path;

/// The pages that have a Chinese twin, by file name without `.md`.
const PAGES: &[&str] = &[
    "config",
    "mqtt",
    "serial",
    "troubleshooting",
    "operating",
    "install-deb",
];

fn read(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// A page cut into its fenced code blocks (language, lines) and the rest (line number, line).
struct Page {
    blocks: Vec<(String, Vec<String>)>,
    text: Vec<(usize, String)>,
}

fn split(md: &str) -> Page {
    let (mut blocks, mut text) = (Vec::new(), Vec::new());
    let mut cur: Option<(String, Vec<String>)> = None;
    for (i, line) in md.lines().enumerate() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            match cur.take() {
                Some(b) => blocks.push(b),
                None => cur = Some((info.trim().to_owned(), Vec::new())),
            }
            continue;
        }
        match cur.as_mut() {
            Some((_, lines)) => lines.push(line.to_owned()),
            None => text.push((i + 1, line.to_owned())),
        }
    }
    assert!(cur.is_none(), "an unclosed code block");
    Page { blocks, text }
}

/// A code line as both languages must have it: its `#` comment cut (a `#` inside quotes, or
/// not after a blank, is part of the code), trailing blanks cut.
fn code(line: &str) -> String {
    let (mut single, mut double) = (false, false);
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => {
                return line[..i].trim_end().to_owned();
            }
            _ => {}
        }
        prev = c;
    }
    line.trim_end().to_owned()
}

/// The code spans of `s` (between backticks) and `s` without them.
fn spans(s: &str) -> (Vec<String>, String) {
    let mut out = Vec::new();
    let mut rest = String::new();
    let mut parts = s.split('`');
    if let Some(first) = parts.next() {
        rest.push_str(first);
    }
    let mut inside = true;
    for p in parts {
        if inside {
            // Markdown reads a line break in a span as a blank.
            out.push(p.split_whitespace().collect::<Vec<_>>().join(" "));
        } else {
            rest.push(' ');
            rest.push_str(p);
        }
        inside = !inside;
    }
    (out, rest)
}

/// The numbers of `s` as written: `0x`-hex, or digits with inner `.`, `,` (`1,117,320,768`,
/// `3.1.1`, `0.95`).
fn numbers(s: &str) -> Vec<String> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric())) {
            let start = i;
            if b[i] == b'0' && b.get(i + 1) == Some(&b'x') {
                i += 2;
                while i < b.len() && b[i].is_ascii_hexdigit() {
                    i += 1;
                }
            } else {
                loop {
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    if i + 1 < b.len() && matches!(b[i], b'.' | b',') && b[i + 1].is_ascii_digit() {
                        i += 1;
                    } else {
                        break;
                    }
                }
            }
            out.push(s[start..i].to_owned());
        } else {
            i += 1;
        }
    }
    out
}

/// The link targets of `s` (`](target)`), which name pages and sections, not facts.
fn without_links(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(at) = rest.find("](") {
        out.push_str(&rest[..at + 1]);
        rest = &rest[at + 2..];
        match rest.find(')') {
            Some(end) => rest = &rest[end + 1..],
            None => break,
        }
    }
    out.push_str(rest);
    out
}

fn counted(items: Vec<String>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for i in items {
        *m.entry(i).or_insert(0) += 1;
    }
    m
}

/// What one side has more of than the other, for a message.
fn difference(a: &BTreeMap<String, usize>, b: &BTreeMap<String, usize>) -> String {
    let mut d = Vec::new();
    for (k, n) in a {
        let m = b.get(k).copied().unwrap_or(0);
        if *n > m {
            d.push(format!("English +{} {k:?}", n - m));
        }
    }
    for (k, n) in b {
        let m = a.get(k).copied().unwrap_or(0);
        if *n > m {
            d.push(format!("Chinese +{} {k:?}", n - m));
        }
    }
    d.join(", ")
}

/// A Markdown table row's cells (a `|` in a code span or escaped as `\|` is the cell's).
fn cells(row: &str) -> Vec<String> {
    let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
    let mut out = vec![String::new()];
    let mut in_code = false;
    let mut prev = ' ';
    for c in inner.chars() {
        match c {
            '`' => in_code = !in_code,
            '|' if !in_code && prev != '\\' => {
                out.push(String::new());
                prev = c;
                continue;
            }
            _ => {}
        }
        out.last_mut().expect("a cell").push(c);
        prev = c;
    }
    out.into_iter().map(|c| c.trim().to_owned()).collect()
}

/// The tables of a page: each a list of (line number, cells), the `---` row left out.
fn tables(text: &[(usize, String)]) -> Vec<Vec<(usize, Vec<String>)>> {
    let mut out: Vec<Vec<(usize, Vec<String>)>> = Vec::new();
    let mut in_table = false;
    for (n, line) in text {
        if line.trim_start().starts_with('|') {
            if !in_table {
                out.push(Vec::new());
                in_table = true;
            }
            let c = cells(line);
            let rule = c
                .iter()
                .all(|c| !c.is_empty() && c.chars().all(|x| "-: ".contains(x)));
            if !rule {
                out.last_mut().expect("a table").push((*n, c));
            }
        } else {
            in_table = false;
        }
    }
    out
}

/// Everything that differs between `en` (English) and `zh` (its translation), one line each.
fn compare(page: &str, en: &str, zh: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let (e, z) = (split(en), split(zh));
    let zh_name = format!("docs/zh-CN/{page}.md");

    if !en.contains(&format!("(zh-CN/{page}.md)")) {
        bad.push(format!(
            "docs/{page}.md: no link to its Chinese twin (zh-CN/{page}.md)"
        ));
    }
    if !zh.contains(&format!("(../{page}.md)")) {
        bad.push(format!("{zh_name}: no link back to ../{page}.md"));
    }

    if e.blocks.len() != z.blocks.len() {
        bad.push(format!(
            "{page}: {} code blocks in English, {} in Chinese",
            e.blocks.len(),
            z.blocks.len()
        ));
    }
    for (i, ((el, eb), (zl, zb))) in e.blocks.iter().zip(&z.blocks).enumerate() {
        let keep = |b: &Vec<String>| -> Vec<String> {
            b.iter()
                .map(|l| code(l))
                .filter(|l| !l.is_empty())
                .collect()
        };
        let (ec, zc) = (keep(eb), keep(zb));
        if el != zl {
            bad.push(format!(
                "{page}: code block {}: ```{el} in English, ```{zl} in Chinese",
                i + 1
            ));
        }
        if ec != zc {
            let at = ec
                .iter()
                .zip(&zc)
                .position(|(a, b)| a != b)
                .unwrap_or(ec.len().min(zc.len()));
            bad.push(format!(
                "{page}: code block {} differs at its code line {}: English {:?}, Chinese {:?}",
                i + 1,
                at + 1,
                ec.get(at),
                zc.get(at)
            ));
        }
    }

    let (et, zt) = (tables(&e.text), tables(&z.text));
    if et.len() != zt.len() {
        bad.push(format!(
            "{page}: {} tables in English, {} in Chinese",
            et.len(),
            zt.len()
        ));
    }
    for (ti, (a, b)) in et.iter().zip(&zt).enumerate() {
        if a.len() != b.len() {
            bad.push(format!(
                "{page}: table {} (English line {}): {} rows in English, {} in Chinese",
                ti + 1,
                a[0].0,
                a.len(),
                b.len()
            ));
            continue;
        }
        for ((en_line, ra), (zh_line, rb)) in a.iter().zip(b) {
            if ra.len() != rb.len() {
                bad.push(format!(
                    "{page}: table {} row at English line {en_line} / Chinese line {zh_line}: {} cells against {}",
                    ti + 1,
                    ra.len(),
                    rb.len()
                ));
                continue;
            }
            for (ci, (ca, cb)) in ra.iter().zip(rb).enumerate() {
                let (sa, pa) = spans(&without_links(ca));
                let (sb, pb) = spans(&without_links(cb));
                let (sa, sb) = (counted(sa), counted(sb));
                let (na, nb) = (counted(numbers(&pa)), counted(numbers(&pb)));
                if sa != sb || na != nb {
                    bad.push(format!(
                        "{page}: table {} row at English line {en_line} / Chinese line {zh_line}, column {}: {}",
                        ti + 1,
                        ci + 1,
                        difference(&sa, &sb) + &difference(&na, &nb)
                    ));
                }
            }
        }
    }

    // A code span may go on over a line break: the page's text is read as one.
    let whole = |p: &Page| {
        let text: Vec<&str> = p.text.iter().map(|(_, l)| l.as_str()).collect();
        let (sp, rest) = spans(&without_links(&text.join("\n")));
        (counted(sp), counted(numbers(&rest)))
    };
    let ((es, en_n), (zs, zn)) = (whole(&e), whole(&z));
    if es != zs {
        bad.push(format!(
            "{page}: code spans differ: {}",
            difference(&es, &zs)
        ));
    }
    if en_n != zn {
        bad.push(format!(
            "{page}: numbers differ: {}",
            difference(&en_n, &zn)
        ));
    }
    bad
}

#[test]
fn each_chinese_page_says_what_its_english_twin_says() {
    let mut bad = Vec::new();
    for page in PAGES {
        let en = read(&format!("docs/{page}.md"));
        let zh = read(&format!("docs/zh-CN/{page}.md"));
        bad.extend(compare(page, &en, &zh));
    }
    assert!(
        bad.is_empty(),
        "the Chinese pages are out of step with the English ones:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_readmes_list_the_chinese_pages() {
    let readme = read("README.zh-CN.md");
    for page in PAGES {
        assert!(
            readme.contains(&format!("docs/zh-CN/{page}.md")),
            "README.zh-CN.md does not name docs/zh-CN/{page}.md"
        );
    }
}

#[test]
fn a_changed_fact_is_caught() {
    let en = "# T\n\n[中文](zh-CN/t.md)\n\n| a | b |\n|---|---|\n| `x` | 502 |\n\nAt most `n`, 16 of them.\n\n```sh\nedgellm serve   # go\n```\n";
    let zh = "# T\n\n[English](../t.md)\n\n| a | b |\n|---|---|\n| `x` | 502 |\n\n最多 `n`，16 个。\n\n```sh\nedgellm serve   # 启动\n```\n";
    assert_eq!(compare("t", en, zh), Vec::<String>::new());
    for (from, to) in [
        ("| `x` | 502 |", "| `x` | 1502 |"),
        ("| `x` | 502 |", "| `y` | 502 |"),
        ("16 个", "15 个"),
        ("edgellm serve   # 启动", "edgellm serve --check   # 启动"),
        ("[English](../t.md)", "[English](t.md)"),
        ("| `x` | 502 |\n", "| `x` | 502 |\n| `z` | 1 |\n"),
    ] {
        let changed = zh.replace(from, to);
        assert_ne!(changed, zh, "{from} is in the example");
        assert!(
            !compare("t", en, &changed).is_empty(),
            "not caught: {from:?} -> {to:?}"
        );
    }
}
