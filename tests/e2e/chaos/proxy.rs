//! The fault suite's TCP proxy between one server and PostgreSQL: it
//! forwards both ways, and on a fault adds latency to every chunk it
//! forwards, or black-holes the traffic (the kernel takes the bytes, the
//! proxy forwards none, closes nothing, and holds new connections alike)
//! until it heals, when what it held goes through in order.

#[allow(unused_imports)]
use super::*;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    Forward,
    /// Each chunk waits this long before it is forwarded, each way.
    Delay(Duration),
    BlackHole,
}

pub(super) struct Proxy {
    pub(super) port: u16,
    mode: watch::Sender<Mode>,
    stop: CancellationToken,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to `upstream` (a port of
    /// 127.0.0.1).
    pub(super) async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (mode, watching) = watch::channel(Mode::Forward);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((down, _)) = accepted else { continue };
                let watching = watching.clone();
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let session = async {
                        // A black hole holds the connection too.
                        passable(&mut watching.clone()).await;
                        let Ok(up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                            return;
                        };
                        let (down_r, down_w) = down.into_split();
                        let (up_r, up_w) = up.into_split();
                        tokio::join!(
                            pump(down_r, up_w, watching.clone()),
                            pump(up_r, down_w, watching.clone())
                        );
                    };
                    tokio::select! {
                        () = stopped.cancelled() => {}
                        () = session => {}
                    }
                });
            }
        });
        Proxy { port, mode, stop }
    }

    pub(super) fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Waits while the proxy black-holes; the mode to forward under.
async fn passable(mode: &mut watch::Receiver<Mode>) -> Mode {
    match mode.wait_for(|m| *m != Mode::BlackHole).await {
        Ok(m) => *m,
        Err(_) => Mode::Forward,
    }
}

/// One direction: each chunk read is held through a black hole, delayed
/// by the mode's latency, then written; the end of the stream likewise.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if let Mode::Delay(d) = passable(&mut mode).await {
            tokio::time::sleep(d).await;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
