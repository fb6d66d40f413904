//! On-disk formats of the claims store, as pure functions of bytes.
//!
//! # Snapshot (`--state-path`)
//!
//! The Go original's `claims.json`, byte for byte as Go
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

mod journal;
mod load;
mod snapshot;
#[cfg(test)]
mod tests;
mod time;

pub use journal::{Journal, JournalOp, decode_journal, encode_frame, replay, snapshot_base};
pub use load::{LoadError, Loaded, StateBytes, StateFile, load_state};
pub use snapshot::{decode_snapshot, encode_snapshot};
pub use time::{format_time, is_unset, normalised, to_file_deadline, to_second};
