//! The Kubernetes client: credentials in kube-rs's order (in-cluster
//! service account first, then `--kubeconfig`, then `$KUBECONFIG`, then
//! `~/.kube/config`), vk-sandbox's User-Agent, a deadline on every call
//! that is not a watch ([`deadline`]), which covers the wait for a token
//! of the `--kube-api-qps`/`-burst` and `--event-qps`/`-burst` buckets
//! ([`rate`]; the node's Lease and Node requests are never throttled).

pub mod deadline;
pub mod progress;
pub mod rate;
pub mod transport;

use std::path::PathBuf;
use std::sync::Arc;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tracing::info;

use crate::{Error, Result};

/// Where the credentials came from (logged at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    InCluster,
    Kubeconfig(PathBuf),
}

fn kubeconfig_candidates(flag: Option<PathBuf>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    v.extend(flag);
    if let Some(env) = std::env::var_os("KUBECONFIG").filter(|s| !s.is_empty()) {
        // Like kubectl, the first file of a list is the one read here.
        v.extend(std::env::split_paths(&env).next());
    }
    if let Some(home) = std::env::var_os("HOME").filter(|s| !s.is_empty()) {
        v.push(PathBuf::from(home).join(".kube").join("config"));
    }
    v
}

/// Builds the client configuration.
pub async fn config(kubeconfig_flag: Option<PathBuf>) -> Result<(Config, Source)> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        match Config::incluster() {
            Ok(c) => return Ok((c, Source::InCluster)),
            Err(e) => info!(error = %e, "in-cluster credentials unusable; trying a kubeconfig"),
        }
    }
    let flag_given = kubeconfig_flag.is_some();
    let candidates = kubeconfig_candidates(kubeconfig_flag);
    for (i, path) in candidates.iter().enumerate() {
        let explicit = i == 0 && flag_given;
        if !explicit && !path.exists() {
            continue;
        }
        let kc = Kubeconfig::read_from(path).map_err(|e| {
            Error::Config(format!(
                "kubeconfig {}: {e}; fix the file or point --kubeconfig at a valid one",
                path.display()
            ))
        })?;
        let c = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| {
                Error::Config(format!(
                    "kubeconfig {}: {e}; fix the file or point --kubeconfig at a valid one",
                    path.display()
                ))
            })?;
        return Ok((c, Source::Kubeconfig(path.clone())));
    }
    Err(Error::Config(no_credentials(&candidates)))
}

/// The refusal when no kubeconfig was found: it names each file looked for
/// (a `KUBECONFIG` naming a missing file is not "unset").
fn no_credentials(looked_at: &[PathBuf]) -> String {
    let tried = if looked_at.is_empty() {
        "no --kubeconfig, KUBECONFIG unset and HOME unset".to_string()
    } else {
        let files: Vec<String> = looked_at.iter().map(|p| p.display().to_string()).collect();
        format!(
            "no --kubeconfig and none of these exist: {}",
            files.join(", ")
        )
    };
    format!("no Kubernetes credentials: not running in a cluster, {tried}; pass --kubeconfig PATH")
}

/// The daemon's client; its watches report their progress to `watches`.
pub async fn client(
    settings: &crate::config::KubeClientConfig,
    watches: Arc<progress::WatchProgress>,
) -> Result<(Client, Source)> {
    let (cfg, source) = config(settings.kubeconfig.clone()).await?;
    let limits = Limits {
        call_deadline: deadline::DEFAULT,
        qps: settings.qps,
        burst: settings.burst,
        event_qps: settings.event_qps,
        event_burst: settings.event_burst,
    };
    Ok((build_watched(cfg, limits, watches)?, source))
}

/// The client-side limits of every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bound of each non-watch call, send to the end of its body.
    pub call_deadline: std::time::Duration,
    /// `--kube-api-qps` / `--kube-api-burst`.
    pub qps: f32,
    pub burst: u32,
    /// `--event-qps` / `--event-burst`.
    pub event_qps: f32,
    pub event_burst: u32,
}

impl Limits {
    /// Buckets far above any test's traffic, and `call_deadline`.
    pub fn generous(call_deadline: std::time::Duration) -> Limits {
        Limits {
            call_deadline,
            qps: 1000.0,
            burst: 1000,
            event_qps: 1000.0,
            event_burst: 1000,
        }
    }
}

/// The client for `cfg`: vk-sandbox's User-Agent (the apiserver names the
/// field manager of writes that name none after it), and every request but
/// a watch rate-limited in its lane and bounded by its deadline from the
/// call (the wait for a token included) to the end of the reply's body.
pub fn build(cfg: Config, limits: Limits) -> Result<Client> {
    build_watched(cfg, limits, progress::WatchProgress::new())
}

/// [`build`], with the progress of its watches reported to `watches`.
pub fn build_watched(
    mut cfg: Config,
    limits: Limits,
    watches: Arc<progress::WatchProgress>,
) -> Result<Client> {
    cfg.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(crate::identity::USER_AGENT),
    ));
    let builder = transport::builder(cfg)?;
    // Layers added later wrap the earlier ones: the deadline is outermost,
    // so the wait in a bucket counts against it.
    Ok(builder
        .with_layer(&progress::ProgressLayer::new(watches))
        .with_layer(&rate::RateLimitLayer::new(
            (limits.qps, limits.burst),
            (limits.event_qps, limits.event_burst),
        ))
        .with_layer(&deadline::DeadlineLayer::new(limits.call_deadline))
        .build())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The call deadline covers the wait for a token: a request that would
    /// wait 100 s in the bucket fails at its deadline (it waited the 100 s
    /// and then had the whole deadline again).
    #[tokio::test]
    async fn the_deadline_covers_the_wait_for_a_token() {
        let seen = std::sync::Arc::new(transport::tests::Seen::default());
        let cfg = transport::tests::apiserver(&[b"h2"], Duration::ZERO, seen).await;
        let limits = Limits {
            qps: rate::MIN_QPS,
            burst: 1,
            ..Limits::generous(Duration::from_millis(300))
        };
        let client = build(cfg, limits).expect("client");
        let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
            kube::Api::namespaced(client, "default");
        api.get("cm").await.expect("the burst's token");
        // Bounded only so a regression fails instead of waiting 100 s.
        let second = tokio::time::timeout(Duration::from_secs(20), api.get("cm"))
            .await
            .expect("the deadline must end the wait");
        let err = second.expect_err("no token within the deadline");
        assert!(
            format!("{err:?}").contains("DeadlineExceeded"),
            "want the deadline error, got {err:?}"
        );
    }

    #[test]
    fn no_credentials_names_the_files_looked_for() {
        let msg = no_credentials(&[
            PathBuf::from("/etc/missing.kubeconfig"),
            PathBuf::from("/root/.kube/config"),
        ]);
        assert!(
            msg.contains("none of these exist: /etc/missing.kubeconfig, /root/.kube/config"),
            "{msg}"
        );
        assert!(!msg.contains("KUBECONFIG unset"), "{msg}");
        assert!(msg.ends_with("pass --kubeconfig PATH"), "{msg}");
        let msg = no_credentials(&[]);
        assert!(msg.contains("KUBECONFIG unset and HOME unset"), "{msg}");
    }
}
