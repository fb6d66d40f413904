//! `sandbox-controller`: the agent-sandbox Sandbox controller stand-in (see
//! the crate docs and e2e/README.md). Needs the CRD of
//! e2e/sandbox-controller/crds/agents.x-k8s.io_sandboxes.yaml (or upstream's) installed.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sandbox_controller::{DefaultRuntime, Options};
use tracing::{error, info};

/// A stand-in for the upstream agent-sandbox Sandbox controller, for
/// machines that cannot fetch it: one Pod per Sandbox
/// (agents.x-k8s.io/v1beta1) and the Sandbox status fed back from the Pod.
#[derive(Debug, Parser)]
#[command(name = "sandbox-controller", version)]
struct Cli {
    /// kubeconfig to use (default: in-cluster, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, value_name = "NS")]
    namespace: Option<String>,
    /// Also act as cocoonstack sandbox-operator's runtime mutator: Pods in
    /// sandboxd mode get the sandboxd nodeSelector and the provider
    /// toleration. Upstream agent-sandbox does not do this; off by default.
    #[arg(long)]
    runtime_mutator: bool,
    /// With --runtime-mutator: the runtime of Pods that neither carry
    /// sandbox.cocoonstack.io/runtime nor set runtimeClassName.
    #[arg(long, value_enum, default_value_t = DefaultRuntime::Standard, requires = "runtime_mutator")]
    default_runtime: DefaultRuntime,
}

async fn client(cli: &Cli) -> Result<Client, String> {
    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?
        }
        None => Config::infer().await.map_err(|e| e.to_string())?,
    };
    Client::try_from(config).map_err(|e| e.to_string())
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = term => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let client = match client(&cli).await {
        Ok(c) => c,
        Err(e) => {
            error!("no Kubernetes client: {e}");
            return ExitCode::from(2);
        }
    };
    let options = Options {
        namespace: cli.namespace.clone(),
        runtime_mutator: cli.runtime_mutator,
        default_runtime: cli.default_runtime,
    };
    tokio::select! {
        _ = sandbox_controller::run(client, options) => {
            error!("the controller stopped");
            ExitCode::FAILURE
        }
        _ = shutdown_signal() => {
            info!("signal received, stopping");
            ExitCode::SUCCESS
        }
    }
}
