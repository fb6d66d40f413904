//! A streaming session's data plane, re-checked on every use (defect
//! review 2026-12-b, finding 2). A session looks its Pod's sandbox up once,
//! at the upgrade, but lives on: a port-forward opens a relay for every
//! local connection, an exec opens one for each `kill` and terminal
//! resize. sandboxd wakes a hibernated VM for any relay opened with the
//! claim's token, so a session that outlived its Pod (a suspended
//! Sandbox's Pod deleted, its VM hibernated) would wake the VM behind
//! vk-sandbox's back. Each relay is therefore opened only after the same
//! lookup the upgrade made still names the same sandbox: the Pod still
//! here and not being deleted, still tracked, still holding that claim.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::sandbox::{
    DataPlane, Relay, RelayError, SandboxRef, SandboxStats, Sandboxes, Unavailable,
};

/// The Pod a session was opened for, and the lookup that re-checks it.
pub struct Rechecked {
    plane: Arc<dyn DataPlane>,
    sandboxes: Arc<dyn Sandboxes>,
    ns: String,
    name: String,
    uid: Option<String>,
}

impl Rechecked {
    pub fn new(
        plane: Arc<dyn DataPlane>,
        sandboxes: Arc<dyn Sandboxes>,
        ns: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Rechecked {
        Rechecked {
            plane,
            sandboxes,
            ns: ns.to_string(),
            name: name.to_string(),
            uid: uid.map(str::to_string),
        }
    }

    /// The sandbox the session may still reach: the one it was opened on,
    /// as the lookup finds it now.
    fn current(&self, opened_on: &SandboxRef) -> Result<SandboxRef, RelayError> {
        still_serves(
            self.sandboxes.as_ref(),
            &self.ns,
            &self.name,
            self.uid.as_deref(),
            &opened_on.id,
        )
        .map_err(RelayError::Withdrawn)
    }
}

/// Pod `ns/name` (and `uid`) still holds sandbox `id`, as the lookup finds
/// it now (with the claim's token); else why not. Every relay opened
/// after a session's upgrade, or for a Pod-address connection, asks this
/// first.
pub fn still_serves(
    sandboxes: &dyn Sandboxes,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    id: &str,
) -> Result<SandboxRef, String> {
    let pod = format!("{ns}/{name}");
    match sandboxes.lookup(ns, name, uid) {
        Ok(now) if now.id == id => Ok(now),
        Ok(now) => Err(format!(
            "pod {pod} now runs in sandbox {} and this session was opened on sandbox {id}; \
             open a new one",
            now.id
        )),
        Err(Unavailable::NoPod) => Err(format!(
            "pod {pod} is no longer on this node; this session no longer reaches its sandbox"
        )),
        Err(Unavailable::NoSandbox(why)) => Err(why),
    }
}

impl DataPlane for Rechecked {
    fn agent<'a>(&'a self, sandbox: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            let now = self.current(sandbox)?;
            self.plane.agent(&now).await
        })
    }

    fn port<'a>(
        &'a self,
        sandbox: &'a SandboxRef,
        port: u16,
    ) -> BoxFuture<'a, Result<Relay, RelayError>> {
        Box::pin(async move {
            let now = self.current(sandbox)?;
            self.plane.port(&now, port).await
        })
    }

    /// Stats never wake a VM (the node token's read).
    fn stats<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
        self.plane.stats(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A lookup whose answer the test sets.
    struct Answer(Mutex<Result<SandboxRef, Unavailable>>);

    impl Sandboxes for Answer {
        fn lookup(&self, _: &str, _: &str, _: Option<&str>) -> Result<SandboxRef, Unavailable> {
            self.0.lock().expect("lock").clone()
        }
        fn running(&self) -> Vec<(crate::pods::pod::Pod, SandboxRef)> {
            Vec::new()
        }
    }

    /// A plane that counts the relays it was asked for.
    #[derive(Default)]
    struct Counting(Mutex<Vec<String>>);

    impl DataPlane for Counting {
        fn agent<'a>(&'a self, s: &'a SandboxRef) -> BoxFuture<'a, Result<Relay, RelayError>> {
            self.0.lock().expect("lock").push(format!("agent {}", s.id));
            Box::pin(async { Err(RelayError::Transport("counted".into())) })
        }
        fn port<'a>(
            &'a self,
            s: &'a SandboxRef,
            port: u16,
        ) -> BoxFuture<'a, Result<Relay, RelayError>> {
            self.0
                .lock()
                .expect("lock")
                .push(format!("port {} {port}", s.id));
            Box::pin(async { Err(RelayError::Transport("counted".into())) })
        }
        fn stats<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<SandboxStats, RelayError>> {
            Box::pin(async { Err(RelayError::Transport("counted".into())) })
        }
    }

    fn sandbox(id: &str) -> SandboxRef {
        SandboxRef {
            id: id.into(),
            token: crate::sandboxd::Secret::new("t"),
        }
    }

    #[tokio::test]
    async fn a_relay_is_opened_only_while_the_lookup_names_the_same_sandbox() {
        let answer = Arc::new(Answer(Mutex::new(Ok(sandbox("sb-1")))));
        let counted = Arc::new(Counting::default());
        let plane = Rechecked::new(counted.clone(), answer.clone(), "ns", "p", None);
        let opened_on = sandbox("sb-1");
        let _ = plane.port(&opened_on, 80).await;
        let _ = plane.agent(&opened_on).await;
        assert_eq!(
            *counted.0.lock().expect("lock"),
            ["port sb-1 80", "agent sb-1"]
        );

        let cases = [
            (Err(Unavailable::NoPod), "no longer on this node"),
            (
                Err(Unavailable::NoSandbox("pod ns/p is being deleted".into())),
                "being deleted",
            ),
            (Ok(sandbox("sb-2")), "now runs in sandbox sb-2"),
        ];
        for (now, says) in cases {
            *answer.0.lock().expect("lock") = now;
            for relay in [
                plane.port(&opened_on, 80).await,
                plane.agent(&opened_on).await,
            ] {
                match relay {
                    Err(RelayError::Withdrawn(why)) => assert!(why.contains(says), "{why}"),
                    Err(e) => panic!("{e}"),
                    Ok(_) => panic!("a relay opened"),
                }
            }
        }
        assert_eq!(
            counted.0.lock().expect("lock").len(),
            2,
            "relays opened after the Pod left"
        );
    }
}
