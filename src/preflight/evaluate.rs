//! Pure evaluation of what [`super::probe`] observed into checklist lines.

use std::io::ErrorKind;
use std::path::Path;

use k8s_openapi::api::core::v1::Node;

pub use super::check::ApiError;
use super::check::CheckResult;
use crate::config::ListenAddr;
use crate::inventory::groups::{Choice, KNOWN};
use crate::inventory::types::{PLURAL, VERSION};
use crate::node::desired::adoptable;

mod sandboxd_checks;
mod webhook_config;

pub use sandboxd_checks::{SandboxdProblem, pool_label, pools, sandboxd};
pub use webhook_config::{Configured, Target, WEBHOOK_NAME, webhook_configuration};

/// The apiserver line: reachable (`GET /version`) and the credentials
/// accepted (a SelfSubjectReview names the user).
/// `source`: where the credentials came from, for messages.
pub fn apiserver(
    server: &str,
    source: &str,
    version: &Result<String, ApiError>,
    whoami: &Result<String, ApiError>,
) -> CheckResult {
    let name = "apiserver";
    let rejected = |version: &str| {
        CheckResult::fail(
            name,
            format!("{server}{version} rejected the credentials from {source} (HTTP 401)"),
            format!(
                "renew the token or client certificate in {source}, or point --kubeconfig at \
                 valid credentials"
            ),
        )
    };
    let version = match version {
        Ok(v) => v,
        // Invalid credentials are refused even where /version is public.
        Err(ApiError::Status { code: 401, .. }) => return rejected(""),
        Err(e) => {
            return CheckResult::fail(
                name,
                format!("cannot reach the apiserver at {server}: {e}"),
                format!(
                    "check the server address in {source} and that this host can reach it \
                     (firewall, proxy, DNS)"
                ),
            );
        }
    };
    match whoami {
        Ok(user) => CheckResult::ok(
            name,
            format!("{server} ({version}), authenticated as {user} (credentials: {source})"),
        ),
        Err(ApiError::Status { code: 401, .. }) => rejected(&format!(" ({version})")),
        // A cluster older than 1.28 serves no SelfSubjectReview; the RBAC
        // check's reviews still prove the credentials.
        Err(ApiError::Status { code: 404, .. }) => CheckResult::ok(
            name,
            format!(
                "{server} ({version}) reachable (credentials: {source}; this apiserver does \
                 not serve SelfSubjectReview, so the identity is not shown)"
            ),
        ),
        Err(e) => CheckResult::fail(
            name,
            format!("{server} ({version}): the authenticated request failed: {e}"),
            format!("check the credentials in {source} and the apiserver's health"),
        ),
    }
}

/// The NodeInventory CRD line. `served`: the versions in which each known
/// group (and `flag`'s) serves `nodeinventories` (empty: not installed);
/// `choice`: where vk-sandbox would publish (with `--publish-inventory`).
pub fn inventory_crd(
    publish: bool,
    flag: Option<&str>,
    served: &Result<Vec<(String, Vec<String>)>, ApiError>,
    choice: Option<&Choice>,
) -> CheckResult {
    let name = "NodeInventory CRD";
    let (served, choice) = match (publish, served, choice) {
        (false, _, _) | (_, _, None) => {
            return CheckResult::ok(name, "not needed (--publish-inventory is off)");
        }
        (true, Err(e), _) => {
            return CheckResult::fail(
                name,
                format!("cannot look {PLURAL} up through API discovery: {e}"),
                "check the apiserver connection",
            );
        }
        (true, Ok(served), Some(choice)) => (served, choice),
    };
    let versions_of = |group: &str| {
        served
            .iter()
            .find(|(g, _)| g == group)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    if let Some(group) = flag {
        let crd = format!("{PLURAL}.{group}");
        let versions = versions_of(group);
        return if versions.is_empty() {
            CheckResult::fail(
                name,
                format!(
                    "{crd} is not installed (the apiserver serves no {PLURAL} in {group}, the \
                     group --inventory-group names)"
                ),
                "install the CRD (sandbox-operator's chart, or this repository's crds/ for the \
                 group), set --inventory-group (env VK_INVENTORY_GROUP) to the group your \
                 operator serves or unset it to publish where a CRD is served, or drop \
                 --publish-inventory",
            )
        } else if versions.iter().any(|v| v == VERSION) {
            CheckResult::ok(
                name,
                format!(
                    "{crd} served ({}); publishes there (--inventory-group)",
                    versions.join(", ")
                ),
            )
        } else {
            CheckResult::fail(
                name,
                format!(
                    "{crd} is served only as {}; vk-sandbox writes {VERSION}",
                    versions.join(", ")
                ),
                "install a CRD version that serves v1beta1",
            )
        };
    }
    if choice.is_empty() {
        let elsewhere: Vec<String> = served
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(g, v)| format!("{PLURAL}.{g} only as {}", v.join(", ")))
            .collect();
        let detail = if elsewhere.is_empty() {
            format!(
                "no NodeInventory CRD is installed: the apiserver serves {PLURAL} in neither {} \
                 nor {}",
                KNOWN[0], KNOWN[1]
            )
        } else {
            format!(
                "no NodeInventory CRD serves {VERSION}: {}",
                elsewhere.join("; ")
            )
        };
        return CheckResult::fail(
            name,
            detail,
            "install the CRD your operator reads (sandbox-operator's chart, or this \
             repository's crds/<group>_nodeinventories.yaml), set --inventory-group (env \
             VK_INVENTORY_GROUP), or drop --publish-inventory",
        );
    }
    CheckResult::ok(name, format!("publishes in {}", choice.describe()))
}

/// What a look for a left-over NodeInventory in one group found: its
/// field managers when it exists.
pub type StaleLook = (String, Result<Option<Vec<String>>, ApiError>);

/// One line per known group vk-sandbox does not publish in where an
/// object named after `node` was found (stale: nobody updates it), or
/// could not be looked for.
pub fn inventory_stale(node: &str, found: &[StaleLook]) -> Vec<CheckResult> {
    let name = "NodeInventory left over";
    found
        .iter()
        .filter_map(|(group, found)| match found {
            Ok(None) => None,
            Ok(Some(managers)) => Some(CheckResult::warn(
                name,
                format!(
                    "{PLURAL}.{group}/{node} exists (written by {}) but vk-sandbox will not \
                     publish in {group}: its readers would see stale sandboxes and pools",
                    if managers.is_empty() {
                        "an unknown manager".to_string()
                    } else {
                        managers.join(", ")
                    }
                ),
                Some(format!(
                    "delete it (kubectl delete {PLURAL}.{group} {node}), or publish there too \
                     (unset --inventory-group to publish in every group served)"
                )),
            )),
            Err(e) => Some(CheckResult::warn(
                name,
                format!("cannot look for {PLURAL}.{group}/{node}: {e}"),
                Some(format!(
                    "grant get on {PLURAL} in {group} (manifests/rbac.yaml)"
                )),
            )),
        })
        .collect()
}

/// The node name line: no Node yet, a virtual one (adopted), or a physical
/// one (refused at start-up).
pub fn node_name(name: &str, existing: &Result<Option<Node>, ApiError>) -> CheckResult {
    let check = "node name";
    match existing {
        Ok(None) => CheckResult::ok(
            check,
            format!("no Node named {name} yet; it will be registered"),
        ),
        Ok(Some(node)) if adoptable(node) => CheckResult::ok(
            check,
            format!("Node {name} exists and is a virtual kubelet; it will be adopted"),
        ),
        Ok(Some(_)) => CheckResult::fail(
            check,
            format!(
                "Node {name} exists and is not a virtual kubelet (no label \
                 type=virtual-kubelet); it is probably the physical node, and vk-sandbox \
                 refuses to take it over"
            ),
            format!(
                "give the virtual node its own name with --node-name (env VK_NODE_NAME), \
                 e.g. {name}-sandboxd"
            ),
        ),
        Err(e) => CheckResult::fail(
            check,
            format!("cannot read Node {name}: {e}"),
            "the identity needs get on nodes (manifests/rbac.yaml)",
        ),
    }
}

/// The placement webhook's certificate pair line; `loaded`: how many
/// certificates the chain holds, or why the pair does not load.
pub fn webhook_pair(cert: &Path, key: &Path, loaded: &Result<usize, String>) -> CheckResult {
    let name = "webhook certificate";
    match loaded {
        Ok(n) => CheckResult::ok(
            name,
            format!(
                "{} and {} load ({n} certificate(s)); the webhook configuration's caBundle must \
                 hold their CA",
                cert.display(),
                key.display()
            ),
        ),
        Err(e) => CheckResult::fail(
            name,
            e.clone(),
            "give --webhook-tls-cert/--webhook-tls-key (env VK_WEBHOOK_TLS_CERT/VK_WEBHOOK_TLS_KEY) \
             a PEM pair whose key fits the certificate, issued for the webhook's Service name",
        ),
    }
}

/// Whether two bind addresses would compete for one port.
pub fn ports_clash(a: &ListenAddr, b: &ListenAddr) -> bool {
    a.port == b.port && (a.host == b.host || a.host.is_empty() || b.host.is_empty())
}

/// A listen port line from the outcome of binding it.
/// `flag`/`env`: e.g. `listen-addr`, `VK_LISTEN_ADDR`.
pub fn port(
    name: &str,
    flag: &str,
    env: &str,
    addr: &ListenAddr,
    bound: &Result<(), (ErrorKind, String)>,
) -> CheckResult {
    let other = format!("choose another --{flag} (env {env})");
    match bound {
        Ok(()) => CheckResult::ok(name, format!("{addr} is free")),
        Err((ErrorKind::AddrInUse, _)) => CheckResult::fail(
            name,
            format!("{addr} is already in use"),
            format!(
                "stop what listens there (ss -ltnp 'sport = :{}') or {other}; the host \
                 kubelet and vk-cocoon use :10250",
                addr.port
            ),
        ),
        Err((ErrorKind::PermissionDenied, e)) => CheckResult::fail(
            name,
            format!("not permitted to bind {addr}: {e}"),
            format!("ports below 1024 need root or CAP_NET_BIND_SERVICE; {other} above 1024"),
        ),
        Err((ErrorKind::AddrNotAvailable, e)) => CheckResult::fail(
            name,
            format!("cannot bind {addr}: {e}"),
            format!(
                "use an address of this host, or an empty host (:{}), or {other}",
                addr.port
            ),
        ),
        Err((_, e)) => CheckResult::fail(name, format!("cannot bind {addr}: {e}"), other),
    }
}

#[cfg(test)]
mod tests;
