//! `edgellm sessions list|show|delete`: the named sessions of a state directory, read from
//! their conversation logs and snapshot files, without a daemon.

use super::CliResult;
use super::common::StateDirArgs;
use edgellm::engine::store::SessionId;
use edgellm::engine::store::conversation;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The named sessions of a state directory.
#[derive(clap::Args)]
#[command(after_help = "\
Examples:
  edgellm sessions list
  edgellm sessions show shift-a --state-dir /var/lib/edgellm
  edgellm sessions delete shift-a

A named session is a conversation the daemon keeps: STATE_DIR/sessions/<name>.conv holds its
messages, <name>.kv the model's cache of them. list and show only read, and work while the
daemon runs (a turn being written is shown once it is whole). delete is refused while a daemon
holds the state directory, whose memory holds the session too: ask the daemon instead (RESET
<name> on the serial line, {\"session\": \"<name>\", \"reset\": true} over MQTT, /reset on the
console, Modbus MODE 2), or stop it first.")]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Subcommand)]
enum Command {
    /// One line per session: name, turns, messages, bytes of conversation and of cache, age.
    List(StateDirArgs),
    /// One session's conversation, one message a paragraph (or JSON).
    Show(NameArgs),
    /// Forget a session: its conversation and its cache (not while a daemon runs).
    Delete(NameArgs),
}

#[derive(clap::Args)]
struct NameArgs {
    /// The session's name: 1-64 of A-Z a-z 0-9 _ - . (not starting with . or -).
    name: SessionId,
    #[command(flatten)]
    dir: StateDirArgs,
}

pub fn run(a: Args) -> CliResult {
    match a.command {
        Command::List(d) => list(&d),
        Command::Show(n) => show(&n),
        Command::Delete(n) => delete(&n),
    }
}

/// What a session's files say.
struct Info {
    name: String,
    turns: u64,
    messages: usize,
    conv_bytes: u64,
    kv_bytes: u64,
    /// Seconds since either file last changed.
    age_s: Option<u64>,
}

fn sessions_dir(d: &StateDirArgs) -> Result<PathBuf, String> {
    let dir = d.state_dir.join("sessions");
    if !d.state_dir.is_dir() {
        return Err(format!(
            "{} is not a directory: give the daemon's state directory (state.dir)",
            d.state_dir.display()
        ));
    }
    Ok(dir)
}

/// The conversation logged at `path` (none when there is no log or it is not one).
fn read_log(path: &Path) -> Result<Option<conversation::Conversation>, String> {
    conversation::read(path).map_err(|e| e.to_string())
}

fn info(dir: &Path, name: &str) -> Result<Info, String> {
    let conv = dir.join(format!("{name}.conv"));
    let kv = dir.join(format!("{name}.kv"));
    let c = read_log(&conv)?;
    let meta = |p: &Path| std::fs::metadata(p).ok();
    let newest = [meta(&conv), meta(&kv)]
        .into_iter()
        .flatten()
        .filter_map(|m| m.modified().ok())
        .max();
    Ok(Info {
        name: name.to_owned(),
        turns: c.as_ref().map_or(0, |c| c.turns),
        messages: c.as_ref().map_or(0, |c| c.messages.len()),
        conv_bytes: meta(&conv).map_or(0, |m| m.len()),
        kv_bytes: meta(&kv).map_or(0, |m| m.len()),
        age_s: newest.and_then(|t| t.elapsed().ok()).map(|d| d.as_secs()),
    })
}

fn list(d: &StateDirArgs) -> CliResult {
    let dir = sessions_dir(d)?;
    let mut names = std::collections::BTreeSet::new();
    if let Ok(rd) = std::fs::read_dir(&dir) {
        for e in rd.flatten() {
            let f = e.file_name().to_string_lossy().into_owned();
            let stem = f.strip_suffix(".conv").or_else(|| f.strip_suffix(".kv"));
            if let Some(s) = stem.filter(|s| SessionId::parse(s).is_ok()) {
                names.insert(s.to_owned());
            }
        }
    }
    let infos: Vec<Info> = names
        .iter()
        .map(|n| info(&dir, n))
        .collect::<Result<_, _>>()?;
    if d.json {
        let v: Vec<_> = infos
            .iter()
            .map(|i| {
                json!({"name": i.name, "turns": i.turns, "messages": i.messages,
                    "conversation_bytes": i.conv_bytes, "cache_bytes": i.kv_bytes,
                    "age_s": i.age_s})
            })
            .collect();
        println!("{}", serde_json::Value::from(v));
        return Ok(());
    }
    if infos.is_empty() {
        println!("no sessions in {}", d.state_dir.display());
    }
    for i in &infos {
        let age = i.age_s.map_or("?".to_owned(), |s| format!("{s} s ago"));
        println!(
            "{}  turns={} messages={} conversation={} B cache={} B  changed {age}",
            i.name, i.turns, i.messages, i.conv_bytes, i.kv_bytes
        );
    }
    Ok(())
}

fn show(n: &NameArgs) -> CliResult {
    let dir = sessions_dir(&n.dir)?;
    let name = n.name.as_str();
    let c = read_log(&dir.join(format!("{name}.conv")))?;
    let Some(c) = c else {
        let kv = dir.join(format!("{name}.kv")).exists();
        return Err(if kv {
            format!("session {name} has a cache but no conversation (a raw-text session)")
        } else {
            format!("no session {name} in {}", n.dir.state_dir.display())
        }
        .into());
    };
    if n.dir.json {
        let msgs: Vec<_> = c
            .messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        println!(
            "{}",
            json!({"name": name, "turns": c.turns, "system": c.system, "messages": msgs})
        );
        return Ok(());
    }
    println!("{}", c.transcript());
    Ok(())
}

fn delete(n: &NameArgs) -> CliResult {
    let dir = sessions_dir(&n.dir)?;
    let name = n.name.as_str();
    // Held until the files are gone, so that a daemon starting meanwhile waits for it.
    let _held = match edgellm::kv::file::try_lock(&n.dir.state_dir.join("LOCK")) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Err(format!(
                "a daemon holds {} (its LOCK): ask it to forget the session instead (RESET {name} \
                 on the serial line, {{\"session\": \"{name}\", \"reset\": true}} over MQTT, \
                 /reset on the console, Modbus MODE 2), or stop the daemon first",
                n.dir.state_dir.display()
            )
            .into());
        }
        Err(e) => return Err(format!("{}: {e}", n.dir.state_dir.display()).into()),
        Ok(l) => l,
    };
    let mut gone = 0;
    for ext in ["conv", "kv"] {
        let p = dir.join(format!("{name}.{ext}"));
        match std::fs::remove_file(&p) {
            Ok(()) => gone += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display()).into()),
        }
    }
    if gone == 0 {
        return Err(format!("no session {name} in {}", n.dir.state_dir.display()).into());
    }
    println!("session {name} deleted");
    Ok(())
}
