//! Compiles the .proto files with protox (pure Rust, no protoc needed on the machine).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/rml.proto",
        "proto/grpcomm.proto",
        "proto/control.proto",
        "proto/daemon.proto",
        "proto/job.proto",
        "proto/pmixworker.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_build::configure().bytes(["."]).build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
