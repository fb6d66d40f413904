//! CustomResourceDefinitions for the tests: applied (server-side), then
//! waited for until API discovery lists the kind and the kind can be
//! listed, the two ways vk-sandbox and its preflight look for them.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersion;
use kube::{Api, Client};

use super::wait_for;

/// The field manager of everything the tests apply.
const MANAGER: &str = "vk-sandbox-tests";

/// Applies `crd` and waits until every version it serves is usable.
pub async fn install(client: &Client, crd: &CustomResourceDefinition) {
    let name = crd.metadata.name.clone().expect("a CRD has a name");
    Api::<CustomResourceDefinition>::all(client.clone())
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
    let spec = &crd.spec;
    for version in spec.versions.iter().filter(|v| v.served) {
        let resource = ApiResource {
            group: spec.group.clone(),
            version: version.name.clone(),
            api_version: format!("{}/{}", spec.group, version.name),
            kind: spec.names.kind.clone(),
            plural: spec.names.plural.clone(),
        };
        wait_served(client, &resource).await;
    }
}

/// [`install`] of the CRD in the YAML file `path` (e.g. one of `crds/`).
pub async fn install_file(client: &Client, path: &Path) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a CRD: {e}", path.display()));
    install(client, &crd).await;
}

/// Waits until API discovery lists `resource` in its group version and the
/// kind can be listed: a CRD just applied is neither for a moment.
pub async fn wait_served(client: &Client, resource: &ApiResource) {
    let gv = GroupVersion::gv(&resource.group, &resource.version);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    wait_for(
        &format!("{} {} to be served", resource.api_version, resource.kind),
        Duration::from_secs(60),
        || async {
            let group = kube::discovery::oneshot::pinned_group(client, &gv)
                .await
                .map_err(|e| format!("discovery: {e}"))?;
            if !group
                .resources_by_stability()
                .iter()
                .any(|(ar, _)| ar.plural == resource.plural)
            {
                return Err("not in API discovery yet".into());
            }
            api.list(&ListParams::default().limit(1))
                .await
                .map(|_| ())
                .map_err(|e| format!("list: {e}"))
        },
    )
    .await;
}

/// The NodeInventory resource (v1beta1) in `group`.
pub fn nodeinventories(group: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: "v1beta1".into(),
        api_version: format!("{group}/v1beta1"),
        kind: "NodeInventory".into(),
        plural: "nodeinventories".into(),
    }
}
