//! Named sessions kept on flash under a state directory, with a RAM budget (resident sessions,
//! the least recently used evicted) and a disk budget (the oldest snapshot files deleted), and
//! system prompts computed once, persisted, and restored at start-up.
//!
//! The state directory:
//!
//! ```text
//! LOCK                  advisory lock (flock): one process owns the directory
//! sessions/<id>.kv      one snapshot per named session (docs/kv-format.md)
//! sessions/<id>.conv    its conversation: the messages the snapshot is a cache of
//! prefixes/<hash>.kv    one snapshot per system prompt (hash of model, context, type, tokens)
//! answers.journal       the MQTT front end's last answers (not this module's: see mqtt::journal)
//! ```
//!
//! A request names a session and brings its whole prompt (the service renders it from the
//! session's conversation, `conversation`). The store takes the session's K/V
//! rows from RAM, or else from its file, or else from the longest cached prefix (a system
//! prompt, or another resident session) that the prompt begins with, and the engine computes
//! only the rest. After generating, the new positions are appended to the session's file. No
//! failure to read or write flash fails a request: it is logged, counted in [`StoreStatus`],
//! and the answer is computed from what is left.

pub mod conversation;
mod id;
mod prefix;
mod restore;
mod single;

pub use id::{IdError, MAX_ID_LEN, SessionId};
pub use prefix::PrefixReport;
pub use restore::{LoadReport, SaveError};
pub use single::SessionFile;

use super::{Engine, EngineError, GenOutput, GenParams, Sampler, Session};
use crate::kv::file::{self, SnapshotFile};
use crate::kv::{Geometry, SaveKind};
use prefix::Prefix;
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Errors of the session store. Only opening can fail for reasons of the flash; requests fail
/// only on bad input.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    BadId(#[from] IdError),
    #[error(
        "state directory {dir} is in use by another edgellm process (its LOCK is held): stop that process or use another state directory"
    )]
    Locked { dir: PathBuf },
    #[error("{}: in use by another edgellm process (its .lock is held)", file.display())]
    FileLocked { file: PathBuf },
    #[error("{}: {source}", file.display())]
    File {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {dir}: {source}")]
    Dir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("system prompt: {0}")]
    Prefix(String),
    #[error(
        "session {id} cannot be taken now: it, or every session held in RAM, is in use by an answer being decoded"
    )]
    AllInUse { id: SessionId },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Where the store lives and how much it may hold.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub dir: PathBuf,
    /// RAM for resident sessions' KV caches; at least one session is always resident.
    pub ram_bytes: u64,
    /// Flash for snapshot files (sessions and system prompts); when a save goes over it, the
    /// least recently saved sessions' files are deleted (never a system prompt's, never the
    /// session just saved).
    pub disk_bytes: u64,
    /// Most session files kept; past it, the least recently saved are deleted the same way.
    /// `None`: as many as the disk budget holds.
    pub max_sessions: Option<usize>,
}

impl StoreConfig {
    /// Sessions kept resident when each KV cache is `per_session` bytes: as many as
    /// `ram_bytes` holds, at least one.
    pub fn max_resident(&self, per_session: u64) -> u64 {
        (self.ram_bytes / per_session.max(1)).max(1)
    }
}

/// Counters and the last error, for a status request or a log line.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StoreStatus {
    pub resident: usize,
    pub max_resident: usize,
    /// Bytes of the resident sessions' and system prompts' KV caches.
    pub ram_bytes: u64,
    pub disk_bytes: u64,
    pub disk_budget: u64,
    pub prefixes: usize,
    /// Sessions restored from their files.
    pub restored: u64,
    /// Snapshot files refused (moved aside); their tokens were recomputed when intact.
    pub refused: u64,
    /// Torn last records (interrupted saves) cut off the session files at start.
    pub tails_cut: u64,
    pub saves: u64,
    pub save_failures: u64,
    /// Sessions dropped from RAM (their files keep them).
    pub evicted_ram: u64,
    /// Session files deleted to stay within the disk budget, or within the most sessions kept.
    pub evicted_disk: u64,
    /// Sessions dropped from RAM that were not on flash (a save had failed): lost.
    pub lost: u64,
    /// The directory could not be locked (read-only): another process could write it too.
    pub unlocked: bool,
    pub last_error: Option<String>,
}

/// How a request's session was found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "from")]
pub enum Source {
    /// Resident in RAM.
    Ram,
    /// Restored from its file: `tokens` positions. When the last record was torn (a save cut
    /// by a power loss, or damaged rows) its tokens, if intact, were `recomputed`.
    File {
        tokens: usize,
        torn_tail: bool,
        recomputed: usize,
    },
    /// No file: a new session.
    New,
    /// The file was refused (moved aside); `recomputed` tokens salvaged from it were computed
    /// again.
    Refused { why: String, recomputed: usize },
    /// The file could not be read; the session starts empty and is not saved over it.
    Unreadable { why: String },
}

/// What one request did besides generating.
#[derive(Clone, Debug)]
pub struct TurnReport {
    pub source: Source,
    /// What loading the session's file did (empty when the session was resident).
    pub load: LoadReport,
    /// Positions taken from a cached prefix (a system prompt, or another session) instead of
    /// the session itself.
    pub prefix_tokens: usize,
    /// `Ok` with what was written, or why the save failed (the answer is unaffected).
    pub save: Result<SaveKind, SaveError>,
    /// The session's snapshot file, and the tokens it holds after the save.
    pub file: PathBuf,
    pub file_tokens: usize,
}

/// One resident session.
struct Slot {
    id: Option<SessionId>,
    session: Session,
    /// `None` when the file exists but could not be read: never overwrite what we cannot read.
    file: Option<SnapshotFile>,
    /// The file holds every token of the session.
    saved: bool,
    /// What the last load from flash did, for the next turn's report.
    load: LoadReport,
    last_used: u64,
    /// Taken by an answer ([`Lease`]): neither evicted nor given to another answer.
    leased: bool,
}

/// A named session taken for one answer ([`SessionStore::lease`]): it stays in RAM, and no
/// other answer uses it, until it is given back ([`SessionStore::give_back`]) or released.
/// An answer decoded beside others holds one while the batch goes on.
#[derive(Debug)]
pub struct Lease {
    slot: usize,
    id: SessionId,
    source: Source,
    load: LoadReport,
    prefix_tokens: usize,
}

impl Lease {
    /// The session's place in the store: the same for no two leases held at once.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The session's name.
    pub fn id(&self) -> &SessionId {
        &self.id
    }
}

/// Sessions on flash and in RAM, and the system prompts.
pub struct SessionStore {
    dir: PathBuf,
    geometry: Geometry,
    slots: Vec<Slot>,
    max_resident: usize,
    prefixes: Vec<Prefix>,
    disk_budget: u64,
    max_sessions: Option<usize>,
    clock: u64,
    status: StoreStatus,
    /// Held for the store's lifetime; `None` when the directory is read-only.
    _lock: Option<nix::fcntl::Flock<File>>,
}

const SESSIONS: &str = "sessions";
const PREFIXES: &str = "prefixes";
/// Most system prompts a store holds.
pub const MAX_PREFIXES: usize = 16;

impl SessionStore {
    /// Opens (creating it if needed) the state directory for `engine`'s model and context.
    /// Fails only when another process holds the directory or it cannot be created; a
    /// read-only directory opens (nothing will be saved, and each failure is reported).
    pub fn open(engine: &Engine, cfg: StoreConfig) -> Result<SessionStore, StoreError> {
        let dir = cfg.dir.clone();
        let dir_err = |source| StoreError::Dir {
            dir: dir.clone(),
            source,
        };
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(dir_err)?;
        }
        let mut status = StoreStatus {
            disk_budget: cfg.disk_bytes,
            ..Default::default()
        };
        let lock = lock_dir(&dir)?;
        if lock.is_none() {
            status.unlocked = true;
            tracing::warn!(dir = %dir.display(), "state directory is read-only: cannot lock it, nothing will be saved");
        }
        for sub in [SESSIONS, PREFIXES] {
            let d = dir.join(sub);
            if let Err(e) = std::fs::create_dir_all(&d) {
                status.last_error = Some(format!("{}: {e}", d.display()));
                tracing::warn!(dir = %d.display(), "cannot create: {e}");
            }
            remove_stale_temporaries(&d);
        }
        let ec = engine.config();
        let geometry = Geometry::of(engine.model(), ec.n_ctx, ec.kv_type);
        let per_session = crate::engine::session_kv_bytes(engine.model(), ec)
            .unwrap_or(u64::MAX)
            .max(1);
        let max_resident = cfg.max_resident(per_session) as usize;
        status.max_resident = max_resident;
        tracing::info!(
            dir = %dir.display(),
            max_resident,
            session_mib = per_session >> 20,
            disk_budget_mib = cfg.disk_bytes >> 20,
            "session store open"
        );
        let mut store = SessionStore {
            dir,
            geometry,
            slots: Vec::new(),
            max_resident,
            prefixes: Vec::new(),
            disk_budget: cfg.disk_bytes,
            max_sessions: cfg.max_sessions,
            clock: 0,
            status,
            _lock: lock,
        };
        store.cut_torn_tails();
        store.status.disk_bytes = store.disk_usage().total;
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// At start, checks every session file and cuts off a torn last record: a save that a power
    /// cut or a crash interrupted, whose answer was never sent (the final message follows the
    /// save). The files are then as `edgellm kv verify` passes them, before any request. A file
    /// damaged before its end, or made for another model or context, is left for its first
    /// load, which moves it aside and salvages its tokens. Costs one read of the sessions.
    fn cut_torn_tails(&mut self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join(SESSIONS)) else {
            return;
        };
        let started = std::time::Instant::now();
        let (mut files, mut cut, mut left) = (0u32, 0u32, 0u32);
        for e in rd.flatten() {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "kv") {
                continue;
            }
            files += 1;
            match crate::kv::file::cut_torn_tail(&path, &self.geometry) {
                Ok(None) => {}
                Ok(Some(t)) => {
                    cut += 1;
                    tracing::warn!(file = %path.display(), "{t}: cut off at start");
                }
                Err(err) => {
                    left += 1;
                    tracing::warn!(file = %path.display(), "left for its first load: {err}");
                }
            }
        }
        self.status.tails_cut += u64::from(cut);
        if files > 0 {
            tracing::info!(
                files,
                torn_tails_cut = cut,
                left_for_load = left,
                ms = started.elapsed().as_millis() as u64,
                "session files checked"
            );
        }
    }

    /// The snapshot file of session `id`.
    pub fn session_path(&self, id: &SessionId) -> PathBuf {
        self.dir.join(SESSIONS).join(format!("{id}.kv"))
    }

    /// The conversation log of session `id` (`conversation`), beside its snapshot.
    pub fn conversation_path(&self, id: &SessionId) -> PathBuf {
        self.dir.join(SESSIONS).join(format!("{id}.conv"))
    }

    pub fn status(&self) -> StoreStatus {
        let mut s = self.status.clone();
        s.resident = self.slots.iter().filter(|s| s.id.is_some()).count();
        s.prefixes = self.prefixes.len();
        s.ram_bytes = self
            .slots
            .iter()
            .map(|s| s.session.kv.bytes() as u64)
            .chain(self.prefixes.iter().map(|p| p.bytes()))
            .sum();
        s
    }

    /// The tokens session `id` holds (loading it from flash if it is not resident): a front end
    /// that receives only the next message appends it to these.
    pub fn tokens(&mut self, engine: &mut Engine, id: &SessionId) -> Result<&[u32], StoreError> {
        let (slot, _) = self.checkout(engine, id)?;
        Ok(self.slots[slot].session.tokens())
    }

    /// Generates after `prompt` in session `id`: restores what it can (RAM, file, cached
    /// prefix), computes the rest, generates, and appends the new positions to the session's
    /// file. A failed save is reported in the [`TurnReport`], never as an error.
    #[allow(clippy::too_many_arguments)]
    pub fn generate(
        &mut self,
        engine: &mut Engine,
        id: &SessionId,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        is_eog: &dyn Fn(u32) -> bool,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(GenOutput, TurnReport), StoreError> {
        let lease = self.lease(engine, id, prompt)?;
        let s = self.session(&lease);
        match engine.generate(s, prompt, params, sampler, is_eog, on_token) {
            Ok(out) => Ok((out, self.give_back(lease))),
            Err(e) => {
                self.release(lease);
                Err(e.into())
            }
        }
    }

    /// Whether session `id` can be leased now: no answer holds it, and it is in RAM or a slot
    /// can take it (a free one, a new one within the RAM budget, or one to evict).
    pub fn can_lease(&self, id: &SessionId) -> bool {
        match self.slots.iter().find(|s| s.id.as_ref() == Some(id)) {
            Some(s) => !s.leased,
            None => self.slots.len() < self.max_resident || self.slots.iter().any(|s| !s.leased),
        }
    }

    /// Takes session `id` for an answer after `prompt`: restores what it can (RAM, file, cached
    /// prefix) into a session kept in RAM until [`give_back`](Self::give_back). The engine
    /// then computes the rest of the prompt in it and generates, alone or beside others.
    pub fn lease(
        &mut self,
        engine: &mut Engine,
        id: &SessionId,
        prompt: &[u32],
    ) -> Result<Lease, StoreError> {
        if !self.can_lease(id) {
            return Err(StoreError::AllInUse { id: id.clone() });
        }
        let (slot, source) = self.checkout(engine, id)?;
        let load = match source {
            Source::Ram => LoadReport::default(),
            _ => std::mem::take(&mut self.slots[slot].load),
        };
        let prefix_tokens = self.reuse_prefix(slot, prompt);
        self.slots[slot].leased = true;
        Ok(Lease {
            slot,
            id: id.clone(),
            source,
            load,
            prefix_tokens,
        })
    }

    /// The session a lease holds.
    pub fn session(&mut self, lease: &Lease) -> &mut Session {
        &mut self.slots[lease.slot].session
    }

    /// Every leased session, by its lease's place: what a batched step takes its sessions from.
    pub fn leased_sessions(&mut self) -> impl Iterator<Item = (usize, &mut Session)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.leased)
            .map(|(i, s)| (i, &mut s.session))
    }

    /// Gives back a session whose answer has ended: its new positions are appended to its file.
    pub fn give_back(&mut self, lease: Lease) -> TurnReport {
        let Lease {
            slot,
            id,
            source,
            load,
            prefix_tokens,
        } = lease;
        self.slots[slot].leased = false;
        let save = self.save_slot(slot);
        let file_tokens = self.slots[slot]
            .file
            .as_ref()
            .map_or(0, |f| f.tokens().len());
        TurnReport {
            source,
            load,
            prefix_tokens,
            save,
            file: self.session_path(&id),
            file_tokens,
        }
    }

    /// Gives back a session whose answer failed, unsaved (as the engine left it).
    pub fn release(&mut self, lease: Lease) {
        self.slots[lease.slot].leased = false;
    }

    /// Forgets session `id`: drops it from RAM and deletes its file.
    pub fn delete(&mut self, id: &SessionId) -> Result<(), StoreError> {
        if let Some(s) = self.slots.iter_mut().find(|s| s.id.as_ref() == Some(id)) {
            s.id = None;
            s.session.truncate(0);
        }
        for path in [self.session_path(id), self.conversation_path(id)] {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(StoreError::Dir { dir: path, source }),
            }
        }
        Ok(())
    }

    /// Makes `id` resident and returns its slot and where it came from.
    fn checkout(
        &mut self,
        engine: &mut Engine,
        id: &SessionId,
    ) -> Result<(usize, Source), StoreError> {
        self.clock += 1;
        if let Some(i) = self.slots.iter().position(|s| s.id.as_ref() == Some(id)) {
            self.slots[i].last_used = self.clock;
            return Ok((i, Source::Ram));
        }
        let i = self
            .free_slot(engine)
            .ok_or_else(|| StoreError::AllInUse { id: id.clone() })?;
        let f = SnapshotFile::new(self.session_path(id), self.geometry.clone());
        let slot = &mut self.slots[i];
        slot.id = Some(id.clone());
        slot.last_used = self.clock;
        // Never the previous occupant's file, whatever happens below.
        slot.file = None;
        let r = restore::restore(engine, &mut slot.session, f, id.as_str());
        slot.file = r.file;
        slot.saved = r.saved;
        slot.load = r.load;
        match &r.source {
            Source::File { .. } => self.status.restored += 1,
            Source::Refused { why, .. } => {
                self.status.refused += 1;
                self.status.last_error = Some(format!("session {id}: {why}"));
            }
            Source::Unreadable { why } => self.status.last_error = Some(why.clone()),
            Source::New | Source::Ram => {}
        }
        Ok((i, r.source))
    }

    /// A slot to load a session into: a free one, a new one within the RAM budget, or the least
    /// recently used one that no answer holds (evicted; its file keeps it). `None` when every
    /// slot is leased.
    fn free_slot(&mut self, engine: &Engine) -> Option<usize> {
        if let Some(i) = self.slots.iter().position(|s| s.id.is_none() && !s.leased) {
            return Some(i);
        }
        if self.slots.len() < self.max_resident {
            self.slots.push(Slot {
                id: None,
                session: engine.new_session(),
                file: None,
                saved: true,
                load: LoadReport::default(),
                last_used: 0,
                leased: false,
            });
            return Some(self.slots.len() - 1);
        }
        // Least recently used, preferring sessions whose file holds them.
        let i = (0..self.slots.len())
            .filter(|&i| !self.slots[i].leased)
            .min_by_key(|&i| (!self.slots[i].saved, self.slots[i].last_used))?;
        if !self.slots[i].saved && self.save_slot(i).is_err() {
            self.status.lost += 1;
            tracing::error!(
                session = %self.slots[i].id.as_ref().map_or("", |s| s.as_str()),
                "session evicted from RAM without a snapshot on flash: its context is lost"
            );
        }
        let s = &mut self.slots[i];
        tracing::debug!(session = %s.id.as_ref().map_or("", |s| s.as_str()), "session evicted from RAM");
        s.id = None;
        s.session.truncate(0);
        self.status.evicted_ram += 1;
        Some(i)
    }

    /// Saves slot `i`'s new positions, then keeps the directory within the disk budget.
    fn save_slot(&mut self, i: usize) -> Result<SaveKind, SaveError> {
        let s = &mut self.slots[i];
        match restore::save(s.file.as_mut(), &s.session) {
            Ok(kind) => {
                s.saved = true;
                self.status.saves += 1;
                let keep = s.id.clone();
                // The budget deletes the least recently *written* files first. A turn that adds
                // no position (a session at its context's end) writes nothing, so its file
                // would age while the session is in use and be deleted before idle ones (the
                // likely cause of a hot session lost in the soak test): its time is brought up
                // to date instead.
                if kind == SaveKind::Unchanged
                    && let Some(id) = &keep
                {
                    let now = std::time::SystemTime::now();
                    let touched = File::options()
                        .write(true)
                        .open(self.session_path(id))
                        .and_then(|f| f.set_modified(now));
                    if let Err(e) = touched {
                        tracing::debug!(session = %id, "cannot update the file's time: {e}");
                    }
                }
                self.enforce_disk_budget(keep.as_ref());
                Ok(kind)
            }
            // Nothing was tried: the failure to read the file was reported when it happened.
            Err(e @ SaveError::Unreadable) => Err(e),
            Err(e) => {
                s.saved = false;
                self.status.save_failures += 1;
                tracing::error!(session = %s.id.as_ref().map_or("", |s| s.as_str()), "session not saved (the answer is unaffected): {e}");
                self.status.last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Deletes the least recently written session files until the directory fits the disk
    /// budget and holds at most `max_sessions` of them.
    fn enforce_disk_budget(&mut self, keep: Option<&SessionId>) {
        let usage = self.disk_usage();
        let mut total = usage.total;
        let mut count = usage.sessions.len();
        let keep = keep.map(|k| format!("{k}.kv"));
        for (_, name, len) in usage.sessions {
            let too_many = self.max_sessions.is_some_and(|m| count > m);
            if total <= self.disk_budget && !too_many {
                break;
            }
            if Some(&name) == keep.as_ref() {
                continue;
            }
            let path = self.dir.join(SESSIONS).join(&name);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), "cannot delete for the disk budget: {e}");
                continue;
            }
            total -= len;
            count -= 1;
            self.status.evicted_disk += 1;
            if too_many {
                // Past the most sessions kept, the session itself goes: its conversation too.
                let conv = path.with_extension("conv");
                if let Ok(m) = std::fs::metadata(&conv)
                    && std::fs::remove_file(&conv).is_ok()
                {
                    total = total.saturating_sub(m.len());
                }
            }
            let why = if too_many {
                "most sessions kept"
            } else {
                "disk budget"
            };
            tracing::info!(file = %path.display(), bytes = len, "session file deleted ({why})");
            // A resident session whose file was deleted starts a new one on its next save.
            if let Some(s) = self
                .slots
                .iter_mut()
                .find(|s| s.id.as_ref().is_some_and(|id| format!("{id}.kv") == name))
            {
                s.file = Some(SnapshotFile::new(path, self.geometry.clone()));
                s.saved = false;
            }
        }
        if total > self.disk_budget {
            tracing::warn!(
                bytes = total,
                budget = self.disk_budget,
                "state directory is over its disk budget with nothing left to delete"
            );
        }
        self.status.disk_bytes = total;
    }

    /// Bytes of every snapshot, and the session files oldest first.
    fn disk_usage(&self) -> DiskUsage {
        let mut usage = DiskUsage::default();
        for sub in [SESSIONS, PREFIXES] {
            let Ok(rd) = std::fs::read_dir(self.dir.join(sub)) else {
                continue;
            };
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Ok(m) = e.metadata() else { continue };
                if !m.is_file() {
                    continue;
                }
                usage.total += m.len();
                if sub == SESSIONS && name.ends_with(".kv") {
                    let t = m.modified().unwrap_or(std::time::UNIX_EPOCH);
                    usage.sessions.push((t, name, m.len()));
                }
            }
        }
        usage.sessions.sort();
        usage
    }
}

#[derive(Default)]
struct DiskUsage {
    total: u64,
    /// `(modified, file name, bytes)`, oldest first.
    sessions: Vec<(std::time::SystemTime, String, u64)>,
}

/// Takes the directory's advisory lock. `Ok(None)` when the directory is read-only and has no
/// lock file to lock.
fn lock_dir(dir: &Path) -> Result<Option<nix::fcntl::Flock<File>>, StoreError> {
    file::try_lock(&dir.join("LOCK")).map_err(|source| {
        if source.kind() == std::io::ErrorKind::WouldBlock {
            StoreError::Locked {
                dir: dir.to_path_buf(),
            }
        } else {
            StoreError::Dir {
                dir: dir.to_path_buf(),
                source,
            }
        }
    })
}

/// Removes `*.tmp-<pid>` files a crash left mid-rewrite (we hold the lock: nobody else writes).
fn remove_stale_temporaries(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.contains(".kv.tmp-") || name.contains(".conv.tmp-") {
            let p = e.path();
            match std::fs::remove_file(&p) {
                Ok(()) => {
                    tracing::info!(file = %p.display(), "removed a temporary file left by a crash")
                }
                Err(err) => {
                    tracing::warn!(file = %p.display(), "cannot remove stale temporary: {err}")
                }
            }
        }
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
