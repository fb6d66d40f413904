//! Remote command (exec, attach) over SPDY/3.1: the client opens one stream
//! per channel, named by its `streamType` header (`error`, `stdin`,
//! `stdout`, `stderr`, `resize`); once the expected set is open the command
//! runs, and its status goes on the error stream (a `v1.Status` for v4;
//! plain text for v2 and v3), after which the session is closed.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::watch::Upkeep;
use super::{ResizeDecoder, StreamOptions, status_text};
use crate::kubelet::exec::{Channels, Input, Outcome, Output, TermSize};
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

/// The streams a client opens for `opts` under `protocol`.
pub fn expected(opts: &StreamOptions, protocol: &str) -> Vec<&'static str> {
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
    if opts.tty && protocol != "v2.channel.k8s.io" {
        want.push("resize");
    }
    want
}

/// The error stream's text for `status` under `protocol`.
pub fn error_stream_body(protocol: &str, status: &serde_json::Value) -> Vec<u8> {
    status_text(
        protocol == "v4.channel.k8s.io" || protocol == "v5.channel.k8s.io",
        status,
    )
}

/// Serve one remote-command session on an upgraded connection: wait for
/// the client's streams, run `command` with them, report its outcome. The
/// session is held to `upkeep`: its client's hang-up or its idle timeout
/// ends it (and with it the command, as any hang-up).
pub async fn serve<IO, F, Fut>(
    io: IO,
    protocol: &'static str,
    opts: StreamOptions,
    command: F,
    upkeep: Upkeep,
) where
    IO: AsyncRead + AsyncWrite + Send + 'static,
    F: FnOnce(Channels) -> Fut,
    Fut: Future<Output = (Outcome, serde_json::Value)>,
{
    let (session, mut incoming) = spdy::start_with(io, upkeep.spdy);
    let _watching = upkeep.watch.spdy(&session);
    let want = expected(&opts, protocol);
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
        Ok(false) => return,
        Err(_) => {
            tracing::info!(
                want = ?want,
                "the client did not open its remote-command streams in time"
            );
            session.close().await;
            return;
        }
    }
    let mut take = |kind: &str| {
        streams
            .iter()
            .position(|(k, _)| *k == kind)
            .map(|i| streams.swap_remove(i).1)
    };
    let Some(error) = take("error") else { return };
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
        tokio::spawn(async move {
            session.ended().await;
            hangup.cancel();
        })
    };
    let channels = Channels {
        stdin: stdin.map(|s| Box::new(s.reader) as Box<dyn Input>),
        stdout: stdout.map(|s| Box::new(s.writer) as Box<dyn Output>),
        stderr: stderr.map(|s| Box::new(s.writer) as Box<dyn Output>),
        resize: resize.map(|s| resizes(s.reader)),
        hangup: hangup.clone(),
    };
    let (outcome, status) = command(channels).await;
    ended.abort();
    if hangup.is_cancelled() {
        tracing::debug!(?outcome, "remote-command client gone");
        return;
    }
    let body = error_stream_body(protocol, &status);
    if !body.is_empty() {
        let _ = error.writer.write(Bytes::from(body)).await;
    }
    let _ = error.writer.finish().await;
    if let Some(w) = stdin_writer {
        let _ = w.finish().await;
    }
    session.close().await;
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
    use serde_json::json;

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
            expected(&opts(true, true, true, false), "v4.channel.k8s.io"),
            ["error", "stdin", "stdout", "stderr"]
        );
        assert_eq!(
            expected(&opts(true, true, false, true), "v4.channel.k8s.io"),
            ["error", "stdin", "stdout", "resize"]
        );
        assert_eq!(
            expected(&opts(false, true, true, true), "v3.channel.k8s.io"),
            ["error", "stdout", "resize"],
            "no stderr under a terminal"
        );
        assert_eq!(
            expected(&opts(true, true, false, true), "v2.channel.k8s.io"),
            ["error", "stdin", "stdout"],
            "v2 has no resize"
        );
    }

    #[test]
    fn error_stream_bodies() {
        let ok = json!({"status": "Success"});
        let bad = json!({"status": "Failure", "message": "exit 3"});
        assert_eq!(
            error_stream_body("v4.channel.k8s.io", &ok),
            ok.to_string().into_bytes()
        );
        assert_eq!(
            error_stream_body("v5.channel.k8s.io", &bad),
            bad.to_string().into_bytes()
        );
        assert_eq!(error_stream_body("v3.channel.k8s.io", &ok), b"");
        assert_eq!(error_stream_body("v2.channel.k8s.io", &bad), b"exit 3");
    }
}
