//! How vk-sandbox names itself to the apiserver: the field manager of every
//! write, the reporting controller of every Event, and the User-Agent.

/// Field manager of every write vk-sandbox makes (server-side applies,
/// creates, replaces and merge patches alike), so `managedFields` and audit
/// logs show `vk-sandbox` and never `unknown`.
pub const FIELD_MANAGER: &str = "vk-sandbox";

/// The reporting controller of every Event written (the instance is the
/// node name).
pub const REPORTING_CONTROLLER: &str = "vk-sandbox";

/// The User-Agent of the Kubernetes client. The apiserver derives the
/// field manager of a write that names none from it (up to the first `/`),
/// which covers writes made by library code (kube's Event recorder).
pub const USER_AGENT: &str = concat!("vk-sandbox/", env!("CARGO_PKG_VERSION"));
