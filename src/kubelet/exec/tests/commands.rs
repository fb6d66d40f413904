//! Commands without a terminal: output, stdin, the exit code, refusals, a
//! client that leaves, bounded stdin frames and queue.

use super::*;

#[tokio::test]
async fn output_streams_apart_and_the_exit_code() {
    let plane = FakePlane::new();
    let (h, ch) = channels(false, false);
    let req = ExecRequest {
        argv: argv(&["echo", "hello", "world"]),
        tty: false,
    };
    let outcome = run(plane.clone(), sandbox(), req, ch).await;
    assert_eq!(outcome, Outcome::Exited(3));
    assert_eq!(h.out.text(), "hello world\n");
    assert_eq!(h.err.text(), "to stderr\n");
    let exec = plane.frames("exec");
    assert_eq!(
        exec[0]["argv"],
        serde_json::json!(["echo", "hello", "world"])
    );
    assert_eq!(exec[0]["detach"], false);
    // No stdin asked for: the agent is told at once.
    wait_until("stdin_close", || {
        plane.ops().contains(&"stdin_close".to_string())
    })
    .await;
}

#[tokio::test]
async fn stdin_is_forwarded_and_closed() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, false);
    let tx = h.stdin.clone().unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["cat"]),
            tty: false,
        },
        ch,
    ));
    tx.send(Bytes::from_static(b"hi\n")).await.unwrap();
    drop(tx);
    drop(h.stdin);
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
    assert_eq!(h.out.text(), "hi\n");
    assert_eq!(plane.ops(), ["exec", "stdin", "stdin_close"]);
}

#[tokio::test]
async fn agent_refusals_and_an_unreachable_agent() {
    let plane = FakePlane::new();
    let (_h, ch) = channels(false, false);
    let outcome = run(
        plane,
        sandbox(),
        ExecRequest {
            argv: argv(&["nope"]),
            tty: false,
        },
        ch,
    )
    .await;
    assert_eq!(
        outcome,
        Outcome::AgentError {
            kind: "bad_request".into(),
            message: "no such command".into()
        }
    );
    let down = Arc::new(FakePlane {
        seen: Arc::default(),
        reachable: false,
        killed: Arc::default(),
    });
    let (_h, ch) = channels(false, false);
    let outcome = run(
        down,
        sandbox(),
        ExecRequest {
            argv: argv(&["echo"]),
            tty: false,
        },
        ch,
    )
    .await;
    assert!(matches!(outcome, Outcome::Unreachable(m) if m.contains("guest agent unreachable")));
    let (_h, ch) = channels(false, false);
    let outcome = run(
        FakePlane::new(),
        sandbox(),
        ExecRequest {
            argv: vec![],
            tty: false,
        },
        ch,
    )
    .await;
    assert!(matches!(
        outcome,
        Outcome::Refused {
            reason: "BadRequest",
            ..
        }
    ));
}

#[tokio::test]
async fn a_client_that_hangs_up_gets_its_quiet_process_killed() {
    let plane = FakePlane::new();
    let (h, ch) = channels(false, false);
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["sleep"]),
            tty: false,
        },
        ch,
    ));
    wait_until("the exec", || !plane.frames("exec").is_empty()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    h.hangup.cancel();
    assert_eq!(task.await.unwrap(), Outcome::Exited(-1));
    wait_until("the kill", || !plane.frames("kill").is_empty()).await;
    let kill = &plane.frames("kill")[0];
    assert_eq!(kill["pid"], 42);
    assert!(kill.get("signal").is_none(), "SIGKILL is the default");
    assert_eq!(
        plane.seen.lock().unwrap().connections,
        2,
        "kill on its own connection"
    );
}

/// The review's lower note: one large stdin message (a WebSocket one may be
/// 16 MiB) went to the agent as one frame, over its 8 MiB limit once in
/// base64. It now goes in frames of at most 64 KiB, in order.
#[tokio::test]
async fn large_stdin_reaches_the_agent_in_bounded_frames() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, false);
    let tx = h.stdin.clone().unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["cat"]),
            tty: false,
        },
        ch,
    ));
    let big: Vec<u8> = (0..(3 * STDIN_FRAME + 100))
        .map(|i| (i % 251) as u8)
        .collect();
    tx.send(Bytes::from(big.clone())).await.unwrap();
    drop(tx);
    drop(h.stdin);
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
    let frames = plane.frames("stdin");
    let sizes: Vec<usize> = frames.iter().map(|f| unb64(&f["data"]).len()).collect();
    assert_eq!(sizes, [STDIN_FRAME, STDIN_FRAME, STDIN_FRAME, 100]);
    let joined: Vec<u8> = frames.iter().flat_map(|f| unb64(&f["data"])).collect();
    assert_eq!(joined, big);
    assert_eq!(
        h.out.0.lock().unwrap().len(),
        big.len(),
        "cat echoed it all"
    );
}

/// Finding 5: requests queued for an agent that does not read stop at the
/// queue's bytes (they were 32 frames of any size).
#[tokio::test]
async fn the_agent_queue_is_bounded_in_bytes() {
    struct Deaf(std::sync::Mutex<Vec<DuplexStream>>);
    impl DataPlane for Deaf {
        fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
            Box::pin(async move {
                let (a, b) = tokio::io::duplex(4096);
                self.0.lock().unwrap().push(b);
                Ok(Box::new(a) as Relay)
            })
        }
        fn port<'a>(
            &'a self,
            _: &'a SandboxRef,
            _: u16,
        ) -> BoxFuture<'a, Result<Relay, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
        fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
    }
    let plane = Deaf(Default::default());
    let (_reader, writer) = agent::connect(&plane, &sandbox()).await.unwrap();
    let chunk = vec![7u8; 8 * 1024];
    let line = Request::Stdin(chunk.clone()).to_line().len();
    let mut sent = 0;
    while tokio::time::timeout(
        Duration::from_millis(200),
        writer.send(Request::Stdin(chunk.clone())),
    )
    .await
    .is_ok()
    {
        sent += 1;
        assert!(sent < 10_000, "never pushed back");
    }
    // The queue's bytes, plus the batch being written into the pipe.
    let most = agent::QUEUE_BYTES / line + 1;
    assert!(
        sent <= most && sent * line >= agent::QUEUE_BYTES / 2,
        "{sent} lines of {line} bytes queued"
    );
}

/// Without stdin, `stdin_close` goes with the request, in the same write
/// (sandboxd's own exec does the same): the agent reads both at once, and
/// it is woken once, not twice.
#[tokio::test]
async fn without_stdin_the_request_and_its_end_go_in_one_write() {
    /// Records each read of the agent's side as it came.
    struct Reads(Arc<std::sync::Mutex<Vec<String>>>);
    impl DataPlane for Reads {
        fn agent<'a>(&'a self, _: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
            let reads = Arc::clone(&self.0);
            Box::pin(async move {
                let (a, b) = tokio::io::duplex(1 << 16);
                tokio::spawn(async move {
                    let (mut r, mut w) = tokio::io::split(b);
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = tokio::io::AsyncReadExt::read(&mut r, &mut buf)
                            .await
                            .unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let text = String::from_utf8_lossy(&buf[..n]).to_string();
                        let closed = text.contains("\"stdin_close\"");
                        reads.lock().unwrap().push(text);
                        if closed {
                            let _ = w.write_all(b"{\"type\":\"exit\",\"code\":0}\n").await;
                        }
                    }
                });
                Ok(Box::new(a) as Relay)
            })
        }
        fn port<'a>(
            &'a self,
            _: &'a SandboxRef,
            _: u16,
        ) -> BoxFuture<'a, Result<Relay, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
        fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("none".into())) })
        }
    }
    let reads = Arc::new(std::sync::Mutex::new(Vec::new()));
    let plane = Arc::new(Reads(Arc::clone(&reads)));
    let (_h, ch) = channels(false, false);
    let req = ExecRequest {
        argv: argv(&["true"]),
        tty: false,
    };
    assert_eq!(run(plane, sandbox(), req, ch).await, Outcome::Exited(0));
    let reads = reads.lock().unwrap().clone();
    assert_eq!(reads.len(), 1, "{reads:?}");
    let ops: Vec<String> = reads[0]
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["op"].to_string())
        .collect();
    assert_eq!(ops, ["\"exec\"", "\"stdin_close\""]);
}
