use super::*;
use crate::kubelet::authority::test_rng::XorShift;

// The rewriter's output is read back with another decoder than its own, as `h2` would.
use loona_hpack::{Decoder, Encoder};

/// A frame as `h2` would read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

fn parse_frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let head = FrameHead::parse(&bytes[..9]);
        frames.push(Frame {
            kind: head.kind,
            flags: head.flags,
            stream: head.stream,
            payload: bytes[9..9 + head.len].to_vec(),
        });
        bytes = &bytes[9 + head.len..];
    }
    frames
}

/// Decodes every header block in `frames` the way `h2` does: with one decoder for the
/// connection, so a rewriter that left entries in its table would show here.
fn header_lists(frames: &[Frame]) -> Vec<(u32, Vec<(String, String)>)> {
    let mut decoder = Decoder::new();
    decoder.set_max_table_size(0);
    let mut lists = Vec::new();
    let mut block = Vec::new();
    for f in frames {
        match f.kind {
            HEADERS => {
                let skip = if f.flags & PRIORITY != 0 { 5 } else { 0 };
                block = f.payload[skip..].to_vec();
            }
            CONTINUATION => block.extend_from_slice(&f.payload),
            _ => continue,
        }
        if f.flags & END_HEADERS != 0 {
            let list = decoder.decode(&block).expect("rewritten block decodes");
            let list = list
                .into_iter()
                .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                .collect();
            lists.push((f.stream, list));
        }
    }
    lists
}

fn request_headers(authority: Option<&str>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/pluginregistration.Registration/GetInfo"),
    ];
    if let Some(a) = authority {
        headers.push((":authority", a));
    }
    headers.extend([
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.2"),
        ("te", "trailers"),
    ]);
    headers
        .into_iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// Encodes the way clients that index aggressively do (grpc-core, grpc-go for repeated
/// fields): every new field is added to the dynamic table with a literal name, every repeat
/// is sent as a bare index into it.
#[derive(Default)]
struct IndexingEncoder {
    /// Newest first, as HPACK numbers them (62, 63, ...).
    table: Vec<(Vec<u8>, Vec<u8>)>,
}

impl IndexingEncoder {
    fn encode(&mut self, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in headers {
            if let Some(i) = self
                .table
                .iter()
                .position(|e| e.0 == *name && e.1 == *value)
            {
                loona_hpack::encoder::encode_integer_into(62 + i, 7, 0x80, &mut out).unwrap();
                continue;
            }
            out.push(0x40);
            for s in [name, value] {
                loona_hpack::encoder::encode_integer_into(s.len(), 7, 0, &mut out).unwrap();
                out.extend_from_slice(s);
            }
            self.table.insert(0, (name.clone(), value.clone()));
        }
        out
    }
}

fn encode(encoder: &mut Encoder<'_>, headers: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())))
}

fn run(input: &[u8]) -> Result<Vec<u8>, AuthorityError> {
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    rewriter.feed(input, &mut out)?;
    Ok(out)
}

fn authority_of(list: &[(String, String)]) -> Option<&str> {
    list.iter()
        .find(|(n, _)| n == ":authority")
        .map(|(_, v)| v.as_str())
}

const SOCKET: &str = "/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock";
const ENCODED: &str = "%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fgpu.nvidia.com-reg.sock";

#[test]
fn every_authority_form_becomes_one_h2_accepts_and_valid_ones_are_kept() {
    let cases: [(Option<&str>, Option<&str>); 6] = [
        (Some(SOCKET), Some("localhost")),
        (Some(ENCODED), Some("localhost")),
        (Some("localhost"), Some("localhost")),
        (Some("localhost:50051"), Some("localhost:50051")),
        (Some(""), Some("localhost")),
        (None, None),
    ];
    for (sent, want) in cases {
        let block = encode(&mut Encoder::new(), &request_headers(sent));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, END_HEADERS, 1, &block));
        let frames = parse_frames(&run(&input).unwrap()[PREFACE.len()..]);
        let lists = header_lists(&frames);
        assert_eq!(authority_of(&lists[0].1), want, "sent {sent:?}");
        if let Some(a) = want {
            assert!(http::uri::Authority::try_from(a).is_ok(), "{a:?}");
        }
        let names: Vec<_> = lists[0].1.iter().map(|(n, _)| n.clone()).collect();
        let sent_names: Vec<_> = request_headers(sent)
            .into_iter()
            .map(|(n, _)| String::from_utf8(n).unwrap())
            .collect();
        assert_eq!(names, sent_names, "header order is kept");
    }
}

#[test]
fn frames_other_than_headers_pass_through_byte_for_byte() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(0x4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    input.extend(frame(0x0, 0x1, 1, &vec![7u8; 40_000])); // DATA over the default frame size
    input.extend(frame(0x8, 0, 0, &[0, 1, 0, 0])); // WINDOW_UPDATE
    input.extend(frame(0x6, 0, 0, b"pingping")); // PING
    assert_eq!(run(&input).unwrap(), input);
}

#[test]
fn any_split_of_the_input_gives_the_same_output() {
    let mut encoder = IndexingEncoder::default();
    let mut input = PREFACE.to_vec();
    for stream in [1u32, 3, 5] {
        let block = encoder.encode(&request_headers(Some(SOCKET)));
        let (a, b) = block.split_at(block.len() / 2);
        input.extend(frame(HEADERS, 0, stream, a));
        input.extend(frame(CONTINUATION, END_HEADERS, stream, b));
        input.extend(frame(0x0, 0x1, stream, &[0, 0, 0, 0, 0]));
    }
    let whole = run(&input).unwrap();
    for chunk in [1, 2, 7, 9, 10, 100] {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            rewriter.feed(piece, &mut out).unwrap();
        }
        assert_eq!(out, whole, "chunks of {chunk}");
        assert!(rewriter.at_frame_boundary());
        assert_eq!(rewriter.rewritten(), 3);
    }
}

#[test]
fn the_clients_dynamic_table_is_followed_across_requests() {
    // The second and third blocks refer to the first one's entries by index only.
    let mut encoder = IndexingEncoder::default();
    let headers = request_headers(Some(SOCKET));
    let blocks: Vec<_> = (0..3).map(|_| encoder.encode(&headers)).collect();
    assert!(
        blocks[1].len() < blocks[0].len() / 4,
        "indexed the second time"
    );
    let mut input = PREFACE.to_vec();
    for (i, block) in blocks.iter().enumerate() {
        input.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            2 * i as u32 + 1,
            block,
        ));
    }
    let frames = parse_frames(&run(&input).unwrap()[PREFACE.len()..]);
    let lists = header_lists(&frames);
    assert_eq!(lists.len(), 3);
    for (_, list) in &lists {
        assert_eq!(authority_of(list), Some("localhost"));
        assert_eq!(list.len(), headers.len());
    }
    assert!(frames.iter().all(|f| f.flags & END_STREAM != 0));
}

#[test]
fn padding_is_dropped_and_priority_kept() {
    let block = encode(&mut Encoder::new(), &request_headers(Some(SOCKET)));
    let mut payload = vec![4u8]; // pad length
    payload.extend([0x80, 0, 0, 0, 15]); // exclusive dependency on stream 0, weight 16
    payload.extend(&block);
    payload.extend([0u8; 4]);
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, END_HEADERS | PADDED | PRIORITY, 1, &payload));
    let frames = parse_frames(&run(&input).unwrap()[PREFACE.len()..]);
    assert_eq!(frames[0].flags, END_HEADERS | PRIORITY);
    assert_eq!(frames[0].payload[..5], [0x80, 0, 0, 0, 15]);
    assert_eq!(authority_of(&header_lists(&frames)[0].1), Some("localhost"));
}

#[test]
fn a_large_block_is_recut_into_frames_within_the_default_size() {
    let mut headers = request_headers(Some(SOCKET));
    headers.push((b"x-padding".to_vec(), vec![b'p'; 40_000]));
    let block = encode(&mut Encoder::new(), &headers);
    let mut input = PREFACE.to_vec();
    for (i, piece) in block.chunks(1_000).enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let last = (i + 1) * 1_000 >= block.len();
        input.extend(frame(kind, if last { END_HEADERS } else { 0 }, 1, piece));
    }
    let frames = parse_frames(&run(&input).unwrap()[PREFACE.len()..]);
    assert!(frames.len() >= 3);
    assert!(frames.iter().all(|f| f.payload.len() <= OUT_FRAME));
    assert_eq!(frames[0].kind, HEADERS);
    assert!(frames[1..].iter().all(|f| f.kind == CONTINUATION));
    let ends: Vec<_> = frames.iter().map(|f| f.flags & END_HEADERS != 0).collect();
    assert_eq!(ends.iter().filter(|e| **e).count(), 1);
    assert!(ends[ends.len() - 1]);
    let lists = header_lists(&frames);
    assert_eq!(lists[0].1.last().unwrap().1.len(), 40_000);
}

#[test]
fn something_that_is_not_http2_passes_through_untouched() {
    let input = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    assert_eq!(run(&input).unwrap(), input);
}

#[test]
fn framing_and_hpack_errors_end_the_connection_with_the_reason() {
    let block = encode(&mut Encoder::new(), &request_headers(Some(SOCKET)));
    let with_preface = |frames: &[Vec<u8>]| {
        let mut input = PREFACE.to_vec();
        frames.iter().for_each(|f| input.extend(f));
        input
    };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "continuation without headers",
            with_preface(&[frame(CONTINUATION, END_HEADERS, 1, &block)]),
        ),
        (
            "data inside a header block",
            with_preface(&[frame(HEADERS, 0, 1, &block), frame(0x0, 0, 1, b"x")]),
        ),
        (
            "continuation of another stream",
            with_preface(&[
                frame(HEADERS, 0, 1, &block),
                frame(CONTINUATION, END_HEADERS, 3, &[]),
            ]),
        ),
        (
            "padding longer than the frame",
            with_preface(&[frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2])]),
        ),
        (
            "priority fields cut short",
            with_preface(&[frame(HEADERS, END_HEADERS | PRIORITY, 1, &[0, 0])]),
        ),
        (
            "index beyond both tables",
            with_preface(&[frame(HEADERS, END_HEADERS, 1, &[0xff, 0x7f])]),
        ),
        (
            "table size above the protocol default",
            with_preface(&[frame(HEADERS, END_HEADERS, 1, &[0x3f, 0xe1, 0x7f, 0x82])]),
        ),
    ];
    for (name, input) in cases {
        let error = run(&input).expect_err(name);
        assert!(!error.to_string().is_empty(), "{name}");
    }
    let mut big = PREFACE.to_vec();
    big.extend(frame(HEADERS, 0, 1, &vec![0; 16_000]));
    let mut rewriter = Rewriter::new();
    let mut out = Vec::new();
    rewriter.feed(&big, &mut out).unwrap();
    let mut error = None;
    for _ in 0..100 {
        if let Err(e) = rewriter.feed(&frame(CONTINUATION, 0, 1, &vec![0; 16_000]), &mut out) {
            error = Some(e);
            break;
        }
    }
    assert!(matches!(
        error,
        Some(AuthorityError::HeaderBlockTooLarge { stream: 1, .. })
    ));
}

#[test]
fn random_and_mutated_input_never_panics() {
    // A valid connection to mutate: preface, SETTINGS, three requests with DATA.
    let mut encoder = IndexingEncoder::default();
    let mut valid = PREFACE.to_vec();
    valid.extend(frame(0x4, 0, 0, &[]));
    for stream in [1u32, 3, 5] {
        let block = encoder.encode(&request_headers(Some(SOCKET)));
        valid.extend(frame(HEADERS, END_HEADERS, stream, &block));
        valid.extend(frame(0x0, END_STREAM, stream, &[0, 0, 0, 0, 1, 9]));
    }
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let mut input = valid.clone();
        for _ in 0..1 + rng.below(8) {
            let at = PREFACE.len() + rng.below(input.len() - PREFACE.len() + 1);
            match rng.below(3) {
                0 if at < input.len() => input[at] = rng.next() as u8,
                1 => input.truncate(at),
                _ => {
                    let junk: Vec<u8> = (0..rng.below(64)).map(|_| rng.next() as u8).collect();
                    input.splice(at..at, junk);
                }
            }
        }
        let mut rewriter = Rewriter::new();
        let mut out = Vec::new();
        for piece in input.chunks(1 + rng.below(64)) {
            if rewriter.feed(piece, &mut out).is_err() {
                break;
            }
        }
        assert!(out.len() <= input.len() * 2 + MAX_HEADER_BLOCK);
    }
}
