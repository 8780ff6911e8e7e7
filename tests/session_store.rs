//! Named sessions under a state directory, on tiny synthetic models: a session continues from
//! RAM, or from flash after a restart, exactly as an uninterrupted run; the RAM and disk
//! budgets evict the least recently used; system prompts are computed once and restored at
//! start-up; bad files are moved aside and their tokens recomputed; a second process cannot
//! share the directory; a read-only directory still answers. And a snapshot written on one
//! architecture restores on another (CI writes it on x86 and reads it under qemu).

mod common;

use common::synth_prompt as prompt;
use edgellm::engine::store::{SessionId, SessionStore, Source, StoreConfig, StoreError};
use edgellm::engine::{Engine, EngineConfig, GenParams, Sampler, SamplingParams};
use edgellm::kv::{KvType, SaveKind};
use edgellm::model::Model;
use edgellm::model::synth::{SynthSpec, synth_model};
use std::path::Path;
use std::sync::Arc;

const CTX: usize = 64;

fn model() -> Arc<Model> {
    Arc::new(synth_model(&SynthSpec::default()))
}

/// The reference kernels: plain scalar code that gives the same bits on every architecture.
fn engine(model: &Arc<Model>) -> Engine {
    let cfg = EngineConfig {
        n_ctx: CTX,
        chunk: 8,
        threads: 1,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    Engine::with_kernels(Arc::clone(model), cfg, &kernels_neon::dispatch::REFERENCE).unwrap()
}

fn session_bytes(m: &Model) -> u64 {
    (2 * m.hp.n_layer * CTX * m.hp.kv_dim() * 2) as u64
}

fn open(e: &Engine, dir: &Path, ram_sessions: u64, disk: u64) -> SessionStore {
    let cfg = StoreConfig {
        dir: dir.to_path_buf(),
        ram_bytes: ram_sessions * session_bytes(e.model()),
        disk_bytes: disk,
        max_sessions: None,
    };
    SessionStore::open(e, cfg).unwrap()
}

fn id(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

fn sampler(e: &Engine) -> Sampler {
    let p = SamplingParams {
        temperature: 0.0,
        ..Default::default()
    };
    Sampler::new(p, e.model().hp.n_vocab)
}

const N: usize = 5;
const PARAMS: GenParams = GenParams {
    max_tokens: N,
    top_logits: 0,
};

/// A turn in session `sid`; returns the generated ids and the report.
fn turn(
    st: &mut SessionStore,
    e: &mut Engine,
    sid: &str,
    prompt: &[u32],
) -> (Vec<u32>, edgellm::engine::store::TurnReport) {
    let mut s = sampler(e);
    let (out, rep) = st
        .generate(
            e,
            &id(sid),
            prompt,
            &PARAMS,
            &mut s,
            &|_| false,
            &mut |_| true,
        )
        .unwrap();
    (out.generated, rep)
}

/// The same prompt from an empty session, no store.
fn fresh(e: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    let mut s = e.new_session();
    let mut smp = sampler(e);
    e.generate(&mut s, prompt, &PARAMS, &mut smp, &|_| false, &mut |_| true)
        .unwrap()
        .generated
}

fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    [a, b].concat()
}

#[test]
fn a_session_continues_from_ram_and_after_a_restart_from_flash_exactly() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let p1 = prompt(12, 1);
    let (g1, r1) = {
        let mut st = open(&e, dir.path(), 4, u64::MAX);
        turn(&mut st, &mut e, "plc-1", &p1)
    };
    assert_eq!(r1.source, Source::New);
    assert!(matches!(r1.save, Ok(SaveKind::Rewritten { .. })), "{r1:?}");
    let p2 = cat(&cat(&p1, &g1), &prompt(6, 2));
    let expect = fresh(&mut e, &p2);

    // In RAM: the second turn reuses the first.
    let mut st = open(&e, dir.path(), 4, u64::MAX);
    let (g, r) = turn(&mut st, &mut e, "plc-1", &p1);
    assert_eq!(g, g1);
    let want = p1.len() + N - 1;
    assert!(
        matches!(r.source, Source::File { tokens, torn_tail: false, recomputed: 0 } if tokens == want),
        "{r:?}"
    );
    let (g2, r) = turn(&mut st, &mut e, "plc-1", &p2);
    assert_eq!(r.source, Source::Ram);
    assert_eq!(g2, expect);
    assert!(matches!(r.save, Ok(SaveKind::Appended { .. })), "{r:?}");
    drop(st);

    // After a restart: from flash, the same answer again.
    let mut st = open(&e, dir.path(), 4, u64::MAX);
    let (g2b, r) = turn(&mut st, &mut e, "plc-1", &p2);
    assert!(matches!(r.source, Source::File { .. }), "{r:?}");
    assert_eq!(g2b, expect);
    assert_eq!(st.status().restored, 1);
}

#[test]
fn resident_sessions_stay_within_the_ram_budget_least_recently_used_out() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let mut st = open(&e, dir.path(), 2, u64::MAX);
    let prompts: Vec<_> = (0..3).map(|i| prompt(10, 10 + i)).collect();
    let mut first = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        first.push(turn(&mut st, &mut e, &format!("s{i}"), p).0);
        assert!(st.status().resident <= 2);
    }
    let s = st.status();
    assert_eq!((s.resident, s.max_resident, s.evicted_ram), (2, 2, 1));
    // s1 and s2 are resident; s0 was evicted and comes back from its file.
    let (_, r) = turn(&mut st, &mut e, "s2", &prompts[2]);
    assert_eq!(r.source, Source::Ram);
    let p0 = cat(&cat(&prompts[0], &first[0]), &prompt(4, 9));
    let (g, r) = turn(&mut st, &mut e, "s0", &p0);
    assert!(matches!(r.source, Source::File { .. }), "{r:?}");
    assert_eq!(g, fresh(&mut e, &p0));
    // That evicted s1, the least recently used.
    let (_, r) = turn(&mut st, &mut e, "s1", &prompts[1]);
    assert!(matches!(r.source, Source::File { .. }), "{r:?}");
    assert_eq!(st.status().lost, 0);
}

#[test]
fn the_disk_budget_deletes_the_least_recently_saved_session_files() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let mut st = open(&e, dir.path(), 4, u64::MAX);
    turn(&mut st, &mut e, "a", &prompt(10, 1));
    let one = std::fs::metadata(st.session_path(&id("a"))).unwrap().len();
    drop(st);
    // Room for two files of this size, not three.
    let mut st = open(&e, dir.path(), 4, 2 * one + one / 2);
    for s in ["b", "c"] {
        std::thread::sleep(std::time::Duration::from_millis(20)); // distinct mtimes
        turn(&mut st, &mut e, s, &prompt(10, 2));
    }
    assert!(!st.session_path(&id("a")).exists(), "oldest file kept");
    assert!(st.session_path(&id("b")).exists() && st.session_path(&id("c")).exists());
    let s = st.status();
    assert_eq!(s.evicted_disk, 1);
    assert!(s.disk_bytes <= s.disk_budget, "{s:?}");
    // a was still resident: it keeps working, and its next save writes a new file.
    let (_, r) = turn(&mut st, &mut e, "a", &prompt(12, 1));
    assert!(matches!(r.save, Ok(SaveKind::Rewritten { .. })), "{r:?}");
    assert!(st.session_path(&id("a")).exists());
    assert!(!st.session_path(&id("b")).exists());
}

#[test]
fn past_the_most_sessions_kept_the_least_recently_saved_files_go() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        dir: dir.path().to_path_buf(),
        ram_bytes: 4 * session_bytes(e.model()),
        disk_bytes: u64::MAX,
        max_sessions: Some(2),
    };
    let mut st = SessionStore::open(&e, cfg).unwrap();
    for s in ["a", "b", "c"] {
        std::thread::sleep(std::time::Duration::from_millis(20)); // distinct mtimes
        turn(&mut st, &mut e, s, &prompt(10, 2));
    }
    assert!(!st.session_path(&id("a")).exists(), "oldest file kept");
    assert!(st.session_path(&id("b")).exists() && st.session_path(&id("c")).exists());
    assert_eq!(st.status().evicted_disk, 1);
    // Saving one of the two kept deletes nothing.
    turn(&mut st, &mut e, "b", &prompt(12, 2));
    assert!(st.session_path(&id("c")).exists());
    assert_eq!(st.status().evicted_disk, 1);
}

#[test]
fn a_system_prompt_is_computed_once_and_restored_at_start_up() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let sys = prompt(30, 7);
    let p = cat(&sys, &prompt(6, 8));
    let expect = fresh(&mut e, &p);

    let mut st = open(&e, dir.path(), 2, u64::MAX);
    let r = st.add_system_prompt(&mut e, &sys).unwrap();
    assert_eq!(
        (r.source.clone(), r.tokens, r.save_error),
        (Source::New, 30, None)
    );
    assert_eq!(
        st.add_system_prompt(&mut e, &sys).unwrap().source,
        Source::Ram
    );
    drop(st);

    let mut st = open(&e, dir.path(), 2, u64::MAX);
    let r = st.add_system_prompt(&mut e, &sys).unwrap();
    assert!(matches!(r.source, Source::File { tokens: 30, .. }), "{r:?}");
    // Two sessions start from it: only their own tokens are computed.
    let (g, rep) = turn(&mut st, &mut e, "x", &p);
    assert_eq!(rep.prefix_tokens, 30);
    assert_eq!(g, expect);
    // The next one shares even more with session x, which is resident: it starts from x.
    let (g, rep) = turn(&mut st, &mut e, "y", &p);
    assert_eq!(rep.prefix_tokens, p.len());
    assert_eq!(g, expect);
    // A prompt that shares only part of the system prompt reuses that part.
    let q = cat(&sys[..20], &prompt(5, 9));
    let (g, rep) = turn(&mut st, &mut e, "z", &q);
    assert_eq!(rep.prefix_tokens, 20);
    assert_eq!(g, fresh(&mut e, &q));
    assert!(st.add_system_prompt(&mut e, &prompt(CTX, 1)).is_err());
    assert!(st.add_system_prompt(&mut e, &[]).is_err());
}

/// Engines with other contexts sharing a state directory keep their own system prompt files
/// rather than refusing and replacing each other's on every start.
#[test]
fn engines_of_other_contexts_keep_their_own_system_prompt_files() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let sys = prompt(20, 3);
    let mut small = engine(&m);
    let cfg = EngineConfig {
        n_ctx: 2 * CTX,
        chunk: 8,
        threads: 1,
        kv_type: KvType::F16,
        max_batch: 1,
    };
    let mut big =
        Engine::with_kernels(Arc::clone(&m), cfg, &kernels_neon::dispatch::REFERENCE).unwrap();
    for round in 0..2 {
        for e in [&mut small, &mut big] {
            let mut st = SessionStore::open(
                e,
                StoreConfig {
                    dir: dir.path().to_path_buf(),
                    ram_bytes: 0,
                    disk_bytes: u64::MAX,
                    max_sessions: None,
                },
            )
            .unwrap();
            let r = st.add_system_prompt(e, &sys).unwrap();
            let restored = matches!(r.source, Source::File { .. });
            assert_eq!(restored, round == 1, "round {round}: {r:?}");
            assert_eq!(st.status().refused, 0);
        }
    }
}

#[test]
fn another_resident_session_serves_as_a_prefix() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let mut st = open(&e, dir.path(), 3, u64::MAX);
    let shared = prompt(20, 3);
    turn(&mut st, &mut e, "first", &shared);
    let q = cat(&shared, &prompt(4, 4));
    let (g, rep) = turn(&mut st, &mut e, "second", &q);
    assert_eq!(rep.prefix_tokens, 20);
    assert_eq!(g, fresh(&mut e, &q));
}

/// Two turns saved (two records), then one byte flipped: in the last record it reads as a torn
/// last turn, which opening the store cuts off (the file is its first turn again, as
/// `edgellm kv verify` passes it; the second turn is computed anew); in the first record it is
/// corruption (the file is moved aside at its first load and every token recomputed from the
/// intact token ids). Either way the conversation continues exactly.
#[test]
fn damaged_session_files_are_recomputed_from_their_tokens() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let p1 = prompt(12, 5);
    let (p2, len1, len2) = {
        let mut st = open(&e, dir.path(), 1, u64::MAX);
        let g1 = turn(&mut st, &mut e, "bad", &p1).0;
        let p2 = cat(&cat(&p1, &g1), &prompt(3, 6));
        let g2 = turn(&mut st, &mut e, "bad", &p2).0;
        (
            cat(&cat(&p2, &g2), &prompt(2, 7)),
            p1.len() + N - 1,
            p2.len() + N - 1,
        )
    };
    let expect = fresh(&mut e, &p2);
    let path = dir.path().join("sessions/bad.kv");
    let good = std::fs::read(&path).unwrap();
    let flip = |at: usize| {
        let mut b = good.clone();
        b[at] ^= 0x40;
        std::fs::write(&path, &b).unwrap();
    };

    flip(good.len() - 10); // the second record's K/V rows
    let mut st = open(&e, dir.path(), 1, u64::MAX);
    // Opening the store cut the torn record off: the file is its first record, whole.
    assert_eq!(st.status().tails_cut, 1);
    let (_, parsed) = edgellm::kv::file::read(&path).unwrap();
    assert!(parsed.torn.is_none());
    assert_eq!(parsed.tokens.len(), len1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), parsed.valid_len);
    let (g, r) = turn(&mut st, &mut e, "bad", &p2);
    let want = Source::File {
        tokens: len1,
        torn_tail: false,
        recomputed: 0,
    };
    assert_eq!(r.source, want);
    assert_eq!(g, expect);
    assert!(matches!(r.save, Ok(SaveKind::Appended { .. })), "{r:?}");
    drop(st);

    // The file header, the record header, token ids, their CRC: then the first record's rows.
    use edgellm::kv::snapshot::{HEADER_LEN, RECORD_HEADER_LEN};
    flip(HEADER_LEN + RECORD_HEADER_LEN + 4 * len1 + 4 + 10);
    let mut st = open(&e, dir.path(), 1, u64::MAX);
    let (g, r) = turn(&mut st, &mut e, "bad", &p2);
    match &r.source {
        Source::Refused { why, recomputed } => {
            assert!(why.contains("checksum"), "{why}");
            assert_eq!(*recomputed, len2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(g, expect);
    let aside = std::fs::read_dir(dir.path().join("sessions"))
        .unwrap()
        .flatten()
        .filter(|f| f.file_name().to_string_lossy().contains(".corrupt-"))
        .count();
    assert_eq!(aside, 1);
    assert!(matches!(r.save, Ok(SaveKind::Rewritten { .. })), "{r:?}");
    assert_eq!(st.status().refused, 1);
}

#[test]
fn a_second_process_cannot_open_the_same_state_directory() {
    let m = model();
    let e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let st = open(&e, dir.path(), 1, u64::MAX);
    let cfg = StoreConfig {
        dir: dir.path().to_path_buf(),
        ram_bytes: 0,
        disk_bytes: u64::MAX,
        max_sessions: None,
    };
    // flock locks belong to the open file, so a second open conflicts even in one process.
    match SessionStore::open(&e, cfg.clone()) {
        Err(err @ StoreError::Locked { .. }) => {
            assert!(err.to_string().contains("in use by another edgellm"))
        }
        other => panic!("{:?}", other.err()),
    }
    drop(st);
    assert!(SessionStore::open(&e, cfg).is_ok());
}

#[test]
fn a_read_only_state_directory_still_answers_and_reports_the_failure() {
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root ignores permission bits: use /sys, where no file can be created.
    let root = std::fs::write(ro.join("probe"), b"").is_ok();
    let target = if root { Path::new("/sys") } else { &ro };
    let mut st = open(&e, target, 1, u64::MAX);
    assert!(st.status().unlocked);
    let p = prompt(10, 1);
    let (g, r) = turn(&mut st, &mut e, "ro", &p);
    assert_eq!(g, fresh(&mut e, &p));
    assert!(r.save.is_err(), "{r:?}");
    let s = st.status();
    assert_eq!((s.saves, s.save_failures), (0, 1));
    assert!(s.last_error.is_some());
    assert!(!target.join("sessions").exists());
}

#[test]
fn stale_temporaries_of_a_crashed_rewrite_are_removed_at_open() {
    let m = model();
    let e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    drop(open(&e, dir.path(), 1, u64::MAX));
    let tmp = dir.path().join("sessions/a.kv.tmp-12345");
    std::fs::write(&tmp, b"half a file").unwrap();
    let keep = dir.path().join("sessions/notes.txt");
    std::fs::write(&keep, b"not ours").unwrap();
    drop(open(&e, dir.path(), 1, u64::MAX));
    assert!(!tmp.exists() && keep.exists());
}

/// x86 → aarch64: with `EDGELLM_KV_OUT=DIR` the session is saved into DIR with the ids that
/// must follow; with `EDGELLM_KV_IN=DIR` (another architecture's DIR) it is restored from
/// there and must continue with those ids. Without either, both halves run here. The reference
/// kernels make the rows the same bits on every architecture.
#[test]
fn a_snapshot_restores_and_continues_identically_on_another_architecture() {
    let m = model();
    let mut e = engine(&m);
    let p1 = prompt(14, 21);
    let local = tempfile::tempdir().unwrap();
    let (dir, write) = match (
        std::env::var_os("EDGELLM_KV_IN"),
        std::env::var_os("EDGELLM_KV_OUT"),
    ) {
        (Some(d), _) => (std::path::PathBuf::from(d), false),
        (None, Some(d)) => (std::path::PathBuf::from(d), true),
        (None, None) => (local.path().to_path_buf(), true),
    };
    let expect_file = dir.join("expected-ids.json");
    if write {
        std::fs::create_dir_all(&dir).unwrap();
        let mut st = open(&e, &dir, 1, u64::MAX);
        let g1 = turn(&mut st, &mut e, "xarch", &p1).0;
        let p2 = cat(&cat(&p1, &g1), &prompt(5, 22));
        let expect = fresh(&mut e, &p2);
        std::fs::write(&expect_file, serde_json::to_vec(&(p2, expect)).unwrap()).unwrap();
    }
    let (p2, expect): (Vec<u32>, Vec<u32>) =
        serde_json::from_slice(&std::fs::read(&expect_file).unwrap()).unwrap();
    // Restore from a copy: the written directory stays as the other architecture made it.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir(copy.path().join("sessions")).unwrap();
    let f = "sessions/xarch.kv";
    std::fs::copy(dir.join(f), copy.path().join(f)).unwrap();
    let mut st = open(&e, copy.path(), 1, u64::MAX);
    let (g2, r) = turn(&mut st, &mut e, "xarch", &p2);
    assert!(matches!(r.source, Source::File { .. }), "{r:?}");
    assert_eq!(g2, expect);
    eprintln!(
        "session_store: arch={} restored {:?}, continued with {} identical ids",
        std::env::consts::ARCH,
        r.source,
        g2.len()
    );
}

/// A crafted file whose checksums hold but whose token ids are outside the vocabulary: the
/// salvage cannot recompute them, the session starts empty and answers, and its save goes to
/// its own file, never to the file of the session that had its slot before.
#[test]
fn a_crafted_file_with_foreign_token_ids_is_answered_from_scratch_and_saved_to_itself() {
    use edgellm::kv::Geometry;
    use edgellm::kv::snapshot::{encode_header, encode_record};
    let m = model();
    let mut e = engine(&m);
    let dir = tempfile::tempdir().unwrap();
    let mut st = open(&e, dir.path(), 1, u64::MAX);
    turn(&mut st, &mut e, "a", &prompt(10, 1));
    let a_file = st.session_path(&id("a"));
    let a_bytes = std::fs::read(&a_file).unwrap();

    let g = Geometry::of(&m, CTX, KvType::F16);
    let bad: Vec<u32> = vec![300, 301, 4_000_000_000];
    let rows = vec![0u8; g.kv_bytes(3).unwrap() as usize];
    let mut b = encode_header(&g).to_vec();
    encode_record(&g, 0, &bad, 3, &rows, &mut b);
    let first_end = b.len();
    encode_record(&g, 3, &bad, 3, &rows, &mut b);
    b[first_end - 10] ^= 1; // the first record's rows: corruption, not a torn tail
    std::fs::write(st.session_path(&id("b")), &b).unwrap();

    let p = prompt(8, 2);
    let (g_b, r) = turn(&mut st, &mut e, "b", &p);
    assert!(
        matches!(&r.source, Source::Refused { recomputed: 0, .. }),
        "{r:?}"
    );
    assert_eq!(g_b, fresh(&mut e, &p));
    assert!(matches!(r.save, Ok(SaveKind::Rewritten { .. })), "{r:?}");
    assert_eq!(
        std::fs::read(&a_file).unwrap(),
        a_bytes,
        "a's file was written"
    );
    let (_, rep) = turn(&mut st, &mut e, "b", &p);
    assert_eq!(rep.source, Source::Ram);
}
