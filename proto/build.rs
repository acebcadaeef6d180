//! Generates the etcd v3 API and Keel's peer protocol with a vendored protoc, so a fresh
//! machine needs no system protoc.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    // SAFETY: build scripts are single-threaded; edition 2024 marks set_var unsafe.
    unsafe {
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
        std::env::set_var("PROTOC_INCLUDE", protoc_bin_vendored::include_path()?);
    }
    let mut files: Vec<std::path::PathBuf> = Vec::new();
    let include = [
        std::path::PathBuf::from("proto/etcd"),
        std::path::PathBuf::from("proto/keel"),
    ];
    for dir in &include {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "proto") {
                files.push(path);
            }
        }
    }
    files.sort();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Services and methods Keel does not implement yet answer UNIMPLEMENTED.
        .generate_default_stubs(true)
        .compile_protos(&files, &include)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
