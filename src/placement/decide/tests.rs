use super::*;

const ON: Settings = Settings { tolerations: true };
const OFF: Settings = Settings { tolerations: false };

fn sandbox_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "annotations": {RUNTIME: SANDBOXD, "sandbox.cocoonstack.io/template": "base"},
        },
        "spec": {"containers": [{"name": "agent", "image": "base"}]},
    }))
    .unwrap()
}

fn with_spec(mut pod: Pod, field: &str, value: Value) -> Pod {
    let mut spec = serde_json::to_value(pod.spec.take().unwrap()).unwrap();
    spec[field] = value;
    pod.spec = Some(serde_json::from_value(spec).unwrap());
    pod
}

/// What the DefaultTolerationSeconds plugin gives every Pod first.
fn default_300s() -> Value {
    json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
    ])
}

fn provider_toleration() -> Value {
    json!({"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"})
}

fn held(nodes: &[&str]) -> Lookup {
    Lookup::Held(nodes.iter().map(|n| n.to_string()).collect())
}

/// The Pod as the apiserver stores it after the patch.
fn patched(pod: &Pod, d: &Decision) -> Pod {
    let mut doc = serde_json::to_value(pod).unwrap();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(d.patch().to_vec())).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    serde_json::from_value(doc).unwrap()
}

fn required_terms(pod: &Pod) -> Value {
    let spec = serde_json::to_value(pod.spec.as_ref().unwrap()).unwrap();
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"]
        .clone()
}

fn tolerations(pod: &Pod) -> Value {
    serde_json::to_value(
        pod.spec
            .as_ref()
            .unwrap()
            .tolerations
            .clone()
            .unwrap_or_default(),
    )
    .unwrap()
}

fn pin(nodes: &[&str]) -> Value {
    json!({"key": "metadata.name", "operator": "In", "values": nodes})
}

fn outage(key: &str) -> Value {
    json!({"key": key, "operator": "Exists", "effect": "NoExecute"})
}

#[test]
fn placement_table() {
    struct Row {
        what: &'static str,
        pod: Pod,
        lookup: Lookup,
        placement: Placement,
        /// The nodeSelectorTerms after the patch (Null: no affinity).
        terms: Value,
    }
    let expr =
        json!({"key": "sandbox.cocoonstack.io/runtime", "operator": "In", "values": ["sandboxd"]});
    let rows = [
        Row {
            what: "held on one node: pinned there",
            pod: sandbox_pod("a"),
            lookup: held(&["node-b"]),
            placement: Placement::Pinned(vec!["node-b".into()]),
            terms: json!([{"matchFields": [pin(&["node-b"])]}]),
        },
        Row {
            what: "held on two nodes: either, never a third",
            pod: sandbox_pod("a"),
            lookup: held(&["node-c", "node-a", "node-c"]),
            placement: Placement::Pinned(vec!["node-a".into(), "node-c".into()]),
            terms: json!([{"matchFields": [pin(&["node-a", "node-c"])]}]),
        },
        Row {
            what: "on no node: left to the scheduler",
            pod: sandbox_pod("a"),
            lookup: held(&[]),
            placement: Placement::Unheld,
            terms: Value::Null,
        },
        Row {
            what: "the index has not listed yet: not placed",
            pod: sandbox_pod("a"),
            lookup: Lookup::NotSynced,
            placement: Placement::Unknown,
            terms: Value::Null,
        },
        Row {
            what: "already bound: nodeName wins, nothing added",
            pod: with_spec(sandbox_pod("a"), "nodeName", json!("node-a")),
            lookup: held(&["node-b"]),
            placement: Placement::AlreadyBound("node-a".into()),
            terms: Value::Null,
        },
        Row {
            what: "generateName only: no key",
            pod: {
                let mut p = sandbox_pod("a");
                p.metadata.name = None;
                p.metadata.generate_name = Some("a-".into());
                p
            },
            lookup: held(&["node-b"]),
            placement: Placement::NoKey,
            terms: Value::Null,
        },
        Row {
            what: "the Pod's own terms: the pin ANDed into each, empty terms left",
            pod: with_spec(
                sandbox_pod("a"),
                "affinity",
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [expr]}, {}]}}}),
            ),
            lookup: held(&["node-b"]),
            placement: Placement::Pinned(vec!["node-b".into()]),
            terms: json!([{"matchExpressions": [expr], "matchFields": [pin(&["node-b"])]}, {}]),
        },
        Row {
            what: "reinvoked: the pin is there already",
            pod: with_spec(
                sandbox_pod("a"),
                "affinity",
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [pin(&["node-b"])]}]}}}),
            ),
            lookup: held(&["node-b"]),
            placement: Placement::AlreadyPinned,
            terms: json!([{"matchFields": [pin(&["node-b"])]}]),
        },
    ];
    for row in rows {
        let d = decide(&row.pod, &row.lookup, OFF);
        let Decision::Mutate {
            placement,
            tolerations,
            ..
        } = &d
        else {
            panic!("{}: not ours?", row.what);
        };
        assert_eq!(placement, &row.placement, "{}", row.what);
        assert_eq!(tolerations, &Tolerations::Off, "{}", row.what);
        let after = patched(&row.pod, &d);
        assert_eq!(required_terms(&after), row.terms, "{}", row.what);
        // The patch touches only the affinity.
        for op in d.patch() {
            assert_eq!(op["path"], "/spec/affinity", "{}", row.what);
        }
    }
}

#[test]
fn preferred_affinity_and_pod_affinity_are_kept() {
    let pod = with_spec(
        sandbox_pod("a"),
        "affinity",
        json!({
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}}]},
            "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]},
        }),
    );
    let after = patched(&pod, &decide(&pod, &held(&["node-b"]), OFF));
    let aff = serde_json::to_value(after.spec.unwrap().affinity.unwrap()).unwrap();
    assert_eq!(
        aff["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        5
    );
    assert_eq!(
        aff["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"],
        1
    );
    assert_eq!(
        aff["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([{"matchFields": [pin(&["node-b"])]}])
    );
}

#[test]
fn tolerations_table() {
    struct Row {
        what: &'static str,
        tolerations: Value,
        outcome: Tolerations,
        after: Value,
    }
    let unreachable = outage("node.kubernetes.io/unreachable");
    let not_ready = outage("node.kubernetes.io/not-ready");
    let rows = [
        Row {
            what: "none: both added",
            tolerations: Value::Null,
            outcome: Tolerations::Set,
            after: json!([unreachable, not_ready]),
        },
        Row {
            what: "the apiserver's 300 s defaults: replaced, others kept in order",
            tolerations: {
                let mut t = default_300s();
                t.as_array_mut().unwrap().insert(0, provider_toleration());
                t
            },
            outcome: Tolerations::Set,
            after: json!([provider_toleration(), unreachable, not_ready]),
        },
        Row {
            what: "already unlimited: nothing to do",
            tolerations: json!([provider_toleration(), not_ready, unreachable]),
            outcome: Tolerations::Present,
            after: json!([provider_toleration(), not_ready, unreachable]),
        },
        Row {
            what: "tolerate-everything (no key, Exists): nothing to add",
            tolerations: json!([{"operator": "Exists"}]),
            outcome: Tolerations::Present,
            after: json!([{"operator": "Exists"}]),
        },
        Row {
            what: "a NoSchedule toleration of the key does not cover NoExecute",
            tolerations: json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"}]),
            outcome: Tolerations::Set,
            after: json!([
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoSchedule"},
                unreachable, not_ready]),
        },
        Row {
            what: "a broad toleration with seconds still limits: said so",
            tolerations: json!([{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60}]),
            outcome: Tolerations::LimitedByPod,
            after: json!([
                {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
                unreachable, not_ready]),
        },
        Row {
            what: "a key with a value (Equal) does not match the valueless taint",
            tolerations: json!([{"key": "node.kubernetes.io/not-ready", "operator": "Equal", "value": "x", "effect": "NoExecute"}]),
            outcome: Tolerations::Set,
            after: json!([
                {"key": "node.kubernetes.io/not-ready", "operator": "Equal", "value": "x", "effect": "NoExecute"},
                unreachable, not_ready]),
        },
    ];
    for row in rows {
        let pod = if row.tolerations.is_null() {
            sandbox_pod("a")
        } else {
            with_spec(sandbox_pod("a"), "tolerations", row.tolerations.clone())
        };
        let d = decide(&pod, &held(&[]), ON);
        let Decision::Mutate {
            tolerations: outcome,
            placement,
            patch,
        } = &d
        else {
            panic!("{}: not ours?", row.what);
        };
        assert_eq!(outcome, &row.outcome, "{}", row.what);
        assert_eq!(placement, &Placement::Unheld, "{}", row.what);
        assert_eq!(
            patch.is_empty(),
            row.outcome == Tolerations::Present,
            "{}: a patch only when something changes",
            row.what
        );
        assert_eq!(tolerations(&patched(&pod, &d)), row.after, "{}", row.what);
    }
}

#[test]
fn off_leaves_the_tolerations_as_they_are() {
    let pod = with_spec(sandbox_pod("a"), "tolerations", default_300s());
    let d = decide(&pod, &held(&["n"]), OFF);
    assert_eq!(tolerations(&patched(&pod, &d)), default_300s());
}

#[test]
fn tolerations_and_pin_together_in_one_patch() {
    let pod = with_spec(sandbox_pod("a"), "tolerations", default_300s());
    let d = decide(&pod, &held(&["node-b"]), ON);
    assert_eq!(d.patch().len(), 2);
    let after = patched(&pod, &d);
    assert_eq!(
        required_terms(&after),
        json!([{"matchFields": [pin(&["node-b"])]}])
    );
    assert!(
        after
            .spec
            .unwrap()
            .tolerations
            .unwrap()
            .iter()
            .all(|t| t.toleration_seconds.is_none())
    );
    // Applied again (the apiserver may reinvoke), it changes nothing.
    assert!(
        decide(&patched(&pod, &d), &held(&["node-b"]), ON)
            .patch()
            .is_empty()
    );
}

#[test]
fn only_sandbox_pods_are_touched() {
    for (what, annotations) in [
        ("no annotations", Value::Null),
        ("another runtime", json!({RUNTIME: "kata"})),
        (
            "template only",
            json!({"sandbox.cocoonstack.io/template": "base"}),
        ),
    ] {
        let mut doc = serde_json::to_value(sandbox_pod("a")).unwrap();
        doc["metadata"]["annotations"] = annotations;
        let pod: Pod = serde_json::from_value(doc).unwrap();
        assert_eq!(
            decide(&pod, &held(&["node-b"]), ON),
            Decision::NotOurs,
            "{what}"
        );
    }
}

#[test]
fn the_key_is_namespace_and_name() {
    let mut pod = sandbox_pod("a");
    assert_eq!(key(&pod, "team"), Some("team/a".into()));
    pod.metadata.namespace = Some("own".into());
    assert_eq!(key(&pod, "team"), Some("own/a".into()));
    pod.metadata.name = Some(String::new());
    assert_eq!(key(&pod, "team"), None);
}
