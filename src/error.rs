//! The crate's one error type. Each variant carries enough context to name
//! the problem and, where there is one, the fix.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// A flag, env var or file given at start-up is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("kubernetes API: {context}: {source}")]
    Kube {
        context: String,
        #[source]
        source: Box<kube::Error>,
    },

    #[error(transparent)]
    Sandboxd(#[from] crate::sandboxd::SandboxdError),

    /// A write conditional on the object as last read kept losing to newer
    /// versions; retried with back-off.
    #[error("{context}")]
    Conflict { context: String },

    /// Something inside the process failed that no configuration or input
    /// explains: a background task ended or panicked, a metric could not be
    /// built, an object could not be encoded.
    #[error("internal error: {0}")]
    Internal(String),

    /// A sandbox Pod could not be claimed for (yet); retried with back-off.
    #[error("{message}")]
    PodCreate {
        pod: String,
        /// `ProviderFailed` or `NoWarmCapacity`.
        reason: &'static str,
        message: String,
        /// Look again no later than this (a Pod's hand-back grace ends).
        retry_within: Option<std::time::Duration>,
    },

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The claims state (snapshot or journal) is malformed or unreadable:
    /// refuse to start, never discard it. `problem` says what is wrong and
    /// what to do.
    #[error("claims state {}: {problem}", path.display())]
    State {
        path: std::path::PathBuf,
        problem: String,
    },

    /// Persisting the claims state failed (at start-up this is fatal).
    /// `problem` names the file and the operation that failed.
    #[error(
        "claims state is not writable: {problem} (state path {}; check free space and that the directory is writable)",
        path.display()
    )]
    StateWrite {
        path: std::path::PathBuf,
        problem: String,
    },

    /// A claim was committed for a key that holds another claim id;
    /// overwriting would lose that claim's release credential.
    #[error(
        "claims key {key} already holds claim {held}; refusing to overwrite it with claim {offered} (release or drop the held claim first)"
    )]
    ClaimConflict {
        key: String,
        held: String,
        offered: String,
    },
}

impl Error {
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            context: context.into(),
            source: Box::new(source),
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// A short, stable label for metrics (`error` label of failure counters).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Kube { .. } => "kube",
            Error::Sandboxd(e) => e.metric_label(),
            Error::Conflict { .. } => "conflict",
            Error::Internal(_) => "internal",
            Error::Io { .. } => "io",
            Error::State { .. } => "state",
            Error::StateWrite { .. } => "state_write",
            Error::ClaimConflict { .. } => "claim_conflict",
            Error::PodCreate {
                reason: "NoWarmCapacity",
                ..
            } => "no_warm_capacity",
            Error::PodCreate { .. } => "pod_create",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
