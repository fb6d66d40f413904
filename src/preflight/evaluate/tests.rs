use super::*;
use crate::preflight::Status;
use crate::sandboxd::{NodeInfo, PoolInfo};
use std::path::PathBuf;

#[test]
fn apiserver_lines() {
    let v = Ok("v1.33.4".to_string());
    let ok = apiserver("https://a:6443", "kubeconfig /k", &v, &Ok("alice".into()));
    assert_eq!(ok.status, Status::Ok);
    assert!(ok.detail.contains("authenticated as alice"), "{ok:?}");

    let rejected_early = apiserver(
        "https://a:6443",
        "kubeconfig /k",
        &Err(ApiError::Status {
            code: 401,
            message: "Unauthorized".into(),
        }),
        &Err(ApiError::Timeout),
    );
    assert_eq!(rejected_early.status, Status::Fail);
    assert!(rejected_early.detail.contains("rejected the credentials"));

    let unreachable = apiserver(
        "https://a:6443",
        "kubeconfig /k",
        &Err(ApiError::Other("connection refused".into())),
        &Err(ApiError::Timeout),
    );
    assert_eq!(unreachable.status, Status::Fail);
    assert!(unreachable.detail.contains("connection refused"));

    let rejected = apiserver(
        "https://a:6443",
        "kubeconfig /k",
        &v,
        &Err(ApiError::Status {
            code: 401,
            message: "Unauthorized".into(),
        }),
    );
    assert_eq!(rejected.status, Status::Fail);
    assert!(
        rejected
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("--kubeconfig"))
    );

    let old = apiserver(
        "https://a:6443",
        "kubeconfig /k",
        &v,
        &Err(ApiError::Status {
            code: 404,
            message: "not found".into(),
        }),
    );
    assert_eq!(old.status, Status::Ok);
}

fn served(gs: &[(&str, &[&str])]) -> Result<Vec<(String, Vec<String>)>, ApiError> {
    Ok(gs
        .iter()
        .map(|(g, v)| (g.to_string(), v.iter().map(|s| s.to_string()).collect()))
        .collect())
}

/// The line from discovery, as the probe builds it.
fn crd_line(flag: Option<&str>, got: Result<Vec<(String, Vec<String>)>, ApiError>) -> CheckResult {
    let v1beta1: Vec<String> = got
        .iter()
        .flatten()
        .filter(|(_, v)| v.iter().any(|v| v == "v1beta1"))
        .map(|(g, _)| g.clone())
        .collect();
    let choice = crate::inventory::groups::choose(flag, &v1beta1);
    inventory_crd(true, flag, &got, Some(&choice))
}

#[test]
fn crd_lines() {
    let d = "sandbox.cocoonstack.io";
    let x = "extensions.agents.x-k8s.io";
    assert_eq!(
        inventory_crd(false, None, &Ok(vec![]), None).status,
        Status::Ok
    );

    // With --inventory-group: that group only.
    let missing = crd_line(Some(d), served(&[(d, &[]), (x, &["v1beta1"])]));
    assert_eq!(missing.status, Status::Fail);
    assert!(
        missing
            .detail
            .contains("nodeinventories.sandbox.cocoonstack.io")
    );
    assert!(
        missing
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("--inventory-group"))
    );
    assert_eq!(
        crd_line(Some(d), served(&[(d, &["v1beta1"])])).status,
        Status::Ok
    );
    assert_eq!(
        crd_line(Some(d), served(&[(d, &["v1"])])).status,
        Status::Fail
    );
    assert_eq!(
        crd_line(Some(d), Err(ApiError::Timeout)).status,
        Status::Fail
    );

    // Without it: where the CRD is served, named.
    let ext = crd_line(None, served(&[(d, &[]), (x, &["v1beta1"])]));
    assert_eq!(ext.status, Status::Ok);
    assert!(
        ext.detail
            .contains("nodeinventories.extensions.agents.x-k8s.io")
            && !ext.detail.contains("nodeinventories.sandbox"),
        "{}",
        ext.detail
    );
    let both = crd_line(None, served(&[(d, &["v1beta1"]), (x, &["v1beta1"])]));
    assert!(both.detail.contains(" and "), "{}", both.detail);
    let none = crd_line(None, served(&[(d, &[]), (x, &[])]));
    assert_eq!(none.status, Status::Fail);
    assert!(none.detail.contains("neither"), "{}", none.detail);
    let old = crd_line(None, served(&[(d, &[]), (x, &["v1alpha1"])]));
    assert_eq!(old.status, Status::Fail);
    assert!(old.detail.contains("only as v1alpha1"), "{}", old.detail);
    assert_eq!(crd_line(None, Err(ApiError::Timeout)).status, Status::Fail);
}

#[test]
fn stale_inventory_lines() {
    let found = vec![
        ("a.example".to_string(), Ok(None)),
        (
            "b.example".to_string(),
            Ok(Some(vec!["vk-sandbox".to_string()])),
        ),
        ("c.example".to_string(), Err(ApiError::Timeout)),
    ];
    let lines = inventory_stale("n1", &found);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0].status, Status::Warn);
    assert!(
        lines[0].detail.contains("nodeinventories.b.example/n1"),
        "{:?}",
        lines[0]
    );
    assert!(lines[0].detail.contains("vk-sandbox"), "{:?}", lines[0]);
    assert!(
        lines[0]
            .fix
            .as_deref()
            .is_some_and(|f| f.contains("kubectl delete nodeinventories.b.example n1")),
        "{:?}",
        lines[0]
    );
    assert_eq!(lines[1].status, Status::Warn);
    assert!(lines[1].detail.contains("c.example"), "{:?}", lines[1]);
}

fn node(labels: serde_json::Value) -> Node {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "n", "labels": labels}
    }))
    .expect("node")
}

#[test]
fn node_name_lines() {
    assert_eq!(node_name("n", &Ok(None)).status, Status::Ok);
    let virt = node_name(
        "n",
        &Ok(Some(node(serde_json::json!({"type": "virtual-kubelet"})))),
    );
    assert_eq!(virt.status, Status::Ok);
    assert!(virt.detail.contains("adopted"));
    let phys = node_name(
        "n",
        &Ok(Some(node(
            serde_json::json!({"kubernetes.io/hostname": "n"}),
        ))),
    );
    assert_eq!(phys.status, Status::Fail);
    assert!(
        phys.fix
            .as_deref()
            .is_some_and(|f| f.contains("VK_NODE_NAME"))
    );
    assert!(
        phys.fix
            .as_deref()
            .is_some_and(|f| f.contains("n-sandboxd"))
    );
    let forbidden = node_name(
        "n",
        &Err(ApiError::Status {
            code: 403,
            message: "forbidden".into(),
        }),
    );
    assert_eq!(forbidden.status, Status::Fail);
}

fn pool(template: &str, warm: u64, target: u64) -> PoolInfo {
    serde_json::from_value(serde_json::json!({
        "key": {"template": template, "net": "none", "size": "small"},
        "warm": warm, "target": target
    }))
    .expect("pool info")
}

fn info(pools: Vec<PoolInfo>) -> NodeInfo {
    NodeInfo {
        pools,
        claimed: 1,
        hibernated: 0,
        archived: 0,
        draining: false,
        peers: vec![],
        at_capacity: false,
        at_capacity_reason: None,
    }
}

#[test]
fn sandboxd_ok_lists_pools() {
    let token = PathBuf::from("/etc/vk-sandbox/sandboxd-token");
    let r = sandboxd(
        "http://127.0.0.1:7777",
        Some(&token),
        &Ok(info(vec![pool("base:24.04", 2, 2), pool("py", 0, 1)])),
    );
    assert_eq!(r.len(), 2);
    assert_eq!(r[0].status, Status::Ok);
    assert!(r[0].detail.contains("accepted"));
    assert_eq!(r[1].status, Status::Ok);
    assert_eq!(
        r[1].detail,
        "1 of 2 warm: base:24.04 (none, small) warm 2/2; py (none, small) warm 0/1"
    );
    let cold = sandboxd("u", None, &Ok(info(vec![pool("py", 0, 1)])));
    assert_eq!(cold[1].status, Status::Warn);
    let none = sandboxd("u", None, &Ok(info(vec![])));
    assert_eq!(none[1].status, Status::Warn);
    let mut draining = info(vec![pool("py", 1, 1)]);
    draining.draining = true;
    assert_eq!(sandboxd("u", None, &Ok(draining))[0].status, Status::Warn);
}

#[test]
fn sandboxd_failures_name_the_fix() {
    let token = PathBuf::from("/t");
    let status = |status, json| SandboxdProblem::Status {
        status,
        message: if json {
            "unauthorized".into()
        } else {
            String::new()
        },
        json,
    };
    let r = sandboxd("u", Some(&token), &Err(status(401, true)));
    assert_eq!(r[0].status, Status::Fail);
    assert!(r[0].detail.contains("rejected the token"));
    assert!(r[0].fix.as_deref().is_some_and(|f| f.contains("/t")));
    assert_eq!(r[1].status, Status::Warn, "pools not checked");
    let r = sandboxd("u", None, &Err(status(401, true)));
    assert!(
        r[0].fix
            .as_deref()
            .is_some_and(|f| f.contains("SANDBOXD_TOKEN_FILE"))
    );
    let r = sandboxd("u", Some(&token), &Err(status(403, true)));
    assert!(r[0].detail.contains("not the node (root) token"));
    let r = sandboxd("u", None, &Err(status(404, false)));
    assert!(
        r[0].fix
            .as_deref()
            .is_some_and(|f| f.contains("--sandboxd-url"))
    );
    let r = sandboxd(
        "u",
        None,
        &Err(SandboxdProblem::Unreachable("connection refused".into())),
    );
    assert!(r[0].detail.contains("cannot reach sandboxd"));
}

#[test]
fn port_lines_and_clashes() {
    let a = ListenAddr::parse("127.0.0.1:10260").expect("addr");
    assert_eq!(
        port("kubelet port", "listen-addr", "VK_LISTEN_ADDR", &a, &Ok(())).status,
        Status::Ok
    );
    let used = port(
        "kubelet port",
        "listen-addr",
        "VK_LISTEN_ADDR",
        &a,
        &Err((ErrorKind::AddrInUse, "in use".into())),
    );
    assert_eq!(used.status, Status::Fail);
    assert!(used.detail.contains("already in use"));
    assert!(
        used.fix
            .as_deref()
            .is_some_and(|f| f.contains("VK_LISTEN_ADDR"))
    );
    let any = ListenAddr::parse(":10260").expect("addr");
    let other_port = ListenAddr::parse(":10261").expect("addr");
    let other_host = ListenAddr::parse("127.0.0.2:10260").expect("addr");
    assert!(ports_clash(&a, &any));
    assert!(ports_clash(&a, &a));
    assert!(!ports_clash(&a, &other_port));
    assert!(!ports_clash(&a, &other_host));
}

#[test]
fn webhook_pair_lines() {
    let (cert, key) = (PathBuf::from("/w/tls.crt"), PathBuf::from("/w/tls.key"));
    let ok = webhook_pair(&cert, &key, &Ok(2));
    assert_eq!(ok.status, Status::Ok);
    assert!(ok.detail.contains("2 certificate(s)"), "{ok:?}");
    let bad = webhook_pair(
        &cert,
        &key,
        &Err("the key does not fit the certificate".into()),
    );
    assert_eq!(bad.status, Status::Fail);
    assert!(bad.detail.contains("does not fit"), "{bad:?}");
    assert!(
        bad.fix
            .as_deref()
            .is_some_and(|f| f.contains("--webhook-tls-cert")),
        "{bad:?}"
    );
}
