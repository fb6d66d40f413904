//! The simulator binary stopped with SIGTERM ends what its guests ran:
//! unlike sandboxd's VMs, its guests are processes of this machine, and a
//! background process an exec left running must not outlive it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sandboxd-sim");

/// One HTTP/1.0 request; the reply's body.
fn request(addr: &str, method: &str, path: &str, token: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("request");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("reply");
    reply
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// A string field of a flat JSON object (enough for these replies).
fn field(json: &str, name: &str) -> String {
    let key = format!("\"{name}\":");
    let rest = &json[json
        .find(&key)
        .unwrap_or_else(|| panic!("{name} in {json}"))
        + key.len()..];
    rest.trim_start()
        .trim_start_matches('"')
        .split(['"', ',', '}'])
        .next()
        .unwrap_or_default()
        .to_string()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
    })
}

#[test]
fn the_guests_processes_end_with_the_simulator() {
    let dir = std::env::temp_dir().join(format!("sandboxd-sim-shutdown-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(dir.join("token"), "tok").expect("token");
    let mut sim = Command::new(BIN)
        .args(["--listen=127.0.0.1:0", "--pool=base:24.04=1"])
        .arg(format!("--api-token-file={}", dir.join("token").display()))
        .arg(format!("--scratch-dir={}", dir.join("vms").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the simulator");
    // Kept open to the end: the simulator prints as it stops.
    let mut stdout = BufReader::new(sim.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("its first line");
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    let claim = request(
        &addr,
        "POST",
        "/v1/claim",
        "tok",
        r#"{"template":"base:24.04"}"#,
    );
    let (id, token) = (field(&claim, "id"), field(&claim, "token"));
    let out = request(
        &addr,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        &token,
        r#"{"argv":["sh","-c","sleep 300 >/dev/null 2>&1 & echo $!"]}"#,
    );
    let pid: u32 = field(&out, "stdout")
        .trim_end_matches("\\n")
        .parse()
        .unwrap_or_else(|_| panic!("a pid in {out}"));
    assert!(alive(pid), "the background process runs after its exec");

    sigterm(sim.id());
    let status = sim.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(pid) {
        if Instant::now() > deadline {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("process {pid} outlived the simulator");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGTERM by pid, through kill(1) (the test needs no extra crate).
fn sigterm(pid: u32) {
    let ok = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -TERM {pid}");
}
