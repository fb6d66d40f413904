//! Pods bound to this node.

pub mod cache;
