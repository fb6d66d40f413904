//! Whether to claim for a Pod whose key's VM another node holds. Pure.

use std::time::Duration;

use jiff::Timestamp;

/// What is known of a node the NodeInventories say holds the key's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderNode {
    /// Its Node object is gone (deleted with the node).
    Gone,
    /// Its Node; `unreachable_since`: its `SandboxdReachable` condition is
    /// `False` since then (`None`: reachable, or not said).
    Present {
        unreachable_since: Option<Timestamp>,
    },
    /// It could not be read.
    Unknown(String),
}

/// What to do before claiming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Claim here, as for any Pod: no other node holds its VM, or nothing
    /// is known (no index, not listed yet).
    Claim,
    /// Claim a fresh VM here, and say so: the node holding the VM is gone
    /// for good (`why`).
    ClaimMoved { from: String, why: String },
    /// Hand the Pod back: its VM lives on `node`.
    HandBack { node: String },
    /// Neither yet (a holder could not be read): retried.
    Wait(String),
}

/// The nodes other than `me` among those holding the key's VM (`None`:
/// nothing is known, the index has not listed yet).
pub fn others(held: Option<&[String]>, me: &str) -> Option<Vec<String>> {
    held.map(|nodes| nodes.iter().filter(|n| *n != me).cloned().collect())
}

/// The verdict from what is known of each other holder (normally one):
/// any that lives gets the Pod back; all gone for good (deleted, or
/// sandboxd unreachable for `grace`) lets this node claim.
pub fn decide(holders: &[(String, HolderNode)], now: Timestamp, grace: Duration) -> Verdict {
    let mut gone = Vec::new();
    for (node, known) in holders {
        match known {
            HolderNode::Gone => gone.push((node, "its Node is deleted".to_string())),
            HolderNode::Present {
                unreachable_since: Some(since),
            } if now
                .duration_since(*since)
                .try_into()
                .is_ok_and(|d: Duration| d >= grace) =>
            {
                gone.push((
                    node,
                    format!("its sandboxd has been unreachable since {since}"),
                ))
            }
            HolderNode::Present { .. } => return Verdict::HandBack { node: node.clone() },
            HolderNode::Unknown(why) => {
                return Verdict::Wait(format!(
                    "the VM of this Pod's key is held on node {node}, which cannot be read \
                     to tell whether it lives: {why}"
                ));
            }
        }
    }
    match gone.first() {
        None => Verdict::Claim,
        Some((node, why)) => Verdict::ClaimMoved {
            from: (*node).clone(),
            why: why.clone(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn others_leaves_this_node_out_and_knows_nothing_before_the_list() {
        let held = |n: &[&str]| -> Vec<String> { n.iter().map(|s| s.to_string()).collect() };
        assert_eq!(others(None, "a"), None);
        assert_eq!(others(Some(&held(&[])), "a"), Some(vec![]));
        assert_eq!(others(Some(&held(&["a"])), "a"), Some(vec![]));
        assert_eq!(
            others(Some(&held(&["a", "b"])), "a"),
            Some(vec!["b".to_string()])
        );
    }

    #[test]
    fn the_decision_table() {
        let now = at("2026-12-06T10:10:00Z");
        let grace = Duration::from_secs(300);
        let present = |since: Option<&str>| HolderNode::Present {
            unreachable_since: since.map(at),
        };
        let b = |k: HolderNode| vec![("b".to_string(), k)];
        let cases = [
            ("no other holder", vec![], Verdict::Claim),
            (
                "a live holder",
                b(present(None)),
                Verdict::HandBack { node: "b".into() },
            ),
            (
                "its sandboxd unreachable within the grace",
                b(present(Some("2026-12-06T10:05:01Z"))),
                Verdict::HandBack { node: "b".into() },
            ),
            (
                "its sandboxd unreachable for the grace",
                b(present(Some("2026-12-06T10:05:00Z"))),
                Verdict::ClaimMoved {
                    from: "b".into(),
                    why: "its sandboxd has been unreachable since 2026-12-06T10:05:00Z".into(),
                },
            ),
            (
                "a clock behind the condition",
                b(present(Some("2026-12-06T10:20:00Z"))),
                Verdict::HandBack { node: "b".into() },
            ),
            (
                "its Node deleted",
                b(HolderNode::Gone),
                Verdict::ClaimMoved {
                    from: "b".into(),
                    why: "its Node is deleted".into(),
                },
            ),
            (
                "unreadable",
                b(HolderNode::Unknown("503".into())),
                Verdict::Wait(
                    "the VM of this Pod's key is held on node b, which cannot be read to tell \
                     whether it lives: 503"
                        .into(),
                ),
            ),
            (
                "one gone, one alive: back to the live one",
                vec![
                    ("b".to_string(), HolderNode::Gone),
                    ("c".to_string(), present(None)),
                ],
                Verdict::HandBack { node: "c".into() },
            ),
        ];
        for (name, holders, want) in cases {
            assert_eq!(decide(&holders, now, grace), want, "{name}");
        }
    }
}
