//! KV snapshots on tiny synthetic models: restore-then-continue equals uninterrupted
//! generation; truncation at every byte and random bit flips are detected (the snapshot is at
//! its last complete record, or refused), never a panic; another model, quantization, context,
//! cache type or a future version is refused with a clear message; a failed save leaves what
//! was saved intact.

mod common;

use common::synth_prompt as prompt;
use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams, Session};
use edgellm::gguf::GgmlType;
use edgellm::kv::snapshot::{self, HEADER_LEN};
use edgellm::kv::{Geometry, KvType, SaveKind, SnapshotFile};
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model};
use std::sync::Arc;

const CTX: usize = 64;

fn engine(model: &Arc<Model>, ty: KvType) -> Engine {
    let cfg = EngineConfig {
        n_ctx: CTX,
        chunk: 8,
        threads: 1,
        kv_type: ty,
        max_batch: 1,
    };
    Engine::new(Arc::clone(model), cfg).unwrap()
}

fn generate(e: &mut Engine, s: &mut Session, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut sampler = Sampler::new(
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        e.model().hp.n_vocab,
    );
    let gp = GenParams {
        max_tokens: n,
        top_logits: 0,
    };
    e.generate(s, prompt, &gp, &mut sampler, &|_| false, &mut |_| true)
        .unwrap()
        .generated
}

/// Three turns with a save after each; returns the model, the file's bytes after each save
/// and the session tokens after each.
fn three_turns(ty: KvType) -> (Arc<Model>, Vec<Vec<u8>>, Vec<Vec<u32>>) {
    let model = Arc::new(synth_model(&SynthSpec::default()));
    let mut e = engine(&model, ty);
    let mut s = e.new_session();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kv");
    let mut f = SnapshotFile::new(&path, Geometry::of(&model, CTX, ty));
    let mut conv = Vec::new();
    let (mut files, mut toks) = (Vec::new(), Vec::new());
    for turn in 0..3 {
        conv.extend(prompt(5 + turn, turn as u32));
        let gen_ids = generate(&mut e, &mut s, &conv, 4);
        conv.extend(&gen_ids);
        let kind = f.save(&s.kv, s.tokens()).unwrap();
        assert!(
            matches!(
                (turn, kind),
                (0, SaveKind::Rewritten { .. }) | (1.., SaveKind::Appended { .. })
            ),
            "turn {turn}: {kind:?}"
        );
        files.push(std::fs::read(&path).unwrap());
        toks.push(s.tokens().to_vec());
    }
    (model, files, toks)
}

#[test]
fn restore_then_continue_equals_uninterrupted_generation() {
    for ty in [KvType::F16, KvType::F32] {
        let model = Arc::new(synth_model(&SynthSpec::default()));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conv.kv");
        let g = Geometry::of(&model, CTX, ty);
        let turn1 = prompt(11, 1);

        // Uninterrupted: two turns in one session.
        let mut e = engine(&model, ty);
        let mut s = e.new_session();
        let gen1 = generate(&mut e, &mut s, &turn1, 6);
        let mut f = SnapshotFile::new(&path, g.clone());
        f.save(&s.kv, s.tokens()).unwrap();
        let mut turn2 = turn1.clone();
        turn2.extend(&gen1);
        turn2.extend(prompt(7, 2));
        let gen2 = generate(&mut e, &mut s, &turn2, 8);

        // A restart: a new engine restores the snapshot and continues.
        let mut e2 = engine(&model, ty);
        let mut s2 = e2.new_session();
        let mut f2 = SnapshotFile::new(&path, g.clone());
        assert!(f2.load(&mut s2.kv).unwrap().is_none());
        s2.restore_tokens(f2.tokens());
        assert_eq!(s2.tokens().len(), turn1.len() + gen1.len() - 1);
        let mut sampler = Sampler::new(SamplingParams::default(), model.hp.n_vocab);
        let out = e2
            .generate(
                &mut s2,
                &turn2,
                &GenParams {
                    max_tokens: 8,
                    top_logits: 0,
                },
                &mut sampler,
                &|_| false,
                &mut |_| true,
            )
            .unwrap();
        assert_eq!(out.generated, gen2, "{ty}: restored continuation differs");
        assert_eq!(out.timings.restored_tokens, f2.tokens().len());
        // The next save appends only the new positions.
        let before = f2.tokens().len();
        match f2.save(&s2.kv, s2.tokens()).unwrap() {
            SaveKind::Appended { positions, .. } => {
                assert_eq!(positions, s2.tokens().len() - before)
            }
            k => panic!("expected an append, got {k:?}"),
        }
    }
}

/// Loads `bytes` through a file (the streaming reader) and checks that it agrees with
/// [`snapshot::parse`]: the same tokens, torn tail and verdict.
fn load_agrees_with_parse(model: &Model, dir: &std::path::Path, bytes: &[u8]) {
    let path = dir.join("x.kv");
    std::fs::write(&path, bytes).unwrap();
    let hp = &model.hp;
    let mut kv = edgellm::kv::KvCache::new(hp.n_layer, CTX, hp.n_head_kv, hp.head_dim, KvType::F16);
    let mut f = SnapshotFile::new(&path, Geometry::of(model, CTX, KvType::F16));
    let loaded = f.load(&mut kv);
    match (snapshot::parse(bytes), loaded) {
        (Ok(p), Ok(torn)) => {
            assert_eq!(f.tokens(), p.tokens);
            assert_eq!(torn.is_some(), p.torn.is_some());
            for r in &p.records {
                let mut a = Vec::new();
                kv.write_rows(r.first as usize..(r.first + r.count) as usize, &mut a);
                assert!(
                    a == bytes[r.kv.clone()],
                    "restored rows differ from the file's"
                );
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("parse {a:?} but load {b:?}"),
    }
}

#[test]
fn every_truncation_restores_a_complete_prefix_or_is_refused() {
    let (model, files, toks) = three_turns(KvType::F16);
    let full = files.last().unwrap();
    let ends: Vec<usize> = files.iter().map(|f| f.len()).collect();
    let dir = tempfile::tempdir().unwrap();
    for cut in 0..=full.len() {
        load_agrees_with_parse(&model, dir.path(), &full[..cut]);
        match snapshot::parse(&full[..cut]) {
            Err(e) => assert!(cut < HEADER_LEN, "cut {cut}: {e}"),
            Ok(p) => {
                // The last complete record at or before the cut.
                let k = ends.iter().filter(|&&e| e <= cut).count();
                let want: &[u32] = if k == 0 { &[] } else { &toks[k - 1] };
                assert_eq!(p.tokens, want, "cut {cut}");
                assert_eq!(
                    p.valid_len as usize,
                    if k == 0 { HEADER_LEN } else { ends[k - 1] }
                );
                assert_eq!(p.torn.is_some(), cut != p.valid_len as usize, "cut {cut}");
                for r in &p.records {
                    assert_eq!(&full[r.kv.clone()], &files[files.len() - 1][r.kv.clone()]);
                }
            }
        }
    }
}

/// The first record is never appended, not even to a file saved without positions: a reader
/// may then take any bad byte in it for corruption, never for a torn append.
#[test]
fn the_first_record_is_always_written_whole_by_a_rewrite() {
    let model = Arc::new(synth_model(&SynthSpec::default()));
    let mut e = engine(&model, KvType::F16);
    let mut s = e.new_session();
    let dir = tempfile::tempdir().unwrap();
    let mut f = SnapshotFile::new(
        dir.path().join("s.kv"),
        Geometry::of(&model, CTX, KvType::F16),
    );
    let kind = f.save(&s.kv, &[]).unwrap();
    assert!(matches!(kind, SaveKind::Rewritten { .. }), "{kind:?}");
    generate(&mut e, &mut s, &prompt(5, 0), 2);
    let kind = f.save(&s.kv, s.tokens()).unwrap();
    assert!(matches!(kind, SaveKind::Rewritten { .. }), "{kind:?}");
}

#[test]
fn random_bit_flips_are_detected() {
    let (model, files, toks) = three_turns(KvType::F16);
    let full = files.last().unwrap();
    let ends: Vec<usize> = files.iter().map(|f| f.len()).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bit = (x % (full.len() as u64 * 8)) as usize;
        let mut b = full.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        load_agrees_with_parse(&model, dir.path(), &b);
        match snapshot::parse(&b) {
            Err(e) => assert!(!e.to_string().is_empty()),
            Ok(p) => {
                // A flip in the last record, or in the header of an appended record (which
                // then cannot say how long its record is), leaves the snapshot at the record
                // before it, reported as a torn tail; a flip anywhere else — the first record,
                // written whole by a rewrite, included — is refused.
                let byte = bit / 8;
                let rec = ends.iter().filter(|&&e| e <= byte).count();
                let start = if rec == 0 { HEADER_LEN } else { ends[rec - 1] };
                assert!(
                    rec == 2 || (rec == 1 && byte < start + snapshot::RECORD_HEADER_LEN),
                    "flip at byte {byte} (record {rec}) accepted"
                );
                let want: &[u32] = if rec == 0 { &[] } else { &toks[rec - 1] };
                assert_eq!(p.tokens, want, "flip at byte {byte}");
                assert!(p.torn.is_some());
            }
        }
    }
}

#[test]
fn another_model_quant_context_type_or_version_is_refused() {
    let (model, files, _) = three_turns(KvType::F16);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kv");
    std::fs::write(&path, files.last().unwrap()).unwrap();
    let load = |m: &Model, ctx: usize, ty: KvType| {
        let mut kv =
            edgellm::kv::KvCache::new(m.hp.n_layer, ctx, m.hp.n_head_kv, m.hp.head_dim, ty);
        SnapshotFile::new(&path, Geometry::of(m, ctx, ty))
            .load(&mut kv)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert_eq!(load(&model, CTX, KvType::F16), Ok(()));
    let other = synth_model(&SynthSpec {
        seed: 2,
        ..Default::default()
    });
    let e = load(&other, CTX, KvType::F16).unwrap_err();
    assert!(e.contains("another model or quantization"), "{e}");
    let q8 = synth_model(&SynthSpec {
        weight_type: GgmlType::Q8_0,
        ..Default::default()
    });
    let e = load(&q8, CTX, KvType::F16).unwrap_err();
    assert!(e.contains("another model or quantization"), "{e}");
    let e = load(&model, 2 * CTX, KvType::F16).unwrap_err();
    assert!(
        e.contains("context (n_ctx) is 64 but this engine has 128"),
        "{e}"
    );
    let e = load(&model, CTX, KvType::F32).unwrap_err();
    assert!(
        e.contains("KV cache type is f16 but this engine has f32"),
        "{e}"
    );

    // A future version with a valid header checksum.
    let mut b = files[0].clone();
    b[8..12].copy_from_slice(&3u32.to_le_bytes());
    let c = snapshot::crc32c(&b[..68]);
    b[68..72].copy_from_slice(&c.to_le_bytes());
    std::fs::write(&path, &b).unwrap();
    let e = load(&model, CTX, KvType::F16).unwrap_err();
    assert!(e.contains("format version 3 is newer"), "{e}");
    // Not a snapshot at all.
    std::fs::write(&path, b"GGUF and more").unwrap();
    let e = load(&model, CTX, KvType::F16).unwrap_err();
    assert!(e.contains("bad magic"), "{e}");
}

/// A save that cannot write (the directory is gone: the same path as a read-only or full
/// state directory, an I/O error from create or write) returns the error and the session and
/// the file already saved are intact.
#[test]
fn a_failed_save_reports_and_damages_nothing() {
    let model = Arc::new(synth_model(&SynthSpec::default()));
    let mut e = engine(&model, KvType::F16);
    let mut s = e.new_session();
    generate(&mut e, &mut s, &prompt(9, 3), 3);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir").join("s.kv");
    let mut f = SnapshotFile::new(&missing, Geometry::of(&model, CTX, KvType::F16));
    let err = f.save(&s.kv, s.tokens()).unwrap_err().to_string();
    assert!(err.contains("no-such-dir"), "{err}");
    assert!(f.tokens().is_empty());

    // A file saved, then made unwritable by replacing it with a directory's worth of
    // trouble: appending to a path whose file vanished fails and reports.
    let path = dir.path().join("s.kv");
    let mut f = SnapshotFile::new(&path, Geometry::of(&model, CTX, KvType::F16));
    f.save(&s.kv, s.tokens()).unwrap();
    let saved = std::fs::read(&path).unwrap();
    let n = s.tokens().len();
    let mut more = s.tokens().to_vec();
    more.extend(prompt(4, 9));
    generate(&mut e, &mut s, &more, 2);
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert!(f.save(&s.kv, s.tokens()).is_err());
    assert_eq!(f.tokens().len(), n, "a failed append claims nothing");
    std::fs::remove_dir(&path).unwrap();
    std::fs::write(&path, &saved).unwrap();
    let mut kv = edgellm::kv::KvCache::new(2, CTX, 2, 16, KvType::F16);
    let mut g = SnapshotFile::new(&path, Geometry::of(&model, CTX, KvType::F16));
    g.load(&mut kv).unwrap();
    assert_eq!(g.tokens().len(), n);
}

/// A corrupt middle record makes the snapshot unusable, but the conversation's tokens whose
/// checksums hold can still be recovered, for recomputing it.
#[test]
fn tokens_are_salvaged_from_a_snapshot_with_corrupt_rows() {
    let (model, files, toks) = three_turns(KvType::F16);
    let full = files.last().unwrap();
    let g = Geometry::of(&model, CTX, KvType::F16);
    // A flipped bit in the K/V rows of the second record: refused, all tokens salvaged.
    let mut b = full.clone();
    b[files[1].len() - 10] ^= 4;
    assert!(snapshot::parse(&b).is_err());
    let (fg, t) = snapshot::salvage_tokens(&b).unwrap();
    assert_eq!((fg, &t), (g.clone(), &toks[2]));
    // A flipped bit in the tokens of the second record: only the first record's tokens.
    let mut b = full.clone();
    b[files[0].len() + snapshot::RECORD_HEADER_LEN + 2] ^= 1;
    assert!(snapshot::parse(&b).is_err());
    assert_eq!(snapshot::salvage_tokens(&b).unwrap().1, toks[0]);
    // Through a file, for the right model only.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.kv");
    std::fs::write(&path, &b).unwrap();
    assert_eq!(edgellm::kv::file::salvage_tokens(&path, &g), toks[0]);
    let other = Geometry {
        n_ctx: 2 * CTX as u32,
        ..g
    };
    assert!(edgellm::kv::file::salvage_tokens(&path, &other).is_empty());
    assert!(snapshot::salvage_tokens(b"junk").is_none());
}

/// A long session is saved as records of at most `MAX_RECORD_POSITIONS` positions (a restore
/// reads one record at a time) and restores exactly.
#[test]
fn long_sessions_are_saved_in_bounded_records_and_restore_exactly() {
    use edgellm::kv::file::MAX_RECORD_POSITIONS;
    let model = Arc::new(synth_model(&SynthSpec::default()));
    let n_ctx = 2 * MAX_RECORD_POSITIONS + 100;
    let cfg = EngineConfig {
        n_ctx,
        chunk: 64,
        threads: 1,
        kv_type: KvType::F32,
        max_batch: 1,
    };
    let mut e = Engine::new(Arc::clone(&model), cfg.clone()).unwrap();
    let mut s = e.new_session();
    e.feed(&mut s, &prompt(2 * MAX_RECORD_POSITIONS + 10, 4))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.kv");
    let g = Geometry::of(&model, n_ctx, KvType::F32);
    let mut f = SnapshotFile::new(&path, g.clone());
    f.save(&s.kv, s.tokens()).unwrap();
    let (_, p) = edgellm::kv::file::read(&path).unwrap();
    let counts: Vec<u32> = p.records.iter().map(|r| r.count).collect();
    assert_eq!(counts, [256, 256, 10]);

    let e2 = Engine::new(Arc::clone(&model), cfg).unwrap();
    let mut s2 = e2.new_session();
    let mut f2 = SnapshotFile::new(&path, g);
    assert!(f2.load(&mut s2.kv).unwrap().is_none());
    assert_eq!(f2.tokens(), s.tokens());
    let (mut a, mut b) = (Vec::new(), Vec::new());
    s.kv.write_rows(0..s.tokens().len(), &mut a);
    s2.kv.write_rows(0..s.tokens().len(), &mut b);
    assert!(a == b, "restored rows differ");
}
