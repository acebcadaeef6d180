//! Generates the etcd v3 API and Keel's peer protocol with a vendored protoc, so a fresh
//! machine needs no system protoc, and serde for the etcd API in grpc-gateway's JSON (proto
//! field names, bytes as base64, 64-bit integers as strings, enums by name, defaults
//! omitted), which the JSON gateway on `/v3/*` speaks.
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
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("descriptors.bin");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Services and methods Keel does not implement yet answer UNIMPLEMENTED.
        .generate_default_stubs(true)
        // Structure-aware fuzz inputs (feature `arbitrary`, server/tests/fuzz).
        .type_attribute(
            ".",
            "#[cfg_attr(feature = \"arbitrary\", derive(arbitrary::Arbitrary))]",
        )
        .file_descriptor_set_path(&descriptors)
        .compile_protos(&files, &include)?;
    // etcd's gateway (3.4/3.5 jsonpb OrigName, 3.6 UseProtoNames) discards unknown fields.
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptors)?)?
        .preserve_proto_field_names()
        .ignore_unknown_fields()
        .build(&[
            ".mvccpb",
            ".authpb",
            ".etcdserverpb",
            ".v3lockpb",
            ".v3electionpb",
        ])?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
