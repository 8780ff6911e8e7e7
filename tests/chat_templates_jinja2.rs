//! Chat templates rendered by edgellm (minijinja) against Python's Jinja2 set up as Hugging
//! Face's `apply_chat_template` runs it (tests/chat_render.py): every template of llama.cpp's
//! collection (`models/templates/*.jinja`, real models' templates) and those of our own models,
//! on a few conversations with and without the generation prompt. Wherever Jinja2 renders, the
//! two texts must be identical; where Jinja2 raises (a template that needs tools, or refuses a
//! system message), edgellm may fail too, and the cases are only counted.
//!
//! Needs llama.cpp's source (`bench/build-llamacpp.sh --source-only`, or `EDGELLM_LLAMACPP_SRC`)
//! and Python's Jinja2 (`/usr/bin/python3` with Debian's python3-jinja2, which
//! scripts/setup.sh installs; `EDGELLM_JINJA2_PYTHON` names another interpreter). Either one
//! missing fails the test: it is never skipped.

mod common;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use edgellm::gguf::{Gguf, OpenOptions};
use edgellm::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;

const BOS: &str = "<s>";
const EOS: &str = "</s>";

/// One rendering to compare: a conversation and whether the assistant's turn is opened.
struct Case {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
}

fn m(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

/// The conversations every template is rendered with, each with and without the generation
/// prompt. Contents carry spaces at their ends, a newline and non-ASCII text, so that templates
/// that trim or escape show it.
fn cases() -> Vec<Case> {
    let conversations = [
        vec![m("user", "Hello! Who are you?")],
        vec![
            m("system", "You are a terse assistant."),
            m("user", "What is 2+2?"),
        ],
        vec![
            m("user", "Hi"),
            m("assistant", "Hello! How can I help?"),
            m(
                "user",
                "  Tell me a joke\nabout café \"quotes\" & <tags>.  ",
            ),
        ],
        vec![
            m("system", "Answer in French."),
            m("user", "Good morning"),
            m("assistant", "Bonjour !"),
            m("user", "Thanks \u{1F600}"),
        ],
        // A tool's answer as a client may send one (roles are free text): templates that
        // group tool turns look at their neighbours (`loop.previtem`, `loop.nextitem`).
        vec![
            m("user", "What is the weather?"),
            m("assistant", "Let me check."),
            m("tool", "{\"temp\": 21}"),
            m("assistant", "It is 21 °C."),
        ],
    ];
    conversations
        .iter()
        .flat_map(|c| {
            [true, false].map(|add_generation_prompt| Case {
                messages: c.clone(),
                add_generation_prompt,
            })
        })
        .collect()
}

/// The Python that has Jinja2: `$EDGELLM_JINJA2_PYTHON`, else Debian's /usr/bin/python3 (a
/// python3 earlier on PATH, such as a pyenv one, may lack it).
fn python() -> PathBuf {
    std::env::var_os("EDGELLM_JINJA2_PYTHON")
        .map_or_else(|| "/usr/bin/python3".into(), PathBuf::from)
}

/// Jinja2's renderings, one row per template and one entry per case: `Ok(text)` or
/// `Err(what it raised)`.
fn jinja2_render(
    templates: &[&str],
    cases: &[Case],
    bos: &str,
    eos: &str,
) -> Vec<Vec<Result<String, String>>> {
    // Messages are spelled `{"role", "content"}` in that order, as Hugging Face's users write
    // them: a template that walks a message's items sees them in that order. (serde_json's
    // maps would sort the keys.)
    let s = |t: &str| Value::from(t).to_string();
    let conversations: Vec<String> = cases
        .iter()
        .map(|c| {
            let messages: Vec<String> = c
                .messages
                .iter()
                .map(|m| format!(r#"{{"role":{},"content":{}}}"#, s(&m.role), s(&m.content)))
                .collect();
            format!(
                r#"{{"messages":[{}],"add_generation_prompt":{}}}"#,
                messages.join(","),
                c.add_generation_prompt
            )
        })
        .collect();
    let templates: Vec<String> = templates.iter().map(|t| s(t)).collect();
    let job = format!(
        r#"{{"bos_token":{},"eos_token":{},"templates":[{}],"conversations":[{}]}}"#,
        s(bos),
        s(eos),
        templates.join(","),
        conversations.join(",")
    );
    let py = python();
    let script = common::repo_root().join("tests/chat_render.py");
    let mut child = Command::new(&py)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} (scripts/setup.sh installs python3-jinja2 for /usr/bin/python3; \
                 EDGELLM_JINJA2_PYTHON names another): {e}",
                py.display()
            )
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(job.as_bytes())
        .expect("write the job to chat_render.py");
    let out = child.wait_with_output().expect("chat_render.py ran");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} {} failed ({}); it needs Jinja2 (Debian's python3-jinja2: run scripts/setup.sh):\n{stderr}",
        py.display(),
        script.display(),
        out.status
    );
    let rows: Vec<Vec<Value>> =
        serde_json::from_slice(&out.stdout).expect("chat_render.py prints JSON");
    assert_eq!(rows.len(), templates.len(), "one row per template");
    rows.into_iter()
        .map(|row| {
            assert_eq!(row.len(), cases.len(), "one entry per case");
            row.into_iter()
                .map(|r| match (r["text"].as_str(), r["error"].as_str()) {
                    (Some(t), _) => Ok(t.to_owned()),
                    (_, Some(e)) => Err(e.to_owned()),
                    _ => panic!("chat_render.py answered {r}"),
                })
                .collect()
        })
        .collect()
}

/// What the comparison found, over all templates.
#[derive(Default)]
struct Tally {
    /// Cases Jinja2 rendered: edgellm must render them identically.
    compared: usize,
    equal: usize,
    /// Cases Jinja2 raised on, and whether edgellm failed on them too.
    jinja2_raises: usize,
    both_raise: usize,
    /// Templates Jinja2 raised on: how many of their cases, and the first error.
    raising: Vec<(String, usize, String)>,
    /// The failure report: a template, a case and a diff for each case that differs.
    failures: String,
}

fn describe(c: &Case) -> String {
    let roles: Vec<&str> = c.messages.iter().map(|m| m.role.as_str()).collect();
    format!(
        "[{}] add_generation_prompt={}",
        roles.join(", "),
        c.add_generation_prompt
    )
}

/// Where two texts part, with some context from each, plus both texts whole.
fn diff(want: &str, got: &str) -> String {
    let at = want
        .char_indices()
        .zip(got.chars())
        .find(|((_, a), b)| a != b)
        .map_or(want.len().min(got.len()), |((i, _), _)| i);
    let from = want[..at]
        .char_indices()
        .rev()
        .nth(60)
        .map_or(0, |(i, _)| i);
    let tail = |s: &str| s[at.min(s.len())..].chars().take(80).collect::<String>();
    format!(
        "    first difference at byte {at}, after {:?}\n    jinja2:  {:?}\n    edgellm: {:?}\n    \
         jinja2 whole:  {want:?}\n    edgellm whole: {got:?}\n",
        &want[from..at],
        tail(want),
        tail(got)
    )
}

/// Renders `cases` with `edgellm` and compares with Jinja2's `want`, adding to `t`.
fn compare(
    t: &mut Tally,
    name: &str,
    edgellm: &Result<ChatTemplate, String>,
    cases: &[Case],
    want: &[Result<String, String>],
) {
    for (c, w) in cases.iter().zip(want) {
        let got = match edgellm {
            Ok(tmpl) => tmpl
                .render(&c.messages, c.add_generation_prompt)
                .map_err(|e| e.to_string()),
            Err(e) => Err(format!("does not compile: {e}")),
        };
        match (w, got) {
            (Ok(w), Ok(g)) => {
                t.compared += 1;
                if *w == g {
                    t.equal += 1;
                } else {
                    let _ = writeln!(t.failures, "{name} {}: texts differ", describe(c));
                    t.failures.push_str(&diff(w, &g));
                }
            }
            (Ok(_), Err(e)) => {
                t.compared += 1;
                let _ = writeln!(
                    t.failures,
                    "{name} {}: jinja2 renders it, edgellm fails: {e}",
                    describe(c)
                );
            }
            (Err(_), got) => {
                t.jinja2_raises += 1;
                t.both_raise += usize::from(got.is_err());
            }
        }
    }
    let errors: Vec<&String> = want.iter().filter_map(|w| w.as_ref().err()).collect();
    if let Some(first) = errors.first() {
        t.raising
            .push((name.to_owned(), errors.len(), (*first).clone()));
    }
}

/// The UTC day: a template that prints today's date (`strftime_now`) renders differently on
/// either side of midnight, so a comparison that straddled one is run again.
fn utc_day() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400)
}

/// Compares every `(name, source)` template on `cases`: Jinja2 gets `bos`/`eos`, edgellm the
/// template `edgellm(source)` compiles.
fn compare_all(
    templates: &[(String, String)],
    cases: &[Case],
    bos: &str,
    eos: &str,
    edgellm: &dyn Fn(&str) -> Result<ChatTemplate, String>,
) -> Tally {
    loop {
        let day = utc_day();
        let sources: Vec<&str> = templates.iter().map(|(_, s)| s.as_str()).collect();
        let want = jinja2_render(&sources, cases, bos, eos);
        let mut t = Tally::default();
        for ((name, source), want) in templates.iter().zip(&want) {
            compare(&mut t, name, &edgellm(source), cases, want);
        }
        if utc_day() == day {
            return t;
        }
    }
}

fn report(what: &str, t: &Tally, started: Instant) {
    eprintln!(
        "{what}: {} cases jinja2 renders, {} equal; {} skipped because jinja2 raises ({} of them \
         fail in edgellm too); {:.1} s",
        t.compared,
        t.equal,
        t.jinja2_raises,
        t.both_raise,
        started.elapsed().as_secs_f64()
    );
    for (name, n, e) in &t.raising {
        eprintln!("  jinja2 raises on {n} cases of {name}: {e}");
    }
}

fn assert_all_equal(what: &str, t: &Tally) {
    assert!(
        t.failures.is_empty(),
        "{what}: {} of {} cases that jinja2 renders differ in edgellm:\n{}",
        t.compared - t.equal,
        t.compared,
        t.failures
    );
}

/// `models/templates/` of the llama.cpp tree; panics saying how to get it when it is missing.
fn llama_cpp_templates() -> Vec<(String, String)> {
    let dir = common::llama_cpp_src().join("models/templates");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run `bench/build-llamacpp.sh --source-only` (or set \
                 EDGELLM_LLAMACPP_SRC to a llama.cpp source tree)",
                dir.display()
            )
        })
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "jinja"))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "{} has no .jinja templates: is it llama.cpp's source?",
        dir.display()
    );
    files
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let source =
                std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, source)
        })
        .collect()
}

#[test]
fn every_llama_cpp_template_renders_as_jinja2_renders_it() {
    let started = Instant::now();
    let templates = llama_cpp_templates();
    let cases = cases();
    let t = compare_all(&templates, &cases, BOS, EOS, &|src| {
        ChatTemplate::new(src, BOS, EOS).map_err(|e| e.to_string())
    });
    report(
        &format!(
            "{} llama.cpp templates × {} cases",
            templates.len(),
            cases.len()
        ),
        &t,
        started,
    );
    assert_all_equal("llama.cpp templates", &t);
    // A renderer that raises on everything would compare nothing: most cases must render.
    assert!(
        t.compared * 4 > (t.compared + t.jinja2_raises) * 3,
        "jinja2 rendered only {} of {} cases: is tests/chat_render.py set up as transformers is?",
        t.compared,
        t.compared + t.jinja2_raises
    );
}

/// A model's own template, as edgellm loads it (with the tokenizer's BOS/EOS texts), against
/// Jinja2 given the same texts; every case must render on both sides. Returns the template.
fn check_model(path: &Path, cases: &[Case]) -> ChatTemplate {
    let started = Instant::now();
    let g = Gguf::open(path, &OpenOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&g).expect("tokenizer");
    let source = g
        .metadata()
        .opt_str("tokenizer.chat_template")
        .expect("metadata")
        .expect("the model has a chat template")
        .to_owned();
    let text = |id: Option<u32>| {
        id.and_then(|i| tok.token_text(i))
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (text(tok.bos()), text(tok.eos()));
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let t = compare_all(&[(name.clone(), source)], cases, &bos, &eos, &|_| {
        ChatTemplate::from_gguf(&g, &tok).map_err(|e| e.to_string())
    });
    report(&name, &t, started);
    assert_all_equal(&name, &t);
    assert_eq!(t.jinja2_raises, 0, "jinja2 renders every case of {name}");
    ChatTemplate::from_gguf(&g, &tok).expect("chat template")
}

#[test]
fn smollm2_template_renders_as_jinja2_renders_it() {
    check_model(&common::model_path("q4_1"), &cases());
}

#[test]
fn qwen_coder_template_renders_as_jinja2_renders_it_with_and_without_a_system_message() {
    let path = common::cached_model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let cases = cases();
    // Without a system message Qwen's template writes its own default one: both kinds of
    // conversation are among the cases.
    assert!(cases.iter().any(|c| c.messages[0].role == "system"));
    assert!(cases.iter().any(|c| c.messages[0].role != "system"));
    let chat = check_model(&path, &cases);
    // The two kinds differ as Qwen's template means them to: its default system prompt, or
    // the conversation's own.
    const DEFAULT: &str = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.";
    let user = chat.render(&cases[0].messages, true).unwrap();
    assert!(user.starts_with(DEFAULT), "{user:?}");
    let system = chat.render(&cases[2].messages, true).unwrap();
    assert!(
        system.starts_with("<|im_start|>system\nYou are a terse assistant.<|im_end|>"),
        "{system:?}"
    );
}

/// Jinja constructs real templates use, each on its own, so that a difference names its cause:
/// loop controls and neighbours, transformers' `{% generation %}` block and its scope, `tojson`
/// as transformers defines it, Python's spelling of None and booleans, string methods,
/// namespaces and the filters templates lean on.
const CONSTRUCTS: &[(&str, &str)] = &[
    (
        "loop controls",
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}\
         {{ m.role }}:{{ m.content }}\n{% if m.role == 'assistant' %}{% break %}{% endif %}\
         {% endfor %}",
    ),
    (
        "loop neighbours",
        "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }}>\
         {{ m.role }}>{{ loop.nextitem.role if loop.nextitem else '-' }} \
         {{ loop.index }}/{{ loop.length }} {{ loop.first }}{{ loop.last }}\n{% endfor %}",
    ),
    (
        "generation block",
        "{% for m in messages %}{% set x = 'outer' %}\n  {% if m.role == 'assistant' %}\n  \
         {%- generation -%}\n {% set x = 'inner' %}[{{ m.content }}|{{ x }}]\n\
         {% endgeneration %}\n{% endif %}{{ x }}\n{% endfor %}",
    ),
    (
        "message items",
        "{% for m in messages %}{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}\
         {{ m.get('name', 'anon') }} {{ m['role'] }} {{ m.content is string }}\n{% endfor %}",
    ),
    (
        "tojson",
        r#"{{ messages|tojson }}
{{ {'b': 1, 'a': [1.5, none, true, false, 1.5e20, 0.0001, 0.00001, 100.0, -3], 'é': 'tab	"q" \\ <b> & x'}|tojson }}
{{ messages[0]|tojson(indent=2) }}
{{ {'b': {'y': [], 'x': {}}, 'a': [1, [2, 'z']]}|tojson(indent=2, sort_keys=true) }}
{{ messages|tojson(ensure_ascii=true) }}
{{ messages[-1]|tojson(separators=(',', ':')) }}
{{ messages|map(attribute='content')|list|tojson(indent='--') }}
{{ 'x\x01\x7f'|tojson }} {{ 'x\x01\x7f'|tojson(ensure_ascii=true) }}"#,
    ),
    (
        "python values",
        "{{ tools }}|{{ documents }}|{{ none }}|{{ true }}|{{ false }}|{{ tools|string }}|\
         {{ add_generation_prompt }}|{{ (messages|length > 2)|string }}|{{ tools is defined }}|\
         {{ tools is none }}|{{ documents is not none }}",
    ),
    (
        "python tests",
        "{{ tools is iterable }} {{ nothing is iterable }} {{ 'x' is iterable }} \
         {{ messages is iterable }} {{ 1 is iterable }} {{ messages[0] is iterable }} \
         {{ 'x' is sequence }} {{ messages[0] is sequence }} {{ nothing is sequence }} \
         {{ tools is sequence }} {{ true is number }} {{ 1.5 is number }} {{ 'x' is number }} \
         {{ messages[0].tool_calls|length }} {{ nothing|count }} {{ messages|count }} \
         {{ tools is mapping }} {{ messages[0] is mapping }} {{ none|default('d') }} \
         {{ nothing|default('d') }} {{ ''|default('d', true) }} \
         {{ ['b', 'A', 'a', 'B']|sort|join }} {{ ['b', 'A', 'a', 'B']|unique|join }} \
         {{ 'line one\nline two\n'|indent(4, true) }}|{{ 'a\n\nb\r\nc\n'|indent(2, blank=true) }}|\
         {{ 'a\n\nb'|indent('> ') }}|{{ messages[-1].content|indent }}|{{ '  x  '|trim }}|\
         {{ 'xxhixx'|trim('x') }}",
    ),
    (
        "string methods",
        "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.split(' ')|length }}|\
         {{ m.content.startswith(('Hi', 'Hello')) }}|{{ m.content.upper() }}|{{ m.role.title() }}|\
         {{ '{}-{}'.format(m.role, loop.index) }}|{{ m.content.replace(' ', '_') }}|\
         {{ m.content|trim }}|{{ m.content.lstrip().rstrip('. ') }}|{{ m.content.split('\\n')[0] }}|\
         {{ m.content[:5] }}|{{ m.content.endswith('?') }}|{{ m.content.find('o') }}\n{% endfor %}",
    ),
    (
        "namespaces and filters",
        "{% set ns = namespace(n=0, last='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}\
         {% set ns.last = m.role %}{% endfor %}{{ ns.n }} {{ ns.last }} \
         {{ messages|map(attribute='role')|join(',') }} \
         {{ messages|selectattr('role', 'equalto', 'user')|list|length }} \
         {{ (messages|last).content|length }} {{ messages[1:]|length }} \
         {{ messages|rejectattr('role', 'eq', 'system')|map(attribute='content')|first }} \
         {{ messages[0].content|default('none', true) }} \
         {% set d = {'b': 2, 'a': 1, 'C': 3} %}{% for k, v in d|dictsort %}{{ k }}{{ v }}{% endfor %} \
         {% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %} {{ 'a\\nb'|indent(2) }} \
         {{ messages|length is divisibleby(2) }} {{ [3, 1, 2]|sort|join }} {{ 7 // 2 }} {{ 7 / 2 }}",
    ),
];

#[test]
fn the_constructs_templates_use_render_as_jinja2_renders_them() {
    let started = Instant::now();
    let templates: Vec<(String, String)> = CONSTRUCTS
        .iter()
        .map(|(n, s)| (n.to_string(), s.to_string()))
        .collect();
    let cases = cases();
    let t = compare_all(&templates, &cases, BOS, EOS, &|src| {
        ChatTemplate::new(src, BOS, EOS).map_err(|e| e.to_string())
    });
    report("constructs", &t, started);
    assert_all_equal("constructs", &t);
    assert_eq!(t.jinja2_raises, 0, "jinja2 renders every construct");
}
