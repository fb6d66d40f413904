//! Stamps the build-time version, revision and date into the binary.
//! The Makefile passes them through the environment; plain `cargo build`
//! falls back to the package version and "unknown".
fn main() {
    for (var, fallback) in [
        ("VK_VERSION", env!("CARGO_PKG_VERSION")),
        ("VK_REVISION", "unknown"),
        ("VK_BUILT_AT", "unknown"),
    ] {
        println!("cargo:rerun-if-env-changed={var}");
        let value = std::env::var(var)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| fallback.to_string());
        println!("cargo:rustc-env={var}={value}");
    }
}
