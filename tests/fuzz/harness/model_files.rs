//! GGUF model files and KV-cache snapshots: the two file formats the daemon reads from disk,
//! where a file is untrusted (a truncated download, a torn write at power loss).

use edgellm::gguf::Gguf;
use edgellm::kv::snapshot;
use edgellm::kv::{KvCache, KvError, SnapshotFile};
use edgellm::tokenizer::Tokenizer;

// ---------------------------------------------------------------------------------------------
// GGUF reader: from bytes, every view, the tokenizer and the model built from it.

pub fn gguf(data: &[u8]) {
    let Ok(g) = Gguf::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let len = data.len() as u64;
    assert!(g.data_offset() <= len.next_multiple_of(g.alignment()));
    for t in g.tensors() {
        // Parsing accepted the file: every tensor lies inside it, so its bytes are all there.
        let end = g
            .data_offset()
            .checked_add(t.offset)
            .and_then(|s| s.checked_add(t.size));
        assert!(
            t.size == 0 || end.is_some_and(|e| e <= len),
            "{t:?} past the end"
        );
        assert_eq!(g.tensor_data(t).len() as u64, t.size);
        let _ = (t.shape_string(), t.n_rows(), t.row_len());
        if let Ok(v) = g.tensor_view(&t.name) {
            // At most 8 values a byte (Q4): bounded by the input's size.
            let mut out = vec![0f32; t.n_elements() as usize];
            v.to_f32(&mut out);
        }
    }
    for (key, value) in g.metadata().iter() {
        let _ = (key.len(), value.describe(), value.to_string());
    }
    if let Ok(tok) = Tokenizer::from_gguf(&g) {
        let ids = tok.encode("Hello <|im_start|> wörld", true, true);
        assert!(ids.iter().all(|&i| (i as usize) < tok.n_vocab()), "{ids:?}");
    }
    if let Ok(m) = edgellm::model::Model::from_gguf(g) {
        assert_eq!(m.tokenizer.n_vocab(), m.hp.n_vocab);
        let _ = m.fingerprint();
    }
}

// ---------------------------------------------------------------------------------------------
// KV snapshot: the whole-file parser, the salvage of tokens, and the streaming file loader,
// which must agree with the parser.

pub fn kv_snapshot(data: &[u8]) {
    let parsed = snapshot::parse(data);
    let salvaged = snapshot::salvage_tokens(data);
    assert_eq!(snapshot::decode_header(data).is_ok(), salvaged.is_some());
    if let Ok(p) = &parsed {
        let (mut pos, mut end) = (0usize, p.geometry.header_len() as u64);
        for r in &p.records {
            assert_eq!(
                (r.first as usize, r.offset),
                (pos, end),
                "records are contiguous"
            );
            assert!(r.count > 0 && r.kv.end + 4 <= data.len());
            pos += r.count as usize;
            end += r.len();
        }
        assert_eq!((p.tokens.len(), p.valid_len), (pos, end));
        assert!(p.tokens.len() <= p.geometry.n_ctx as usize);
        match &p.torn {
            Some(t) => assert_eq!((t.offset, t.offset + t.bytes), (end, data.len() as u64)),
            None => assert_eq!(end, data.len() as u64),
        }
        let (g, tokens) = salvaged.expect("a parsed snapshot has a header");
        assert_eq!(g, p.geometry);
        assert!(
            tokens.starts_with(&p.tokens),
            "salvage keeps the valid records"
        );
    }
    kv_file(data, &parsed);
}

/// The same bytes as a file, through [`SnapshotFile::load`] (streamed a record at a time).
fn kv_file(data: &[u8], parsed: &Result<snapshot::Parsed, KvError>) {
    let Ok(g) = snapshot::decode_header(data) else {
        return;
    };
    let cache_bytes = g.kv_bytes(g.n_ctx as u64);
    if cache_bytes.is_none_or(|b| b > 1 << 22) {
        return; // A cache this large is the daemon's to allocate, not a fuzz run's.
    }
    let path = std::env::temp_dir().join(format!("edgellm-fuzz-kv-{}", std::process::id()));
    std::fs::write(&path, data).expect("write the snapshot to a temporary file");
    let mut kv = KvCache::with_window(
        g.n_layer as usize,
        g.n_ctx as usize,
        g.kv_dim as usize,
        1,
        g.dtype,
        g.window,
        4,
    );
    let mut file = SnapshotFile::new(&path, g);
    let loaded = file.load(&mut kv);
    let read = edgellm::kv::file::read(&path);
    let _ = std::fs::remove_file(&path);
    // Files longer than any snapshot of their shape are refused before they are read.
    let too_long = |e: &KvError| {
        matches!(
            e,
            KvError::Invalid {
                section: "file",
                ..
            }
        )
    };
    if loaded.as_ref().is_err_and(too_long) {
        assert!(read.as_ref().is_err_and(too_long));
        return;
    }
    assert_eq!(read.is_ok(), parsed.is_ok(), "{read:?}");
    match (parsed, &loaded) {
        (Ok(p), Ok(torn)) => {
            // A torn tail can leave the sliding-window rows short: then nothing is restored.
            let short = !p.geometry.window_covers(p.window_from, p.tokens.len());
            let want: &[u32] = if short { &[] } else { &p.tokens };
            assert_eq!(file.tokens(), want);
            assert_eq!(torn.is_some(), p.torn.is_some());
        }
        (Err(_), Err(_)) => {}
        (p, l) => panic!("the file loader and the parser disagree: {l:?} vs {p:?}"),
    }
    if let (Ok((bytes, p)), Ok(q)) = (&read, parsed) {
        assert_eq!((bytes.as_slice(), &p.tokens), (data, &q.tokens));
    }
}
