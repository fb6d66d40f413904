//! The Pod-IP relay's admission from the verdicts: the Pod a connection is
//! for, looked up in the node's Pod cache, and
//! [`NetworkPolicies::verdict`] on it (no I/O; it runs on every accepted
//! connection).

use std::net::IpAddr;
use std::sync::Arc;

use kube::runtime::reflector::{ObjectRef, Store};
use tracing::debug;

use super::enforcer::{LocalPods, NetworkPolicies};
use crate::podnet::relay::Admission;
use crate::pods::pod::Pod;

/// Admits a connection to a Pod of the node's cache when the
/// NetworkPolicies selecting it allow its source and port.
pub struct PolicyAdmission {
    policies: Arc<NetworkPolicies>,
    pods: Store<Pod>,
}

impl PolicyAdmission {
    pub fn new(policies: Arc<NetworkPolicies>, pods: Store<Pod>) -> PolicyAdmission {
        PolicyAdmission { policies, pods }
    }
}

impl Admission for PolicyAdmission {
    fn admit(&self, ns: &str, pod: &str, source: IpAddr, port: u16) -> Result<(), String> {
        let Some(target) = self.pods.get(&ObjectRef::new(pod).within(ns)) else {
            return Err(format!("Pod {ns}/{pod} is not in this node's cache"));
        };
        let v = self.policies.verdict(&*target, source, port);
        if v.allowed {
            debug!(pod = %format!("{ns}/{pod}"), %source, port, why = %v.why, "connection admitted");
            Ok(())
        } else {
            Err(v.why)
        }
    }
}

/// The node's Pods (namespace and labels) from its Pod cache, for
/// [`NetworkPolicies::new`].
pub fn local_pods(pods: Store<Pod>) -> LocalPods {
    Arc::new(move || {
        pods.state()
            .iter()
            .filter_map(|p| {
                let ns = p.metadata.namespace.clone()?;
                Some((ns, p.metadata.labels.clone().unwrap_or_default()))
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": {"app": app}},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_admitted_as_the_policies_of_its_cached_pod_say() {
        let (reader, mut writer) = store::<Pod>();
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(pod("shop", "web", "web")));
        writer.apply_watcher_event(&Event::InitApply(pod("shop", "db", "db")));
        writer.apply_watcher_event(&Event::InitDone);
        let mut local = (local_pods(reader.clone()))();
        local.sort();
        assert_eq!(
            local
                .iter()
                .map(|(ns, l)| format!("{ns} {}", l["app"]))
                .collect::<Vec<_>>(),
            vec!["shop db", "shop web"]
        );
        let policies = NetworkPolicies::new(local_pods(reader.clone()));
        let deny_web: NetworkPolicy = serde_json::from_value(json!({
            "metadata": {"namespace": "shop", "name": "deny-web"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}},
        }))
        .unwrap();
        policies.seed(&[deny_web]);
        let admission = PolicyAdmission::new(policies, reader);
        let from: IpAddr = "10.0.0.9".parse().unwrap();
        assert_eq!(admission.admit("shop", "db", from, 80), Ok(()));
        assert_eq!(
            admission.admit("shop", "web", from, 80),
            Err(
                "1 NetworkPolicy selects the Pod (deny-web); none allows 10.0.0.9 to TCP port 80"
                    .to_string()
            )
        );
        assert_eq!(
            admission.admit("shop", "gone", from, 80),
            Err("Pod shop/gone is not in this node's cache".to_string())
        );
    }
}
