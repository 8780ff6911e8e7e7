//! Where `edgellm run` keeps a conversation: one snapshot file (`--session-file`), or a named
//! session in a state directory (`--state-dir`, `--session`) with its system prompt cached.

use edgellm::engine::store::{PrefixReport, SessionId, SessionStore, StoreConfig, TurnReport};
use edgellm::engine::{Engine, Session};
use edgellm::kv::{Geometry, SaveKind, SnapshotFile, file};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The session file of a run: the snapshot to save to (none when the file could not be read),
/// and what its load did, for the JSON report.
pub(super) struct SessionFile {
    /// `F.lock`, held while we may write `F`.
    _lock: Option<nix::fcntl::Flock<std::fs::File>>,
    file: Option<SnapshotFile>,
    path: PathBuf,
    load: serde_json::Value,
}

/// Restores `path` into `session`. Any fault is logged with its reason; a file that exists but
/// is not a valid snapshot of this model is moved aside, and the session starts empty. A file
/// that cannot be read (an I/O error) is left alone and not saved to.
pub(super) fn restore(
    path: &Path,
    g: Geometry,
    session: &mut Session,
) -> Result<SessionFile, String> {
    // A lock file beside F, not F itself: a rewrite renames a new file over F, and a lock on
    // the old inode would not exclude a process that opens the new one.
    let mut lock_path = path.as_os_str().to_os_string();
    lock_path.push(".lock");
    let lock = match file::try_lock(Path::new(&lock_path)) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            return Err(format!(
                "{}: in use by another edgellm process (its .lock is held)",
                path.display()
            ));
        }
        Err(e) => return Err(format!("{}.lock: {e}", path.display())),
    };
    let mut f = SnapshotFile::new(path, g.clone());
    let (file, load) = match f.load(&mut session.kv) {
        Ok(torn) => {
            if let Some(t) = &torn {
                tracing::warn!(file = %path.display(), "session file: {t}");
            }
            session.restore_tokens(f.tokens());
            tracing::info!(file = %path.display(), tokens = f.tokens().len(), "session restored");
            let load = json!({
                "tokens": f.tokens().len(),
                "torn_tail": torn.map(|t| t.to_string()),
            });
            (Some(f), load)
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), "session file not restored: {e}");
            session.truncate(0);
            if matches!(e, edgellm::kv::KvError::Io { .. }) {
                (None, json!({ "tokens": 0, "error": e.to_string() }))
            } else {
                let moved = match file::move_aside(path) {
                    Ok(to) => {
                        tracing::warn!(to = %to.display(), "bad session file moved aside");
                        Some(to)
                    }
                    Err(e) => {
                        tracing::error!("cannot move the bad session file aside: {e}");
                        None
                    }
                };
                let load = json!({ "tokens": 0, "error": e.to_string(), "moved_to": moved });
                (Some(SnapshotFile::new(path, g)), load)
            }
        }
    };
    Ok(SessionFile {
        _lock: lock,
        file,
        path: path.to_path_buf(),
        load,
    })
}

/// Saves the session's new positions; returns the JSON report.
pub(super) fn save(sf: &mut SessionFile, session: &Session) -> serde_json::Value {
    let mut v = match &mut sf.file {
        Some(f) => save_to(f, session),
        None => {
            tracing::error!("session not saved: its file could not be read");
            json!({
                "saved": false,
                "error": "not saved: the session file could not be read",
            })
        }
    };
    v["file"] = json!(sf.path);
    v["load"] = sf.load.clone();
    v
}

fn save_to(f: &mut SnapshotFile, session: &Session) -> serde_json::Value {
    match f.save(&session.kv, session.tokens()) {
        Ok(kind) => {
            let (write, positions, bytes) = match kind {
                SaveKind::Unchanged => ("unchanged", 0, 0),
                SaveKind::Appended { positions, bytes } => ("appended", positions, bytes),
                SaveKind::Rewritten { positions, bytes } => ("rewritten", positions, bytes),
            };
            tracing::info!(file = %f.path().display(), write, positions, bytes, "session saved");
            json!({
                "saved": true,
                "write": write,
                "positions_written": positions,
                "bytes_written": bytes,
                "tokens": f.tokens().len(),
            })
        }
        Err(e) => {
            tracing::error!("session not saved (the answer is unaffected): {e}");
            json!({
                "saved": false,
                "error": e.to_string(),
                "tokens": f.tokens().len(),
            })
        }
    }
}

/// A parsed byte size: `4096`, `64K`, `256M`, `2G` (powers of 1024).
pub(super) fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 10),
        Some((i, 'm' | 'M')) => (&s[..i], 20),
        Some((i, 'g' | 'G')) => (&s[..i], 30),
        _ => (s, 0),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("{s:?} is not a size (e.g. 4096, 64K, 256M, 2G)"))
}

/// A named session in a state directory, and the system prompt cached for it.
pub(super) struct StoreRun {
    pub store: SessionStore,
    pub id: SessionId,
    pub system: Option<PrefixReport>,
}

impl StoreRun {
    pub fn open(
        engine: &Engine,
        dir: &Path,
        id: SessionId,
        disk_bytes: u64,
    ) -> Result<StoreRun, String> {
        let cfg = StoreConfig {
            dir: dir.to_path_buf(),
            // One resident session: a run answers one request.
            ram_bytes: 0,
            disk_bytes,
        };
        let store = SessionStore::open(engine, cfg).map_err(|e| e.to_string())?;
        Ok(StoreRun {
            store,
            id,
            system: None,
        })
    }

    /// Caches `prefix` (a chat template's system turn, tokenized) for this and later runs, if
    /// the prompt begins with at least two of its tokens; a failure only costs speed.
    pub fn cache_system_prompt(&mut self, engine: &mut Engine, prefix: &[u32], prompt: &[u32]) {
        let n = prefix
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        if n < 2 || n >= prompt.len() {
            return;
        }
        match self.store.add_system_prompt(engine, &prompt[..n]) {
            Ok(r) => self.system = Some(r),
            Err(e) => tracing::warn!("system prompt not cached: {e}"),
        }
    }

    /// The JSON report of the turn: where the session came from, the save, the store's status.
    pub fn report(&self, turn: &TurnReport) -> serde_json::Value {
        let mut v = json!({
            "id": self.id.as_str(),
            "file": self.store.session_path(&self.id),
            "source": turn.source,
            "prefix_tokens": turn.prefix_tokens,
            "status": self.store.status(),
        });
        match &turn.save {
            Ok(kind) => {
                v["saved"] = json!(true);
                v["write"] = json!(kind);
            }
            Err(e) => {
                v["saved"] = json!(false);
                v["error"] = json!(e);
            }
        }
        if let Some(s) = &self.system {
            v["system_prompt"] = json!(s);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_take_binary_suffixes_and_refuse_nonsense() {
        use super::parse_size;
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        for bad in ["", "M", "-1", "1.5G", "99999999999G", "12T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
