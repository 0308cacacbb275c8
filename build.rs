//! Compiles `proto/` into Rust with no system `protoc`: `protox` parses the
//! .proto files in pure Rust, and tonic-prost-build generates from the
//! resulting descriptor set, which is also written out for server reflection.

use std::{env, fs, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["jobq/v1/jobq.proto"], ["proto"])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    // `compile_fds` ignores `file_descriptor_set_path`, so write it ourselves.
    fs::write(out.join("jobq_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
