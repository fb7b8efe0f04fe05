//! A TCP proxy in front of Postgres that can cut every connection and refuse new ones.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

#[derive(Clone)]
pub struct ChaosProxy {
    pub port: u16,
    down: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<AbortHandle>>>,
}

impl ChaosProxy {
    pub async fn start(upstream: String) -> ChaosProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let p = ChaosProxy { port, down: Arc::default(), conns: Arc::default() };
        let me = p.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                if me.down.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let upstream = upstream.clone();
                let h = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                me.conns.lock().unwrap().push(h.abort_handle());
            }
        });
        p
    }

    /// Drop every open connection and refuse new ones until `restore`.
    pub fn cut(&self) {
        self.down.store(true, Ordering::SeqCst);
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    pub fn restore(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}
