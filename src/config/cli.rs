//! The command line: the run command's flags by concern, the
//! subcommands, and parsing with environment defaults.

use std::ffi::OsString;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

mod flags;

pub use flags::*;

/// vk-sandbox registers a virtual Node and turns sandbox Pods bound to it
/// into sandboxd microVM claims.
///
/// Environment variables only supply defaults: an explicit flag always wins,
/// and a variable set to the empty string counts as unset. Kubernetes
/// credentials: in-cluster service account, else --kubeconfig, else
/// $KUBECONFIG, else ~/.kube/config.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "vk-sandbox",
    version = crate::build_info::VERSION_LINE,
    max_term_width = 100,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub struct Cli {
    /// `None`: run the virtual node with the flags in `run`.
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands; without one, `vk-sandbox [flags]` runs the daemon.
// Parsed once per process: the size of the preflight variant is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// Check, without changing anything, that this configuration can start:
    /// apiserver and credentials, RBAC, the NodeInventory CRD, sandboxd and
    /// its warm pools, the state path, the listen ports and the node name.
    /// Takes the same flags and environment as the run command; exits 1
    /// when any check fails.
    Preflight(RunArgs),
    /// Inspect the claims state without changing it (safe while the daemon
    /// runs): list, show, verify against sandboxd, export as a Go
    /// claims.json.
    Claims(ClaimsArgs),
}

/// `vk-sandbox claims …`.
#[derive(Debug, Clone, Args)]
pub struct ClaimsArgs {
    #[command(subcommand)]
    pub command: ClaimsCommand,
}

/// Output format of `vk-sandbox claims`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    Table,
    /// One JSON document for scripts.
    Json,
}

/// State path and output format.
#[derive(Debug, Clone, Args)]
pub struct ViewArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// What `vk-sandbox claims` does.
#[derive(Debug, Clone, Subcommand)]
pub enum ClaimsCommand {
    /// List every claim: key, sandbox id, Pod UID, claimed at, deadline,
    /// state (active, or expired once its deadline passed). Tokens are
    /// never shown unless --show-tokens.
    List {
        #[command(flatten)]
        view: ViewArgs,
        /// Show the release tokens (credentials: keep the output private).
        #[arg(long)]
        show_tokens: bool,
    },
    /// Show one claim (every field) by its key, `<namespace>/<pod name>`.
    /// Exit 1 when no claim has that key.
    Show {
        /// The claim's key, `<namespace>/<pod name>`.
        #[arg(value_name = "KEY")]
        key: String,
        #[command(flatten)]
        view: ViewArgs,
        /// Show the release token (a credential: keep the output private).
        #[arg(long)]
        show_tokens: bool,
    },
    /// Check the claims against sandboxd's listing: held and listed, held
    /// and missing (reaped at the deadline, or released by someone else),
    /// and listed under a held key but not held (a claim sandboxd made for
    /// a Pod whose credential this state lacks). Exit 0 when consistent, 1
    /// when not, 2 when the check could not run.
    Verify {
        #[command(flatten)]
        view: ViewArgs,
        #[command(flatten)]
        sandboxd: SandboxdArgs,
    },
    /// Write the state (snapshot with its journal folded in) to stdout as
    /// a Go vk-sandbox `claims.json`, tokens included, e.g. for jq or a
    /// rollback: `vk-sandbox claims export > claims.json`.
    Export {
        #[command(flatten)]
        state: StateArg,
    },
}

/// Every flag of the run command, by concern (each group has its own
/// heading in `--help`).
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub node: NodeArgs,
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    #[command(flatten)]
    pub streaming: StreamingArgs,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub sandboxd: SandboxdArgs,
    #[command(flatten)]
    pub state: StateArg,
    #[command(flatten)]
    pub lifecycle: LifecycleArgs,
    #[command(flatten)]
    pub pod_network: PodNetworkArgs,
    #[command(flatten)]
    pub audit: AuditArgs,
    #[command(flatten)]
    pub inventory: InventoryArgs,
    #[command(flatten)]
    pub fleet: FleetArgs,
    #[command(flatten)]
    pub webhook: WebhookArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// The clap command with environment defaults applied from `env`.
///
/// For each argument that names an environment variable: clap's own
/// (process-environment, empty-counts-as-set) reading is removed, a
/// non-empty value from `env` becomes the argument's default, and the
/// variable's name is appended to the help text.
pub fn command(env: &dyn Fn(&str) -> Option<String>) -> clap::Command {
    with_env(Cli::command(), env)
}

/// [`command`]'s environment defaults on `cmd` and, recursively, on its
/// subcommands (`preflight`, `claims list`, …).
fn with_env(cmd: clap::Command, env: &dyn Fn(&str) -> Option<String>) -> clap::Command {
    let subcommands: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let mut cmd = cmd.mut_args(|arg| {
        let Some(var) = arg.get_env().and_then(|v| v.to_str()).map(str::to_owned) else {
            return arg;
        };
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        let mut arg = arg
            .env(None::<&'static str>)
            .help(format!("{help} [env: {var}]"));
        if let Some(value) = env(&var).filter(|v| !v.is_empty()) {
            arg = arg.default_value(value);
        }
        arg
    });
    for name in subcommands {
        cmd = cmd.mut_subcommand(name, |c| with_env(c, env));
    }
    cmd
}

/// Parse `args` (argv, including the program name) with environment
/// defaults from `env`. Errors include `--help` and `--version`, which the
/// caller shows with `clap::Error::exit` (exit 0 for those, 2 for usage).
pub fn parse_from<I, T>(args: I, env: &dyn Fn(&str) -> Option<String>) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut matches = command(env).try_get_matches_from(args)?;
    Cli::from_arg_matches_mut(&mut matches)
}

/// [`parse_from`] on the process's argv and environment; prints help,
/// version or the usage error and exits as clap does.
pub fn parse_process_args() -> Cli {
    let env = |name: &str| std::env::var(name).ok();
    parse_from(std::env::args_os(), &env).unwrap_or_else(|e| e.exit())
}
