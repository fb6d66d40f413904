//! The `Sandbox` resource (`agents.x-k8s.io/v1beta1`) as far as this
//! stand-in reads and writes it. The CRD installed in clusters is the
//! hand-written `e2e/sandbox-controller/crds/agents.x-k8s.io_sandboxes.yaml`
//! (upstream's own CRD where the upstream controller runs); the derive only
//! provides the typed API (its schema generation is disabled).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "agents.x-k8s.io";
pub const API_VERSION: &str = "agents.x-k8s.io/v1beta1";
pub const KIND: &str = "Sandbox";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "agents.x-k8s.io",
    version = "v1beta1",
    kind = "Sandbox",
    plural = "sandboxes",
    shortname = "sandbox",
    namespaced,
    status = "SandboxStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct SandboxSpec {
    #[serde(default)]
    pub pod_template: PodTemplate,
    /// Accepted and stored; the stand-in does not create PVCs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_claim_templates: Vec<serde_json::Value>,
    /// Accepted and stored; the stand-in does not create a Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_policy: Option<ShutdownPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operating_mode: Option<OperatingMode>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodTemplate {
    #[serde(default)]
    pub metadata: TemplateMetadata,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TemplateMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// What happens to the Sandbox once `shutdownTime` has passed (the Pod is
/// deleted either way). The CRD defaults it to `Retain`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ShutdownPolicy {
    Delete,
    #[default]
    Retain,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OperatingMode {
    #[default]
    Running,
    Suspended,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStatus {
    #[serde(
        rename = "serviceFQDN",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub service_fqdn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    #[serde(rename = "podIPs", default, skip_serializing_if = "Vec::is_empty")]
    pub pod_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

impl SandboxStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

impl Sandbox {
    pub fn operating_mode(&self) -> OperatingMode {
        self.spec.operating_mode.unwrap_or_default()
    }

    pub fn shutdown_policy(&self) -> ShutdownPolicy {
        self.spec.shutdown_policy.unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use serde_json::Value;

    fn repo_file(path: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../..")
            .join(path);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// The hand-written CRD names what the typed API expects.
    #[test]
    fn crd_yaml_matches_the_typed_resource() {
        let crd: Value = serde_saphyr::from_str(&repo_file(
            "e2e/sandbox-controller/crds/agents.x-k8s.io_sandboxes.yaml",
        ))
        .expect("yaml");
        let derived = serde_json::to_value(Sandbox::crd()).expect("crd json");
        assert_eq!(crd["metadata"]["name"], derived["metadata"]["name"]);
        assert_eq!(crd["spec"]["group"], GROUP);
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        for key in ["kind", "plural", "singular", "shortNames"] {
            assert_eq!(
                crd["spec"]["names"][key], derived["spec"]["names"][key],
                "{key}"
            );
        }
        let versions = crd["spec"]["versions"].as_array().expect("versions");
        let names: Vec<_> = versions.iter().map(|v| v["name"].clone()).collect();
        assert_eq!(names, vec!["v1beta1", "v1alpha1"]);
        assert_eq!(versions[0]["storage"], true);
        assert_eq!(versions[1]["storage"], false);
        assert!(versions.iter().all(|v| v["served"] == true));
        assert_eq!(versions[0]["schema"], versions[1]["schema"]);
        assert_eq!(crd["spec"]["conversion"]["strategy"], "None");
        assert_eq!(versions[0]["subresources"]["status"], serde_json::json!({}));
        // The embedded copy parses as a typed CRD.
        let typed = crate::crd::crd().expect("typed CRD");
        assert_eq!(typed.spec.versions.len(), 2);
    }

    #[test]
    fn example_sandbox_parses() {
        let sb: Sandbox =
            serde_saphyr::from_str(&repo_file("manifests/examples/sandbox.yaml")).expect("example");
        assert_eq!(sb.metadata.name.as_deref(), Some("demo"));
        let ann = &sb.spec.pod_template.metadata.annotations;
        assert_eq!(ann["sandbox.cocoonstack.io/runtime"], "sandboxd");
        assert_eq!(ann["sandbox.cocoonstack.io/template"], "base:24.04");
        assert_eq!(sb.operating_mode(), OperatingMode::Running);
        assert_eq!(sb.shutdown_policy(), ShutdownPolicy::Retain);
    }
}
