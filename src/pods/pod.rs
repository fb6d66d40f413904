//! The Pod as vk-sandbox reads it: only the fields the controller, the
//! statuses it publishes and the kubelet API look at. The watch cache
//! holds every Pod bound to this node, so its type decides the process's
//! memory: k8s-openapi's `Pod` carries every field of the API (a spec of 40
//! fields, containers of 24, volumes, managedFields) in every cached
//! object, and decoding those fields costs CPU on every watch event.
//! Here the unread fields are skipped while the JSON is decoded, so they
//! are never allocated.
//!
//! What is kept: the metadata (without `managedFields` and `selfLink`),
//! the spec's `nodeName`, `restartPolicy` and each container's name and
//! image, and the status fields vk-sandbox writes or decides on (phase,
//! reason, message, addresses, start time, conditions, container
//! statuses). Everything a status patch names must be kept, or the Pod
//! would never look up to date and each echo would be written again (see
//! [`super::status::changes`]).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerState, HostIP, PodCondition, PodIP};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::{Deserialize, Deserializer, Serialize};

/// How long a grace-0 deletion is left to the apiserver before the Pod is
/// deleted again (see `removal_pending`).
pub const REMOVAL_WAIT: Duration = Duration::from_secs(10);

/// A Pod bound to this node, as cached. Serializes as a `v1` `Pod` with
/// only these fields (the kubelet API's `/pods` shows it so).
#[derive(Clone, Debug, Default, PartialEq, Deserialize, kube::Resource)]
#[resource(inherit = "k8s_openapi::api::core::v1::Pod")]
pub struct Pod {
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PodSpec>,
    #[serde(default)]
    pub status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default)]
    pub containers: Vec<Container>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Container {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The declared ports: a Pod address listens on the TCP ones
    /// (docs/pod-network.md), NetworkPolicies name them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ContainerPort>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerPort {
    #[serde(default)]
    pub container_port: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `None`: TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, rename = "hostIP", skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<String>,
    #[serde(default, rename = "hostIPs", skip_serializing_if = "Option::is_none")]
    pub host_ips: Option<Vec<HostIP>>,
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    #[serde(default, rename = "podIPs", skip_serializing_if = "Option::is_none")]
    pub pod_ips: Option<Vec<PodIP>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<PodCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<bool>,
    #[serde(default)]
    pub restart_count: i32,
    #[serde(default)]
    pub image: String,
    #[serde(default, rename = "imageID")]
    pub image_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ContainerState>,
}

/// The metadata fields kept; `managedFields` (often the largest part of a
/// Pod) and `selfLink` are skipped while decoding.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    generate_name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    deletion_grace_period_seconds: Option<i64>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<OwnerReference>>,
    #[serde(default)]
    finalizers: Option<Vec<String>>,
}

fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = LeanMeta::deserialize(d)?;
    Ok(ObjectMeta {
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references,
        finalizers: m.finalizers,
        managed_fields: None,
        self_link: None,
    })
}

impl Serialize for Pod {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Out<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            #[serde(skip_serializing_if = "Option::is_none")]
            spec: Option<&'a PodSpec>,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: Option<&'a PodStatus>,
        }
        Out {
            api_version: "v1",
            kind: "Pod",
            metadata: &self.metadata,
            spec: self.spec.as_ref(),
            status: self.status.as_ref(),
        }
        .serialize(s)
    }
}

/// The order of two `resourceVersion`s of the same resource. Since
/// Kubernetes 1.35 they are decimal integers that clients may compare
/// (comparable resource versions, KEP-5504): the longer number is newer,
/// and numbers of one length compare digit by digit. `None` when either is
/// not such a number (an apiserver that keeps them opaque): then no order
/// is assumed.
pub fn version_order(a: &str, b: &str) -> Option<Ordering> {
    let decimal = |v: &str| {
        !v.is_empty() && v.bytes().all(|c| c.is_ascii_digit()) && (v == "0" || !v.starts_with('0'))
    };
    if !decimal(a) || !decimal(b) {
        return None;
    }
    Some(a.len().cmp(&b.len()).then_with(|| a.cmp(b)))
}

/// How long the watch cache may show an older version of a Pod than our
/// own last write to it before that write is taken for history the
/// apiserver no longer has (etcd restored from a snapshot: its revisions,
/// and so resourceVersions, went back). Our write's echo comes within
/// seconds; the Pods controller resyncs every 300 s, so the second resync
/// after a restore replaces it.
pub const BEHIND_LIMIT: Duration = Duration::from_secs(120);

/// Whether the watch cache's version of a Pod replaces the tracked copy
/// (our last write to the same Pod): unless the tracked copy is newer, and
/// then only once the cache has shown older versions for [`BEHIND_LIMIT`]
/// (`behind_for`: since the cache first did). Pure.
pub fn cached_replaces_tracked(tracked_is_newer: bool, behind_for: Duration) -> bool {
    !tracked_is_newer || behind_for >= BEHIND_LIMIT
}

/// `<namespace>/<name>`: a Pod's key (the claim's `claim_ref` adds the
/// Pod's UID to it, see [`super::claim_ref`]).
pub fn key_of(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or("default"))
}

impl Pod {
    /// `<namespace>/<name>` (see [`key_of`]).
    pub fn key(&self) -> String {
        key_of(
            self.metadata.namespace.as_deref(),
            self.metadata.name.as_deref().unwrap_or_default(),
        )
    }

    /// The UID, empty when the Pod has none (only hand-made Pods lack one).
    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    /// An annotation's value; an empty one counts as absent.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Whether the apiserver is removing the object on its own: grace 0 was
    /// set (by our earlier delete, or `kubectl delete --force`) less than
    /// [`REMOVAL_WAIT`] before `now`. A second delete would only repeat it;
    /// skipping saves one write per Pod (our grace-0 delete echoes back as
    /// an update before the object is gone). An older one is not pending:
    /// the apiserver records grace 0 and then removes the object in a
    /// second step, and a delete cut between the two (a timeout, our
    /// process killed) leaves the Pod Terminating for good unless it is
    /// sent again, as a kubelet does.
    pub fn removal_pending(&self, now: jiff::Timestamp) -> bool {
        let Some(at) = &self.metadata.deletion_timestamp else {
            return false;
        };
        let wait =
            jiff::SignedDuration::try_from(REMOVAL_WAIT).unwrap_or(jiff::SignedDuration::MAX);
        self.metadata.deletion_grace_period_seconds == Some(0) && now.duration_since(at.0) < wait
    }

    /// A container is "running" unless every status is terminated or
    /// waiting.
    pub fn has_running_container(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.state
                        .as_ref()
                        .is_none_or(|st| st.terminated.is_none() && st.waiting.is_none())
                })
            })
    }

    /// Failed or Succeeded: never touched again.
    pub fn terminal(&self) -> bool {
        matches!(self.phase(), Some("Failed") | Some("Succeeded"))
    }

    pub fn phase(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.phase.as_deref())
    }

    /// `restartPolicy: Never`.
    pub fn never_restarts(&self) -> bool {
        self.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never")
    }

    /// Whether `self` is a later version of the same Pod (same UID) than
    /// `other`, as far as their resourceVersions tell.
    pub fn is_newer_than(&self, other: &Pod) -> bool {
        self.metadata.uid.is_some()
            && self.metadata.uid == other.metadata.uid
            && matches!(
                (&self.metadata.resource_version, &other.metadata.resource_version),
                (Some(a), Some(b)) if version_order(a, b) == Some(Ordering::Greater)
            )
    }
}

#[cfg(test)]
mod tests;
