//! KV snapshots of sliding-window models (their layers keep a ring of recent positions, and a
//! record holds those layers' rows only from the ring's base), and version 1 files, which
//! hold every row of every layer and are still read, then rewritten as version 2.

mod common;

use common::synth_prompt as prompt;
use edgellm::engine::{Engine, EngineConfig, Session};
use edgellm::kv::snapshot::{self, HEADER_LEN, RECORD_HEADER_LEN};
use edgellm::kv::{Geometry, KvType, SaveKind, SnapshotFile};
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model};
use std::sync::Arc;

const CTX: usize = 96;

fn engine(model: &Arc<Model>, chunk: usize) -> Engine {
    let cfg = EngineConfig {
        n_ctx: CTX,
        chunk,
        threads: 1,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).unwrap()
}

/// The logits after each of `tokens`, fed one at a time after what `s` holds.
fn logits_of(e: &mut Engine, s: &mut Session, tokens: &[u32]) -> Vec<Vec<f32>> {
    tokens
        .iter()
        .map(|&t| e.feed(s, &[t]).unwrap().to_vec())
        .collect()
}

/// A session of a sliding-window model saved turn by turn (appends), its ring shifted many
/// times, restores on a restart and goes on with bit-identical logits; its records hold the
/// sliding layers' rows only from the ring's base, so the file is smaller than every row.
#[test]
fn windowed_sessions_restore_and_continue_bit_identically() {
    let model = Arc::new(synth_model(&SynthSpec::gemma3()));
    let g = Geometry::of(&model, CTX, KvType::F16);
    assert!(g.window.is_some() && g.sliding_layers() == 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kv");
    let mut e = engine(&model, 8);
    let mut s = e.new_session();
    let mut f = SnapshotFile::new(&path, g.clone());
    for turn in 0..3 {
        e.feed(&mut s, &prompt(17 + 5 * turn, turn as u32)).unwrap();
        let kind = f.save(&s.kv, s.tokens()).unwrap();
        // The first save writes the file, the others append.
        let appended = matches!(kind, SaveKind::Appended { .. });
        assert_eq!(appended, turn > 0, "turn {turn}: {kind:?}");
    }
    let n = s.tokens().len();
    assert!(s.kv.window_base() > 0, "the ring shifted");
    let (bytes, parsed) = edgellm::kv::file::read(&path).unwrap();
    assert_eq!(parsed.tokens, s.tokens());
    assert!(parsed.records.iter().any(|r| r.window_rows < r.count));
    let full = g.kv_bytes(n as u64).unwrap();
    let held: u64 = parsed.records.iter().map(|r| r.kv.len() as u64).sum();
    assert!(held < full, "{held} bytes of rows, every row is {full}");
    drop(bytes);

    let next = prompt(9, 7);
    let want = logits_of(&mut e, &mut s, &next);
    // A restart with another batch size (another ring) restores and goes on alike.
    for chunk in [8, 3] {
        let mut e2 = engine(&model, chunk);
        let mut s2 = e2.new_session();
        let mut f2 = SnapshotFile::new(&path, g.clone());
        assert!(f2.load(&mut s2.kv).unwrap().is_none());
        s2.restore_tokens(f2.tokens());
        assert_eq!(s2.tokens().len(), n);
        let got = logits_of(&mut e2, &mut s2, &next);
        assert!(got == want, "chunk {chunk}: restored logits differ");
    }
}

/// Rewrites a version 2 file whose records hold every row as version 1 (no window in the
/// header, 20-byte record headers): the files edgellm wrote before.
fn as_version_1(v2: &[u8]) -> Vec<u8> {
    let p = snapshot::parse(v2).unwrap();
    let mut out = v2[..60].to_vec();
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    let c = snapshot::crc32c(&out);
    out.extend_from_slice(&c.to_le_bytes());
    for r in &p.records {
        assert_eq!(r.window_rows, r.count, "every row, as version 1 holds");
        let at = r.offset as usize;
        let mut h = v2[at..at + 16].to_vec();
        let c = snapshot::crc32c(&h);
        h.extend_from_slice(&c.to_le_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(&v2[at + RECORD_HEADER_LEN..r.kv.end + 4]);
    }
    out
}

/// Version 1 files (SmolLM2-like and Gemma-like models) load into today's caches, ring or not,
/// go on with the logits of the session that wrote them, and the next save rewrites them as
/// version 2 rather than appending to them.
#[test]
fn version_1_files_still_load_and_are_rewritten_as_version_2() {
    for spec in [SynthSpec::default(), SynthSpec::gemma3()] {
        let model = Arc::new(synth_model(&spec));
        let g = Geometry::of(&model, CTX, KvType::F16);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.kv");
        // Batches of the whole context: a ring as long as the context, every row kept.
        let mut e = engine(&model, CTX);
        let mut s = e.new_session();
        e.feed(&mut s, &prompt(40, 3)).unwrap();
        assert_eq!(s.kv.window_base(), 0);
        SnapshotFile::new(&path, g.clone())
            .save(&s.kv, s.tokens())
            .unwrap();
        let v1 = as_version_1(&std::fs::read(&path).unwrap());
        assert_eq!(snapshot::decode_header(&v1).unwrap().version, 1);
        assert_eq!(snapshot::parse(&v1).unwrap().tokens, s.tokens());
        std::fs::write(&path, &v1).unwrap();
        let next = prompt(30, 4);
        let want = logits_of(&mut e, &mut s, &next);

        let mut e2 = engine(&model, 8);
        let mut s2 = e2.new_session();
        let mut f = SnapshotFile::new(&path, g.clone());
        assert!(f.load(&mut s2.kv).unwrap().is_none(), "{}", spec.arch);
        s2.restore_tokens(f.tokens());
        let got = logits_of(&mut e2, &mut s2, &next);
        assert!(
            got == want,
            "{}: logits after a version 1 restore differ",
            spec.arch
        );
        match f.save(&s2.kv, s2.tokens()).unwrap() {
            SaveKind::Rewritten { positions, .. } => assert_eq!(positions, 70),
            k => panic!("{}: a version 1 file is rewritten, not {k:?}", spec.arch),
        }
        let bytes = std::fs::read(&path).unwrap();
        let p = snapshot::parse(&bytes).unwrap();
        assert_eq!((p.geometry.version, p.tokens.len()), (2, 70));
        assert_eq!(p.records[0].offset, HEADER_LEN as u64);
    }
}

/// A windowed file whose sliding rows do not reach back to the next token's window is refused
/// (parse and load alike) — unless a torn tail explains it: then nothing is restored, the
/// tokens are salvaged for recomputing, and the next save rewrites the file.
#[test]
fn windowed_rows_that_stop_short_are_refused_or_recomputed() {
    let model = Arc::new(synth_model(&SynthSpec::gemma3()));
    let g = Geometry::of(&model, CTX, KvType::F16);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kv");
    let mut e = engine(&model, 8);
    let mut s = e.new_session();
    // One save of 60 positions from a shifted ring: one record (fewer than 256), its sliding
    // rows from the base on.
    e.feed(&mut s, &prompt(60, 5)).unwrap();
    SnapshotFile::new(&path, g.clone())
        .save(&s.kv, s.tokens())
        .unwrap();
    let good = std::fs::read(&path).unwrap();
    let p = snapshot::parse(&good).unwrap();
    let r = &p.records[0];
    assert!(r.window_rows < r.count);

    // Positions 0..58 with no sliding rows, then 58..60 with theirs (every checksum valid):
    // the token at 60 attends to 57..60, and 57 is missing.
    let tokens = s.tokens().to_vec();
    let mut rows = Vec::new();
    assert_eq!(s.kv.write_rows(58..60, &mut rows), 2);
    let mut b = snapshot::encode_header(&g).to_vec();
    let zero = vec![0u8; g.rows_bytes(58, 0).unwrap() as usize];
    snapshot::encode_record(&g, 0, &tokens[..58], 0, &zero, &mut b);
    let end_first = b.len();
    snapshot::encode_record(&g, 58, &tokens[58..], 2, &rows, &mut b);
    std::fs::write(&path, &b).unwrap();
    let e1 = snapshot::parse(&b).unwrap_err().to_string();
    assert!(
        e1.contains("sliding-window rows start at position 58"),
        "{e1}"
    );
    let mut s2 = e.new_session();
    let e2 = SnapshotFile::new(&path, g.clone())
        .load(&mut s2.kv)
        .unwrap_err()
        .to_string();
    assert!(
        e2.contains("sliding-window rows start at position 58"),
        "{e2}"
    );

    // Torn: the second record cut short. What is left (58 positions, no sliding rows) cannot
    // be restored; the file is rewritten at the next save.
    std::fs::write(&path, &b[..end_first + 30]).unwrap();
    let mut f = SnapshotFile::new(&path, g.clone());
    let mut s3 = e.new_session();
    assert!(f.load(&mut s3.kv).unwrap().is_some(), "a torn tail");
    assert!(f.tokens().is_empty(), "nothing restorable");
    assert_eq!(
        edgellm::kv::file::salvage_tokens(&path, &g),
        tokens[..58].to_vec()
    );
    e.feed(&mut s3, &tokens[..58]).unwrap();
    assert!(matches!(
        f.save(&s3.kv, s3.tokens()).unwrap(),
        SaveKind::Rewritten { .. }
    ));
    assert_eq!(
        snapshot::parse(&std::fs::read(&path).unwrap())
            .unwrap()
            .tokens,
        &tokens[..58]
    );
}
