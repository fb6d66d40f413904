//! vk-sandbox: parse and validate flags, then run the virtual node until
//! SIGTERM/SIGINT. Start-up order (docs/architecture.md#start-up): configuration
//! (nothing touches the cluster before it is valid), credentials, kubelet
//! API bound, Pod watch synced, then the Node registered, its Lease and
//! status heartbeats started, and the Node marked Ready.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};
use vk_sandbox::admin::{self, Health};
use vk_sandbox::claims::ClaimsStore;
use vk_sandbox::claims::state_lock::StateLock;
use vk_sandbox::config::{self, Config};
use vk_sandbox::inventory::Publisher;
use vk_sandbox::kubelet::KubeletApi;
use vk_sandbox::kubelet::PodSource;
use vk_sandbox::metrics::{Metrics, SampledGauge};
use vk_sandbox::node::{self, NodeSettings};
use vk_sandbox::pods::context::Context;
use vk_sandbox::pods::controller;
use vk_sandbox::pods::provider::Provider;
use vk_sandbox::runtime::Threads;
use vk_sandbox::sandboxd::SandboxdClient;
use vk_sandbox::{Error, Result, kube_client, orphan, telemetry};

/// `--features mimalloc`: mimalloc instead of the C library's allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = config::parse_process_args();
    if let Some(config::Command::Preflight(args)) = &cli.command {
        return vk_sandbox::preflight::main(args);
    }
    if let Some(config::Command::Claims(args)) = &cli.command {
        return vk_sandbox::claims_cli::main(args);
    }
    telemetry::init(cli.run.admin.log_format);
    let cfg = match Config::from_args(&cli.run) {
        Ok(c) => c,
        Err(e) => {
            error!("{e}");
            plain_error(cli.run.admin.log_format, &e);
            return ExitCode::from(1);
        }
    };
    // The runtime installs the one TLS crypto provider kube, reqwest and
    // the servers share.
    let runtime = match vk_sandbox::runtime::build(Threads::Multi) {
        Ok(r) => r,
        Err(e) => {
            error!("{e}");
            plain_error(cli.run.admin.log_format, &e);
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
            plain_error(cli.run.admin.log_format, &e);
            ExitCode::from(1)
        }
    }
}

/// The fatal error once more as a plain line, for people reading a
/// terminal or journal; JSON logs stay one object per line (the error is in
/// the last one).
fn plain_error(format: config::LogFormat, e: &Error) {
    if format == config::LogFormat::Text {
        eprintln!("vk-sandbox: {e}");
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

/// Resolves on the first SIGTERM or SIGINT; a second one ends the process
/// at once (exit 130), for an operator whose shutdown seems stuck.
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
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        error!("second signal received; exiting without waiting for shutdown");
        std::process::exit(130);
    });
    Ok(())
}

/// The tasks `run` supervises: each ends only on shutdown, or with the error
/// that stops the process.
type Tasks = tokio::task::JoinSet<Result<()>>;

/// Spawns a loop that retries its own failures and ends only when told to
/// stop; ending is reported like any task's.
fn spawn_loop(tasks: &mut Tasks, fut: impl std::future::Future<Output = ()> + Send + 'static) {
    tasks.spawn(async move {
        fut.await;
        Ok(())
    });
}

/// A background task's outcome as `main` reports it.
fn task_ended(done: std::result::Result<Result<()>, tokio::task::JoinError>) -> Error {
    match done {
        Ok(Ok(())) => Error::Internal("a background task ended unexpectedly".into()),
        Ok(Err(e)) => e,
        Err(e) => Error::Internal(format!("a background task panicked: {e}")),
    }
}

/// Says at start-up what running without a sandboxd token means (a
/// tenant token is named when sandboxd first refuses it; see
/// `Provider::list`).
fn warn_open_mode(sandboxd: &SandboxdClient) {
    if !sandboxd.has_token() {
        warn!(
            "no sandboxd token (--sandboxd-token-file unset): sandboxd must run in open mode; \
             sandboxes cannot be released by id, so a lost claim reply is left to its deadline \
             and a claim recovered without its credential cannot be released"
        );
    }
}

async fn run(cfg: Config) -> Result<()> {
    let signal = shutdown_signal();
    let stop = CancellationToken::new();

    let metrics = Metrics::new()?;
    let health = Health::new();
    // One process per state path, before anything reads or writes it.
    let _state_lock = StateLock::acquire(&cfg.state_path)?;
    // The claims store loads and is written once before the Node exists (an
    // unwritable state path keeps the node out of scheduling); its writer
    // thread does that while the Kubernetes credentials load.
    let (client, claims) = tokio::join!(
        kube_client::client(&cfg.kube),
        ClaimsStore::open(&cfg.state_path)
    );
    let (client, source) = client?;
    info!(?source, node = %cfg.node_name, "Kubernetes credentials loaded");
    // Whether the Node exists, read while the Pod watch lists (off the
    // start-up's critical path; registration decides its writes from it
    // only where that is safe, see `node::register::register`).
    let seen_node = {
        let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
        let name = cfg.node_name.clone();
        tokio::spawn(async move { nodes.get_opt(&name).await })
    };
    let claims = Arc::new(claims?);

    let sandboxd = SandboxdClient::builder(cfg.sandboxd.url.clone())
        .token(cfg.sandboxd.token.as_ref().map(|t| t.expose().to_string()))
        .observer(Arc::clone(&metrics) as Arc<dyn vk_sandbox::sandboxd::Observer>)
        .build()?;
    {
        let m = Arc::clone(&metrics);
        claims.on_write(move |elapsed, ok| {
            m.claims_store_wrote(elapsed, ok);
        });
    }
    register_sampled_gauges(&metrics, &claims)?;
    warn_open_mode(&sandboxd);
    let provider = Arc::new(Provider::new(
        client.clone(),
        sandboxd.clone(),
        Arc::clone(&claims),
    ));
    // The Pod controller's store serves the kubelet API and gates readiness.
    let (pod_controller, synced) = controller::controller(&client, &cfg.node_name);
    let store = pod_controller.store();
    register_pod_phase_gauge(&metrics, store.clone())?;
    let pods = Arc::new(NodePods {
        store: store.clone(),
        provider: Arc::clone(&provider),
    });

    // Ready: the Pod watch has synced and the Node is registered. Pod
    // reconciles wait for it, so registering is not queued behind them,
    // and no Pod is claimed for before the start-up listing below.
    let (ready_tx, ready_rx) = watch::channel(false);
    let mut tasks = Tasks::new();
    {
        let ctx = Arc::new(
            Context::new(
                client.clone(),
                Arc::clone(&provider),
                &cfg.node_name,
                Arc::clone(&metrics),
            )
            .with_health(Arc::clone(&health))
            .gated(ready_rx.clone()),
        );
        // The Pod watch starts listing now, alongside the steps below.
        let fut = controller::run(pod_controller, synced.clone(), ctx, stop.clone());
        spawn_loop(&mut tasks, fut);
    }

    // Vouch for the previous run's claims and look for strays, with one
    // listing (which also seeds the first NodeInventory); a failure is
    // tolerated (the rows stay quarantined, and the refresh loop lists
    // again until sandboxd answers). The kubelet API's certificate and
    // client CA are prepared meanwhile.
    let kubelet_settings = cfg.kubelet();
    let (listed, kubelet) = tokio::join!(
        provider.refresh(),
        KubeletApi::prepare(&kubelet_settings, &client, pods, Arc::clone(&metrics)),
    );
    let start_listing = match listed {
        Ok(listing) => Some(listing),
        Err(e) => {
            info!(error = %e, "sandboxd cannot be listed at start-up; claims stay quarantined");
            None
        }
    };
    let kubelet = kubelet?;
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

    tasks.spawn(kubelet.run(stop.clone().cancelled_owned()));
    tasks.spawn(admin::serve(
        admin_listener,
        admin_router,
        stop.clone().cancelled_owned(),
    ));

    // Wait for the initial Pod list before registering, so a Ready node
    // always knows its Pods; a signal meanwhile still shuts down cleanly.
    let settings = node_settings(&cfg);
    tokio::pin!(signal);
    let registered = tokio::select! {
        r = async {
            synced.wait().await;
            health.set_pod_watch_synced(true);
            let seen = match seen_node.await {
                Ok(Ok(node)) => Some(node),
                // Read again by registration.
                _ => None,
            };
            // Registration is the Node's first reconcile (a created Node
            // carries its status; the status loop then waits a heartbeat).
            let started = std::time::Instant::now();
            let r = node::register::register(&client, &settings, seen, true).await;
            metrics.reconciled("node", started.elapsed(), &r);
            r
        } => Some(r?),
        r = &mut signal => { r?; None }
    };

    if let Some(registered) = registered {
        // Registered, and the Pod watch has synced: the node is ready.
        // Sent before the status loop starts, which then applies this
        // readiness (unless the Node was just created with it).
        let _ = ready_tx.send(true);
        let (uid_tx, uid_rx) =
            watch::channel(registered.node.metadata.uid.clone().unwrap_or_default());
        let beat = |name: &'static str, period: Duration| {
            Some(health.register_loop(name, period + admin::STALL_MARGIN))
        };
        let lease_metrics = Arc::clone(&metrics);
        let lease_health = Arc::clone(&health);
        {
            let fut = node::lease::run(
                client.clone(),
                cfg.node_name.clone(),
                uid_rx,
                stop.clone(),
                beat("node Lease", node::lease::RENEW_INTERVAL),
                move |r: &Result<()>| {
                    lease_metrics.lease_renewed(r.is_ok());
                    lease_health.set_lease_ok(r.is_ok());
                },
            );
            spawn_loop(&mut tasks, fut);
        }
        {
            let fut = node::register::run_status_loop(
                client.clone(),
                settings,
                registered,
                ready_rx,
                cfg.node_status_interval,
                stop.clone(),
                beat("Node status", cfg.node_status_interval),
                uid_tx,
                {
                    let m = Arc::clone(&metrics);
                    move |r: &Result<()>, took| m.reconciled("node", took, r)
                },
            );
            spawn_loop(&mut tasks, fut);
        }
        if cfg.inventory.publish {
            let publisher = Publisher::new(
                client.clone(),
                &cfg.inventory.group,
                sandboxd.clone(),
                Arc::clone(&claims),
                &cfg.node_name,
                &cfg.sandboxd.advertise_addr,
                Arc::clone(&metrics),
            );
            let publisher = match start_listing {
                Some(listing) => publisher.seeded(listing),
                None => publisher,
            };
            let fut = publisher.run(
                cfg.inventory.interval,
                stop.clone(),
                beat("NodeInventory publisher", cfg.inventory.interval),
            );
            spawn_loop(&mut tasks, fut);
        }
        match cfg.orphan_scan_interval {
            Some(every) => {
                let scanner = orphan::Scanner::new(
                    sandboxd.clone(),
                    Arc::clone(&claims),
                    Arc::clone(&metrics),
                );
                let fut = scanner.run(Some(every), stop.clone(), beat("orphan audit", every));
                spawn_loop(&mut tasks, fut);
            }
            None => info!("orphan audit scan disabled (--orphan-scan-interval <= 0)"),
        }
        info!(node = %cfg.node_name, "virtual node ready");

        // Run until a signal, or until a task fails.
        tokio::select! {
            r = &mut signal => r?,
            Some(done) = tasks.join_next(), if !stop.is_cancelled() => {
                stop.cancel();
                return Err(task_ended(done));
            }
        }
    }

    // Shutdown never evicts, releases or deletes: stop the loops, exit 0.
    stop.cancel();
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
    // Leave a plain claims.json behind (an operator can roll back to the Go
    // build); the journal is folded in. If that fails the journal still
    // holds every change and the next start replays it: nothing is lost, so
    // the shutdown still succeeds.
    if let Err(e) = claims.compact().await {
        warn!(
            error = %e,
            "final compaction of the claims state failed; the journal beside it still holds \
             every change and is replayed at the next start (roll back to the Go build only \
             after a clean compaction)"
        );
    }
    Ok(())
}

/// Claims by state, read from the store at each scrape.
fn register_sampled_gauges(metrics: &Metrics, claims: &Arc<ClaimsStore>) -> Result<()> {
    let claims = Arc::clone(claims);
    metrics.register_sampled(SampledGauge::new(
        "vk_sandbox_claims",
        "Claims held in the claims store, by state (settled, tentative, quarantined).",
        "state",
        move || {
            let c = claims.counts();
            vec![
                ("settled".to_string(), c.settled as i64),
                ("tentative".to_string(), c.tentative as i64),
                ("quarantined".to_string(), c.quarantined as i64),
            ]
        },
    )?)
}

/// Pods bound to this node by phase, and the oldest Pending one's age by
/// status reason, read from the watch cache at each scrape.
fn register_pod_phase_gauge(
    metrics: &Metrics,
    store: kube::runtime::reflector::Store<vk_sandbox::pods::pod::Pod>,
) -> Result<()> {
    let pending = store.clone();
    metrics.register_sampled(SampledGauge::new(
        "vk_sandbox_pods",
        "Pods bound to this node, by phase.",
        "phase",
        move || {
            let mut by_phase: std::collections::BTreeMap<String, i64> =
                ["Pending", "Running", "Succeeded", "Failed", "Unknown"]
                    .into_iter()
                    .map(|p| (p.to_string(), 0))
                    .collect();
            for pod in store.state() {
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_else(|| "Pending".to_string());
                *by_phase.entry(phase).or_default() += 1;
            }
            by_phase.into_iter().collect()
        },
    )?)?;
    metrics.register_sampled(SampledGauge::new(
        vk_sandbox::metrics::PODS_PENDING_OLDEST,
        "How long the oldest Pending Pod bound to this node has been Pending, by Pod status \
         reason (none when it has none yet).",
        "reason",
        move || {
            let pods = pending.state();
            vk_sandbox::metrics::pending_oldest(pods.iter().map(|p| &**p), jiff::Timestamp::now())
        },
    )?)
}

/// `/pods` from the watch cache; `/runningpods/` from the provider.
struct NodePods {
    store: kube::runtime::reflector::Store<vk_sandbox::pods::pod::Pod>,
    provider: Arc<Provider>,
}

impl PodSource for NodePods {
    fn node_pods(&self) -> Vec<vk_sandbox::pods::pod::Pod> {
        let mut pods: Vec<_> = self.store.state().iter().map(|p| (**p).clone()).collect();
        pods.sort_by_key(vk_sandbox::pods::annotations::key);
        pods
    }

    fn running_pods(&self) -> Vec<vk_sandbox::pods::pod::Pod> {
        self.provider.tracked_pods()
    }
}
