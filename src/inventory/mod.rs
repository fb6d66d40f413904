//! NodeInventory publishing (docs/architecture.md#decision-nodeinventory):
//! the type and its CRD, the pure desired-object builder, and the publisher
//! loop.

pub mod desired;
pub mod groups;
pub mod publisher;
pub mod types;

pub use publisher::{Publisher, TickOutcome};
pub use types::{NodeInventory, crd_name};
