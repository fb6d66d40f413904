//! The virtual Node: its desired shape (pure), registration/adoption and
//! status heartbeats, and the node Lease.

pub mod desired;
pub mod lease;
pub mod register;

pub use desired::NodeSettings;
