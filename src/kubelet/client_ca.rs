//! The CA that signs kubelet API client certificates: `--client-ca-file`,
//! or the cluster's own (the `client-ca-file` key of the ConfigMap
//! `kube-system/extension-apiserver-authentication`), read once at start.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use rustls::RootCertStore;

use crate::config::KubeletAuthConfig;
use crate::error::{Error, Result};

/// Attempts at reading the client CA ConfigMap before giving up.
const CLIENT_CA_ATTEMPTS: u32 = 3;

/// Namespace and name of the ConfigMap holding the cluster's client CA.
pub const CLIENT_CA_CONFIGMAP_NAMESPACE: &str = "kube-system";
pub const CLIENT_CA_CONFIGMAP_NAME: &str = "extension-apiserver-authentication";
pub const CLIENT_CA_CONFIGMAP_KEY: &str = "client-ca-file";

/// The client CA for kubelet API client certificates: `None` when auth is
/// off; else `--client-ca-file`, or the cluster's
/// kube-system/extension-apiserver-authentication `client-ca-file` key.
/// Call once at start (after the Kubernetes client exists, before the
/// kubelet API binds).
#[tracing::instrument(skip_all)]
pub async fn load_client_ca(
    cfg: &KubeletAuthConfig,
    client: &Client,
) -> Result<Option<Arc<RootCertStore>>> {
    if !cfg.enabled {
        tracing::warn!(
            "kubelet API authentication and authorization are off (--kubelet-auth=false)"
        );
        return Ok(None);
    }
    if let Some(path) = &cfg.client_ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            Error::Config(format!(
                "--client-ca-file (env VK_CLIENT_CA_FILE)={}: cannot read it: {e}; give a \
                 readable PEM CA bundle",
                path.display()
            ))
        })?;
        let source = format!("--client-ca-file {}", path.display());
        return crate::kubelet::tls::roots_from_pem(&pem, &source).map(Some);
    }
    let source = format!(
        "ConfigMap {CLIENT_CA_CONFIGMAP_NAMESPACE}/{CLIENT_CA_CONFIGMAP_NAME} key {CLIENT_CA_CONFIGMAP_KEY}"
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), CLIENT_CA_CONFIGMAP_NAMESPACE);
    let fix = "allow `get` on that ConfigMap (e.g. bind the Role \
               extension-apiserver-authentication-reader), or give --client-ca-file (env \
               VK_CLIENT_CA_FILE), or turn auth off with --kubelet-auth=false";
    // A few quick retries ride out an apiserver that is still starting;
    // a refusal (403) or absence (404) is final.
    let mut delay = Duration::from_millis(500);
    let mut attempt = 1;
    let cm = loop {
        match api.get(CLIENT_CA_CONFIGMAP_NAME).await {
            Ok(cm) => break cm,
            Err(kube::Error::Api(ae)) if ae.code == 403 || ae.code == 404 => {
                return Err(Error::Config(format!(
                    "reading the kubelet client CA from {source}: {} ({}); {fix}",
                    ae.message, ae.code
                )));
            }
            Err(e) if attempt >= CLIENT_CA_ATTEMPTS => {
                return Err(Error::kube(
                    format!("reading the kubelet client CA from {source} ({fix})"),
                    e,
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, attempt, "reading the kubelet client CA failed; retrying");
                tokio::time::sleep(delay).await;
                delay *= 2;
                attempt += 1;
            }
        }
    };
    let pem = cm
        .data
        .as_ref()
        .and_then(|d| d.get(CLIENT_CA_CONFIGMAP_KEY))
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| {
            Error::Config(format!(
                "{source} is missing: the apiserver has no --client-ca-file; give \
                 --client-ca-file (env VK_CLIENT_CA_FILE) or turn auth off with \
                 --kubelet-auth=false"
            ))
        })?;
    let roots = crate::kubelet::tls::roots_from_pem(pem.as_bytes(), &source)?;
    tracing::info!(%source, certificates = roots.len(), "kubelet client CA loaded");
    Ok(Some(roots))
}
