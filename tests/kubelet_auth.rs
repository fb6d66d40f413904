//! Kubelet API authentication and authorization against the real local
//! control plane:
//!
//! - with the shipped RBAC's ServiceAccount: the client CA is read from
//!   kube-system/extension-apiserver-authentication, TokenReview and
//!   SubjectAccessReview round-trip;
//! - the apiserver reaches an in-process kubelet API through its own
//!   kubelet client certificate: `pods/log` through the apiserver answers
//!   the not-implemented text, and `kubectl exec/attach/port-forward` fail
//!   naming "not implemented" and the sandbox SDK; anonymous and
//!   unauthorized callers are refused.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::from_json;
use support::kubelet::StaticPods;
use tokio_util::sync::CancellationToken;
use vk_sandbox::config::{KubeletAuthConfig, TlsFiles};
use vk_sandbox::kubelet::auth::{
    Authenticator, Authorizer, Decision, KubeAuthenticator, KubeAuthorizer, request_attributes,
};
use vk_sandbox::kubelet::{
    KubeletAuth, KubeletState, KubeletTls, UserInfo, load_client_ca, router, serve,
};
use vk_sandbox::metrics::Metrics;

/// A client acting as the `vk-sandbox` ServiceAccount of manifests/rbac.yaml.
async fn vk_client(cluster: &support::TestCluster) -> Client {
    let path = support::vk::sa_kubeconfig(cluster).await;
    support::client_for(&path)
        .await
        .unwrap_or_else(|e| panic!("client for the vk-sandbox ServiceAccount: {e}"))
}

/// A token for ServiceAccount `ns/name` (created here).
async fn sa_token(client: &Client, ns: &str, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    match sas
        .create(
            &PostParams::default(),
            &from_json(
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
            ),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(e) => panic!("create ServiceAccount {ns}/{name}: {e}"),
    }
    let req: TokenRequest = from_json(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }));
    sas.create_token_request(name, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("token for {ns}/{name}: {e}"))
        .status
        .expect("TokenRequest status")
        .token
}

#[tokio::test]
async fn client_ca_token_review_and_sar_with_shipped_rbac() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let vk = vk_client(&cluster).await;
    let ns = cluster.namespace("kauth").await;

    // The client CA from the cluster, read with the shipped RBAC.
    let cfg = KubeletAuthConfig {
        enabled: true,
        anonymous: false,
        client_ca_file: None,
    };
    let roots = load_client_ca(&cfg, &vk)
        .await
        .expect("client CA from extension-apiserver-authentication")
        .expect("auth on means a CA");
    assert!(!roots.is_empty());
    let off = KubeletAuthConfig {
        enabled: false,
        ..cfg.clone()
    };
    assert!(load_client_ca(&off, &vk).await.unwrap().is_none());

    // TokenReview: a real token authenticates, a bogus one does not.
    let token = sa_token(&cluster.client, &ns, "caller").await;
    let authn = KubeAuthenticator::new(vk.clone());
    let user = authn
        .authenticate_token(&token)
        .await
        .expect("TokenReview allowed by the shipped RBAC")
        .expect("a valid token");
    assert_eq!(user.name, format!("system:serviceaccount:{ns}:caller"));
    assert!(user.groups.iter().any(|g| g == "system:serviceaccounts"));
    assert!(!user.uid.is_empty());
    assert_eq!(authn.authenticate_token("not-a-token").await.unwrap(), None);

    // SubjectAccessReview: the ServiceAccount may not proxy to nodes...
    let authz = KubeAuthorizer::new(vk.clone());
    let node = format!("kauth-node-{}", support::suffix());
    let proxy = request_attributes(&http::Method::GET, "/pods", &node);
    let stats = request_attributes(&http::Method::GET, "/stats/summary", &node);
    assert!(matches!(
        authz.authorize(&user, &proxy).await.expect("SAR"),
        Decision::Deny(_)
    ));
    // ...the apiserver's kubelet client (system:masters) may.
    let apiserver = UserInfo {
        name: "kube-apiserver-kubelet-client".into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
        ..UserInfo::default()
    };
    assert_eq!(
        authz.authorize(&apiserver, &proxy).await.unwrap(),
        Decision::Allow
    );

    // Granting nodes/stats lets the ServiceAccount read stats, not proxy.
    let role = format!("kauth-stats-{}", support::suffix());
    let roles: Api<ClusterRole> = Api::all(cluster.client.clone());
    roles
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": role},
                "rules": [{"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]}]
            })),
        )
        .await
        .expect("create ClusterRole");
    let bindings: Api<ClusterRoleBinding> = Api::all(cluster.client.clone());
    bindings
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "caller", "namespace": ns}]
            })),
        )
        .await
        .expect("create ClusterRoleBinding");
    support::wait_for(
        "the stats grant to take effect",
        Duration::from_secs(30),
        || async {
            match authz.authorize(&user, &stats).await {
                Ok(Decision::Allow) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert!(matches!(
        authz.authorize(&user, &proxy).await.unwrap(),
        Decision::Deny(_)
    ));

    let _ = bindings.delete(&role, &DeleteParams::default()).await;
    let _ = roles.delete(&role, &DeleteParams::default()).await;
    cluster.drop_namespace(&ns).await;
}

struct RunningApi {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<vk_sandbox::Result<()>>,
}

/// The kubelet API as main runs it: self-signed cert, client CA from the
/// cluster, TokenReview/SAR with the vk-sandbox ServiceAccount.
async fn start_kubelet_api(vk: &Client, node: &str) -> RunningApi {
    let cfg = KubeletAuthConfig {
        enabled: true,
        anonymous: false,
        client_ca_file: None,
    };
    let tls = KubeletTls::init(&TlsFiles::default(), node, Some("127.0.0.1")).expect("tls");
    let roots = load_client_ca(&cfg, vk).await.expect("client CA");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = KubeletState {
        node_name: node.to_string(),
        pods: Arc::new(StaticPods::default()),
        auth: Some(Arc::new(KubeletAuth::with_client(vk.clone(), node, false))),
        metrics: Metrics::new().expect("metrics"),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(serve(
        listener,
        tls.server_config(roots).expect("server config"),
        router(state),
        stop.clone(),
    ));
    RunningApi { addr, stop, task }
}

#[tokio::test]
async fn apiserver_reaches_the_kubelet_api_and_strangers_are_refused() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let vk = vk_client(&cluster).await;
    let ns = cluster.namespace("kauth-api").await;
    let node = format!("kauth-api-{}", support::suffix());
    let api = start_kubelet_api(&vk, &node).await;

    // A Node whose kubelet endpoint is the API above, and a Pod bound to it.
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    nodes
        .create(
            &PostParams::default(),
            &from_json(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node, "labels": {"type": "virtual-kubelet"}},
                "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "value": "sandboxd", "effect": "NoSchedule"}]}
            })),
        )
        .await
        .expect("create node");
    nodes
        .patch_status(
            &node,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": node}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": api.addr.port()}}
            }})),
        )
        .await
        .expect("node status");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    support::wait_for(
        "the Pod to be created (default ServiceAccount)",
        Duration::from_secs(30),
        || async {
            pods.create(
                &PostParams::default(),
                &from_json(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p"},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "base:24.04"}],
                             "tolerations": [{"operator": "Exists"}]}
                })),
            )
            .await
            .map(|_| ())
            .or_else(|e| match e {
                kube::Error::Api(ae) if ae.code == 409 => Ok(()),
                other => Err(other.to_string()),
            })
        },
    )
    .await;

    // Running, as vk-sandbox would report it (kubectl attach and
    // port-forward only talk to running Pods).
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                "image": "base:24.04", "imageID": "", "state": {"running": {}}}]
        }})),
    )
    .await
    .expect("pod status");

    // pods/log through the apiserver: its kubelet client certificate is
    // verified and authorized, and the not-implemented text comes back.
    let err = pods
        .logs("p", &LogParams::default())
        .await
        .expect_err("logs are not implemented");
    let text = err.to_string();
    assert!(text.contains("not implemented"), "{text}");
    assert!(text.contains("use the sandbox SDK"), "{text}");
    let err = pods
        .logs(
            "p",
            &LogParams {
                tail_lines: Some(5),
                ..LogParams::default()
            },
        )
        .await
        .expect_err("logs are not implemented");
    assert!(err.to_string().contains("not implemented"), "{err}");

    // Anonymous callers are refused; an authenticated stranger is forbidden.
    let direct = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let url = format!("https://127.0.0.1:{}/pods", api.addr.port());
    let resp = direct.get(&url).send().await.expect("anonymous request");
    assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);
    let token = sa_token(&cluster.client, &ns, "stranger").await;
    let resp = direct
        .get(&url)
        .bearer_auth(&token)
        .send()
        .await
        .expect("token request");
    assert_eq!(resp.status(), reqwest::StatusCode::FORBIDDEN);
    let body = resp.text().await.unwrap_or_default();
    assert!(
        body.contains(&format!("system:serviceaccount:{ns}:stranger")),
        "{body}"
    );
    let healthz = format!("https://127.0.0.1:{}/healthz", api.addr.port());
    let resp = direct.get(&healthz).send().await.expect("healthz");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);

    // kubectl exec/attach/port-forward/logs through the apiserver fail,
    // naming "not implemented" and the sandbox SDK.
    let kubectl = support::kubectl::path();
    if kubectl.is_file() {
        let base = ["-n", ns.as_str()];
        let cases: [&[&str]; 4] = [
            &["exec", "p", "--", "true"],
            &["exec", "-i", "p", "--", "sh"],
            &["attach", "p"],
            &["port-forward", "pod/p", "0:80"],
        ];
        for case in cases {
            let args: Vec<&str> = base.iter().chain(case.iter()).copied().collect();
            let (ok, out) = support::kubectl::run(&cluster.kubeconfig, &args).await;
            eprintln!("kubectl {case:?}: {}", out.trim());
            assert!(!ok, "kubectl {case:?} must fail: {out}");
            assert!(out.contains("not implemented"), "kubectl {case:?}: {out}");
            assert!(out.contains("sandbox SDK"), "kubectl {case:?}: {out}");
        }
        let (ok, out) =
            support::kubectl::run(&cluster.kubeconfig, &[&base[..], &["logs", "p"]].concat()).await;
        assert!(
            !ok && out.contains("not implemented"),
            "kubectl logs: {out}"
        );
    } else {
        eprintln!("SKIPPED kubectl part: no kubectl at {}", kubectl.display());
    }

    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    cluster.drop_namespace(&ns).await;
    api.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), api.task).await;
}
