//! The in-guest agent's wire frames (silkd's protocol as sandboxd's
//! contract describes it): newline-delimited JSON, one frame per line.
//! Requests carry `"v":1` and `"op"`; responses carry `"type"`; binary
//! payloads are standard base64 in `data` (`""` when empty); unknown fields
//! are ignored; a frame is at most 8 MiB.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::{Value, json};

/// Largest frame either way.
pub const MAX_FRAME: usize = 8 * 1024 * 1024;

/// A request frame, by `op`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Exec(ExecSpec),
    Stdin(Vec<u8>),
    StdinClose,
    PtyOpen(PtySpec),
    PtyResize {
        pid: u32,
        cols: u16,
        rows: u16,
    },
    Kill {
        pid: u32,
        signal: Option<i32>,
    },
    Ps,
    Logs {
        pid: u32,
    },
    Attach {
        pid: u32,
    },
    Info,
    /// A well-formed frame with an op this agent does not serve.
    Unknown(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub detach: bool,
    pub session: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PtySpec {
    pub cols: u16,
    pub rows: u16,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
}

#[derive(Deserialize)]
struct PidField {
    pid: u32,
}

#[derive(Deserialize)]
struct ResizeFields {
    pid: u32,
    #[serde(default)]
    cols: u16,
    #[serde(default)]
    rows: u16,
}

#[derive(Deserialize)]
struct KillFields {
    pid: u32,
    #[serde(default)]
    signal: Option<i32>,
}

#[derive(Deserialize)]
struct DataField {
    #[serde(default)]
    data: Option<String>,
}

/// Parse one request line (without its newline). The error is the
/// `bad_request` message.
pub fn parse_request(line: &[u8]) -> Result<Request, String> {
    let value: Value =
        serde_json::from_slice(line).map_err(|e| format!("frame is not JSON: {e}"))?;
    let Some(op) = value.get("op").and_then(Value::as_str).map(str::to_string) else {
        return Err("frame has no \"op\"".to_string());
    };
    let fields = |what: &str, e: serde_json::Error| format!("{what}: {e}");
    Ok(match op.as_str() {
        "exec" => Request::Exec(serde_json::from_value(value).map_err(|e| fields("exec", e))?),
        "stdin" => {
            let d: DataField = serde_json::from_value(value).map_err(|e| fields("stdin", e))?;
            let data = STANDARD
                .decode(d.data.unwrap_or_default())
                .map_err(|e| format!("stdin: data is not base64: {e}"))?;
            Request::Stdin(data)
        }
        "stdin_close" | "data_end" => Request::StdinClose,
        "pty_open" => {
            Request::PtyOpen(serde_json::from_value(value).map_err(|e| fields("pty_open", e))?)
        }
        "pty_resize" => {
            let f: ResizeFields =
                serde_json::from_value(value).map_err(|e| fields("pty_resize", e))?;
            Request::PtyResize {
                pid: f.pid,
                cols: f.cols,
                rows: f.rows,
            }
        }
        "kill" => {
            let f: KillFields = serde_json::from_value(value).map_err(|e| fields("kill", e))?;
            Request::Kill {
                pid: f.pid,
                signal: f.signal,
            }
        }
        "ps" => Request::Ps,
        "logs" => Request::Logs {
            pid: serde_json::from_value::<PidField>(value)
                .map_err(|e| fields("logs", e))?
                .pid,
        },
        "attach" => Request::Attach {
            pid: serde_json::from_value::<PidField>(value)
                .map_err(|e| fields("attach", e))?
                .pid,
        },
        "info" => Request::Info,
        _ => Request::Unknown(op),
    })
}

/// Error kinds of an `error` frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    BadRequest,
    NotFound,
    Unimplemented,
    Internal,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unimplemented => "unimplemented",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Response frames, each one JSON line with its newline.
pub fn started(pid: u32) -> Vec<u8> {
    line(json!({ "type": "started", "pid": pid }))
}

pub fn stdout(data: &[u8]) -> Vec<u8> {
    line(json!({ "type": "stdout", "data": STANDARD.encode(data) }))
}

pub fn stderr(data: &[u8]) -> Vec<u8> {
    line(json!({ "type": "stderr", "data": STANDARD.encode(data) }))
}

/// Terminal: `-1` means killed or unknown.
pub fn exit(code: i32) -> Vec<u8> {
    line(json!({ "type": "exit", "code": code }))
}

/// Terminal.
pub fn done() -> Vec<u8> {
    line(json!({ "type": "done" }))
}

/// Terminal.
pub fn error(kind: ErrorKind, message: impl Into<String>) -> Vec<u8> {
    line(json!({ "type": "error", "kind": kind.as_str(), "message": message.into() }))
}

pub fn procs(procs: Vec<Value>) -> Vec<u8> {
    line(json!({ "type": "procs", "procs": procs }))
}

pub fn info(uptime_secs: u64, procs: usize) -> Vec<u8> {
    line(json!({
        "type": "info", "version": concat!("sandboxd-sim-", env!("CARGO_PKG_VERSION")),
        "proto": 2, "uptime_secs": uptime_secs, "procs": procs, "sessions": 0,
    }))
}

fn line(v: Value) -> Vec<u8> {
    let mut bytes = serde_json::to_vec(&v).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_frames_parse_as_the_contract_writes_them() {
        let exec = parse_request(
            br#"{"v":1,"op":"exec","argv":["sh","-c","echo hi"],"cwd":"/tmp","env":{"A":"1"},"detach":false,"extra":true}"#,
        )
        .expect("exec");
        let Request::Exec(spec) = exec else {
            panic!("not exec: {exec:?}")
        };
        assert_eq!(spec.argv, ["sh", "-c", "echo hi"]);
        assert_eq!(spec.cwd.as_deref(), Some("/tmp"));
        assert_eq!(spec.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            parse_request(br#"{"v":1,"op":"stdin","data":"aGk="}"#).expect("stdin"),
            Request::Stdin(b"hi".to_vec())
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"stdin","data":""}"#).expect("empty stdin"),
            Request::Stdin(Vec::new())
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"stdin_close"}"#).expect("close"),
            Request::StdinClose
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"pty_resize","pid":7,"cols":120,"rows":40}"#)
                .expect("resize"),
            Request::PtyResize {
                pid: 7,
                cols: 120,
                rows: 40
            }
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"kill","pid":7}"#).expect("kill"),
            Request::Kill {
                pid: 7,
                signal: None
            }
        );
        assert_eq!(
            parse_request(br#"{"v":1,"op":"fork"}"#).expect("unknown op"),
            Request::Unknown("fork".into())
        );
        for bad in [
            &b"not json"[..],
            br#"{"v":1}"#,
            br#"{"v":1,"op":"stdin","data":"***"}"#,
            br#"{"v":1,"op":"kill"}"#,
            br#"{"v":1,"op":"exec","argv":"sh"}"#,
        ] {
            assert!(
                parse_request(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn response_frames_are_lines() {
        let out = stdout(b"");
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        let v: Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            (v["type"].as_str(), v["data"].as_str()),
            (Some("stdout"), Some(""))
        );
        let v: Value = serde_json::from_slice(&exit(-1)).expect("json");
        assert_eq!(
            (v["type"].as_str(), v["code"].as_i64()),
            (Some("exit"), Some(-1))
        );
        let e: Value =
            serde_json::from_slice(&error(ErrorKind::NotFound, "no such pid")).expect("json");
        assert_eq!(e["kind"], "not_found");
        assert_eq!(e["type"], "error");
    }
}
