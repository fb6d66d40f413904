//! A stand-in for the upstream agent-sandbox `Sandbox` controller
//! (kubernetes-sigs/agent-sandbox 1.0), used only where upstream cannot be
//! fetched or built (e2e/agent-sandbox.sh decides). It models upstream for what
//! vk-sandbox relies on: one Pod per Sandbox, named after it, with the
//! propagated metadata and one controller owner reference, the template's
//! spec unchanged; the Pod re-created under the same name when it
//! disappears; deleted when the Sandbox is suspended or its `shutdownTime`
//! passes; the Sandbox status fed back from the Pod with upstream's
//! conditions. tests/e2e_controller_parity.rs runs one scenario against
//! both and compares the Pods.
//!
//! Not covered: Services, PVCs, SandboxTemplate/Claim/WarmPool, Events,
//! adopting unowned Pods, the labels upstream propagates for its
//! extensions. cocoonstack sandbox-operator's runtime mutator (sandboxd
//! nodeSelector and toleration) is an explicit opt-in mode
//! (`Options::runtime_mutator`, `--runtime-mutator`), never the default.
//!
//! Tests run it in-process with [`spawn`]; the `sandbox-controller` binary
//! runs the same loop.

pub mod controller;
pub mod crd;
pub mod pod;
pub mod status;
pub mod types;

pub use controller::{ControllerHandle, Options, run, spawn};
pub use pod::DefaultRuntime;
pub use types::{Sandbox, SandboxSpec, SandboxStatus};
