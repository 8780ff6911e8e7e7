//! The documentation speaks of the product, to the people who install, operate and integrate
//! it: no issue numbers, no words about how the code was developed or tested, no description
//! of the machine it was developed on beyond what a reproduction needs. This test reads every
//! README, `docs/` (with its translations), `board/`, `yocto/`, `models/`, the Markdown of
//! `bench/` and the header comment of each `bench/` script, and fails on the phrases below,
//! naming the file, the line and the phrase.

use std::path::{Path, PathBuf};

const ISSUE: &str = "an issue number";
const HISTORY: &str = "a test's history while developing";
const WHO: &str = "the people or tools that developed it";
const SETUP: &str = "the development set-up";
const WORK: &str = "how the work was done";
const MACHINE: &str = "the development machine";
const LOAD: &str = "the development machine's load";

/// A phrase that is never product documentation, and why. Matched on the line with ASCII
/// letters lowered; `<n>` stands for a run of digits. A phrase that starts (ends) with an ASCII
/// letter or digit must start (end) at a word boundary, so `thelper` or `red-black` are not hits.
const PHRASES: &[(&str, &str)] = &[
    // Issue and ticket numbers: the reader has no tracker. (`#<n>` is the rule below.)
    ("issue <n>", ISSUE),
    ("issues <n>", ISSUE),
    ("issue #<n>", ISSUE),
    ("ticket <n>", ISSUE),
    ("ticket #<n>", ISSUE),
    // How a test was seen to fail while the code was written.
    ("seen red", HISTORY),
    ("saw it red", HISTORY),
    ("saw them red", HISTORY),
    ("went red", HISTORY),
    ("was red", HISTORY),
    ("were red", HISTORY),
    ("red before the fix", HISTORY),
    // How the work was organised.
    ("helper", WHO),
    ("helpers", WHO),
    ("helper's", WHO),
    ("another session compiling", LOAD),
    ("another session building", LOAD),
    ("worktree", SETUP),
    ("worktrees", SETUP),
    ("this workplace", SETUP),
    ("the packaging work", WORK),
    ("the kernel work", WORK),
    ("the docs work", WORK),
    ("while writing", WORK),
    ("while developing", WORK),
    ("earlier attempts", WORK),
    // The development machine and its load: a reproduction needs the CPU, memory, kernel and
    // versions, said as facts, not "this VM" or what else ran on it.
    ("this vm", MACHINE),
    ("our vm", MACHINE),
    ("our machine", MACHINE),
    ("this <n>-core", MACHINE),
    ("project's <n>-core", MACHINE),
    ("shared <n>-core", LOAD),
    ("another build", LOAD),
    ("other builds", LOAD),
    ("clippy build", LOAD),
    ("compiling beside", LOAD),
    ("ran beside it", LOAD),
    ("cannot be checked here", MACHINE),
    ("this x86", MACHINE),
    ("background load of its own", LOAD),
    ("loaded differently", LOAD),
    // The same in the Chinese pages.
    ("项目的 <n> 核", MACHINE),
    ("这台虚拟机", MACHINE),
    ("另一个会话", LOAD),
    ("开发机", MACHINE),
    ("助手", WHO),
];

/// `#<n>` with no word, path or entity before it: an issue reference (`#30`, `(#31)`). An
/// upstream project's `owner/repo#123` is a citation a reader can follow, and is kept.
fn issue_hash(line: &str) -> Option<String> {
    let b = line.as_bytes();
    for (i, _) in line.match_indices('#') {
        let before_ok = i == 0 || {
            let c = b[i - 1];
            !(c.is_ascii_alphanumeric() || b"/&$_.-#".contains(&c))
        };
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        let after = b.get(i + 1 + digits);
        if before_ok && digits > 0 && !after.is_some_and(|c| c.is_ascii_alphanumeric()) {
            return Some(line[i..i + 1 + digits].to_owned());
        }
    }
    None
}

/// Where `pattern` (lowered, `<n>` a digit run) matches `hay` (lowered), if it does.
fn find(hay: &str, pattern: &str) -> Option<String> {
    let parts: Vec<&str> = pattern.split("<n>").collect();
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let first = pattern.chars().next();
    let last = pattern.chars().last();
    for (start, _) in hay.match_indices(parts[0]) {
        if word(first) && word(hay[..start].chars().last()) {
            continue;
        }
        let mut at = start + parts[0].len();
        let mut ok = true;
        for p in &parts[1..] {
            let digits = hay[at..].bytes().take_while(u8::is_ascii_digit).count();
            if digits == 0 || !hay[at + digits..].starts_with(p) {
                ok = false;
                break;
            }
            at += digits + p.len();
        }
        if ok && !(word(last) && word(hay[at..].chars().next())) {
            return Some(hay[start..at].to_owned());
        }
    }
    None
}

/// The phrase of `line` this test refuses, with why.
fn hit(line: &str) -> Option<(String, &'static str)> {
    if let Some(h) = issue_hash(line) {
        return Some((h, ISSUE));
    }
    let lower = line.to_ascii_lowercase();
    PHRASES
        .iter()
        .find_map(|(p, why)| find(&lower, p).map(|m| (m, *why)))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file below `dir`, which must be readable: a folder the test cannot read would be
/// a folder it silently does not check.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let rd = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

/// The lines of a script's header: after a `#!` line, the leading `#` (or `//`) comments and,
/// in Python, the module docstring. Numbered from 1.
fn header(path: &Path, text: &str) -> Vec<(usize, String)> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let comment = if matches!(ext, "c" | "cc" | "cpp" | "h" | "hpp" | "rs") {
        "//"
    } else {
        "#"
    };
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    if let Some((_, l)) = lines.peek()
        && l.starts_with("#!")
    {
        lines.next();
    }
    let mut in_doc = false;
    for (i, l) in lines {
        let t = l.trim_start();
        if in_doc {
            out.push((i + 1, l.to_owned()));
            if t.contains("\"\"\"") {
                in_doc = false;
            }
        } else if t.starts_with(comment) {
            out.push((i + 1, l.to_owned()));
        } else if ext == "py" && t.starts_with("\"\"\"") {
            out.push((i + 1, l.to_owned()));
            in_doc = !t[3..].contains("\"\"\"");
        } else if !(ext == "py" && t.is_empty() && out.is_empty()) {
            break;
        }
    }
    out
}

/// Every (file, line number, line) the rules apply to.
fn documentation() -> Vec<(String, usize, String)> {
    let root = root();
    let mut files = Vec::new();
    let mut top: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("the repository root")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("README"))
        })
        .collect();
    top.sort();
    files.extend(top);
    for d in ["docs", "board", "yocto", "models"] {
        walk(&root.join(d), &mut files);
    }
    let mut bench = Vec::new();
    walk(&root.join("bench"), &mut bench);
    let mut out = Vec::new();
    let mut add = |path: &Path, lines: Vec<(usize, String)>| {
        let rel = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string();
        out.extend(lines.into_iter().map(|(n, l)| (rel.clone(), n, l)));
    };
    for f in &files {
        // A binary file (none today) has no wording.
        if let Ok(text) = std::fs::read_to_string(f) {
            let lines = text.lines().enumerate().map(|(i, l)| (i + 1, l.to_owned()));
            add(f, lines.collect());
        }
    }
    for f in &bench {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        match ext {
            "md" => add(
                f,
                text.lines()
                    .enumerate()
                    .map(|(i, l)| (i + 1, l.to_owned()))
                    .collect(),
            ),
            "sh" | "py" | "cpp" | "c" | "h" | "rs" => add(f, header(f, &text)),
            _ => {}
        }
    }
    out
}

#[test]
fn docs_speak_of_the_product_only() {
    let docs = documentation();
    assert!(
        docs.iter().any(|(f, _, _)| f == "docs/config.md")
            && docs.iter().any(|(f, _, _)| f.starts_with("bench/")),
        "the documentation was not found under {}",
        root().display()
    );
    let hits: Vec<String> = docs
        .iter()
        .filter_map(|(file, n, line)| {
            hit(line).map(|(phrase, why)| {
                let shown: String = line.trim().chars().take(140).collect();
                format!("{file}:{n}: \"{phrase}\" ({why}): {shown}")
            })
        })
        .collect();
    assert!(
        hits.is_empty(),
        "{} line(s) speak of the development, not of the product; say what the product does, \
         or leave it out:\n{}",
        hits.len(),
        hits.join("\n")
    );
}

#[test]
fn the_rules_catch_their_examples_and_nothing_else() {
    let caught = [
        "the fix of #30 made it so",
        "(issue 31, \"Benchmarks\")",
        "issue #5's start-up targets",
        "Mutations seen red: the replay",
        "watched it; it went red",
        "a helper's load",
        "load average 3.6, another session compiling beside it",
        "the emulated board of the packaging work has one",
        "this workplace reaches PyPI",
        "words found while writing the docs",
        "on this project's 2-core x86_64 VM",
        "figures from this 2-core x86_64 machine",
        "on this VM the share moves",
        "on the shared 2-core machine while another worktree built",
        "measured while another build ran on the machine",
        "the VM has background load of its own",
        "speed against llama.cpp on this x86 machine",
        "advisories cannot be checked here (no network)",
        "在本项目的 2 核 x86_64 虚拟机上测得",
    ];
    for line in caught {
        assert!(hit(line).is_some(), "not caught: {line}");
    }
    let kept = [
        "edgellm board detect          # this machine: profile, cores and their kinds",
        "meta-raspberrypi has a wrynose branch (agherzan/meta-raspberrypi#1598)",
        "The register map is in [serial.md](serial.md#modbus).",
        "#DEBHELPER#",
        "a request that names another session's file is refused",
        "a named session, its turns, the red LED of the HAT",
        "`*HH` checksums, `#` comments, &#1234; entities, $# arguments",
        "the board's figures: 4 GB RK3588 boards, the helpers_total counter",
        "x86_64 VM with 2 cores (AMD EPYC), Linux 6.1",
    ];
    for line in kept {
        assert!(hit(line).is_none(), "a false hit: {line}: {:?}", hit(line));
    }
}
