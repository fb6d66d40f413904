//! One line of the preflight checklist, and the bound of each check.

use std::fmt;
use std::time::Duration;

/// Upper bound of one check (one request, or one batch of concurrent
/// requests), so preflight never hangs.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Startup is not blocked, but something deserves attention.
    Warn,
    /// The daemon would refuse to start or could not work.
    Fail,
}

impl Status {
    /// The checklist marker, padded so details line up.
    pub fn marker(self) -> &'static str {
        match self {
            Status::Ok => "[ok]  ",
            Status::Warn => "[warn]",
            Status::Fail => "[FAIL]",
        }
    }
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Short name of what was checked (`apiserver`, `RBAC`, `sandboxd`, …).
    pub name: String,
    pub status: Status,
    /// One line saying what was found.
    pub detail: String,
    /// What to do about it (always set on failures; optional on warnings).
    pub fix: Option<String>,
}

impl CheckResult {
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Self {
        CheckResult {
            name: name.into(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(name: impl Into<String>, detail: impl Into<String>, fix: Option<String>) -> Self {
        CheckResult {
            name: name.into(),
            status: Status::Warn,
            detail: detail.into(),
            fix,
        }
    }

    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        CheckResult {
            name: name.into(),
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A check that could not run because an earlier one failed.
    pub fn not_checked(name: impl Into<String>, why: &str) -> Self {
        Self::warn(name, format!("not checked: {why}"), None)
    }
}

impl fmt::Display for CheckResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.marker(),
            self.name,
            one_line(&self.detail)
        )?;
        if let Some(fix) = &self.fix {
            write!(f, "\n       fix: {}", one_line(fix))?;
        }
        Ok(())
    }
}

/// Newlines (e.g. in a multi-problem configuration error) become `; `, so
/// every check stays one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A failed apiserver request, reduced to what the checks distinguish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// The apiserver answered with an error status.
    Status { code: u16, message: String },
    /// No answer within the check's timeout.
    Timeout,
    /// Connection, TLS or decoding failure.
    Other(String),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Status { code, message } => write!(f, "HTTP {code}: {message}"),
            ApiError::Timeout => write!(f, "no answer within {:?}", CHECK_TIMEOUT),
            ApiError::Other(e) => f.write_str(e),
        }
    }
}

impl From<kube::Error> for ApiError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => ApiError::Status {
                code: s.code,
                message: s.message,
            },
            other => ApiError::Other(other.to_string()),
        }
    }
}
