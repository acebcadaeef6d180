//! TCP port allocation for the members and proxies of a run (127.0.0.1 only).
//!
//! A port is probed by binding it, then released for the member or proxy to bind, so another
//! process may take it in between (accepted: the ranges are picked apart). Within one process,
//! though, clusters are often started at once (the tests of one binary run in parallel), so a
//! port of a range is handed out once per process: a second cluster never gets a port the
//! first was given and has not bound yet (a `leadership` test failed on that, "Address already
//! in use", twenty-first sitting).

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::sync::{Mutex, PoisonError};

use rand::Rng;

/// An inclusive port range `LO-HI` the run must stay in (`--port-range`), e.g. `26000-27999`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
}

impl std::str::FromStr for PortRange {
    type Err = String;

    /// Parses `LO-HI` with `0 < LO <= HI`.
    fn from_str(s: &str) -> Result<PortRange, String> {
        let (lo, hi) = s
            .split_once('-')
            .ok_or_else(|| format!("port range {s:?} is not LO-HI"))?;
        let lo: u16 = lo.trim().parse().map_err(|e| format!("port {lo:?}: {e}"))?;
        let hi: u16 = hi.trim().parse().map_err(|e| format!("port {hi:?}: {e}"))?;
        if lo == 0 || lo > hi {
            return Err(format!("port range {s:?} must have 0 < LO <= HI"));
        }
        Ok(PortRange { lo, hi })
    }
}

/// Finds `n` distinct ports that are free on 127.0.0.1 right now: OS-assigned ones without a
/// range, otherwise ports of `range` this process has not handed out before, probed from a
/// random starting point (so two runs sharing a range rarely race for the same ports).
///
/// Errors: when the range has fewer than `n` free ports, or binding fails.
pub fn free_ports(n: usize, range: Option<PortRange>) -> anyhow::Result<Vec<u16>> {
    let mut held = Vec::with_capacity(n);
    match range {
        None => {
            for _ in 0..n {
                held.push(TcpListener::bind("127.0.0.1:0")?);
            }
        }
        Some(r) => {
            let mut given = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
            let span = u32::from(r.hi - r.lo) + 1;
            let start = rand::thread_rng().gen_range(0..span);
            for k in 0..span {
                if held.len() == n {
                    break;
                }
                let port = (r.lo as u32 + (start + k) % span) as u16;
                if given.contains(&port) {
                    continue;
                }
                if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                    held.push(l);
                }
            }
            if held.len() < n {
                anyhow::bail!(
                    "only {} free ports in {}-{}, need {n}",
                    held.len(),
                    r.lo,
                    r.hi
                );
            }
            for l in &held {
                given.insert(l.local_addr()?.port());
            }
        }
    }
    held.iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<anyhow::Result<Vec<u16>>>()
}

/// Ports of a range this process handed out (module docs).
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ranges() {
        assert_eq!(
            "26000-27999".parse::<PortRange>(),
            Ok(PortRange {
                lo: 26000,
                hi: 27999
            })
        );
        assert!("27999-26000".parse::<PortRange>().is_err());
        assert!("0-10".parse::<PortRange>().is_err());
        assert!("26000".parse::<PortRange>().is_err());
    }

    #[test]
    fn allocates_distinct_ports_in_the_range() {
        let range = PortRange {
            lo: 26000,
            hi: 27999,
        };
        let ports = free_ports(6, Some(range)).unwrap();
        assert_eq!(ports.len(), 6);
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 6, "{ports:?}");
        assert!(
            ports.iter().all(|p| (26000..=27999).contains(p)),
            "{ports:?}"
        );
    }

    #[test]
    fn a_port_of_a_range_is_handed_out_once_per_process() {
        let range = PortRange {
            lo: 28000,
            hi: 28009,
        };
        let first = free_ports(3, Some(range)).unwrap();
        // Released, so free on the machine, yet not handed out again.
        let second = free_ports(3, Some(range)).unwrap();
        assert!(
            second.iter().all(|p| !first.contains(p)),
            "{first:?} {second:?}"
        );
        // At most 4 of the 10 are left to this process, whatever else is busy.
        let err = free_ports(5, Some(range)).unwrap_err().to_string();
        assert!(err.contains("free ports in 28000-28009, need 5"), "{err}");
    }
}
