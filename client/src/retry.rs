//! When a failed call is repeated: bounded in attempts and time, and never for a write that
//! may have been applied.

use std::time::Duration;

use crate::error::ClientError;

/// Retry bounds of the typed calls of [`crate::Client`]. Attempt `k` (0-based) goes to the
/// member after the one of attempt `k - 1`, so a dead or leaderless member is skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most attempts of one call, including the first (1 = no retry).
    pub max_attempts: u32,
    /// No retry starts later than this after the first attempt started.
    pub max_elapsed: Duration,
    /// Pause before the first retry; doubles for each further retry (leader elections take
    /// about one election timeout, 1 s by default in etcd and Keel).
    pub backoff: Duration,
    /// Upper bound of the pause between attempts.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            max_elapsed: Duration::from_secs(15),
            backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Try again (on the next member) after this pause.
    RetryAfter(Duration),
    /// Return the error to the caller.
    GiveUp,
}

impl RetryPolicy {
    /// No retries: every error reaches the caller (benchmarks count errors this way).
    pub fn none() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        }
    }

    /// Decides after attempt number `attempt` (0-based) failed with `error`, `elapsed`
    /// after the first attempt started. `idempotent` requests (reads) are retried on any
    /// transient error; other requests (writes) only on transient errors that prove the
    /// request was not applied ([`ClientError::may_have_applied`] is false), since a
    /// repeated txn or lease grant could otherwise take effect twice.
    pub fn decide(
        &self,
        attempt: u32,
        elapsed: Duration,
        idempotent: bool,
        error: &ClientError,
    ) -> Decision {
        let safe = idempotent || !error.may_have_applied();
        if !safe || !error.is_transient() || attempt + 1 >= self.max_attempts {
            return Decision::GiveUp;
        }
        let pause = self
            .backoff
            .saturating_mul(1u32 << attempt.min(16))
            .min(self.max_backoff);
        if elapsed + pause > self.max_elapsed {
            return Decision::GiveUp;
        }
        Decision::RetryAfter(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    fn etcd(code: Code, message: &str) -> ClientError {
        ClientError::from_status(&tonic::Status::new(code, message), "m")
    }

    fn not_sent() -> ClientError {
        ClientError::NotSent {
            endpoint: "m".into(),
            message: "refused".into(),
        }
    }

    #[test]
    fn reads_retry_on_transient_errors_with_growing_pauses() {
        let p = RetryPolicy::default();
        let no_leader = etcd(Code::Unavailable, "etcdserver: no leader");
        assert_eq!(
            p.decide(0, Duration::ZERO, true, &no_leader),
            Decision::RetryAfter(Duration::from_millis(50))
        );
        assert_eq!(
            p.decide(2, Duration::ZERO, true, &no_leader),
            Decision::RetryAfter(Duration::from_millis(200))
        );
        assert_eq!(
            p.decide(4, Duration::ZERO, true, &no_leader),
            Decision::GiveUp,
            "the fifth attempt is the last"
        );
        let lost = ClientError::ConnectionLost {
            message: "reset".into(),
        };
        assert!(matches!(
            p.decide(0, Duration::ZERO, true, &lost),
            Decision::RetryAfter(_)
        ));
    }

    #[test]
    fn writes_retry_only_when_not_applied() {
        let p = RetryPolicy::default();
        for maybe in [
            etcd(Code::Unavailable, "etcdserver: no leader"),
            etcd(Code::Unavailable, "etcdserver: request timed out"),
            etcd(Code::Unavailable, "etcdserver: leader changed"),
            ClientError::DeadlineExceeded {
                message: "t".into(),
            },
            ClientError::ConnectionLost {
                message: "reset".into(),
            },
        ] {
            assert_eq!(
                p.decide(0, Duration::ZERO, false, &maybe),
                Decision::GiveUp,
                "{maybe:?}"
            );
        }
        assert!(matches!(
            p.decide(0, Duration::ZERO, false, &not_sent()),
            Decision::RetryAfter(_)
        ));
        assert!(matches!(
            p.decide(
                0,
                Duration::ZERO,
                false,
                &etcd(
                    Code::Unavailable,
                    "etcdserver: rpc not supported for learner"
                )
            ),
            Decision::RetryAfter(_)
        ));
    }

    #[test]
    fn request_errors_are_never_retried() {
        let p = RetryPolicy::default();
        let bad = etcd(Code::InvalidArgument, "etcdserver: key is not provided");
        assert_eq!(p.decide(0, Duration::ZERO, true, &bad), Decision::GiveUp);
        let compacted = etcd(
            Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
        );
        assert_eq!(
            p.decide(0, Duration::ZERO, true, &compacted),
            Decision::GiveUp
        );
    }

    #[test]
    fn time_and_attempt_bounds_hold() {
        let p = RetryPolicy {
            max_elapsed: Duration::from_millis(100),
            ..RetryPolicy::default()
        };
        assert_eq!(
            p.decide(0, Duration::from_millis(60), true, &not_sent()),
            Decision::GiveUp,
            "60 ms + 50 ms pause passes the 100 ms budget"
        );
        assert_eq!(
            RetryPolicy::none().decide(0, Duration::ZERO, true, &not_sent()),
            Decision::GiveUp
        );
        let capped = RetryPolicy {
            max_attempts: 40,
            max_elapsed: Duration::from_secs(3600),
            ..RetryPolicy::default()
        };
        assert_eq!(
            capped.decide(30, Duration::ZERO, true, &not_sent()),
            Decision::RetryAfter(Duration::from_secs(1))
        );
    }
}
