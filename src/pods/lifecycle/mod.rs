//! The Sandbox's lifecycle on a microVM (docs/pod-contract.md, "Lifecycle";
//! docs/architecture.md, "Sandbox lifecycle"): a suspended owner's VM is
//! hibernated and woken for the Pod that comes back, a living owner's lease
//! is renewed, an expired or moved owner's VM is released. What the owner
//! asks is read in [`crate::pods::owner`].
//!
//! - [`decide`]: what the owner's state does to the VM, on a Pod's deletion
//!   and at each claim's upkeep turn (pure);
//! - [`schedule`]: when a lease is renewed, and for how long (pure).

pub mod decide;
pub mod schedule;
