//! `edgellm bench --profile`: one profiled pp and tg pass per thread count, shown as a table
//! per phase, a "profile" JSON field, and (`--svg`) a bar chart readable without a legend.

use edgellm::engine::{Engine, Session};
use edgellm::runtime::{Op, OpStat, Profile};
use serde_json::{Value, json};
use std::fmt::Write as _;
use std::time::Instant;

/// The per-op times of one profiled phase (pp or tg) at one thread count.
pub struct Phase {
    /// `pp128`, `tg64`: as in the bench table.
    pub name: String,
    pub threads: usize,
    pub tokens: usize,
    /// Measured wall time of the whole phase.
    pub wall_ns: u64,
    /// Ops that ran at least once, in forward-pass order.
    pub ops: Vec<(Op, OpStat)>,
}

/// One line of the table or chart: an op, or the unaccounted rest ("other").
struct Row {
    name: &'static str,
    /// `None` for "other".
    op: Option<Op>,
    calls: u64,
    ns: u64,
    bytes: u64,
}

impl Phase {
    fn new(name: String, threads: usize, tokens: usize, wall_ns: u64, p: &Profile) -> Phase {
        Phase {
            name,
            threads,
            tokens,
            wall_ns,
            ops: p.ops().filter(|(_, s)| s.calls > 0).collect(),
        }
    }

    /// Wall time not spent in any timed op (loop bookkeeping, clock reads, waits): what makes
    /// the table add up to the measured time.
    pub fn other_ns(&self) -> u64 {
        let sum: u64 = self.ops.iter().map(|(_, s)| s.ns).sum();
        self.wall_ns.saturating_sub(sum)
    }

    /// Ops by time, most expensive first, then "other".
    fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .ops
            .iter()
            .map(|&(op, s)| Row {
                name: op.name(),
                op: Some(op),
                calls: s.calls,
                ns: s.ns,
                bytes: s.bytes,
            })
            .collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.ns));
        rows.push(Row {
            name: "other",
            op: None,
            calls: 0,
            ns: self.other_ns(),
            bytes: 0,
        });
        rows
    }

    fn ms_per_token(&self, ns: u64) -> f64 {
        ns as f64 / 1e6 / self.tokens.max(1) as f64
    }

    fn pct(&self, ns: u64) -> f64 {
        100.0 * ns as f64 / self.wall_ns.max(1) as f64
    }

    fn title(&self) -> String {
        let per_tok = self.ms_per_token(self.wall_ns);
        format!(
            "{}, {} thread{}: {:.2} ms, {:.3} ms/token ({:.1} t/s)",
            self.name,
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.wall_ns as f64 / 1e6,
            per_tok,
            1000.0 / per_tok.max(1e-9)
        )
    }
}

/// GB/s of weights a matrix op streamed (bytes per ns = GB/s).
fn gbps(r: &Row) -> Option<f64> {
    (r.op.is_some_and(Op::is_matrix) && r.ns > 0).then(|| r.bytes as f64 / r.ns as f64)
}

/// Runs one profiled pp pass (`prompt` from an empty cache) and one profiled tg pass (`n_gen`
/// tokens decoded one at a time, greedy, sampling timed) and returns their profiles.
pub fn run(
    e: &mut Engine,
    s: &mut Session,
    depth: usize,
    prompt: &[u32],
    n_gen: usize,
) -> Result<Vec<Phase>, String> {
    let threads = e.config().threads;
    let mut phases = Vec::new();
    e.set_profiling(true);
    if !prompt.is_empty() {
        if s.truncate(depth) != depth {
            return Err(format!(
                "the session cannot be rewound to the depth {depth}"
            ));
        }
        e.profile_mut().reset();
        let t0 = Instant::now();
        e.feed(s, prompt).map_err(|e| e.to_string())?;
        let wall = t0.elapsed().as_nanos() as u64;
        let name = format!("pp{}{}", prompt.len(), at_depth(depth));
        phases.push(Phase::new(name, threads, prompt.len(), wall, e.profile()));
    }
    if n_gen > 0 {
        if s.truncate(depth) != depth {
            return Err(format!(
                "the session cannot be rewound to the depth {depth}"
            ));
        }
        e.profile_mut().reset();
        let t0 = Instant::now();
        // As bench's tg run, with the argmax timed as the sampling step.
        let mut tok = 1u32;
        for _ in 0..n_gen {
            let logits = e.feed(s, &[tok]).map_err(|e| e.to_string())?;
            let ts = Instant::now();
            tok = edgellm::engine::sampler::argmax(logits) as u32;
            let ns = ts.elapsed().as_nanos() as u64;
            e.profile_mut().record_outside(Op::Sample, ns);
        }
        let wall = t0.elapsed().as_nanos() as u64;
        phases.push(Phase::new(
            format!("tg{n_gen}{}", at_depth(depth)),
            threads,
            n_gen,
            wall,
            e.profile(),
        ));
    }
    e.set_profiling(false);
    Ok(phases)
}

/// llama-bench's suffix for a test run after `depth` cached positions.
pub fn at_depth(depth: usize) -> String {
    match depth {
        0 => String::new(),
        d => format!(" @ d{d}"),
    }
}

/// The table of one phase, as markdown.
pub fn table(p: &Phase) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "profile {}", p.title());
    s.push_str("| op           |  calls |  total ms | ms/token |      % |  GB/s |\n");
    s.push_str("|--------------|-------:|----------:|---------:|-------:|------:|\n");
    for r in p.rows() {
        let calls = if r.op.is_some() {
            r.calls.to_string()
        } else {
            String::new()
        };
        let gb = gbps(&r).map_or(String::new(), |g| format!("{g:.2}"));
        let _ = writeln!(
            s,
            "| {:<12} | {calls:>6} | {:>9.3} | {:>8.4} | {:>5.1}% | {gb:>5} |",
            r.name,
            r.ns as f64 / 1e6,
            p.ms_per_token(r.ns),
            p.pct(r.ns)
        );
    }
    let _ = writeln!(
        s,
        "| {:<12} | {:>6} | {:>9.3} | {:>8.4} | {:>5.1}% | {:>5} |",
        "total",
        "",
        p.wall_ns as f64 / 1e6,
        p.ms_per_token(p.wall_ns),
        100.0,
        ""
    );
    s
}

/// The `"profile"` field of a bench JSON row: `{pp: {...}, tg: {...}}`, ops as objects.
pub fn json(phases: &[Phase]) -> Value {
    let mut o = serde_json::Map::new();
    for p in phases {
        let ops: Vec<Value> = p
            .rows()
            .iter()
            .map(|r| {
                json!({"op": r.name, "calls": r.calls, "total_ms": r.ns as f64 / 1e6,
                       "ms_per_token": p.ms_per_token(r.ns), "pct": p.pct(r.ns),
                       "gbps": gbps(r)})
            })
            .collect();
        let key = if p.name.starts_with("pp") { "pp" } else { "tg" };
        o.insert(
            key.to_string(),
            json!({"tokens": p.tokens, "wall_ms": p.wall_ns as f64 / 1e6,
                   "ms_per_token": p.ms_per_token(p.wall_ns), "ops": ops}),
        );
    }
    Value::Object(o)
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Bar colours by kind, so the chart reads without a legend beyond its one-line caption.
fn colour(op: Option<Op>) -> &'static str {
    match op {
        Some(op) if op.is_matrix() => "#4c78a8",
        Some(Op::Attention) => "#f58518",
        Some(Op::Sample) => "#54a24b",
        Some(_) => "#72b7b2",
        None => "#bab0ac",
    }
}

const W: usize = 980;
const LABEL_X: usize = 140;
const BAR_X: usize = 150;
const BAR_MAX: usize = 520;
const ROW_H: usize = 22;

/// A self-contained SVG: for each phase a title and one horizontal bar per op (most
/// expensive first), each labelled with its name, ms/token, share of the time and, for
/// weight matrices, GB/s.
pub fn svg(heading: &str, phases: &[&Phase]) -> String {
    let mut body = String::new();
    let mut y = 30;
    let _ = writeln!(
        body,
        r#"<text x="10" y="{y}" font-size="16" font-weight="bold">{}</text>"#,
        xml_escape(heading)
    );
    y += 20;
    let _ = writeln!(
        body,
        r##"<text x="10" y="{y}" fill="#555">blue: weight matrix products · orange: attention · teal: other kernels · green: sampling · grey: unaccounted</text>"##
    );
    y += 16;
    let _ = writeln!(
        body,
        r##"<text x="10" y="{y}" fill="#555">bars are scaled to the largest op of each chart; ms/token is per token processed (pp) or generated (tg)</text>"##
    );
    y += 16;
    for p in phases {
        y += 24;
        let _ = writeln!(
            body,
            r#"<text x="10" y="{y}" font-size="15" font-weight="bold">{}</text>"#,
            xml_escape(&p.title())
        );
        y += 10;
        let rows = p.rows();
        let max = rows.iter().map(|r| r.ns).max().unwrap_or(0).max(1);
        for r in &rows {
            let w = ((r.ns as f64 / max as f64) * BAR_MAX as f64).round() as usize;
            let mid = y + ROW_H / 2 + 4;
            let mut note = format!("{:.3} ms/token · {:.1}%", p.ms_per_token(r.ns), p.pct(r.ns));
            if let Some(g) = gbps(r) {
                let _ = write!(note, " · {g:.1} GB/s");
            }
            let _ = writeln!(
                body,
                r#"<text x="{LABEL_X}" y="{mid}" text-anchor="end">{}</text>"#,
                r.name
            );
            let _ = writeln!(
                body,
                r#"<rect x="{BAR_X}" y="{}" width="{}" height="{}" fill="{}"/>"#,
                y + 3,
                w.max(1),
                ROW_H - 6,
                colour(r.op)
            );
            let _ = writeln!(
                body,
                r#"<text x="{}" y="{mid}">{note}</text>"#,
                BAR_X + w.max(1) + 6
            );
            y += ROW_H;
        }
    }
    let h = y + 20;
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{h}\" \
         viewBox=\"0 0 {W} {h}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n{body}</svg>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase() -> Phase {
        let mut p = Profile::default();
        p.set_enabled(true);
        p.record_outside(Op::FfnDown, 6_000_000);
        p.record_outside(Op::Attention, 2_000_000);
        Phase::new("tg4".into(), 1, 4, 10_000_000, &p)
    }

    #[test]
    fn table_adds_up_to_the_wall_time() {
        let p = phase();
        assert_eq!(p.other_ns(), 2_000_000);
        let t = table(&p);
        assert!(t.contains("| ffn_down     |      1 |     6.000 |   1.5000 |  60.0% |"));
        assert!(t.contains("| other        |        |     2.000 |   0.5000 |  20.0% |"));
        assert!(t.contains("| total        |        |    10.000 |   2.5000 | 100.0% |"));
        // Most expensive first, "other" after the ops.
        let (fd, at, ot) = (
            t.find("ffn_down").unwrap(),
            t.find("attention").unwrap(),
            t.find("other").unwrap(),
        );
        assert!(fd < at && at < ot, "{t}");
    }

    #[test]
    fn svg_escapes_text_and_draws_one_bar_per_row() {
        let s = svg("a<b & c", &[&phase()]);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("a&lt;b &amp; c"));
        // Background + ffn_down, attention, other.
        assert_eq!(s.matches("<rect").count(), 4);
    }
}
