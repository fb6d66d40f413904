//! The Pod gauges, read from the watch cache at each scrape:
//! `vk_sandbox_pods{phase}` and `vk_sandbox_pods_pending_oldest_seconds{reason}`.

use std::collections::BTreeMap;

use kube::runtime::reflector::Store;

use super::pod::Pod;
use crate::error::Result;
use crate::metrics::{Metrics, SampledGauge};

/// Registers the Pod gauges over the watch cache `store`.
pub fn register(metrics: &Metrics, store: Store<Pod>) -> Result<()> {
    let pending = store.clone();
    metrics.register_sampled(SampledGauge::new(
        "vk_sandbox_pods",
        "Pods bound to this node, by phase.",
        "phase",
        move || by_phase(store.state().iter().map(|p| &**p)),
    )?)?;
    metrics.register_sampled(SampledGauge::new(
        PODS_PENDING_OLDEST,
        "How long the oldest Pending Pod bound to this node has been Pending, by Pod status \
         reason (none when it has none yet).",
        "reason",
        move || {
            let pods = pending.state();
            pending_oldest(pods.iter().map(|p| &**p), jiff::Timestamp::now())
        },
    )?)
}

/// Pods per phase (a Pod without one counts as Pending); every phase is
/// present, 0 when no Pod has it.
fn by_phase<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Vec<(String, i64)> {
    let mut by_phase: BTreeMap<String, i64> =
        ["Pending", "Running", "Succeeded", "Failed", "Unknown"]
            .into_iter()
            .map(|p| (p.to_string(), 0))
            .collect();
    for pod in pods {
        *by_phase
            .entry(pod.phase().unwrap_or("Pending").to_string())
            .or_default() += 1;
    }
    by_phase.into_iter().collect()
}

/// `vk_sandbox_pods_pending_oldest_seconds{reason}`: for each Pod status
/// reason among the Pending Pods bound to this node (`none` when the Pod
/// has none yet, e.g. `NoWarmCapacity` while it waits for a warm VM), how
/// long the oldest of them has been Pending: since it was bound to the node
/// (its `PodScheduled` condition), else since it was created. Pods being
/// deleted are not counted. No series when no Pod is Pending.
pub const PODS_PENDING_OLDEST: &str = "vk_sandbox_pods_pending_oldest_seconds";

/// The samples of [`PODS_PENDING_OLDEST`] for `pods` at `now`.
pub fn pending_oldest<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    now: jiff::Timestamp,
) -> Vec<(String, i64)> {
    let mut oldest: std::collections::BTreeMap<String, i64> = Default::default();
    for pod in pods {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let status = pod.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending") != "Pending" {
            continue;
        }
        let bound = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "True")
            })
            .and_then(|c| c.last_transition_time.as_ref());
        let Some(since) = bound.or(pod.metadata.creation_timestamp.as_ref()) else {
            continue;
        };
        let age = (now.as_second() - since.0.as_second()).max(0);
        let reason = status
            .and_then(|s| s.reason.clone())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| "none".to_string());
        let entry = oldest.entry(reason).or_insert(age);
        *entry = (*entry).max(age);
    }
    oldest.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_oldest_by_reason() {
        use crate::pods::pod::PodStatus;
        use k8s_openapi::api::core::v1::PodCondition;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let at = |s: &str| Time(s.parse().expect("ts"));
        let pod =
            |phase: Option<&str>, reason: Option<&str>, created: &str, bound: Option<&str>| {
                let mut p = Pod::default();
                p.metadata.creation_timestamp = Some(at(created));
                p.status = Some(PodStatus {
                    phase: phase.map(Into::into),
                    reason: reason.map(Into::into),
                    conditions: bound.map(|b| {
                        vec![PodCondition {
                            type_: "PodScheduled".into(),
                            status: "True".into(),
                            last_transition_time: Some(at(b)),
                            ..Default::default()
                        }]
                    }),
                    ..Default::default()
                });
                p
            };
        let mut deleting = pod(Some("Pending"), None, "2026-01-01T00:00:00Z", None);
        deleting.metadata.deletion_timestamp = Some(at("2026-01-01T00:00:01Z"));
        let pods = [
            // Waiting for capacity since binding 10 min ago (created earlier).
            pod(
                Some("Pending"),
                Some("NoWarmCapacity"),
                "2026-01-01T00:00:00Z",
                Some("2026-01-01T00:50:00Z"),
            ),
            pod(
                Some("Pending"),
                Some("NoWarmCapacity"),
                "2026-01-01T00:55:00Z",
                Some("2026-01-01T00:55:00Z"),
            ),
            // No status yet: Pending since created.
            pod(None, None, "2026-01-01T00:59:00Z", None),
            pod(Some("Running"), None, "2026-01-01T00:00:00Z", None),
            deleting,
        ];
        let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().expect("ts");
        assert_eq!(
            pending_oldest(&pods, now),
            vec![
                ("NoWarmCapacity".to_string(), 600),
                ("none".to_string(), 60)
            ]
        );
        assert!(pending_oldest(&pods[3..], now).is_empty());
    }

    #[test]
    fn phases_are_counted_and_all_present() {
        let pod = |phase: Option<&str>| Pod {
            status: phase.map(|ph| crate::pods::pod::PodStatus {
                phase: Some(ph.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = [pod(None), pod(Some("Running")), pod(Some("Running"))];
        assert_eq!(
            by_phase(&pods),
            vec![
                ("Failed".to_string(), 0),
                ("Pending".to_string(), 1),
                ("Running".to_string(), 2),
                ("Succeeded".to_string(), 0),
                ("Unknown".to_string(), 0),
            ]
        );
    }
}
