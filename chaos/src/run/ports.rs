//! TCP port allocation for the members and proxies of a run (127.0.0.1 only).

use std::net::TcpListener;

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
/// range, otherwise ports of `range` probed from a random starting point (so two runs sharing
/// a range rarely race for the same ports).
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
            let span = u32::from(r.hi - r.lo) + 1;
            let start = rand::thread_rng().gen_range(0..span);
            for k in 0..span {
                if held.len() == n {
                    break;
                }
                let port = r.lo as u32 + (start + k) % span;
                if let Ok(l) = TcpListener::bind(("127.0.0.1", port as u16)) {
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
        }
    }
    held.iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect::<anyhow::Result<Vec<u16>>>()
}

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
}
