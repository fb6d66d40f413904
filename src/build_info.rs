//! Build-time identity of this binary (`--version`, in the Go program's
//! format).

/// `<VERSION> (rev=<REVISION> built=<BUILTAT>)`; clap prefixes the binary name.
pub const VERSION_LINE: &str = concat!(
    env!("VK_VERSION"),
    " (rev=",
    env!("VK_REVISION"),
    " built=",
    env!("VK_BUILT_AT"),
    ")"
);

/// The bare version, reported as the Node's kubelet version.
pub const VERSION: &str = env!("VK_VERSION");
