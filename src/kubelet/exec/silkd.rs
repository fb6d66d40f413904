//! The guest agent's wire protocol as sandboxd's `/agent` relay carries it
//! (docs/streaming.md#the-guest-agent): newline-delimited JSON, one frame
//! per line. Requests carry `"v":1` and an `op`; replies a `type`; binary
//! payloads are standard base64 in `data` (`""` when empty, never null);
//! unknown fields are ignored; a frame is at most 8 MiB either way. Pure:
//! encoding and line splitting, no I/O.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, BytesMut};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Largest frame either side may send.
pub const MAX_FRAME: usize = 8 * 1024 * 1024;

/// A request frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Run `argv` in the foreground (`detach` is always sent, false).
    Exec { argv: Vec<String> },
    /// Input for the RPC in flight.
    Stdin(Vec<u8>),
    /// End of input for the RPC in flight.
    StdinClose,
    /// The guest's shell under a pseudo-terminal of this size.
    PtyOpen { cols: u16, rows: u16 },
    /// Resize the pty whose shell has `pid` (its own RPC, on another
    /// connection).
    PtyResize { pid: u32, cols: u16, rows: u16 },
    /// Signal `pid`; `None` = SIGKILL (its own RPC, on another connection).
    Kill { pid: u32, signal: Option<i32> },
}

impl Request {
    /// The frame as one line, newline included.
    pub fn to_line(&self) -> Vec<u8> {
        let v = match self {
            Request::Exec { argv } => {
                json!({"v": 1, "op": "exec", "argv": argv, "detach": false})
            }
            Request::Stdin(data) => {
                json!({"v": 1, "op": "stdin", "data": STANDARD.encode(data)})
            }
            Request::StdinClose => json!({"v": 1, "op": "stdin_close"}),
            Request::PtyOpen { cols, rows } => {
                json!({"v": 1, "op": "pty_open", "cols": cols, "rows": rows})
            }
            Request::PtyResize { pid, cols, rows } => {
                json!({"v": 1, "op": "pty_resize", "pid": pid, "cols": cols, "rows": rows})
            }
            Request::Kill { pid, signal } => {
                let mut m = Map::new();
                m.insert("v".into(), 1.into());
                m.insert("op".into(), "kill".into());
                m.insert("pid".into(), (*pid).into());
                if let Some(s) = signal {
                    m.insert("signal".into(), (*s).into());
                }
                Value::Object(m)
            }
        };
        let mut line = v.to_string().into_bytes();
        line.push(b'\n');
        line
    }
}

/// A reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// First reply of a foreground exec or a pty.
    Started {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// Terminal: the exit code, `-1` = killed or unknown.
    Exit {
        code: i32,
    },
    /// Terminal: the RPC failed.
    Error {
        kind: String,
        message: String,
    },
    /// Terminal: a control RPC (resize, kill) succeeded.
    Done,
    /// A reply type this side does not know (ignored).
    Other(String),
}

impl Reply {
    /// Whether the RPC ends with this reply.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Reply::Exit { .. } | Reply::Error { .. } | Reply::Done)
    }
}

/// A line that is not a reply frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("guest agent sent a malformed frame: {0}")]
pub struct BadFrame(pub String);

#[derive(Deserialize)]
struct RawReply {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    code: Option<i32>,
    #[serde(default, rename = "kind")]
    error_kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

fn payload(data: Option<String>, kind: &str) -> Result<Vec<u8>, BadFrame> {
    // Absent or null data is an empty payload (the protocol says "" but a
    // lenient reader costs nothing).
    let data = data.unwrap_or_default();
    STANDARD
        .decode(data.as_bytes())
        .map_err(|e| BadFrame(format!("{kind} data is not standard base64: {e}")))
}

/// Decode one line (without its newline).
pub fn parse_reply(line: &[u8]) -> Result<Reply, BadFrame> {
    let raw: RawReply =
        serde_json::from_slice(line).map_err(|e| BadFrame(format!("not a reply frame: {e}")))?;
    Ok(match raw.kind.as_str() {
        "started" => Reply::Started {
            pid: raw
                .pid
                .ok_or_else(|| BadFrame("started without a pid".into()))?,
        },
        "stdout" => Reply::Stdout(payload(raw.data, "stdout")?),
        "stderr" => Reply::Stderr(payload(raw.data, "stderr")?),
        "exit" => Reply::Exit {
            code: raw
                .code
                .ok_or_else(|| BadFrame("exit without a code".into()))?,
        },
        "error" => Reply::Error {
            kind: raw.error_kind.unwrap_or_else(|| "internal".into()),
            message: raw.message.unwrap_or_default(),
        },
        "done" => Reply::Done,
        other => Reply::Other(other.to_string()),
    })
}

/// Splits the agent's byte stream into lines.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: BytesMut,
    /// How far `buf` is known to hold no newline.
    scanned: usize,
}

impl LineBuffer {
    /// Where reads go.
    pub fn buffer(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    /// The next whole line (newline stripped), `Ok(None)` when none is
    /// complete yet; a line longer than [`MAX_FRAME`] is an error.
    pub fn next_line(&mut self) -> Result<Option<BytesMut>, BadFrame> {
        match self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            Some(i) => {
                let end = self.scanned + i;
                let mut line = self.buf.split_to(end + 1);
                line.truncate(end);
                self.scanned = 0;
                Ok(Some(line))
            }
            None => {
                self.scanned = self.buf.len();
                if self.buf.len() > MAX_FRAME {
                    return Err(BadFrame(format!(
                        "a frame runs past {MAX_FRAME} bytes without a newline"
                    )));
                }
                Ok(None)
            }
        }
    }

    /// Bytes buffered that are not yet a whole line.
    pub fn pending(&self) -> usize {
        self.buf.remaining()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(r: &Request) -> Value {
        let l = r.to_line();
        assert_eq!(l.last(), Some(&b'\n'));
        assert_eq!(l.iter().filter(|&&b| b == b'\n').count(), 1);
        serde_json::from_slice(&l).expect("a request line is JSON")
    }

    #[test]
    fn requests_as_the_agent_reads_them() {
        assert_eq!(
            line(&Request::Exec {
                argv: vec!["sh".into(), "-c".into(), "echo\nhi".into()]
            }),
            json!({"v":1,"op":"exec","argv":["sh","-c","echo\nhi"],"detach":false})
        );
        assert_eq!(
            line(&Request::Stdin(b"hi\n".to_vec())),
            json!({"v":1,"op":"stdin","data":"aGkK"})
        );
        assert_eq!(
            line(&Request::Stdin(vec![])),
            json!({"v":1,"op":"stdin","data":""})
        );
        assert_eq!(
            line(&Request::StdinClose),
            json!({"v":1,"op":"stdin_close"})
        );
        assert_eq!(
            line(&Request::PtyOpen { cols: 80, rows: 24 }),
            json!({"v":1,"op":"pty_open","cols":80,"rows":24})
        );
        assert_eq!(
            line(&Request::PtyResize {
                pid: 7,
                cols: 100,
                rows: 40
            }),
            json!({"v":1,"op":"pty_resize","pid":7,"cols":100,"rows":40})
        );
        assert_eq!(
            line(&Request::Kill {
                pid: 7,
                signal: None
            }),
            json!({"v":1,"op":"kill","pid":7})
        );
        assert_eq!(
            line(&Request::Kill {
                pid: 7,
                signal: Some(15)
            }),
            json!({"v":1,"op":"kill","pid":7,"signal":15})
        );
    }

    #[test]
    fn replies_decode_and_unknown_fields_are_ignored() {
        let cases: [(&str, Reply); 9] = [
            (r#"{"type":"started","pid":42}"#, Reply::Started { pid: 42 }),
            (
                r#"{"type":"stdout","data":"aGkK","extra":1}"#,
                Reply::Stdout(b"hi\n".to_vec()),
            ),
            (r#"{"type":"stderr","data":""}"#, Reply::Stderr(vec![])),
            (r#"{"type":"stderr","data":null}"#, Reply::Stderr(vec![])),
            (r#"{"type":"exit","code":3}"#, Reply::Exit { code: 3 }),
            (r#"{"type":"exit","code":-1}"#, Reply::Exit { code: -1 }),
            (
                r#"{"type":"error","kind":"bad_request","message":"no such file"}"#,
                Reply::Error {
                    kind: "bad_request".into(),
                    message: "no such file".into(),
                },
            ),
            (r#"{"type":"done"}"#, Reply::Done),
            (
                r#"{"type":"procs","procs":[]}"#,
                Reply::Other("procs".into()),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse_reply(text.as_bytes()), Ok(want), "{text}");
        }
        assert!(Reply::Exit { code: 0 }.is_terminal());
        assert!(Reply::Done.is_terminal());
        assert!(!Reply::Started { pid: 1 }.is_terminal());
        assert!(!Reply::Other("info".into()).is_terminal());
    }

    #[test]
    fn malformed_replies_are_errors() {
        for bad in [
            "",
            "{",
            "[]",
            r#"{"pid":1}"#,
            r#"{"type":"started"}"#,
            r#"{"type":"exit"}"#,
            r#"{"type":"exit","code":"3"}"#,
            r#"{"type":"stdout","data":"***"}"#,
            r#"{"type":"started","pid":-1}"#,
        ] {
            assert!(parse_reply(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_split_across_reads() {
        let mut lb = LineBuffer::default();
        lb.buffer().extend_from_slice(b"{\"a\":1}\n{\"b\"");
        assert_eq!(
            lb.next_line().expect("a line or the end").as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(lb.next_line().expect("a line or the end"), None);
        assert_eq!(lb.pending(), 4);
        lb.buffer().extend_from_slice(b":2}\n\n");
        assert_eq!(
            lb.next_line().expect("a line or the end").as_deref(),
            Some(&b"{\"b\":2}"[..])
        );
        assert_eq!(
            lb.next_line().expect("a line or the end").as_deref(),
            Some(&b""[..])
        );
        assert_eq!(lb.next_line().expect("a line or the end"), None);
    }

    #[test]
    fn an_endless_line_is_an_error() {
        let mut lb = LineBuffer::default();
        lb.buffer().extend_from_slice(&vec![b'x'; MAX_FRAME]);
        assert_eq!(lb.next_line().expect("a line or the end"), None);
        lb.buffer().extend_from_slice(b"xx");
        assert!(lb.next_line().is_err());
    }
}
