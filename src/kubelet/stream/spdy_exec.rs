//! Remote command (exec, attach) over SPDY/3.1: the client opens one stream
//! per channel, named by its `streamType` header (`error`, `stdin`,
//! `stdout`, `stderr`, `resize`); once the expected set is open the session
//! is [`Opened`]. Its status goes on the error stream (a `v1.Status` from
//! v4; plain text for v2 and v3), after which the session is closed.

use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::session::{Opened, StatusSink, status_body};
use super::version::RemoteCommandVersion;
use super::watch::{Upkeep, Watching};
use super::{ResizeDecoder, StreamOptions};
use crate::kubelet::exec::{Channels, Input, Output, TermSize};
use crate::spdy::{self, StreamReader, StreamWriter};

/// How long the client gets to open its streams (the kubelet's default).
pub const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

impl Input for StreamReader {
    fn next(&mut self) -> BoxFuture<'_, Option<Bytes>> {
        Box::pin(async move { StreamReader::next(self).await.ok() })
    }
}

impl Output for StreamWriter {
    fn write(&self, data: Bytes) -> BoxFuture<'_, Result<(), ()>> {
        Box::pin(async move { StreamWriter::write(self, data).await.map_err(|_| ()) })
    }

    fn finish(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let _ = StreamWriter::finish(self).await;
        })
    }
}

/// The streams a client opens for `opts` under `version`.
pub fn expected(opts: &StreamOptions, version: RemoteCommandVersion) -> Vec<&'static str> {
    let mut want = vec!["error"];
    if opts.stdin {
        want.push("stdin");
    }
    if opts.stdout {
        want.push("stdout");
    }
    if opts.stderr && !opts.tty {
        want.push("stderr");
    }
    if opts.tty && version.resize() {
        want.push("resize");
    }
    want
}

/// Open one remote-command session on an upgraded connection: wait for the
/// client's streams (`None` if it leaves or does not open them in time).
/// The session is held to `upkeep`: its client's hang-up or its idle
/// timeout ends it (and with it the command, as any hang-up).
pub async fn open<IO>(
    io: IO,
    version: RemoteCommandVersion,
    opts: &StreamOptions,
    upkeep: Upkeep,
) -> Option<Opened>
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (session, mut incoming) = spdy::start_with(io, upkeep.spdy);
    let watching = upkeep.watch.spdy(&session);
    let want = expected(opts, version);
    let mut streams: Vec<(&'static str, spdy::Stream)> = Vec::new();
    let collect = async {
        while streams.len() < want.len() {
            let Some(s) = incoming.recv().await else {
                return false;
            };
            let kind = s.headers.get("streamtype").unwrap_or_default();
            match want.iter().find(|w| **w == kind) {
                Some(w) if !streams.iter().any(|(k, _)| k == w) => streams.push((w, s)),
                _ => {
                    tracing::debug!(kind, "unexpected remote-command stream; reset");
                    let _ = s.writer.reset().await;
                }
            }
        }
        true
    };
    match tokio::time::timeout(STREAM_CREATION_TIMEOUT, collect).await {
        Ok(true) => {}
        Ok(false) => return None,
        Err(_) => {
            tracing::info!(
                want = ?want,
                "the client did not open its remote-command streams in time"
            );
            session.close().await;
            return None;
        }
    }
    let mut take = |kind: &str| {
        streams
            .iter()
            .position(|(k, _)| *k == kind)
            .map(|i| streams.swap_remove(i).1)
    };
    let error = take("error")?;
    let stdin = take("stdin");
    let stdout = take("stdout");
    let stderr = take("stderr");
    let resize = take("resize");
    // The stdin stream is finished by this side at the end (clients wait for
    // it); keep its writer.
    let stdin_writer = stdin.as_ref().map(|s| s.writer.clone());
    let hangup = CancellationToken::new();
    let ended = {
        let hangup = hangup.clone();
        let session = session.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            session.ended().await;
            hangup.cancel();
        }))
    };
    let channels = Channels {
        stdin: stdin.map(|s| Box::new(s.reader) as Box<dyn Input>),
        stdout: stdout.map(|s| Box::new(s.writer) as Box<dyn Output>),
        stderr: stderr.map(|s| Box::new(s.writer) as Box<dyn Output>),
        resize: resize.map(|s| resizes(s.reader)),
        hangup,
    };
    let status = SpdyStatus {
        version,
        session,
        error: error.writer,
        stdin: stdin_writer,
        _ended: ended,
        _watching: watching,
    };
    Some(Opened {
        channels,
        status: Box::new(status),
    })
}

/// The error stream of a SPDY session, and what ends the session.
struct SpdyStatus {
    version: RemoteCommandVersion,
    session: spdy::Session,
    error: StreamWriter,
    stdin: Option<StreamWriter>,
    _ended: AbortOnDropHandle<()>,
    _watching: Watching,
}

impl StatusSink for SpdyStatus {
    fn send(self: Box<Self>, status: Status) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            let body = status_body(self.version, &status);
            if !body.is_empty() {
                let _ = self.error.write(Bytes::from(body)).await;
            }
            let _ = self.error.finish().await;
            if let Some(w) = &self.stdin {
                let _ = w.finish().await;
            }
            self.session.close().await;
        })
    }
}

/// Terminal sizes from a resize stream (a sequence of JSON objects).
fn resizes(mut reader: StreamReader) -> mpsc::Receiver<TermSize> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut decoder = ResizeDecoder::default();
        while let Ok(data) = reader.next().await {
            for size in decoder.feed(&data) {
                if tx.send(size).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use RemoteCommandVersion::*;

    fn opts(stdin: bool, stdout: bool, stderr: bool, tty: bool) -> StreamOptions {
        StreamOptions {
            stdin,
            stdout,
            stderr,
            tty,
            command: vec![],
        }
    }

    #[test]
    fn the_streams_each_version_opens() {
        assert_eq!(
            expected(&opts(true, true, true, false), V4),
            ["error", "stdin", "stdout", "stderr"]
        );
        assert_eq!(
            expected(&opts(true, true, false, true), V4),
            ["error", "stdin", "stdout", "resize"]
        );
        assert_eq!(
            expected(&opts(false, true, true, true), V3),
            ["error", "stdout", "resize"],
            "no stderr under a terminal"
        );
        assert_eq!(
            expected(&opts(true, true, false, true), V2),
            ["error", "stdin", "stdout"],
            "v2 has no resize"
        );
    }
}
