//! The reconcile loop: a kube-runtime `Controller` over Sandboxes that owns
//! Pods. Each pass reads the Sandbox's Pod from the API, acts (create,
//! delete, metadata sync) and writes the status the Pod implies.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::pod::{self, DefaultRuntime, NAME_HASH_LABEL, POD_NAME_ANNOTATION};
use crate::status::{self, Blocker};
use crate::types::{OperatingMode, Sandbox, ShutdownPolicy};

/// Field manager of every write.
pub const MANAGER: &str = "sandbox-controller";
/// Periodic re-check of every Sandbox (shutdownTime is also honoured on time).
const RESYNC: Duration = Duration::from_secs(60);

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Watch one namespace only (tests run one controller per namespace);
    /// `None` = every namespace.
    pub namespace: Option<String>,
    /// Also act as cocoonstack's sandbox-operator runtime mutator (which
    /// adds the sandboxd nodeSelector and toleration): an explicit mode,
    /// off by default, because upstream agent-sandbox does no such thing.
    pub runtime_mutator: bool,
    /// The mutator's `--default-runtime` (only with `runtime_mutator`).
    pub default_runtime: DefaultRuntime,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Sandbox {0} has no namespace")]
    NoNamespace(String),
}

struct Ctx {
    client: Client,
    options: Options,
}

fn is_status(e: &kube::Error, codes: &[u16]) -> bool {
    matches!(e, kube::Error::Api(s) if codes.contains(&s.code))
}

/// Runs the controller until the future is dropped (or the watches end).
pub async fn run(client: Client, options: Options) {
    let (sandboxes, pods): (Api<Sandbox>, Api<Pod>) = match &options.namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    info!(namespace = ?options.namespace, runtime_mutator = options.runtime_mutator,
        default_runtime = ?options.default_runtime, "sandbox controller stand-in starting");
    let ctx = Arc::new(Ctx { client, options });
    Controller::new(sandboxes, watcher::Config::default())
        .owns(pods, watcher::Config::default().labels(NAME_HASH_LABEL))
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => debug!(sandbox = %obj, "reconciled"),
                Err(e) => warn!("reconcile: {e}"),
            }
        })
        .await;
}

/// A controller running on the current Tokio runtime; dropping the handle
/// stops it.
pub struct ControllerHandle {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ControllerHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn spawn(client: Client, options: Options) -> ControllerHandle {
    ControllerHandle {
        task: tokio::spawn(run(client, options)),
    }
}

fn error_policy(sandbox: Arc<Sandbox>, error: &Error, _ctx: Arc<Ctx>) -> Action {
    warn!(sandbox = %sandbox.name_any(), "reconcile failed, retrying in 2s: {error}");
    Action::requeue(Duration::from_secs(2))
}

/// Deletes `pod` (UID precondition) unless it is already going.
async fn delete_pod(pods: &Api<Pod>, pod: &Pod, why: &str) -> Result<(), Error> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    info!(pod = %pod.name_any(), "deleting Pod: {why}");
    match pods.delete(&pod.name_any(), &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, &[404, 409]) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes the Sandbox's legacy `agents.x-k8s.io/pod-name` annotation when
/// it is there: agent-sandbox 1.0 still follows it to a Pod adopted under
/// another name, clears it once that Pod is gone or the Sandbox is
/// suspended, and never sets it.
async fn clear_pod_name(sandboxes: &Api<Sandbox>, sandbox: &Sandbox) -> Result<(), Error> {
    if !sandbox.annotations().contains_key(POD_NAME_ANNOTATION) {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": {POD_NAME_ANNOTATION: null}}});
    match sandboxes
        .patch(
            &sandbox.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, &[404]) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile(sandbox: Arc<Sandbox>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = sandbox.name_any();
    if sandbox.metadata.deletion_timestamp.is_some() {
        // Garbage collection takes the Pod; never re-create it now.
        return Ok(Action::await_change());
    }
    let ns = sandbox
        .namespace()
        .ok_or_else(|| Error::NoNamespace(name.clone()))?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let now = Timestamp::now();
    let pod_name = pod::pod_name(&sandbox);

    let mut blocker = None;
    let mut pod = match pods.get_opt(&pod_name).await? {
        Some(p) if pod::controlled_by(&p, &sandbox) => Some(p),
        Some(_) => {
            blocker = Some(Blocker::Conflict(format!(
                "Pod {pod_name} exists but is not controlled by this Sandbox"
            )));
            None
        }
        None => None,
    };
    if pod.is_none() && blocker.is_none() && pod_name != name {
        // The Pod the annotation named is gone: track nothing, and make
        // the Pod under the Sandbox's own name.
        clear_pod_name(&sandboxes, &sandbox).await?;
        pod = pods
            .get_opt(&name)
            .await?
            .filter(|p| pod::controlled_by(p, &sandbox));
    }

    let shutdown_at = sandbox.spec.shutdown_time.as_ref().map(|t| t.0);
    let expired = shutdown_at.is_some_and(|t| t <= now);
    if expired {
        if let Some(p) = &pod {
            delete_pod(&pods, p, "shutdownTime reached").await?;
        }
        if sandbox.shutdown_policy() == ShutdownPolicy::Delete {
            info!(sandbox = %name, "shutdownTime reached, policy Delete: deleting the Sandbox");
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: sandbox.metadata.uid.clone(),
                    resource_version: None,
                }),
                ..DeleteParams::background()
            };
            match sandboxes.delete(&name, &dp).await {
                Ok(_) => return Ok(Action::await_change()),
                Err(e) if is_status(&e, &[404, 409]) => return Ok(Action::await_change()),
                Err(e) => return Err(e.into()),
            }
        }
        if blocker.is_none() {
            blocker = Some(Blocker::Expired);
        }
    } else if sandbox.operating_mode() == OperatingMode::Suspended {
        if let Some(p) = &pod {
            delete_pod(&pods, p, "the Sandbox is suspended").await?;
        }
        clear_pod_name(&sandboxes, &sandbox).await?;
    } else if blocker.is_none() {
        let mutator = ctx
            .options
            .runtime_mutator
            .then_some(ctx.options.default_runtime);
        match pod::desired_pod(&sandbox, mutator) {
            Err(rejection) => {
                warn!(sandbox = %name, "no Pod: {rejection}");
                blocker = Some(Blocker::Rejected(rejection.to_string()));
            }
            Ok(desired) => match &pod {
                None => match pods.create(&PostParams::default(), &desired).await {
                    Ok(created) => {
                        info!(sandbox = %name, pod = %created.name_any(), uid = ?created.metadata.uid,
                            "created Pod");
                        pod = Some(created);
                    }
                    // Still terminating, or a cache race: look again shortly.
                    Err(e) if is_status(&e, &[409]) => {
                        return Ok(Action::requeue(Duration::from_millis(500)));
                    }
                    Err(e) => return Err(e.into()),
                },
                Some(existing) if existing.metadata.deletion_timestamp.is_none() => {
                    if let Some(patch) = pod::metadata_patch(existing, &sandbox) {
                        let existing_name = existing.name_any();
                        info!(pod = %existing_name, "syncing propagated metadata");
                        let pp = PatchParams::default();
                        pod = Some(
                            pods.patch(&existing_name, &pp, &Patch::Merge(&patch))
                                .await?,
                        );
                    }
                }
                // Terminating: re-created once it is gone (the watch says when).
                Some(_) => {}
            },
        }
    }

    let status = status::compute_status(&sandbox, pod.as_ref(), blocker.as_ref(), now);
    if sandbox.status.as_ref() != Some(&status) {
        let patch = status::status_patch(&status);
        let pp = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..PatchParams::default()
        };
        match sandboxes
            .patch_status(&name, &pp, &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                let ready = status.condition(status::READY);
                debug!(sandbox = %name, ready = ?ready.map(|c| (&c.status, &c.reason)),
                    "status written");
            }
            Err(e) if is_status(&e, &[404]) => return Ok(Action::await_change()),
            Err(e) => return Err(e.into()),
        }
    }

    let requeue = match shutdown_at {
        Some(t) if t > now => {
            let left = Duration::try_from(t.duration_since(now)).unwrap_or(RESYNC);
            left.min(RESYNC) + Duration::from_millis(50)
        }
        _ => RESYNC,
    };
    Ok(Action::requeue(requeue))
}
