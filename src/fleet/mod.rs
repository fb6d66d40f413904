//! sandboxd's capacity and health on the Node (docs/operations.md,
//! "Fleet: capacity, conditions and taints"): one reader of `/v1/info`
//! ([`feed`]) whose readings the NodeInventory publisher and the Node
//! status share, and the pure decision ([`decide`]) from a reading to the
//! Node's allocatable, conditions and taints.

pub mod decide;
pub mod feed;
pub mod reading;
pub mod taints;
