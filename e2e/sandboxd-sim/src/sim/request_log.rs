//! The request log (every API request with its reply status and a note
//! when a fault changed its delivery) and the reaper's record.

use serde::{Deserialize, Serialize};

use super::Sim;

/// Most requests kept in the request log (oldest dropped first).
const REQUEST_LOG_CAP: usize = 10_000;

/// One recorded API request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub seq: u64,
    pub method: String,
    /// Path and query.
    pub path: String,
    /// The Authorization header verbatim, if any.
    pub authorization: Option<String>,
    /// The body, as UTF-8 (lossy).
    pub body: String,
    /// `None` while in flight, or when no reply was sent.
    pub status: Option<u16>,
    pub note: Option<String>,
}

/// A claim the reaper ended at its deadline (destroyed or archived).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapRecord {
    pub id: String,
    /// The request log's last sequence number when it was reaped: requests
    /// up to it came before.
    pub after_seq: u64,
    /// Archived rather than destroyed.
    pub archived: bool,
}

#[derive(Debug, Default)]
pub(super) struct RequestLog {
    entries: Vec<RequestRecord>,
    pub(super) next_seq: u64,
    pub(super) reaped: Vec<ReapRecord>,
}

impl Sim {
    pub(crate) fn log_begin(
        &self,
        method: &str,
        path: &str,
        authorization: Option<String>,
        body: &[u8],
    ) -> u64 {
        let mut log = self.log_lock();
        log.next_seq += 1;
        let seq = log.next_seq;
        log.entries.push(RequestRecord {
            seq,
            method: method.to_string(),
            path: path.to_string(),
            authorization,
            body: String::from_utf8_lossy(body).into_owned(),
            status: None,
            note: None,
        });
        if log.entries.len() > REQUEST_LOG_CAP {
            let excess = log.entries.len() - REQUEST_LOG_CAP;
            log.entries.drain(..excess);
        }
        seq
    }

    pub(crate) fn log_finish(&self, seq: u64, status: Option<u16>, note: Option<String>) {
        let mut log = self.log_lock();
        if let Some(e) = log.entries.iter_mut().rev().find(|e| e.seq == seq) {
            e.status = status;
            if note.is_some() {
                e.note = note;
            }
        }
    }

    pub fn requests(&self) -> Vec<RequestRecord> {
        self.log_lock().entries.clone()
    }

    /// Every claim the reaper ended, in order (kept across
    /// [`Sim::clear_requests`]).
    pub fn reaped(&self) -> Vec<ReapRecord> {
        self.log_lock().reaped.clone()
    }

    pub fn clear_requests(&self) {
        self.log_lock().entries.clear();
    }
}
