//! The HTTP/1.1 server loop: accepts connections and serves the router on each, as
//! `axum::serve` did, plus what it lacks: a bound on how long a connection may wait for a
//! request's head. Without it a client that connects and sends nothing (or a keep-alive
//! connection its client forgot) is held forever, with its task, buffers and descriptor: a
//! slow-loris attack needs no bandwidth.

use std::time::Duration;

use axum::serve::{Listener, ListenerExt};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `app` on `listener` until `stop` fires, then stops accepting, lets requests in
/// flight finish (idle connections close at once) and returns when every connection is closed.
///
/// `idle`: how long a connection may go without a complete request head, counted from its
/// accept and again from the end of each response (hyper's header read timeout). A request
/// being handled, a long `?wait=true` or an event stream is never cut by it. `None`: no bound.
pub async fn serve(listener: TcpListener, app: Router, idle: Option<Duration>, stop: CancellationToken) {
    // Every route turned into a service once, here (what `into_make_service` does), rather than
    // for every request; each connection then shares the router (a clone is a reference count).
    let app: Router = app.with_state(());
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(idle);
    // TCP_NODELAY: without it a response written in two parts waits for the client's delayed
    // ACK (up to 40 ms on Linux), which was most of a waiting request's overhead.
    let mut listener = listener.tap_io(|s: &mut tokio::net::TcpStream| {
        let _ = s.set_nodelay(true);
    });
    loop {
        // axum's accept: a connection reset before it was accepted is skipped; any other error
        // (out of descriptors) is logged and waited out for a second.
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            c = listener.accept() => c,
        };
        let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
