//! The Node this process registers, as a pure function of its settings
//! (docs/architecture.md, "Node and Lease"). No I/O here: `register` and
//! `heartbeat` apply it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, Taint};
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

/// The Node as first created: labels and the single taint.
pub fn new_node(s: &NodeSettings) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": s.name, "labels": labels(s)},
        "spec": {"taints": [taint()]},
    })
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
    fn new_node_has_exactly_one_taint() {
        let n = new_node(&settings());
        let taints = n["spec"]["taints"].as_array().expect("taints");
        assert_eq!(taints.len(), 1);
        assert_eq!(taints[0]["key"], TAINT_KEY);
        assert_eq!(taints[0]["value"], TAINT_VALUE);
        assert_eq!(taints[0]["effect"], "NoSchedule");
        assert!(labels_apply(&settings()).get("spec").is_none());
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
