//! On-disk formats of the claims store, as pure functions of bytes.
//!
//! # Snapshot (`--state-path`)
//!
//! The Go original's `claims.json` (behaviour.md §4.1), byte for byte as Go
//! writes it: one compact JSON object, no trailing newline,
//!
//! ```text
//! {"claims":{"<ns>/<name>":{"id":"sb_…","token":"…","address":"10.0.0.5:7777",
//!   "podUID":"…","claimedAt":"2026-01-01T00:00:00Z","deadline":"…"}}}
//! ```
//!
//! keys in byte order, fields in that order, `address` omitted when empty,
//! `claimedAt`/`deadline` omitted when unset, times at second precision in
//! UTC. The reader is as lenient as Go's `encoding/json`: indentation,
//! unknown fields, `null` values, `"claims": null` or no `claims` key (empty
//! table), field names matched exactly first and then ignoring ASCII case.
//! Wrong types, times that are not RFC 3339, trailing garbage or an empty
//! file are errors (Go refuses them too).
//!
//! # Journal (`<state-path>.journal`)
//!
//! Append-only; one line ("frame") per group commit:
//!
//! ```text
//! <payload length, decimal> <first 16 hex digits of SHA-256(payload)> <payload>\n
//! payload = {"base":"<16 hex>","ops":[{"op":"put","key":"ns/a","claim":{<row as in the snapshot>}},
//!                                     {"op":"del","key":"ns/b"}]}
//! ```
//!
//! A `put` sets the key's row, a `del` removes it; each record carries the
//! key's whole durable state (the last record of a key wins, keys the
//! journal never names keep their snapshot row). The first frame of a
//! journal carries `base`, [`snapshot_base`] of the snapshot it continues: a
//! journal is only ever replayed over that exact snapshot, so a snapshot
//! replaced behind the store's back (restored from a backup, or written by
//! the Go original after a rollback) is never mixed with stale records.
//!
//! Frames are written one at a time and the next frame is only written after
//! the previous one was `fdatasync`ed, so only the last frame of a journal
//! can be damaged by a crash, and nothing in it was ever acknowledged. The
//! last line is therefore ignored when it is *incomplete*: no terminating
//! newline, a header that does not parse, a payload shorter or longer than
//! its declared length, or NUL bytes (blocks the file system allocated but
//! never wrote). Any other bad line — a bad line followed by more lines, or
//! a complete last line whose checksum does not match — is corruption, and
//! the state is refused.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Map, Value};

use super::Claim;
use crate::sandboxd::Deadline;

/// Truncate to whole seconds: the precision of the state file.
pub fn to_second(ts: Timestamp) -> Timestamp {
    Timestamp::from_second(ts.as_second()).unwrap_or(ts)
}

/// A deadline as the file holds it: whole seconds, and Go's zero time
/// (`0001-01-01T00:00:00Z`, which the file reads as "no expiry") is `None`.
pub fn to_file_deadline(ts: Timestamp) -> Option<Timestamp> {
    let ts = to_second(ts);
    (!matches!(Deadline::parse(Some(&format_time(ts))), Deadline::Never)).then_some(ts)
}

/// A `claimedAt` at or before the Unix epoch counts as unset (Go's zero time
/// and `Timestamp::default()` both fall there; no real claim predates 1970).
pub fn is_unset(ts: Timestamp) -> bool {
    ts <= Timestamp::UNIX_EPOCH
}

/// RFC 3339, second precision, UTC (`2026-01-01T00:00:00Z`).
pub fn format_time(ts: Timestamp) -> String {
    to_second(ts).to_string()
}

/// One row as the Go original writes it.
#[derive(Serialize)]
struct RowOut<'a> {
    id: &'a str,
    token: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    address: &'a str,
    #[serde(rename = "podUID")]
    pod_uid: &'a str,
    #[serde(rename = "claimedAt", skip_serializing_if = "Option::is_none")]
    claimed_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline: Option<String>,
}

impl<'a> From<&'a Claim> for RowOut<'a> {
    fn from(c: &'a Claim) -> Self {
        RowOut {
            id: &c.id,
            token: &c.token,
            address: &c.address,
            pod_uid: &c.pod_uid,
            claimed_at: (!is_unset(c.claimed_at)).then(|| format_time(c.claimed_at)),
            deadline: c.deadline.map(format_time),
        }
    }
}

fn push_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Serializing strings and plain structs into a Vec cannot fail.
    if let Err(e) = serde_json::to_writer(&mut *out, value) {
        tracing::error!(error = %e, "claims: JSON encoding failed");
    }
}

/// Encode rows (iterated in key order) as a Go `claims.json`.
pub fn encode_snapshot<'a, I>(rows: I) -> Vec<u8>
where
    I: IntoIterator<Item = (&'a String, &'a Claim)>,
{
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"{\"claims\":{");
    for (i, (key, claim)) in rows.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        push_json(&mut out, key.as_str());
        out.push(b':');
        push_json(&mut out, &RowOut::from(claim));
    }
    out.extend_from_slice(b"}}");
    out
}

/// Decode a snapshot. `now` fills a missing `claimedAt`. The error is the
/// problem, for a message that also names the file.
pub fn decode_snapshot(bytes: &[u8], now: Timestamp) -> Result<BTreeMap<String, Claim>, String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            "is empty (a claims file is at least {\"claims\":{}})".to_string()
        } else {
            format!("is not valid JSON: {e}")
        }
    })?;
    let Value::Object(top) = value else {
        return Err(format!("is {}, expected a JSON object", kind(&value)));
    };
    let mut table = BTreeMap::new();
    match field(&top, "claims") {
        None | Some(Value::Null) => {}
        Some(Value::Object(rows)) => {
            for (key, row) in rows {
                table.insert(key.clone(), decode_row(key, row, now)?);
            }
        }
        Some(other) => {
            return Err(format!(
                "\"claims\" is {}, expected an object of rows",
                kind(other)
            ));
        }
    }
    Ok(table)
}

/// The field named `name`: exact match first, then ignoring ASCII case (as
/// Go's `encoding/json` matches struct fields).
fn field<'v>(obj: &'v Map<String, Value>, name: &str) -> Option<&'v Value> {
    obj.get(name).or_else(|| {
        obj.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string_field(obj: &Map<String, Value>, key: &str, name: &str) -> Result<String, String> {
    match field(obj, name) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(other) => Err(format!(
            "row {key:?}: field {name:?} is {}, expected a string",
            kind(other)
        )),
    }
}

/// A time field: `None` when absent, null, empty or Go's zero time.
fn time_field(
    obj: &Map<String, Value>,
    key: &str,
    name: &str,
) -> Result<Option<Timestamp>, String> {
    let raw = string_field(obj, key, name)?;
    match Deadline::parse(Some(&raw)) {
        Deadline::Never => Ok(None),
        Deadline::At(ts) => Ok(Some(to_second(ts))),
        Deadline::Unparseable(_) => Err(format!(
            "row {key:?}: field {name:?} is {raw:?}, not an RFC 3339 time"
        )),
    }
}

fn decode_row(key: &str, row: &Value, now: Timestamp) -> Result<Claim, String> {
    let empty = Map::new();
    let obj = match row {
        Value::Object(obj) => obj,
        // Go decodes a null row into the zero row.
        Value::Null => &empty,
        other => {
            return Err(format!(
                "row {key:?} is {}, expected an object",
                kind(other)
            ));
        }
    };
    Ok(Claim {
        id: string_field(obj, key, "id")?,
        token: string_field(obj, key, "token")?,
        address: string_field(obj, key, "address")?,
        pod_uid: string_field(obj, key, "podUID")?,
        claimed_at: time_field(obj, key, "claimedAt")?
            .filter(|ts| !is_unset(*ts))
            .unwrap_or(now),
        deadline: time_field(obj, key, "deadline")?,
    })
}

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

fn checksum(payload: &[u8]) -> String {
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

/// One of the state files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFile {
    /// `--state-path`.
    Snapshot,
    /// `<state-path>.journal.old` (only while a rewrite replaces the snapshot).
    JournalOld,
    /// `<state-path>.journal`.
    Journal,
}

/// The bytes of the state files as read; `None`: the file does not exist.
#[derive(Debug, Default, Clone, Copy)]
pub struct StateBytes<'a> {
    pub snapshot: Option<&'a [u8]>,
    pub journal_old: Option<&'a [u8]>,
    pub journal: Option<&'a [u8]>,
}

/// Why state files do not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The file does not decode (the problem).
    Malformed(StateFile, String),
    /// `<state-path>.journal` continues another snapshot than the one on
    /// disk (the snapshot was replaced since the journal started).
    JournalDoesNotContinue,
}

/// The table the state files hold, as the store's start-up load builds it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub rows: BTreeMap<String, Claim>,
    /// Rows in the snapshot alone.
    pub snapshot_rows: usize,
    /// Complete journal frames replayed.
    pub frames: usize,
    /// Incomplete last lines ignored: the journal and its bytes.
    pub torn_tails: Vec<(StateFile, usize)>,
    /// `<state-path>.journal.old` was present but already folded into the
    /// snapshot (a rewrite was interrupted after its rename), so skipped.
    pub skipped_journal_old: bool,
    /// Keys some replayed journal record named (the rest of the rows are
    /// as the snapshot has them).
    pub journal_keys: std::collections::BTreeSet<String>,
}

/// Load state files: the snapshot, then `<path>.journal.old` if it
/// continues the snapshot, then `<path>.journal`, which must continue it.
///
/// A rewrite moves the journal to `.journal.old` before renaming the new
/// snapshot into place. If a crash came before that rename, the old journal
/// still continues this snapshot and is replayed; after it, the snapshot
/// already holds everything the old journal did (the writer's memory is a
/// superset of what it journaled) and it is skipped. Pure: the caller reads
/// the files (and decides what a missing one means).
pub fn load_state(files: StateBytes<'_>, now: Timestamp) -> Result<Loaded, LoadError> {
    let mut rows = match files.snapshot {
        Some(bytes) => decode_snapshot(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::Snapshot, problem))?,
        None => BTreeMap::new(),
    };
    let base = files.snapshot.map(snapshot_base);
    let mut loaded = Loaded {
        snapshot_rows: rows.len(),
        ..Loaded::default()
    };
    let mut apply = |loaded: &mut Loaded, file: StateFile, j: Journal| {
        if j.torn_tail_bytes > 0 {
            loaded.torn_tails.push((file, j.torn_tail_bytes));
        }
        loaded.frames += j.frames;
        loaded.journal_keys.extend(j.ops.iter().map(|op| match op {
            JournalOp::Put { key, .. } | JournalOp::Del { key } => key.clone(),
        }));
        replay(&mut rows, j.ops);
    };
    if let Some(bytes) = files.journal_old {
        let j = decode_journal(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::JournalOld, problem))?;
        if j.base.is_some() && j.base == base {
            apply(&mut loaded, StateFile::JournalOld, j);
        } else {
            loaded.skipped_journal_old = true;
        }
    }
    if let Some(bytes) = files.journal {
        let j = decode_journal(bytes, now)
            .map_err(|problem| LoadError::Malformed(StateFile::Journal, problem))?;
        if j.base.is_some() && j.base != base {
            return Err(LoadError::JournalDoesNotContinue);
        }
        apply(&mut loaded, StateFile::Journal, j);
    }
    loaded.rows = rows;
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    fn now() -> Timestamp {
        ts("2026-08-01T12:00:00Z")
    }

    fn claim(id: &str) -> Claim {
        Claim {
            id: id.into(),
            token: format!("tok-{id}"),
            address: "10.0.0.5:7777".into(),
            pod_uid: "uid-1".into(),
            claimed_at: ts("2026-01-01T00:00:00Z"),
            deadline: Some(ts("2026-01-02T00:00:00Z")),
        }
    }

    #[test]
    fn go_compact_round_trips_byte_for_byte() {
        let go = r#"{"claims":{"ns/a":{"id":"sb_1","token":"t1","address":"10.0.0.5:7777","podUID":"u1","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-01-02T00:00:00Z"},"ns/b":{"id":"sb_2","token":"t2","podUID":""}}}"#;
        let table = decode_snapshot(go.as_bytes(), now()).expect("decode");
        assert_eq!(table["ns/b"].claimed_at, now());
        assert_eq!(table["ns/b"].deadline, None);
        let mut again = table.clone();
        again.get_mut("ns/b").expect("row").claimed_at = Timestamp::UNIX_EPOCH;
        assert_eq!(
            String::from_utf8(encode_snapshot(&again)).expect("utf8"),
            go
        );
    }

    #[test]
    fn empty_table_is_exact() {
        assert_eq!(encode_snapshot(&BTreeMap::new()), br#"{"claims":{}}"#);
    }

    #[test]
    fn times_are_seconds_utc() {
        let mut c = claim("sb_1");
        c.claimed_at = ts("2026-01-01T08:00:00.987654321+08:00");
        c.deadline = Some(ts("2026-01-02T00:00:00.5Z"));
        let out = String::from_utf8(encode_snapshot(&BTreeMap::from([("k".to_string(), c)])))
            .expect("utf8");
        assert!(
            out.contains(r#""claimedAt":"2026-01-01T00:00:00Z""#),
            "{out}"
        );
        assert!(
            out.contains(r#""deadline":"2026-01-02T00:00:00Z""#),
            "{out}"
        );
    }

    #[test]
    fn lenient_reader() {
        for (text, rows) in [
            ("{}", 0),
            (r#"{"claims":null}"#, 0),
            (r#"{"other":1}"#, 0),
            (
                "\n{\n  \"claims\": {\n    \"ns/a\": {\n      \"id\": \"sb_1\",\n      \"token\": \"t\",\n      \"podUID\": \"u\"\n    }\n  }\n}\n",
                1,
            ),
            (
                r#"{"claims":{"ns/a":{"ID":"sb_1","Token":"t","PodUid":"u","extra":[1,2],"claimedAt":null,"deadline":"0001-01-01T00:00:00Z"}},"version":3}"#,
                1,
            ),
            (r#"{"claims":{"ns/a":null}}"#, 1),
        ] {
            let table = decode_snapshot(text.as_bytes(), now()).expect(text);
            assert_eq!(table.len(), rows, "{text}");
        }
        let t = decode_snapshot(
            br#"{"claims":{"ns/a":{"ID":"sb_1","Token":"t","PodUid":"u","deadline":"0001-01-01T00:00:00Z"}}}"#,
            now(),
        )
        .expect("decode");
        let a = &t["ns/a"];
        assert_eq!(
            (a.id.as_str(), a.token.as_str(), a.pod_uid.as_str()),
            ("sb_1", "t", "u")
        );
        assert_eq!(a.deadline, None);
        assert_eq!(a.claimed_at, now());
    }

    #[test]
    fn malformed_snapshots_are_refused() {
        for bad in [
            "",
            "  \n",
            "{",
            "[]",
            "null",
            r#"{"claims":[]}"#,
            r#"{"claims":{"ns/a":{"id":5}}}"#,
            r#"{"claims":{"ns/a":"sb_1"}}"#,
            r#"{"claims":{"ns/a":{"deadline":"tomorrow"}}}"#,
            r#"{"claims":{}} trailing"#,
        ] {
            assert!(decode_snapshot(bad.as_bytes(), now()).is_err(), "{bad:?}");
        }
        assert!(decode_snapshot(b"{\"claims\":{}}\xff", now()).is_err());
    }

    fn frame(ops: &[JournalOp]) -> Vec<u8> {
        encode_frame(ops, Some("0123456789abcdef"))
    }

    #[test]
    fn journal_round_trip_and_replay() {
        let a = claim("sb_1");
        let b = claim("sb_2");
        let mut bytes = frame(&[JournalOp::Put {
            key: "ns/a".into(),
            claim: a.clone(),
        }]);
        bytes.extend(frame(&[
            JournalOp::Put {
                key: "ns/b".into(),
                claim: b.clone(),
            },
            JournalOp::Del { key: "ns/a".into() },
        ]));
        let j = decode_journal(&bytes, now()).expect("journal");
        assert_eq!(j.frames, 2);
        assert_eq!(j.torn_tail_bytes, 0);
        assert_eq!(j.base.as_deref(), Some("0123456789abcdef"));
        let mut table = BTreeMap::from([("ns/c".to_string(), claim("sb_3"))]);
        replay(&mut table, j.ops);
        assert_eq!(
            table.keys().collect::<Vec<_>>(),
            vec!["ns/b", "ns/c"],
            "del removes, put adds, untouched keys stay"
        );
        assert_eq!(table["ns/b"], b);
    }

    #[test]
    fn torn_last_line_is_ignored() {
        let good = frame(&[JournalOp::Del { key: "k".into() }]);
        let next = frame(&[JournalOp::Put {
            key: "k2".into(),
            claim: claim("sb_9"),
        }]);
        for cut in 1..next.len() {
            let mut bytes = good.clone();
            bytes.extend_from_slice(&next[..cut]);
            let j = decode_journal(&bytes, now()).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
            assert_eq!(j.frames, 1, "cut {cut}");
            assert_eq!(j.torn_tail_bytes, cut, "cut {cut}");
        }
        // Blocks allocated but never written read as zeros.
        let mut zeros = good.clone();
        zeros.extend(std::iter::repeat_n(0u8, 4096));
        assert_eq!(decode_journal(&zeros, now()).expect("zeros").frames, 1);
        let mut holed = good.clone();
        let mut hole = next.clone();
        hole[10..20].fill(0);
        holed.extend(hole);
        assert_eq!(decode_journal(&holed, now()).expect("hole").frames, 1);
    }

    #[test]
    fn damaged_middle_or_complete_last_line_is_refused() {
        let a = frame(&[JournalOp::Del { key: "a".into() }]);
        let b = frame(&[JournalOp::Del { key: "b".into() }]);
        // A torn line followed by another frame.
        let mut bytes = a[..a.len() - 3].to_vec();
        bytes.push(b'\n');
        bytes.extend_from_slice(&b);
        let err = decode_journal(&bytes, now()).expect_err("middle");
        assert!(err.contains("line 1"), "{err}");
        // A flipped byte in a complete last line.
        let mut flipped = a.clone();
        flipped.extend_from_slice(&b);
        let n = flipped.len();
        flipped[n - 4] ^= 0x01;
        let err = decode_journal(&flipped, now()).expect_err("checksum");
        assert!(err.contains("checksum"), "{err}");
        // An empty middle line.
        let mut empty = a.clone();
        empty.push(b'\n');
        empty.extend_from_slice(&b);
        assert!(decode_journal(&empty, now()).is_err());
        // A journal whose first frame names no base.
        let unbased = encode_frame(&[JournalOp::Del { key: "a".into() }], None);
        let err = decode_journal(&unbased, now()).expect_err("no base");
        assert!(err.contains("base"), "{err}");
        // A well-framed payload that is not a journal record.
        let payload = br#"{"ops":[{"op":"zap","key":"k"}]}"#;
        let mut odd = format!("{} {} ", payload.len(), checksum(payload)).into_bytes();
        odd.extend_from_slice(payload);
        odd.push(b'\n');
        assert!(decode_journal(&odd, now()).is_err());
    }
}
