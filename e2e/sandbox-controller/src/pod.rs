//! The Pod a Sandbox asks for, as pure functions, as the upstream
//! agent-sandbox controller makes it: name, propagated metadata, owner
//! reference, the template's spec unchanged. Plus, as an explicit opt-in
//! mode only ([`apply_runtime`]), the runtime mutator of cocoonstack's
//! sandbox-operator, which upstream agent-sandbox does not have.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use crate::types::{API_VERSION, KIND, Sandbox};

/// Sandbox annotation naming the Pod of an adopted warm Sandbox.
pub const POD_NAME_ANNOTATION: &str = "agents.x-k8s.io/pod-name";
pub const NAME_HASH_LABEL: &str = "agents.x-k8s.io/sandbox-name-hash";
pub const PROPAGATED_LABELS: &str = "agents.x-k8s.io/propagated-labels";
pub const PROPAGATED_ANNOTATIONS: &str = "agents.x-k8s.io/propagated-annotations";
/// Template keys with these prefixes are never copied onto the Pod.
pub const RESERVED_PREFIXES: [&str; 2] = ["agents.x-k8s.io/", "extensions.agents.x-k8s.io/"];

/// Pod annotation choosing the runtime; also the Node label key selecting
/// sandboxd nodes.
pub const RUNTIME_KEY: &str = "sandbox.cocoonstack.io/runtime";
pub const TEMPLATE_ANNOTATION: &str = "sandbox.cocoonstack.io/template";
pub const SANDBOXD: &str = "sandboxd";
pub const STANDARD: &str = "standard";
pub const PROVIDER_TAINT_KEY: &str = "virtual-kubelet.io/provider";

/// The operator's `--default-runtime`: the mode of Pods that neither carry
/// the runtime annotation nor set `runtimeClassName`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DefaultRuntime {
    #[default]
    Standard,
    Sandboxd,
}

impl DefaultRuntime {
    pub fn as_str(self) -> &'static str {
        match self {
            DefaultRuntime::Standard => STANDARD,
            DefaultRuntime::Sandboxd => SANDBOXD,
        }
    }
}

/// Why no Pod can be made for a Sandbox. Shown in the Sandbox's Ready
/// condition (reason `PodRejected`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("annotation {RUNTIME_KEY}=sandboxd cannot be combined with runtimeClassName {0:?}")]
    RuntimeClassConflict(String),
    #[error("sandboxd Pods are placed by the scheduler; spec.nodeName {0:?} must not be set")]
    NodeNamePinned(String),
    #[error("nodeSelector {RUNTIME_KEY}={0:?} contradicts the sandboxd runtime")]
    NodeSelectorConflict(String),
    #[error("the Sandbox has no {0}")]
    Incomplete(&'static str),
}

/// FNV-1a, 32 bits.
pub fn fnv1a32(data: &[u8]) -> u32 {
    data.iter().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

/// The value of the `agents.x-k8s.io/sandbox-name-hash` label: 8 lower-case
/// hex digits of FNV-1a-32 of the Sandbox name.
pub fn name_hash(sandbox_name: &str) -> String {
    format!("{:08x}", fnv1a32(sandbox_name.as_bytes()))
}

/// The Pod's name: the legacy `agents.x-k8s.io/pod-name` annotation (a
/// warm Pod adopted by a controller before 1.0) or the Sandbox's own name.
pub fn pod_name(sandbox: &Sandbox) -> String {
    sandbox
        .annotations()
        .get(POD_NAME_ANNOTATION)
        .filter(|n| !n.is_empty())
        .cloned()
        .unwrap_or_else(|| sandbox.name_any())
}

fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| key.starts_with(p))
}

fn unreserved(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    map.iter()
        .filter(|(k, _)| !is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn key_list(map: &BTreeMap<String, String>) -> String {
    // BTreeMap keys are already sorted.
    map.keys().cloned().collect::<Vec<_>>().join(",")
}

/// The labels and annotations the Sandbox propagates to its Pod: template
/// metadata minus reserved prefixes, the name hash, and the two
/// `propagated-*` key lists (each only when it lists something).
pub fn propagated_metadata(
    sandbox: &Sandbox,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let template = &sandbox.spec.pod_template.metadata;
    let mut labels = unreserved(&template.labels);
    let mut annotations = unreserved(&template.annotations);
    let label_keys = key_list(&labels);
    let annotation_keys = key_list(&annotations);
    labels.insert(NAME_HASH_LABEL.into(), name_hash(&sandbox.name_any()));
    if !label_keys.is_empty() {
        annotations.insert(PROPAGATED_LABELS.into(), label_keys);
    }
    if !annotation_keys.is_empty() {
        annotations.insert(PROPAGATED_ANNOTATIONS.into(), annotation_keys);
    }
    (labels, annotations)
}

/// The one owner reference of a Sandbox's Pod.
pub fn owner_reference(sandbox: &Sandbox) -> Result<OwnerReference, Rejection> {
    Ok(OwnerReference {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        name: sandbox
            .metadata
            .name
            .clone()
            .ok_or(Rejection::Incomplete("name"))?,
        uid: sandbox
            .metadata
            .uid
            .clone()
            .ok_or(Rejection::Incomplete("uid"))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Whether `pod` is controlled by this very Sandbox (same UID).
pub fn controlled_by(pod: &Pod, sandbox: &Sandbox) -> bool {
    let Some(uid) = sandbox.metadata.uid.as_deref() else {
        return false;
    };
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The Pod to create for `sandbox`: always named after the Sandbox (the
/// `pod-name` annotation only finds an existing Pod). `mutator` is the
/// opt-in runtime mutator mode with its default runtime; `None` (the
/// default, as upstream) leaves the template's spec as it is.
pub fn desired_pod(sandbox: &Sandbox, mutator: Option<DefaultRuntime>) -> Result<Pod, Rejection> {
    let (labels, annotations) = propagated_metadata(sandbox);
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(sandbox.name_any()),
            namespace: sandbox.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner_reference(sandbox)?]),
            ..ObjectMeta::default()
        },
        spec: Some(sandbox.spec.pod_template.spec.clone()),
        status: None,
    };
    if let Some(default_runtime) = mutator {
        apply_runtime(&mut pod, default_runtime)?;
    }
    Ok(pod)
}

/// sandbox-operator's runtime mutator (an opt-in mode of the stand-in,
/// `--runtime-mutator`; upstream agent-sandbox has no such thing): in
/// sandboxd mode, route the Pod to sandboxd nodes, or reject it when it
/// cannot go there. Other modes leave the Pod as it is.
pub fn apply_runtime(pod: &mut Pod, default_runtime: DefaultRuntime) -> Result<(), Rejection> {
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let spec = pod.spec.get_or_insert_with(Default::default);
    let explicit = annotations
        .get(RUNTIME_KEY)
        .filter(|v| !v.is_empty())
        .cloned();
    let runtime_class = spec.runtime_class_name.clone().filter(|v| !v.is_empty());
    let mode = match (&explicit, &runtime_class) {
        (Some(m), _) => m.as_str(),
        (None, Some(_)) => STANDARD,
        (None, None) => default_runtime.as_str(),
    };
    if mode != SANDBOXD {
        return Ok(());
    }
    if let (Some(_), Some(rc)) = (&explicit, runtime_class) {
        return Err(Rejection::RuntimeClassConflict(rc));
    }
    if let Some(node) = spec.node_name.clone().filter(|n| !n.is_empty()) {
        return Err(Rejection::NodeNamePinned(node));
    }
    let selector = spec.node_selector.get_or_insert_with(BTreeMap::new);
    match selector.get(RUNTIME_KEY) {
        Some(v) if v != SANDBOXD => return Err(Rejection::NodeSelectorConflict(v.clone())),
        _ => {}
    }
    selector.insert(RUNTIME_KEY.into(), SANDBOXD.into());
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    if !tolerations.iter().any(tolerates_provider_taint) {
        tolerations.push(Toleration {
            key: Some(PROVIDER_TAINT_KEY.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    }
    annotations.insert(RUNTIME_KEY.into(), SANDBOXD.into());
    if !annotations.contains_key(TEMPLATE_ANNOTATION)
        && let Some(image) = spec
            .containers
            .first()
            .and_then(|c| c.image.clone())
            .filter(|i| !i.is_empty())
    {
        annotations.insert(TEMPLATE_ANNOTATION.into(), image);
    }
    Ok(())
}

/// Whether `t` already tolerates the sandboxd node taint
/// `virtual-kubelet.io/provider=sandboxd:NoSchedule` (so adding the
/// canonical toleration would change nothing).
pub fn tolerates_provider_taint(t: &Toleration) -> bool {
    let effect_ok = matches!(t.effect.as_deref(), None | Some("") | Some("NoSchedule"));
    let exists = t.operator.as_deref() == Some("Exists");
    let key_ok = match t.key.as_deref() {
        None | Some("") => exists, // empty key + Exists tolerates every taint
        Some(k) => k == PROVIDER_TAINT_KEY,
    };
    let value_ok = exists || t.value.as_deref() == Some(SANDBOXD);
    effect_ok && key_ok && value_ok
}

/// A JSON merge patch bringing an existing Pod's propagated metadata in
/// line with the Sandbox template, or `None` when nothing differs. Keys the
/// operator did not propagate (e.g. vk-sandbox's claim-id annotation) are
/// never touched; previously propagated keys that left the template are
/// removed.
pub fn metadata_patch(existing: &Pod, sandbox: &Sandbox) -> Option<Value> {
    let (labels, annotations) = propagated_metadata(sandbox);
    let old_annotations = existing.annotations();
    let previously = |key: &str| -> BTreeSet<String> {
        old_annotations
            .get(key)
            .map(|v| {
                v.split(',')
                    .filter(|k| !k.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let label_patch = map_patch(existing.labels(), &labels, &previously(PROPAGATED_LABELS));
    let mut annotation_patch = map_patch(
        old_annotations,
        &annotations,
        &previously(PROPAGATED_ANNOTATIONS),
    );
    // An existing Pod's key lists are kept in step even when they empty
    // (an absent list counts as empty).
    let template = &sandbox.spec.pod_template.metadata;
    for (key, list) in [
        (PROPAGATED_LABELS, key_list(&unreserved(&template.labels))),
        (
            PROPAGATED_ANNOTATIONS,
            key_list(&unreserved(&template.annotations)),
        ),
    ] {
        if old_annotations.get(key).map_or("", String::as_str) != list {
            annotation_patch.insert(key.into(), Value::String(list));
        } else {
            annotation_patch.remove(key);
        }
    }
    let mut metadata = Map::new();
    if !label_patch.is_empty() {
        metadata.insert("labels".into(), Value::Object(label_patch));
    }
    if !annotation_patch.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotation_patch));
    }
    (!metadata.is_empty()).then(|| json!({ "metadata": metadata }))
}

fn map_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
    previously_propagated: &BTreeSet<String>,
) -> Map<String, Value> {
    let mut patch = Map::new();
    for (k, v) in desired {
        if current.get(k) != Some(v) {
            patch.insert(k.clone(), Value::String(v.clone()));
        }
    }
    for k in previously_propagated {
        if !desired.contains_key(k) && current.contains_key(k) && !is_reserved(k) {
            patch.insert(k.clone(), Value::Null);
        }
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sandbox(value: Value) -> Sandbox {
        let mut v = json!({
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "uid-1"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "agent", "image": "base:24.04"}]}}}
        });
        merge(&mut v, value);
        serde_json::from_value(v).expect("sandbox json")
    }

    fn merge(a: &mut Value, b: Value) {
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn sandboxd_sandbox() -> Sandbox {
        sandbox(
            json!({"spec": {"podTemplate": {"metadata": {"annotations": {
            "sandbox.cocoonstack.io/runtime": "sandboxd"}}}}}),
        )
    }

    fn provider_toleration() -> Toleration {
        Toleration {
            key: Some(PROVIDER_TAINT_KEY.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        }
    }

    #[test]
    fn fnv1a32_known_vectors() {
        assert_eq!(fnv1a32(b""), 0x811c9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9cf968);
        assert_eq!(name_hash("a"), "e40c292c");
        assert_eq!(name_hash(""), "811c9dc5");
        assert_eq!(name_hash("demo").len(), 8);
    }

    #[test]
    fn pods_are_looked_up_by_the_pod_name_annotation_and_created_under_the_sandbox_name() {
        let sb = sandbox(json!({}));
        assert_eq!(pod_name(&sb), "demo");
        let sb = sandbox(json!({"metadata": {"annotations": {POD_NAME_ANNOTATION: "pool-abc"}}}));
        assert_eq!(pod_name(&sb), "pool-abc");
        let pod = desired_pod(&sb, None).expect("pod");
        assert_eq!(pod.metadata.name.as_deref(), Some("demo"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn without_the_mutator_the_template_spec_is_kept_as_it_is() {
        // As upstream: the runtime annotation alone routes nothing.
        let pod = desired_pod(&sandboxd_sandbox(), None).expect("pod");
        let spec = pod.spec.expect("spec");
        assert!(spec.node_selector.is_none() && spec.tolerations.is_none());
        let ann = pod.metadata.annotations.expect("annotations");
        assert!(!ann.contains_key(TEMPLATE_ANNOTATION));
        // No propagated-labels list when no label is propagated.
        assert!(!ann.contains_key(PROPAGATED_LABELS));
        assert_eq!(ann[PROPAGATED_ANNOTATIONS], RUNTIME_KEY);
        // Nothing is refused either.
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"nodeName": "n1"}}}}));
        assert!(desired_pod(&sb, None).is_ok());
    }

    #[test]
    fn metadata_is_propagated_minus_reserved_prefixes() {
        let sb = sandbox(json!({"spec": {"podTemplate": {"metadata": {
            "labels": {"app": "x", "agents.x-k8s.io/secret": "no", "extensions.agents.x-k8s.io/t": "no", "b": "1"},
            "annotations": {"sandbox.cocoonstack.io/net": "egress", "agents.x-k8s.io/pod-name": "no", "z": "2"}
        }}}}));
        let pod = desired_pod(&sb, None).expect("pod");
        let labels = pod.metadata.labels.expect("labels");
        let want: BTreeMap<String, String> = [
            ("app", "x"),
            ("b", "1"),
            (NAME_HASH_LABEL, name_hash("demo").as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, want);
        let ann = pod.metadata.annotations.expect("annotations");
        assert_eq!(
            ann.get("sandbox.cocoonstack.io/net").map(String::as_str),
            Some("egress")
        );
        assert_eq!(ann.get("z").map(String::as_str), Some("2"));
        assert!(!ann.contains_key("agents.x-k8s.io/pod-name"));
        assert_eq!(ann[PROPAGATED_LABELS], "app,b");
        assert_eq!(ann[PROPAGATED_ANNOTATIONS], "sandbox.cocoonstack.io/net,z");
        // Standard runtime: no routing.
        assert!(!ann.contains_key(RUNTIME_KEY));
        let spec = pod.spec.expect("spec");
        assert!(spec.node_selector.is_none());
        assert!(spec.tolerations.is_none());
    }

    #[test]
    fn exactly_one_controller_owner_reference() {
        let pod = desired_pod(&sandbox(json!({})), Some(DefaultRuntime::Standard)).expect("pod");
        let owners = pod.metadata.owner_references.expect("owners");
        assert_eq!(
            owners,
            vec![OwnerReference {
                api_version: "agents.x-k8s.io/v1beta1".into(),
                kind: "Sandbox".into(),
                name: "demo".into(),
                uid: "uid-1".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        );
    }

    #[test]
    fn sandbox_without_uid_is_rejected() {
        let mut sb = sandbox(json!({}));
        sb.metadata.uid = None;
        assert_eq!(
            desired_pod(&sb, Some(DefaultRuntime::Standard)),
            Err(Rejection::Incomplete("uid"))
        );
    }

    #[test]
    fn sandboxd_mode_routes_the_pod() {
        let pod = desired_pod(&sandboxd_sandbox(), Some(DefaultRuntime::Standard)).expect("pod");
        let ann = pod.metadata.annotations.expect("annotations");
        assert_eq!(ann[RUNTIME_KEY], "sandboxd");
        assert_eq!(ann[TEMPLATE_ANNOTATION], "base:24.04");
        let spec = pod.spec.expect("spec");
        assert_eq!(
            spec.node_selector.expect("selector")[RUNTIME_KEY],
            "sandboxd"
        );
        assert_eq!(
            spec.tolerations.expect("tolerations"),
            vec![provider_toleration()]
        );
    }

    #[test]
    fn template_annotation_is_only_defaulted_when_absent() {
        let sb = sandbox(
            json!({"spec": {"podTemplate": {"metadata": {"annotations": {
            RUNTIME_KEY: "sandboxd", TEMPLATE_ANNOTATION: "rt:24.04"}}}}}),
        );
        let pod = desired_pod(&sb, Some(DefaultRuntime::Standard)).expect("pod");
        assert_eq!(
            pod.metadata.annotations.expect("a")[TEMPLATE_ANNOTATION],
            "rt:24.04"
        );
        // No image, no default.
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"containers": [{"name": "agent"}]}}}}));
        let pod = desired_pod(&sb, Some(DefaultRuntime::Standard)).expect("pod");
        assert!(
            !pod.metadata
                .annotations
                .expect("a")
                .contains_key(TEMPLATE_ANNOTATION)
        );
    }

    #[test]
    fn mode_selection() {
        // Default runtime sandboxd routes unannotated Pods…
        let pod = desired_pod(&sandbox(json!({})), Some(DefaultRuntime::Sandboxd)).expect("pod");
        assert_eq!(
            pod.metadata.annotations.expect("a")[RUNTIME_KEY],
            "sandboxd"
        );
        // …but not those with a runtimeClassName (standard).
        let sb = sandbox(json!({"spec": {"podTemplate": {"spec": {"runtimeClassName": "kata"}}}}));
        let pod = desired_pod(&sb, Some(DefaultRuntime::Sandboxd)).expect("pod");
        assert!(
            !pod.metadata
                .annotations
                .expect("a")
                .contains_key(RUNTIME_KEY)
        );
        // An explicit other mode is left alone.
        let sb = sandbox(
            json!({"spec": {"podTemplate": {"metadata": {"annotations": {RUNTIME_KEY: "standard"}}}}}),
        );
        let pod = desired_pod(&sb, Some(DefaultRuntime::Sandboxd)).expect("pod");
        assert!(pod.spec.expect("spec").node_selector.is_none());
    }

    #[test]
    fn sandboxd_rejections() {
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"runtimeClassName": "kata"}}}}));
        assert_eq!(
            desired_pod(&sb, Some(DefaultRuntime::Standard)),
            Err(Rejection::RuntimeClassConflict("kata".into()))
        );
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"nodeName": "n1"}}}}));
        assert_eq!(
            desired_pod(&sb, Some(DefaultRuntime::Standard)),
            Err(Rejection::NodeNamePinned("n1".into()))
        );
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"nodeSelector": {RUNTIME_KEY: "cocoon"}}}}}));
        assert_eq!(
            desired_pod(&sb, Some(DefaultRuntime::Standard)),
            Err(Rejection::NodeSelectorConflict("cocoon".into()))
        );
        // The same selector value is fine, and other selectors are kept.
        let sb = sandbox(json!({"spec": {"podTemplate": {
            "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
            "spec": {"nodeSelector": {RUNTIME_KEY: "sandboxd", "zone": "a"}}}}}));
        let sel = desired_pod(&sb, Some(DefaultRuntime::Standard))
            .expect("pod")
            .spec
            .expect("spec")
            .node_selector
            .expect("selector");
        assert_eq!(sel.len(), 2);
    }

    #[test]
    fn equivalent_tolerations_are_not_duplicated() {
        for existing in [
            json!({"key": PROVIDER_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}),
            json!({"key": PROVIDER_TAINT_KEY, "operator": "Exists"}),
            json!({"key": PROVIDER_TAINT_KEY, "operator": "Equal", "value": "sandboxd"}),
            json!({"key": PROVIDER_TAINT_KEY, "value": "sandboxd", "effect": "NoSchedule"}),
            json!({"operator": "Exists"}),
        ] {
            let sb = sandbox(json!({"spec": {"podTemplate": {
                "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
                "spec": {"tolerations": [existing.clone()]}}}}));
            let tol = desired_pod(&sb, Some(DefaultRuntime::Standard))
                .expect("pod")
                .spec
                .expect("spec")
                .tolerations
                .expect("tolerations");
            assert_eq!(tol.len(), 1, "{existing} should count as equivalent");
        }
        for other in [
            json!({"key": PROVIDER_TAINT_KEY, "operator": "Equal", "value": "cocoon"}),
            json!({"key": PROVIDER_TAINT_KEY, "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": "other", "operator": "Exists"}),
        ] {
            let sb = sandbox(json!({"spec": {"podTemplate": {
                "metadata": {"annotations": {RUNTIME_KEY: "sandboxd"}},
                "spec": {"tolerations": [other.clone()]}}}}));
            let tol = desired_pod(&sb, Some(DefaultRuntime::Standard))
                .expect("pod")
                .spec
                .expect("spec")
                .tolerations
                .expect("tolerations");
            assert_eq!(tol.len(), 2, "{other} is not equivalent");
            assert_eq!(tol[1], provider_toleration());
        }
    }

    #[test]
    fn metadata_patch_syncs_propagated_keys_and_keeps_others() {
        let old = sandbox(json!({"spec": {"podTemplate": {"metadata": {
            "labels": {"app": "x", "gone": "1"},
            "annotations": {"keep": "a", "drop": "b"}}}}}));
        let mut pod = desired_pod(&old, None).expect("pod");
        assert_eq!(metadata_patch(&pod, &old), None);
        // vk-sandbox's own annotation on the Pod.
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert("sandbox.cocoonstack.io/claim-id".into(), "sb_1".into());
        let new = sandbox(json!({"spec": {"podTemplate": {"metadata": {
            "labels": {"app": "y"},
            "annotations": {"keep": "a", "new": "c"}}}}}));
        let patch = metadata_patch(&pod, &new).expect("a patch");
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"app": "y", "gone": null},
                "annotations": {"drop": null, "new": "c",
                    PROPAGATED_LABELS: "app", PROPAGATED_ANNOTATIONS: "keep,new"}
            }})
        );
        // Every label leaves the template: the list empties, it stays.
        let bare = sandbox(json!({"spec": {"podTemplate": {"metadata": {
            "annotations": {"keep": "a", "drop": "b"}}}}}));
        let patch = metadata_patch(&pod, &bare).expect("a patch");
        assert_eq!(
            patch,
            json!({"metadata": {
                "labels": {"app": null, "gone": null},
                "annotations": {PROPAGATED_LABELS: ""}
            }})
        );
    }
}
