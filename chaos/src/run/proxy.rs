//! A TCP proxy for one ordered pair of members (i -> j): member i dials member j's advertised
//! peer URL through it (`--experimental-peer-dial-override`), so it carries every peer RPC i
//! sends to j and j's answers. The harness switches its [`LinkMode`] at run time.
//!
//! Drop is a blackhole, like a partition on a real network: open connections are closed and
//! new ones are accepted but never forwarded (the dialer sees no answer, not a refusal), until
//! the mode changes. Delay adds latency to every chunk in both directions without limiting
//! throughput (each chunk is released `delay` after it was read).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// How a link treats traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    /// Forward everything as it comes.
    Pass,
    /// Blackhole: forward nothing, close open connections.
    Drop,
    /// Forward everything, `Duration` late.
    Delay(Duration),
}

/// Bytes read per chunk.
const CHUNK: usize = 64 * 1024;

/// One running proxy; dropping it stops accepting (open connections end with the runtime).
pub struct LinkProxy {
    /// Where member `from` connects instead of member `to`'s peer listener.
    pub listen: SocketAddr,
    mode: watch::Sender<LinkMode>,
    task: tokio::task::JoinHandle<()>,
}

impl LinkProxy {
    /// Binds `listen` and forwards accepted connections to `target` in [`LinkMode::Pass`].
    ///
    /// Errors: when `listen` cannot be bound.
    pub async fn start(listen: SocketAddr, target: SocketAddr) -> std::io::Result<LinkProxy> {
        let listener = TcpListener::bind(listen).await?;
        let (mode, _) = watch::channel(LinkMode::Pass);
        let modes = mode.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                let _ = inbound.set_nodelay(true);
                tokio::spawn(serve(inbound, target, modes.subscribe()));
            }
        });
        Ok(LinkProxy { listen, mode, task })
    }

    /// Switches the mode; `Drop` also closes every open connection.
    pub fn set(&self, mode: LinkMode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> LinkMode {
        *self.mode.borrow()
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one accepted connection until either side closes or the link drops.
async fn serve(inbound: TcpStream, target: SocketAddr, mut mode: watch::Receiver<LinkMode>) {
    // Blackholed at accept: hold the connection silently until the link heals, then close it
    // (the dialer reconnects through a healthy link).
    if *mode.borrow_and_update() == LinkMode::Drop {
        let _ = mode.wait_for(|m| *m != LinkMode::Drop).await;
        return;
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    let (in_r, in_w) = inbound.into_split();
    let (out_r, out_w) = outbound.into_split();
    let forward = pump(in_r, out_w, mode.clone());
    let backward = pump(out_r, in_w, mode.clone());
    tokio::select! {
        _ = forward => {}
        _ = backward => {}
        _ = mode.wait_for(|m| *m == LinkMode::Drop) => {}
    }
}

/// Copies one direction, each chunk released after the link's current delay.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mode: watch::Receiver<LinkMode>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let delay = match *mode.borrow() {
                LinkMode::Delay(d) => d,
                _ => Duration::ZERO,
            };
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    // The writer drains what the reader queued before it ended.
    let _ = tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::ports::{PortRange, free_ports};

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr, within: Duration) -> Option<Duration> {
        let started = Instant::now();
        let attempt = async {
            let mut s = TcpStream::connect(addr).await.ok()?;
            s.write_all(b"ping").await.ok()?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).await.ok()?;
            (&buf == b"ping").then_some(())
        };
        match tokio::time::timeout(within, attempt).await {
            Ok(Some(())) => Some(started.elapsed()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn passes_drops_and_delays() {
        let target = echo_server().await;
        let range = PortRange {
            lo: 26000,
            hi: 27999,
        };
        let port = free_ports(1, Some(range)).unwrap()[0];
        let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let proxy = LinkProxy::start(listen, target).await.unwrap();
        let second = Duration::from_secs(1);

        assert!(round_trip(listen, second).await.is_some(), "pass forwards");

        proxy.set(LinkMode::Drop);
        assert_eq!(
            round_trip(listen, Duration::from_millis(300)).await,
            None,
            "drop blackholes"
        );

        proxy.set(LinkMode::Delay(Duration::from_millis(150)));
        let took = round_trip(listen, second)
            .await
            .expect("delay still forwards");
        // Both directions are delayed.
        assert!(took >= Duration::from_millis(300), "took {took:?}");

        proxy.set(LinkMode::Pass);
        assert!(round_trip(listen, second).await.is_some(), "healed");
    }

    #[tokio::test]
    async fn drop_closes_open_connections() {
        let target = echo_server().await;
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let listener = std::net::TcpListener::bind(listen).unwrap();
        let listen = listener.local_addr().unwrap();
        drop(listener);
        let proxy = LinkProxy::start(listen, target).await.unwrap();
        let mut s = TcpStream::connect(listen).await.unwrap();
        s.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.unwrap();
        proxy.set(LinkMode::Drop);
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "the open connection was closed by the drop");
        assert!(rest.is_empty());
    }
}
