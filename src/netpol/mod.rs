//! Ingress NetworkPolicy for connections to sandbox Pods' own addresses
//! (docs/networkpolicy.md): no CNI sees them, so the relay that accepts
//! them is where the policies selecting the Pod are enforced.
//!
//! - `verdict` decides (pure); `selector` and `cidr` are its label
//!   selectors and address blocks; `target` reads the Pod a connection is
//!   for.
//! - `peers` says which label-selected Pod watches the policies need and
//!   indexes their Pods by address (pure); `watches` runs the watches.
//! - `egress` compares the egress policies selecting a Pod with sandboxd's
//!   lane (pure; nothing here enforces egress) and `egress_events` reports
//!   a gap as a Warning Event on the Pod.
//! - `enforcer` is the handle: [`NetworkPolicies::verdict`] per connection,
//!   [`NetworkPolicies::run`] for the watches; `admission` is the relay's
//!   `Admission` made of it.

pub mod admission;
pub mod cidr;
pub mod egress;
pub mod egress_events;
pub mod enforcer;
pub mod peers;
pub mod selector;
pub mod target;
pub mod verdict;
pub mod watches;

pub use admission::PolicyAdmission;
pub use enforcer::{LocalPods, NetworkPolicies};
pub use target::TargetPod;
pub use verdict::Verdict;
