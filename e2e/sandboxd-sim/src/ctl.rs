//! A tiny HTTP/1.1 client for driving the admin API from a shell
//! (`sandboxd-sim ctl …`), so the demo needs no curl.

use axum::body::Body;
use http::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Send one request to `base` (`http://host:port`) and return the status
/// and body.
pub async fn call(
    base: &str,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<(u16, String), String> {
    let authority = base
        .trim()
        .strip_prefix("http://")
        .ok_or_else(|| format!("admin URL {base:?}: want http://host:port"))?
        .trim_end_matches('/')
        .to_string();
    let stream = TcpStream::connect(&authority)
        .await
        .map_err(|e| format!("connect to {authority}: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {authority}: {e}"))?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", &authority);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req
        .body(Body::from(body.unwrap_or_default()))
        .map_err(|e| format!("build request: {e}"))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("{path}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 64 * 1024 * 1024)
        .await
        .map_err(|e| format!("{path}: read reply: {e}"))?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}
