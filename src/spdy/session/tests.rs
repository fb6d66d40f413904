//! The session against a hand-driven peer ([`crate::spdy::testing::Peer`]),
//! and its reader alone; by concern in the files below.

use std::time::Duration;

use super::limits::WRITE_QUEUE;
use super::stream::Outbound;
use super::*;
use crate::spdy::frame::{self, Frame, goaway, rst};
use crate::spdy::headers::{Headers, Inflater};
use crate::spdy::testing::Peer;

use bytes::{Bytes, BytesMut};
use std::sync::atomic::AtomicBool;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

fn pair() -> (Peer, Session, mpsc::Receiver<Stream>) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (session, streams) = start(b);
    (Peer::new(a), session, streams)
}

async fn next_stream(streams: &mut mpsc::Receiver<Stream>) -> Stream {
    tokio::time::timeout(Duration::from_secs(10), streams.recv())
        .await
        .expect("a stream within 10 s")
        .expect("session alive")
}

/// A reader fed streams directly, its replies and streams drained.
fn bare_reader() -> Reader {
    bare_reader_with(Limits::default())
}

fn bare_reader_with(limits: Limits) -> Reader {
    let (out, mut out_rx) = mpsc::channel(WRITE_QUEUE);
    let (streams, mut streams_rx) = mpsc::channel::<Stream>(8);
    tokio::spawn(async move { while out_rx.recv().await.is_some() {} });
    tokio::spawn(async move { while streams_rx.recv().await.is_some() {} });
    Reader {
        out,
        streams,
        open: HashMap::new(),
        live: HashMap::new(),
        prune_at: 64,
        inflater: Inflater::new(),
        last_id: 0,
        going_away: false,
        stream_bytes: limits.stream_bytes,
        session_budget: Arc::new(Semaphore::new(limits.session_bytes)),
        max_streams: limits.max_streams,
        tally: Arc::new(Tally {
            streams: AtomicUsize::new(0),
            stats: limits.stats,
        }),
        activity: Activity::new(),
        ended: CancellationToken::new(),
    }
}

/// A reader whose messages to the writer task are kept for the test.
fn bare_reader_seen(limits: Limits) -> (Reader, mpsc::Receiver<Outbound>) {
    let mut r = bare_reader_with(limits);
    let (out, out_rx) = mpsc::channel(1 << 20);
    r.out = out;
    (r, out_rx)
}

async fn wait_for(f: impl Fn() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not met in 10 s");
}

mod budgets;
mod ending;
mod streams;
