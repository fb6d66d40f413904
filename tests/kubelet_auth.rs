//! Kubelet API authentication and authorization against the real local
//! control plane:
//!
//! - with the shipped RBAC's ServiceAccount: the client CA is read from
//!   kube-system/extension-apiserver-authentication, TokenReview and
//!   SubjectAccessReview round-trip;
//! - the apiserver reaches an in-process kubelet API through its own
//!   kubelet client certificate: `pods/log` answers that a sandbox keeps no
//!   container log, `kubectl port-forward` reaches a guest port (a local
//!   listener standing where sandboxd's relay leads), `kubectl exec` on a
//!   Pod without a sandbox and `kubectl attach` fail with their reasons;
//!   anonymous callers get 401, callers without `create` on `nodes/proxy`
//!   403, for exec and port-forward too.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::from_json;
use support::kubelet::{FixedSandboxes, LocalPorts, StaticPods};
use tokio_util::sync::CancellationToken;
use vk_sandbox::config::{KubeletAuthConfig, TlsFiles};
use vk_sandbox::kubelet::auth::{
    Authenticator, Authorizer, Decision, KubeAuthenticator, KubeAuthorizer, request_attributes,
};
use vk_sandbox::kubelet::{
    KubeletAuth, KubeletState, KubeletTls, Streaming, UserInfo, load_client_ca, router, serve,
};
use vk_sandbox::metrics::Metrics;

/// A client acting as the `vk-sandbox` ServiceAccount of manifests/rbac.yaml.
async fn vk_client(cluster: &support::TestCluster) -> Client {
    let path = support::vk::sa_kubeconfig(cluster).await;
    support::client_for(&path)
        .await
        .unwrap_or_else(|e| panic!("client for the vk-sandbox ServiceAccount: {e}"))
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
    let token = support::rbac::sa_token(&cluster.client, &ns, "caller").await;
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
    let role = support::rbac::grant(
        &cluster.client,
        &ns,
        "caller",
        json!({"apiGroups": [""], "resources": ["nodes/stats"], "verbs": ["get"]}),
    )
    .await;
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

    support::rbac::revoke(&cluster.client, &role).await;
    cluster.drop_namespace(&ns).await;
}

struct RunningApi {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<vk_sandbox::Result<()>>,
}

/// The kubelet API as main runs it: self-signed cert, client CA from the
/// cluster, TokenReview/SAR with the vk-sandbox ServiceAccount; `ns/p`
/// runs in a sandbox whose guest ports are `plane`'s listeners, `ns/q`
/// has none.
async fn start_kubelet_api(
    vk: &Client,
    node: &str,
    ns: &str,
    plane: Arc<LocalPorts>,
) -> RunningApi {
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
        streaming: Some(Streaming::new(
            Arc::new(
                FixedSandboxes::default()
                    .with(&format!("{ns}/p"), "sb_test")
                    .without(
                        &format!("{ns}/q"),
                        &format!("pod {ns}/q has no sandbox: vk-sandbox holds no claim for it"),
                    ),
            ),
            plane,
        )),
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
    // Deleted at the end, or when the test fails.
    let _node_cleanup = support::nodes::NodeCleanup::new(cluster.kubeconfig.clone(), &node);
    let plane = Arc::new(LocalPorts::default());
    let guest = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    plane.map(8080, guest.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut c, _)) = guest.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = c.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let api = start_kubelet_api(&vk, &node, &ns, Arc::clone(&plane)).await;

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
                "daemonEndpoints": {"kubeletEndpoint": {"Port": api.addr.port()}},
                // As vk-sandbox declares it: WebSocket streams come as they are.
                "declaredFeatures": ["ExtendWebSocketsToKubelet"]
            }})),
        )
        .await
        .expect("node status");
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), &ns);
    for name in ["p", "q"] {
        support::wait_for(
            "the Pod to be created (default ServiceAccount)",
            Duration::from_secs(30),
            || async {
                pods.create(
                    &PostParams::default(),
                    &from_json(json!({
                        "apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": name},
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
            name,
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
    }

    // pods/log through the apiserver: its kubelet client certificate is
    // verified and authorized, and the reason comes back (a 400).
    for params in [
        LogParams::default(),
        LogParams {
            tail_lines: Some(5),
            ..LogParams::default()
        },
    ] {
        let err = pods
            .logs("p", &params)
            .await
            .expect_err("a sandbox has no container log");
        let text = err.to_string();
        assert!(text.contains("has no container log"), "{text}");
        assert!(
            matches!(err, kube::Error::Api(ref ae) if ae.code == 400),
            "{err:?}"
        );
    }

    // Direct callers: anonymous 401, a stranger 403 (naming the user), for
    // every route but /healthz, exec and port-forward included.
    let port = api.addr.port();
    let direct = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let url = format!("https://127.0.0.1:{port}/pods");
    let resp = direct.get(&url).send().await.expect("anonymous request");
    assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);
    let exec_path = format!("/exec/{ns}/p/c?command=true&output=1");
    let pf_path = format!("/portForward/{ns}/p");
    let exec_h = [("X-Stream-Protocol-Version", "v4.channel.k8s.io")];
    let pf_h = [("X-Stream-Protocol-Version", "portforward.k8s.io")];
    let refused = |r: Result<support::spdy::Client, support::spdy::Head>| match r {
        Ok(_) => panic!("upgraded without credentials"),
        Err(h) => h,
    };
    for (path, h) in [(&exec_path, &exec_h), (&pf_path, &pf_h)] {
        let head = refused(support::spdy::connect(port, "POST", path, h).await);
        assert_eq!(head.status, 401, "anonymous {path}: {}", head.text);
    }
    let token = support::rbac::sa_token(&cluster.client, &ns, "stranger").await;
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
    let bearer = format!("Bearer {token}");
    for (path, proto) in [(&exec_path, &exec_h[0]), (&pf_path, &pf_h[0])] {
        let h = [*proto, ("Authorization", bearer.as_str())];
        let head = refused(support::spdy::connect(port, "POST", path, &h).await);
        assert_eq!(head.status, 403, "stranger {path}: {}", head.text);
        assert!(
            head.text.contains("subresource(s)=[proxy]"),
            "{}",
            head.text
        );
    }
    // `get` on nodes/proxy reads /pods but opens no stream (a WebSocket
    // upgrade is a GET); `create` does.
    let node_proxy = |verb: &str| json!({"apiGroups": [""], "resources": ["nodes/proxy"], "resourceNames": [node], "verbs": [verb]});
    let get_role = support::rbac::grant(&cluster.client, &ns, "proxy-get", node_proxy("get")).await;
    let create_role =
        support::rbac::grant(&cluster.client, &ns, "proxy-create", node_proxy("create")).await;
    let reader = support::rbac::sa_token(&cluster.client, &ns, "proxy-get").await;
    let opener = support::rbac::sa_token(&cluster.client, &ns, "proxy-create").await;
    support::wait_for("the get grant", Duration::from_secs(30), || async {
        let r = direct
            .get(&url)
            .bearer_auth(&reader)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        (r.status() == reqwest::StatusCode::OK)
            .then_some(())
            .ok_or(format!("{}", r.status()))
    })
    .await;
    let reader_h = format!("Bearer {reader}");
    let opener_h = format!("Bearer {opener}");
    for (path, proto) in [(&exec_path, &exec_h[0]), (&pf_path, &pf_h[0])] {
        let h = [*proto, ("Authorization", reader_h.as_str())];
        let head = refused(support::spdy::connect(port, "POST", path, &h).await);
        assert_eq!(head.status, 403, "get-only {path}: {}", head.text);
        assert!(head.text.contains("verb=create"), "{}", head.text);
        let h = [*proto, ("Authorization", opener_h.as_str())];
        // Authorized: the upgrade happens (the decision may take a moment
        // to propagate; a 403 is cached for 30 s, so wait for it here).
        let mut upgraded = false;
        for _ in 0..40 {
            match support::spdy::connect(port, "POST", path, &h).await {
                Ok(_) => {
                    upgraded = true;
                    break;
                }
                Err(head) => assert_eq!(head.status, 403, "{}", head.text),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert!(upgraded, "create on nodes/proxy opens {path}");
    }
    for role in [&get_role, &create_role] {
        support::rbac::revoke(&cluster.client, role).await;
    }
    let healthz = format!("https://127.0.0.1:{port}/healthz");
    let resp = direct.get(&healthz).send().await.expect("healthz");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);

    // kubectl through the apiserver: port-forward reaches the guest port;
    // exec, attach and logs fail with their reasons.
    let kubectl = support::kubectl::path();
    if kubectl.is_file() {
        let base = ["-n", ns.as_str()];
        let cases: [(&[&str], &str); 5] = [
            (&["exec", "q", "--", "true"], "has no sandbox"),
            (&["exec", "-i", "q", "--", "sh"], "has no sandbox"),
            (
                &["exec", "p", "--", "true"],
                "cannot reach the sandbox's guest agent",
            ),
            (&["attach", "p"], "no container process to attach to"),
            (&["logs", "p"], "has no container log"),
        ];
        for (case, want) in cases {
            let args: Vec<&str> = base.iter().chain(case.iter()).copied().collect();
            // WebSocket (kubectl's default) and SPDY (its fallback).
            for env in [
                &[][..],
                &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")][..],
            ] {
                let ran = support::kubectl::run_with(
                    &cluster.kubeconfig,
                    &args,
                    None,
                    env,
                    Duration::from_secs(60),
                )
                .await;
                let out = format!("{}{}", ran.stdout_text(), ran.stderr);
                eprintln!("kubectl {case:?} {env:?}: {}", out.trim());
                assert_ne!(ran.code, Some(0), "kubectl {case:?} must fail: {out}");
                assert!(out.contains(want), "kubectl {case:?} {env:?}: {out}");
                assert!(
                    !out.contains("Internal error"),
                    "kubectl {case:?} {env:?}: {out}"
                );
            }
        }
        let local = support::process::free_port();
        let mut pf = tokio::process::Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["-n", &ns, "port-forward", "pod/p", &format!("{local}:8080")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("kubectl port-forward");
        let echoed = support::wait_for("port-forward to echo", Duration::from_secs(30), || async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut c = tokio::net::TcpStream::connect(("127.0.0.1", local))
                .await
                .map_err(|e| e.to_string())?;
            c.write_all(b"ping").await.map_err(|e| e.to_string())?;
            let mut buf = [0u8; 4];
            tokio::time::timeout(Duration::from_secs(5), c.read_exact(&mut buf))
                .await
                .map_err(|_| "no echo".to_string())?
                .map_err(|e| e.to_string())?;
            Ok(buf)
        })
        .await;
        assert_eq!(&echoed, b"ping");
        let _ = pf.kill().await;
        assert!(plane.opened.lock().unwrap().contains(&8080));
    } else {
        eprintln!("SKIPPED kubectl part: no kubectl at {}", kubectl.display());
    }

    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    cluster.drop_namespace(&ns).await;
    api.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), api.task).await;
}
