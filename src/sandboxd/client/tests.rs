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
