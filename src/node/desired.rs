//! The Node this process registers, as a pure function of its settings
//! (docs/architecture.md, "Node and Lease"). No I/O here: `register` and
//! `heartbeat` apply it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

/// Label that marks a Node as a virtual kubelet; vk-sandbox never adopts a
/// Node without it (that is a real kubelet's Node, which it must not take
/// over) unless vk-sandbox itself manages it.
pub const VIRTUAL_KUBELET_LABEL: (&str, &str) = ("type", "virtual-kubelet");
pub const TAINT_KEY: &str = "virtual-kubelet.io/provider";
pub const TAINT_VALUE: &str = "sandboxd";
pub use crate::identity::FIELD_MANAGER;

/// What the Node is derived from (a projection of the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSettings {
    pub name: String,
    /// `--node-ip`; `None` when empty.
    pub ip: Option<String>,
    /// Port of `--listen-addr`, advertised as the kubelet endpoint.
    pub kubelet_port: u16,
    pub cpu: String,
    pub memory: String,
    pub pods: String,
    /// Parsed `--node-labels` (applied after the fixed labels, so they may
    /// override them).
    pub extra_labels: BTreeMap<String, String>,
}

pub fn labels(s: &NodeSettings) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(
        VIRTUAL_KUBELET_LABEL.0.to_string(),
        VIRTUAL_KUBELET_LABEL.1.to_string(),
    );
    l.insert("kubernetes.io/role".into(), "agent".into());
    l.insert("kubernetes.io/hostname".into(), s.name.clone());
    l.extend(s.extra_labels.clone());
    l
}

pub fn taint() -> Taint {
    Taint {
        key: TAINT_KEY.into(),
        value: Some(TAINT_VALUE.into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }
}

/// True when `taints` already holds ours (key and effect; value as ours).
pub fn has_taint(taints: &[Taint]) -> bool {
    taints.iter().any(|t| {
        t.key == TAINT_KEY && t.effect == "NoSchedule" && t.value.as_deref() == Some(TAINT_VALUE)
    })
}

/// The Node as first created: labels, the single taint and its status
/// (the apiserver keeps a Node's status on create, as a kubelet registers
/// it), so a new Node is Ready with one request.
pub fn new_node(s: &NodeSettings, status: &NodeStatus) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": s.name, "labels": labels(s)},
        "spec": {"taints": [taint()]},
        "status": status,
    })
}

/// Whether an existing Node already carries what adopting it would apply:
/// our labels with our values, and exactly those label keys under our
/// server-side-apply manager (a label dropped from `--node-labels` is
/// removed by the next apply, so its absence from the desired set means
/// the apply is still needed). Pure: read from the Node's managedFields.
pub fn labels_current(node: &Node, s: &NodeSettings) -> bool {
    let want = labels(s);
    let have = node.metadata.labels.clone().unwrap_or_default();
    if want.iter().any(|(k, v)| have.get(k) != Some(v)) {
        return false;
    }
    let applied = node.metadata.managed_fields.iter().flatten().find(|m| {
        m.manager.as_deref() == Some(FIELD_MANAGER)
            && m.operation.as_deref() == Some("Apply")
            && m.subresource.as_deref().unwrap_or_default().is_empty()
    });
    let Some(fields) = applied.and_then(|m| m.fields_v1.as_ref()) else {
        return false;
    };
    let owned: std::collections::BTreeSet<&str> = fields
        .0
        .pointer("/f:metadata/f:labels")
        .and_then(Value::as_object)
        .map(|o| o.keys().filter_map(|k| k.strip_prefix("f:")).collect())
        .unwrap_or_default();
    owned == want.keys().map(String::as_str).collect()
}

/// The server-side-apply body for the Node's metadata on adoption: only our
/// labels, so labels and taints others own stay as they are.
pub fn labels_apply(s: &NodeSettings) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": s.name, "labels": labels(s)},
    })
}

/// The conditions vk-sandbox owns. `ready` is true once the Pod watch has
/// synced; readiness is never tied to sandboxd health (a sandboxd outage
/// must not make the node NotReady and get its Pods evicted).
fn conditions(ready: bool) -> [(&'static str, &'static str, &'static str, &'static str); 5] {
    let (ready_status, ready_reason, ready_msg) = if ready {
        ("True", "KubeletReady", "Kubelet is ready")
    } else {
        (
            "False",
            "KubeletNotReady",
            "vk-sandbox is starting: waiting for the Pod watch to sync",
        )
    };
    [
        ("Ready", ready_status, ready_reason, ready_msg),
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "memory is sandboxd's to manage",
        ),
        (
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "disk is sandboxd's to manage",
        ),
        (
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "PIDs are sandboxd's to manage",
        ),
        (
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "sandbox networking is sandboxd's to manage",
        ),
    ]
}

/// The desired Node status. `observed` is the status as the apiserver last
/// returned it: a condition keeps its `lastTransitionTime` unless its status
/// changes.
pub fn status(
    s: &NodeSettings,
    ready: bool,
    now: Timestamp,
    observed: Option<&NodeStatus>,
) -> NodeStatus {
    let previous = |type_: &str| -> Option<&NodeCondition> {
        observed?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    };
    let conditions = conditions(ready)
        .into_iter()
        .map(|(type_, status, reason, message)| {
            let transition = match previous(type_) {
                Some(p) if p.status == status => p.last_transition_time.clone(),
                _ => None,
            }
            .unwrap_or(Time(now));
            NodeCondition {
                type_: type_.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_heartbeat_time: Some(Time(now)),
                last_transition_time: Some(transition),
            }
        })
        .collect();
    let mut addresses = Vec::new();
    if let Some(ip) = &s.ip {
        addresses.push(address("InternalIP", ip));
    }
    addresses.push(address("Hostname", &s.name));
    let resources: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> =
        [("cpu", &s.cpu), ("memory", &s.memory), ("pods", &s.pods)]
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()),
                )
            })
            .collect();
    NodeStatus {
        addresses: Some(addresses),
        allocatable: Some(resources.clone()),
        capacity: Some(resources),
        conditions: Some(conditions),
        daemon_endpoints: Some(k8s_openapi::api::core::v1::NodeDaemonEndpoints {
            kubelet_endpoint: Some(k8s_openapi::api::core::v1::DaemonEndpoint {
                port: i32::from(s.kubelet_port),
            }),
        }),
        node_info: Some(node_info()),
        phase: Some(if ready { "Running" } else { "Pending" }.into()),
        ..Default::default()
    }
}

fn address(type_: &str, value: &str) -> k8s_openapi::api::core::v1::NodeAddress {
    k8s_openapi::api::core::v1::NodeAddress {
        type_: type_.into(),
        address: value.into(),
    }
}

fn node_info() -> k8s_openapi::api::core::v1::NodeSystemInfo {
    k8s_openapi::api::core::v1::NodeSystemInfo {
        architecture: std::env::consts::ARCH.into(),
        operating_system: std::env::consts::OS.into(),
        kubelet_version: format!("v{}-vk-sandbox", env!("CARGO_PKG_VERSION")),
        container_runtime_version: "sandboxd://microvm".into(),
        os_image: "sandboxd microVMs".into(),
        kernel_version: String::new(),
        kube_proxy_version: String::new(),
        machine_id: String::new(),
        system_uuid: String::new(),
        boot_id: String::new(),
        swap: None,
    }
}

/// The server-side-apply body for the status subresource.
pub fn status_apply(name: &str, status: &NodeStatus) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let st = status(&settings(), true, now, None);
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
        let st = status(&settings(), true, now, None);
        let a = st.addresses.expect("addresses");
        assert_eq!(
            a.iter()
                .map(|a| (a.type_.as_str(), a.address.as_str()))
                .collect::<Vec<_>>(),
            vec![("InternalIP", "10.1.2.3"), ("Hostname", "vk-a")]
        );
        let mut s = settings();
        s.ip = None;
        let a = status(&s, true, now, None).addresses.expect("addresses");
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].type_, "Hostname");
    }

    #[test]
    fn capacity_equals_allocatable_and_port_advertised() {
        let st = status(&settings(), true, Timestamp::now(), None);
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
        let st = status(&settings(), true, Timestamp::now(), None);
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
        let not_ready = status(&settings(), false, Timestamp::now(), None);
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
        let first = status(&settings(), false, t0, None);
        let second = status(&settings(), false, t1, Some(&first));
        let third = status(&settings(), true, t1, Some(&second));
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
}
