//! Ingress NetworkPolicy for connections to sandbox Pods' own addresses
//! (docs/networkpolicy.md): no CNI sees them, so the relay that accepts
//! them is where the policies selecting the Pod are enforced. `verdict`
//! decides (pure); `selector` and `cidr` are its label selectors and
//! address blocks.

pub mod cidr;
pub mod selector;
pub mod verdict;
