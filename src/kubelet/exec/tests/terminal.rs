//! Commands under the guest agent's terminal.

use super::*;

#[tokio::test]
async fn a_terminal_runs_the_argv_under_the_shell_and_hides_the_preamble() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, true);
    let resize = h.resize.clone().unwrap();
    resize
        .send(TermSize {
            width: 120,
            height: 40,
        })
        .await
        .unwrap();
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["python3", "-i"]),
            tty: true,
        },
        ch,
    ));
    wait_until("the command", || h.out.text().contains("ran")).await;
    assert_eq!(
        h.out.text(),
        "ran 'python3' '-i'\r\n",
        "no motd, prompt or echo"
    );
    let open = &plane.frames("pty_open")[0];
    assert_eq!(
        (open["cols"].as_u64(), open["rows"].as_u64()),
        (Some(120), Some(40))
    );
    // Typing reaches the command; a resize goes on its own connection.
    let stdin = h.stdin.clone().unwrap();
    stdin.send(Bytes::from_static(b"x")).await.unwrap();
    wait_until("the echo", || h.out.text().ends_with('x')).await;
    resize
        .send(TermSize {
            width: 90,
            height: 30,
        })
        .await
        .unwrap();
    wait_until("the resize", || !plane.frames("pty_resize").is_empty()).await;
    let r = &plane.frames("pty_resize")[0];
    assert_eq!(
        (r["pid"].as_u64(), r["cols"].as_u64(), r["rows"].as_u64()),
        (Some(77), Some(90), Some(30))
    );
    stdin.send(Bytes::from_static(b"q")).await.unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
}

#[tokio::test]
async fn without_a_size_the_terminal_opens_at_80_by_24() {
    let plane = FakePlane::new();
    let (h, ch) = channels(true, true);
    let task = tokio::spawn(run(
        plane.clone(),
        sandbox(),
        ExecRequest {
            argv: argv(&["sh"]),
            tty: true,
        },
        ch,
    ));
    wait_until("the command", || h.out.text().contains("ran")).await;
    let open = &plane.frames("pty_open")[0];
    assert_eq!(
        (open["cols"].as_u64(), open["rows"].as_u64()),
        (Some(80), Some(24))
    );
    h.stdin
        .clone()
        .unwrap()
        .send(Bytes::from_static(b"q"))
        .await
        .unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Exited(0));
}
