//! sandboxd HTTP client and wire types (docs/architecture.md#sandboxd-api).
//!
//! - [`client`]: the pooled reqwest client (claim, release, list, info)
//!   and the one request path every call takes; `auth` makes every
//!   `Authorization` header;
//! - [`decode`]: reply mapping as pure functions of status and body;
//! - [`types`]: request and reply types;
//! - [`lease_deadline`] and [`owner_addr`]: parsing of the two fields whose
//!   shapes vary between sandboxd builds (a sandbox's lease deadline, its
//!   owner address);
//! - [`verbs`], [`verbs_types`], [`verbs_decode`]: the lifecycle and
//!   buffered data-plane calls (hibernate, wake, renew, get, stats, owner,
//!   exec), their types and pure decoders;
//! - [`relay`]: the `/agent` and `/ports` upgrades and their byte stream,
//!   [`RelayStream`];
//! - [`error`] and [`refusal`]: the error taxonomy.

mod auth;
pub mod client;
pub mod decode;
pub mod drain;
pub mod error;
pub mod lease_deadline;
pub mod owner_addr;
pub mod refusal;
pub mod relay;
pub mod types;
pub mod verbs;
pub mod verbs_decode;
pub mod verbs_types;

pub use client::{
    ClientBuilder, DEFAULT_TIMEOUT, Observer, SandboxdClient, normalise_base_url, read_token_file,
};
pub use decode::RawReply;
pub use error::{Op, SandboxdError};
pub use lease_deadline::{Deadline, parse_deadline};
pub use owner_addr::{NoUsableAddress, OwnerAddr, pod_ip_from_owner_addr};
pub use refusal::Refusal;
pub use relay::{AGENT_PROTOCOL, PORT_PROTOCOL, RelayStream};
pub use types::{
    ClaimRequest, Granted, MAX_TTL_SECONDS, NodeInfo, PoolInfo, PoolKey, ReleaseOutcome,
    SandboxRow, SandboxState, Secret, Token,
};
pub use verbs::EXEC_TIMEOUT_MARGIN;
pub use verbs_types::{
    ExecOutput, ExecRequest, OwnerProbe, SandboxAuth, SandboxInfo, SandboxStats,
};
