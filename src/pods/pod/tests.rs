use kube::Resource;
use serde_json::{Value, json};

use super::*;

/// A Pod as the apiserver sends it: managedFields, a projected token
/// volume, env, tolerations, server defaults in spec and status.
fn server_pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
            "generateName": "p-", "generation": 1,
            "selfLink": "/api/v1/namespaces/ns/pods/p",
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"app": "a"},
            "annotations": {"sandbox.cocoonstack.io/template": "base:24.04"},
            "ownerReferences": [{"apiVersion": "agents.x-k8s.io/v1alpha1", "kind": "Sandbox",
                "name": "s", "uid": "o", "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["example.com/hold"],
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}],
        },
        "spec": {
            "nodeName": "vk", "restartPolicy": "Never", "schedulerName": "default-scheduler",
            "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 30,
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                "effect": "NoExecute", "tolerationSeconds": 300}],
            "containers": [{"name": "agent", "image": "base:24.04",
                "env": [{"name": "K", "value": "V"}],
                "resources": {"limits": {"cpu": "1"}},
                "terminationMessagePath": "/dev/termination-log",
                "volumeMounts": [{"name": "tok", "mountPath": "/var/run/secrets"}]}],
            "initContainers": [{"name": "init", "image": "busybox"}],
            "volumes": [{"name": "tok", "projected": {"sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}],
        },
        "status": {
            "phase": "Running", "qosClass": "Burstable",
            "hostIP": "10.0.0.5", "hostIPs": [{"ip": "10.0.0.5"}],
            "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}],
            "startTime": "2026-12-01T10:00:01Z",
            "conditions": [{"type": "Ready", "status": "True",
                "lastProbeTime": null, "lastTransitionTime": "2026-12-01T10:00:01Z"}],
            "containerStatuses": [{"name": "agent", "ready": true, "started": true,
                "restartCount": 0, "image": "base:24.04", "imageID": "sandboxd://sb_1",
                "lastState": {}, "state": {"running": {"startedAt": "2026-12-01T10:00:01Z"}}}],
        }
    })
}

#[test]
fn keeps_what_vk_sandbox_reads_and_drops_the_rest() {
    let full: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(server_pod()).expect("k8s-openapi pod");
    let lean: Pod = serde_json::from_value(server_pod()).expect("lean pod");

    // Metadata: all but managedFields and selfLink, exactly as decoded by
    // k8s-openapi.
    let mut meta = full.metadata.clone();
    assert!(meta.managed_fields.is_some() && meta.self_link.is_some());
    meta.managed_fields = None;
    meta.self_link = None;
    assert_eq!(lean.metadata, meta);

    let spec = lean.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("vk"));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.containers,
        vec![Container {
            name: "agent".into(),
            image: Some("base:24.04".into()),
            ports: Vec::new(),
        }]
    );

    let st = lean.status.as_ref().expect("status");
    let fst = full.status.as_ref().expect("status");
    assert_eq!(st.phase, fst.phase);
    assert_eq!(st.pod_ip, fst.pod_ip);
    assert_eq!(st.host_ip, fst.host_ip);
    assert_eq!(st.pod_ips, fst.pod_ips);
    assert_eq!(st.host_ips, fst.host_ips);
    assert_eq!(st.start_time, fst.start_time);
    assert_eq!(st.conditions, fst.conditions);
    let cs = &st.container_statuses.as_ref().expect("statuses")[0];
    let fcs = &fst.container_statuses.as_ref().expect("statuses")[0];
    assert_eq!(
        (
            &cs.name,
            cs.ready,
            cs.started,
            cs.restart_count,
            &cs.image,
            &cs.image_id,
            &cs.state
        ),
        (
            &fcs.name,
            fcs.ready,
            fcs.started,
            fcs.restart_count,
            &fcs.image,
            &fcs.image_id,
            &fcs.state
        )
    );

    // Serialized (the kubelet API's /pods): a v1 Pod without what was
    // dropped.
    let out = serde_json::to_value(&lean).expect("json");
    assert_eq!(
        (out["apiVersion"].clone(), out["kind"].clone()),
        (json!("v1"), json!("Pod"))
    );
    for gone in [
        "/metadata/managedFields",
        "/metadata/selfLink",
        "/spec/volumes",
        "/spec/tolerations",
        "/spec/initContainers",
        "/spec/containers/0/env",
        "/spec/containers/0/volumeMounts",
        "/status/qosClass",
        "/status/containerStatuses/0/lastState",
    ] {
        assert!(
            out.pointer(gone).is_none(),
            "{gone} should be dropped: {out}"
        );
    }
    // What is kept reads back the same through k8s-openapi.
    let again: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(out).expect("a valid v1 Pod");
    assert_eq!(again.metadata, meta);
    assert_eq!(again.status.and_then(|s| s.conditions), fst.conditions);
}

#[test]
fn an_echo_of_the_running_write_is_not_drift() {
    // The apiserver's copy after our Running patch, with the fields it
    // adds itself; decoded lean it must still cover the patch, or every
    // echo would be written again.
    let mut server = server_pod();
    let view = crate::pods::status::ClaimView {
        id: "sb_1",
        ip: Some("10.0.0.5".into()),
        claimed_at: "2026-12-01T10:00:01Z".parse().expect("time"),
        deadline: None,
    };
    let lean: Pod = serde_json::from_value(server.clone()).expect("lean");
    let patch = crate::pods::status::running(&lean, &view);
    json_patch::merge(&mut server, &patch);
    server["status"]["conditions"][0]["lastTransitionTime"] = json!("2026-12-01T10:00:02Z");
    let echoed: Pod = serde_json::from_value(server).expect("lean");
    assert!(!crate::pods::status::changes(&echoed, &patch));
    // And a Pod that is not Running yet does need the write.
    let mut pending = echoed.clone();
    pending.status = None;
    assert!(crate::pods::status::changes(&pending, &patch));
}

#[test]
fn a_pod_with_nothing_but_a_name_decodes() {
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("pod");
    assert_eq!(p.metadata.name.as_deref(), Some("p"));
    assert_eq!((p.spec, p.status), (None, None));
    let bad = serde_json::from_value::<Pod>(json!({"metadata": {"name": 7}}));
    assert!(bad.is_err(), "a malformed field is an error, not a default");
}

#[test]
fn is_the_core_v1_pods_resource() {
    assert_eq!(Pod::url_path(&(), Some("ns")), "/api/v1/namespaces/ns/pods");
    let p: Pod = serde_json::from_value(server_pod()).expect("pod");
    let r = p.object_ref(&());
    assert_eq!(
        (
            r.api_version.as_deref(),
            r.kind.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref()
        ),
        (Some("v1"), Some("Pod"), Some("p"), Some("u-1"))
    );
}

#[test]
fn resource_versions_order_as_decimal_numbers_or_not_at_all() {
    use std::cmp::Ordering::*;
    for (a, b, want) in [
        ("10", "9", Some(Greater)),
        ("9", "10", Some(Less)),
        ("123", "124", Some(Less)),
        ("124", "124", Some(Equal)),
        ("0", "1", Some(Less)),
        (
            "1000000000000000000000",
            "999999999999999999999",
            Some(Greater),
        ),
        // Not decimal numbers: no order is assumed.
        ("", "1", None),
        ("1", "", None),
        ("01", "2", None),
        ("2", "01", None),
        ("abc", "1", None),
        ("1", "1a", None),
        ("-1", "1", None),
    ] {
        assert_eq!(version_order(a, b), want, "{a:?} vs {b:?}");
    }
}

#[test]
fn newer_means_the_same_pod_at_a_later_version() {
    let at = |uid: Option<&str>, rv: Option<&str>| {
        let mut p = Pod::default();
        p.metadata.uid = uid.map(Into::into);
        p.metadata.resource_version = rv.map(Into::into);
        p
    };
    let v9 = at(Some("u"), Some("9"));
    let v10 = at(Some("u"), Some("10"));
    assert!(v10.is_newer_than(&v9));
    assert!(!v9.is_newer_than(&v10));
    assert!(!v10.is_newer_than(&v10.clone()));
    // Another Pod of the same name is never "newer".
    assert!(!at(Some("w"), Some("10")).is_newer_than(&v9));
    assert!(!at(None, Some("10")).is_newer_than(&at(None, Some("9"))));
    // Versions that cannot be ordered.
    assert!(!at(Some("u"), Some("x")).is_newer_than(&v9));
    assert!(!at(Some("u"), None).is_newer_than(&v9));
    assert!(!v10.is_newer_than(&at(Some("u"), None)));
}

fn pod_of(v: Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

#[test]
fn grace_zero_means_the_apiserver_removes_it_for_a_while() {
    let at: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().expect("ts");
    let after = |secs: i64| at + jiff::SignedDuration::from_secs(secs);
    let mut p = pod_of(json!({"metadata": {"name": "p", "uid": "u",
        "deletionTimestamp": "2026-01-01T00:00:00Z"}}));
    p.metadata.deletion_grace_period_seconds = Some(30);
    assert!(!p.removal_pending(after(1)));
    p.metadata.deletion_grace_period_seconds = Some(0);
    assert!(p.removal_pending(after(0)));
    assert!(p.removal_pending(after(9)));
    // Still there 10 s on: the removal was cut half-way; delete again.
    assert!(!p.removal_pending(after(10)));
    assert!(!p.removal_pending(after(3600)));
    // Not deleting at all: never pending, whatever the field says.
    let mut live = pod_of(json!({"metadata": {"name": "p", "uid": "u"}}));
    live.metadata.deletion_grace_period_seconds = Some(0);
    assert!(!live.removal_pending(after(1)));
}

#[test]
fn key_uid_annotations_and_predicates() {
    let p = pod_of(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u",
            "annotations": {"a": "x", "empty": ""}},
        "spec": {"restartPolicy": "Never"},
        "status": {"phase": "Failed", "containerStatuses": [
            {"name": "c", "state": {"terminated": {"exitCode": 0}}}]},
    }));
    assert_eq!((p.key(), p.uid()), ("ns/p".to_string(), "u"));
    assert_eq!(
        (p.annotation("a"), p.annotation("empty"), p.annotation("b")),
        (Some("x"), None, None)
    );
    assert!(p.terminal() && p.never_restarts() && !p.has_running_container());
    let bare = pod_of(
        json!({"metadata": {"name": "q"}, "status": {"phase": "Succeeded",
        "containerStatuses": [{"name": "c"}]}}),
    );
    assert_eq!((bare.key(), bare.uid()), ("default/q".to_string(), ""));
    assert!(bare.terminal() && !bare.never_restarts());
    assert!(
        bare.has_running_container(),
        "a status with no state counts as running"
    );
    let running = pod_of(json!({"status": {"phase": "Running"}}));
    assert!(!running.terminal() && !running.has_running_container());
    assert_eq!(key_of(None, "x"), "default/x");
}

#[test]
fn the_cache_replaces_our_write_once_it_stayed_behind_long_enough() {
    assert!(cached_replaces_tracked(false, Duration::ZERO), "not older");
    assert!(
        !cached_replaces_tracked(true, Duration::ZERO),
        "the echo lags"
    );
    assert!(!cached_replaces_tracked(
        true,
        BEHIND_LIMIT - Duration::from_millis(1)
    ));
    assert!(cached_replaces_tracked(true, BEHIND_LIMIT), "etcd restored");
}
