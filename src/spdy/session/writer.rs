//! The session's writer task: what is queued, batched into few writes;
//! the header compressor, so a stream's SYN_REPLY precedes its data.

use std::sync::atomic::Ordering;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::error::SessionError;
use super::limits::LINGER;
use super::stream::Outbound;
use crate::activity::Activity;
use crate::spdy::frame::{self, Frame, goaway};
use crate::spdy::headers::{Deflater, encode_block};

/// Write what is queued, batched, until the queue closes, a write fails,
/// or [`Outbound::Close`] is done. Once the session has ended, only what
/// is already queued still goes out, whole frames, for [`LINGER`] at most
/// (a protocol error's GOAWAY; a stream's last frames to a peer that
/// closed only its side); a connection that takes nothing for that long
/// is let go mid-frame, as it is going anyway.
pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    mut write: W,
    mut rx: mpsc::Receiver<Outbound>,
    activity: &Activity,
    ended: &CancellationToken,
) -> Result<(), SessionError> {
    let mut deflater = Deflater::new()?;
    let empty_block = encode_block(&[]);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut closing = false;
    let lingered = async {
        ended.cancelled().await;
        tokio::time::sleep(LINGER).await;
    };
    tokio::pin!(lingered);
    loop {
        let first = if ended.is_cancelled() {
            match rx.try_recv() {
                Ok(item) => item,
                Err(_) => return Ok(()),
            }
        } else {
            tokio::select! {
                item = rx.recv() => match item {
                    Some(item) => item,
                    None => return Ok(()),
                },
                _ = ended.cancelled() => continue,
            }
        };
        let mut next = Some(first);
        // Batch whatever is queued into one write.
        while let Some(item) = next.take() {
            match item {
                Outbound::Frame(f) => frame::encode(&f, &mut buf)?,
                Outbound::Stream(shared, f) => {
                    if !shared.reset.load(Ordering::Acquire) {
                        frame::encode(&f, &mut buf)?;
                    }
                }
                Outbound::Reply { stream_id } => {
                    let block = deflater.compress(&empty_block)?;
                    frame::encode(
                        &Frame::SynReply {
                            stream_id,
                            fin: false,
                            header_block: block.into(),
                        },
                        &mut buf,
                    )?;
                }
                Outbound::Close => closing = true,
            }
            if closing || buf.len() >= 256 * 1024 {
                break;
            }
            next = rx.try_recv().ok();
        }
        if closing {
            frame::encode(
                &Frame::GoAway {
                    last_good_stream_id: 0,
                    status: goaway::OK,
                },
                &mut buf,
            )?;
        }
        let io = async {
            if !buf.is_empty() {
                write.write_all(&buf).await?;
                write.flush().await?;
                activity.note();
            }
            if closing {
                write.shutdown().await?;
            }
            Ok::<(), std::io::Error>(())
        };
        tokio::select! {
            biased;
            r = io => r?,
            _ = &mut lingered => return Ok(()),
        }
        buf.clear();
        if closing {
            return Ok(());
        }
    }
}
