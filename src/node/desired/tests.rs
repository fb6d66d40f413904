use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

fn node(labels: &[(&str, &str)], manager: Option<&str>) -> Node {
    let mut n = Node::default();
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n.metadata.managed_fields = manager.map(|m| {
        vec![ManagedFieldsEntry {
            manager: Some(m.into()),
            ..Default::default()
        }]
    });
    n
}

#[test]
fn physical_node_is_not_adoptable() {
    assert!(!adoptable(&node(
        &[("kubernetes.io/hostname", "a")],
        Some("kubelet")
    )));
    assert!(!adoptable(&node(&[("type", "physical")], None)));
}

#[test]
fn virtual_or_ours_is_adoptable() {
    assert!(adoptable(&node(&[("type", "virtual-kubelet")], None)));
    assert!(adoptable(&node(&[("type", "vk")], Some("vk-sandbox"))));
}

fn settings() -> NodeSettings {
    NodeSettings {
        name: "vk-a".into(),
        ip: Some("10.1.2.3".into()),
        kubelet_port: 10260,
        cpu: "4000".into(),
        memory: "8Ti".into(),
        pods: "2000".into(),
        extra_labels: [(
            "sandbox.cocoonstack.io/runtime".to_string(),
            "sandboxd".to_string(),
        )]
        .into(),
        fixed: Fixed::default(),
    }
}

#[test]
fn labels_fixed_then_extra_with_override() {
    let mut s = settings();
    let l = labels(&s);
    assert_eq!(l["type"], "virtual-kubelet");
    assert_eq!(l["kubernetes.io/role"], "agent");
    assert_eq!(l["kubernetes.io/hostname"], "vk-a");
    assert_eq!(l["sandbox.cocoonstack.io/runtime"], "sandboxd");
    s.extra_labels = [("type".to_string(), "vk".to_string())].into();
    let l = labels(&s);
    assert_eq!(l["type"], "vk");
    assert!(!l.contains_key("sandbox.cocoonstack.io/runtime"));
}

#[test]
fn new_node_has_exactly_one_taint_and_its_status() {
    let now: Timestamp = "2026-12-01T10:00:00Z".parse().expect("ts");
    let st = status(&settings(), true, now, None, &Verdict::default());
    let n = new_node(&settings(), &st);
    let taints = n["spec"]["taints"].as_array().expect("taints");
    assert_eq!(taints.len(), 1);
    assert_eq!(taints[0]["key"], TAINT_KEY);
    assert_eq!(taints[0]["value"], TAINT_VALUE);
    assert_eq!(taints[0]["effect"], "NoSchedule");
    assert!(labels_apply(&settings()).get("spec").is_none());
    // Created Ready: the status rides along.
    let typed: Node = serde_json::from_value(n).expect("a Node");
    assert_eq!(typed.status, Some(st));
}

#[test]
fn labels_are_current_only_when_ours_are_applied_exactly() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    let s = settings();
    let entry = |manager: &str, op: &str, sub: Option<&str>, keys: &[&str]| {
        let labels: serde_json::Map<String, Value> =
            keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            subresource: sub.map(Into::into),
            fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": labels}}))),
            ..Default::default()
        }
    };
    let ours: Vec<String> = labels(&s).keys().cloned().collect();
    let ours: Vec<&str> = ours.iter().map(String::as_str).collect();
    let node = |labels: BTreeMap<String, String>, managed: Vec<ManagedFieldsEntry>| {
        let mut n = Node::default();
        n.metadata.labels = Some(labels);
        n.metadata.managed_fields = Some(managed);
        n
    };
    let mut with_other = labels(&s);
    with_other.insert("team".into(), "x".into());
    let applied = entry(FIELD_MANAGER, "Apply", None, &ours);

    // Ours, applied by us: nothing to apply (others' labels do not matter).
    assert!(labels_current(
        &node(with_other.clone(), vec![applied.clone()]),
        &s
    ));
    // A value changed by someone else.
    let mut changed = labels(&s);
    changed.insert("kubernetes.io/role".into(), "other".into());
    assert!(!labels_current(&node(changed, vec![applied.clone()]), &s));
    // A label of ours missing.
    let mut missing = labels(&s);
    missing.remove("type");
    assert!(!labels_current(&node(missing, vec![applied.clone()]), &s));
    // Set by our create (Update), never applied: apply once.
    let created = entry(FIELD_MANAGER, "Update", None, &ours);
    assert!(!labels_current(&node(labels(&s), vec![created]), &s));
    // Our status apply owns no labels.
    let status_apply = entry(FIELD_MANAGER, "Apply", Some("status"), &ours);
    assert!(!labels_current(&node(labels(&s), vec![status_apply]), &s));
    // Another manager's apply.
    let theirs = entry("kubectl", "Apply", None, &ours);
    assert!(!labels_current(&node(labels(&s), vec![theirs]), &s));
    // We applied a label we no longer want (dropped from --node-labels):
    // the next apply removes it.
    let mut stale_keys = ours.clone();
    stale_keys.push("old");
    let mut stale_labels = labels(&s);
    stale_labels.insert("old".into(), "1".into());
    let stale = entry(FIELD_MANAGER, "Apply", None, &stale_keys);
    assert!(!labels_current(&node(stale_labels, vec![stale]), &s));
    // No managedFields at all.
    let mut bare = Node::default();
    bare.metadata.labels = Some(labels(&s));
    assert!(!labels_current(&bare, &s));
}

#[test]
fn addresses_internal_ip_first_then_hostname() {
    let now = Timestamp::now();
    let st = status(&settings(), true, now, None, &Verdict::default());
    let a = st.addresses.expect("addresses");
    assert_eq!(
        a.iter()
            .map(|a| (a.type_.as_str(), a.address.as_str()))
            .collect::<Vec<_>>(),
        vec![("InternalIP", "10.1.2.3"), ("Hostname", "vk-a")]
    );
    let mut s = settings();
    s.ip = None;
    let a = status(&s, true, now, None, &Verdict::default())
        .addresses
        .expect("addresses");
    assert_eq!(a.len(), 1);
    assert_eq!(a[0].type_, "Hostname");
}

#[test]
fn capacity_equals_allocatable_and_port_advertised() {
    let st = status(
        &settings(),
        true,
        Timestamp::now(),
        None,
        &Verdict::default(),
    );
    assert_eq!(st.capacity, st.allocatable);
    let cap = st.capacity.expect("capacity");
    assert_eq!(cap["cpu"].0, "4000");
    assert_eq!(cap["memory"].0, "8Ti");
    assert_eq!(cap["pods"].0, "2000");
    assert_eq!(
        st.daemon_endpoints
            .and_then(|d| d.kubelet_endpoint)
            .map(|e| e.port),
        Some(10260)
    );
    assert!(
        st.node_info
            .expect("nodeInfo")
            .kubelet_version
            .starts_with('v')
    );
}

#[test]
fn ready_only_condition_true() {
    let st = status(
        &settings(),
        true,
        Timestamp::now(),
        None,
        &Verdict::default(),
    );
    let conds = st.conditions.expect("conditions");
    assert_eq!(conds.len(), 5);
    for c in &conds {
        if c.type_ == "Ready" {
            assert_eq!(c.status, "True");
            assert_eq!(c.reason.as_deref(), Some("KubeletReady"));
        } else {
            assert_eq!(c.status, "False", "{}", c.type_);
        }
    }
    let not_ready = status(
        &settings(),
        false,
        Timestamp::now(),
        None,
        &Verdict::default(),
    );
    assert!(
        not_ready
            .conditions
            .expect("conditions")
            .iter()
            .all(|c| c.status != "True")
    );
}

#[test]
fn transition_time_stable_unless_status_changes() {
    let t0: Timestamp = "2026-01-01T00:00:00Z".parse().expect("t0");
    let t1: Timestamp = "2026-01-01T00:01:00Z".parse().expect("t1");
    let first = status(&settings(), false, t0, None, &Verdict::default());
    let second = status(&settings(), false, t1, Some(&first), &Verdict::default());
    let third = status(&settings(), true, t1, Some(&second), &Verdict::default());
    let get = |st: &NodeStatus, ty: &str| {
        st.conditions
            .as_ref()
            .expect("conditions")
            .iter()
            .find(|c| c.type_ == ty)
            .cloned()
            .expect("condition")
    };
    // Same status: transition kept, heartbeat moves.
    assert_eq!(get(&second, "Ready").last_transition_time, Some(Time(t0)));
    assert_eq!(get(&second, "Ready").last_heartbeat_time, Some(Time(t1)));
    // Ready flips: transition moves; unchanged conditions keep theirs.
    assert_eq!(get(&third, "Ready").last_transition_time, Some(Time(t1)));
    assert_eq!(
        get(&third, "DiskPressure").last_transition_time,
        Some(Time(t0))
    );
}

#[test]
fn the_status_apply_declares_websockets_to_the_kubelet() {
    let st = status(
        &settings(),
        true,
        Timestamp::now(),
        None,
        &Verdict::default(),
    );
    let body = status_apply("n", &st);
    assert_eq!(
        body["status"]["declaredFeatures"],
        json!(["ExtendWebSocketsToKubelet"])
    );
    assert_eq!(body["status"]["phase"], "Running");
}

fn quantity(st: &NodeStatus, k: &str) -> String {
    st.allocatable
        .as_ref()
        .and_then(|a| a.get(k))
        .map(|q| q.0.clone())
        .unwrap_or_default()
}

#[test]
fn sandboxd_sizes_allocatable_unless_a_flag_was_given() {
    use crate::fleet::decide::Derived;
    let fleet = Verdict {
        capacity: Derived {
            cpu: Some("40".into()),
            memory: Some("20480Mi".into()),
            pods: Some("40".into()),
        },
        ..Verdict::default()
    };
    let st = status(&settings(), true, Timestamp::now(), None, &fleet);
    assert_eq!(quantity(&st, "cpu"), "40");
    assert_eq!(quantity(&st, "memory"), "20480Mi");
    assert_eq!(quantity(&st, "pods"), "40");
    assert_eq!(st.capacity, st.allocatable);
    let mut s = settings();
    s.fixed.pods = true;
    let st = status(&s, true, Timestamp::now(), None, &fleet);
    assert_eq!(quantity(&st, "pods"), "2000", "--node-pods overrides");
    assert_eq!(quantity(&st, "cpu"), "40");
    // Nothing derived: the flags' values (or their defaults).
    let st = status(
        &settings(),
        true,
        Timestamp::now(),
        None,
        &Verdict::default(),
    );
    assert_eq!(quantity(&st, "cpu"), "4000");
}

#[test]
fn sandboxd_conditions_sit_beside_ours_and_keep_their_transition_time() {
    use crate::fleet::decide::Cond;
    let draining = |status: &'static str| Verdict {
        conditions: vec![Cond {
            type_: "SandboxdDraining",
            status,
            reason: "Draining",
            message: "m".into(),
        }],
        ..Verdict::default()
    };
    let t0 = Timestamp::from_second(1_000).expect("t0");
    let t1 = Timestamp::from_second(2_000).expect("t1");
    let first = status(&settings(), true, t0, None, &draining("True"));
    let types: Vec<&str> = first
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(types[0], "Ready");
    assert!(types.contains(&"SandboxdDraining"), "{types:?}");
    let ready = |st: &NodeStatus| {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status.clone())
    };
    assert_eq!(
        ready(&first).as_deref(),
        Some("True"),
        "a sandboxd fault never touches Ready"
    );
    let when = |st: &NodeStatus| {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "SandboxdDraining")
            .and_then(|c| c.last_transition_time.clone())
    };
    let same = status(&settings(), true, t1, Some(&first), &draining("True"));
    assert_eq!(when(&same), when(&first));
    let flipped = status(&settings(), true, t1, Some(&same), &draining("False"));
    assert_eq!(when(&flipped).map(|t| t.0), Some(t1));
}
