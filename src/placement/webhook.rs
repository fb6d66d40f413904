//! The mutating admission webhook for sandbox Pods (docs/placement.md):
//! `POST /mutate-pods` takes an `AdmissionReview` of a Pod being created
//! and answers with [`decide`]'s JSON patch; `GET /healthz` says it is up.
//! Served over TLS with its own certificate pair, on `--webhook-addr`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use tracing::{debug, info, warn};

use super::decide::{Decision, Lookup, Placement, Settings, Tolerations, decide, key};
use super::watch::Index;

/// The path the webhook configuration names.
pub const PATH: &str = "/mutate-pods";

/// What the handler needs.
#[derive(Debug)]
pub struct Webhook {
    pub index: Arc<Index>,
    pub settings: Settings,
}

pub fn router(webhook: Arc<Webhook>) -> Router {
    Router::new()
        .route(PATH, post(mutate))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(webhook)
}

async fn mutate(
    State(webhook): State<Arc<Webhook>>,
    body: Bytes,
) -> axum::Json<AdmissionReview<DynamicObject>> {
    axum::Json(review(&body, &webhook.index, webhook.settings))
}

/// The answer to one `AdmissionReview` body. Anything but a Pod create is
/// allowed unchanged; a body that is not a review is answered `invalid`
/// (the apiserver then applies the failure policy).
pub fn review(body: &[u8], index: &Index, settings: Settings) -> AdmissionReview<DynamicObject> {
    let request: AdmissionRequest<Pod> = match serde_json::from_slice::<AdmissionReview<Pod>>(body)
        .map_err(|e| e.to_string())
        .and_then(|r| {
            r.try_into()
                .map_err(|e: kube::core::admission::ConvertAdmissionReviewError| e.to_string())
        }) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "placement webhook: not an AdmissionReview");
            return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}"))
                .into_review();
        }
    };
    let response = AdmissionResponse::from(&request);
    let (Operation::Create, Some(pod)) = (&request.operation, request.object.as_ref()) else {
        return response.into_review();
    };
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let lookup = match key(pod, namespace) {
        Some(k) => index.lookup(&k),
        None => Lookup::Held(Vec::new()),
    };
    let decision = decide(pod, &lookup, settings);
    let Decision::Mutate {
        patch,
        placement,
        tolerations,
    } = &decision
    else {
        return response.into_review();
    };
    let who = key(pod, namespace).unwrap_or_else(|| format!("{namespace}/{}", request.name));
    match placement {
        Placement::Pinned(nodes) => {
            info!(pod = %who, ?nodes, "placement: pinned to the node holding its VM")
        }
        Placement::Unknown => {
            warn!(pod = %who, "placement: the NodeInventory index has not listed yet; not placed")
        }
        other => debug!(pod = %who, placement = ?other, "placement: not pinned"),
    }
    let mut response = response;
    response
        .audit_annotations
        .insert("placement".into(), describe(placement));
    if *tolerations == Tolerations::LimitedByPod {
        response.warnings = Some(vec![
            "a toleration of this Pod limits how long it tolerates node.kubernetes.io/unreachable \
             or not-ready (tolerationSeconds): an outage of the node agent evicts it after that"
                .into(),
        ]);
    }
    if patch.is_empty() {
        return response.into_review();
    }
    let parsed: Result<json_patch::Patch, _> =
        serde_json::from_value(serde_json::Value::Array(patch.clone()));
    match parsed
        .map_err(|e| e.to_string())
        .and_then(|p| response.clone().with_patch(p).map_err(|e| e.to_string()))
    {
        Ok(r) => r.into_review(),
        Err(e) => {
            // Never reached with the patches decide builds; the Pod is
            // then admitted as it is.
            warn!(pod = %who, error = %e, "placement: the patch could not be encoded; Pod admitted unchanged");
            response.into_review()
        }
    }
}

/// The audit annotation's value.
fn describe(placement: &Placement) -> String {
    match placement {
        Placement::Pinned(nodes) => format!("pinned to {}", nodes.join(",")),
        Placement::Unheld => "its VM is on no node".into(),
        Placement::AlreadyBound(node) => format!("already bound to {node}"),
        Placement::NoKey => "no name yet".into(),
        Placement::Unknown => "index not synced".into(),
        Placement::AlreadyPinned => "already pinned".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn body(operation: &str, pod: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "requestResource": {"group": "", "version": "v1", "resource": "pods"},
                "name": "a", "namespace": "ns", "operation": operation,
                "userInfo": {"username": "system:serviceaccount:agent-sandbox-system:controller"},
                "object": pod,
                "oldObject": null, "dryRun": false,
            }
        }))
        .unwrap()
    }

    fn pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "a", "annotations": {"sandbox.cocoonstack.io/runtime": "sandboxd"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        })
    }

    fn synced_index(node: &str, key: &str) -> Index {
        let index = Index::default();
        index.apply(Event::Init);
        index.apply(Event::InitApply(
            serde_json::from_value(json!({
                "apiVersion": "sandbox.cocoonstack.io/v1beta1", "kind": "NodeInventory",
                "metadata": {"name": node}, "node": node,
                "entries": [{"name": key, "phase": "Hibernated", "claimRef": key, "addr": "10.0.0.1"}],
            }))
            .unwrap(),
        ));
        index.apply(Event::InitDone);
        index
    }

    /// The response as the apiserver reads it, and its decoded patch
    /// (kube writes the bytes as a JSON array of numbers, which the
    /// apiserver's decoder takes for a []byte as well as base64).
    fn answer(review: AdmissionReview<DynamicObject>) -> (serde_json::Value, serde_json::Value) {
        let v = serde_json::to_value(review).unwrap();
        let patch = match &v["response"]["patch"] {
            serde_json::Value::Null => serde_json::Value::Null,
            bytes => {
                let raw: Vec<u8> = serde_json::from_value(bytes.clone()).unwrap();
                serde_json::from_slice(&raw).unwrap()
            }
        };
        (v, patch)
    }

    #[test]
    fn a_create_of_a_held_key_is_pinned_in_a_json_patch() {
        let index = synced_index("node-b", "ns/a");
        let (v, patch) = answer(review(
            &body("CREATE", pod()),
            &index,
            Settings { tolerations: true },
        ));
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(v["response"]["patchType"], "JSONPatch");
        assert_eq!(
            v["response"]["auditAnnotations"]["placement"],
            "pinned to node-b"
        );
        let paths: Vec<&str> = patch
            .as_array()
            .unwrap()
            .iter()
            .map(|op| op["path"].as_str().unwrap())
            .collect();
        assert_eq!(paths, vec!["/spec/tolerations", "/spec/affinity"]);
    }

    #[test]
    fn other_operations_and_unknown_keys_pass_unpatched() {
        let index = synced_index("node-b", "ns/other");
        for (op, tolerations) in [("UPDATE", true), ("DELETE", true), ("CREATE", false)] {
            let (v, patch) = answer(review(&body(op, pod()), &index, Settings { tolerations }));
            assert_eq!(v["response"]["allowed"], true, "{op}");
            assert!(patch.is_null(), "{op}: {patch}");
        }
        // Not synced: tolerations only.
        let (v, patch) = answer(review(
            &body("CREATE", pod()),
            &Index::default(),
            Settings { tolerations: true },
        ));
        assert_eq!(
            v["response"]["auditAnnotations"]["placement"],
            "index not synced"
        );
        assert_eq!(patch.as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_body_that_is_no_review_is_answered_invalid() {
        let (v, _) = answer(review(
            b"{}",
            &Index::default(),
            Settings { tolerations: true },
        ));
        assert_eq!(v["response"]["allowed"], false);
    }
}
