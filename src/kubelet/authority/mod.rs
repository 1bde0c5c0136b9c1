//! Every gRPC client's `:authority`, accepted: an I/O adapter on each accepted Unix
//! connection that runs the client's bytes through a [`Rewriter`] before `h2` parses them.
//!
//! Why it exists: the kubelet's plugin watcher dials the registration socket with grpc-go's
//! passthrough resolver, which sends the socket path as `:authority`; grpc-python (≥ 1.57) and
//! grpc-swift send the percent-encoded path, grpc-java the path. `h2` resets such streams with
//! PROTOCOL_ERROR (hyperium/h2#487), so without this adapter a real kubelet never registers
//! the plugin. Server-to-client bytes are not touched.

mod hpack;
mod rewriter;
#[cfg(test)]
mod test_rng;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::{Connected, UdsConnectInfo};
use tracing::debug;

pub use hpack::encode_string;
pub use rewriter::{AuthorityError, MAX_HEADER_BLOCK, PREFACE, REPLACEMENT_AUTHORITY, Rewriter};

/// How much is read from the client at a time: one maximum-size default frame.
const READ_CHUNK: usize = 16_384;

/// One accepted connection with the client's `:authority` made acceptable to `h2`.
///
/// Guarantees: `h2` sees exactly the client's bytes, except that header blocks are
/// re-encoded (same headers, same order, `:authority` possibly replaced) and their frames
/// re-cut. Reads fail with [`io::ErrorKind::InvalidData`] (ending only this connection) when
/// the client breaks HTTP/2 framing or HPACK in a way `h2` would refuse too. Writes pass
/// straight through.
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet handed to `h2`, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    scratch: Box<[u8]>,
    failed: bool,
}

impl<S> AuthorityFix<S> {
    /// Wraps a freshly accepted connection (nothing read from it yet).
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: Rewriter::new(),
            out: Vec::new(),
            out_pos: 0,
            scratch: vec![0; READ_CHUNK].into_boxed_slice(),
            failed: false,
        }
    }

    /// How many requests on this connection had their `:authority` replaced.
    pub fn rewritten(&self) -> u64 {
        self.rewriter.rewritten()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.out_pos < this.out.len() {
                let n = (this.out.len() - this.out_pos).min(buf.remaining());
                buf.put_slice(&this.out[this.out_pos..this.out_pos + n]);
                this.out_pos += n;
                if this.out_pos == this.out.len() {
                    this.out.clear();
                    this.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.failed {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "connection ended after an HTTP/2 framing error",
                )));
            }
            // DATA and other pass-through payload goes from the socket straight into h2's
            // buffer: no copy through `out`.
            let direct = this.rewriter.passthrough_remaining().min(buf.remaining());
            if direct > 0 {
                let mut limited = ReadBuf::new(buf.initialize_unfilled_to(direct));
                ready!(Pin::new(&mut this.inner).poll_read(cx, &mut limited))?;
                let n = limited.filled().len();
                buf.advance(n);
                this.rewriter.skipped(n);
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.scratch);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut chunk))?;
            let read = chunk.filled();
            if read.is_empty() {
                return Poll::Ready(Ok(()));
            }
            if let Err(error) = this.rewriter.feed(read, &mut this.out) {
                debug!(error = %error, "ending a kubelet socket connection");
                this.failed = true;
                // What was rewritten before the error still reaches h2, then the error.
                if this.out.is_empty() {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, error)));
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for AuthorityFix<UnixStream> {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
