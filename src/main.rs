//! vk-sandbox: parse and validate flags, then run the virtual node until
//! SIGTERM/SIGINT. Start-up order (docs/architecture.md#start-up): configuration
//! (nothing touches the cluster before it is valid), credentials, kubelet
//! API bound, Pod watch synced, then the Node registered, its Lease and
//! status heartbeats started, and the Node marked Ready.

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::{error, info, warn};
use vk_sandbox::admin;
use vk_sandbox::claims::state_lock::StateLock;
use vk_sandbox::claims::{self, ClaimsStore};
use vk_sandbox::config::{self, Config};
use vk_sandbox::cordon::CordonDrain;
use vk_sandbox::fleet::decide::FleetSettings;
use vk_sandbox::fleet::feed::InfoFeed;
use vk_sandbox::fleet::reading::Sample;
use vk_sandbox::health::Health;
use vk_sandbox::inventory::Publisher;
use vk_sandbox::kube_client::progress::{self, WatchProgress};
use vk_sandbox::kubelet::{ClaimedSandboxes, KubeletApi, SandboxdPlane, Streaming};
use vk_sandbox::metrics::Metrics;
use vk_sandbox::node::lease::Renewal;
use vk_sandbox::node::register::{Seen, StatusLoop};
use vk_sandbox::node::{self, NodeSettings};
use vk_sandbox::placement::{self, watch::Index};
use vk_sandbox::pods::context::Context;
use vk_sandbox::pods::provider::Provider;
use vk_sandbox::pods::source::NodePods;
use vk_sandbox::pods::{self, controller};
use vk_sandbox::runtime::Threads;
use vk_sandbox::sandboxd::{Observer, SandboxRow, SandboxdClient};
use vk_sandbox::supervise::Tasks;
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

/// The sandboxd client, counted in the metrics. Says at start-up what
/// running without a sandboxd token means (a tenant token is named when
/// sandboxd first refuses it; see `Provider::list`).
fn sandboxd_client(cfg: &Config, metrics: &Arc<Metrics>) -> Result<SandboxdClient> {
    let sandboxd = SandboxdClient::builder(cfg.sandboxd.url.clone())
        .token(cfg.sandboxd.token.as_ref().map(|t| t.expose().to_string()))
        .observer(Arc::clone(metrics) as Arc<dyn Observer>)
        .build()?;
    if !sandboxd.has_token() {
        warn!(
            "no sandboxd token (--sandboxd-token-file unset): sandboxd must run in open mode; \
             sandboxes cannot be released by id, so a lost claim reply is left to its deadline \
             and a claim recovered without its credential cannot be released"
        );
    }
    Ok(sandboxd)
}

/// The kubelet API, its certificate and client CA prepared: exec,
/// port-forward and stats reach each Pod's sandbox through sandboxd's relays
/// with the claim's token (docs/streaming.md).
async fn kubelet_api(
    cfg: &Config,
    client: &kube::Client,
    pods: Arc<NodePods>,
    claims: &Arc<ClaimsStore>,
    sandboxd: &SandboxdClient,
    metrics: &Arc<Metrics>,
) -> Result<KubeletApi> {
    let settings = cfg.kubelet();
    let streaming = Streaming::new(
        Arc::new(ClaimedSandboxes::new(pods.clone(), claims.clone())),
        Arc::new(SandboxdPlane::new(sandboxd.clone())),
    )
    .with_limits(settings.streaming, metrics.streaming());
    KubeletApi::prepare(&settings, client, pods, metrics.clone(), Some(streaming)).await
}

/// Each sandbox's own Pod address (`--pod-cidr`, docs/pod-network.md): a
/// listener per address and declared TCP port, relaying to the guest. Or,
/// without a range, the node's address for every Pod, said loudly.
fn pod_addresses(
    tasks: &mut Tasks,
    cfg: &Config,
    provider: &Arc<Provider>,
    pods: &Arc<NodePods>,
    claims: &Arc<ClaimsStore>,
    sandboxd: &SandboxdClient,
    admission: Arc<dyn vk_sandbox::podnet::relay::Admission>,
) {
    use vk_sandbox::kubelet::pod_address::SandboxPorts;
    use vk_sandbox::podnet::{listeners, netns::PodNetns, relay};
    let Some(range) = cfg.pod_network.range else {
        warn!(
            "no --pod-cidr: every sandbox Pod gets the node's address (the host part of \
             sandboxd's owner_addr), so Services, the sandbox-router and clients that dial the \
             Pod IP reach the node, not the sandbox; set --pod-cidr to a range routed to this \
             host (docs/pod-network.md)"
        );
        return;
    };
    let netns = PodNetns::new(cfg.pod_network.netns.clone());
    // Whether the range is local where Pod addresses are answered: else
    // every listener's bind fails (and says so, once per address).
    let probe = std::net::SocketAddr::from((range.first(), 0));
    match netns.listen(probe) {
        Ok(_) => info!(%range, netns = ?cfg.pod_network.netns, "Pod addresses of their own"),
        Err(e) => warn!(%range, error = %e,
            "Pod addresses from --pod-cidr cannot be listened on yet: the range must be \
             routed locally where they are answered (`ip route add local {range} dev lo`, \
             docs/pod-network.md); retried for each Pod"),
    }
    let relaying = Arc::new(relay::Relaying {
        guest: Arc::new(SandboxPorts::new(
            Arc::new(ClaimedSandboxes::new(pods.clone(), claims.clone())),
            Arc::new(SandboxdPlane::new(sandboxd.clone())),
        )),
        admission,
        counts: Arc::default(),
    });
    let endpoints: Arc<dyn listeners::Endpoints> = provider.clone();
    tasks.spawn_loop(listeners::Listeners::new(netns, relaying).run(endpoints));
}

/// Ingress NetworkPolicy at the Pod addresses (docs/networkpolicy.md): with
/// `--pod-cidr` the relay asks the policies selecting each Pod, kept by
/// watches of the policies, the namespaces' labels and the Pods their peers
/// select; without it there is no relay, and nothing is watched.
fn network_policy(
    tasks: &mut Tasks,
    cfg: &Config,
    client: &kube::Client,
    store: kube::runtime::reflector::Store<vk_sandbox::pods::pod::Pod>,
) -> Arc<dyn vk_sandbox::podnet::relay::Admission> {
    use vk_sandbox::netpol::{self, NetworkPolicies, PolicyAdmission};
    if cfg.pod_network.range.is_none() {
        return Arc::new(vk_sandbox::podnet::relay::AdmitAll);
    }
    let policies = NetworkPolicies::new(netpol::admission::local_pods(store.clone()));
    let watches = Arc::clone(&policies).run(client.clone(), cfg.node_name.clone(), tasks.stop());
    tasks.spawn_loop(watches);
    tasks.spawn_loop(netpol::egress_events::run(
        Arc::clone(&policies),
        store.clone(),
        client.clone(),
        cfg.node_name.clone(),
        tasks.stop(),
    ));
    Arc::new(PolicyAdmission::new(policies, store))
}

/// The placement webhook (`--webhook-addr`, docs/placement.md): bound and
/// its certificate loaded now (a failure stops start-up), served from
/// here on, its NodeInventory index filling meanwhile. Not tied to this
/// node's own readiness: it answers from the API, so any vk-sandbox of the
/// fleet can serve it.
async fn placement_webhook(
    tasks: &mut Tasks,
    cfg: &Config,
    index: Option<&Arc<Index>>,
    metrics: &Arc<Metrics>,
) -> Result<()> {
    let (Some(webhook), Some(index)) = (&cfg.webhook, index) else {
        return Ok(());
    };
    let server = vk_sandbox::placement::serve::Server::prepare(webhook).await?;
    let (serving, loops) = server.run(Arc::clone(index), Arc::clone(metrics), tasks.stop())?;
    tasks.spawn(serving);
    tasks.spawn_loop(loops);
    Ok(())
}

/// What the reporting loops share.
struct Shared {
    client: kube::Client,
    sandboxd: SandboxdClient,
    claims: Arc<ClaimsStore>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The loops that report rather than act: the NodeInventory publisher
/// (seeded with the start-up listing) and the orphan audit.
fn spawn_reports(
    tasks: &mut Tasks,
    cfg: &Config,
    s: Shared,
    listing: Option<Vec<SandboxRow>>,
    info_feed: Option<watch::Receiver<Sample>>,
) {
    if cfg.inventory.publish {
        let publisher = Publisher::new(
            s.client,
            cfg.inventory.group.as_deref(),
            s.sandboxd.clone(),
            Arc::clone(&s.claims),
            &cfg.node_name,
            &cfg.sandboxd.advertise_addr,
            Arc::clone(&s.metrics),
        );
        let publisher = publisher.seeded(listing);
        let publisher = match info_feed {
            Some(rx) => publisher.with_info_feed(rx),
            None => publisher,
        };
        let every = cfg.inventory.interval;
        tasks.spawn_loop(publisher.run(every, Arc::clone(&s.health), tasks.stop()));
    }
    match cfg.orphan_scan_interval {
        Some(every) => {
            let scanner = orphan::Scanner::new(s.sandboxd, s.claims, s.metrics);
            tasks.spawn_loop(scanner.run(every, s.health, tasks.stop()));
        }
        None => info!("orphan audit scan disabled (--orphan-scan-interval <= 0)"),
    }
}

async fn run(cfg: Config) -> Result<()> {
    // The start of the start-up timeline (each step below logs its end).
    info!(version = env!("CARGO_PKG_VERSION"), node = %cfg.node_name, "vk-sandbox starting");
    let signal = shutdown_signal();
    let mut tasks = Tasks::new();
    let (metrics, health) = (Metrics::new()?, Health::new());
    // One process per state path, before anything reads or writes it.
    let state_lock = StateLock::acquire(&cfg.state_path)?;
    // The claims store loads and is written once before the Node exists (an
    // unwritable state path keeps the node out of scheduling), while the
    // Kubernetes credentials load.
    // /livez fails on a Pod watch that makes no progress (no event, no
    // bookmark) for longer than the server's watch timeout.
    let watches = WatchProgress::new();
    watches.report_to(&health, progress::STALL_LIMIT);
    let (client, claims) = tokio::join!(
        kube_client::client(&cfg.kube, watches),
        // The store's writer keeps the lock (and re-asserts it should the
        // state directory be deleted).
        ClaimsStore::open_locked(&cfg.state_path, state_lock)
    );
    let (client, source) = client?;
    info!(?source, node = %cfg.node_name, "Kubernetes credentials loaded");
    // Whether the Node exists, read while the Pod watch lists.
    let seen_node = tokio::spawn(Seen::read(client.clone(), cfg.node_name.clone()));
    let claims = Arc::new(claims?);
    claims::gauge::instrument(&claims, &metrics)?;
    let sandboxd = sandboxd_client(&cfg, &metrics)?;
    let provider = Provider::new(client.clone(), sandboxd.clone(), claims.clone()).with_lifecycle(
        vk_sandbox::pods::lifecycle::decide::Settings {
            hibernate_on_suspend: cfg.lifecycle.hibernate_on_suspend,
            renew_margin: cfg.lifecycle.renew_margin,
        },
    );
    // The Pod watch starts listing now. Its store serves the kubelet API,
    // the gauges and the Pod-address picker; reconciles wait until the node
    // is ready (the watch synced, the Node registered), so registering is
    // not queued behind them and no Pod is claimed for before the start-up
    // listing below (nor before the store knows every Pod here).
    let (ready_tx, ready_rx) = watch::channel(false);
    // Of each list, Pods Running on the claim held for them are queued
    // after the others, once reconciles open (src/pods/work_first.rs).
    let held = Arc::clone(&claims);
    let can_wait = move |pod: &pods::pod::Pod| {
        let held_for = held.get(&pod.key()).map(|(claim, _)| claim.pod_uid);
        pods::work_first::served(pod, held_for.as_deref())
    };
    let (pod_controller, synced) =
        controller::controller(&client, &cfg.node_name, can_wait, ready_rx.clone());
    let store = pod_controller.store();
    let provider = match cfg.pod_network.range {
        Some(range) => provider.with_pod_range(range, store.clone()),
        None => provider,
    };
    let provider = Arc::new(provider);
    pods::gauges::register(&metrics, store.clone())?;
    let ctx = Context::new(
        client.clone(),
        provider.clone(),
        &cfg.node_name,
        metrics.clone(),
    );
    let ctx = ctx
        .with_health(health.clone())
        .gated(ready_rx.clone())
        .handing_back_after(cfg.fleet.hand_back_after);
    // Which node holds which key's VM: one NodeInventory watch, read by
    // the check before a claim (src/pods/elsewhere, where this node
    // publishes) and by the placement webhook.
    let vm_index = (cfg.inventory.publish || cfg.webhook.is_some()).then(|| {
        let index = Arc::new(Index::default());
        let group = cfg.inventory.group.clone();
        let watch = placement::watch::run(Arc::clone(&index), client.clone(), group, tasks.stop());
        tasks.spawn_loop(watch);
        index
    });
    let ctx = Arc::new(match &vm_index {
        Some(index) if cfg.inventory.publish => {
            ctx.checking_holders(Arc::clone(index) as _, cfg.fleet.vm_holder_gone_after)
        }
        _ => ctx,
    });
    let reconciles = controller::run(pod_controller, synced.clone(), ctx, tasks.stop());
    tasks.spawn_loop(reconciles);

    // One sandboxd listing vouches for the previous run's claims, finds
    // strays and seeds the first NodeInventory (a failure leaves the rows
    // quarantined; the refresh loop lists again). The kubelet API's
    // certificate and client CA are prepared meanwhile.
    let admission = network_policy(&mut tasks, &cfg, &client, store.clone());
    let pods = Arc::new(NodePods::new(store.clone(), provider.clone()));
    pod_addresses(
        &mut tasks, &cfg, &provider, &pods, &claims, &sandboxd, admission,
    );
    let (listed, kubelet) = tokio::join!(
        provider.refresh(),
        kubelet_api(&cfg, &client, pods, &claims, &sandboxd, &metrics),
    );
    let start_listing = listed
        .inspect_err(
            |e| info!(error = %e, "no sandboxd listing at start-up; claims stay quarantined"),
        )
        .ok();
    tasks.spawn(kubelet?.run(tasks.stop()));
    placement_webhook(&mut tasks, &cfg, vm_index.as_ref(), &metrics).await?;
    let admin_listener = admin::bind(&cfg.admin_addr).await?;
    let admin_router = admin::router(Arc::clone(&health), Arc::clone(&metrics));
    tasks.spawn(admin::serve(admin_listener, admin_router, tasks.stop()));

    // Registered once the initial Pod list is in, so a Ready node always
    // knows its Pods; a signal meanwhile still shuts down cleanly.
    let settings = NodeSettings::from_config(&cfg);
    tokio::pin!(signal);
    let registered = tokio::select! {
        r = async {
            synced.wait().await;
            health.mark_pod_watch_synced();
            info!(pods = store.state().len(), "Pod watch listed this node's Pods");
            let seen = seen_node.await.unwrap_or(Seen::ReadNow);
            node::register::at_start(&client, &settings, seen, &metrics).await
        } => r?,
        r = &mut signal => {
            r?;
            tasks.shut_down(&claims).await;
            return Ok(());
        }
    };
    // Ready, before the status loop starts, which then applies it (unless
    // the Node was just created with it).
    let _ = ready_tx.send(true);

    let (uid_tx, uid_rx) = watch::channel(registered.node.metadata.uid.clone().unwrap_or_default());
    // The Lease loop notices a deleted Node first (its Lease goes with it).
    let node_gone = Arc::new(tokio::sync::Notify::new());
    let lease = Renewal::new(
        client.clone(),
        &cfg.node_name,
        uid_rx,
        metrics.clone(),
        health.clone(),
        node_gone.clone(),
    );
    tasks.spawn_loop(lease.run(tasks.stop()));
    // The one reader of sandboxd's /v1/info when the Node follows it; the
    // NodeInventory publisher takes its readings too.
    let fleet_settings = FleetSettings {
        capacity: cfg.fleet.capacity,
        conditions: cfg.fleet.conditions,
        taints: cfg.fleet.taints,
        max_claims: cfg.fleet.max_claims,
    };
    let info_feed = (fleet_settings.any() || cfg.fleet.drain_on_cordon).then(|| {
        let (feed, rx) = InfoFeed::new(sandboxd.clone());
        tasks.spawn_loop(feed.run(cfg.fleet.info_interval, Arc::clone(&health), tasks.stop()));
        rx
    });
    let status = StatusLoop {
        client: client.clone(),
        settings,
        registered,
        ready: ready_rx,
        interval: cfg.node_status_interval,
        node_uid: uid_tx,
        metrics: Arc::clone(&metrics),
        node_gone,
        fleet: info_feed
            .clone()
            .filter(|_| fleet_settings.any())
            .map(|rx| (rx, fleet_settings)),
    };
    tasks.spawn_loop(status.run(Arc::clone(&health), tasks.stop()));
    if cfg.fleet.drain_on_cordon
        && let Some(feed) = info_feed.clone()
    {
        let cordon = CordonDrain {
            client: client.clone(),
            node: cfg.node_name.clone(),
            sandboxd: sandboxd.clone(),
            feed,
        };
        tasks.spawn_loop(cordon.run(Arc::clone(&health), tasks.stop()));
    }
    let shared = Shared {
        client,
        sandboxd,
        claims: Arc::clone(&claims),
        metrics,
        health,
    };
    spawn_reports(&mut tasks, &cfg, shared, start_listing, info_feed);
    info!(node = %cfg.node_name, "virtual node ready");

    tasks.supervise(&mut signal).await?;
    tasks.shut_down(&claims).await;
    Ok(())
}
