//! One session kept in one snapshot file of the caller's choosing (no state directory): the
//! store's restore policy ([`super::restore`]) and a lock beside the file, so two processes
//! never write it at once.

use super::restore::{self, LoadReport};
use super::{Source, StoreError, TurnReport};
use crate::engine::{Engine, GenOutput, GenParams, Sampler, Session};
use crate::kv::Geometry;
use crate::kv::file::{self, SnapshotFile};
use std::fs::File;
use std::path::{Path, PathBuf};

/// A session restored from its file, saved back to it after each turn.
pub struct SessionFile {
    /// `F.lock`, held while we may write `F`.
    _lock: Option<nix::fcntl::Flock<File>>,
    path: PathBuf,
    session: Session,
    file: Option<SnapshotFile>,
    /// Where the session came from, reported with the first turn.
    source: Option<(Source, LoadReport)>,
}

impl SessionFile {
    /// Locks `path` and restores it into a new session of `engine`. Fails only when another
    /// process holds the file or its lock cannot be taken; a bad file is moved aside and an
    /// unreadable one left alone (and never saved over), as the store does.
    pub fn open(engine: &mut Engine, path: &Path) -> Result<SessionFile, StoreError> {
        // A lock file beside F, not F itself: a rewrite renames a new file over F, and a lock on
        // the old inode would not exclude a process that opens the new one.
        let mut lock_path = path.as_os_str().to_os_string();
        lock_path.push(".lock");
        let lock = file::try_lock(Path::new(&lock_path)).map_err(|source| {
            if source.kind() == std::io::ErrorKind::WouldBlock {
                StoreError::FileLocked {
                    file: path.to_path_buf(),
                }
            } else {
                StoreError::File {
                    file: PathBuf::from(&lock_path),
                    source,
                }
            }
        })?;
        let ec = engine.config();
        let g = Geometry::of(engine.model(), ec.n_ctx, ec.kv_type);
        let mut session = engine.new_session();
        let label = path.display().to_string();
        let r = restore::restore(engine, &mut session, SnapshotFile::new(path, g), &label);
        Ok(SessionFile {
            _lock: lock,
            path: path.to_path_buf(),
            session,
            file: r.file,
            source: Some((r.source, r.load)),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Generates after `prompt` in the session, then appends the new positions to the file. A
    /// failed save is reported in the [`TurnReport`], never as an error.
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(GenOutput, TurnReport), StoreError> {
        let out = engine.generate(&mut self.session, prompt, params, sampler, is_eog, on_token)?;
        let save = restore::save(self.file.as_mut(), &self.session);
        match &save {
            Ok(kind) => {
                tracing::info!(file = %self.path.display(), ?kind, "session saved")
            }
            Err(e) => {
                tracing::error!(file = %self.path.display(), "session not saved (the answer is unaffected): {e}")
            }
        }
        let (source, load) = self
            .source
            .take()
            .unwrap_or((Source::Ram, LoadReport::default()));
        Ok((
            out,
            TurnReport {
                source,
                load,
                prefix_tokens: 0,
                save,
                file: self.path.clone(),
                file_tokens: self.file.as_ref().map_or(0, |f| f.tokens().len()),
            },
        ))
    }
}
