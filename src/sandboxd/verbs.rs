//! The client's lifecycle and buffered data-plane calls: hibernate, wake,
//! renew, the single-sandbox read, stats, the owner probe and the buffered
//! exec (docs/architecture.md#sandboxd-api). The upgrades are in
//! [`super::relay`].

use std::num::NonZeroU64;
use std::time::Duration;

use percent_encoding::utf8_percent_encode;

use super::auth::Credential;
use super::client::{PATH_SEGMENT, SandboxdClient};
use super::error::{Op, SandboxdError};
use super::lease_deadline::Deadline;
use super::types::Secret;
use super::verbs_decode::{
    decode_exec, decode_get, decode_no_content, decode_owner, decode_renew, decode_stats,
};
use super::verbs_types::{
    ExecBody, ExecOutput, ExecRequest, OwnerProbe, RenewBody, SandboxAuth, SandboxInfo,
    SandboxStats,
};

/// Extra time a buffered exec's request gets beyond the command's own
/// `timeout_seconds`, for sandboxd to kill it and answer `504`.
pub const EXEC_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

impl SandboxdClient {
    /// `{base}/v1/sandboxes/{id}{suffix}`, the id path-escaped; an empty id
    /// is refused locally.
    pub(super) fn sandbox_url(
        &self,
        op: Op,
        id: &str,
        suffix: &str,
    ) -> Result<String, SandboxdError> {
        if id.is_empty() {
            return Err(SandboxdError::InvalidRequest {
                op,
                message: "empty sandbox id".into(),
            });
        }
        Ok(format!(
            "{}/v1/sandboxes/{}{suffix}",
            self.inner.base,
            utf8_percent_encode(id, PATH_SEGMENT)
        ))
    }

    /// `POST /v1/sandboxes/{id}/hibernate`: snapshot the memory and stop the
    /// VM (`204`, also when it already is). The lease keeps running. A
    /// `409` ([`super::Refusal::Conflict`]) is an egress-lane or volume
    /// sandbox, which cannot hibernate; a `500` left the VM running. On a
    /// timeout the outcome is unknown (sandboxd finishes the transition);
    /// retrying is safe.
    pub async fn hibernate(&self, id: &str, auth: SandboxAuth<'_>) -> Result<(), SandboxdError> {
        let op = Op::Hibernate;
        let url = self.sandbox_url(op, id, "/hibernate")?;
        let req = self.inner.http.post(url);
        self.call(op, id, req, Credential::Sandbox(auth), |r| {
            decode_no_content(op, r)
        })
        .await
    }

    /// `POST /v1/sandboxes/{id}/wake`: restore a hibernated sandbox (it
    /// keeps its deadline) or an archived one (it gets a fresh lease of its
    /// granted length: read it back with [`Self::get`]); `204`, also when it
    /// was running. Early builds have no route:
    /// [`super::Refusal::Unsupported`].
    pub async fn wake(&self, id: &str, auth: SandboxAuth<'_>) -> Result<(), SandboxdError> {
        let op = Op::Wake;
        let url = self.sandbox_url(op, id, "/wake")?;
        let req = self.inner.http.post(url);
        self.call(op, id, req, Credential::Sandbox(auth), |r| {
            decode_no_content(op, r)
        })
        .await
    }

    /// `POST /v1/sandboxes/{id}/renew` `{"ttl_seconds": N}`: the deadline
    /// becomes now + N (at most 24 h; a renew can shorten a lease, which is
    /// why N is never 0 here: sandboxd reads 0 as 5 minutes). Returns the
    /// granted deadline, the one to record. A hibernated sandbox is renewed
    /// without waking; an archived one answers `409`
    /// ([`super::Refusal::Conflict`]): wake it first.
    pub async fn renew(
        &self,
        id: &str,
        auth: SandboxAuth<'_>,
        ttl_seconds: NonZeroU64,
    ) -> Result<Deadline, SandboxdError> {
        let op = Op::Renew;
        let url = self.sandbox_url(op, id, "/renew")?;
        let req = self.post_json(op, url, &RenewBody::new(ttl_seconds))?;
        self.call(op, id, req, Credential::Sandbox(auth), decode_renew)
            .await
    }

    /// `GET /v1/sandboxes/{id}` with the node (root) token: one row with its
    /// `hibernated`, `archived` and (late builds) `failed` and `token`. The
    /// authoritative "is it paused" read; the listing may lag behind it.
    pub async fn get(&self, id: &str) -> Result<SandboxInfo, SandboxdError> {
        let op = Op::Get;
        let url = self.sandbox_url(op, id, "")?;
        let req = self.inner.http.get(url);
        self.call(op, id, req, Credential::NodeIfAny, decode_get)
            .await
    }

    /// `GET /v1/sandboxes/{id}/stats` with the node (root) token: the size
    /// tier's CPUs and memory and the VMM's resident memory (none while
    /// hibernated). sandboxd measures no CPU usage.
    pub async fn stats(&self, id: &str) -> Result<SandboxStats, SandboxdError> {
        let op = Op::Stats;
        let url = self.sandbox_url(op, id, "/stats")?;
        let req = self.inner.http.get(url);
        self.call(op, id, req, Credential::NodeIfAny, decode_stats)
            .await
    }

    /// `GET /v1/sandboxes/{id}/owner` with the claim's own token: a cheap
    /// "still here, token valid" probe that leaves a paused sandbox paused.
    pub async fn owner(&self, id: &str, token: &Secret) -> Result<OwnerProbe, SandboxdError> {
        let op = Op::Owner;
        let url = self.sandbox_url(op, id, "/owner")?;
        let req = self.inner.http.get(url);
        let credential = Credential::Sandbox(SandboxAuth::Token(token));
        self.call(op, id, req, credential, decode_owner).await
    }

    /// `POST /v1/sandboxes/{id}/exec` with the claim's own token (the root
    /// token gets `404`): run a command to completion and return its exit
    /// code and output. Wakes a hibernated sandbox. The request may take
    /// the command's `timeout_seconds` plus [`EXEC_TIMEOUT_MARGIN`] beyond
    /// the client's usual timeout.
    pub async fn exec(
        &self,
        id: &str,
        token: &Secret,
        request: &ExecRequest,
    ) -> Result<ExecOutput, SandboxdError> {
        let op = Op::Exec;
        if request.argv.is_empty() {
            return Err(SandboxdError::InvalidRequest {
                op,
                message: "empty argv".into(),
            });
        }
        let url = self.sandbox_url(op, id, "/exec")?;
        let mut req = self.post_json(op, url, &ExecBody::from(request))?;
        if request.timeout_seconds > 0 {
            let extra =
                Duration::from_secs(request.timeout_seconds).saturating_add(EXEC_TIMEOUT_MARGIN);
            req = req.timeout(self.inner.timeout.saturating_add(extra));
        }
        let credential = Credential::Sandbox(SandboxAuth::Token(token));
        self.call(op, id, req, credential, decode_exec).await
    }
}
