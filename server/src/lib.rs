//! Keel member library. See `docs/` and `../shared/DESIGN.md` for the architecture.
