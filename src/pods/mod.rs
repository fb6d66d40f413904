//! Sandbox Pods bound to this node: the Pod contract (annotations), the
//! statuses published, delete authorization, the provider that claims and
//! releases, and the controller that drives it.

pub mod annotations;
pub mod authority;
pub mod controller;
pub mod provider;
pub mod status;
