//! README.md and README.zh-CN.md say the same: each links to the other, both start with the
//! same two set-up commands, and every command block holds the same commands (comments, which
//! are translated, aside). A command changed in one and not the other fails here.

use std::path::Path;

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The fenced code blocks of `md`, each as its lines with `# comments` and trailing blanks
/// cut (a `#` inside quotes is kept: it is part of the command).
fn command_blocks(md: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut cur: Option<Vec<String>> = None;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            match cur.take() {
                Some(b) => blocks.push(b),
                None => cur = Some(Vec::new()),
            }
            continue;
        }
        if let Some(b) = cur.as_mut() {
            let code = comparable(strip_comment(line).trim_end());
            if !code.is_empty() {
                b.push(code);
            }
        }
    }
    assert!(cur.is_none(), "an unclosed code block");
    blocks
}

/// A command line as both READMEs must have it: the demo's question is asked in each README's
/// own language, so its quoted argument is left out of the comparison.
fn comparable(line: &str) -> String {
    match line.strip_prefix("scripts/demo.sh ") {
        Some(rest) if rest.starts_with('"') => {
            let close = rest[1..].find('"').map_or(rest.len(), |i| i + 2);
            format!("scripts/demo.sh \"<question>\"{}", &rest[close..])
        }
        _ => line.to_owned(),
    }
}

/// The demo's question in `md`'s first command.
fn demo_question(md: &str) -> String {
    let line = md
        .lines()
        .find(|l| l.starts_with("scripts/demo.sh \""))
        .expect("a scripts/demo.sh command");
    let rest = &line["scripts/demo.sh \"".len()..];
    rest[..rest.find('"').expect("a closing quote")].to_owned()
}

fn strip_comment(line: &str) -> &str {
    let (mut single, mut double) = (false, false);
    let b = line.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        match c {
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'#' if !single && !double && (i == 0 || b[i - 1] == b' ') => return &line[..i],
            _ => {}
        }
    }
    line
}

#[test]
fn the_two_readmes_have_the_same_commands() {
    let en = command_blocks(&read("README.md"));
    let zh = command_blocks(&read("README.zh-CN.md"));
    assert!(en.len() >= 2, "README.md has {} code blocks", en.len());
    assert_eq!(
        en.len(),
        zh.len(),
        "README.md has {} code blocks, README.zh-CN.md {}",
        en.len(),
        zh.len()
    );
    for (i, (a, b)) in en.iter().zip(&zh).enumerate() {
        assert_eq!(
            a,
            b,
            "code block {} differs between README.md and README.zh-CN.md",
            i + 1
        );
    }
}

#[test]
fn both_start_with_the_same_two_setup_commands_and_link_each_other() {
    let (en, zh) = (read("README.md"), read("README.zh-CN.md"));
    let first = |md: &str| command_blocks(md).into_iter().next().unwrap_or_default();
    assert_eq!(
        first(&en).len(),
        2,
        "README.md's first block: {:?}",
        first(&en)
    );
    assert_eq!(first(&en), first(&zh));
    // Each asks the demo's question in its own language: the boiling point of water, which the
    // default model must answer right (tests/readme_demo.rs asks both).
    assert!(demo_question(&en).contains("boiling point of water"));
    assert!(demo_question(&zh).contains("沸点"));
    // The first block comes before any other text but the title.
    for md in [&en, &zh] {
        let before: Vec<&str> = md
            .lines()
            .take_while(|l| !l.starts_with("```"))
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(
            before.len(),
            1,
            "only the title before the commands: {before:?}"
        );
    }
    assert!(
        en.contains("(README.zh-CN.md)"),
        "README.md links README.zh-CN.md"
    );
    assert!(
        zh.contains("(README.md)"),
        "README.zh-CN.md links README.md"
    );
}

#[test]
fn a_comment_is_cut_but_a_hash_in_quotes_is_kept() {
    assert_eq!(strip_comment("ls # list"), "ls ");
    assert_eq!(
        strip_comment("echo '# not a comment' # one"),
        "echo '# not a comment' "
    );
    assert_eq!(strip_comment("a#b"), "a#b");
}
