//! A gRPC client written frame by frame, sending exactly what real clients put on the wire:
//! the connection preface, SETTINGS, HEADERS with the `:authority` each real client sends
//! (HPACK-encoded here, with the client's own dynamic table), CONTINUATION when the test
//! asks for it, and DATA that obeys the server's flow-control windows.
//!
//! What real clients send, by their source: the kubelet's plugin watcher (grpc-go,
//! `grpc.DialContext(ctx, socketPath, WithContextDialer(unix))`, passthrough resolver) sends
//! the socket path; its DRA client (`grpc.NewClient("unix:" + endpoint)`) sends `localhost`;
//! grpc-python ≥ 1.57 and grpc-swift send the percent-encoded path; grpc-java the path.
#![allow(dead_code)] // each test file uses a different part

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::time::Duration;

use loona_hpack::Decoder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub const DATA: u8 = 0x0;
pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const WINDOW_UPDATE: u8 = 0x8;
pub const CONTINUATION: u8 = 0x9;
pub const END_STREAM: u8 = 0x1;
pub const ACK: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;

/// How long any single read may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(20);

/// The `:authority` forms real clients send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// The socket path (kubelet plugin watcher, grpc-java).
    SocketPath,
    /// The percent-encoded path (grpc-python ≥ 1.57, grpc-swift).
    PercentEncoded,
    /// `localhost` (grpc-go's `unix:` resolver: the kubelet's DRA client).
    Localhost,
    /// `host:port`.
    HostPort,
    /// Present but empty.
    Empty,
    /// Not sent at all.
    Absent,
}

impl Authority {
    pub const ALL: [Authority; 6] = [
        Authority::SocketPath,
        Authority::PercentEncoded,
        Authority::Localhost,
        Authority::HostPort,
        Authority::Empty,
        Authority::Absent,
    ];

    pub fn value(self, socket: &Path) -> Option<String> {
        let path = socket.to_string_lossy().into_owned();
        match self {
            Authority::SocketPath => Some(path),
            Authority::PercentEncoded => Some(path.replace('/', "%2F")),
            Authority::Localhost => Some("localhost".into()),
            Authority::HostPort => Some("localhost:50051".into()),
            Authority::Empty => Some(String::new()),
            Authority::Absent => None,
        }
    }
}

/// HPACK as clients that index aggressively encode it: each new field goes into the
/// dynamic table (literal name), each repeat is a bare index into it. Strings are
/// Huffman-coded when that makes them shorter, as grpc-go's encoder (golang.org/x/net's
/// hpack) does.
#[derive(Default)]
pub struct IndexingEncoder {
    table: Vec<(String, String)>,
    size: usize,
}

impl IndexingEncoder {
    pub fn encode(&mut self, headers: &[(String, String)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, value) in headers {
            if let Some(i) = self
                .table
                .iter()
                .position(|e| e.0 == *name && e.1 == *value)
            {
                integer(62 + i, 7, 0x80, &mut out);
                continue;
            }
            let entry = name.len() + value.len() + 32;
            if entry > 4_096 {
                // Too big to index: literal without indexing.
                out.push(0x00);
            } else {
                out.push(0x40);
                self.table.insert(0, (name.clone(), value.clone()));
                self.size += entry;
                while self.size > 4_096 {
                    let (n, v) = self.table.pop().expect("entries to evict");
                    self.size -= n.len() + v.len() + 32;
                }
            }
            for s in [name, value] {
                gpu_dra::kubelet::authority::encode_string(s.as_bytes(), &mut out);
            }
        }
        out
    }
}

fn integer(value: usize, prefix: u8, first: u8, out: &mut Vec<u8>) {
    loona_hpack::encoder::encode_integer_into(value, prefix, first, out).expect("Vec write");
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A gRPC message: not compressed, 4-byte length, payload.
pub fn grpc_message(payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The request headers grpc-go sends, in its order.
pub fn grpc_headers(path: &str, authority: Option<&str>) -> Vec<(String, String)> {
    let mut headers = vec![(":method", "POST"), (":scheme", "http"), (":path", path)];
    if let Some(a) = authority {
        headers.push((":authority", a));
    }
    headers.extend([
        ("content-type", "application/grpc"),
        ("user-agent", "grpc-go/1.72.2"),
        ("te", "trailers"),
        ("grpc-timeout", "44999876u"),
    ]);
    headers
        .into_iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// What came back on one stream.
#[derive(Debug, Default, Clone)]
pub struct Response {
    pub headers: Vec<(String, String)>,
    pub trailers: Vec<(String, String)>,
    pub data: Vec<u8>,
    pub ended: bool,
    pub reset: Option<u32>,
}

impl Response {
    /// `grpc-status` from the trailers (or a trailers-only response's headers).
    pub fn grpc_status(&self) -> Option<u32> {
        self.trailers
            .iter()
            .chain(&self.headers)
            .find(|(n, _)| n == "grpc-status")
            .and_then(|(_, v)| v.parse().ok())
    }

    pub fn grpc_message(&self) -> String {
        self.trailers
            .iter()
            .chain(&self.headers)
            .find(|(n, _)| n == "grpc-message")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// The gRPC messages received so far, complete ones only.
    pub fn messages(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = &self.data[..];
        while rest.len() >= 5 {
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            if rest.len() < 5 + len {
                break;
            }
            out.push(rest[5..5 + len].to_vec());
            rest = &rest[5 + len..];
        }
        out
    }
}

/// How the connection ended, when it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// The server sent GOAWAY with this error code.
    GoAway(u32),
    /// The server closed the socket.
    Eof,
}

/// One HTTP/2 connection, driven frame by frame.
pub struct RawH2 {
    io: UnixStream,
    encoder: IndexingEncoder,
    decoder: Decoder<'static>,
    next_stream: u32,
    conn_window: i64,
    stream_windows: HashMap<u32, i64>,
    initial_window: i64,
    max_frame: usize,
    buf: Vec<u8>,
    block: Option<(u32, u8, Vec<u8>)>,
    /// Header fragments are cut to this size; smaller than the block forces CONTINUATION.
    pub header_fragment: usize,
    /// Bytes of each header block sent, newest last.
    pub header_block_sizes: Vec<usize>,
    pub server_settings: Vec<(u16, u32)>,
    pub responses: HashMap<u32, Response>,
    pub closed: Option<Closed>,
}

impl RawH2 {
    /// Connects and sends the preface and an empty SETTINGS frame, as grpc-go does.
    pub async fn connect(socket: &Path) -> io::Result<Self> {
        let mut io = UnixStream::connect(socket).await?;
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(SETTINGS, 0, 0, &[]));
        io.write_all(&hello).await?;
        Ok(Self {
            io,
            encoder: IndexingEncoder::default(),
            decoder: Decoder::new(),
            next_stream: 1,
            conn_window: 65_535,
            stream_windows: HashMap::new(),
            initial_window: 65_535,
            max_frame: 16_384,
            buf: Vec::new(),
            block: None,
            header_fragment: 16_384,
            header_block_sizes: Vec::new(),
            server_settings: Vec::new(),
            responses: HashMap::new(),
            closed: None,
        })
    }

    /// Writes raw bytes, for tests that send what no well-behaved client would.
    /// A server that already hung up is not an error here: what it did is read back with
    /// [`RawH2::until_closed`].
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.io.write_all(bytes).await {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            other => other,
        }
    }

    /// Half-closes the connection: the client will send nothing more.
    pub async fn hang_up(&mut self) -> io::Result<()> {
        self.io.shutdown().await
    }

    /// Opens a stream with `headers`, cut into HEADERS + CONTINUATION at
    /// `header_fragment` bytes; returns its id.
    pub async fn start(&mut self, headers: &[(String, String)]) -> io::Result<u32> {
        let stream = self.next_stream;
        self.next_stream += 2;
        let block = self.encoder.encode(headers);
        self.header_block_sizes.push(block.len());
        let mut bytes = Vec::new();
        let pieces: Vec<&[u8]> = block.chunks(self.header_fragment.max(1)).collect();
        for (i, piece) in pieces.iter().enumerate() {
            let kind = if i == 0 { HEADERS } else { CONTINUATION };
            let flags = if i + 1 == pieces.len() {
                END_HEADERS
            } else {
                0
            };
            bytes.extend(frame(kind, flags, stream, piece));
        }
        self.stream_windows.insert(stream, self.initial_window);
        self.responses.insert(stream, Response::default());
        self.io.write_all(&bytes).await?;
        Ok(stream)
    }

    /// Sends `payload` as DATA frames no larger than the server allows, waiting for
    /// WINDOW_UPDATEs whenever the connection or stream window is used up.
    pub async fn send_data(&mut self, stream: u32, payload: &[u8], end: bool) -> io::Result<()> {
        let mut rest = payload;
        loop {
            if self.done(stream) {
                // The server answered (or reset the stream) before reading everything, as it
                // does for a message over its size limit: stop sending, like grpc-go.
                return Ok(());
            }
            let window = self.conn_window.min(self.stream_windows[&stream]);
            if window <= 0 && !rest.is_empty() {
                self.read_frame().await?;
                continue;
            }
            let n = rest.len().min(self.max_frame).min(window.max(0) as usize);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let flags = if rest.is_empty() && end {
                END_STREAM
            } else {
                0
            };
            self.io
                .write_all(&frame(DATA, flags, stream, chunk))
                .await?;
            self.conn_window -= n as i64;
            *self.stream_windows.get_mut(&stream).expect("open stream") -= n as i64;
            if rest.is_empty() {
                return Ok(());
            }
        }
    }

    /// A unary call: headers, one message, end of stream; then the whole response.
    pub async fn unary(
        &mut self,
        path: &str,
        authority: Option<&str>,
        request: &[u8],
    ) -> io::Result<Response> {
        let stream = self.start(&grpc_headers(path, authority)).await?;
        self.send_data(stream, &grpc_message(request), true).await?;
        self.finish(stream).await
    }

    /// Reads until `stream` ends (END_STREAM or RST_STREAM) or the connection does.
    pub async fn finish(&mut self, stream: u32) -> io::Result<Response> {
        while !self.done(stream) {
            self.read_frame().await?;
        }
        Ok(self.responses[&stream].clone())
    }

    /// Reads until `stream` holds `count` complete messages (a server stream).
    pub async fn messages(&mut self, stream: u32, count: usize) -> io::Result<Vec<Vec<u8>>> {
        while self.responses[&stream].messages().len() < count && !self.done(stream) {
            self.read_frame().await?;
        }
        Ok(self.responses[&stream].messages())
    }

    /// Reads until the server ends the connection.
    pub async fn until_closed(&mut self) -> io::Result<Closed> {
        while self.closed.is_none() {
            self.read_frame().await?;
        }
        Ok(self.closed.clone().expect("closed"))
    }

    fn done(&self, stream: u32) -> bool {
        let r = &self.responses[&stream];
        r.ended || r.reset.is_some() || self.closed.is_some()
    }

    /// Reads and handles one frame: SETTINGS and PING are acknowledged, DATA is credited
    /// back at once (as grpc-go does for small windows), headers are HPACK-decoded.
    pub async fn read_frame(&mut self) -> io::Result<()> {
        if self.closed.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let Some(head) = self.fill(9).await? else {
            self.closed = Some(Closed::Eof);
            return Ok(());
        };
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        self.buf.drain(..9);
        let Some(payload) = self.fill(len).await? else {
            self.closed = Some(Closed::Eof);
            return Ok(());
        };
        self.buf.drain(..len);
        match kind {
            SETTINGS if flags & ACK == 0 => {
                for s in payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([s[0], s[1]]);
                    let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
                    self.server_settings.push((id, value));
                    match id {
                        0x4 => {
                            let delta = i64::from(value) - self.initial_window;
                            self.initial_window = i64::from(value);
                            self.stream_windows.values_mut().for_each(|w| *w += delta);
                        }
                        0x5 => self.max_frame = value as usize,
                        _ => {}
                    }
                }
                self.reply(&frame(SETTINGS, ACK, 0, &[])).await?;
            }
            PING if flags & ACK == 0 => {
                self.reply(&frame(PING, ACK, 0, &payload)).await?;
            }
            WINDOW_UPDATE => {
                let inc = i64::from(
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]])
                        & 0x7fff_ffff,
                );
                if stream == 0 {
                    self.conn_window += inc;
                } else if let Some(w) = self.stream_windows.get_mut(&stream) {
                    *w += inc;
                }
            }
            DATA => {
                if !payload.is_empty() {
                    let credit = (payload.len() as u32).to_be_bytes();
                    let mut updates = frame(WINDOW_UPDATE, 0, 0, &credit);
                    updates.extend(frame(WINDOW_UPDATE, 0, stream, &credit));
                    self.reply(&updates).await?;
                }
                let r = self.responses.entry(stream).or_default();
                r.data.extend_from_slice(&payload);
                r.ended |= flags & END_STREAM != 0;
            }
            HEADERS | CONTINUATION => {
                let mut block = match self.block.take() {
                    Some(b) => b,
                    None => (stream, flags, Vec::new()),
                };
                block.2.extend_from_slice(&payload);
                if flags & END_HEADERS == 0 {
                    self.block = Some(block);
                } else {
                    let list = self
                        .decoder
                        .decode(&block.2)
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    let list: Vec<(String, String)> = list
                        .into_iter()
                        .map(|(n, v)| {
                            (
                                String::from_utf8_lossy(&n).into_owned(),
                                String::from_utf8_lossy(&v).into_owned(),
                            )
                        })
                        .collect();
                    let r = self.responses.entry(block.0).or_default();
                    if r.headers.is_empty() {
                        r.headers = list;
                    } else {
                        r.trailers = list;
                    }
                    r.ended |= block.1 & END_STREAM != 0;
                }
            }
            RST_STREAM => {
                let code = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                self.responses.entry(stream).or_default().reset = Some(code);
            }
            GOAWAY => {
                let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
                self.closed = Some(Closed::GoAway(code));
            }
            _ => {}
        }
        Ok(())
    }

    /// Answers the server; one that already hung up is found by the next read.
    async fn reply(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.io.write_all(bytes).await {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// Reads until the buffer holds `n` bytes; `None` when the server closed first.
    async fn fill(&mut self, n: usize) -> io::Result<Option<Vec<u8>>> {
        while self.buf.len() < n {
            let mut chunk = [0u8; 16_384];
            let read = match tokio::time::timeout(PATIENCE, self.io.read(&mut chunk)).await {
                Ok(Ok(read)) => read,
                Ok(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset => 0,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "server silent")),
            };
            if read == 0 {
                return Ok(None);
            }
            self.buf.extend_from_slice(&chunk[..read]);
        }
        Ok(Some(self.buf[..n].to_vec()))
    }
}
