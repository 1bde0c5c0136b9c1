use super::*;
use crate::kubelet::authority::test_rng::XorShift;

fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

fn decode_all(decoder: &mut Decoder, block: &[u8]) -> Result<Vec<(String, String)>, HpackError> {
    let mut fields = Vec::new();
    decoder.decode(block, |n, v| {
        fields.push((
            String::from_utf8_lossy(n).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ));
    })?;
    Ok(fields)
}

fn owned(fields: &[(&str, &str)]) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// The Huffman code of `symbol`: (code, length).
fn code_of(symbol: usize) -> (u32, usize) {
    (CANONICAL.codes[symbol], usize::from(CODE_LENGTHS[symbol]))
}

fn huffman(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    huffman_encode(input, &mut out);
    out
}

fn integer_into(value: usize, prefix: u8, first: u8, out: &mut Vec<u8>) {
    loona_hpack::encoder::encode_integer_into(value, prefix, first, out).unwrap();
}

fn string_into(s: &[u8], huffman_coded: bool, out: &mut Vec<u8>) {
    if huffman_coded {
        let coded = huffman(s);
        integer_into(coded.len(), 7, 0x80, out);
        out.extend_from_slice(&coded);
    } else {
        integer_into(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

#[test]
fn the_code_is_the_rfcs_canonical_huffman_code() {
    // Spot checks against RFC 7541 Appendix B.
    assert_eq!(code_of(usize::from(b'0')), (0x0, 5));
    assert_eq!(code_of(usize::from(b'a')), (0x3, 5));
    assert_eq!(code_of(usize::from(b' ')), (0x14, 6));
    assert_eq!(code_of(0), (0x1ff8, 13));
    assert_eq!(code_of(256), (0x3fff_ffff, 30));
    // Kraft equality: a complete prefix code.
    let kraft: f64 = CODE_LENGTHS.iter().map(|&l| 2f64.powi(-i32::from(l))).sum();
    assert!((kraft - 1.0).abs() < 1e-12, "{kraft}");
}

#[test]
fn every_byte_round_trips_through_the_huffman_code() {
    let all: Vec<u8> = (0..=255).collect();
    let mut out = Vec::new();
    huffman_decode(&huffman(&all), 0, &mut out).unwrap();
    assert_eq!(out, all);
    for b in 0..=255u8 {
        let mut out = Vec::new();
        huffman_decode(&huffman(&[b, b'x', b]), 0, &mut out).unwrap();
        assert_eq!(out, [b, b'x', b]);
    }
}

#[test]
fn rfc_7541_appendix_c_3_requests_without_huffman_coding() {
    let mut d = Decoder::new(4096);
    let first = hex("8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d");
    assert_eq!(
        decode_all(&mut d, &first).unwrap(),
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com")
        ])
    );
    assert_eq!(d.size, 57);
    let second = hex("8286 84be 5808 6e6f 2d63 6163 6865");
    assert_eq!(
        decode_all(&mut d, &second).unwrap(),
        owned(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache")
        ])
    );
    assert_eq!(d.size, 110);
    let third = hex("8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65");
    assert_eq!(
        decode_all(&mut d, &third).unwrap(),
        owned(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value")
        ])
    );
    assert_eq!(d.size, 164);
    assert_eq!(d.dynamic_len(), 3);
}

#[test]
fn rfc_7541_appendix_c_4_requests_with_huffman_coding() {
    let blocks = [
        hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"),
        hex("8286 84be 5886 a8eb 1064 9cbf"),
        hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
    ];
    let mut d = Decoder::new(4096);
    let mut reference = loona_hpack::Decoder::new();
    let mut got = Vec::new();
    for block in &blocks {
        let fields = decode_all(&mut d, block).unwrap();
        let theirs: Vec<(String, String)> = reference
            .decode(block)
            .unwrap()
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        assert_eq!(fields, theirs);
        got.push(fields);
    }
    assert_eq!(got[0][3], (":authority".into(), "www.example.com".into()));
    assert_eq!(got[1][4], ("cache-control".into(), "no-cache".into()));
    assert_eq!(got[2][4], ("custom-key".into(), "custom-value".into()));
    assert_eq!(d.size, 164);
}

#[test]
fn an_entry_larger_than_the_table_empties_it_and_small_tables_evict_the_oldest() {
    let mut d = Decoder::new(4096);
    let mut block = Vec::new();
    for name in [&b"aaaa"[..], b"bbbb", b"cccc"] {
        block.push(0x40);
        string_into(name, true, &mut block);
        string_into(b"v", false, &mut block);
    }
    decode_all(&mut d, &block).unwrap();
    assert_eq!(d.dynamic_len(), 3);
    // Shrink to two entries' worth (37 bytes each): the oldest goes.
    let mut shrink = Vec::new();
    integer_into(80, 5, 0x20, &mut shrink);
    shrink.push(0xbe); // index 62: the newest
    assert_eq!(
        decode_all(&mut d, &shrink).unwrap(),
        owned(&[("cccc", "v")])
    );
    assert_eq!(d.dynamic_len(), 2);
    assert!(matches!(
        decode_all(&mut d, &[0xc0]),
        Err(HpackError::Index {
            index: 64,
            dynamic: 2
        })
    ));
    // An entry over the table's 80 bytes empties it and is not added, but is still a field.
    let mut huge = vec![0x40];
    string_into(&[b'n'; 60], false, &mut huge);
    string_into(b"v", false, &mut huge);
    assert_eq!(decode_all(&mut d, &huge).unwrap().len(), 1);
    assert_eq!((d.dynamic_len(), d.size), (0, 0));
}

#[test]
fn malformed_blocks_are_refused_with_the_reason() {
    let mut long_padding = vec![0x00];
    string_into(b"x", false, &mut long_padding);
    // "a" (00011) padded with 11 one bits: two bytes, more than 7 bits of padding.
    long_padding.extend([0x82, 0x1f, 0xff]);
    type Expected = fn(&HpackError) -> bool;
    let cases: Vec<(&str, Vec<u8>, Expected)> = vec![
        ("index 0", vec![0x80], |e| {
            matches!(e, HpackError::Index { index: 0, .. })
        }),
        ("index past the static table", vec![0xbe], |e| {
            matches!(e, HpackError::Index { index: 62, .. })
        }),
        ("integer cut short", vec![0xff], |e| {
            matches!(e, HpackError::Integer { at: 0 })
        }),
        (
            "integer too large",
            vec![0xff, 0xff, 0xff, 0xff, 0xff, 0x7f],
            |e| matches!(e, HpackError::Integer { .. }),
        ),
        ("string past the block", vec![0x00, 0x05, b'a'], |e| {
            matches!(e, HpackError::StringLength { at: 1, len: 5 })
        }),
        ("padding over 7 bits", long_padding, |e| {
            matches!(e, HpackError::Huffman { .. })
        }),
        // "a" (00011) padded with zeros.
        (
            "padding not all ones",
            vec![0x00, 0x01, b'x', 0x81, 0x18],
            |e| matches!(e, HpackError::Huffman { .. }),
        ),
        // EOS (30 ones) coded inside a string.
        (
            "EOS in a string",
            vec![0x00, 0x01, b'x', 0x84, 0xff, 0xff, 0xff, 0xff],
            |e| matches!(e, HpackError::Huffman { .. }),
        ),
        (
            "table size over the allowed",
            vec![0x3f, 0xe2, 0x1f, 0x82],
            |e| {
                matches!(
                    e,
                    HpackError::TableSize {
                        size: 4_097,
                        allowed: 4_096
                    }
                )
            },
        ),
        ("size update after a field", vec![0x82, 0x20, 0x82], |e| {
            matches!(e, HpackError::LateSizeUpdate { at: 1 })
        }),
        ("size update at the end", vec![0x20], |e| {
            matches!(e, HpackError::SizeUpdateAtEnd)
        }),
    ];
    for (name, block, expected) in cases {
        let error = decode_all(&mut Decoder::new(4096), &block).expect_err(name);
        assert!(expected(&error), "{name}: {error:?}");
        assert!(!error.to_string().is_empty());
    }
}

/// Random valid blocks — every representation, Huffman and raw strings, table size
/// updates, entries evicted — decode to what the reference decoder says, block after block
/// on one connection.
#[test]
fn random_blocks_decode_as_the_reference_decoder_does() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    for _ in 0..200 {
        let mut ours = Decoder::new(4096);
        let mut reference = loona_hpack::Decoder::new();
        reference.set_max_allowed_table_size(4096);
        // The encoder's view of the dynamic table: entry sizes, newest first, and its size.
        let mut sizes: Vec<(Vec<u8>, usize)> = Vec::new();
        let mut max = 4096;
        let evict = |sizes: &mut Vec<(Vec<u8>, usize)>, limit: usize| {
            while sizes.iter().map(|e| e.1).sum::<usize>() > limit {
                sizes.pop();
            }
        };
        for _ in 0..20 {
            let mut block = Vec::new();
            if rng.below(8) == 0 {
                max = rng.below(4097);
                integer_into(max, 5, 0x20, &mut block);
                evict(&mut sizes, max);
            }
            for _ in 0..1 + rng.below(8) {
                let string = |rng: &mut XorShift| -> Vec<u8> {
                    (0..rng.below(40)).map(|_| rng.next() as u8).collect()
                };
                let entries = sizes.len();
                match rng.below(5) {
                    0 => integer_into(1 + rng.below(61 + entries), 7, 0x80, &mut block),
                    kind => {
                        let (first, prefix) = match kind {
                            1 => (0x40, 6),
                            2 => (0x00, 4),
                            _ => (0x10, 4),
                        };
                        let name_index = if rng.below(2) == 0 {
                            0
                        } else {
                            1 + rng.below(61 + entries)
                        };
                        integer_into(name_index, prefix, first, &mut block);
                        let name = if name_index == 0 {
                            let name = string(&mut rng);
                            string_into(&name, rng.below(2) == 0, &mut block);
                            name
                        } else if name_index <= 61 {
                            STATIC_TABLE[name_index - 1].0.to_vec()
                        } else {
                            sizes[name_index - 62].0.clone()
                        };
                        let value = string(&mut rng);
                        string_into(&value, rng.below(2) == 0, &mut block);
                        if kind == 1 {
                            let size = name.len() + value.len() + 32;
                            if size > max {
                                sizes.clear();
                            } else {
                                evict(&mut sizes, max - size);
                                sizes.insert(0, (name, size));
                            }
                        }
                    }
                }
            }
            let mine = decode_all(&mut ours, &block).expect("our decoder");
            let theirs: Vec<(String, String)> = reference
                .decode(&block)
                .expect("reference decoder")
                .into_iter()
                .map(|(n, v)| {
                    (
                        String::from_utf8_lossy(&n).into_owned(),
                        String::from_utf8_lossy(&v).into_owned(),
                    )
                })
                .collect();
            assert_eq!(mine, theirs);
        }
    }
}

/// Mutated blocks never panic, and ours refuses a block exactly when the reference does.
#[test]
fn mutated_blocks_are_refused_when_the_reference_refuses_them() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut valid = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
    valid.extend(hex("4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"));
    let mut disagreements = Vec::new();
    let (mut both_decoded, mut both_refused) = (0, 0);
    for _ in 0..20_000 {
        let mut block = valid.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(block.len() + 1);
            match rng.below(3) {
                0 if at < block.len() => block[at] = rng.next() as u8,
                1 => block.truncate(at),
                _ => block.insert(at, rng.next() as u8),
            }
        }
        let mine = decode_all(&mut Decoder::new(4096), &block);
        let mut reference = loona_hpack::Decoder::new();
        reference.set_max_allowed_table_size(4096);
        let theirs = reference.decode(&block);
        match (&mine, &theirs) {
            (Ok(a), Ok(b)) => {
                let b: Vec<(String, String)> = b
                    .iter()
                    .map(|(n, v)| {
                        (
                            String::from_utf8_lossy(n).into_owned(),
                            String::from_utf8_lossy(v).into_owned(),
                        )
                    })
                    .collect();
                assert_eq!(a, &b, "{block:02x?}");
                both_decoded += 1;
            }
            (Err(HpackError::LateSizeUpdate { .. }), Ok(_)) => {
                // RFC 7541 §4.2 (and h2) refuse it; the reference decoder does not check.
            }
            (Err(_), Err(_)) => both_refused += 1,
            _ => disagreements.push((block.clone(), mine.err(), theirs.is_ok())),
        }
    }
    assert!(
        disagreements.is_empty(),
        "{:02x?}",
        &disagreements[..disagreements.len().min(3)]
    );
    assert!(
        both_decoded > 1_000 && both_refused > 1_000,
        "{both_decoded} decoded, {both_refused} refused: the mutations test too little"
    );
}
