use clap::Parser;

/// vk-sandbox registers a virtual Node and turns sandbox Pods bound to it
/// into sandboxd microVM claims.
#[derive(Debug, Parser)]
#[command(name = "vk-sandbox", version = vk_sandbox::build_info::VERSION_LINE)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
}
