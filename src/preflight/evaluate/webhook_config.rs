//! The placement webhook's configuration line: whether a
//! MutatingWebhookConfiguration sends sandbox Pods to the webhook, and
//! whether the Service it names has a ready endpoint (the apiserver's way
//! in). Pure: [`crate::preflight::probe`] lists and reads.

use crate::preflight::check::{ApiError, CheckResult};

/// The webhook's name in the configurations vk-sandbox ships
/// (manifests/placement, the chart).
pub const WEBHOOK_NAME: &str = "placement.sandbox.cocoonstack.io";

const LINE: &str = "webhook configuration";

/// Where a configuration sends the webhook's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Service, and its ready endpoints as read (`Err`: not read).
    Service {
        namespace: String,
        name: String,
        ready: Result<usize, ApiError>,
    },
    /// A URL (not checked from here).
    Url(String),
    /// Neither (the apiserver refuses such a configuration).
    Nothing,
}

/// One configuration holding the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configured {
    pub configuration: String,
    pub target: Target,
    pub failure_policy: String,
}

const INSTALL: &str = "apply the kustomize component manifests/placement, or set \
     placementWebhook.enabled=true in the Helm chart (docs/placement.md)";

/// The line for what the apiserver listed.
pub fn webhook_configuration(listed: &Result<Vec<Configured>, ApiError>) -> CheckResult {
    let found = match listed {
        Err(ApiError::Status { code: 403, .. }) => {
            return CheckResult::warn(
                LINE,
                "not checked: these credentials may not list mutatingwebhookconfigurations",
                Some(
                    "grant list on mutatingwebhookconfigurations.admissionregistration.k8s.io and \
                     endpointslices.discovery.k8s.io (the ClusterRole of manifests/placement)"
                        .into(),
                ),
            );
        }
        Err(e) => return CheckResult::warn(LINE, format!("not checked: {e}"), None),
        Ok(found) => found,
    };
    let Some(first) = found.first() else {
        return CheckResult::warn(
            LINE,
            format!(
                "no MutatingWebhookConfiguration has the webhook {WEBHOOK_NAME}: this node serves \
                 it, but nothing sends Pods to it, so sandbox Pods are placed by the scheduler \
                 alone (one reaching a node other than its VM's is handed back)"
            ),
            Some(INSTALL.into()),
        );
    };
    let policy = &first.failure_policy;
    match &first.target {
        Target::Service {
            namespace,
            name,
            ready: Ok(n),
        } if *n > 0 => CheckResult::ok(
            LINE,
            format!(
                "{} sends sandbox Pods to service {namespace}/{name} ({n} ready endpoint(s)), \
                 failurePolicy {policy}",
                first.configuration
            ),
        ),
        Target::Service {
            namespace,
            name,
            ready: Ok(_),
        } => CheckResult::warn(
            LINE,
            format!(
                "{} sends sandbox Pods to service {namespace}/{name}, which has no ready \
                 endpoint: the apiserver cannot reach the webhook (failurePolicy {policy}: \
                 {})",
                first.configuration,
                if policy == "Fail" {
                    "sandbox Pods cannot be created"
                } else {
                    "Pods are admitted unplaced"
                }
            ),
            Some(format!(
                "run vk-sandbox with --webhook-addr where the Service {namespace}/{name} selects \
                 it, and check its port"
            )),
        ),
        Target::Service {
            namespace,
            name,
            ready: Err(e),
        } => CheckResult::warn(
            LINE,
            format!(
                "{} sends sandbox Pods to service {namespace}/{name}; its endpoints were not \
                 read: {e}",
                first.configuration
            ),
            None,
        ),
        Target::Url(url) => CheckResult::ok(
            LINE,
            format!(
                "{} sends sandbox Pods to {url} (not reached from here), failurePolicy {policy}",
                first.configuration
            ),
        ),
        Target::Nothing => CheckResult::warn(
            LINE,
            format!("{} names neither a service nor a URL", first.configuration),
            Some(INSTALL.into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preflight::check::Status;

    fn service(ready: Result<usize, ApiError>, policy: &str) -> Vec<Configured> {
        vec![Configured {
            configuration: "vk-sandbox-placement".into(),
            target: Target::Service {
                namespace: "sandbox-system".into(),
                name: "vk-sandbox-webhook".into(),
                ready,
            },
            failure_policy: policy.into(),
        }]
    }

    #[test]
    fn each_observation_reads_as_its_line() {
        let forbidden = ApiError::Status {
            code: 403,
            message: "forbidden".into(),
        };
        let cases = [
            (
                Err(forbidden),
                Status::Warn,
                "not checked: these credentials",
            ),
            (
                Err(ApiError::Timeout),
                Status::Warn,
                "not checked: no answer",
            ),
            (
                Ok(vec![]),
                Status::Warn,
                "no MutatingWebhookConfiguration has the webhook",
            ),
            (
                Ok(service(Ok(2), "Ignore")),
                Status::Ok,
                "vk-sandbox-placement sends sandbox Pods to service \
                 sandbox-system/vk-sandbox-webhook (2 ready endpoint(s)), failurePolicy Ignore",
            ),
            (
                Ok(service(Ok(0), "Ignore")),
                Status::Warn,
                "which has no ready endpoint: the apiserver cannot reach the webhook \
                 (failurePolicy Ignore: Pods are admitted unplaced)",
            ),
            (
                Ok(service(Ok(0), "Fail")),
                Status::Warn,
                "(failurePolicy Fail: sandbox Pods cannot be created)",
            ),
            (
                Ok(service(Err(ApiError::Timeout), "Ignore")),
                Status::Warn,
                "its endpoints were not read",
            ),
            (
                Ok(vec![Configured {
                    configuration: "c".into(),
                    target: Target::Url("https://127.0.0.1:10262/mutate-pods".into()),
                    failure_policy: "Ignore".into(),
                }]),
                Status::Ok,
                "c sends sandbox Pods to https://127.0.0.1:10262/mutate-pods (not reached from here)",
            ),
            (
                Ok(vec![Configured {
                    configuration: "c".into(),
                    target: Target::Nothing,
                    failure_policy: "Ignore".into(),
                }]),
                Status::Warn,
                "names neither a service nor a URL",
            ),
        ];
        for (listed, status, detail) in cases {
            let line = webhook_configuration(&listed);
            assert_eq!(line.name, LINE);
            assert_eq!(line.status, status, "{listed:?}");
            assert!(line.detail.contains(detail), "{listed:?}: {}", line.detail);
        }
    }

    /// The probe over a scripted apiserver: only the placement webhook's
    /// entries, a Service's ready endpoints counted (not-ready ones not).
    #[tokio::test]
    async fn the_probe_reads_the_configurations_and_counts_ready_endpoints() {
        use crate::pods::fixtures::ApiServer;
        use serde_json::json;
        let api = ApiServer::new(|s| match s.path() {
            "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations" => (
                200,
                json!({"apiVersion": "admissionregistration.k8s.io/v1",
                    "kind": "MutatingWebhookConfigurationList", "metadata": {}, "items": [
                    {"metadata": {"name": "other"}, "webhooks": [{"name": "other.example.com",
                        "clientConfig": {"url": "https://x"}, "sideEffects": "None",
                        "admissionReviewVersions": ["v1"]}]},
                    {"metadata": {"name": "vk-sandbox-placement"}, "webhooks": [{
                        "name": WEBHOOK_NAME, "failurePolicy": "Ignore",
                        "clientConfig": {"service": {"namespace": "sandbox-system",
                            "name": "vk-sandbox-webhook"}},
                        "sideEffects": "None", "admissionReviewVersions": ["v1"]}]},
                ]}),
            ),
            "/apis/discovery.k8s.io/v1/namespaces/sandbox-system/endpointslices" => {
                assert!(
                    s.uri.contains(
                        "labelSelector=kubernetes.io%2Fservice-name%3Dvk-sandbox-webhook"
                    ),
                    "{}",
                    s.uri
                );
                (
                    200,
                    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                    "metadata": {}, "items": [{"addressType": "IPv4", "metadata": {"name": "e"},
                    "endpoints": [
                        {"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                        {"addresses": ["10.0.0.2"], "conditions": {"ready": false}},
                        {"addresses": ["10.0.0.3"]},
                    ]}]}),
                )
            }
            _ => (404, serde_json::Value::Null),
        });
        let found = crate::preflight::probe::webhook_configurations(&api.client)
            .await
            .expect("listed");
        assert_eq!(
            found,
            vec![Configured {
                configuration: "vk-sandbox-placement".into(),
                target: Target::Service {
                    namespace: "sandbox-system".into(),
                    name: "vk-sandbox-webhook".into(),
                    ready: Ok(2),
                },
                failure_policy: "Ignore".into(),
            }]
        );
    }
}
