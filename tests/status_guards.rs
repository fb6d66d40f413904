//! The guards on Pod status writes (`src/pods/writes.rs`) against the real
//! apiserver: how it refuses a write meant for another Pod (same name, new
//! UID: 422 on `metadata.uid`) or for an older version (409), and that
//! vk-sandbox reads those refusals as "gone" and "conflict". The unit tests
//! use hand-written `Status` bodies; this proves the mapping against the
//! apiserver the bodies were copied from.

mod support;

use k8s_openapi::api::core::v1::Pod as K8sPod;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use vk_sandbox::metrics::Metrics;
use vk_sandbox::pods::pod::Pod;
use vk_sandbox::pods::writes::{Guard, Written, write_status};

fn pod(name: &str) -> K8sPod {
    support::from_json(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        // No scheduler picks it up: no node of another test acts on it.
        "spec": {"schedulerName": "vk-sandbox-test-unscheduled",
                 "containers": [{"name": "c", "image": "base:24.04"}]},
    }))
}

/// The lean Pod vk-sandbox decides from, as the watch would bring it.
fn lean(p: &K8sPod) -> Pod {
    support::from_json(serde_json::to_value(p).expect("pod json"))
}

/// A status vk-sandbox could write (and that differs from a new Pod's).
fn running(ip: &str) -> serde_json::Value {
    json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// Deletes the Pod `name` at once and waits until it is gone.
async fn delete_now(api: &Api<K8sPod>, name: &str) {
    api.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    support::wait_for(
        "the Pod gone",
        std::time::Duration::from_secs(30),
        || async {
            match api.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_string()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
}

async fn recreate(api: &Api<K8sPod>, name: &str) -> K8sPod {
    let old = api.get(name).await.expect("get");
    delete_now(api, name).await;
    let new = api
        .create(&PostParams::default(), &pod(name))
        .await
        .expect("create the successor");
    assert_ne!(new.metadata.uid, old.metadata.uid);
    new
}

#[tokio::test(flavor = "multi_thread")]
async fn status_write_refusals_read_as_gone_or_conflict() {
    let Some(cluster) = support::cluster().await else {
        return;
    };
    let ns = cluster.namespace("guards").await;
    let api: Api<K8sPod> = Api::namespaced(cluster.client.clone(), &ns);
    let metrics = Metrics::new().expect("metrics");
    let client = &cluster.client;

    // A version read earlier: any newer one refuses a Fresh write (409),
    // and the Pod keeps the newer version's status.
    let first = api
        .create(&PostParams::default(), &pod("p"))
        .await
        .expect("create");
    let stale = lean(&first);
    api.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"bumped": "1"}}})),
    )
    .await
    .expect("bump the resourceVersion");
    let got = write_status(client, &metrics, &stale, &running("10.0.0.1"), Guard::Fresh)
        .await
        .expect("a refusal is not an error");
    assert_eq!(got, Written::Conflict);
    let now = api.get("p").await.expect("get");
    assert_ne!(
        now.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        Some("10.0.0.1"),
        "the stale write landed"
    );
    // The UID guard alone lets a write computed from an older version of
    // the same Pod through.
    let got = write_status(client, &metrics, &stale, &running("10.0.0.2"), Guard::Uid)
        .await
        .expect("write");
    assert!(matches!(got, Written::Stored(_)), "{got:?}");

    // A same-name successor refuses the predecessor's write (422 on
    // metadata.uid): "gone", and the successor's status is untouched.
    let before = lean(&api.get("p").await.expect("get"));
    let successor = recreate(&api, "p").await;
    let got = write_status(client, &metrics, &before, &running("10.0.0.3"), Guard::Uid)
        .await
        .expect("a refusal is not an error");
    assert_eq!(got, Written::Gone);
    // With the resourceVersion as well, the apiserver checks that first:
    // a conflict (harmless: decided again from the watch).
    let got = write_status(
        client,
        &metrics,
        &before,
        &running("10.0.0.4"),
        Guard::Fresh,
    )
    .await
    .expect("a refusal is not an error");
    assert!(
        matches!(got, Written::Conflict | Written::Gone),
        "a write for the predecessor must never land: {got:?}"
    );
    let now = api.get("p").await.expect("get");
    assert_eq!(now.metadata.uid, successor.metadata.uid);
    assert!(
        now.status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .is_none(),
        "the predecessor's status landed on the successor: {:?}",
        now.status
    );

    // No Pod of that name at all: 404, "gone".
    let current = lean(&now);
    delete_now(&api, "p").await;
    let got = write_status(client, &metrics, &current, &running("10.0.0.5"), Guard::Uid)
        .await
        .expect("a refusal is not an error");
    assert_eq!(got, Written::Gone);
    cluster.drop_namespace(&ns).await;
}
