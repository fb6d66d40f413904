//! The Sandbox's lifecycle on a microVM (docs/pod-contract.md, "Lifecycle";
//! docs/architecture.md, "Sandbox lifecycle"): a suspended owner's VM is
//! hibernated and woken for the Pod that comes back, a living owner's lease
//! is renewed, an expired or moved owner's VM is released. What the owner
//! asks is read in [`crate::pods::owner`].
//!
//! - [`decide`]: what the owner's state does to the VM, on a Pod's deletion
//!   and at each claim's upkeep turn (pure);
//! - [`schedule`]: when a lease is renewed, and for how long (pure);
//! - [`observe`]: what a record becomes when sandboxd lists its VM in
//!   another state (pure).

pub mod decide;
pub mod observe;
pub mod schedule;

/// Event reasons (docs/pod-contract.md lists them with their actions).
pub mod reason {
    pub const HIBERNATED: &str = "SandboxHibernated";
    pub const HIBERNATE_FAILED: &str = "SandboxHibernateFailed";
    /// Actions of a `SandboxHibernateFailed`.
    pub const HIBERNATE_REFUSED: &str = "HibernateRefused";
    pub const HIBERNATE_ERROR: &str = "HibernateFailed";
    pub const WOKEN: &str = "SandboxWoken";
    /// The action of a `ProviderCreateFailed` whose wake failed.
    pub const WAKE_FAILED: &str = "WakeFailed";
    /// The Pod's status reason while its VM cannot be woken.
    pub const WAKE_FAILED_STATUS: &str = "SandboxWakeFailed";
    pub const LOST: &str = "SandboxLost";
    pub const RENEW_FAILED: &str = "SandboxRenewFailed";
    pub const RENEW_ERROR: &str = "RenewFailed";
    /// The action of a `SandboxReleased` for a Sandbox that moved.
    pub const MOVED: &str = "SandboxMoved";
    pub const OWNER_GONE: &str = "SandboxOwnerGone";
}
