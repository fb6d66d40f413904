//! The journal: one checksummed frame per group commit.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use super::snapshot::{RowOut, decode_row, push_json};
use crate::claims::types::Claim;

/// One journal record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalOp {
    /// The key's durable row is this claim.
    Put { key: String, claim: Claim },
    /// The key has no durable row.
    Del { key: String },
}

#[derive(Serialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum OpOut<'a> {
    Put { key: &'a str, claim: RowOut<'a> },
    Del { key: &'a str },
}

#[derive(Serialize)]
struct FrameOut<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    base: Option<&'a str>,
    ops: Vec<OpOut<'a>>,
}

/// Identity of snapshot bytes (first 16 hex digits of their SHA-256): the
/// `base` a journal names.
pub fn snapshot_base(snapshot: &[u8]) -> String {
    checksum(snapshot)
}

pub(super) fn checksum(payload: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, payload);
    let mut hex = String::with_capacity(16);
    for b in &digest.as_ref()[..8] {
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// Encode one journal frame (one line, newline-terminated). The first
/// frame of a journal passes the `base` it continues.
pub fn encode_frame(ops: &[JournalOp], base: Option<&str>) -> Vec<u8> {
    let frame = FrameOut {
        base,
        ops: ops
            .iter()
            .map(|op| match op {
                JournalOp::Put { key, claim } => OpOut::Put {
                    key,
                    claim: RowOut::from(claim),
                },
                JournalOp::Del { key } => OpOut::Del { key },
            })
            .collect(),
    };
    let mut payload = Vec::with_capacity(256);
    push_json(&mut payload, &frame);
    let mut out = format!("{} {} ", payload.len(), checksum(&payload)).into_bytes();
    out.extend_from_slice(&payload);
    out.push(b'\n');
    out
}

/// A decoded journal.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Journal {
    /// The snapshot this journal continues (from its first frame); `None`
    /// when it has no complete frame.
    pub base: Option<String>,
    /// Records of every complete frame, in order.
    pub ops: Vec<JournalOp>,
    /// Complete frames read.
    pub frames: usize,
    /// Bytes of an incomplete last line that were ignored (0 when none).
    pub torn_tail_bytes: usize,
}

/// Why one line is not a frame.
enum BadLine {
    /// Consistent with a write cut short by a crash.
    Incomplete(String),
    /// Complete but wrong.
    Corrupt(String),
}

fn parse_line(line: &[u8], terminated: bool) -> Result<&[u8], BadLine> {
    if !terminated {
        return Err(BadLine::Incomplete("no terminating newline".into()));
    }
    if line.contains(&0) {
        return Err(BadLine::Incomplete("NUL bytes (never written)".into()));
    }
    let mut parts = line.splitn(3, |b| *b == b' ');
    let (Some(len), Some(sum), Some(payload)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(BadLine::Incomplete("no frame header".into()));
    };
    let len = std::str::from_utf8(len)
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<usize>().ok())
        .ok_or_else(|| BadLine::Incomplete("frame header has no length".into()))?;
    if sum.len() != 16 || !sum.iter().all(|b| b.is_ascii_hexdigit()) {
        return Err(BadLine::Incomplete("frame header has no checksum".into()));
    }
    if payload.len() != len {
        return Err(BadLine::Incomplete(format!(
            "payload is {} bytes, the header says {len}",
            payload.len()
        )));
    }
    if checksum(payload).as_bytes() != sum {
        return Err(BadLine::Corrupt("checksum mismatch".into()));
    }
    Ok(payload)
}

/// The frame's `base` (if any) and records.
type Frame = (Option<String>, Vec<JournalOp>);

fn decode_payload(payload: &[u8], now: Timestamp) -> Result<Frame, String> {
    let value: Value =
        serde_json::from_slice(payload).map_err(|e| format!("payload is not JSON: {e}"))?;
    let base = match value.get("base") {
        None => None,
        Some(Value::String(b)) => Some(b.clone()),
        Some(_) => return Err("\"base\" is not a string".into()),
    };
    let ops = value
        .get("ops")
        .and_then(Value::as_array)
        .ok_or("payload has no \"ops\" array")?;
    ops.iter()
        .map(|op| {
            let key = op
                .get("key")
                .and_then(Value::as_str)
                .ok_or("record without a \"key\" string")?
                .to_string();
            match op.get("op").and_then(Value::as_str) {
                Some("put") => {
                    let row = op.get("claim").ok_or("put record without a \"claim\"")?;
                    let claim = decode_row(&key, row, now)?;
                    Ok(JournalOp::Put { key, claim })
                }
                Some("del") => Ok(JournalOp::Del { key }),
                other => Err(format!("unknown record type {other:?}")),
            }
        })
        .collect::<Result<Vec<_>, String>>()
        .map(|ops| (base, ops))
}

/// Decode a journal. See the module documentation for what is tolerated.
pub fn decode_journal(bytes: &[u8], now: Timestamp) -> Result<Journal, String> {
    let mut journal = Journal::default();
    let mut rest = bytes;
    let mut line_no = 0usize;
    while !rest.is_empty() {
        line_no += 1;
        let (line, terminated, next) = match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (&rest[..i], true, &rest[i + 1..]),
            None => (rest, false, &rest[rest.len()..]),
        };
        let last = next.is_empty();
        match parse_line(line, terminated) {
            Ok(payload) => {
                let (base, ops) =
                    decode_payload(payload, now).map_err(|e| format!("line {line_no}: {e}"))?;
                if journal.frames == 0 {
                    journal.base = Some(base.ok_or_else(|| {
                        format!("line {line_no}: the first frame names no base snapshot")
                    })?);
                }
                journal.ops.extend(ops);
                journal.frames += 1;
            }
            Err(BadLine::Incomplete(_)) if last => {
                journal.torn_tail_bytes = rest.len();
            }
            Err(BadLine::Incomplete(why) | BadLine::Corrupt(why)) => {
                let place = if last { "last line" } else { "line" };
                return Err(format!(
                    "{place} {line_no} is damaged ({why}){}",
                    if last {
                        ""
                    } else {
                        "; only an incomplete last line can come from a crash"
                    }
                ));
            }
        }
        rest = next;
    }
    Ok(journal)
}

/// Apply journal records to a table.
pub fn replay(table: &mut BTreeMap<String, Claim>, ops: Vec<JournalOp>) {
    for op in ops {
        match op {
            JournalOp::Put { key, claim } => {
                table.insert(key, claim);
            }
            JournalOp::Del { key } => {
                table.remove(&key);
            }
        }
    }
}
