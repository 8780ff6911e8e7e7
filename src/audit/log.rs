//! Appending to the trail: one line per entry, synced before the answer goes out; segments
//! rotated under the budget; a torn last line (power cut mid-write) cut off at open and noted
//! in the next entry; a failed write (full or read-only disk) undone, counted, retried with
//! the next entry.

use super::read::{self, Segment};
use super::{AuditConfig, AuditError, EngineFacts, Entry, GENESIS, ModelFacts};
use crate::engine::EngineConfig;
use crate::service::{Event, Health, Recorder, Refusal, Request};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What the trail reports to the daemon's status (shared with the writer on the worker).
#[derive(Debug, Default)]
pub struct AuditState {
    /// Entries written since start.
    pub written: AtomicU64,
    /// Whether writes work (failures since start, and why the last failed until one works).
    pub health: Health,
    /// The last entry's sequence number.
    pub seq: AtomicU64,
}

/// The trail's writer. Owned by the service worker (through [`Recorder`]).
pub struct AuditLog {
    cfg: AuditConfig,
    /// Bytes of one segment before the next is started.
    segment_bytes: u64,
    /// The segments, oldest first; the last is the one appended to.
    segments: Vec<Segment>,
    /// The open last segment, and its length up to its last whole entry.
    pub(super) file: Option<File>,
    seq: u64,
    prev: String,
    /// A torn tail cut at open, not yet noted in an entry.
    tail_cut: Option<u64>,
    /// The model's facts; its SHA-256 is hashed in the background and waited for at the first
    /// entry (a few hundred ms after start at most).
    model: ModelFacts,
    model_sha256: Arc<OnceLock<String>>,
    state: Arc<AuditState>,
}

impl AuditLog {
    /// Opens (or creates) the trail in `cfg.dir`, cutting a torn last line and continuing the
    /// chain from the last entry. `state` is where the writer reports (the daemon's status
    /// reads it).
    pub fn open(
        cfg: AuditConfig,
        model: ModelFacts,
        model_sha256: Arc<OnceLock<String>>,
        state: Arc<AuditState>,
    ) -> Result<AuditLog, AuditError> {
        std::fs::create_dir_all(&cfg.dir).map_err(|e| AuditError::io(&cfg.dir, e))?;
        let segments = read::segments(&cfg.dir)?;
        let segment_bytes = (cfg.max_bytes / 4).max(4096);
        let mut log = AuditLog {
            segment_bytes,
            segments,
            file: None,
            seq: 0,
            prev: GENESIS.to_owned(),
            tail_cut: None,
            model,
            model_sha256,
            state,
            cfg,
        };
        if let Some(last) = log.segments.last_mut() {
            let tail = read::last_entry(&last.path)?;
            if tail.torn > 0 {
                // Power was lost mid-write: that entry's answer was never sent (the line is
                // synced first). Cut it, and say so in the next entry, so a cut made by
                // someone else is on record too.
                let f = OpenOptions::new()
                    .write(true)
                    .open(&last.path)
                    .map_err(|e| AuditError::io(&last.path, e))?;
                f.set_len(tail.good_len)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| AuditError::io(&last.path, e))?;
                tracing::warn!(
                    file = %last.path.display(),
                    bytes = tail.torn,
                    "audit trail: cut an incomplete last line (a write cut by power loss)"
                );
                log.tail_cut = Some(tail.torn);
            }
            last.len = tail.good_len;
            // The chain goes on from the newest entry, which is in an older segment when the
            // newest one is still empty (the power went just after it was made).
            let mut newest = tail.last;
            for older in log.segments.iter().rev().skip(1) {
                if newest.is_some() {
                    break;
                }
                newest = read::last_entry(&older.path)?.last;
            }
            if let Some((seq, hash)) = newest {
                log.seq = seq;
                log.prev = hash;
            }
        }
        log.state.seq.store(log.seq, Ordering::Relaxed);
        Ok(log)
    }

    pub fn state(&self) -> Arc<AuditState> {
        Arc::clone(&self.state)
    }

    /// Appends `entry` (its `seq`, `prev`, `time` and `tail_cut` are set here) and syncs it.
    pub fn append(&mut self, mut entry: Entry) -> Result<(), AuditError> {
        entry.seq = self.seq + 1;
        entry.prev = self.prev.clone();
        entry.time = super::rfc3339(std::time::SystemTime::now());
        entry.tail_cut = self.tail_cut;
        let (line, hash) = super::seal(&entry);
        self.write_line(&line)?;
        self.seq = entry.seq;
        self.prev = hash;
        self.tail_cut = None;
        self.state.seq.store(self.seq, Ordering::Relaxed);
        Ok(())
    }

    fn write_line(&mut self, line: &[u8]) -> Result<(), AuditError> {
        let full = self
            .segments
            .last()
            .is_none_or(|s| s.len > 0 && s.len + line.len() as u64 > self.segment_bytes);
        if full {
            self.start_segment()?;
        }
        let seg = self
            .segments
            .last_mut()
            .expect("a segment was just started");
        if self.file.is_none() {
            let f = OpenOptions::new()
                .append(true)
                .open(&seg.path)
                .map_err(|e| AuditError::io(&seg.path, e))?;
            self.file = Some(f);
        }
        let f = self.file.as_mut().expect("opened above");
        let res = f.write_all(line).and_then(|()| f.sync_data());
        if let Err(e) = res {
            // A part of the line may have reached the file (a disk that filled up mid-write):
            // take it back, so the next entry starts on a clean line. If even that fails, the
            // file is opened again (and cut) by the next attempt.
            let undone = f.set_len(seg.len).and_then(|()| f.sync_data());
            if undone.is_err() {
                self.file = None;
                if let Ok(f) = OpenOptions::new().write(true).open(&seg.path) {
                    let _ = f.set_len(seg.len);
                }
            }
            return Err(AuditError::io(&seg.path, e));
        }
        seg.len += line.len() as u64;
        Ok(())
    }

    /// Starts the next segment, then removes the oldest ones past the budget.
    fn start_segment(&mut self) -> Result<(), AuditError> {
        let n = self.segments.last().map_or(1, |s| s.number + 1);
        let path = self.cfg.dir.join(read::segment_name(n));
        let f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| AuditError::io(&path, e))?;
        // The new name must survive a power cut before entries are written into it.
        File::open(&self.cfg.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| AuditError::io(&self.cfg.dir, e))?;
        self.file = Some(f);
        self.segments.push(Segment {
            number: n,
            path,
            len: 0,
        });
        // The current segment always stays, whatever the budget.
        while self.segments.len() > 1
            && self.segments.iter().map(|s| s.len).sum::<u64>() + self.segment_bytes
                > self.cfg.max_bytes
        {
            let old = self.segments.remove(0);
            if let Err(e) = std::fs::remove_file(&old.path) {
                tracing::warn!(file = %old.path.display(), "audit trail: cannot rotate out: {e}");
            } else {
                tracing::info!(file = %old.path.display(), "audit trail: oldest segment rotated out");
            }
        }
        Ok(())
    }

    /// The directory of the trail.
    pub fn dir(&self) -> &PathBuf {
        &self.cfg.dir
    }
}

impl AuditLog {
    fn facts(&mut self, engine: &EngineConfig, kernels: &'static str) -> EngineFacts {
        if self.model.sha256.is_empty() {
            // Hashed since start in the background; an answer is seconds, the hash less.
            self.model.sha256 = self.model_sha256.wait().clone();
        }
        EngineFacts {
            kernels: kernels.to_owned(),
            threads: engine.threads,
            ctx: engine.n_ctx,
            chunk: engine.chunk,
            kv_type: engine.kv_type,
        }
    }

    /// Appends `entry`; a failure costs the record, not the service.
    fn write(&mut self, entry: super::Entry) {
        let id = entry.id.clone();
        match self.append(entry) {
            Ok(()) => {
                self.state.written.fetch_add(1, Ordering::Relaxed);
                if self.state.health.ok() {
                    tracing::info!("audit trail: written again");
                }
            }
            Err(e) => {
                // The answer still goes out: a full disk costs the record, not the service.
                let msg = e.to_string();
                if self.state.health.failed(msg.clone()) {
                    tracing::error!(request = id, "audit trail: entry not written: {msg}");
                }
            }
        }
    }
}

impl Recorder for AuditLog {
    fn record(&mut self, req: &Request, end: &Event, engine: &EngineConfig, kernels: &'static str) {
        let facts = self.facts(engine, kernels);
        self.write(super::entry_of(
            req,
            end,
            &self.model,
            facts,
            self.cfg.texts,
        ));
    }

    fn refused(&mut self, r: &Refusal, engine: &EngineConfig, kernels: &'static str) {
        let facts = self.facts(engine, kernels);
        self.write(super::entry_of_refusal(r, &self.model, facts));
    }
}
