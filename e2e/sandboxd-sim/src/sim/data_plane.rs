//! The data-plane relays: the checks before an `/agent` or `/ports`
//! upgrade (auth, upgrade header, state, the implicit wake, the guest
//! dial), and the buffered `/exec`, which really runs the command in the
//! VM's scratch directory.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tracing::debug;

use super::auth::unknown;
use super::{Answer, Reply, Sim};
use crate::config::PortMapping;
use crate::guest::frames::ErrorKind;
use crate::guest::process::{Launch, exit_code, spawn_piped};
use crate::guest::{RelayHold, Vm};
use crate::model::{bearer, ct_eq};

/// Largest stdout + stderr of a buffered exec.
pub const EXEC_OUTPUT_CAP: usize = 8 * 1024 * 1024;

/// What an accepted relay gets.
#[derive(Debug)]
pub struct RelayGrant {
    pub vm: Arc<Vm>,
    /// Holds the VM against idle hibernation while the relay is open.
    pub hold: RelayHold,
    /// A root-token port relay: it never counts as activity.
    pub passive: bool,
    /// The port relay's connection to the guest port.
    pub guest: Option<TcpStream>,
}

/// `1`–`65535` written plainly (no sign, no leading `+`).
pub fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|p| *p != 0)
}

/// The `Upgrade` header names this protocol (case-insensitively).
fn upgrades_to(header: Option<&str>, proto: &str) -> bool {
    header.is_some_and(|h| h.trim().eq_ignore_ascii_case(proto))
}

/// A buffered exec request, decoded strictly (an unknown field is a 400).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecBody {
    argv: Vec<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    timeout_seconds: Option<i64>,
}

/// A buffered exec's command: killed if still running when the request
/// goes away (timed out, past the output cap, or its client hung up), and
/// forgotten. Only the command itself: what it started in the background
/// runs on, as in a VM.
struct ExecGuard {
    vm: Arc<Vm>,
    pid: u32,
    child: tokio::process::Child,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.start_kill();
        }
        self.vm.unregister(self.pid);
    }
}

impl Sim {
    /// Failed (409), then paused (the implicit wake; `wake_error` when it
    /// fails), then the VM's guest side. Counts as activity.
    async fn enter_guest(self: &Arc<Self>, id: &str, wake_error: Reply) -> Result<Arc<Vm>, Reply> {
        if self
            .lock()
            .claims
            .get(id)
            .is_some_and(|c| c.failed.is_some())
        {
            return Err(Reply::error(409, "sandbox failed: its VM is not running"));
        }
        if let Some(reply) = self.implicit_wake(id).await
            && reply.status != 204
        {
            debug!(
                id,
                status = reply.status,
                "sandboxd-sim: implicit wake failed"
            );
            return Err(if reply.status == 404 {
                reply
            } else {
                wake_error
            });
        }
        let vm = self
            .guests
            .vm(id)
            .map_err(|e| Reply::error(502, format!("guest agent unreachable: {e}")))?;
        let now = self.clock.now();
        Self::touch(&mut self.lock(), id, now);
        Ok(vm)
    }

    /// `GET /v1/sandboxes/{id}/agent`: 401 no bearer, 426 no `Upgrade:
    /// silkd`, 404 unknown sandbox or not its token, 409 failed, 500 when
    /// the implicit wake fails, 502 when the guest cannot be reached.
    pub async fn open_agent(
        self: &Arc<Self>,
        auth: Option<&str>,
        upgrade: Option<&str>,
        id: &str,
    ) -> Result<RelayGrant, Reply> {
        let Some(token) = bearer(auth) else {
            return Err(Reply::error(401, "missing bearer token"));
        };
        if !upgrades_to(upgrade, "silkd") {
            return Err(Reply::error(426, "upgrade required: silkd"));
        }
        if !self.own_claim(token, id) {
            return Err(unknown());
        }
        let vm = self
            .enter_guest(id, Reply::error(500, "sandbox lookup failed"))
            .await?;
        Ok(RelayGrant {
            hold: vm.hold(),
            vm,
            passive: false,
            guest: None,
        })
    }

    /// Where a guest port leads when it is mapped: a mapping for this
    /// sandbox, else one for its template.
    fn port_target(&self, id: &str, port: u16) -> Option<SocketAddr> {
        let st = self.lock();
        let template = st.claims.get(id).map(|c| c.key.template.clone())?;
        let maps = &st.cfg.port_map;
        maps.iter()
            .find(|m| m.guest_port == port && m.sandbox.as_deref() == Some(id))
            .or_else(|| {
                maps.iter().find(|m| {
                    m.guest_port == port && m.template.as_deref() == Some(template.as_str())
                })
            })
            .map(|m| m.target)
    }

    /// `GET /v1/sandboxes/{id}/ports/{port}`: 401 no bearer, 400 a bad
    /// port, 426 no `Upgrade: tcp`, 404 unknown sandbox or wrong token,
    /// 409 failed (or, for the root token's passive relay, paused or in a
    /// transition), 502 when nothing listens on the guest port or the wake
    /// failed. The sandbox token wakes and counts as activity; the root
    /// token does neither.
    pub async fn open_port(
        self: &Arc<Self>,
        auth: Option<&str>,
        upgrade: Option<&str>,
        id: &str,
        port_text: &str,
    ) -> Result<RelayGrant, Reply> {
        let Some(token) = bearer(auth) else {
            return Err(Reply::error(401, "missing bearer token"));
        };
        let Some(port) = parse_port(port_text) else {
            return Err(Reply::error(400, "port must be 1-65535"));
        };
        if !upgrades_to(upgrade, "tcp") {
            return Err(Reply::error(426, "upgrade required: tcp"));
        }
        let passive = {
            let st = self.lock();
            let Some(c) = st.claims.get(id) else {
                return Err(unknown());
            };
            let root = st.cfg.passive_root_ports
                && !st.cfg.api_token.is_empty()
                && ct_eq(token, &st.cfg.api_token);
            if !root && !ct_eq(token, &c.token) {
                return Err(unknown());
            }
            if root {
                let busy = if c.failed.is_some() {
                    Some("sandbox failed: its VM is not running")
                } else if c.hibernated || c.archived {
                    Some("sandbox is paused (a passive relay does not wake it)")
                } else if self.in_transition(id) {
                    Some("sandbox is in a lifecycle transition")
                } else {
                    None
                };
                if let Some(why) = busy {
                    return Err(Reply::error(409, why));
                }
            }
            root
        };
        let unreachable = || Reply::error(502, "guest port unreachable");
        let vm = if passive {
            self.guests.vm(id).map_err(|_| unreachable())?
        } else {
            self.enter_guest(id, unreachable()).await?
        };
        // A mapping is an explicit override; else the guest's own
        // 127.0.0.1:port (inside its namespace).
        let guest = match self.port_target(id, port) {
            Some(target) => TcpStream::connect(target).await,
            None => vm.dial(port).await,
        };
        let guest = guest.map_err(|e| {
            debug!(id, port, error = %e, "sandboxd-sim: guest port unreachable");
            unreachable()
        })?;
        Ok(RelayGrant {
            hold: vm.hold(),
            vm,
            passive,
            guest: Some(guest),
        })
    }

    /// The relay closed: a sandbox-token relay counts as activity up to its
    /// end.
    pub fn relay_closed(&self, grant: &RelayGrant) {
        if !grant.passive {
            let now = self.clock.now();
            Self::touch(&mut self.lock(), &grant.vm.id, now);
        }
    }

    /// Add, replace (same sandbox or template and guest port) or remove
    /// (`target: None`) a guest port mapping.
    pub fn map_port(&self, mapping: PortMapping, remove: bool) -> Result<(), String> {
        mapping.validate()?;
        let mut st = self.lock();
        st.cfg.port_map.retain(|m| {
            !(m.guest_port == mapping.guest_port
                && m.sandbox == mapping.sandbox
                && m.template == mapping.template)
        });
        if !remove {
            st.cfg.port_map.push(mapping);
        }
        Ok(())
    }

    pub fn port_map(&self) -> Vec<PortMapping> {
        self.lock().cfg.port_map.clone()
    }

    pub fn clear_ports(&self) {
        self.lock().cfg.port_map.clear();
    }

    /// One claim as the admin API shows it: the record (with its token)
    /// plus its guest side (scratch directory, network namespace, the
    /// agent's processes, open relays) and whether a hibernate or wake is
    /// running. The guest side is made on first use (an exec, a shell, a
    /// relay); before that `scratch_dir` and `netns` are null.
    pub fn claim_state(&self, id: &str) -> Option<serde_json::Value> {
        let claim = self.lock().claims.get(id).cloned()?;
        let vm = self.guests.existing(id);
        Some(json!({
            "claim": claim,
            "running": claim.is_running(),
            "in_transition": self.in_transition(id),
            "open_relays": vm.as_ref().map_or(0, |v| v.open_relays()),
            "processes": vm.as_ref().map(|v| v.ps()).unwrap_or_default(),
            "scratch_dir": vm.as_ref().map(|v| v.scratch.display().to_string()),
            "netns": vm.as_ref().and_then(|v| v.netns_path()),
        }))
    }

    // ----- POST /v1/sandboxes/{id}/exec -------------------------------------

    /// The buffered exec: sandbox token only; wakes a paused sandbox; runs
    /// the command with no stdin and no terminal; `200 {exit_code, stdout,
    /// stderr}` (non-UTF-8 output becomes U+FFFD), `413` past 8 MiB of
    /// output, `504` past `timeout_seconds`; the command is killed whenever
    /// the node gives up, the client's hang-up included.
    pub async fn exec(self: &Arc<Self>, auth: Option<&str>, id: &str, body: &[u8]) -> Answer {
        let Some(token) = bearer(auth) else {
            return Err(Reply::error(401, "missing bearer token").into());
        };
        let req: ExecBody = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(_) => return Err(Reply::error(400, "invalid request body").into()),
        };
        if req.argv.is_empty() {
            return Err(Reply::error(400, "argv must not be empty").into());
        }
        let timeout = match req.timeout_seconds {
            Some(t) if t < 0 => {
                return Err(Reply::error(400, "timeout_seconds must not be negative").into());
            }
            Some(t) if t > 0 => Some(Duration::from_secs(t as u64)),
            _ => None,
        };
        if !self.own_claim(token, id) {
            return Err(unknown().into());
        }
        let vm = match self
            .enter_guest(id, Reply::error(502, "guest agent unreachable"))
            .await
        {
            Ok(vm) => vm,
            Err(reply) => return Err(reply.into()),
        };
        let _hold = vm.hold();
        let env = req.env.unwrap_or_default();
        let reply = run_buffered(&vm, &req.argv, req.cwd.as_deref(), &env, timeout).await;
        Ok(reply)
    }
}

/// Run one command to completion, collecting its output.
async fn run_buffered(
    vm: &Arc<Vm>,
    argv: &[String],
    cwd: Option<&str>,
    env: &BTreeMap<String, String>,
    timeout: Option<Duration>,
) -> Reply {
    let launch = Launch {
        argv,
        cwd,
        env,
        user: None,
        term: "dumb",
        net: vm.net(),
    };
    let mut child = match spawn_piped(&vm.scratch, &launch, false) {
        Ok(c) => c,
        Err((ErrorKind::BadRequest, message)) => return Reply::error(400, message),
        Err((_, message)) => return Reply::error(502, message),
    };
    let Some(pid) = child.id() else {
        return Reply::error(502, "the command vanished");
    };
    vm.register(pid, argv.to_vec(), None);
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut guard = ExecGuard {
        vm: Arc::clone(vm),
        pid,
        child,
    };
    let (Some(mut stdout), Some(mut stderr)) = (stdout, stderr) else {
        return Reply::error(502, "the command's output is not readable");
    };
    let run = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut out_buf = vec![0u8; 32 * 1024];
        let mut err_buf = vec![0u8; 32 * 1024];
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            tokio::select! {
                n = stdout.read(&mut out_buf), if out_open => match n {
                    Ok(n) if n > 0 => out.extend_from_slice(&out_buf[..n]),
                    _ => out_open = false,
                },
                n = stderr.read(&mut err_buf), if err_open => match n {
                    Ok(n) if n > 0 => err.extend_from_slice(&err_buf[..n]),
                    _ => err_open = false,
                },
            }
            if out.len() + err.len() > EXEC_OUTPUT_CAP {
                return Err(Reply::error(413, "output exceeds 8 MiB"));
            }
        }
        let code = exit_code(guard.child.wait().await);
        Ok((code, out, err))
    };
    let result = match timeout {
        Some(t) => match tokio::time::timeout(t, run).await {
            Ok(r) => r,
            Err(_) => Err(Reply::error(504, "command timed out")),
        },
        None => run.await,
    };
    match result {
        Ok((code, out, err)) => Reply::json(
            200,
            json!({
                "exit_code": code,
                "stdout": String::from_utf8_lossy(&out),
                "stderr": String::from_utf8_lossy(&err),
            }),
        ),
        Err(reply) => reply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_parse_as_the_contract_tests_them() {
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(parse_port("65535"), Some(65535));
        for bad in ["0", "65536", "http", "-1", "+22", "", " 22", "22 "] {
            assert_eq!(parse_port(bad), None, "{bad}");
        }
    }
}
