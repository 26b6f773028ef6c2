//! Generates the libpmix bindings (client + server API) with bindgen and links `-lpmix`.
//!
//! Any missing piece (pkg-config, libpmix headers, libclang) fails the build with one message
//! naming the Debian packages to install.

use std::env;
use std::path::PathBuf;

const INSTALL_HINT: &str = "apt-get install -y libpmix-dev libclang-dev pkg-config";

fn fail(what: &str, detail: &str) -> ! {
    let msg = format!("dvm-pmix-shim: {what}; install the build prerequisites with `{INSTALL_HINT}` ({detail})");
    println!("cargo:warning={msg}");
    panic!("{msg}");
}

fn main() {
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");

    let lib = match pkg_config::Config::new().atleast_version("4.0").probe("pmix") {
        Ok(lib) => lib,
        Err(e) => {
            let first = e.to_string().lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_owned();
            fail("libpmix (>= 4.0) not found through pkg-config", &first)
        }
    };

    // Where the client library is, for ranks told to load it (Intel MPI's I_MPI_PMI_LIBRARY).
    if let Some(dir) = lib.link_paths.first() {
        println!("cargo:rustc-env=DVM_PMIX_LIBDIR={}", dir.display());
    }

    if !clang_sys_available() {
        fail("libclang not found (bindgen needs it)", "set LIBCLANG_PATH if it is installed elsewhere");
    }

    let mut builder = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("PMIx_.*")
        .allowlist_type("pmix_.*")
        .allowlist_var("PMIX_.*")
        .derive_default(false)
        .layout_tests(false)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for dir in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate())) {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail("bindgen could not parse pmix.h/pmix_server.h", &e.to_string()),
        Err(_) => fail("bindgen failed to load libclang", "set LIBCLANG_PATH if it is installed elsewhere"),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR set by cargo")).join("pmix_bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        fail("could not write the generated bindings", &e.to_string());
    }
}

/// Looks for libclang the way clang-sys does, without panicking: LIBCLANG_PATH, then the
/// usual Debian locations.
fn clang_sys_available() -> bool {
    if let Ok(p) = env::var("LIBCLANG_PATH") {
        return std::fs::read_dir(p)
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libclang")))
            .unwrap_or(false);
    }
    let dirs = ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"];
    let in_dir = |d: &str| {
        std::fs::read_dir(d)
            .map(|it| it.flatten().any(|e| e.file_name().to_string_lossy().starts_with("libclang")))
            .unwrap_or(false)
    };
    dirs.iter().any(|d| in_dir(d))
        || std::fs::read_dir("/usr/lib")
            .map(|it| {
                it.flatten().any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("llvm-") && in_dir(&format!("/usr/lib/{n}/lib"))
                })
            })
            .unwrap_or(false)
}
