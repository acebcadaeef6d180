//! Where the `keel` binary under test is (and `keelutl`, found the same way).
//!
//! Order: `$KEEL_BIN` (any binary with etcd's flags: a release build, or a real etcd to check a
//! test's own expectations), then the path cargo gave the caller (`CARGO_BIN_EXE_keel`, which
//! cargo sets only while compiling keel-server's own integration tests, so the caller passes
//! it in; [`keel_binary!`](crate::keel_binary) does that), then `keel` in the cargo profile
//! directory of the running executable (`target/<profile>/keel`).

use std::path::{Path, PathBuf};

/// The environment variable that overrides the `keel` binary.
pub const KEEL_BIN_ENV: &str = "KEEL_BIN";

/// The `keel` binary to run (see the module docs for the order). `cargo_bin` is the caller's
/// `CARGO_BIN_EXE_keel`, if cargo set it.
///
/// Panics, naming the build command, if the binary found last does not exist.
pub fn find_keel(cargo_bin: Option<&str>) -> PathBuf {
    find_binary("keel", KEEL_BIN_ENV, cargo_bin)
}

/// The environment variable that overrides the `keelutl` binary.
pub const KEELUTL_BIN_ENV: &str = "KEELUTL_BIN";

/// The `keelutl` binary (offline tools), found as [`find_keel`] finds `keel`:
/// `$KEELUTL_BIN`, then `cargo_bin` (the caller's `CARGO_BIN_EXE_keelutl`), then
/// `target/<profile>/keelutl`.
///
/// Panics, naming the build command, if the binary found last does not exist.
pub fn find_keelutl(cargo_bin: Option<&str>) -> PathBuf {
    find_binary("keelutl", KEELUTL_BIN_ENV, cargo_bin)
}

/// keel-server's binary `name`: `$<env>`, then `cargo_bin`, then `name` in the cargo profile
/// directory of the running executable (which must exist).
fn find_binary(name: &str, env: &str, cargo_bin: Option<&str>) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    if let Some(path) = cargo_bin {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("path of the running executable");
    let path = profile_dir(&exe).join(name);
    assert!(
        path.is_file(),
        "{} not found: build it first (`cargo build -p keel-server --bin {name}`, same \
         profile; `cargo test --workspace` builds it), or set {env}",
        path.display()
    );
    path
}

/// The cargo profile directory (`target/<profile>`) of an executable cargo built: its own
/// directory for binaries, the parent of `deps/` for test executables.
pub fn profile_dir(exe: &Path) -> PathBuf {
    let dir = exe.parent().expect("an executable lives in a directory");
    match dir.file_name() {
        Some(name) if name == "deps" || name == "examples" => {
            dir.parent().expect("deps/ has a parent").to_path_buf()
        }
        _ => dir.to_path_buf(),
    }
}

/// [`find_keelutl`] with the calling crate's `CARGO_BIN_EXE_keelutl`.
#[macro_export]
macro_rules! keelutl_binary {
    () => {
        $crate::binary::find_keelutl(option_env!("CARGO_BIN_EXE_keelutl"))
    };
}

/// [`find_keel`] with the calling crate's `CARGO_BIN_EXE_keel` (set only in keel-server's
/// integration tests; elsewhere `None`, so the profile directory is used).
#[macro_export]
macro_rules! keel_binary {
    () => {
        $crate::binary::find_keel(option_env!("CARGO_BIN_EXE_keel"))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_dir_of_tests_binaries_and_examples() {
        assert_eq!(
            profile_dir(Path::new("/t/debug/deps/e2e-123")),
            Path::new("/t/debug")
        );
        assert_eq!(
            profile_dir(Path::new("/t/release/lease-bench")),
            Path::new("/t/release")
        );
        assert_eq!(
            profile_dir(Path::new("/t/debug/examples/x")),
            Path::new("/t/debug")
        );
    }
}
