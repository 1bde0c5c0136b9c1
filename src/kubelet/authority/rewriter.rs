//! The client-to-server byte stream of one HTTP/2 connection, with every request's
//! `:authority` made acceptable to `h2` (pure: bytes in, bytes out, no I/O).
//!
//! Real gRPC clients of a Unix socket send whatever their resolver put in `:authority`: the
//! kubelet's plugin watcher sends the socket path, grpc-python the percent-encoded path,
//! grpc-java the path. `h2` accepts only a valid URI authority there and resets the stream
//! with PROTOCOL_ERROR otherwise. [`Rewriter`] sits in front of `h2`:
//!
//! - the connection preface and every frame other than HEADERS/CONTINUATION pass through
//!   byte for byte (DATA is streamed, never buffered);
//! - a header block (HEADERS plus its CONTINUATIONs) is collected, HPACK-decoded against the
//!   client's dynamic table, its `:authority` replaced by `localhost` when it is not a valid
//!   URI authority, and re-encoded as literals that never touch `h2`'s dynamic table, so the
//!   two tables stay consistent whatever the client indexed;
//! - anything that is not HTTP/2 after a wrong preface passes through untouched, for `h2` to
//!   refuse as it always did.
//!
//! Every limit `h2` enforces (frame sizes, header list size, streams, flow control) is still
//! enforced by `h2`; the rewriter adds only a bound on the header block it buffers.

use super::hpack::{Decoder, HpackError};

/// The client connection preface, RFC 9113 §3.4.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The length of a frame header, RFC 9113 §4.1.
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Re-encoded header blocks are cut into frames of at most the protocol's initial
/// SETTINGS_MAX_FRAME_SIZE, which every server accepts whatever it announced.
const OUT_FRAME: usize = 16_384;
/// The dynamic table size every HTTP/2 endpoint starts with; the plugin's server never
/// announces another SETTINGS_HEADER_TABLE_SIZE, so a client may not use a larger one.
const HPACK_TABLE: usize = 4_096;
/// The most header block bytes buffered for one request: far above any gRPC client's
/// metadata limit (grpc-go: 16 KiB), far below what would strain the node.
pub const MAX_HEADER_BLOCK: usize = 1 << 20;
/// What an unusable `:authority` becomes; tonic routes by `:path` and never reads it.
pub const REPLACEMENT_AUTHORITY: &[u8] = b"localhost";

/// Why a connection cannot go on: the client broke HTTP/2 framing or HPACK in a way `h2`
/// would also refuse. The connection ends; the server and its other connections do not.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// CONTINUATION must follow a HEADERS frame without END_HEADERS (RFC 9113 §6.10).
    #[error("CONTINUATION frame on stream {stream} without an open header block")]
    UnexpectedContinuation { stream: u32 },

    /// Nothing may come between a HEADERS frame and its last CONTINUATION.
    #[error(
        "frame of type {kind:#04x} on stream {stream} interrupts the header block of stream {open}"
    )]
    InterruptedHeaderBlock { kind: u8, stream: u32, open: u32 },

    /// The padding or priority fields claim more bytes than the frame has.
    #[error("HEADERS frame on stream {stream} is shorter than its padding and priority fields")]
    MalformedHeaders { stream: u32 },

    #[error("header block of stream {stream} is over {limit} bytes")]
    HeaderBlockTooLarge { stream: u32, limit: usize },

    #[error("cannot decode the HPACK header block of stream {stream}")]
    Hpack {
        stream: u32,
        #[source]
        source: HpackError,
    },
}

/// Where in the client's byte stream the rewriter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Matching the 24-byte preface.
    Preface,
    /// Collecting a 9-byte frame header.
    FrameHeader,
    /// Passing `remaining` payload bytes of a frame through.
    Payload { remaining: usize },
    /// Collecting the payload of a HEADERS or CONTINUATION frame.
    HeaderPayload { header: FrameHead },
    /// Not HTTP/2: everything passes through.
    Raw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHead {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHead {
    fn parse(bytes: &[u8]) -> Self {
        Self {
            len: usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }
}

/// A header block being collected across HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    end_stream: bool,
    /// The HEADERS frame's priority fields (stream dependency and weight), kept as sent.
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// The client-to-server half of one connection. Feed it what the client sent, in order, and
/// hand what it writes to `h2`.
pub struct Rewriter {
    phase: Phase,
    pending: Vec<u8>,
    block: Option<OpenBlock>,
    decoder: Decoder,
    rewritten: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("phase", &self.phase)
            .field("pending", &self.pending.len())
            .field("rewritten", &self.rewritten)
            .finish_non_exhaustive()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Self::new()
    }
}

impl Rewriter {
    /// A rewriter at the start of a connection, expecting the client preface.
    pub fn new() -> Self {
        Self {
            phase: Phase::Preface,
            pending: Vec::new(),
            block: None,
            decoder: Decoder::new(HPACK_TABLE),
            rewritten: 0,
        }
    }

    /// How many `:authority` values this connection had replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// How many payload bytes of the current pass-through frame are still to come: the caller
    /// may move that many bytes straight from the client to `h2` without feeding them here,
    /// then report them with [`Rewriter::skipped`].
    pub fn passthrough_remaining(&self) -> usize {
        match self.phase {
            Phase::Payload { remaining } => remaining,
            _ => 0,
        }
    }

    /// Records that `n` (at most [`Rewriter::passthrough_remaining`]) payload bytes went to
    /// `h2` directly.
    pub fn skipped(&mut self, n: usize) {
        if let Phase::Payload { remaining } = self.phase {
            let left = remaining.saturating_sub(n);
            self.phase = if left == 0 {
                Phase::FrameHeader
            } else {
                Phase::Payload { remaining: left }
            };
        }
    }

    /// Whether the client is between frames: a connection that ends here ended cleanly.
    pub fn at_frame_boundary(&self) -> bool {
        self.pending.is_empty()
            && self.block.is_none()
            && matches!(self.phase, Phase::FrameHeader | Phase::Raw)
    }

    /// Consumes `input` (any split of the client's bytes) and appends what `h2` should read
    /// to `out`. Bytes of an incomplete frame header or header block are kept for the next
    /// call.
    ///
    /// Fails when the client broke framing or HPACK; the connection must then end, and
    /// nothing more may be fed.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        while !input.is_empty() {
            match self.phase {
                Phase::Raw => {
                    out.extend_from_slice(input);
                    return Ok(());
                }
                Phase::Preface => {
                    let taken = self.collect(&mut input, PREFACE.len());
                    if !PREFACE.starts_with(&self.pending) {
                        out.append(&mut self.pending);
                        self.phase = Phase::Raw;
                    } else if taken {
                        out.append(&mut self.pending);
                        self.phase = Phase::FrameHeader;
                    }
                }
                Phase::FrameHeader => {
                    if self.collect(&mut input, FRAME_HEADER) {
                        let head = FrameHead::parse(&self.pending);
                        self.frame_header(head, out)?;
                    }
                }
                Phase::Payload { remaining } => {
                    let n = remaining.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input = &input[n..];
                    self.skipped(n);
                }
                Phase::HeaderPayload { header } => {
                    if self.collect(&mut input, header.len) {
                        self.header_payload(header, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves bytes from `input` into `pending` until it holds `want`; true once it does.
    fn collect(&mut self, input: &mut &[u8], want: usize) -> bool {
        let n = want.saturating_sub(self.pending.len()).min(input.len());
        self.pending.extend_from_slice(&input[..n]);
        *input = &input[n..];
        self.pending.len() == want
    }

    fn frame_header(&mut self, head: FrameHead, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let is_header_frame = head.kind == HEADERS || head.kind == CONTINUATION;
        if let Some(open) = &self.block
            && (head.kind != CONTINUATION || head.stream != open.stream)
        {
            return Err(AuthorityError::InterruptedHeaderBlock {
                kind: head.kind,
                stream: head.stream,
                open: open.stream,
            });
        }
        if head.kind == CONTINUATION && self.block.is_none() {
            return Err(AuthorityError::UnexpectedContinuation {
                stream: head.stream,
            });
        }
        if is_header_frame {
            let buffered = self.block.as_ref().map_or(0, |b| b.fragment.len());
            if buffered + head.len > MAX_HEADER_BLOCK {
                return Err(AuthorityError::HeaderBlockTooLarge {
                    stream: head.stream,
                    limit: MAX_HEADER_BLOCK,
                });
            }
            self.pending.clear();
            self.phase = Phase::HeaderPayload { header: head };
            if head.len == 0 {
                self.header_payload(head, out)?;
            }
        } else {
            out.append(&mut self.pending);
            self.phase = if head.len == 0 {
                Phase::FrameHeader
            } else {
                Phase::Payload {
                    remaining: head.len,
                }
            };
        }
        Ok(())
    }

    fn header_payload(&mut self, head: FrameHead, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let payload = std::mem::take(&mut self.pending);
        self.phase = Phase::FrameHeader;
        match &mut self.block {
            Some(open) => open.fragment.extend_from_slice(&payload),
            None => self.block = Some(open_block(head, &payload)?),
        }
        if head.flags & END_HEADERS != 0
            && let Some(block) = self.block.take()
        {
            self.rewrite(block, out)?;
        }
        Ok(())
    }

    fn rewrite(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let mut encoded = Vec::with_capacity(block.fragment.len() + 64);
        let mut replaced = false;
        self.decoder
            .decode(&block.fragment, |name, value| {
                let value = if name == b":authority" && !valid_authority(value) {
                    replaced = true;
                    REPLACEMENT_AUTHORITY
                } else {
                    value
                };
                encode_literal(name, value, &mut encoded);
            })
            .map_err(|source| AuthorityError::Hpack {
                stream: block.stream,
                source,
            })?;
        if replaced {
            self.rewritten += 1;
        }
        write_header_frames(&block, &encoded, out);
        Ok(())
    }
}

/// Starts a header block from a HEADERS frame's payload, without its padding.
fn open_block(head: FrameHead, payload: &[u8]) -> Result<OpenBlock, AuthorityError> {
    let malformed = AuthorityError::MalformedHeaders {
        stream: head.stream,
    };
    let mut rest = payload;
    let pad = if head.flags & PADDED != 0 {
        let (&n, tail) = rest.split_first().ok_or(malformed)?;
        rest = tail;
        usize::from(n)
    } else {
        0
    };
    let priority = if head.flags & PRIORITY != 0 {
        let fields: [u8; 5] = rest.get(..5).and_then(|f| f.try_into().ok()).ok_or(
            AuthorityError::MalformedHeaders {
                stream: head.stream,
            },
        )?;
        rest = &rest[5..];
        Some(fields)
    } else {
        None
    };
    let Some(len) = rest.len().checked_sub(pad) else {
        return Err(AuthorityError::MalformedHeaders {
            stream: head.stream,
        });
    };
    Ok(OpenBlock {
        stream: head.stream,
        end_stream: head.flags & END_STREAM != 0,
        priority,
        fragment: rest[..len].to_vec(),
    })
}

/// Whether `h2` accepts `value` as a request's `:authority`.
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A literal header field without indexing, with a literal name and no Huffman coding
/// (RFC 7541 §6.2.2): it neither reads nor changes the receiver's dynamic table.
fn encode_literal(name: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.push(0x00);
    for string in [name, value] {
        super::hpack::encode_integer(string.len(), 7, 0, out);
        out.extend_from_slice(string);
    }
}

/// Writes `encoded` as a HEADERS frame with the block's flags and priority, followed by as
/// many CONTINUATION frames as needed.
fn write_header_frames(block: &OpenBlock, encoded: &[u8], out: &mut Vec<u8>) {
    let priority: &[u8] = block.priority.as_ref().map_or(&[], |p| p.as_slice());
    let first_room = OUT_FRAME - priority.len();
    let (first, mut rest) = encoded.split_at(encoded.len().min(first_room));
    let mut flags = 0;
    if block.end_stream {
        flags |= END_STREAM;
    }
    if !priority.is_empty() {
        flags |= PRIORITY;
    }
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    write_frame_header(
        out,
        priority.len() + first.len(),
        HEADERS,
        flags,
        block.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(OUT_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
#[path = "rewriter_tests.rs"]
mod tests;
