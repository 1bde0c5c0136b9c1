//! What accepting every client's `:authority` costs per call: the rewriter alone on the
//! bytes a kubelet sends for one prepare, and the whole adapter (rewriter plus the extra
//! copy) reading those bytes from a socket pair, against reading them directly. Strings are
//! Huffman-coded when that makes them shorter, as grpc-go sends them: the cost the first
//! version of this bench missed (its client sent raw strings) was in Huffman decoding.

use std::hint::black_box;
use std::time::{Duration, Instant};

use gpu_dra::kubelet::authority::{AuthorityFix, PREFACE, Rewriter, encode_string};
use gpu_dra::kubelet::proto::dra_v1;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SOCKET: &str = "/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock";

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A literal header field with incremental indexing and a literal name, as a client sends
/// the first request of a connection.
fn literal(name: &str, value: &str, out: &mut Vec<u8>) {
    literal_with(0x40, name, value, out);
}

/// A literal header field with the given representation byte (0x00: without indexing), each
/// string Huffman-coded when that makes it shorter, as grpc-go's encoder (and h2's) does.
fn literal_with(first: u8, name: &str, value: &str, out: &mut Vec<u8>) {
    out.push(first);
    for s in [name, value] {
        encode_string(s.as_bytes(), out);
    }
}

/// The bytes of `calls` NodePrepareResources calls with one claim each on one connection,
/// the first carrying every header, the later ones indexed references (grpc-go style).
fn kubelet_bytes(calls: u32) -> Vec<u8> {
    let request = dra_v1::NodePrepareResourcesRequest {
        claims: vec![dra_v1::Claim {
            namespace: "team-a".into(),
            uid: "0b6f3c2e-2d1a-4a43-9c1e-5c7d0f0f4a11".into(),
            name: "pod-gpu-claim".into(),
        }],
    }
    .encode_to_vec();
    let mut message = vec![0];
    message.extend_from_slice(&(request.len() as u32).to_be_bytes());
    message.extend_from_slice(&request);
    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    let headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (
            ":path",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        ),
        (":authority", SOCKET),
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.2"),
        ("te", "trailers"),
    ];
    for call in 0..calls {
        let stream = 2 * call + 1;
        let mut block = Vec::new();
        if call == 0 {
            headers.iter().for_each(|(n, v)| literal(n, v, &mut block));
        } else {
            // Indexed: the table holds the seven entries, newest first (62..=68).
            (0..headers.len())
                .rev()
                .for_each(|i| block.push(0x80 | (62 + i as u8)));
        }
        // A per-call value: not worth indexing.
        literal_with(
            0x00,
            "grpc-timeout",
            &format!("{}u", 44_999_876 - call),
            &mut block,
        );
        out.extend(frame(0x1, 0x4, stream, &block));
        out.extend(frame(0x0, 0x1, stream, &message));
    }
    out
}

fn report(label: &str, total: Duration, calls: u64) {
    println!(
        "{label:<58} {:>9.2} µs/call",
        total.as_secs_f64() * 1e6 / calls as f64
    );
}

fn main() {
    const CALLS: u32 = 100;
    const ROUNDS: u32 = 2_000;
    let bytes = kubelet_bytes(CALLS);

    let start = Instant::now();
    for _ in 0..ROUNDS {
        let mut rewriter = Rewriter::new();
        let mut out = Vec::with_capacity(bytes.len() * 2);
        rewriter.feed(black_box(&bytes), &mut out).unwrap();
        assert_eq!(rewriter.rewritten(), u64::from(CALLS));
        black_box(out);
    }
    report(
        "rewriter alone (HPACK decode + re-encode + frame copy)",
        start.elapsed(),
        u64::from(CALLS * ROUNDS),
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let through = |fix: bool| {
        runtime.block_on(async {
            let start = Instant::now();
            for _ in 0..ROUNDS / 10 {
                let (mut client, server) = tokio::net::UnixStream::pair().unwrap();
                let writer = {
                    let bytes = bytes.clone();
                    tokio::spawn(async move {
                        client.write_all(&bytes).await.unwrap();
                        client.shutdown().await.unwrap();
                    })
                };
                let mut got = Vec::new();
                if fix {
                    AuthorityFix::new(server)
                        .read_to_end(&mut got)
                        .await
                        .unwrap();
                } else {
                    let mut server = server;
                    server.read_to_end(&mut got).await.unwrap();
                }
                writer.await.unwrap();
                black_box(got);
            }
            start.elapsed()
        })
    };
    let direct = through(false);
    let adapted = through(true);
    let calls = u64::from(CALLS * ROUNDS / 10);
    report("socket read, direct", direct, calls);
    report("socket read through the adapter", adapted, calls);
    report(
        "added per call by the adapter (target < 20 µs)",
        adapted.saturating_sub(direct),
        calls,
    );
}
