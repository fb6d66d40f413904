//! The stand-in's Sandbox CRD (e2e/sandbox-controller/crds/), embedded, and
//! its installation (for tests; the demo applies the file with kubectl).

use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

use crate::types::Sandbox;

/// The file's text.
pub const CRD_YAML: &str = include_str!("../crds/agents.x-k8s.io_sandboxes.yaml");
pub const CRD_NAME: &str = "sandboxes.agents.x-k8s.io";

pub fn crd() -> Result<CustomResourceDefinition, String> {
    serde_saphyr::from_str(CRD_YAML)
        .map_err(|e| format!("e2e/sandbox-controller/crds/agents.x-k8s.io_sandboxes.yaml: {e}"))
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Server-side applies the CRD (idempotent; concurrent callers are fine),
/// then waits until it is Established and Sandboxes can be listed.
pub async fn install(client: &Client, timeout: Duration) -> Result<(), String> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let pp = PatchParams::apply(crate::controller::MANAGER).force();
    crds.patch(CRD_NAME, &pp, &Patch::Apply(&crd()?))
        .await
        .map_err(|e| format!("apply CRD {CRD_NAME}: {e}"))?;
    let sandboxes: Api<Sandbox> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match crds.get(CRD_NAME).await {
            Ok(c) if established(&c) => match sandboxes.list(&ListParams::default().limit(1)).await
            {
                Ok(_) => return Ok(()),
                Err(e) => format!("Established, but listing Sandboxes fails: {e}"),
            },
            Ok(_) => "not Established yet".to_string(),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "CRD {CRD_NAME} not usable after {timeout:?}: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
