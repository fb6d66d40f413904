//! The observations behind each check (apiserver, sandboxd, local disk and
//! ports), each bounded by [`CHECK_TIMEOUT`]; [`super::evaluate`],
//! [`super::rbac`] and [`super::state`] turn them into checklist lines.

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};

use super::check::{CHECK_TIMEOUT, CheckResult, Status};
use super::evaluate::{self, ApiError, SandboxdProblem};
use super::rbac::{self, Permission};
use crate::config::{Config, ListenAddr};
use crate::inventory::groups;
use crate::inventory::types::{KIND, PLURAL, VERSION};
use crate::kube_client::{self, Source};
use crate::sandboxd::SandboxdClient;

/// `fut` bounded by [`CHECK_TIMEOUT`].
async fn bounded<T>(fut: impl Future<Output = Result<T, ApiError>>) -> Result<T, ApiError> {
    tokio::time::timeout(CHECK_TIMEOUT, fut)
        .await
        .unwrap_or(Err(ApiError::Timeout))
}

/// Every check after the configuration's, in checklist order.
pub async fn run_all(cfg: &Config) -> Vec<CheckResult> {
    let (kube, sandboxd, state, ports) = tokio::join!(
        kube_checks(cfg),
        sandboxd_checks(cfg),
        state_checks(cfg),
        port_checks(&cfg.listen_addr, &cfg.admin_addr),
    );
    let mut out = kube;
    out.extend(sandboxd);
    out.extend(state);
    out.extend(ports);
    out.extend(webhook_checks(cfg).await);
    out
}

fn source_text(source: &Source) -> String {
    match source {
        Source::InCluster => "the in-cluster service account".into(),
        Source::Kubeconfig(path) => format!("kubeconfig {}", path.display()),
    }
}

const DEPENDENT: [&str; 3] = ["RBAC", "NodeInventory CRD", "node name"];

/// apiserver, RBAC, NodeInventory CRD, node name.
async fn kube_checks(cfg: &Config) -> Vec<CheckResult> {
    let skipped = |first: CheckResult| {
        let mut v = vec![first];
        let webhook = cfg.webhook.as_ref().map(|_| "webhook configuration");
        v.extend(
            DEPENDENT
                .iter()
                .copied()
                .chain(webhook)
                .map(|n| CheckResult::not_checked(n, "the apiserver check failed")),
        );
        v
    };
    let loaded = tokio::time::timeout(
        CHECK_TIMEOUT,
        kube_client::config(cfg.kube.kubeconfig.clone()),
    )
    .await;
    let (mut config, source) = match loaded {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return skipped(CheckResult::fail(
                "apiserver",
                format!("no usable Kubernetes credentials: {e}"),
                "run in a cluster with a ServiceAccount, or pass --kubeconfig PATH (else \
                 $KUBECONFIG or ~/.kube/config is read)",
            ));
        }
        Err(_) => {
            return skipped(CheckResult::fail(
                "apiserver",
                format!("loading the Kubernetes credentials took longer than {CHECK_TIMEOUT:?}"),
                "check the kubeconfig's exec/auth plugin",
            ));
        }
    };
    config.connect_timeout = Some(CHECK_TIMEOUT);
    config.read_timeout = Some(CHECK_TIMEOUT);
    config.write_timeout = Some(CHECK_TIMEOUT);
    let server = config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_string();
    let source = source_text(&source);
    let client = match Client::try_from(config) {
        Ok(c) => c,
        Err(e) => {
            return skipped(CheckResult::fail(
                "apiserver",
                format!("cannot build a client from {source}: {e}"),
                "fix the kubeconfig (server URL, certificates)",
            ));
        }
    };

    let version = bounded(async {
        client
            .apiserver_version()
            .await
            .map(|v| v.git_version)
            .map_err(ApiError::from)
    })
    .await;
    let whoami = if version.is_ok() {
        bounded(whoami(&client)).await
    } else {
        Err(ApiError::Other("not asked".into()))
    };
    let api_line = evaluate::apiserver(&server, &source, &version, &whoami);
    if api_line.status == Status::Fail {
        return skipped(api_line);
    }

    // Where the NodeInventory would go: discovery first, as the RBAC
    // needed depends on it.
    let flag = cfg.inventory.group.as_deref();
    let (served, node) = tokio::join!(
        async {
            if cfg.inventory.publish {
                bounded(inventory_versions(&client, flag)).await
            } else {
                Ok(Vec::new())
            }
        },
        bounded(async {
            Api::<Node>::all(client.clone())
                .get_opt(&cfg.node_name)
                .await
                .map_err(ApiError::from)
        }),
    );
    let choice = cfg.inventory.publish.then(|| {
        let with_v1beta1: Vec<String> = served
            .iter()
            .flatten()
            .filter(|(_, versions)| versions.iter().any(|v| v == VERSION))
            .map(|(g, _)| g.clone())
            .collect();
        groups::choose(flag, &with_v1beta1)
    });
    let network_policy = cfg.pod_network.range.is_some();
    let perms = rbac::required(
        choice.as_ref(),
        cfg.kubelet_auth.enabled,
        network_policy,
        cfg.webhook.is_some(),
        cfg.fleet.drain_on_cordon,
    );
    let (answers, stale) = tokio::join!(
        access_reviews(&client, perms),
        stale_inventories(&client, &cfg.node_name, choice.as_ref()),
    );
    let mut out = vec![api_line];
    out.extend(rbac::evaluate(&answers));
    out.push(evaluate::inventory_crd(
        cfg.inventory.publish,
        flag,
        &served,
        choice.as_ref(),
    ));
    out.extend(evaluate::inventory_stale(&cfg.node_name, &stale));
    out.push(evaluate::node_name(&cfg.node_name, &node));
    if cfg.webhook.is_some() {
        let listed = bounded(webhook_configurations(&client)).await;
        out.push(evaluate::webhook_configuration(&listed));
    }
    out
}

/// The MutatingWebhookConfigurations holding the placement webhook, each
/// with where it sends requests (a Service's ready endpoints read).
pub(crate) async fn webhook_configurations(
    client: &Client,
) -> Result<Vec<evaluate::Configured>, ApiError> {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let configs = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await?;
    let mut out = Vec::new();
    for config in configs.items {
        let name = config.metadata.name.clone().unwrap_or_default();
        for hook in config.webhooks.into_iter().flatten() {
            if hook.name != evaluate::WEBHOOK_NAME {
                continue;
            }
            let target = match (hook.client_config.service, hook.client_config.url) {
                (Some(svc), _) => {
                    let slices: Api<EndpointSlice> =
                        Api::namespaced(client.clone(), &svc.namespace);
                    let selector = format!("kubernetes.io/service-name={}", svc.name);
                    let ready = slices
                        .list(&kube::api::ListParams::default().labels(&selector))
                        .await
                        .map(|l| {
                            l.items
                                .iter()
                                .flat_map(|s| &s.endpoints)
                                .filter(|e| {
                                    e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
                                })
                                .count()
                        })
                        .map_err(ApiError::from);
                    evaluate::Target::Service {
                        namespace: svc.namespace,
                        name: svc.name,
                        ready,
                    }
                }
                (None, Some(url)) => evaluate::Target::Url(url),
                (None, None) => evaluate::Target::Nothing,
            };
            out.push(evaluate::Configured {
                configuration: name.clone(),
                target,
                failure_policy: hook.failure_policy.unwrap_or_else(|| "Fail".into()),
            });
        }
    }
    Ok(out)
}

/// For each group `choice` does not publish in but serves: whether an
/// object named after `node` is there (the managers that wrote it).
async fn stale_inventories(
    client: &Client,
    node: &str,
    choice: Option<&groups::Choice>,
) -> Vec<evaluate::StaleLook> {
    let Some(choice) = choice else {
        return Vec::new();
    };
    let looks = choice.stale_candidates.iter().map(|group| async move {
        let gvk = kube::api::GroupVersionKind::gvk(group, VERSION, KIND);
        let api: Api<kube::api::DynamicObject> = Api::all_with(
            client.clone(),
            &kube::api::ApiResource::from_gvk_with_plural(&gvk, PLURAL),
        );
        let found = bounded(async {
            api.get_opt(node).await.map_err(ApiError::from).map(|o| {
                o.map(|o| {
                    o.metadata
                        .managed_fields
                        .into_iter()
                        .flatten()
                        .filter_map(|f| f.manager)
                        .collect()
                })
            })
        })
        .await;
        (group.clone(), found)
    });
    futures::future::join_all(looks).await
}

/// The user the credentials authenticate as (SelfSubjectReview).
async fn whoami(client: &Client) -> Result<String, ApiError> {
    let review: SelfSubjectReview = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
        "metadata": {}
    }))
    .map_err(|e| ApiError::Other(format!("building a SelfSubjectReview: {e}")))?;
    let answer = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let user = answer
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_else(|| "an unnamed user".into());
    Ok(user)
}

/// One SelfSubjectAccessReview per permission, concurrently, each bounded.
async fn access_reviews(
    client: &Client,
    perms: Vec<Permission>,
) -> Vec<(Permission, Result<bool, String>)> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let reviews = perms.into_iter().map(|perm| {
        let api = api.clone();
        async move {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(perm.group.clone()),
                        resource: Some(perm.resource.clone()),
                        subresource: perm.subresource.clone(),
                        verb: Some(perm.verb.clone()),
                        namespace: perm.namespace.clone(),
                        name: perm.name.clone(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            let answer = bounded(async {
                api.create(&PostParams::default(), &review)
                    .await
                    .map_err(ApiError::from)
            })
            .await
            .map(|r| r.status.is_some_and(|s| s.allowed))
            .map_err(|e| e.to_string());
            (perm, answer)
        }
    });
    futures::future::join_all(reviews).await
}

/// The versions in which each known group, and `flag`'s group, serve
/// `nodeinventories` (API discovery: readable by any authenticated user,
/// unlike the CRD objects themselves).
async fn inventory_versions(
    client: &Client,
    flag: Option<&str>,
) -> Result<Vec<(String, Vec<String>)>, ApiError> {
    let mut names: Vec<&str> = groups::KNOWN.to_vec();
    if let Some(g) = flag.filter(|g| !names.contains(g)) {
        names.push(g);
    }
    let mut out = Vec::new();
    for group in names {
        let versions = groups::served_versions(client, group).await?;
        out.push((group.to_string(), versions));
    }
    Ok(out)
}

/// sandboxd reachable, token accepted, warm pools.
async fn sandboxd_checks(cfg: &Config) -> Vec<CheckResult> {
    let url = cfg.sandboxd.url.as_str();
    let token_file = cfg
        .sandboxd
        .token
        .as_ref()
        .and(cfg.sandboxd.token_file.as_deref());
    let client = SandboxdClient::builder(url)
        .token(cfg.sandboxd.token.as_ref().map(|t| t.expose().to_string()))
        .timeout(CHECK_TIMEOUT)
        .build();
    let info = match client {
        Ok(client) => {
            match tokio::time::timeout(CHECK_TIMEOUT + Duration::from_secs(1), client.info()).await
            {
                Ok(r) => r.map_err(|e| SandboxdProblem::from(&e)),
                Err(_) => Err(SandboxdProblem::Unreachable(format!(
                    "no answer within {CHECK_TIMEOUT:?}"
                ))),
            }
        }
        Err(e) => Err(SandboxdProblem::Unexpected(e.to_string())),
    };
    evaluate::sandboxd(url, token_file, &info)
}

/// State directory and file, off the async threads and bounded (a hung
/// network mount must not hang preflight).
async fn state_checks(cfg: &Config) -> Vec<CheckResult> {
    let path = cfg.state_path.clone();
    let shown = path.display().to_string();
    let task = tokio::task::spawn_blocking(move || super::state::check(&path));
    match tokio::time::timeout(CHECK_TIMEOUT, task).await {
        Ok(Ok(results)) => results,
        Ok(Err(e)) => vec![CheckResult::fail(
            "state directory",
            format!("checking {shown} failed: {e}"),
            "check the state path",
        )],
        Err(_) => vec![CheckResult::fail(
            "state directory",
            format!("{shown} did not answer within {CHECK_TIMEOUT:?}"),
            "check the file system holding --state-path (env VK_STATE_PATH)",
        )],
    }
}

async fn bind(addr: &ListenAddr) -> Result<tokio::net::TcpListener, (std::io::ErrorKind, String)> {
    match tokio::time::timeout(CHECK_TIMEOUT, addr.bind()).await {
        Ok(r) => r.map_err(|e| (e.kind(), e.to_string())),
        Err(_) => Err((
            std::io::ErrorKind::TimedOut,
            format!("resolving {addr} took longer than {CHECK_TIMEOUT:?}"),
        )),
    }
}

/// With `--webhook-addr`: the placement webhook's pair loads, and its
/// port is free and its own (docs/placement.md).
async fn webhook_checks(cfg: &Config) -> Vec<CheckResult> {
    let Some(webhook) = &cfg.webhook else {
        return Vec::new();
    };
    let loaded = crate::kubelet::tls::load_pair(&webhook.cert, &webhook.key).map(|k| k.cert.len());
    let pair = evaluate::webhook_pair(&webhook.cert, &webhook.key, &loaded);
    let port = if [&cfg.listen_addr, &cfg.admin_addr]
        .iter()
        .any(|other| evaluate::ports_clash(&webhook.addr, other))
    {
        CheckResult::fail(
            "webhook port",
            format!(
                "{} uses the port of --listen-addr or --admin-addr",
                webhook.addr
            ),
            "give --webhook-addr (env VK_WEBHOOK_ADDR) its own port, e.g. :10262",
        )
    } else {
        let bound = bind(&webhook.addr).await.map(drop);
        evaluate::port(
            "webhook port",
            "webhook-addr",
            "VK_WEBHOOK_ADDR",
            &webhook.addr,
            &bound,
        )
    };
    vec![pair, port]
}

/// Bind the kubelet port, then (still holding it) the admin port, then let
/// both go.
async fn port_checks(listen: &ListenAddr, admin: &ListenAddr) -> Vec<CheckResult> {
    let kubelet = bind(listen).await;
    let kubelet_line = evaluate::port(
        "kubelet port",
        "listen-addr",
        "VK_LISTEN_ADDR",
        listen,
        &kubelet.as_ref().map(|_| ()).map_err(Clone::clone),
    );
    let admin_line = if evaluate::ports_clash(listen, admin) {
        CheckResult::fail(
            "admin port",
            format!("{admin} uses the port of --listen-addr ({listen})"),
            "give --admin-addr (env VK_ADMIN_ADDR) its own port, e.g. :10261",
        )
    } else {
        let bound = bind(admin).await.map(drop);
        evaluate::port("admin port", "admin-addr", "VK_ADMIN_ADDR", admin, &bound)
    };
    drop(kubelet);
    vec![kubelet_line, admin_line]
}
