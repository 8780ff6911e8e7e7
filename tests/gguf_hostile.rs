//! The GGUF reader on files built wrong on purpose: truncated at every length, absurd counts
//! and lengths, bad magic and versions, overlapping, misaligned and out-of-file tensors,
//! overflowing dims, unknown types, corrupted bytes. Each must be an `Err` with a message that
//! says what is wrong, never a panic, an abort or a huge allocation.

use edgellm::gguf::{
    Array, GgmlType, Gguf, GgufError, GgufWriter, Layout, OpenOptions, TensorView, Value, parse,
};
use kernels_neon::{BlockQ4_0, BlockQ8_0, f16};

/// A small valid model-like file: every metadata value type, nested arrays, four tensors of
/// the runnable types.
fn synthetic() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama")
        .set_str("general.name", "synthetic")
        .set_u32("llama.block_count", 1)
        .set_u32("llama.embedding_length", 64)
        .set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .set("general.file_type", Value::U32(2))
        .set("u8", Value::U8(1))
        .set("i8", Value::I8(-1))
        .set("u16", Value::U16(2))
        .set("i16", Value::I16(-2))
        .set("i32", Value::I32(-3))
        .set("u64", Value::U64(4))
        .set("i64", Value::I64(-5))
        .set("f64", Value::F64(0.25))
        .set("bool", Value::Bool(true))
        .set_array(
            "tokenizer.ggml.tokens",
            Array::String(vec!["<s>".into(), "a".into(), "bc".into(), "é".into()]),
        )
        .set_array(
            "tokenizer.ggml.scores",
            Array::F32(vec![0.0, -1.0, -2.0, -3.0]),
        )
        .set_array("tokenizer.ggml.token_type", Array::I32(vec![3, 1, 1, 1]))
        .set_array(
            "nested",
            Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::Array(vec![Array::String(vec!["x".into()])]),
            ]),
        );
    let norm: Vec<f32> = (0..64).map(|i| 1.0 + i as f32 / 64.0).collect();
    w.add_f32("blk.0.attn_norm.weight", &[64], &norm).unwrap();
    let x: Vec<f32> = (0..128)
        .map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0)
        .collect();
    let mut q = vec![BlockQ4_0::default(); 4];
    kernels_neon::reference::quantize_row_q4_0_ref(&x, &mut q);
    w.add_tensor(
        "blk.0.attn_q.weight",
        GgmlType::Q4_0,
        &[64, 2],
        bytemuck::cast_slice(&q).to_vec(),
    )
    .unwrap();
    let mut q8 = vec![BlockQ8_0::default(); 3];
    kernels_neon::reference::quantize_row_q8_0_ref(&x[..96], &mut q8);
    w.add_tensor(
        "blk.0.ffn_up.weight",
        GgmlType::Q8_0,
        &[32, 3],
        bytemuck::cast_slice(&q8).to_vec(),
    )
    .unwrap();
    let h: Vec<f16> = x[..64].iter().map(|&v| f16::from_f32(v)).collect();
    w.add_tensor(
        "token_embd.weight",
        GgmlType::F16,
        &[32, 2],
        bytemuck::cast_slice(&h).to_vec(),
    )
    .unwrap();
    w
}

fn file() -> (Vec<u8>, Layout) {
    synthetic().to_bytes_with_layout().unwrap()
}

fn err(bytes: &[u8]) -> GgufError {
    match parse(bytes) {
        Ok(_) => panic!("parse accepted a bad file"),
        Err(e) => e,
    }
}

fn put_u32(b: &mut [u8], at: u64, v: u32) {
    b[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: u64, v: u64) {
    b[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes());
}

/// Offsets of the fields of tensor info `i`: (n_dims, first dim, type, offset).
fn info_fields(b: &[u8], l: &Layout, i: usize) -> (u64, u64, u64, u64) {
    let start = l.tensor_info_starts[i];
    let name_len = u64::from_le_bytes(b[start as usize..start as usize + 8].try_into().unwrap());
    let n_dims_at = start + 8 + name_len;
    let end = l.tensor_info_ends[i];
    (n_dims_at, n_dims_at + 4, end - 12, end - 8)
}

#[test]
fn the_synthetic_file_is_valid_and_round_trips() {
    let (b, l) = file();
    let p = parse(&b).unwrap();
    assert_eq!(p.data_offset, l.data_offset);
    assert_eq!(p.tensors.len(), 4);
    assert_eq!(
        p.metadata.get_array_str("tokenizer.ggml.tokens").unwrap()[3],
        "é"
    );
    assert_eq!(p.metadata.get_i32("i8").unwrap(), -1);
    assert_eq!(p.metadata.get_f32("f64").unwrap(), 0.25);
    assert_eq!(
        p.metadata.get("nested"),
        synthetic().metadata().get("nested")
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.gguf");
    std::fs::write(&path, &b).unwrap();
    let g = Gguf::open(&path, &OpenOptions::default()).unwrap();
    let q: &[BlockQ4_0] = g.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.len(), 4);
    let norm: &[f32] = g.tensor("blk.0.attn_norm.weight").unwrap();
    assert_eq!(norm[63], 1.0 + 63.0 / 64.0);
    assert!(
        matches!(g.tensor_view("token_embd.weight").unwrap(), TensorView::F16(h) if h.len() == 64)
    );
    g.check_all_runnable().unwrap();

    // Version 2 has the same layout.
    let mut w = synthetic();
    w.set_version(2);
    assert_eq!(parse(&w.to_bytes().unwrap()).unwrap().version, 2);
}

#[test]
fn every_truncation_is_an_error() {
    let (b, l) = file();
    let first = parse(&b)
        .unwrap()
        .tensors
        .iter()
        .map(|t| (t.offset, t.name.clone()))
        .min()
        .unwrap();
    for len in 0..b.len() {
        let e = err(&b[..len]);
        let msg = e.to_string();
        if (len as u64) < l.tensor_info_ends[3] {
            assert!(
                matches!(e, GgufError::Truncated { .. } | GgufError::BadMagic { .. }),
                "len {len}: {msg}"
            );
        } else {
            // In the padding or the data: some tensor's data runs past the end.
            assert!(
                matches!(e, GgufError::TensorPastEnd { .. }),
                "len {len}: {msg}"
            );
            assert!(msg.contains(&format!("file {len})")), "len {len}: {msg}");
        }
        if len as u64 == l.data_offset {
            assert!(msg.contains(&format!("'{}'", first.1)), "{msg}");
        }
    }
}

#[test]
fn truncation_at_section_boundaries_says_what_is_missing() {
    let (b, l) = file();
    let e = err(&b[..l.header_end as usize]).to_string();
    assert!(e.contains("metadata entries"), "{e}");
    let e = err(&b[..l.metadata_ends[0] as usize]).to_string();
    assert!(
        e.contains("metadata entries") || e.contains("metadata entry 1 key"),
        "{e}"
    );
    let last_md = *l.metadata_ends.last().unwrap() as usize;
    let e = err(&b[..last_md]).to_string();
    assert!(e.contains("tensor infos"), "{e}");
    let e = err(&b[..l.tensor_info_ends[1] as usize]).to_string();
    assert!(e.contains("truncated file") && e.contains("tensor"), "{e}");
    let e = err(&b[..l.tensor_info_starts[2] as usize + 3]).to_string();
    assert!(e.contains("tensor info 2 name length"), "{e}");
    assert_eq!(
        err(&[]).to_string(),
        "truncated file: magic needs 4 bytes at offset 0, only 0 left"
    );
}

#[test]
fn truncated_files_on_disk_name_the_file_and_tensor() {
    let (b, l) = file();
    let dir = tempfile::tempdir().unwrap();
    for len in [
        0,
        3,
        23,
        l.header_end as usize + 5,
        l.data_offset as usize,
        b.len() - 1,
    ] {
        let path = dir.path().join(format!("cut{len}.gguf"));
        std::fs::write(&path, &b[..len]).unwrap();
        let e = Gguf::open(&path, &OpenOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("{}: ", path.display())), "{e}");
        if len == b.len() - 1 {
            let want = format!(
                "tensor 'token_embd.weight' data runs past end of file (offset {}, size 128, file {len})",
                l.data_offset + parse(&b).unwrap().tensors[3].offset
            );
            assert!(e.ends_with(&want), "{e}\nwanted …{want}");
        }
    }
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let (b, _) = file();
    for (at, v, what) in [
        (8, u64::MAX, "tensor count"),
        (8, 1 << 17, "tensor count"),
        (16, u64::MAX, "metadata count"),
        (16, 1 << 21, "metadata count"),
        (16, 1 << 19, "metadata entries"),
        (8, 1 << 16, "tensor infos"),
    ] {
        let mut c = b.clone();
        put_u64(&mut c, at, v);
        let e = err(&c).to_string();
        assert!(e.contains(what), "count {v} at {at}: {e}");
    }
}

/// Builds a file by hand: header with the given counts, then `body`.
fn raw(n_tensors: u64, n_kv: u64, body: &[u8]) -> Vec<u8> {
    let mut f = b"GGUF".to_vec();
    f.extend(3u32.to_le_bytes());
    f.extend(n_tensors.to_le_bytes());
    f.extend(n_kv.to_le_bytes());
    f.extend(body);
    f
}

fn kv(key: &[u8], ty: u32, value: &[u8]) -> Vec<u8> {
    let mut v = (key.len() as u64).to_le_bytes().to_vec();
    v.extend(key);
    v.extend(ty.to_le_bytes());
    v.extend(value);
    v
}

#[test]
fn absurd_lengths_and_bad_values_are_errors() {
    let huge = u64::MAX.to_le_bytes();
    // Key length.
    let mut body = huge.to_vec();
    body.extend([0; 16]);
    assert!(
        err(&raw(0, 1, &body))
            .to_string()
            .contains("metadata entry 0 key length is 18446744073709551615")
    );
    // String value longer than the cap, and longer than the file.
    let e = err(&raw(0, 1, &kv(b"k", 8, &(2u64 << 20).to_le_bytes()))).to_string();
    assert!(
        e.contains("metadata 'k' value length is 2097152, more than the limit of 1048576"),
        "{e}"
    );
    let e = err(&raw(0, 1, &kv(b"k", 8, &1000u64.to_le_bytes()))).to_string();
    assert!(e.contains("truncated") && e.contains("'k'"), "{e}");
    // Arrays: u8 and string arrays claiming u64::MAX elements, arrays nested too deep.
    for ety in [0u32, 8, 9, 10] {
        let mut a = ety.to_le_bytes().to_vec();
        a.extend(huge);
        let e = err(&raw(0, 1, &kv(b"arr", 9, &a))).to_string();
        assert!(
            e.contains("metadata 'arr' array of 18446744073709551615"),
            "{e}"
        );
    }
    let mut deep = Vec::new();
    for _ in 0..100 {
        deep.extend(9u32.to_le_bytes());
        deep.extend(1u64.to_le_bytes());
    }
    deep.extend(0u32.to_le_bytes());
    deep.extend(0u64.to_le_bytes());
    let e = err(&raw(0, 1, &kv(b"deep", 9, &deep))).to_string();
    assert!(e.contains("'deep' array nesting depth"), "{e}");
    // Unknown value types, bad bools, invalid UTF-8, duplicate keys.
    let e = err(&raw(0, 1, &kv(b"k", 13, &[0; 8]))).to_string();
    assert!(e.contains("unknown value type id 13"), "{e}");
    let e = err(&raw(0, 1, &kv(b"b", 7, &[2]))).to_string();
    assert!(e.contains("'b' has bool byte 2"), "{e}");
    let e = err(&raw(0, 1, &kv(b"\xff\xfe", 0, &[0]))).to_string();
    assert!(e.contains("not valid UTF-8"), "{e}");
    let mut two = kv(b"k", 0, &[1]);
    two.extend(kv(b"k", 0, &[2]));
    assert_eq!(
        err(&raw(0, 2, &two)).to_string(),
        "metadata key 'k' appears twice"
    );
}

#[test]
fn bad_magic_and_versions() {
    let (b, _) = file();
    let mut c = b.clone();
    c[0] = b'X';
    assert!(err(&c).to_string().starts_with("not a GGUF file"));
    for v in [0u32, 1, 4, 0xffff_ffff] {
        let mut c = b.clone();
        put_u32(&mut c, 4, v);
        assert_eq!(
            err(&c).to_string(),
            format!("unsupported GGUF version {v} (edgellm reads versions 2 and 3)")
        );
    }
    let mut c = b;
    c[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err(&c).to_string().contains("big-endian"));
}

#[test]
fn bad_tensor_infos() {
    let (b, l) = file();
    let p = parse(&b).unwrap();
    let (n_dims1, dim1, ty1, off1) = info_fields(&b, &l, 1);

    // Overlap: tensor 1 placed on tensor 0's data.
    let mut c = b.clone();
    put_u64(&mut c, off1, p.tensors[0].offset);
    let e = err(&c).to_string();
    assert!(
        e.contains("'blk.0.attn_norm.weight' and 'blk.0.attn_q.weight' overlap"),
        "{e}"
    );

    // Misaligned offset.
    let mut c = b.clone();
    put_u64(&mut c, off1, p.tensors[1].offset + 2);
    let e = err(&c).to_string();
    assert!(
        e.contains("'blk.0.attn_q.weight' offset")
            && e.contains("not a multiple of the alignment 32"),
        "{e}"
    );

    // Offset past the end, and so large that offset + size overflows.
    for off in [1u64 << 40, u64::MAX - 31] {
        let mut c = b.clone();
        put_u64(&mut c, off1, off);
        let e = err(&c).to_string();
        assert!(
            e.contains("'blk.0.attn_q.weight' data runs past end of file"),
            "{e}"
        );
    }

    // Dims whose product overflows; too many dims; a row that is not whole blocks.
    let mut c = b.clone();
    put_u64(&mut c, dim1, 1 << 62);
    put_u64(&mut c, dim1 + 8, 1 << 62);
    let e = err(&c).to_string();
    assert!(
        e.contains(
            "'blk.0.attn_q.weight' dimensions [4611686018427387904, 4611686018427387904] overflow"
        ),
        "{e}"
    );
    let mut c = b.clone();
    put_u64(&mut c, dim1, 1 << 40);
    put_u64(&mut c, dim1 + 8, 1 << 40);
    assert!(err(&c).to_string().contains("overflow"));
    let mut c = b.clone();
    put_u32(&mut c, n_dims1, 5);
    assert!(err(&c).to_string().contains("has 5 dimensions (at most 4)"));
    let mut c = b.clone();
    put_u32(&mut c, n_dims1, u32::MAX);
    assert!(err(&c).to_string().contains("dimensions"));
    let mut c = b.clone();
    put_u64(&mut c, dim1, 48);
    let e = err(&c).to_string();
    assert!(
        e.contains("row length 48, not a multiple of the Q4_0 block size 32"),
        "{e}"
    );

    // Unknown type ids (4 and 5 were removed from ggml; 1000 never existed).
    for id in [4u32, 5, 31, 1000, u32::MAX] {
        let mut c = b.clone();
        put_u32(&mut c, ty1, id);
        assert_eq!(
            err(&c).to_string(),
            format!("tensor 'blk.0.attn_q.weight' has unknown ggml type id {id}")
        );
    }

    // Duplicate tensor names.
    let mut w = synthetic();
    assert!(matches!(
        w.add_f32("blk.0.attn_norm.weight", &[1], &[0.0]),
        Err(GgufError::DuplicateTensor(_))
    ));
    // Rename tensor 2 ('blk.0.ffn_up.weight', same length) to tensor 1's name.
    let mut c = b.clone();
    let s2 = l.tensor_info_starts[2] as usize + 8;
    assert_eq!(&c[s2..s2 + 19], b"blk.0.ffn_up.weight");
    c[s2..s2 + 19].copy_from_slice(b"blk.0.attn_q.weight");
    assert_eq!(
        err(&c).to_string(),
        "tensor 'blk.0.attn_q.weight' appears twice"
    );
}

#[test]
fn bad_alignment_values() {
    for v in [
        Value::U32(0),
        Value::U32(3),
        Value::U32(1 << 30),
        Value::String("32".into()),
        Value::U64(32),
    ] {
        // Set after the tensor, so the writer itself keeps its 32-byte layout.
        let mut w = GgufWriter::new();
        w.add_f32("t", &[4], &[1.0; 4]).unwrap();
        w.set("general.alignment", v.clone());
        let e = err(&w.to_bytes().unwrap()).to_string();
        assert!(
            e.contains("'general.alignment' must be a u32 power of two"),
            "{v:?}: {e}"
        );
    }
    let mut w = synthetic_with_alignment(64);
    w.set_str("x", "y");
    let b = w.to_bytes().unwrap();
    let p = parse(&b).unwrap();
    assert_eq!(p.alignment, 64);
    assert_eq!(p.data_offset % 64, 0);
    assert!(p.tensors.iter().all(|t| t.offset % 64 == 0));
}

fn synthetic_with_alignment(a: u32) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set_alignment(a).unwrap();
    w.add_f32("a", &[3], &[1.0; 3]).unwrap();
    w.add_f32("b", &[5], &[2.0; 5]).unwrap();
    w
}

#[test]
fn unsupported_types_parse_but_cannot_be_viewed() {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.add_tensor(
        "blk.3.ffn_up.weight",
        GgmlType::Q2_K,
        &[256, 2],
        vec![0; 168],
    )
    .unwrap();
    w.add_tensor(
        "blk.3.ffn_down.weight",
        GgmlType::IQ2_XS,
        &[256],
        vec![0; 74],
    )
    .unwrap();
    let g = Gguf::from_bytes("kquant.gguf", w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.tensor_info("blk.3.ffn_up.weight").unwrap().size, 168);
    let e = g
        .tensor_view("blk.3.ffn_up.weight")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(
            "kquant.gguf: tensor 'blk.3.ffn_up.weight' has type Q2_K, which edgellm cannot run"
        ),
        "{e}"
    );
    assert!(e.contains("edgellm quantize"), "{e}");
    let e = g
        .tensor::<BlockQ4_0>("blk.3.ffn_down.weight")
        .unwrap_err()
        .to_string();
    assert!(e.contains("type IQ2_XS"), "{e}");
    let e = g.check_all_runnable().unwrap_err().to_string();
    assert!(e.contains("'blk.3.ffn_up.weight' has type Q2_K"), "{e}");
    let e = g.tensor::<f32>("missing").unwrap_err().to_string();
    assert_eq!(e, "kquant.gguf: tensor 'missing' not found");
}

/// Every byte of the header region set to a few values: parsing gives Ok or Err, never panics.
#[test]
fn corrupting_any_header_byte_never_panics() {
    let (b, l) = file();
    let end = l.data_offset as usize;
    let mut n_err = 0;
    for i in 0..end {
        for v in [0x00u8, 0xff, b[i].wrapping_add(1), b[i] ^ 0x80] {
            let mut c = b.clone();
            c[i] = v;
            if parse(&c).is_err() {
                n_err += 1;
            }
        }
    }
    assert!(
        n_err > end,
        "most corruptions must be detected ({n_err} of {})",
        4 * end
    );
}

/// Random garbage after a valid magic and version.
#[test]
fn random_files_never_panic() {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for _ in 0..2000 {
        let len = (next() % 300) as usize;
        let mut f = raw(next() % 4, next() % 6, &[]);
        f.extend((0..len).map(|_| next() as u8));
        let _ = parse(&f);
    }
}
