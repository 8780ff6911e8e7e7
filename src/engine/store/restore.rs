//! The one restore policy for a session's snapshot file, used by the store's named sessions and
//! by a lone session file alike: restore what is valid, recompute a torn last turn whose token
//! ids are intact, move a refused file aside (keeping its salvageable tokens), and never write
//! over a file that could not be read.

use super::Source;
use crate::engine::{Engine, Session};
use crate::kv::KvError;
use crate::kv::file::{self, SnapshotFile};
use serde::Serialize;
use std::path::PathBuf;

/// Why a session's new positions were not saved (the answer is unaffected).
#[derive(Clone, Debug, thiserror::Error)]
pub enum SaveError {
    #[error("not saved: the session's file could not be read, so it is not written over")]
    Unreadable,
    #[error("{0}")]
    Write(std::sync::Arc<KvError>),
}

impl Serialize for SaveError {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// What loading a session's file did, beyond where its tokens came from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadReport {
    /// Positions restored from the file (without those recomputed).
    pub tokens: usize,
    /// The torn last record that was dropped, if any.
    pub torn_tail: Option<String>,
    /// Why the file was refused or could not be read.
    pub error: Option<String>,
    /// Where a refused file was moved.
    pub moved_to: Option<PathBuf>,
}

/// The outcome of [`restore`].
pub(super) struct Restored {
    pub source: Source,
    pub load: LoadReport,
    /// The file to save to: `None` when it exists but could not be read.
    pub file: Option<SnapshotFile>,
    /// The file holds every token of the session.
    pub saved: bool,
}

/// Restores `path` into `session` (emptied first). `label` names the session in logs.
pub(super) fn restore(
    engine: &mut Engine,
    session: &mut Session,
    mut f: SnapshotFile,
    label: &str,
) -> Restored {
    session.truncate(0);
    let path = f.path().to_path_buf();
    let geometry = f.geometry().clone();
    let mut load = LoadReport::default();
    match f.load(&mut session.kv) {
        Ok(torn) if f.tokens().is_empty() && torn.is_none() && !path.exists() => Restored {
            source: Source::New,
            load,
            file: Some(f),
            saved: true,
        },
        Ok(torn) => {
            session.restore_tokens(f.tokens());
            load.tokens = f.tokens().len();
            let mut recomputed = 0;
            if let Some(t) = &torn {
                tracing::warn!(session = label, file = %path.display(), "{t}");
                load.torn_tail = Some(t.to_string());
                // A torn last turn whose token ids are intact is computed again.
                let salvaged = file::salvage_tokens(&path, &geometry);
                if let Some(rest) = salvaged.strip_prefix(f.tokens()).filter(|r| !r.is_empty()) {
                    recomputed = recompute(engine, session, rest, label);
                }
            }
            tracing::info!(
                session = label,
                tokens = f.tokens().len(),
                recomputed,
                "session restored from flash"
            );
            Restored {
                source: Source::File {
                    tokens: f.tokens().len(),
                    torn_tail: torn.is_some(),
                    recomputed,
                },
                load,
                file: Some(f),
                saved: recomputed == 0,
            }
        }
        Err(e @ KvError::Io { .. }) => {
            tracing::error!(
                session = label,
                "session file unreadable, starting empty: {e}"
            );
            load.error = Some(e.to_string());
            Restored {
                source: Source::Unreadable { why: e.to_string() },
                load,
                file: None,
                saved: false,
            }
        }
        Err(e) => {
            // Keep the tokens if they are intact: the conversation is recomputed, not lost.
            let salvaged = file::salvage_tokens(&path, &geometry);
            match file::move_aside(&path) {
                Ok(to) => {
                    tracing::warn!(session = label, to = %to.display(), "session file refused and moved aside: {e}");
                    load.moved_to = Some(to);
                }
                Err(m) => {
                    tracing::error!(
                        session = label,
                        "session file refused ({e}); cannot move it aside: {m}"
                    )
                }
            }
            load.error = Some(e.to_string());
            let recomputed = recompute(engine, session, &salvaged, label);
            Restored {
                source: Source::Refused {
                    why: e.to_string(),
                    recomputed,
                },
                load,
                file: Some(SnapshotFile::new(&path, geometry)),
                saved: false,
            }
        }
    }
}

/// Feeds `tokens` salvaged from a damaged file after what the session holds; returns how many
/// were computed. Token ids are covered by a checksum, not checked against the vocabulary: a
/// crafted file can hold ids the engine refuses, and then the session keeps what it had.
fn recompute(engine: &mut Engine, s: &mut Session, tokens: &[u32], label: &str) -> usize {
    if tokens.is_empty() {
        return 0;
    }
    let keep = s.tokens().len();
    match engine.feed(s, tokens) {
        Ok(_) => tokens.len(),
        Err(e) => {
            tracing::warn!(session = label, "salvaged tokens not recomputed: {e}");
            s.truncate(keep);
            0
        }
    }
}

/// Saves the session's new positions to `f` (when there is a file to save to).
pub(super) fn save(
    f: Option<&mut SnapshotFile>,
    session: &Session,
) -> Result<crate::kv::SaveKind, SaveError> {
    let f = f.ok_or(SaveError::Unreadable)?;
    f.save(&session.kv, session.tokens())
        .map_err(|e| SaveError::Write(std::sync::Arc::new(e)))
}
