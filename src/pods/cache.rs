//! The watch of Pods bound to this node (`spec.nodeName=<node>`, all
//! namespaces): a reflector store that feeds the kubelet API's `/pods` and
//! the node's readiness.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::warn;

use crate::kubelet::PodSource;

pub fn watch_config(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node}"))
}

/// Starts the watch; returns the store and the future that drives it (run
/// it until shutdown). Watch errors are retried with back-off, never fatal.
pub fn start(
    client: Client,
    node: &str,
) -> (
    Store<Pod>,
    impl std::future::Future<Output = ()> + Send + use<>,
) {
    let api: Api<Pod> = Api::all(client);
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watch_config(node))
        .default_backoff()
        .modify(|p| {
            // The cache needs neither managedFields nor last-applied blobs.
            p.metadata.managed_fields = None;
        })
        .reflect(writer)
        .applied_objects();
    let drive = async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                warn!(error = %e, "pod watch error; retrying");
            }
        }
    };
    (reader, drive)
}

/// `/pods` from the watch cache; `/runningpods/` from what the provider
/// tracks (empty until the Pod controller claims or adopts something).
pub struct CachedPods {
    pub store: Store<Pod>,
    pub running: Arc<dyn Fn() -> Vec<Pod> + Send + Sync>,
}

impl PodSource for CachedPods {
    fn node_pods(&self) -> Vec<Pod> {
        let mut pods: Vec<Pod> = self.store.state().iter().map(|p| (**p).clone()).collect();
        pods.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        pods
    }

    fn running_pods(&self) -> Vec<Pod> {
        (self.running)()
    }
}
