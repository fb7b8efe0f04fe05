//! The HTTP/1.1 server loop: accepts connections and serves the router on each, as
//! `axum::serve` did, plus what it lacks:
//! - a bound on how long a connection may wait for a request's head (without it a client that
//!   connects and sends nothing is held forever, with its task, buffers and descriptor: a
//!   slow-loris attack needs no bandwidth);
//! - a cap on the connections served at once (`capacity`): one beyond it is answered 503
//!   `at_capacity` at once and closed (health probes answered as such), never left to the
//!   listener's "Too many open files" loop;
//! - a bound on how long a response may wait for a client that stopped reading
//!   (`SUBAGENTD_STREAM_STALL_SECONDS`): its connection is closed, and its stream's hold freed;
//! - request heads of at most 32 KiB (431 beyond).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::{Listener, ListenerExt};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::capacity::{Connections, OVER_CAP};

/// The largest request head: a larger one is answered 431.
pub const MAX_HEAD_BYTES: usize = 32 * 1024;

/// How the server treats its connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a connection may go without a complete request head, counted from its accept and
    /// again from the end of each response (hyper's header read timeout). A request being
    /// handled, a long `?wait=true` or an event stream is never cut by it. `None`: no bound.
    pub idle: Option<Duration>,
    /// How long a response may wait to be written before its connection is closed.
    pub stall: Duration,
    /// SO_SNDBUF of accepted sockets.
    pub send_buffer: Option<usize>,
}

/// Serves `app` on `listener` until `stop` fires, then stops accepting, lets requests in
/// flight finish (idle connections close at once) and returns when every connection is closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    conns: Arc<Connections>,
    limits: Limits,
    stop: CancellationToken,
) {
    // Every route turned into a service once, here (what `into_make_service` does), rather than
    // for every request; each connection then shares the router (a clone is a reference count).
    let app: Router = app.with_state(());
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.idle).max_buf_size(MAX_HEAD_BYTES);
    // TCP_NODELAY: without it a response written in two parts waits for the client's delayed
    // ACK (up to 40 ms on Linux), which was most of a waiting request's overhead.
    let mut listener = listener.tap_io(move |s: &mut TcpStream| {
        let _ = s.set_nodelay(true);
        if let Some(n) = limits.send_buffer {
            set_send_buffer(s, n);
        }
    });
    let over = Arc::new(tokio::sync::Semaphore::new(OVER_CAP));
    loop {
        // axum's accept: a connection reset before it was accepted is skipped; any other error
        // (out of descriptors) is logged and waited out for a second.
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            c = listener.accept() => c,
        };
        let Some(open) = conns.admit() else {
            // Over the cap: answered at once, a few at a time (beyond those, the next accept
            // waits for one of them, and new connections for the listener's backlog).
            metrics::counter!("subagentd_connections_refused_total").increment(1);
            let permit = tokio::select! {
                _ = stop.cancelled() => break,
                p = over.clone().acquire_owned() => p,
            };
            tokio::spawn(async move {
                let _permit = permit;
                at_capacity(stream).await;
            });
            continue;
        };
        let io = TokioIo::new(Stalling::new(stream, limits.stall));
        let conn = builder.serve_connection(io, TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _open = open;
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

fn set_send_buffer(s: &TcpStream, bytes: usize) {
    use std::os::fd::AsRawFd;
    let n = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt on the socket's own descriptor, with a pointer to an int of this frame.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&n as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// A connection over the cap: the health probes get their answer (`/healthz` 200, `/readyz`
/// 503), every other request 503 `at_capacity`; then it is closed. A request head that has not
/// arrived within 50 ms is not waited for.
async fn at_capacity(mut stream: TcpStream) {
    let mut head = [0u8; 256];
    let n = tokio::time::timeout(Duration::from_millis(50), tokio::io::AsyncReadExt::read(&mut stream, &mut head))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let line = &head[..n];
    let response: &[u8] =
        if line.starts_with(b"GET /healthz ") || line.starts_with(b"HEAD /healthz ") { &HEALTHY } else { &AT_CAPACITY };
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(response).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A whole response that closes its connection.
fn closing(status: &str, content_type: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

static HEALTHY: std::sync::LazyLock<Vec<u8>> =
    std::sync::LazyLock::new(|| closing("200 OK", "application/json", "", r#"{"status":"ok"}"#));

static AT_CAPACITY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
    let body = serde_json::json!({"type": "/problems/at_capacity", "code": "at_capacity", "title": "At capacity",
        "status": 503, "detail": "this replica serves as many connections as it can now; retry shortly"});
    closing("503 Service Unavailable", "application/problem+json", "retry-after: 1\r\n", &body.to_string())
});

/// A socket whose writes may not stay blocked longer than `stall`: after that the connection's
/// next write fails, and hyper closes it (a response waiting for a client that stopped
/// reading). The timer runs only while a write is blocked.
struct Stalling {
    inner: TcpStream,
    stall: Duration,
    blocked: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Stalling {
    fn new(inner: TcpStream, stall: Duration) -> Stalling {
        Stalling { inner, stall, blocked: None }
    }

    /// A write that could not go now: pending until the socket can take it, or an error once it
    /// has waited `stall`.
    fn blocked<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let stall = self.stall;
        let timer = self.blocked.get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
        if timer.as_mut().poll(cx).is_ready() {
            metrics::counter!("subagentd_stream_stalls_total").increment(1);
            tracing::debug!("closing a connection whose client stopped reading");
            return Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading")));
        }
        Poll::Pending
    }
}

impl AsyncRead for Stalling {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Stalling {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.blocked(cx),
            done => {
                self.blocked = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.blocked(cx),
            done => {
                self.blocked = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
