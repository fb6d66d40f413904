//! A Pod whose key's VM another node holds (docs/placement.md, "Without the
//! webhook"): the placement webhook pins such a Pod to that node, but when
//! it is down (or a Pod is bound elsewhere by hand) the Pod reaches this
//! one. Claiming here would give the Sandbox a second, empty VM while its
//! own (its memory and files) waits on the other node. So, before
//! claiming, the NodeInventories (watched, never asked per Pod) say
//! whether another node holds a VM for the key:
//!
//! - that node lives: the Pod is handed back (src/pods/handback.rs), so
//!   its owner makes a new one for the scheduler (and the webhook, once
//!   back) to place;
//! - that node is gone for good (its Node deleted, or its sandboxd
//!   unreachable for `--vm-holder-gone-after`): a fresh VM is claimed here
//!   and a Warning Event `SandboxMovedNode` says so; the other node, if it
//!   returns, releases its VM once it sees the Sandbox's Pod Running here
//!   (the upkeep's `Moved`), never before;
//! - that node cannot be read: nothing is claimed yet, retried.
//!
//! Until the watch has listed (start-up), nothing is known and the Pod is
//! claimed for as before.

pub mod decide;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

use self::decide::{HolderNode, Verdict};
use super::annotations::CLAIM_ID;
use super::handback::{self, How};
use super::pod::Pod;
use crate::fleet::decide::COND_REACHABLE;

/// The Warning Event's reason when a fresh VM is claimed for a Sandbox
/// whose VM was on a node gone for good.
pub const MOVED_NODE: &str = "SandboxMovedNode";

/// Which nodes hold a VM for a key (the placement webhook's NodeInventory
/// index implements it; this room does not depend on that one).
pub trait VmHolders: Send + Sync {
    /// The nodes holding a VM for `key`; `None` before the first list.
    fn nodes_holding(&self, key: &str) -> Option<Vec<String>>;
}

/// What to do before claiming for a Pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// Claim (or adopt) as usual.
    Claim,
    /// Claim a fresh VM, and post this Warning first.
    ClaimMoved(String),
    /// Hand the Pod back this way, with this note.
    HandBack(How, String),
    /// Not yet: retried (why).
    Wait(String),
}

/// What is known of each of `nodes`.
async fn holders(client: &Client, nodes: &[String]) -> Vec<(String, HolderNode)> {
    let api: Api<Node> = Api::all(client.clone());
    let mut out = Vec::with_capacity(nodes.len());
    for name in nodes {
        let known = match api.get_opt(name).await {
            Ok(None) => HolderNode::Gone,
            Ok(Some(node)) => HolderNode::Present {
                unreachable_since: node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .find(|c| c.type_ == COND_REACHABLE && c.status == "False")
                    .and_then(|c| c.last_transition_time)
                    .map(|t| t.0),
            },
            Err(e) => HolderNode::Unknown(e.to_string()),
        };
        out.push((name.clone(), known));
    }
    out
}

/// The check before claiming for `pod` on `node` (`holds_claim`: a claim
/// is stored under its key here, which it adopts).
pub async fn check(
    pod: &Pod,
    node: &str,
    holds_claim: bool,
    index: &dyn VmHolders,
    client: &Client,
    gone_after: Duration,
) -> Before {
    if holds_claim || pod.annotation(CLAIM_ID).is_some() {
        return Before::Claim;
    }
    let key = pod.key();
    let held = index.nodes_holding(&key);
    let Some(others) = decide::others(held.as_deref(), node) else {
        return Before::Claim;
    };
    if others.is_empty() {
        return Before::Claim;
    }
    let known = holders(client, &others).await;
    match decide::decide(&known, jiff::Timestamp::now(), gone_after) {
        Verdict::Claim => Before::Claim,
        Verdict::ClaimMoved { from, why } => Before::ClaimMoved(format!(
            "{MOVED_NODE}: the VM of {key} was on node {from}, gone for good ({why}); a fresh \
             VM is claimed on node {node}, without the old one's memory and files"
        )),
        Verdict::HandBack { node: holder } => match handback::how(pod) {
            Some(how) => Before::HandBack(
                how,
                format!(
                    "{}: the VM of {key} is held on node {holder}, which lives; the Pod is \
                     given back so that it is placed there (is the placement webhook \
                     serving?), rather than claim a second VM on node {node}",
                    handback::REASON
                ),
            ),
            None => Before::Wait(format!(
                "the VM of {key} is held on node {holder}; a Pod without a controller is not \
                 handed back: delete it and create it on {holder}"
            )),
        },
        Verdict::Wait(why) => Before::Wait(why),
    }
}
