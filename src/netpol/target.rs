//! What the verdict reads of the Pod a connection is for, from either Pod
//! type: the API's, or the lean one the node's Pod watch caches (which
//! keeps the declared ports too).

use std::collections::BTreeMap;

use super::selector::Labels;
use super::verdict::DeclaredPort;

static NO_LABELS: Labels = BTreeMap::new();

/// The target Pod of a connection.
pub trait TargetPod {
    fn namespace(&self) -> &str;
    fn labels(&self) -> &Labels;
    /// Its containers' declared ports, for named ports.
    fn declared_ports(&self) -> Vec<DeclaredPort>;
}

impl TargetPod for k8s_openapi::api::core::v1::Pod {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    fn labels(&self) -> &Labels {
        self.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    fn declared_ports(&self) -> Vec<DeclaredPort> {
        let containers = self.spec.iter().flat_map(|s| &s.containers);
        containers
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some(DeclaredPort {
                    name: p.name.clone()?,
                    number: p.container_port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                })
            })
            .collect()
    }
}

impl TargetPod for crate::pods::pod::Pod {
    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    fn labels(&self) -> &Labels {
        self.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
    }

    fn declared_ports(&self) -> Vec<DeclaredPort> {
        let containers = self.spec.iter().flat_map(|s| &s.containers);
        containers
            .flat_map(|c| &c.ports)
            .filter_map(|p| {
                Some(DeclaredPort {
                    name: p.name.clone()?,
                    number: p.container_port,
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_api_pod_gives_its_named_ports_with_their_protocol() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "n", "labels": {"app": "web"}},
            "spec": {"containers": [
                {"name": "a", "ports": [{"name": "http", "containerPort": 8080},
                                        {"containerPort": 9000},
                                        {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                {"name": "b", "ports": [{"name": "grpc", "containerPort": 9090, "protocol": "TCP"}]},
                {"name": "c"},
            ]},
        }))
        .unwrap();
        assert_eq!(TargetPod::namespace(&pod), "n");
        assert_eq!(TargetPod::labels(&pod).get("app").unwrap(), "web");
        let port = |name: &str, number, protocol: &str| DeclaredPort {
            name: name.into(),
            number,
            protocol: protocol.into(),
        };
        assert_eq!(
            pod.declared_ports(),
            vec![
                port("http", 8080, "TCP"),
                port("dns", 53, "UDP"),
                port("grpc", 9090, "TCP")
            ]
        );
        let bare = k8s_openapi::api::core::v1::Pod::default();
        assert_eq!(TargetPod::namespace(&bare), "");
        assert!(TargetPod::labels(&bare).is_empty());
        assert!(bare.declared_ports().is_empty());
    }

    #[test]
    fn the_cached_pod_gives_the_same() {
        let pod: crate::pods::pod::Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "n", "name": "p", "labels": {"app": "web"}},
            "spec": {"containers": [
                {"name": "a", "ports": [{"name": "http", "containerPort": 8080},
                                        {"containerPort": 9000},
                                        {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                {"name": "c"},
            ]},
        }))
        .unwrap();
        assert_eq!(TargetPod::namespace(&pod), "n");
        assert_eq!(TargetPod::labels(&pod).get("app").unwrap(), "web");
        let port = |name: &str, number, protocol: &str| DeclaredPort {
            name: name.into(),
            number,
            protocol: protocol.into(),
        };
        assert_eq!(
            pod.declared_ports(),
            vec![port("http", 8080, "TCP"), port("dns", 53, "UDP")]
        );
        let bare = crate::pods::pod::Pod::default();
        assert_eq!(TargetPod::namespace(&bare), "");
        assert!(TargetPod::labels(&bare).is_empty());
    }
}
