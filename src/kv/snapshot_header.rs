//! The snapshot's file header and the cache shape it describes ([`Geometry`]): split from
//! `snapshot.rs`, whose records it sizes.

use super::{HEADER_LEN, KvError, MAGIC, RECORD_HEADER_LEN, VERSION, crc32c, record_len};
use crate::kv::{KvType, Window};

/// What a snapshot's K/V rows belong to: they fit only a cache of exactly this shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Fingerprint of the model that computed the rows (`Model::fingerprint`, a layer above:
    /// to the cache it is 32 opaque bytes).
    pub fingerprint: [u8; 32],
    pub n_layer: u32,
    pub kv_dim: u32,
    pub dtype: KvType,
    pub n_ctx: u32,
    /// The sliding window, whose layers' rows a record holds only for its last
    /// `window_rows` positions (always `None` in version 1 files, which hold every row).
    pub window: Option<Window>,
    /// The format version of the file (the one we write, for a snapshot about to be).
    pub version: u32,
}

impl Geometry {
    /// Bytes of the K and V rows of `count` positions of every layer, or `None` on overflow:
    /// a record's most.
    pub fn kv_bytes(&self, count: u64) -> Option<u64> {
        self.rows_bytes(count, count)
    }

    /// Bytes of the K and V rows of a record of `count` positions whose sliding layers hold
    /// the last `window_rows`, or `None` on overflow.
    pub fn rows_bytes(&self, count: u64, window_rows: u64) -> Option<u64> {
        let sliding = self.sliding_layers() as u64;
        let rows = (self.n_layer as u64 - sliding)
            .checked_mul(count)?
            .checked_add(sliding.checked_mul(window_rows)?)?;
        2u64.checked_mul(self.kv_dim as u64)?
            .checked_mul(self.dtype.bytes() as u64)?
            .checked_mul(rows)
    }

    /// Layers whose rows are windowed.
    pub fn sliding_layers(&self) -> usize {
        Window::sliding_layers(self.window, self.n_layer as usize)
    }

    /// Bytes of the file header.
    pub fn header_len(&self) -> usize {
        if self.version == 1 { 64 } else { HEADER_LEN }
    }

    /// Bytes of a record header.
    pub fn record_header_len(&self) -> usize {
        if self.version == 1 {
            20
        } else {
            RECORD_HEADER_LEN
        }
    }

    /// Whether a snapshot whose sliding layers hold rows from position `from` on (to its end at
    /// `n`) holds everything the token at `n` attends to.
    pub fn window_covers(&self, from: usize, n: usize) -> bool {
        match self.window {
            Some(w) if from > 0 && n > 0 => from.saturating_add(w.size) <= n + 1,
            _ => true,
        }
    }

    /// Refuses a snapshot made for another model, cache type, context or window. (A version 1
    /// file holds every row of every layer: it fits a cache with any window.)
    pub fn check_matches(&self, want: &Geometry) -> Result<(), KvError> {
        if self.fingerprint != want.fingerprint {
            return Err(KvError::WrongModel {
                file: hex(&self.fingerprint),
                model: hex(&want.fingerprint),
            });
        }
        let window = |g: &Geometry| match g.window {
            Some(w) => format!("{} positions (layer pattern {})", w.size, w.pattern),
            None => "none".into(),
        };
        let file_window = if self.version == 1 {
            window(want)
        } else {
            window(self)
        };
        let fields: [(&'static str, String, String); 5] = [
            (
                "n_layer",
                self.n_layer.to_string(),
                want.n_layer.to_string(),
            ),
            ("kv_dim", self.kv_dim.to_string(), want.kv_dim.to_string()),
            (
                "KV cache type",
                self.dtype.to_string(),
                want.dtype.to_string(),
            ),
            (
                "context (n_ctx)",
                self.n_ctx.to_string(),
                want.n_ctx.to_string(),
            ),
            ("sliding window", file_window, window(want)),
        ];
        for (field, file, expected) in fields {
            if file != expected {
                return Err(KvError::Mismatch {
                    field,
                    file,
                    expected,
                });
            }
        }
        Ok(())
    }
}

/// Lower-case hex of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The file header's bytes, in the version we write (whatever `g.version` says).
pub fn encode_header(g: &Geometry) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..44].copy_from_slice(&g.fingerprint);
    h[44..48].copy_from_slice(&g.n_layer.to_le_bytes());
    h[48..52].copy_from_slice(&g.kv_dim.to_le_bytes());
    h[52..56].copy_from_slice(&(dtype_code(g.dtype)).to_le_bytes());
    h[56..60].copy_from_slice(&g.n_ctx.to_le_bytes());
    let (size, pattern) = g
        .window
        .map_or((0, 0), |w| (w.size as u32, w.pattern as u32));
    h[60..64].copy_from_slice(&size.to_le_bytes());
    h[64..68].copy_from_slice(&pattern.to_le_bytes());
    let c = crc32c(&h[..68]);
    h[68..72].copy_from_slice(&c.to_le_bytes());
    h
}

pub(super) fn dtype_code(t: KvType) -> u32 {
    match t {
        KvType::F16 => 1,
        KvType::F32 => 0,
    }
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes and checks the file header (magic, version, checksum, field bounds).
pub fn decode_header(b: &[u8]) -> Result<Geometry, KvError> {
    if b.len() < 8 || b[..8] != MAGIC {
        if b.len() < 8 && MAGIC.starts_with(b) {
            return Err(truncated("file header", 0, HEADER_LEN, b.len()));
        }
        return Err(KvError::BadMagic {
            section: "file header",
            offset: 0,
        });
    }
    if b.len() < 12 {
        return Err(truncated("file header", 0, HEADER_LEN, b.len()));
    }
    // The version says how long the header is, so it is read before the header's checksum.
    let version = u32_at(b, 8);
    if version > VERSION {
        return Err(KvError::FutureVersion {
            found: version,
            supported: VERSION,
        });
    }
    if version == 0 {
        return Err(KvError::BadVersion {
            found: version,
            supported: VERSION,
        });
    }
    let len = if version == 1 { 64 } else { HEADER_LEN };
    if b.len() < len {
        return Err(truncated("file header", 0, len, b.len()));
    }
    let (stored, computed) = (u32_at(b, len - 4), crc32c(&b[..len - 4]));
    if stored != computed {
        return Err(KvError::Checksum {
            section: "file header",
            offset: 0,
            stored,
            computed,
        });
    }
    let invalid = |why: String| KvError::Invalid {
        section: "file header",
        offset: 0,
        why,
    };
    let dtype = match u32_at(b, 52) {
        1 => KvType::F16,
        0 => KvType::F32,
        c => return Err(invalid(format!("unknown cache type code {c}"))),
    };
    let mut fingerprint = [0u8; 32];
    fingerprint.copy_from_slice(&b[12..44]);
    let (size, pattern) = if version == 1 {
        (0, 0)
    } else {
        (u32_at(b, 60), u32_at(b, 64))
    };
    let window = match (size, pattern) {
        (0, _) => None,
        (size, pattern) if pattern > 0 => Some(Window {
            size: size as usize,
            pattern: pattern as usize,
        }),
        (size, pattern) => {
            return Err(invalid(format!(
                "sliding window of {size} positions with a layer pattern of {pattern}"
            )));
        }
    };
    let g = Geometry {
        fingerprint,
        n_layer: u32_at(b, 44),
        kv_dim: u32_at(b, 48),
        dtype,
        n_ctx: u32_at(b, 56),
        window,
        version,
    };
    if g.n_layer == 0 || g.kv_dim == 0 || g.n_ctx == 0 {
        return Err(invalid(format!(
            "n_layer {}, kv_dim {} and n_ctx {} must be positive",
            g.n_layer, g.kv_dim, g.n_ctx
        )));
    }
    // Every record's length is then a u64 (the checks of a record rely on it): a shape whose
    // full context overflows could hold no record, and no cache of it could be allocated.
    if record_len(&g, g.n_ctx, g.n_ctx).is_none() {
        return Err(invalid(format!(
            "n_layer {} × kv_dim {} × n_ctx {} overflows the size of a snapshot",
            g.n_layer, g.kv_dim, g.n_ctx
        )));
    }
    Ok(g)
}

pub(super) fn truncated(section: &'static str, offset: usize, need: usize, have: usize) -> KvError {
    KvError::Truncated {
        section,
        offset: offset as u64,
        need: need as u64,
        have: have as u64,
    }
}
