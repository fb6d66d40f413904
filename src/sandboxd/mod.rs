//! sandboxd HTTP client and wire types (docs/architecture.md#sandboxd-api).
//!
//! - [`client`]: the pooled reqwest client (claim, release, list, info);
//! - [`decode`]: reply mapping as pure functions of status and body;
//! - [`types`]: request and reply types;
//! - [`lease_deadline`] and [`owner_addr`]: parsing of the two fields whose
//!   shapes vary between sandboxd builds (a sandbox's lease deadline, its
//!   owner address);
//! - [`error`]: the error taxonomy.

pub mod client;
pub mod decode;
pub mod error;
pub mod lease_deadline;
pub mod owner_addr;
pub mod types;

pub use client::{
    ClientBuilder, DEFAULT_TIMEOUT, Observer, SandboxdClient, normalise_base_url, read_token_file,
};
pub use decode::RawReply;
pub use error::{Op, SandboxdError};
pub use lease_deadline::{Deadline, parse_deadline};
pub use owner_addr::{NoUsableAddress, OwnerAddr, pod_ip_from_owner_addr};
pub use types::{
    ClaimRequest, Granted, MAX_TTL_SECONDS, NodeInfo, PoolInfo, PoolKey, ReleaseOutcome,
    SandboxRow, SandboxState, Secret, Token,
};
