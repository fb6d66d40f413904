//! The way from a Pod address to the guest (docs/pod-network.md): the same
//! lookup the kubelet API's sessions make (the Pod bound here, tracked,
//! not being deleted, holding the claim), then sandboxd's `/ports` relay
//! with the claim's token, as a port-forward connection opens it.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::recheck::still_serves;
use super::sandbox::{DataPlane, RelayError, Sandboxes};
use crate::podnet::relay::{GuestIo, GuestPorts, Refused};

/// [`GuestPorts`] over the kubelet API's lookup and data plane.
pub struct SandboxPorts {
    sandboxes: Arc<dyn Sandboxes>,
    plane: Arc<dyn DataPlane>,
}

impl SandboxPorts {
    pub fn new(sandboxes: Arc<dyn Sandboxes>, plane: Arc<dyn DataPlane>) -> SandboxPorts {
        SandboxPorts { sandboxes, plane }
    }
}

impl GuestPorts for SandboxPorts {
    fn open<'a>(
        &'a self,
        key: &'a str,
        id: &'a str,
        port: u16,
    ) -> BoxFuture<'a, Result<Box<dyn GuestIo>, Refused>> {
        Box::pin(async move {
            let (ns, name) = key.split_once('/').unwrap_or(("default", key));
            let sandbox =
                still_serves(self.sandboxes.as_ref(), ns, name, None, id).map_err(Refused::Gone)?;
            match self.plane.port(&sandbox, port).await {
                Ok(relay) => Ok(Box::new(relay) as Box<dyn GuestIo>),
                Err(RelayError::Unreachable(why)) => Err(Refused::Guest(why)),
                Err(e @ (RelayError::Gone { .. } | RelayError::Withdrawn(_))) => {
                    Err(Refused::Gone(e.to_string()))
                }
                Err(e) => Err(Refused::Failed(e.to_string())),
            }
        })
    }
}
