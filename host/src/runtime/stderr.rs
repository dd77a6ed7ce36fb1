//! Guest stderr capture: keeps the last bytes a guest wrote, so that a trap can be explained
//! with the guest's own words (a Rust panic message, say). Writes never fail and memory stays
//! bounded however much the guest writes.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// The last `capacity` bytes written, shared between the WASI context and the host.
#[derive(Clone)]
pub struct StderrTail {
    capacity: usize,
    buf: Arc<Mutex<Vec<u8>>>,
}

impl StderrTail {
    /// A capture that keeps the last `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        StderrTail {
            capacity,
            buf: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let Ok(mut buf) = self.buf.lock() else { return };
        let bytes = &bytes[bytes.len().saturating_sub(self.capacity)..];
        let overflow = (buf.len() + bytes.len()).saturating_sub(self.capacity);
        buf.drain(..overflow);
        buf.extend_from_slice(bytes);
    }

    /// What is kept, lossily decoded, trimmed, on one line.
    pub fn text(&self) -> String {
        let Ok(buf) = self.buf.lock() else {
            return String::new();
        };
        String::from_utf8_lossy(&buf).trim().replace('\n', " | ")
    }
}

impl IsTerminal for StderrTail {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrTail {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrTail {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrTail {
    async fn ready(&mut self) {}
}

impl AsyncWrite for StderrTail {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_only_the_tail() {
        let t = StderrTail::new(8);
        t.push(b"hello ");
        t.push(b"world\n");
        assert_eq!(t.text(), "o world");
        t.push(b"0123456789abc");
        assert_eq!(t.text(), "56789abc");
    }
}
