//! The `claim_ref` vk-sandbox sends with every claim, and how a listed
//! row's `claim_ref` is read back. Pure.
//!
//! sandboxd stores `claim_ref` verbatim and echoes it in its listing; it is
//! not unique, and other clients of the same sandboxd write it too (the
//! sandbox-operator's aggregated apiserver writes `<namespace>/<Sandbox>`,
//! which is also the key of that Sandbox's Pod). So a plain
//! `<namespace>/<name>` proves nothing about who claimed a row. vk-sandbox
//! therefore writes `<namespace>/<name>#vk-sandbox:<pod-uid>`: `#` cannot
//! occur in a Kubernetes namespace or name, and the UID is that of a Pod
//! bound to this node, so only this node's vk-sandbox writes it. A row is
//! *ours* only when its `claim_ref` carries that tag; rows without it (other
//! clients, and rows written by the Go implementation or by vk-sandbox
//! before the tag existed) are never returned. See docs/reliability.md
//! ("Lost claim replies among neighbours").

/// Separates the Pod key from the tag.
const TAG: &str = "#vk-sandbox:";

/// The `claim_ref` for a claim made for the Pod `key` with UID `uid`. A Pod
/// without a UID (never the case for a Pod read from the apiserver) gets the
/// bare key, which is never read back as ours.
pub fn for_pod(key: &str, uid: &str) -> String {
    if uid.is_empty() {
        key.to_string()
    } else {
        format!("{key}{TAG}{uid}")
    }
}

/// A `claim_ref` read back from a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parsed<'a> {
    /// The Pod key (`<namespace>/<name>`), or the whole `claim_ref` when it
    /// is not one of ours.
    pub key: &'a str,
    /// The Pod UID when the row carries vk-sandbox's tag: proof that this
    /// node's vk-sandbox made the claim.
    pub ours: Option<&'a str>,
}

/// Reads a listed row's `claim_ref`. A tag with an empty UID, or a key
/// part that is not `<namespace>/<name>`, is not ours.
pub fn parse(claim_ref: &str) -> Parsed<'_> {
    match claim_ref.split_once(TAG) {
        Some((key, uid)) if is_pod_key(key) && !uid.is_empty() && !uid.contains(TAG) => Parsed {
            key,
            ours: Some(uid),
        },
        _ => Parsed {
            key: claim_ref,
            ours: None,
        },
    }
}

/// The Pod key a `claim_ref` names, as shown to people and in the
/// NodeInventory: the tag dropped, anything else verbatim.
pub fn display(claim_ref: &str) -> &str {
    parse(claim_ref).key
}

/// Whether `row_ref` was written by vk-sandbox for the Pod `key` with UID
/// `uid`.
pub fn made_for(row_ref: &str, key: &str, uid: &str) -> bool {
    let p = parse(row_ref);
    p.key == key && p.ours == Some(uid)
}

fn is_pod_key(s: &str) -> bool {
    s.split_once('/')
        .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = for_pod("team-a/worker-0", "3f2a-uid");
        assert_eq!(r, "team-a/worker-0#vk-sandbox:3f2a-uid");
        assert_eq!(
            parse(&r),
            Parsed {
                key: "team-a/worker-0",
                ours: Some("3f2a-uid")
            }
        );
        assert_eq!(display(&r), "team-a/worker-0");
        assert!(made_for(&r, "team-a/worker-0", "3f2a-uid"));
        assert!(!made_for(&r, "team-a/worker-0", "other-uid"));
        assert!(!made_for(&r, "team-a/worker-1", "3f2a-uid"));
    }

    /// What neighbours and older writers put there is never ours.
    #[test]
    fn untagged_refs_are_not_ours() {
        for r in [
            "team-a/worker-0",
            "",
            "sb_1234",
            "fork-child-7",
            "team-a/worker-0#vk-sandbox:",
            "#vk-sandbox:uid",
            "worker-0#vk-sandbox:uid",
            "a/b/c#vk-sandbox:uid",
            "a/b#vk-sandbox:u#vk-sandbox:v",
            "team-a/worker-0#other:uid",
        ] {
            let p = parse(r);
            assert_eq!(p.ours, None, "{r:?} read as ours");
            assert_eq!(p.key, r, "{r:?}: the key of a foreign ref is the ref");
            assert!(!made_for(r, "team-a/worker-0", "uid"), "{r:?}");
        }
    }

    #[test]
    fn a_pod_without_uid_sends_the_bare_key() {
        assert_eq!(for_pod("ns/p", ""), "ns/p");
        assert_eq!(parse("ns/p").ours, None);
    }
}
