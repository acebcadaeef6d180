//! Keel client library (endpoint balancing, retries). Grows with the cluster issue.
