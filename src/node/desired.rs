//! The Node this process registers, as a pure function of its settings
//! (docs/architecture.md, "Node and Lease"). No I/O here: `register` and
//! `heartbeat` apply it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use crate::fleet::decide::Verdict;

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
    /// Which of `cpu`, `memory` and `pods` were given as flags: those stay
    /// as given; the others follow sandboxd when it is known.
    pub fixed: Fixed,
}

/// Which capacity flags were given (`--node-cpu`, `--node-memory`,
/// `--node-pods`): each overrides what sandboxd says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fixed {
    pub cpu: bool,
    pub memory: bool,
    pub pods: bool,
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
/// changes. `fleet` is what sandboxd's last reading says (src/fleet): its
/// conditions beside ours, and allocatable it derives for each resource
/// not given as a flag.
pub fn status(
    s: &NodeSettings,
    ready: bool,
    now: Timestamp,
    observed: Option<&NodeStatus>,
    fleet: &Verdict,
) -> NodeStatus {
    let previous = |type_: &str| -> Option<&NodeCondition> {
        observed?
            .conditions
            .as_ref()?
            .iter()
            .find(|c| c.type_ == type_)
    };
    let ours = conditions(ready)
        .into_iter()
        .map(|(t, st, r, m)| (t, st, r, m.to_string()));
    let sandboxd = fleet
        .conditions
        .iter()
        .map(|c| (c.type_, c.status, c.reason, c.message.clone()));
    let conditions = ours
        .chain(sandboxd)
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
                message: Some(message),
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
    let resources: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> = [
        ("cpu", pick(s.fixed.cpu, &s.cpu, &fleet.capacity.cpu)),
        (
            "memory",
            pick(s.fixed.memory, &s.memory, &fleet.capacity.memory),
        ),
        ("pods", pick(s.fixed.pods, &s.pods, &fleet.capacity.pods)),
    ]
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

/// A flag given stays; else what sandboxd says, else the flag's default.
fn pick<'a>(fixed: bool, flag: &'a String, derived: &'a Option<String>) -> &'a String {
    match derived {
        Some(d) if !fixed => d,
        _ => flag,
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

/// What the node declares in `status.declaredFeatures` (GA in 1.37): with
/// `ExtendWebSocketsToKubelet` the apiserver passes WebSocket exec, attach
/// and port-forward to the kubelet API as they are, instead of translating
/// them to SPDY (docs/streaming.md#protocols). Not in the typed `NodeStatus`
/// of the API version this crate builds against, hence added to the JSON.
pub const DECLARED_FEATURES: [&str; 1] = ["ExtendWebSocketsToKubelet"];

/// The server-side-apply body for the status subresource.
pub fn status_apply(name: &str, status: &NodeStatus) -> Value {
    let mut body = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": status,
    });
    body["status"]["declaredFeatures"] = json!(DECLARED_FEATURES);
    body
}

/// Whether an existing Node may be taken over: it is labelled as a virtual
/// kubelet, or vk-sandbox already manages it (its labels may have been
/// overridden through `--node-labels`). A physical node is neither.
pub fn adoptable(node: &Node) -> bool {
    let (k, v) = VIRTUAL_KUBELET_LABEL;
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(k))
        .is_some_and(|x| x == v);
    let managed = node.metadata.managed_fields.as_ref().is_some_and(|m| {
        m.iter()
            .any(|f| f.manager.as_deref() == Some(FIELD_MANAGER))
    });
    labelled || managed
}

#[cfg(test)]
mod tests;
