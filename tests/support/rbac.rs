//! Runs vk-sandbox as the ServiceAccount `manifests/rbac.yaml` binds, so the
//! tests prove the shipped RBAC is sufficient. Works on any cluster the
//! admin kubeconfig names.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client};
use serde_json::json;

pub const NAMESPACE: &str = "sandbox-system";
pub const SERVICE_ACCOUNT: &str = "vk-sandbox";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Server-side applies every document of a YAML manifest file.
pub async fn apply_manifest(client: &Client, path: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // API discovery answers 404 for a moment while a CRD's group is being
    // registered or removed (another test's CRD): retried, bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let discovery = loop {
        match Discovery::new(client.clone()).run().await {
            Ok(d) => break d,
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("discovery: {e}")),
        }
    };
    let pp = PatchParams::apply("vk-sandbox-tests").force();
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_str_multiple(&text).map_err(|e| e.to_string())?;
    for value in docs {
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject = serde_json::from_value(value).map_err(|e| e.to_string())?;
        let tm = obj
            .types
            .clone()
            .ok_or("manifest document without apiVersion/kind")?;
        let gvk = kube::core::GroupVersionKind::try_from(&tm).map_err(|e| e.to_string())?;
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .ok_or_else(|| format!("{gvk:?} is not served by this cluster"))?;
        let name = obj
            .metadata
            .name
            .clone()
            .ok_or("manifest object without a name")?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(&name, &pp, &Patch::Apply(&obj))
            .await
            .map_err(|e| format!("apply {} {name}: {e}", ar.kind))?;
    }
    Ok(())
}

/// Applies manifests/rbac.yaml and writes a kubeconfig holding a token of
/// its ServiceAccount to `out`. The server and CA come from `admin`.
pub async fn service_account_kubeconfig(
    client: &Client,
    admin: &Path,
    out: &Path,
) -> Result<PathBuf, String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces
        .get_opt(NAMESPACE)
        .await
        .map_err(|e| e.to_string())?
        .is_none()
    {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
        }))
        .map_err(|e| e.to_string())?;
        match namespaces.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(ae)) if ae.code == 409 => {}
            Err(e) => return Err(format!("create namespace {NAMESPACE}: {e}")),
        }
    }
    apply_manifest(client, &repo_root().join("manifests/rbac.yaml")).await?;
    token_kubeconfig(client, admin, NAMESPACE, SERVICE_ACCOUNT, out).await
}

/// Writes to `out` a kubeconfig holding a token of the existing
/// ServiceAccount `namespace/name`. The server and CA come from `admin`.
pub async fn token_kubeconfig(
    client: &Client,
    admin: &Path,
    namespace: &str,
    name: &str,
    out: &Path,
) -> Result<PathBuf, String> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let req: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 172800}
    }))
    .map_err(|e| e.to_string())?;
    let token = sas
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .map_err(|e| format!("token for {namespace}/{name}: {e}"))?
        .status
        .ok_or("TokenRequest without status")?
        .token;

    let mut kc = Kubeconfig::read_from(admin).map_err(|e| e.to_string())?;
    let context = kc
        .current_context
        .clone()
        .ok_or("admin kubeconfig has no current-context")?;
    let cluster_name = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or("admin kubeconfig: current context not found")?;
    kc.clusters.retain(|c| c.name == cluster_name);
    kc.auth_infos = vec![kube::config::NamedAuthInfo {
        name: "vk-sandbox".into(),
        auth_info: Some(kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        }),
        other: Default::default(),
    }];
    kc.contexts = vec![kube::config::NamedContext {
        name: "vk-sandbox".into(),
        context: Some(kube::config::Context {
            cluster: cluster_name,
            user: Some("vk-sandbox".into()),
            ..Default::default()
        }),
        other: Default::default(),
    }];
    kc.current_context = Some("vk-sandbox".into());
    let yaml = serde_saphyr::to_string(&kc).map_err(|e| e.to_string())?;
    std::fs::write(out, yaml).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out.to_path_buf())
}

/// A token for ServiceAccount `ns/name` (created here).
pub async fn sa_token(client: &Client, ns: &str, name: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    match sas
        .create(
            &PostParams::default(),
            &super::from_json(
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
            ),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(ae)) if ae.code == 409 => {}
        Err(e) => panic!("create ServiceAccount {ns}/{name}: {e}"),
    }
    let req: TokenRequest = super::from_json(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }));
    sas.create_token_request(name, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("token for {ns}/{name}: {e}"))
        .status
        .expect("TokenRequest status")
        .token
}

/// A ClusterRole of `rule` bound to ServiceAccount `ns/sa`; returns its
/// name (role and binding share it) for [`revoke`].
pub async fn grant(client: &Client, ns: &str, sa: &str, rule: serde_json::Value) -> String {
    let name = format!("kauth-{sa}-{}", super::suffix());
    let roles: Api<ClusterRole> = Api::all(client.clone());
    roles
        .create(
            &PostParams::default(),
            &super::from_json(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": [rule]
            })),
        )
        .await
        .expect("create ClusterRole");
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .create(
            &PostParams::default(),
            &super::from_json(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]
            })),
        )
        .await
        .expect("create ClusterRoleBinding");
    name
}

pub async fn revoke(client: &Client, name: &str) {
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
    let _ = Api::<ClusterRole>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}
