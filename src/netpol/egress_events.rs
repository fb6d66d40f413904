//! The Warning Events of [`super::egress`]: every few seconds, each of the
//! node's sandbox Pods is compared with the egress policies selecting it,
//! and a Pod whose policies its lane does not express is told so once
//! (`EgressNotEnforced`), again when the message changes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info_span, warn};

use super::egress::Told;
use super::enforcer::NetworkPolicies;
use super::target::TargetPod;
use crate::identity::REPORTING_CONTROLLER;
use crate::pods::annotations::NET;
use crate::pods::pod::Pod;

/// How often the node's Pods are compared with the policies: a policy
/// change or a new Pod is reported within this.
const PERIOD: Duration = Duration::from_secs(2);

pub const REASON: &str = "EgressNotEnforced";

/// Reports, until `stop`, the node's Pods whose egress policies are not
/// what limits their VM.
pub async fn run(
    policies: Arc<NetworkPolicies>,
    pods: Store<Pod>,
    client: Client,
    node: String,
    stop: CancellationToken,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: Some(node.clone()),
        },
    );
    let mut told = Told::default();
    async move {
        loop {
            if policies.policies_known().is_some() {
                turn(&policies, &pods, &recorder, &mut told).await;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(PERIOD) => {}
            }
        }
    }
    .instrument(info_span!("egress_events", node = %node))
    .await
}

async fn turn(policies: &NetworkPolicies, pods: &Store<Pod>, recorder: &Recorder, told: &mut Told) {
    let mut present = BTreeSet::new();
    for pod in pods.state() {
        let Some(uid) = pod.metadata.uid.clone() else {
            continue;
        };
        present.insert(uid.clone());
        let lane = pod.annotation(NET).unwrap_or_default();
        let gap = policies.egress_gap(pod.namespace(), pod.labels(), lane);
        let Some(note) = told.update(&uid, gap) else {
            continue;
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: REASON.into(),
            note: Some(note),
            action: "CompareEgressPolicy".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &pod.object_ref(&())).await {
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let pod = format!("{}/{name}", pod.namespace());
            warn!(%pod, error = %e, "egress Event not recorded; tried again next turn");
            told.forget(&uid);
        }
    }
    told.keep_only(&present);
}
