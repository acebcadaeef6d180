//! Free TCP ports on 127.0.0.1 for test members (the harnesses bind loopback only).
//!
//! A member keeps its ports across restarts, so a port must stay its own while the member is
//! down. Two things could take it meanwhile, and both are ruled out:
//! - another test of the same binary choosing ports: every port is handed out once per
//!   process ([`HANDED_OUT`]);
//! - an outgoing connection (any test's client) picking it as its source port: ports come
//!   from below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768–60999 by
//!   default), which the kernel never picks for a connection. bind(0) picked ports inside
//!   that range, and a restarted member could find its port taken by a client.
//!
//! Another process may still bind a port between the check and the member's bind; that shows
//! up as a clear bind error in the member's log.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lowest port handed out (above the well-known and most registered service ports).
const LOWEST: u16 = 10_000;
/// The kernel's default lowest ephemeral port, used if `/proc` cannot be read.
const DEFAULT_EPHEMERAL_LOW: u16 = 32_768;
/// Fewer ports than this below the ephemeral range: let the kernel pick ([`kernel_picked`]).
const MIN_SPAN: u16 = 1_000;

/// Ports handed out by this process so far.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// Returns `n` distinct ports that were free a moment ago and that this process never handed
/// out before, from below the ephemeral range (module docs).
///
/// Panics if fewer than `n` such ports are left (the range holds about 22,000).
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut handed = HANDED_OUT.lock().expect("port registry lock");
    let handed = handed.get_or_insert_with(HashSet::new);
    let (low, high) = (LOWEST, ephemeral_low());
    if high < low + MIN_SPAN {
        return kernel_picked(n, handed);
    }
    let span = u32::from(high - low);
    // A different start per process, so consecutive test binaries do not retry the same ports.
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0)
        ^ std::process::id().wrapping_mul(2_654_435_761);
    let start = seed % span;
    let mut held: Vec<TcpListener> = Vec::with_capacity(n);
    for step in 0..span {
        if held.len() == n {
            break;
        }
        let port = low + ((start + step) % span) as u16;
        if handed.contains(&port) {
            continue;
        }
        // Held until every port is chosen, so none is returned twice.
        if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(listener);
        }
    }
    assert_eq!(held.len(), n, "no {n} free ports left in {low}..{high}");
    let ports: Vec<u16> = held
        .iter()
        .map(|l| {
            l.local_addr()
                .expect("local_addr of a bound listener")
                .port()
        })
        .collect();
    handed.extend(&ports);
    ports
}

/// [`free_ports`] on a box whose ephemeral range leaves too few ports below it: the kernel
/// picks them (bind to port 0), still never one this process handed out before.
fn kernel_picked(n: usize, handed: &mut HashSet<u16>) -> Vec<u16> {
    let mut held = Vec::with_capacity(n);
    let mut ports = Vec::with_capacity(n);
    while ports.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if handed.insert(port) {
            ports.push(port);
        }
        held.push(listener);
    }
    ports
}

/// One port that was free a moment ago (see [`free_ports`]), e.g. an address nothing listens on.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// The lowest port the kernel picks for outgoing connections.
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(DEFAULT_EPHEMERAL_LOW)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_never_handed_out_twice() {
        let first = free_ports(3);
        let second = free_ports(3);
        let all: HashSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 6, "{first:?} {second:?}");
        for p in all {
            if ephemeral_low() >= LOWEST + MIN_SPAN {
                assert!((LOWEST..ephemeral_low()).contains(&p), "{p}");
            }
        }
        // Not checked: that each port can be bound again now. Another test binary running
        // at the same time may have taken one since (the race the module docs accept), and
        // this check failed on that once.
    }
}
