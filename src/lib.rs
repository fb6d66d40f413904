//! vk-sandbox: a virtual kubelet that turns sandbox Pods bound to its Node
//! into sandboxd microVM claims.

pub mod activity;
pub mod admin;
pub mod backoff;
pub mod build_info;
pub mod claims;
pub mod claims_cli;
pub mod config;
pub mod cordon;
pub mod crypto;
pub mod error;
pub mod fleet;
pub mod health;
pub mod identity;
pub mod inventory;
pub mod kube_client;
pub mod kubelet;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod netpol;
pub mod node;
pub mod orphan;
pub mod periodic;
pub mod placement;
pub mod podnet;
pub mod pods;
pub mod preflight;
pub mod runtime;
pub mod sandboxd;
pub mod spdy;
pub mod stream_stats;
pub mod supervise;
pub mod telemetry;

pub use error::{Error, Result};
