//! Sandbox Pods bound to this node: the Pod contract (annotations and
//! claim refs), the statuses published, delete authorization, the provider
//! that claims and releases, and the controller that drives it.
//!
//! - [`controller`]: the kube-runtime Controller wiring and the reconcile;
//! - [`plan`]: what one reconcile does (pure);
//! - [`failure`]: what a failed create does to the Pod's status (pure);
//! - [`pod`]: the lean Pod type the watch cache holds, its key and
//!   predicates;
//! - [`synced`]: whether the watch has delivered its initial list;
//! - [`context`]: what reconciles share (Events, back-off, the start gate);
//! - [`writes`]: every write to a Pod, each conditional on that Pod;
//! - [`sweeps`]: the side loops (vanished Pods, lease expiry, refresh);
//! - [`owner`]: what a Pod's owner asks of its VM, read at a served version;
//! - [`upkeep`]: the lifecycle's side loop (renewals, pending hibernates,
//!   owners of claims with no Pod here);
//! - [`lifecycle`]: suspend, resume, renewal, expiry and moves of a claim's VM;
//! - [`provider`]: claims and releases against sandboxd and the claims store;
//! - [`source`]: the Pods the kubelet API reports;
//! - [`gauges`]: the Pod gauges, read from the watch cache at each scrape;
//! - [`work_first`]: after each list, Pods that need work are queued before
//!   the ones already served.

pub mod annotations;
pub mod authority;
pub mod claim_ref;
pub mod context;
pub mod controller;
pub mod elsewhere;
pub mod failure;
pub mod gauges;
pub mod handback;
pub mod lifecycle;
pub mod owner;
pub mod owners;
pub mod plan;
pub mod pod;
pub mod provider;
pub mod source;
pub mod status;
pub mod sweeps;
pub mod synced;
pub mod upkeep;
pub mod work_first;
pub mod writes;

#[cfg(test)]
mod elsewhere_tests;
#[cfg(test)]
mod fixture_tests;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod handback_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod side_loop_tests;
#[cfg(test)]
mod suspend_tests;
#[cfg(test)]
mod upkeep_tests;
