//! The snapshot file: the Go original's `claims.json`, byte for byte.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{Map, Value};

use super::time::{format_time, is_unset, to_second};
use crate::claims::lifecycle::{Lifecycle, Wire};
use crate::claims::types::Claim;
use crate::sandboxd::{Deadline, Token};

/// One row as the Go original writes it.
#[derive(Serialize)]
pub(super) struct RowOut<'a> {
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
    /// vk-sandbox's own, ignored by the Go build; absent when empty, so a
    /// row without lifecycle state is the Go build's byte for byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    lifecycle: Option<Box<Wire>>,
}

impl<'a> From<&'a Claim> for RowOut<'a> {
    fn from(c: &'a Claim) -> Self {
        RowOut {
            id: &c.id,
            token: c.token.as_deref().map_or("", |t| t.expose()),
            address: &c.address,
            pod_uid: &c.pod_uid,
            claimed_at: (!is_unset(c.claimed_at)).then(|| format_time(c.claimed_at)),
            deadline: c.deadline.map(format_time),
            lifecycle: c.lifecycle.to_wire().map(Box::new),
        }
    }
}

pub(super) fn push_json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
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

pub(super) fn decode_row(key: &str, row: &Value, now: Timestamp) -> Result<Claim, String> {
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
        token: Token::new(string_field(obj, key, "token")?),
        address: string_field(obj, key, "address")?,
        pod_uid: string_field(obj, key, "podUID")?,
        claimed_at: time_field(obj, key, "claimedAt")?
            .filter(|ts| !is_unset(*ts))
            .unwrap_or(now),
        deadline: time_field(obj, key, "deadline")?,
        lifecycle: Box::new(
            Lifecycle::from_json(field(obj, "lifecycle"))
                .map_err(|e| format!("row {key:?}: {e}"))?,
        ),
    })
}
