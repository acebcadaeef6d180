//! Free TCP ports on 127.0.0.1 for test members (the harnesses bind loopback only).

use std::net::TcpListener;

/// Returns `n` distinct ports that were free a moment ago.
///
/// The kernel picks them (bind to port 0); all listeners are held until every port is chosen so
/// the same port is never returned twice. Another process may still take a port before `keel`
/// binds it; that race is rare enough on a test box and shows up as a clear bind error in the
/// member's log.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0 to find a free port"))
        .collect();
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .expect("local_addr of a bound listener")
                .port()
        })
        .collect()
}

/// One port that was free a moment ago (see [`free_ports`]), e.g. an address nothing listens on.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}
