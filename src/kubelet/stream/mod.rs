//! The streaming protocols of the kubelet API (docs/streaming.md): how an
//! exec, attach or port-forward request is upgraded and framed.
//!
//! - [`version`]: the protocol versions and what each means (pure);
//! - [`negotiate`]: SPDY/3.1 or WebSocket, and which version (pure);
//! - [`session`]: a remote-command session as a transport opens it (its
//!   channels, its status writer);
//! - [`spdy_exec`]: remote command over SPDY streams;
//! - [`websocket`]: remote command over WebSocket channels (v5 … v1);
//! - [`tunnel`]: a WebSocket carrying a SPDY byte stream (port-forward);
//! - [`options`]: the request's stream options (pure);
//! - [`watch`]: ending a session on its idle timeout or its client's
//!   hang-up.

pub mod negotiate;
pub mod options;
pub mod session;
pub mod spdy_exec;
pub mod tunnel;
pub mod version;
pub mod watch;
pub mod websocket;

pub use negotiate::{Negotiated, Refusal, Transport, negotiate};
pub use options::{StreamOptions, stream_options};
pub use session::{Opened, StatusSink};
pub use version::{PortForwardVersion, RemoteCommandVersion};

use crate::kubelet::exec::TermSize;

/// Most bytes of an unfinished resize message kept (they are ~30 bytes).
const MAX_RESIZE_PENDING: usize = 4096;

/// Terminal sizes from the resize channel: JSON objects back to back,
/// possibly split across reads. Malformed input is skipped. Pure.
#[derive(Debug, Default)]
pub struct ResizeDecoder {
    pending: Vec<u8>,
}

impl ResizeDecoder {
    pub fn feed(&mut self, data: &[u8]) -> Vec<TermSize> {
        self.pending.extend_from_slice(data);
        let mut sizes = Vec::new();
        let mut consumed = 0;
        let mut iter = serde_json::Deserializer::from_slice(&self.pending).into_iter::<TermSize>();
        loop {
            match iter.next() {
                Some(Ok(size)) => {
                    consumed = iter.byte_offset();
                    sizes.push(size);
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(_)) => {
                    // Not a size: drop what is buffered and start afresh.
                    consumed = self.pending.len();
                    break;
                }
                None => {
                    consumed = self.pending.len();
                    break;
                }
            }
        }
        self.pending.drain(..consumed);
        if self.pending.len() > MAX_RESIZE_PENDING {
            self.pending.clear();
        }
        sizes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(width: u16, height: u16) -> TermSize {
        TermSize { width, height }
    }

    #[test]
    fn sizes_back_to_back_and_split() {
        let mut d = ResizeDecoder::default();
        assert_eq!(
            d.feed(b"{\"Width\":80,\"Height\":24}\n{\"Width\":100,"),
            [size(80, 24)]
        );
        assert_eq!(d.feed(b"\"Height\":40}\n"), [size(100, 40)]);
        assert!(d.feed(b"").is_empty());
        assert_eq!(d.feed(b"{\"Height\":1,\"Width\":2}"), [size(2, 1)]);
    }

    #[test]
    fn junk_is_dropped_and_decoding_recovers() {
        let mut d = ResizeDecoder::default();
        assert!(d.feed(b"nonsense").is_empty());
        assert_eq!(d.feed(b"{\"Width\":1,\"Height\":1}"), [size(1, 1)]);
        assert!(d.feed(b"{\"Width\":-1,\"Height\":1}").is_empty());
        assert_eq!(d.feed(b"{\"Width\":3,\"Height\":4}"), [size(3, 4)]);
        let mut big = b"{\"Width\":".to_vec();
        big.extend(std::iter::repeat_n(b' ', MAX_RESIZE_PENDING + 1));
        assert!(d.feed(&big).is_empty());
        assert_eq!(d.feed(b"{\"Width\":5,\"Height\":6}"), [size(5, 6)]);
    }
}
