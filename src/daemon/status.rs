//! The daemon's status, as the retained JSON on `{prefix}/{device}/status`: what it runs, how
//! it is doing, and its counters.

use crate::audit::{AuditState, ModelFacts};
use crate::engine::Engine;
use crate::serial::stats::{PortState, PortStats};
use crate::service::{Handle, Health};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The daemon's state as published.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Online,
    Busy,
    Offline,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Online => "online",
            State::Busy => "busy",
            State::Offline => "offline",
        }
    }
}

/// What the status shows besides the uptime and the byte counters: running, queue, counters,
/// hash known, each port's state, the storage faults.
pub type Key = (
    bool,
    usize,
    [u64; 5],
    bool,
    Vec<(PortState, Option<String>)>,
    Vec<String>,
);

/// What does not change while the daemon runs, and the clock of its uptime.
pub struct StatusBoard {
    model_name: String,
    model_file: PathBuf,
    quant: String,
    kernels: &'static str,
    threads: usize,
    ctx: usize,
    max_batch: usize,
    board: Option<String>,
    started: Instant,
    /// The model file's SHA-256, hashed in the background after start (empty until then).
    sha256: Arc<OnceLock<String>>,
    /// The serial ports (Modbus ones included).
    pub ports: Vec<Arc<PortStats>>,
    /// The audit trail's state, when it is kept.
    pub audit: Option<Arc<AuditState>>,
    /// The MQTT answer journal's writes, when there is MQTT.
    pub journal: Option<Arc<Health>>,
}

impl StatusBoard {
    pub fn new(
        engine: &Engine,
        file: &Path,
        board: Option<String>,
        started: Instant,
    ) -> StatusBoard {
        let model = engine.model();
        let md = model.gguf().metadata();
        // The catalog's name for the models edgellm ships ("SmolLM2-135M-Instruct" where the
        // file says "Smollm2 135M 8k Lc100K Mix1 Ep2"), else the file's own.
        let model_name = catalog_name(file)
            .or_else(|| md.opt_str("general.name").ok().flatten().map(str::to_owned))
            .unwrap_or_else(|| {
                file.file_stem()
                    .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
            });
        // The type holding most of the weights' bytes (the "Q4_0" of a Q4_0 file).
        let mut by_type: Vec<(crate::gguf::GgmlType, u64)> = Vec::new();
        for t in model.gguf().tensors().iter().filter(|t| t.dims.len() == 2) {
            match by_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
                Some((_, n)) => *n += t.size,
                None => by_type.push((t.ty, t.size)),
            }
        }
        let quant = by_type
            .iter()
            .max_by_key(|(_, n)| *n)
            .map_or("unknown", |(ty, _)| ty.name())
            .to_ascii_uppercase();
        let sha256 = Arc::new(OnceLock::new());
        let (slot, path) = (Arc::clone(&sha256), file.to_path_buf());
        // A hash of ~100 MB costs a few hundred ms of one core: not on the way to READY. It is
        // always set (the audit trail waits for it): a file that cannot be read again says so.
        let hash = |slot: &OnceLock<String>, path: &Path| {
            let h = crate::audit::file_sha256(path).unwrap_or_else(|e| format!("unreadable: {e}"));
            let _ = slot.set(h);
        };
        let spawned = std::thread::Builder::new()
            .name("edgellm-sha256".into())
            .spawn(move || hash(&slot, &path));
        if spawned.is_err() {
            hash(&sha256, file);
        }
        StatusBoard {
            model_name,
            model_file: file.to_path_buf(),
            quant,
            kernels: engine.kernels().name(),
            threads: engine.config().threads,
            ctx: engine.config().n_ctx,
            max_batch: engine.config().max_batch,
            board,
            started,
            sha256,
            ports: Vec::new(),
            audit: None,
            journal: None,
        }
    }

    /// What cannot be written now, one line each (`audit: …`, `sessions: …`, `journal: …`):
    /// the answers go on, but a technician should look at the state partition.
    pub fn faults(&self, h: &Handle) -> Vec<String> {
        let mut f = Vec::new();
        let mut add = |what: &str, health: &Health| {
            if let Some(e) = health.error() {
                f.push(format!("{what}: {e}"));
            }
        };
        add("sessions", &h.counters().saves);
        if let Some(j) = &self.journal {
            add("journal", j);
        }
        if let Some(a) = &self.audit {
            add("audit", &a.health);
        }
        f
    }

    /// The model's facts as the audit trail records them; the SHA-256 arrives in `sha256`.
    pub fn model_facts(&self) -> (ModelFacts, Arc<OnceLock<String>>) {
        let facts = ModelFacts {
            name: self.model_name.clone(),
            sha256: self.sha256.get().cloned().unwrap_or_default(),
            quant: self.quant.clone(),
        };
        (facts, Arc::clone(&self.sha256))
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }
    pub fn kernels(&self) -> &'static str {
        self.kernels
    }

    /// What the status shows besides the uptime: when it changes, the status is republished.
    pub fn key(&self, h: &Handle) -> Key {
        let c = h.counters();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        (
            h.running().is_some(),
            h.queue_len(),
            [
                n(&c.accepted),
                n(&c.answered),
                n(&c.failed),
                n(&c.cancelled),
                n(&c.busy),
            ],
            self.sha256.get().is_some(),
            self.ports.iter().map(|p| p.state()).collect(),
            self.faults(h),
        )
    }

    pub fn json(&self, state: State, h: &Handle) -> Vec<u8> {
        let c = h.counters();
        let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        json!({
            "state": state.as_str(),
            "model": {
                "name": self.model_name,
                "file": self.model_file,
                "sha256": self.sha256.get(),
                "quant": self.quant,
            },
            "kernels": self.kernels,
            "threads": self.threads,
            "ctx": self.ctx,
            "max_batch": self.max_batch,
            "board": self.board,
            "uptime_s": self.started.elapsed().as_secs(),
            "queue_depth": h.queue_len(),
            "running": h.running(),
            "decoding": h.running_count(),
            "counters": {
                "accepted": n(&c.accepted),
                "answered": n(&c.answered),
                "failed": n(&c.failed),
                "cancelled": n(&c.cancelled),
                "busy": n(&c.busy),
                "batched_steps": n(&c.batched_steps),
            },
            "last_decode_tps": (c.last_tps() * 10.0).round() / 10.0,
            "serial": self.ports.iter().map(|p| p.json()).collect::<Vec<_>>(),
            "faults": self.faults(h),
            "storage": {
                "session_save_failures": c.saves.failures(),
                "journal_failures": self.journal.as_ref().map(|j| j.failures()),
            },
            "audit": self.audit.as_ref().map(|a| json!({
                "last_seq": a.seq.load(Ordering::Relaxed),
                "written": a.written.load(Ordering::Relaxed),
                "failures": a.health.failures(),
                "unrecorded_refusals": n(&c.unrecorded_refusals),
            })),
        })
        .to_string()
        .into_bytes()
    }
}

/// `models/models.toml`, the catalog of the models edgellm ships.
const CATALOG: &str = include_str!("../../models/models.toml");

/// The catalog's name of the model whose file is named as `file` is (the name it is installed
/// under, in `/usr/share/edgellm/models` or the cache).
fn catalog_name(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let catalog: toml::Table = toml::from_str(CATALOG).ok()?;
    catalog
        .get("model")?
        .as_array()?
        .iter()
        .find(|m| m.get("file").and_then(|f| f.as_str()) == Some(name))
        .and_then(|m| m.get("name")?.as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::catalog_name;
    use std::path::Path;

    #[test]
    fn a_shipped_model_is_named_as_the_catalog_names_it_and_another_file_is_not() {
        let named = |f: &str| catalog_name(Path::new(f));
        assert_eq!(
            named("/usr/share/edgellm/models/smollm2-135m-q4_1.gguf").as_deref(),
            Some("SmolLM2-135M-Instruct")
        );
        assert_eq!(
            named("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").as_deref(),
            Some("Qwen2.5-Coder-1.5B-Instruct")
        );
        assert_eq!(named("/tmp/my-own-model.gguf"), None);
    }
}
