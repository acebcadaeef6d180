//! Chaos harness for Keel (issue: chaos monkey). Empty until that work starts.
