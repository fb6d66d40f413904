use super::*;

fn owner(uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "agents.x-k8s.io/v1beta1".into(),
        kind: "Sandbox".into(),
        name: "sb".into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn released(s: &OwnerState) -> bool {
    s.releases()
}

#[test]
fn decision_table() {
    let o = owner("u1");
    assert!(released(&decide(None, &OwnerLookup::NoControllerRef)));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::BadRef("x".into())
    )));
    assert!(released(&decide(
        Some(&o),
        &OwnerLookup::NotFound {
            details_name: Some("sb".into())
        }
    )));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::NotFound { details_name: None }
    )));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::NotFound {
            details_name: Some("other".into())
        }
    )));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::Failed("403".into())
    )));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::Unserved("no served version".into())
    )));
    assert!(released(&decide(
        Some(&o),
        &OwnerLookup::Found {
            deleting: true,
            uid: "u1".into(),
            intent: Intent::default(),
        }
    )));
    assert!(released(&decide(
        Some(&o),
        &OwnerLookup::Found {
            deleting: false,
            uid: "u2".into(),
            intent: Intent::default(),
        }
    )));
    assert!(!released(&decide(
        Some(&o),
        &OwnerLookup::Found {
            deleting: false,
            uid: "u1".into(),
            intent: Intent::default(),
        }
    )));
    let no_uid = owner("");
    assert!(!released(&decide(
        Some(&no_uid),
        &OwnerLookup::Found {
            deleting: false,
            uid: "u9".into(),
            intent: Intent::default(),
        }
    )));
}

#[test]
fn controller_ref_finds_the_controller_among_owners() {
    let p = crate::pods::fixtures::owned_pod("p", "o1");
    let r = controller_ref(&p).expect("the Sandbox is the controller");
    assert_eq!((r.kind.as_str(), r.uid.as_str()), ("Sandbox", "o1"));
}

#[test]
fn controller_ref_ignores_non_controllers() {
    let mut p = Pod::default();
    let mut r = owner("u");
    r.controller = None;
    p.metadata.owner_references = Some(vec![r]);
    assert!(controller_ref(&p).is_none());
}
