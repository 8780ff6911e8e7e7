//! Tests of the KV cache: layout, snapshot rows, the sliding-window ring.

use super::*;
use kernels_neon::dispatch::REFERENCE;

const L: usize = 2;
const HKV: usize = 3;
const HD: usize = 4;

/// Key or value element `c` of position `pos` in layer `l`: distinct, exact in f16.
fn val(kv: usize, l: usize, pos: usize, c: usize) -> f32 {
    (kv * 1000 + l * 100 + pos * 10 + c) as f32 / 8.0
}

fn filled(ty: KvType, n_ctx: usize, n: usize) -> KvCache {
    let mut c = KvCache::new(L, n_ctx, HKV, HD, ty);
    for l in 0..L {
        for pos in 0..n {
            let key: Vec<f32> = (0..HKV * HD).map(|i| val(0, l, pos, i)).collect();
            let value: Vec<f32> = (0..HKV * HD).map(|i| val(1, l, pos, i)).collect();
            c.store(&REFERENCE, l, pos, &key, &value);
        }
    }
    c
}

/// A prefetch hints, for every layer, position and head, exactly the keys and values
/// attention reads for a token there (positions `0..=pos` of that head) and the token's
/// own row, and nothing for a layer or position outside the cache. Checked through the
/// contents: every element hinted must be the value `filled` stored for that head and
/// position, so a range one row long or short, or in another head's run, fails. (That a
/// prefetch changes nothing is the borrow checker's: it takes `&self`.)
#[test]
fn prefetch_hints_the_rows_attention_reads_and_nothing_else() {
    for ty in [KvType::F32, KvType::F16] {
        let n_ctx = 7;
        let c = filled(ty, n_ctx, n_ctx);
        let (k, v): (Vec<f32>, Vec<f32>) = match &c.buffers {
            KvBuffers::F16 { k, v } => (
                k.iter().map(|x| x.to_f32()).collect(),
                v.iter().map(|x| x.to_f32()).collect(),
            ),
            KvBuffers::F32 { k, v } => (k.clone(), v.clone()),
        };
        for l in 0..L + 2 {
            for pos in 0..n_ctx + 2 {
                for cap in [0, 1, 63, 64, 8 << 10, usize::MAX] {
                    c.prefetch(l, pos, cap);
                }
                let runs: Vec<_> = c.prefetch_runs(l, pos).collect();
                if l >= L || pos >= n_ctx {
                    assert!(runs.is_empty(), "{ty} l={l} pos={pos}: outside the cache");
                    continue;
                }
                assert_eq!(runs.len(), HKV, "{ty} l={l} pos={pos}: one run per head");
                for (g, (run, own)) in runs.into_iter().enumerate() {
                    let what = format!("{ty} l={l} pos={pos} head {g}");
                    let want = |kv, positions: std::ops::RangeInclusive<usize>| {
                        positions
                            .flat_map(|j| (0..HD).map(move |i| val(kv, l, j, g * HD + i)))
                            .collect::<Vec<f32>>()
                    };
                    assert_eq!(k[run.clone()], want(0, 0..=pos), "{what}: keys read");
                    assert_eq!(v[run], want(1, 0..=pos), "{what}: values read");
                    assert_eq!(k[own.clone()], want(0, pos..=pos), "{what}: own key row");
                    assert_eq!(v[own], want(1, pos..=pos), "{what}: own value row");
                }
            }
        }
    }
}

/// The snapshot's rows stay position-major whatever the layout in RAM: per layer, the K
/// rows of the range (each `kv_dim` wide, heads in order), then its V rows.
#[test]
fn snapshot_rows_are_position_major_per_layer() {
    for ty in [KvType::F32, KvType::F16] {
        let c = filled(ty, 6, 5);
        let mut got = Vec::new();
        assert_eq!(c.write_rows(1..4, &mut got), 3, "no window: every row");
        let mut want = Vec::new();
        for l in 0..L {
            for kv in 0..2 {
                for pos in 1..4 {
                    for i in 0..HKV * HD {
                        let x = val(kv, l, pos, i);
                        match ty {
                            KvType::F32 => want.extend_from_slice(&x.to_le_bytes()),
                            KvType::F16 => want.extend_from_slice(&f16::from_f32(x).to_le_bytes()),
                        }
                    }
                }
            }
        }
        assert_eq!(got, want, "{ty}");
        assert_eq!(got.len(), c.rows_bytes(3, 3));

        // Read back at another offset of a cache with another context: the same rows.
        let mut d = KvCache::new(L, 9, HKV, HD, ty);
        assert!(d.read_rows(4, 3, 3, &got));
        let mut again = Vec::new();
        d.write_rows(4..7, &mut again);
        assert_eq!(again, want, "{ty} after read_rows");
        assert!(!d.read_rows(7, 3, 3, &got), "positions past the context");
        assert!(!d.read_rows(0, 3, 3, &got[1..]), "not whole positions");
        assert!(!d.read_rows(0, 2, 2, &got), "more bytes than the positions");
    }
}

/// A head attends over its own keys and values, position by position.
#[test]
fn scores_and_mix_read_the_head_they_are_asked_for() {
    // `first` > 0 is a sliding window: positions first..5 only.
    for (ty, first) in [
        (KvType::F32, 0),
        (KvType::F16, 0),
        (KvType::F32, 2),
        (KvType::F16, 3),
    ] {
        let c = filled(ty, 7, 5);
        let n = 5 - first;
        let q = [1.0, -2.0, 0.5, 0.25];
        let p = &[0.1, 0.2, 0.3, 0.15, 0.25][..n];
        for l in 0..L {
            for g in 0..HKV {
                let mut s = vec![0.0f32; n];
                c.scores(&REFERENCE, l, g, first, &q, 0.5, &mut s);
                let mut o = [0.0f32; HD];
                c.mix_values(&REFERENCE, l, g, first, p, &mut o);
                for (j, &sp) in s.iter().enumerate() {
                    let pos = first + j;
                    let k: Vec<f32> = (0..HD).map(|i| val(0, l, pos, g * HD + i)).collect();
                    let dot: f32 = k.iter().zip(&q).map(|(a, b)| a * b).sum();
                    assert_eq!(sp, dot * 0.5, "{ty} l={l} g={g} pos={pos}");
                }
                // Two query heads of a group at once: each gets what it gets alone.
                let q2: Vec<f32> = q.iter().chain(&q.map(|x| -3.0 * x)).copied().collect();
                let mut s2 = vec![0.0f32; 2 * n];
                c.scores(&REFERENCE, l, g, first, &q2, 0.5, &mut s2);
                let mut alone = vec![0.0f32; n];
                c.scores(&REFERENCE, l, g, first, &q2[HD..], 0.5, &mut alone);
                assert_eq!((&s2[..n], &s2[n..]), (&s[..], &alone[..]), "{ty} scores x2");
                let p2: Vec<f32> = p
                    .iter()
                    .chain(&p.iter().map(|x| x / 2.0).collect::<Vec<_>>())
                    .copied()
                    .collect();
                let mut o2 = [0.0f32; 2 * HD];
                c.mix_values(&REFERENCE, l, g, first, &p2, &mut o2);
                let mut alone = [0.0f32; HD];
                c.mix_values(&REFERENCE, l, g, first, &p2[n..], &mut alone);
                assert_eq!((&o2[..HD], &o2[HD..]), (&o[..], &alone[..]), "{ty} mix x2");
                for (i, &oi) in o.iter().enumerate() {
                    let mut want = 0.0f32;
                    for (j, &w) in p.iter().enumerate() {
                        want += w * val(1, l, first + j, g * HD + i);
                    }
                    assert_eq!(oi, want, "{ty} l={l} g={g} [{i}]");
                }
            }
        }
    }
}

/// A prefix handed to a cache of another context keeps every head's rows.
#[test]
fn copy_prefix_keeps_rows_across_contexts() {
    let src = filled(KvType::F16, 5, 5);
    let mut dst = KvCache::new(L, 8, HKV, HD, KvType::F16);
    assert!(dst.copy_prefix_from(&src, 4));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    src.write_rows(0..4, &mut a);
    dst.write_rows(0..4, &mut b);
    assert_eq!(a, b);
    assert!(!dst.copy_prefix_from(&src, 6), "more than the source holds");
    let other = KvCache::new(L, 8, HKV + 1, HD, KvType::F16);
    assert!(!dst.copy_prefix_from(&other, 1), "another width");
}

/// Windowed caches: window 3 on layers 0 and 1 of 3 (pattern 3), batches of up to 2.
const W: Window = Window {
    size: 3,
    pattern: 3,
};

/// The element run of head `g`, layer `l`, position `pos`, read from the buffers.
fn row(c: &KvCache, kv: usize, l: usize, g: usize, pos: usize) -> Vec<f32> {
    let a = c.at(l, g, pos);
    match (&c.buffers, kv) {
        (KvBuffers::F32 { k, .. }, 0) => k[a..a + HD].to_vec(),
        (KvBuffers::F32 { v, .. }, _) => v[a..a + HD].to_vec(),
        (KvBuffers::F16 { k, .. }, 0) => k[a..a + HD].iter().map(|x| x.to_f32()).collect(),
        (KvBuffers::F16 { v, .. }, _) => v[a..a + HD].iter().map(|x| x.to_f32()).collect(),
    }
}

fn want_row(kv: usize, l: usize, g: usize, pos: usize) -> Vec<f32> {
    (0..HD).map(|i| val(kv, l, pos, g * HD + i)).collect()
}

/// Stores positions `p0..p0 + n` of every layer as a forward pass does (room first).
fn feed(c: &mut KvCache, p0: usize, n: usize) {
    c.make_room(p0, n);
    for l in 0..3 {
        for pos in p0..p0 + n {
            let key: Vec<f32> = (0..HKV * HD).map(|i| val(0, l, pos, i)).collect();
            let value: Vec<f32> = (0..HKV * HD).map(|i| val(1, l, pos, i)).collect();
            c.store(&REFERENCE, l, pos, &key, &value);
        }
    }
}

/// After positions `0..end`: every row the tokens from `t` on attend to (up to `end`) is the
/// one stored for it: positions from `t`'s window start on a sliding layer, from 0 on the
/// global one.
fn check_attended(c: &KvCache, t: usize, end: usize, what: &str) {
    for l in 0..3 {
        let first = if W.slides(l) {
            (t + 1).saturating_sub(W.size)
        } else {
            0
        };
        for g in 0..HKV {
            for pos in first..end {
                for kv in 0..2 {
                    let got = row(c, kv, l, g, pos);
                    assert_eq!(
                        got,
                        want_row(kv, l, g, pos),
                        "{what}: l={l} g={g} pos={pos}"
                    );
                }
            }
        }
    }
}

/// The ring is smaller than the context, and through batches of every size, shifts and
/// rewinds every row attention reads is the row stored for that position; a rewind deeper
/// than the ring keeps is refused by `can_keep` (and from position 0 the ring starts again).
#[test]
fn the_ring_holds_every_row_attention_reads() {
    for ty in [KvType::F32, KvType::F16] {
        let n_ctx = 40;
        let mut c = KvCache::with_window(3, n_ctx, HKV, HD, ty, Some(W), 2);
        let (ring, keep) = ring_shape(n_ctx, Some(W), 2);
        assert_eq!(
            (ring, keep),
            (7, 5),
            "window 3: keep 2·3 − 1, a gap of one batch"
        );
        assert_eq!(c.ring(), ring);
        let full = KvCache::new(3, n_ctx, HKV, HD, ty);
        assert_eq!(
            c.bytes() * 3,
            full.bytes() / n_ctx * (2 * ring + n_ctx),
            "{ty}"
        );
        assert_eq!(
            KvCache::bytes_for(3, n_ctx, HKV * HD, ty, Some(W), 2),
            Some(c.bytes() as u64)
        );
        let mut end = 0;
        let mut x = 7u32;
        let mut rewinds = 0;
        while end + 2 <= n_ctx {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let n = 1 + (x >> 16) as usize % 2;
            feed(&mut c, end, n);
            check_attended(&c, end, end + n, &format!("{ty} batch at {end}"));
            end += n;
            assert!(c.can_keep(end), "{ty}: the end itself is always kept");
            if (x >> 20).is_multiple_of(5) {
                let back = 1 + (x >> 8) as usize % 8;
                let m = end.saturating_sub(back);
                // `can_keep` is exactly "the rows the token at m attends to are held".
                let held = c.window_base() + W.size <= m + 1 || c.window_base() == 0;
                assert_eq!(c.can_keep(m), held || m == 0, "{ty} rewind {end} → {m}");
                end = if c.can_keep(m) { m } else { 0 };
                rewinds += 1;
            }
        }
        assert!(
            c.window_base() > 0 && rewinds > 2,
            "{ty}: the ring shifted and rewound"
        );
        // A rewind of up to a window is always kept (the slack `keep` holds beyond what
        // attention needs).
        let mut end = 0;
        for n in [2, 1, 2, 2, 1, 1, 2, 1, 2, 2, 1, 2] {
            feed(&mut c, end, n);
            end += n;
            assert!(
                c.can_keep(end.saturating_sub(W.size)),
                "{ty}: rewind by a window at {end}"
            );
        }
    }
}

/// A windowed cache's rows go to a snapshot in records and come back, into a ring of the same
/// size or a smaller one, holding what the next token attends to; rows from before the ring's
/// base are not written.
#[test]
fn windowed_rows_round_trip_through_records() {
    for ty in [KvType::F32, KvType::F16] {
        let mut c = KvCache::with_window(3, 40, HKV, HD, ty, Some(W), 2);
        for p in 0..23 {
            feed(&mut c, p, 1);
        }
        let base = c.window_base();
        assert!(base > 0);
        let mut records = Vec::new();
        for a in (0..23).step_by(5) {
            let b = (a + 5).min(23);
            let mut rows = Vec::new();
            let w = c.write_rows(a..b, &mut rows);
            assert_eq!(w, b - a.max(base).min(b), "{ty} record {a}..{b}");
            assert_eq!(rows.len(), c.rows_bytes(b - a, w));
            records.push((a, b - a, w, rows));
        }
        for batch in [2, 1] {
            let mut d = KvCache::with_window(3, 40, HKV, HD, ty, Some(W), batch);
            for (a, n, w, rows) in &records {
                assert!(d.read_rows(*a, *n, *w, rows), "{ty} record at {a}");
            }
            assert!(d.can_keep(23));
            check_attended(&d, 23, 23, &format!("{ty} restored (batch {batch})"));
            // And it goes on as the original does.
            feed(&mut d, 23, 1);
            check_attended(&d, 23, 24, &format!("{ty} restored then fed"));
        }
        // Rows that do not reach back to the window: the cache cannot go on from them.
        let mut d = KvCache::with_window(3, 40, HKV, HD, ty, Some(W), 2);
        let mut rows = Vec::new();
        assert_eq!(c.write_rows(22..23, &mut rows), 1);
        assert!(d.read_rows(0, 22, 0, &vec![0; d.rows_bytes(22, 0)]));
        assert!(d.read_rows(22, 1, 1, &rows));
        assert!(
            !d.can_keep(23),
            "{ty}: one sliding row for a window of 3 at 23"
        );
    }
}

/// A prefix is copied from a ring only when the ring can go on from it, and then holds every
/// row the next token attends to.
#[test]
fn copy_prefix_from_a_ring() {
    let mut src = KvCache::with_window(3, 40, HKV, HD, KvType::F16, Some(W), 2);
    for p in 0..20 {
        feed(&mut src, p, 1);
    }
    for n in [20, 18, 16, 15, 10, 3] {
        let mut dst = KvCache::with_window(3, 40, HKV, HD, KvType::F16, Some(W), 2);
        assert_eq!(dst.copy_prefix_from(&src, n), src.can_keep(n), "n={n}");
        if src.can_keep(n) {
            check_attended(&dst, n, n, &format!("prefix {n}"));
        }
    }
    assert!(!src.can_keep(10), "the test rewinds past the ring");
    // A prefix cache just long enough, and a cache without the window: refused shapes.
    let mut short = KvCache::with_window(3, 20, HKV, HD, KvType::F16, Some(W), 2);
    assert!(short.copy_prefix_from(&src, 20));
    check_attended(&short, 20, 20, "a cache of 20");
    let mut plain = KvCache::new(3, 40, HKV, HD, KvType::F16);
    assert!(!plain.copy_prefix_from(&src, 20), "another window");
}

/// On a ring, a prefetch hints the token's window and its own row, nothing outside the ring.
#[test]
fn prefetch_on_a_ring_hints_the_window() {
    let mut c = KvCache::with_window(3, 40, HKV, HD, KvType::F32, Some(W), 2);
    for p in 0..20 {
        feed(&mut c, p, 1);
    }
    let KvBuffers::F32 { k, .. } = &c.buffers else {
        unreachable!()
    };
    for l in 0..3 {
        let runs: Vec<_> = c.prefetch_runs(l, 19).collect();
        assert_eq!(runs.len(), HKV);
        let first = if W.slides(l) { 17 } else { 0 };
        for (g, (run, _)) in runs.into_iter().enumerate() {
            let want: Vec<f32> = (first..20).flat_map(|p| want_row(0, l, g, p)).collect();
            assert_eq!(k[run], want, "l={l} g={g}");
        }
    }
    let past = c.window_base() + c.ring();
    assert_eq!(c.prefetch_runs(0, past).count(), 0, "past the ring's end");
    assert_eq!(
        c.prefetch_runs(2, past).count(),
        HKV,
        "the global layer holds it"
    );
}
