//! vk-sandbox: parse and validate flags, then run the virtual node until
//! SIGTERM/SIGINT. Start-up order follows behaviour.md §1.3: configuration
//! (nothing touches the cluster before it is valid), credentials, kubelet
//! API bound, Pod watch synced, then the Node registered, its Lease and
//! status heartbeats started, and the Node marked Ready.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{error, info};
use vk_sandbox::admin::{self, Health};
use vk_sandbox::config::{self, Config};
use vk_sandbox::kubelet::KubeletApi;
use vk_sandbox::metrics::Metrics;
use vk_sandbox::node::{self, NodeSettings};
use vk_sandbox::pods::cache::{self, CachedPods};
use vk_sandbox::{Error, Result, kube_client, telemetry};

fn main() -> ExitCode {
    let cli = config::parse_process_args();
    telemetry::init(cli.run.log_format);
    // One TLS crypto provider for kube, reqwest and the servers (D1).
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        error!("a rustls crypto provider was already installed");
        return ExitCode::from(1);
    }
    let cfg = match Config::from_args(&cli.run) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            eprintln!("vk-sandbox: {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vk-sandbox: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cfg)) {
        Ok(()) => {
            info!("vk-sandbox exiting");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %e, "vk-sandbox failed");
            eprintln!("vk-sandbox: {e}");
            ExitCode::from(1)
        }
    }
}

fn node_settings(cfg: &Config) -> NodeSettings {
    NodeSettings {
        name: cfg.node_name.clone(),
        ip: cfg.node_ip.clone(),
        kubelet_port: cfg.listen_addr.port,
        cpu: cfg.capacity.cpu.0.clone(),
        memory: cfg.capacity.memory.0.clone(),
        pods: cfg.capacity.pods.0.clone(),
        extra_labels: cfg.node_labels.clone(),
    }
}

/// Resolves on the first SIGTERM or SIGINT.
async fn shutdown_signal() -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| Error::io("install the SIGTERM handler", e))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| Error::io("install the SIGINT handler", e))?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM received; shutting down"),
        _ = int.recv() => info!("SIGINT received; shutting down"),
    }
    Ok(())
}

async fn run(cfg: Config) -> Result<()> {
    let signal = shutdown_signal();
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };

    let metrics = Metrics::new()?;
    let health = Health::new();
    let (client, source) = kube_client::client(cfg.kube.kubeconfig.clone()).await?;
    info!(?source, node = %cfg.node_name, "Kubernetes credentials loaded");

    // Pod watch first: the kubelet API serves from it and readiness waits
    // for it.
    let (store, drive_watch) = cache::start(client.clone(), &cfg.node_name);
    let pods = Arc::new(CachedPods {
        store: store.clone(),
        running: Arc::new(Vec::new),
    });
    let kubelet = KubeletApi::prepare(&cfg, &client, pods, Arc::clone(&metrics)).await?;
    let admin_listener = cfg.admin_addr.bind().await.map_err(|e| {
        Error::io(
            format!(
                "bind the admin port --admin-addr (env VK_ADMIN_ADDR)={}; free the port or \
                 choose another",
                cfg.admin_addr
            ),
            e,
        )
    })?;
    let admin_router = admin::router(Arc::clone(&health), Arc::clone(&metrics));

    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn({
        let stop = stopped(stop_rx.clone());
        async move {
            tokio::select! {
                _ = drive_watch => {}
                _ = stop => {}
            }
            Ok(())
        }
    });
    tasks.spawn(kubelet.run(stopped(stop_rx.clone())));
    tasks.spawn(admin::serve(
        admin_listener,
        admin_router,
        stopped(stop_rx.clone()),
    ));

    // Wait for the initial Pod list before registering, so a Ready node
    // always knows its Pods; a signal meanwhile still shuts down cleanly.
    let settings = node_settings(&cfg);
    let (ready_tx, ready_rx) = watch::channel(false);
    tokio::pin!(signal);
    let registered = tokio::select! {
        r = async {
            store
                .wait_until_ready()
                .await
                .map_err(|e| Error::Config(format!("pod watch ended before syncing: {e}")))?;
            health.set_pod_watch_synced(true);
            node::register::register(&client, &settings).await
        } => Some(r?),
        r = &mut signal => { r?; None }
    };

    if let Some(node_obj) = registered {
        let node_uid = node_obj.metadata.uid.clone().unwrap_or_default();
        let lease_metrics = Arc::clone(&metrics);
        let lease_health = Arc::clone(&health);
        tasks.spawn({
            let fut = node::lease::run(
                client.clone(),
                cfg.node_name.clone(),
                node_uid,
                stop_rx.clone(),
                move |r: &Result<()>| {
                    lease_metrics.lease_renewed(r.is_ok());
                    lease_health.set_lease_ok(r.is_ok());
                },
            );
            async move {
                fut.await;
                Ok(())
            }
        });
        tasks.spawn({
            let fut = node::register::run_status_loop(
                client.clone(),
                settings,
                node_obj,
                ready_rx,
                cfg.node_status_interval,
                stop_rx.clone(),
                |_r: &Result<()>| {},
            );
            async move {
                fut.await;
                Ok(())
            }
        });
        // The Pod watch has synced (above): the node is ready.
        let _ = ready_tx.send(true);
        info!(node = %cfg.node_name, "virtual node ready");

        // Run until a signal, or until a task fails.
        tokio::select! {
            r = &mut signal => r?,
            Some(done) = tasks.join_next() => {
                let _ = stop_tx.send(true);
                return match done {
                    Ok(Ok(())) => Err(Error::Config("a background task ended unexpectedly".into())),
                    Ok(Err(e)) => Err(e),
                    Err(e) => Err(Error::Config(format!("a background task panicked: {e}"))),
                };
            }
        }
    }

    // Shutdown never evicts, releases or deletes: stop the loops, exit 0.
    let _ = stop_tx.send(true);
    let drain = async {
        while let Some(r) = tasks.join_next().await {
            if let Ok(Err(e)) = r {
                error!(error = %e, "task failed during shutdown");
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        info!("some tasks did not stop within 5 s; exiting anyway");
    }
    Ok(())
}
