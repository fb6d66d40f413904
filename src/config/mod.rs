//! Command line and environment (docs/configuration.md).
//!
//! Two steps, both before anything touches the cluster:
//!
//! 1. [`parse_from`] turns argv plus an environment lookup into [`Cli`].
//!    An environment variable only supplies a flag's *default*: an explicit
//!    flag always wins, and a variable set to the empty string counts as
//!    unset. clap's own `env` support treats an empty variable as set, so the
//!    `env = "…"` attributes below only *name* the variable; [`parse_from`]
//!    strips clap's reading and feeds non-empty values in as defaults.
//! 2. [`Config::from_args`] validates every value into a typed [`Config`]:
//!    quantities, listen addresses, intervals, the sandboxd URL, labels, the
//!    token file (read once, trimmed), and the state directory (created 0700
//!    if missing, then proved writable). Every problem found is reported at
//!    once, each naming the flag, its environment variable, the value and the
//!    fix.
//!
//! The flags live in [`RunArgs`], one group per concern (node, kubelet API,
//! Kubernetes client, sandboxd, claims state, orphan audit, NodeInventory,
//! admin), flattened into the top-level command (no subcommand = run).
//!
//! - [`cli`]: the flags and their parsing;
//! - [`values`]: pure parsers of the Go-compatible values (listen
//!   addresses, quantities, durations, labels);
//! - [`settings`]: the validated, typed configuration;
//! - `validate`: from flags to settings, every problem reported at once.
//!
//! `vk-sandbox preflight [flags]` ([`Command::Preflight`]) takes the same
//! flags and environment and checks them against the world instead of
//! running (see [`crate::preflight`]).
//!
//! `KUBECONFIG` is deliberately not a clap env var: credentials come from
//! kube's default order (in-cluster, then `--kubeconfig`, then
//! `$KUBECONFIG`, then `~/.kube/config`).

pub mod cli;
pub mod defaults;
pub mod settings;
mod validate;
pub mod values;

#[cfg(test)]
mod tests;

pub use cli::{
    AdminArgs, AuditArgs, ClaimsArgs, ClaimsCommand, Cli, Command, FleetArgs, InventoryArgs,
    KubeArgs, KubeletArgs, LifecycleArgs, LogFormat, NodeArgs, Output, RunArgs, SandboxdArgs,
    StateArg, StreamingArgs, ViewArgs, WebhookArgs, command, parse_from, parse_process_args,
};
pub use settings::{
    Capacity, Config, FleetConfig, InventoryConfig, KubeClientConfig, KubeletAuthConfig,
    KubeletSettings, LifecycleConfig, SandboxdConfig, StreamingConfig, TlsFiles, WebhookConfig,
};
pub use values::{
    ListenAddr, advertise_default, parse_go_duration, parse_node_labels, validate_quantity,
};
