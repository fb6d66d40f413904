//! A stand-in for the agent-sandbox `Sandbox` controller
//! (sigs.k8s.io/agent-sandbox), covering what vk-sandbox relies on
//! (behaviour.md §10.2 and §10.3): one Pod per Sandbox with the propagated
//! metadata, the owner reference and the sandboxd runtime mutator; the Pod
//! re-created under the same name when it disappears; deleted when the
//! Sandbox is suspended or its `shutdownTime` passes; the Sandbox status fed
//! back from the Pod.
//!
//! Not covered: Services, PVCs, SandboxTemplate/Claim/WarmPool, Events.
//!
//! Tests run it in-process with [`spawn`]; the `sandbox-controller` binary
//! runs the same loop for the demo.

pub mod controller;
pub mod crd;
pub mod pod;
pub mod status;
pub mod types;

pub use controller::{ControllerHandle, Options, run, spawn};
pub use pod::DefaultRuntime;
pub use types::{Sandbox, SandboxSpec, SandboxStatus};
