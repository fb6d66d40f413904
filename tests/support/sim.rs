//! The sandboxd simulator as the tests set it up, and its request log.

use std::path::{Path, PathBuf};

use sandboxd_sim::{PoolConfig, SimConfig, SimHandle};

/// A simulator configuration: root token `token` (empty: open mode, no
/// token asked) and one warm pool per `template=warm[/target]` spec.
pub fn config(token: &str, pools: &[&str]) -> SimConfig {
    SimConfig {
        api_token: token.into(),
        pools: pools
            .iter()
            .map(|spec| PoolConfig::parse_spec(spec).unwrap_or_else(|e| panic!("pool {spec}: {e}")))
            .collect(),
        ..Default::default()
    }
}

/// Starts the simulator of `cfg` on a loopback port, in this process.
pub async fn start(cfg: SimConfig) -> SimHandle {
    sandboxd_sim::start_local(cfg)
        .await
        .expect("start the sandboxd simulator")
}

/// Writes `contents` (the token as the test spells it) to
/// `<dir>/sandboxd-token`; returns the path.
pub fn token_file(dir: &Path, contents: &str) -> PathBuf {
    let path = dir.join("sandboxd-token");
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// vk-sandbox's flags for `sim`: its URL and, when given, the token file.
pub fn vk_args(sim: &SimHandle, token_file: Option<&Path>) -> Vec<String> {
    let mut args = vec![format!("--sandboxd-url={}", sim.base_url())];
    if let Some(path) = token_file {
        args.push(format!("--sandboxd-token-file={}", path.display()));
    }
    args
}

/// Claim requests sent for the Pod `key` (`<namespace>/<name>`): the
/// request's `claim_ref` names that Pod, with or without vk-sandbox's tag.
pub fn claims_for_key(sim: &SimHandle, key: &str) -> usize {
    sim.sim()
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/claim")
        .filter(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()
                .and_then(|b| b["claim_ref"].as_str().map(str::to_string))
                .is_some_and(|cr| vk_sandbox::pods::claim_ref::display(&cr) == key)
        })
        .count()
}

/// The release requests sent so far, whatever the answer.
pub fn releases(sim: &SimHandle) -> Vec<sandboxd_sim::RequestRecord> {
    sim.sim()
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/release"))
        .collect()
}

/// The requests so far but the Node's own reads of `GET /v1/info` (every
/// couple of seconds, whatever the Pods do: src/fleet): what the Pods'
/// handling sent.
pub fn requests_but_info(sim: &SimHandle) -> Vec<sandboxd_sim::RequestRecord> {
    sim.sim()
        .requests()
        .into_iter()
        .filter(|r| !(r.method == "GET" && r.path == "/v1/info"))
        .collect()
}

/// Every sandbox of `template`: guest port `guest` leads to the loopback
/// port `to`, for each `(guest, to)`.
pub fn lead_template_ports(cfg: &mut SimConfig, template: &str, ports: &[(u16, u16)]) {
    for &(guest_port, port) in ports {
        cfg.port_map.push(sandboxd_sim::PortMapping {
            sandbox: None,
            template: Some(template.into()),
            guest_port,
            target: ([127, 0, 0, 1], port).into(),
        });
    }
}

/// The running simulator: sandbox `id`'s guest port `guest` leads to
/// `target`.
pub fn lead_sandbox_port(sim: &SimHandle, id: &str, guest_port: u16, target: std::net::SocketAddr) {
    sim.sim()
        .map_port(
            sandboxd_sim::PortMapping {
                sandbox: Some(id.to_string()),
                template: None,
                guest_port,
                target,
            },
            false,
        )
        .expect("map the guest port");
}
