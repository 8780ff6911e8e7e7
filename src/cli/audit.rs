//! `edgellm audit list|show|verify|replay`: read the daemon's audit trail, check its chain,
//! and replay an answer to show it comes out the same.

use super::CliResult;
use super::common::StateDirArgs;
use edgellm::audit::{self, Entry, Kind, read, replay};
use edgellm::model::{LoadOptions, Model};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

/// Read, check and replay the audit trail of a state directory.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm audit list --last 20
  edgellm audit show 118
  edgellm audit verify --state-dir /var/lib/edgellm
  edgellm audit replay 118 -m /usr/share/edgellm/models/smollm2-135m-q4_1.gguf --threads 1

The daemon writes one entry per request it ends (an answer, or a refusal with its code) to
STATE_DIR/audit/, each holding the SHA-256 of the one before. verify exits with status 1 and
names the first entry that was edited, removed, replaced or cut short; entries rotated out
under audit.max_bytes are reported, not counted as missing. replay needs the texts
(audit.texts = true in the daemon's configuration): it runs the entry's prompt ids again with
its model (checked by SHA-256), context, cache type and sampling settings, on any thread
count, and exits with status 1 unless the answer hashes the same.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// One line per entry: sequence number, time, source, request id, how it ended, tokens.
    List(ListArgs),
    /// One entry, whole, as JSON (with its hash).
    Show(ShowArgs),
    /// Check every entry's hash and its link to the one before; exit 1 at the first bad one.
    Verify(StateDirArgs),
    /// Run an entry again with the same model and settings; exit 1 unless the answer matches.
    Replay(ReplayArgs),
}

#[derive(clap::Args)]
struct ListArgs {
    #[command(flatten)]
    dir: StateDirArgs,
    /// Only the last N entries.
    #[arg(long)]
    last: Option<usize>,
}

#[derive(clap::Args)]
struct ShowArgs {
    /// The entry's sequence number (`audit list` shows them).
    seq: u64,
    #[command(flatten)]
    dir: StateDirArgs,
}

#[derive(clap::Args)]
struct ReplayArgs {
    /// The entry's sequence number.
    seq: u64,
    /// The model file the entry was answered with (its SHA-256 must be the entry's).
    #[arg(short = 'm', long, env = "EDGELLM_MODEL")]
    model: PathBuf,
    /// Worker threads for the replay (the answer must not depend on them).
    #[arg(short = 't', long, default_value_t = 1)]
    threads: usize,
    #[command(flatten)]
    dir: StateDirArgs,
}

pub fn run(a: Args) -> CliResult {
    match a.command {
        Command::List(l) => list(&l),
        Command::Show(s) => show(&s),
        Command::Verify(d) => verify(&d),
        Command::Replay(r) => replay_one(&r),
    }
}

/// The trail's directory, which must be there: a state directory that does not exist (a typo,
/// the wrong machine) or holds no trail is said so, never read as a trail with no entries.
fn trail(d: &StateDirArgs) -> Result<PathBuf, String> {
    use std::io::ErrorKind::NotFound;
    let state = &d.state_dir;
    match std::fs::metadata(state) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{}: not a directory", state.display())),
        Err(e) if e.kind() == NotFound => {
            return Err(format!(
                "{}: no such state directory (the daemon's state.dir)",
                state.display()
            ));
        }
        Err(e) => return Err(format!("{}: {e}", state.display())),
    }
    let dir = state.join(audit::DIR);
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(format!("{}: not a directory", dir.display())),
        Err(e) if e.kind() == NotFound => Err(format!(
            "{}: holds no audit trail (the daemon writes one in {}/ when audit.enabled is on)",
            state.display(),
            audit::DIR
        )),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

fn list(l: &ListArgs) -> CliResult {
    let dir = trail(&l.dir)?;
    let mut rows: std::collections::VecDeque<Result<Entry, String>> = Default::default();
    read::each_line(&dir, |line| {
        rows.push_back(
            line.entry
                .map(|(e, _)| e)
                .map_err(|reason| format!("{} line {}: {reason}", line.file.display(), line.line)),
        );
        if l.last.is_some_and(|n| rows.len() > n) {
            rows.pop_front();
        }
        true
    })?;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    for r in rows {
        match r {
            Ok(e) if l.dir.json => {
                let v = json!({
                    "seq": e.seq, "time": e.time, "kind": e.kind, "id": e.id,
                    "source": e.source, "session": e.session, "turn": e.turn,
                    "finish": e.finish,
                    "error": e.error.as_ref().map(|x| x.code), "usage": e.usage,
                });
                writeln!(out, "{v}")?;
            }
            Ok(e) => writeln!(out, "{}", row(&e))?,
            Err(bad) if l.dir.json => writeln!(out, "{}", json!({ "damaged": bad }))?,
            Err(bad) => writeln!(out, "damaged: {bad}")?,
        }
    }
    Ok(())
}

/// `118  2026-12-01T10:00:02.114Z  mqtt:plc/7/answers  req-42  eog  12+31 tokens (restored 40)`
fn row(e: &Entry) -> String {
    let how = match (e.kind, &e.finish, &e.error) {
        (Kind::Answer, Some(f), _) => serde_json::to_value(f)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        (_, _, Some(err)) => format!("refused {}", err.code),
        _ => "?".into(),
    };
    let u = &e.usage;
    let mut s = format!(
        "{:>6}  {}  {}  {}  {how}  {}+{} tokens",
        e.seq, e.time, e.source, e.id, u.prompt_tokens, u.completion_tokens
    );
    if u.restored_tokens > 0 {
        s.push_str(&format!(" (restored {})", u.restored_tokens));
    }
    if let Some(sess) = &e.session {
        s.push_str(&format!("  session {sess}"));
        if let Some(t) = e.turn {
            s.push_str(&format!(" turn {t}"));
        }
    }
    s
}

fn show(s: &ShowArgs) -> CliResult {
    let (e, hash) = read::find(&trail(&s.dir)?, s.seq)?;
    let mut v = serde_json::to_value(&e)?;
    v["hash"] = json!(hash);
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn verify(d: &StateDirArgs) -> CliResult {
    let dir = trail(d)?;
    let v = read::verify(&dir)?;
    if d.json {
        println!("{}", serde_json::to_string(&v)?);
    } else if v.entries == 0 && v.bad.is_none() {
        println!("{}: no entries", dir.display());
    } else if v.entries > 0 {
        let (first, last) = (v.first_seq.unwrap_or(0), v.last_seq.unwrap_or(0));
        let mut msg = format!("{}: entries {first} to {last} verify", dir.display());
        if first > 1 {
            msg.push_str(&format!(" ({} earlier entries rotated out)", first - 1));
        }
        if v.tails_cut > 0 {
            msg.push_str(&format!(
                "; {} torn tail(s) cut by the daemon after power loss",
                v.tails_cut
            ));
        }
        println!("{msg}");
    }
    match v.bad {
        None => Ok(()),
        Some(b) => Err(format!(
            "entry {} ({} line {}): {}",
            b.seq,
            b.file.display(),
            b.line,
            b.reason
        )
        .into()),
    }
}

fn replay_one(r: &ReplayArgs) -> CliResult {
    let (e, _) = read::find(&trail(&r.dir)?, r.seq)?;
    let sha =
        audit::file_sha256(&r.model).map_err(|err| format!("{}: {err}", r.model.display()))?;
    replay::check_model(&e, &sha)?;
    let model = Model::load(&r.model, &LoadOptions::default()).map_err(|err| err.to_string())?;
    let got = replay::replay(&e, Arc::new(model), r.threads)?;
    if r.dir.json {
        println!("{}", serde_json::to_string(&got)?);
    } else {
        println!(
            "entry {}: {} tokens replayed on {} thread(s) ({}): {}",
            got.seq,
            got.tokens,
            got.threads,
            got.kernels,
            if got.matches {
                format!("the answer matches (sha256 {})", got.answer_sha256)
            } else {
                "the answer differs".to_owned()
            }
        );
    }
    if got.matches {
        Ok(())
    } else {
        Err(format!(
            "entry {}: the replayed answer differs from the recorded one (first at generated \
             token {}; recorded sha256 {}, replayed {})",
            got.seq,
            got.first_difference.unwrap_or(0),
            e.answer_sha256.as_deref().unwrap_or("?"),
            got.answer_sha256
        )
        .into())
    }
}
