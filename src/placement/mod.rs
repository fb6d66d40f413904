//! Placement follows the VM (docs/placement.md): a mutating admission
//! webhook for sandbox Pods that pins a Pod to the node holding its key's
//! VM (as the NodeInventories say) and gives it the node-outage
//! tolerations, so a resumed or replaced Sandbox gets its own VM back and
//! an agent's outage evicts nothing.
//!
//! - [`holders`]: key → nodes, from inventories (pure);
//! - [`decide`]: a Pod and its key's holders → a JSON patch (pure);
//! - [`watch`]: the NodeInventory watch that keeps the index;
//! - [`webhook`]: the `AdmissionReview` handler;
//! - [`serve`]: the server in the daemon.

pub mod decide;
pub mod holders;
pub mod serve;
pub mod watch;
pub mod webhook;
