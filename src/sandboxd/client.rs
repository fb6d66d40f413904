//! The sandboxd HTTP client (docs/architecture.md#sandboxd-api).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use tracing::debug;

use super::auth::{Credential, authorization, bearer};
use super::decode::{RawReply, body_limit, decode_claim, decode_info, decode_list, decode_release};
use super::error::{Op, SandboxdError};
use super::types::{
    ClaimBody, ClaimRequest, Granted, NodeInfo, ReleaseOutcome, SandboxRow, Secret,
};
use super::verbs_types::SandboxAuth;

/// Per-request bound, as the Go client's.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections kept to sandboxd. A burst of claims opens one per
/// request in flight (up to the 64 reconciles); keeping all of them idle
/// held their buffers long after the burst, while a new connection to the
/// node-local daemon costs a fraction of a millisecond.
pub const POOL_MAX_IDLE_PER_HOST: usize = 8;
/// How long an idle pooled connection is kept.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Everything but RFC 3986 unreserved characters is escaped in a path
/// segment.
pub(super) const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Gets told about every finished call: which, how long, and how it ended.
/// Metrics hook in here; keep implementations cheap and non-blocking.
pub trait Observer: Send + Sync {
    fn observe(&self, op: Op, elapsed: Duration, outcome: Result<(), &SandboxdError>);
}

/// Read the node (root) token file: whitespace trimmed; an empty file means
/// "no token" (no Authorization header).
pub fn read_token_file(path: impl AsRef<Path>) -> Result<Option<String>, SandboxdError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| SandboxdError::TokenFile {
        path: path.to_path_buf(),
        source,
    })?;
    let token = text.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

/// Builds a [`SandboxdClient`].
pub struct ClientBuilder {
    base_url: String,
    token: Option<String>,
    timeout: Duration,
    observer: Option<Arc<dyn Observer>>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl ClientBuilder {
    pub fn new(base_url: impl Into<String>) -> Self {
        ClientBuilder {
            base_url: base_url.into(),
            token: None,
            timeout: DEFAULT_TIMEOUT,
            observer: None,
        }
    }

    /// The node (root) token for claim, list and info. `None` or an empty
    /// string sends no Authorization header.
    pub fn token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Per-request timeout (default 10 s). Tests shorten it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn observer(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    pub fn build(self) -> Result<SandboxdClient, SandboxdError> {
        let base = normalise_base_url(&self.base_url)?;
        // reqwest is built without a bundled crypto provider; the project
        // uses ring everywhere. The binary installs it first thing; do it
        // here too so a client built elsewhere (tests, tools) cannot panic.
        crate::crypto::install_provider();
        let mut http = reqwest::Client::builder()
            .timeout(self.timeout)
            .pool_max_idle_per_host(POOL_MAX_IDLE_PER_HOST)
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("vk-sandbox/", env!("CARGO_PKG_VERSION")));
        if url::Url::parse(&base).is_ok_and(|u| u.scheme() == "http") {
            // Plain HTTP never verifies a certificate (and redirects are not
            // followed): skip loading the system's roots, which costs start-up
            // milliseconds for nothing.
            http = http.tls_certs_only([]);
        }
        let http = http
            .build()
            .map_err(|e| SandboxdError::Config(format!("build HTTP client: {e}")))?;
        // The upgrades (`/agent`, `/ports`) are HTTP/1.1 only: a client of
        // their own never negotiates HTTP/2 over TLS, and its idle pool stays
        // empty (an upgraded connection never returns to it).
        let mut relay_http = reqwest::Client::builder()
            .timeout(self.timeout)
            .http1_only()
            .pool_max_idle_per_host(0)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("vk-sandbox/", env!("CARGO_PKG_VERSION")));
        if url::Url::parse(&base).is_ok_and(|u| u.scheme() == "http") {
            relay_http = relay_http.tls_certs_only([]);
        }
        let relay_http = relay_http
            .build()
            .map_err(|e| SandboxdError::Config(format!("build HTTP client: {e}")))?;
        let token = match self.token {
            None => None,
            Some(t) => Some(bearer(&t).ok_or_else(|| {
                SandboxdError::Config(
                    "the sandboxd token contains characters not allowed in an HTTP header".into(),
                )
            })?),
        };
        Ok(SandboxdClient {
            inner: Arc::new(Inner {
                http,
                relay_http,
                timeout: self.timeout,
                base,
                token,
                observer: self.observer,
            }),
        })
    }
}

/// Trim trailing slashes once and check the URL is `http(s)://host…`.
pub fn normalise_base_url(raw: &str) -> Result<String, SandboxdError> {
    let trimmed = raw.trim().trim_end_matches('/');
    let parsed = url::Url::parse(trimmed)
        .map_err(|e| SandboxdError::Config(format!("invalid sandboxd URL {raw:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(SandboxdError::Config(format!(
            "invalid sandboxd URL {raw:?}: want http(s)://host[:port]"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(SandboxdError::Config(format!(
            "invalid sandboxd URL {raw:?}: no query or fragment allowed"
        )));
    }
    Ok(trimmed.to_string())
}

/// The sandboxd client. Cheap to clone; all clones share one connection pool.
#[derive(Clone)]
pub struct SandboxdClient {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) http: reqwest::Client,
    /// HTTP/1.1 only, for the upgrades.
    pub(super) relay_http: reqwest::Client,
    /// The per-request timeout the clients were built with.
    pub(super) timeout: Duration,
    pub(super) base: String,
    pub(super) token: Option<HeaderValue>,
    observer: Option<Arc<dyn Observer>>,
}

impl fmt::Debug for SandboxdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxdClient")
            .field("base", &self.inner.base)
            .field("token", &self.inner.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

impl SandboxdClient {
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(base_url)
    }

    /// The normalised base URL (no trailing slash).
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// Whether a node token is configured.
    pub fn has_token(&self) -> bool {
        self.inner.token.is_some()
    }

    /// `POST /v1/claim`. On [`SandboxdError::is_outcome_unknown`] errors a
    /// claim may exist under `claim_ref`.
    pub async fn claim(&self, request: &ClaimRequest) -> Result<Granted, SandboxdError> {
        let op = Op::Claim;
        let url = format!("{}/v1/claim", self.inner.base);
        let req = self.post_json(op, url, &ClaimBody::from(request))?;
        self.call(op, "", req, Credential::NodeIfAny, decode_claim)
            .await
    }

    /// `POST /v1/sandboxes/{id}/release` with the claim's own token.
    /// `204` → [`ReleaseOutcome::Released`]; sandboxd's JSON `404` →
    /// [`ReleaseOutcome::AlreadyGone`]; everything else is an error.
    pub async fn release(&self, id: &str, token: &Secret) -> Result<ReleaseOutcome, SandboxdError> {
        self.release_with(id, SandboxAuth::Token(token)).await
    }

    /// Release any sandbox by id with the node (root) token, for returning
    /// stray rows of lost claim replies, whose token nobody holds.
    pub async fn release_as_node(&self, id: &str) -> Result<ReleaseOutcome, SandboxdError> {
        self.release_with(id, SandboxAuth::Node).await
    }

    async fn release_with(
        &self,
        id: &str,
        auth: SandboxAuth<'_>,
    ) -> Result<ReleaseOutcome, SandboxdError> {
        let op = Op::Release;
        let url = self.sandbox_url(op, id, "/release")?;
        let req = self.inner.http.post(url);
        self.call(op, id, req, Credential::Sandbox(auth), decode_release)
            .await
    }

    /// `GET /v1/sandboxes`. An error is never an empty list.
    pub async fn list(&self) -> Result<Vec<SandboxRow>, SandboxdError> {
        // Not kept for reuse: a connection's read buffer grows to the
        // largest reply it carried (a listing of thousands of rows is
        // hundreds of KiB) and stays allocated while the connection idles
        // in the pool. Listings are periodic, so a fresh connection to the
        // local daemon each time costs next to nothing.
        let req = self
            .inner
            .http
            .get(format!("{}/v1/sandboxes", self.inner.base))
            .header(reqwest::header::CONNECTION, "close");
        self.call(Op::List, "", req, Credential::NodeIfAny, decode_list)
            .await
    }

    /// `GET /v1/info` (root token only).
    pub async fn info(&self) -> Result<NodeInfo, SandboxdError> {
        let req = self.inner.http.get(format!("{}/v1/info", self.inner.base));
        self.call(Op::Info, "", req, Credential::NodeIfAny, decode_info)
            .await
    }

    /// A POST of `body` as JSON.
    pub(super) fn post_json(
        &self,
        op: Op,
        url: String,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::RequestBuilder, SandboxdError> {
        let body = serde_json::to_vec(body).map_err(|e| SandboxdError::InvalidRequest {
            op,
            message: format!("encode request: {e}"),
        })?;
        Ok(self
            .inner
            .http
            .post(url)
            .header(CONTENT_TYPE, "application/json")
            .body(body))
    }

    /// The one request path: the credential's header, the send, the
    /// reply read within its limit and decoded, the call observed.
    pub(super) async fn call<T>(
        &self,
        op: Op,
        id: &str,
        req: reqwest::RequestBuilder,
        credential: Credential<'_>,
        decode: impl FnOnce(&RawReply) -> Result<T, SandboxdError>,
    ) -> Result<T, SandboxdError> {
        let auth = authorization(self.inner.token.as_ref(), op, id, credential)?;
        self.observed(op, async {
            let reply = self.send(op, req, auth.as_ref()).await?;
            decode(&reply)
        })
        .await
    }

    /// Runs a call, logs and tells the observer how it went and how long
    /// it took (the upgrades come through here too).
    pub(super) async fn observed<T>(
        &self,
        op: Op,
        call: impl Future<Output = Result<T, SandboxdError>>,
    ) -> Result<T, SandboxdError> {
        let started = Instant::now();
        let result = call.await;
        self.finish(op, started, &result);
        result
    }

    async fn send(
        &self,
        op: Op,
        req: reqwest::RequestBuilder,
        auth: Option<&HeaderValue>,
    ) -> Result<RawReply, SandboxdError> {
        let req = match auth {
            Some(value) => req.header(AUTHORIZATION, value.clone()),
            None => req,
        };
        let response = req.send().await.map_err(|e| transport(op, e))?;
        read_reply(op, response).await
    }

    fn finish<T>(&self, op: Op, started: Instant, result: &Result<T, SandboxdError>) {
        let elapsed = started.elapsed();
        match result {
            Ok(_) => debug!(op = op.as_str(), ?elapsed, "sandboxd call succeeded"),
            Err(e) => debug!(op = op.as_str(), ?elapsed, error = %e, "sandboxd call failed"),
        }
        if let Some(observer) = &self.inner.observer {
            observer.observe(op, elapsed, result.as_ref().map(|_| ()));
        }
    }
}

pub(super) fn transport(op: Op, source: reqwest::Error) -> SandboxdError {
    SandboxdError::Transport {
        op,
        timeout: source.is_timeout(),
        source,
    }
}

/// Read at most the status's body limit. A success body that breaks off is a
/// transport error (the outcome of a claim is then unknown); an error body
/// that breaks off is used as far as it got.
pub(super) async fn read_reply(
    op: Op,
    mut response: reqwest::Response,
) -> Result<RawReply, SandboxdError> {
    let status = response.status().as_u16();
    let limit = body_limit(op, status);
    let mut body = Vec::new();
    let mut over_limit = false;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    over_limit = true;
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) if (200..300).contains(&status) => return Err(transport(op, e)),
            Err(_) => break,
        }
    }
    Ok(RawReply {
        status,
        body,
        over_limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::utf8_percent_encode;

    /// Listings ask for their connection to be closed (its buffer, sized
    /// to the listing, is not kept in the pool); claims keep theirs.
    #[tokio::test]
    async fn listings_close_their_connection_claims_do_not() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        crate::crypto::install_provider();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = std::sync::Arc::clone(&heads);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                let seen = std::sync::Arc::clone(&seen);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&got).to_ascii_lowercase();
                    let body = if head.starts_with("get /v1/sandboxes") {
                        r#"{"sandboxes":[]}"#
                    } else {
                        r#"{"id":"sb_1","token":"t","owner_addr":"10.0.0.5:7777"}"#
                    };
                    seen.lock().expect("lock").push(head);
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(reply.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        let client = SandboxdClient::builder(format!("http://{addr}"))
            .build()
            .expect("client");
        client.list().await.expect("list");
        let req = ClaimRequest {
            template: "base:24.04".into(),
            claim_ref: "ns/p".into(),
            ..Default::default()
        };
        client.claim(&req).await.expect("claim");
        let heads = heads.lock().expect("lock").clone();
        assert_eq!(heads.len(), 2, "{heads:?}");
        assert!(heads[0].starts_with("get /v1/sandboxes"), "{heads:?}");
        assert!(heads[0].contains("connection: close"), "{}", heads[0]);
        assert!(heads[1].starts_with("post /v1/claim"), "{heads:?}");
        assert!(!heads[1].contains("connection: close"), "{}", heads[1]);
    }

    #[test]
    fn base_url_is_normalised_once() {
        assert_eq!(
            normalise_base_url("http://127.0.0.1:7777///").expect("url"),
            "http://127.0.0.1:7777"
        );
        assert_eq!(
            normalise_base_url("http://h:1/prefix/").expect("url"),
            "http://h:1/prefix"
        );
        for bad in ["", "127.0.0.1:7777", "ftp://h", "http://", "http://h/?q=1"] {
            assert!(normalise_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_are_path_escaped() {
        assert_eq!(
            utf8_percent_encode("sb_0a1b-2.c~", PATH_SEGMENT).to_string(),
            "sb_0a1b-2.c~"
        );
        assert_eq!(
            utf8_percent_encode("../x y/z?", PATH_SEGMENT).to_string(),
            "..%2Fx%20y%2Fz%3F"
        );
    }

    #[test]
    fn token_file_is_trimmed_and_empty_means_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("token");
        std::fs::write(&path, " tok\n").expect("write");
        assert_eq!(
            read_token_file(&path).expect("read"),
            Some("tok".to_string())
        );
        std::fs::write(&path, " \n\t").expect("write");
        assert_eq!(read_token_file(&path).expect("read"), None);
        let err = read_token_file(dir.path().join("missing")).expect_err("missing");
        assert!(matches!(err, SandboxdError::TokenFile { .. }));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let client = SandboxdClient::builder("http://127.0.0.1:7777/")
            .token(Some("s3cret-token".into()))
            .build()
            .expect("client");
        assert!(!format!("{client:?}").contains("s3cret"));
        assert_eq!(client.base_url(), "http://127.0.0.1:7777");
        let builder = ClientBuilder::new("x").token(Some("s3cret-token".into()));
        assert!(!format!("{builder:?}").contains("s3cret"));
    }

    /// A listing of 5,000 rows (over 1 MiB with vk-sandbox's tagged
    /// `claim_ref`s: every listing failed past that size) is read whole.
    #[tokio::test]
    async fn a_listing_of_five_thousand_rows_is_read() {
        const ROWS: usize = 5000;
        crate::crypto::install_provider();
        let sim = sandboxd_sim::start_local(sandboxd_sim::SimConfig {
            pools: vec![
                sandboxd_sim::config::PoolConfig::parse_spec(&format!("base:24.04={ROWS}"))
                    .expect("pool"),
            ],
            ..Default::default()
        })
        .await
        .expect("sim");
        for i in 0..ROWS {
            let body = serde_json::json!({
                "template": "base:24.04",
                "claim_ref": format!(
                    "namespace-{i:05}/sandbox-pod-{i:05}#vk-sandbox:0b7c2d1e-4f5a-4c3b-9d8e-{i:012}"
                ),
                "ttl_seconds": 86400,
            });
            let reply = sim.sim().claim(None, body.to_string().as_bytes()).await;
            assert_eq!(reply.status, 200, "claim {i}: {reply:?}");
        }
        let raw = reqwest::get(format!("{}/v1/sandboxes", sim.base_url()))
            .await
            .expect("raw listing")
            .bytes()
            .await
            .expect("body");
        assert!(
            raw.len() > super::super::decode::JSON_BODY_LIMIT,
            "the listing is {} bytes; the test needs more than 1 MiB",
            raw.len()
        );
        let client = SandboxdClient::builder(sim.base_url())
            .build()
            .expect("client");
        let rows = client.list().await.expect("the whole listing");
        assert_eq!(rows.len(), ROWS);
    }
}
