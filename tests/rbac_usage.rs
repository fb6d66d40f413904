//! Least privilege, checked from the other side: every verb
//! `manifests/rbac.yaml` grants must have been used by vk-sandbox during the
//! end-to-end run. The local control plane writes an audit log (Metadata
//! level) of the `sandbox-system/vk-sandbox` ServiceAccount's requests;
//! `e2e/run-tests.sh` runs this test after the suite with
//! `VK_RBAC_AUDIT_LOG` (the log) and `VK_RBAC_AUDIT_FROM` (its size before
//! the suite started, so older runs do not count). Without them it skips.
//!
//! The other direction (nothing vk-sandbox calls is missing) is proven by
//! the suite itself: it runs vk-sandbox with that ServiceAccount.

use std::collections::BTreeSet;
use std::io::{Read, Seek, SeekFrom};

const USER: &str = "system:serviceaccount:sandbox-system:vk-sandbox";

use vk_sandbox::preflight::rbac::Grant;

fn grants(manifest: &str) -> BTreeSet<Grant> {
    vk_sandbox::preflight::rbac::grants_of(manifest)
        .expect("manifests/rbac.yaml")
        .0
}

/// What one audited request used, as the grant that allowed it could be
/// written. A server-side apply that created its object (`patch` answered
/// 201) used `create` as well.
fn used(event: &serde_json::Value) -> Vec<(String, String, String, String, String)> {
    if event["user"]["username"] != USER {
        return vec![];
    }
    let code = event["responseStatus"]["code"].as_i64().unwrap_or(0);
    if code == 403 || code == 401 {
        return vec![];
    }
    let o = &event["objectRef"];
    let Some(resource) = o["resource"].as_str() else {
        return vec![];
    };
    let resource = match o["subresource"].as_str() {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource.to_string(),
    };
    let group = o["apiGroup"].as_str().unwrap_or("").to_string();
    let ns = o["namespace"].as_str().unwrap_or("").to_string();
    let name = o["name"].as_str().unwrap_or("").to_string();
    let verb = event["verb"].as_str().unwrap_or("").to_string();
    let mut out = vec![(
        ns.clone(),
        name.clone(),
        group.clone(),
        resource.clone(),
        verb.clone(),
    )];
    if verb == "patch" && code == 201 {
        out.push((ns, name, group, resource, "create".into()));
    }
    out
}

fn covers(grant: &Grant, ns: &str, name: &str, group: &str, resource: &str, verb: &str) -> bool {
    let (w, g, r, v) = grant;
    let place = match w.split_once('/') {
        _ if w == "*" => true,
        Some((gns, gname)) => gns == ns && gname == name,
        None => w == ns,
    };
    place && g == group && r == resource && v == verb
}

/// The grants no audited request used.
fn unused(
    grants: &BTreeSet<Grant>,
    events: &[(String, String, String, String, String)],
) -> Vec<Grant> {
    grants
        .iter()
        .filter(|g| {
            !events
                .iter()
                .any(|(ns, name, group, r, v)| covers(g, ns, name, group, r, v))
        })
        .cloned()
        .collect()
}

#[test]
fn every_granted_verb_was_used() {
    let (Some(log), from) = (
        std::env::var_os("VK_RBAC_AUDIT_LOG"),
        std::env::var("VK_RBAC_AUDIT_FROM")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0),
    ) else {
        eprintln!(
            "SKIPPED: VK_RBAC_AUDIT_LOG is not set (e2e/run-tests.sh sets it after the full suite)"
        );
        return;
    };
    let mut file = std::fs::File::open(&log).expect("open the audit log");
    file.seek(SeekFrom::Start(from)).expect("seek");
    let mut text = String::new();
    file.read_to_string(&mut text).expect("read the audit log");
    let events: Vec<_> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|e| used(&e))
        .collect();
    assert!(
        events.len() > 100,
        "only {} audited requests of {USER}: did the suite run against this plane?",
        events.len()
    );
    let manifest = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/rbac.yaml"),
    )
    .expect("rbac.yaml");
    let left = unused(&grants(&manifest), &events);
    assert!(
        left.is_empty(),
        "manifests/rbac.yaml grants verbs vk-sandbox never used in the whole end-to-end run \
         (remove them, or add the test that exercises them): {left:#?}"
    );
}

/// The check itself: a grant nothing used is reported; a Role grant is
/// used only in its namespace; a resourceNames grant only on that object;
/// an apply that created counts as create.
#[test]
fn the_check_finds_unused_grants() {
    let manifest = r#"
kind: ClusterRole
rules:
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["list", "delete"]
  - apiGroups: ["x.io"]
    resources: ["things"]
    verbs: ["create", "patch"]
---
kind: Role
metadata: {namespace: kube-node-lease}
rules:
  - apiGroups: ["coordination.k8s.io"]
    resources: ["leases"]
    verbs: ["update"]
---
kind: Role
metadata: {namespace: kube-system}
rules:
  - apiGroups: [""]
    resources: ["configmaps"]
    resourceNames: ["ca"]
    verbs: ["get"]
"#;
    let g = grants(manifest);
    let ev = |ns: &str, name: &str, group: &str, res: &str, verb: &str, code: i64| {
        serde_json::json!({
            "user": {"username": USER}, "verb": verb, "responseStatus": {"code": code},
            "objectRef": {"resource": res, "namespace": ns, "name": name, "apiGroup": group},
        })
    };
    let events: Vec<_> = [
        ev("a", "p", "", "pods", "list", 200),
        ev("a", "p", "", "pods", "delete", 403),
        ev("", "t", "x.io", "things", "patch", 201),
        ev(
            "default",
            "l",
            "coordination.k8s.io",
            "leases",
            "update",
            200,
        ),
        ev("kube-system", "other", "", "configmaps", "get", 200),
        serde_json::json!({"user": {"username": "someone"}, "verb": "delete",
            "responseStatus": {"code": 200}, "objectRef": {"resource": "pods"}}),
    ]
    .iter()
    .flat_map(used)
    .collect();
    let left: Vec<String> = unused(&g, &events)
        .into_iter()
        .map(|(w, _, r, v)| format!("{w} {r} {v}"))
        .collect();
    assert_eq!(
        left,
        vec![
            "* pods delete".to_string(),
            "kube-node-lease leases update".to_string(),
            "kube-system/ca configmaps get".to_string(),
        ]
    );
}
