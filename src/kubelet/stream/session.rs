//! A remote-command session as a transport opens it: the client's channels
//! and the one way back to tell it how the command ended. The route runs
//! the command on the channels and sends the status once, in the Go
//! kubelet's `createStreams → ExecInContainer → writeStatus` shape
//! (docs/streaming.md#exec).

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;

use super::version::RemoteCommandVersion;
use crate::kubelet::exec::Channels;

/// An opened session: the channels the client asked for, and its status
/// writer.
pub struct Opened {
    pub channels: Channels,
    pub status: Box<dyn StatusSink>,
}

/// Where a session's status goes. Dropping it unsent ends the session
/// without a word (the client is gone); its tasks end with it.
pub trait StatusSink: Send {
    /// Tell the client how the command ended, in its version's form
    /// ([`status_body`]), and end the session.
    fn send(self: Box<Self>, status: Status) -> BoxFuture<'static, ()>;
}

/// The status channel's bytes under `version`: the `v1.Status` JSON where
/// the version carries one (v4 and v5), else the failure's message and
/// nothing on success (the older versions carry no exit codes).
pub fn status_body(version: RemoteCommandVersion, status: &Status) -> Vec<u8> {
    if version.status_json() {
        return match serde_json::to_vec(status) {
            Ok(json) => json,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode the exec status");
                b"{\"metadata\":{},\"status\":\"Failure\"}".to_vec()
            }
        };
    }
    if status.status.as_deref() == Some("Success") {
        return Vec::new();
    }
    status
        .message
        .as_deref()
        .unwrap_or("command failed")
        .as_bytes()
        .to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use RemoteCommandVersion::*;

    fn failure(message: Option<&str>) -> Status {
        Status {
            status: Some("Failure".into()),
            message: message.map(Into::into),
            ..Status::default()
        }
    }

    #[test]
    fn json_from_v4_text_before() {
        let ok = Status {
            status: Some("Success".into()),
            ..Status::default()
        };
        let bad = failure(Some("exit 3"));
        for v in [V5, V4, V4Base64] {
            assert_eq!(
                status_body(v, &ok),
                br#"{"apiVersion":"v1","kind":"Status","metadata":{},"status":"Success"}"#,
                "{v:?}"
            );
            assert_eq!(
                status_body(v, &bad),
                br#"{"apiVersion":"v1","kind":"Status","message":"exit 3","metadata":{},"status":"Failure"}"#,
                "{v:?}"
            );
        }
        for v in [V3, V2, V1, V1Base64] {
            assert_eq!(status_body(v, &ok), b"", "{v:?}");
            assert_eq!(status_body(v, &bad), b"exit 3", "{v:?}");
            assert_eq!(status_body(v, &failure(None)), b"command failed", "{v:?}");
        }
    }
}
