//! From flags to the typed configuration: every value checked, every
//! problem collected and reported at once, each naming the flag, its
//! environment variable, the value and the fix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cli::RunArgs;
use super::settings::{
    Capacity, Config, FleetConfig, InventoryConfig, KubeClientConfig, KubeletAuthConfig,
    LifecycleConfig, PodNetworkConfig, SandboxdConfig, TlsFiles,
};
use super::values::{
    ListenAddr, advertise_default, check_label_key, check_label_value, nanos_to_duration,
    parse_go_duration, parse_node_labels, validate_quantity,
};
use crate::error::{Error, Result};
use crate::sandboxd::Secret;

mod problems;
mod serving;

use problems::{Problems, non_empty_path};
use serving::{streaming, webhook};

impl Config {
    /// Validate `args`; read the token file; create (0700) and prove
    /// writable the state directory. Touches no cluster.
    pub fn from_args(args: &RunArgs) -> Result<Config> {
        Self::validate(args, true)
    }

    /// [`Config::from_args`] without the state directory step: nothing on
    /// disk is created or probed (`vk-sandbox preflight` checks the state
    /// path itself, read-only).
    pub fn from_args_without_state_check(args: &RunArgs) -> Result<Config> {
        Self::validate(args, false)
    }

    fn validate(args: &RunArgs, check_state: bool) -> Result<Config> {
        let mut p = Problems::default();

        let listen_addr = ListenAddr::parse(&args.kubelet.listen_addr)
            .map_err(|why| {
                p.push(
                    "listen-addr",
                    Some("VK_LISTEN_ADDR"),
                    &args.kubelet.listen_addr,
                    &format!("parse --listen-addr: {why}"),
                    "give host:port with a port in 1-65535, e.g. :10260 or 10.0.0.5:10260",
                )
            })
            .ok();
        let admin_addr = ListenAddr::parse(&args.admin.admin_addr)
            .map_err(|why| {
                p.push(
                    "admin-addr",
                    Some("VK_ADMIN_ADDR"),
                    &args.admin.admin_addr,
                    &format!("parse --admin-addr: {why}"),
                    "give host:port with a port in 1-65535, e.g. :10261 or 127.0.0.1:10261",
                )
            })
            .ok();

        let pod_range = match args.pod_network.pod_cidr.trim() {
            "" => None,
            raw => crate::podnet::range::PodRange::parse(raw)
                .map_err(|why| {
                    p.push(
                        "pod-cidr",
                        Some("VK_POD_CIDR"),
                        raw,
                        &format!("parse --pod-cidr: {why}"),
                        "give an IPv4 block routed to this host that the CNI does not use, \
                         e.g. 10.250.3.0/24, or leave it empty for the node's address",
                    )
                })
                .ok(),
        };
        let pod_netns = match args.pod_network.pod_netns.trim() {
            "" => None,
            raw if Path::new(raw).exists() => Some(PathBuf::from(raw)),
            raw => {
                p.push(
                    "pod-netns",
                    Some("VK_POD_NETNS"),
                    raw,
                    "--pod-netns names no file",
                    "give a network namespace's path (e.g. /run/netns/NAME, made by `ip netns \
                     add NAME`), or leave it empty for vk-sandbox's own",
                );
                None
            }
        };

        let mut quantity = |flag: &str, env: &str, value: &str| {
            validate_quantity(value)
                .map_err(|why| {
                    p.push(
                        flag,
                        Some(env),
                        value,
                        &format!("not a usable Kubernetes quantity: {why}"),
                        "give a positive quantity such as 4000, 500m, 8Ti or 64Gi",
                    )
                })
                .ok()
        };
        let or_default = |v: &str, d: &'static str| {
            if v.is_empty() {
                d.to_string()
            } else {
                v.to_string()
            }
        };
        let cpu = quantity(
            "node-cpu",
            "VK_NODE_CPU",
            &or_default(&args.node.node_cpu, super::defaults::NODE_CPU),
        );
        let memory = quantity(
            "node-memory",
            "VK_NODE_MEMORY",
            &or_default(&args.node.node_memory, super::defaults::NODE_MEMORY),
        );
        let pods = quantity(
            "node-pods",
            "VK_NODE_PODS",
            &or_default(&args.node.node_pods, super::defaults::NODE_PODS),
        );

        let min_qps = super::defaults::MIN_QPS;
        for (flag, qps, example) in [
            ("kube-api-qps", args.kube.kube_api_qps, "--kube-api-qps=200"),
            ("event-qps", args.kube.event_qps, "--event-qps=200"),
        ] {
            if !(qps.is_finite() && qps >= min_qps) {
                p.push(
                    flag,
                    None,
                    &qps.to_string(),
                    &format!(
                        "must be a number of requests per second of at least {min_qps} \
                         (lower rates only make requests wait past their 30 s deadline)"
                    ),
                    &format!("give e.g. {example}"),
                );
            }
        }
        for (flag, burst, example) in [
            (
                "kube-api-burst",
                args.kube.kube_api_burst,
                "--kube-api-burst=400",
            ),
            ("event-burst", args.kube.event_burst, "--event-burst=400"),
        ] {
            if burst == 0 {
                p.push(
                    flag,
                    None,
                    "0",
                    "must be at least 1",
                    &format!("give e.g. {example}"),
                );
            }
        }

        if args.node.node_name.trim().is_empty() {
            p.push(
                "node-name",
                Some("VK_NODE_NAME"),
                &args.node.node_name,
                "the node name is empty",
                "give a DNS name such as node-a-sandboxd",
            );
        }

        let url = crate::sandboxd::normalise_base_url(&args.sandboxd.sandboxd_url)
            .map_err(|e| {
                p.push(
                    "sandboxd-url",
                    Some("SANDBOXD_URL"),
                    &args.sandboxd.sandboxd_url,
                    &e.to_string(),
                    "give e.g. http://127.0.0.1:7777",
                )
            })
            .ok();
        let advertise_addr = if args.inventory.sandboxd_advertise_addr.is_empty() {
            advertise_default(url.as_deref().unwrap_or(&args.sandboxd.sandboxd_url))
        } else {
            args.inventory.sandboxd_advertise_addr.clone()
        };

        let orphan_scan_interval = match parse_go_duration(&args.audit.orphan_scan_interval) {
            Ok(n) if n <= 0 => None,
            Ok(n) => Some(nanos_to_duration(n)),
            Err(why) => {
                p.push(
                    "orphan-scan-interval",
                    None,
                    &args.audit.orphan_scan_interval,
                    &format!("not a Go duration: {why}"),
                    "give e.g. 60s or 5m (0 disables the scan)",
                );
                None
            }
        };
        let renew_margin = match parse_go_duration(&args.lifecycle.lease_renew_margin) {
            Ok(n) if n >= 0 => nanos_to_duration(n),
            Ok(_) => {
                p.push(
                    "lease-renew-margin",
                    Some("VK_LEASE_RENEW_MARGIN"),
                    &args.lifecycle.lease_renew_margin,
                    "must not be negative",
                    "give e.g. 12h, or 0 to renew nothing",
                );
                Duration::ZERO
            }
            Err(why) => {
                p.push(
                    "lease-renew-margin",
                    Some("VK_LEASE_RENEW_MARGIN"),
                    &args.lifecycle.lease_renew_margin,
                    &format!("not a Go duration: {why}"),
                    "give e.g. 12h, or 0 to renew nothing",
                );
                Duration::ZERO
            }
        };
        let node_status_interval = match parse_go_duration(&args.node.node_status_interval) {
            Ok(n) if n > 0 => nanos_to_duration(n),
            Ok(_) | Err(_) => {
                p.push(
                    "node-status-interval",
                    None,
                    &args.node.node_status_interval,
                    "must be a Go duration greater than zero",
                    "give e.g. 60s",
                );
                Duration::from_secs(60)
            }
        };
        let info_interval = match parse_go_duration(&args.fleet.sandboxd_info_interval) {
            Ok(n) if n > 0 => nanos_to_duration(n),
            Ok(_) | Err(_) => {
                p.push(
                    "sandboxd-info-interval",
                    Some("VK_SANDBOXD_INFO_INTERVAL"),
                    &args.fleet.sandboxd_info_interval,
                    "must be a Go duration greater than zero",
                    "give e.g. 2s",
                );
                Duration::from_secs(2)
            }
        };
        let hand_back_after = match parse_go_duration(&args.fleet.hand_back_after) {
            Ok(0) => None,
            Ok(n) if n > 0 => Some(nanos_to_duration(n)),
            Ok(_) | Err(_) => {
                p.push(
                    "hand-back-after",
                    Some("VK_HAND_BACK_AFTER"),
                    &args.fleet.hand_back_after,
                    "must be a Go duration, 0 or more",
                    "give e.g. 10s, or 0 to never hand a Pod back",
                );
                None
            }
        };
        let vm_holder_gone_after = match parse_go_duration(&args.fleet.vm_holder_gone_after) {
            Ok(n) if n >= 0 => nanos_to_duration(n),
            Ok(_) | Err(_) => {
                p.push(
                    "vm-holder-gone-after",
                    Some("VK_VM_HOLDER_GONE_AFTER"),
                    &args.fleet.vm_holder_gone_after,
                    "must be a Go duration, 0 or more",
                    "give e.g. 5m",
                );
                Duration::from_secs(300)
            }
        };
        let publish_interval = match parse_go_duration(&args.inventory.publish_interval) {
            Ok(n) if n > 0 => nanos_to_duration(n),
            Ok(_) if args.inventory.publish_inventory => {
                p.push(
                    "publish-interval",
                    None,
                    &args.inventory.publish_interval,
                    "must be greater than zero while --publish-inventory is on",
                    "give e.g. 30s",
                );
                Duration::ZERO
            }
            Ok(_) => Duration::ZERO,
            Err(why) => {
                p.push(
                    "publish-interval",
                    None,
                    &args.inventory.publish_interval,
                    &format!("not a Go duration: {why}"),
                    "give e.g. 30s",
                );
                Duration::ZERO
            }
        };
        // Empty (e.g. `VK_INVENTORY_GROUP=` in an env file) means unset.
        let inventory_group = args
            .inventory
            .inventory_group
            .as_deref()
            .map(str::trim)
            .filter(|g| !g.is_empty());
        if inventory_group.is_some_and(|g| g.contains('/') || g.contains(char::is_whitespace)) {
            p.push(
                "inventory-group",
                Some("VK_INVENTORY_GROUP"),
                inventory_group.unwrap_or_default(),
                "not an API group name",
                "give e.g. sandbox.cocoonstack.io or extensions.agents.x-k8s.io, or leave it \
                 unset to publish where the cluster serves the CRD",
            );
        }

        let node_labels = parse_node_labels(&args.node.node_labels);
        for (key, value) in &node_labels {
            if let Err(why) = check_label_key(key).and_then(|()| check_label_value(value)) {
                p.push(
                    "node-labels",
                    None,
                    &args.node.node_labels,
                    &why,
                    "use Kubernetes label syntax, e.g. --node-labels=zone=a,team=infra",
                );
            }
        }

        let streaming = streaming(args, &mut p);

        let client_ca_file = non_empty_path(&args.kubelet.client_ca_file);
        if let Some(path) = &client_ca_file
            && let Err(e) = std::fs::metadata(path)
        {
            p.push(
                "client-ca-file",
                Some("VK_CLIENT_CA_FILE"),
                &args.kubelet.client_ca_file,
                &format!("cannot read it: {e}"),
                "give a readable PEM CA bundle, or leave it empty to use the cluster's \
                 kube-system/extension-apiserver-authentication client CA",
            );
        }

        // Token: read once, trimmed; an empty file means no token.
        let token_file = non_empty_path(&args.sandboxd.sandboxd_token_file);
        let token = match &token_file {
            None => None,
            Some(path) => match crate::sandboxd::read_token_file(path) {
                Ok(token) => token.map(Secret::new),
                Err(e) => {
                    p.push(
                        "sandboxd-token-file",
                        Some("SANDBOXD_TOKEN_FILE"),
                        &args.sandboxd.sandboxd_token_file,
                        &e.to_string(),
                        "make the file readable by this process, or unset the flag to send \
                         no token",
                    );
                    None
                }
            },
        };

        // State path last: only touch the disk when it can matter.
        let state_path = if args.state.state_path.is_empty() {
            p.push(
                "state-path",
                Some("VK_STATE_PATH"),
                "",
                "--state-path is required (it holds the claims' release credentials)",
                "give a file path such as /var/lib/vk-sandbox/claims.json",
            );
            None
        } else if !check_state {
            Some(PathBuf::from(&args.state.state_path))
        } else if p.0.is_empty() {
            let path = PathBuf::from(&args.state.state_path);
            match crate::claims::dir::ensure_state_writable(&path) {
                Ok(()) => Some(path),
                Err(why) => {
                    p.push(
                        "state-path",
                        Some("VK_STATE_PATH"),
                        &args.state.state_path,
                        &format!("claims state is not writable: {why}"),
                        "make the directory writable by this process's user (chown, fsGroup, \
                         or a writable volume), or point the flag elsewhere",
                    );
                    None
                }
            }
        } else {
            None
        };

        let webhook = webhook(args, &mut p);
        if !p.0.is_empty() {
            return Err(Error::Config(if p.0.len() == 1 {
                p.0.remove(0)
            } else {
                format!("{} problems:\n  {}", p.0.len(), p.0.join("\n  "))
            }));
        }
        // Every Option below is Some when no problem was recorded.
        let missing = || Error::Config("internal: a validated value is missing".into());
        Ok(Config {
            node_name: args.node.node_name.clone(),
            node_ip: (!args.node.node_ip.is_empty()).then(|| args.node.node_ip.clone()),
            listen_addr: listen_addr.ok_or_else(missing)?,
            admin_addr: admin_addr.ok_or_else(missing)?,
            tls: TlsFiles {
                cert: non_empty_path(&args.kubelet.tls_cert),
                key: non_empty_path(&args.kubelet.tls_key),
            },
            capacity: Capacity {
                cpu: cpu.ok_or_else(missing)?,
                memory: memory.ok_or_else(missing)?,
                pods: pods.ok_or_else(missing)?,
                cpu_fixed: !args.node.node_cpu.is_empty(),
                memory_fixed: !args.node.node_memory.is_empty(),
                pods_fixed: !args.node.node_pods.is_empty(),
            },
            kube: KubeClientConfig {
                kubeconfig: args.kube.kubeconfig.clone(),
                qps: args.kube.kube_api_qps,
                burst: args.kube.kube_api_burst,
                event_qps: args.kube.event_qps,
                event_burst: args.kube.event_burst,
            },
            sandboxd: SandboxdConfig {
                url: url.ok_or_else(missing)?,
                advertise_addr,
                token,
                token_file,
            },
            state_path: state_path.ok_or_else(missing)?,
            lifecycle: LifecycleConfig {
                hibernate_on_suspend: args.lifecycle.hibernate_on_suspend,
                renew_margin,
            },
            pod_network: PodNetworkConfig {
                range: pod_range,
                netns: pod_netns,
            },
            orphan_scan_interval,
            inventory: InventoryConfig {
                publish: args.inventory.publish_inventory,
                interval: publish_interval,
                group: inventory_group.map(str::to_string),
            },
            node_labels,
            kubelet_auth: KubeletAuthConfig {
                enabled: args.kubelet.kubelet_auth,
                anonymous: args.kubelet.anonymous_auth,
                client_ca_file,
            },
            streaming,
            node_status_interval,
            fleet: FleetConfig {
                capacity: args.fleet.node_capacity_from_sandboxd,
                conditions: args.fleet.node_conditions_from_sandboxd,
                taints: args.fleet.node_taints_from_sandboxd,
                drain_on_cordon: args.fleet.drain_sandboxd_on_cordon,
                max_claims: (args.fleet.sandboxd_max_claims > 0)
                    .then_some(args.fleet.sandboxd_max_claims),
                info_interval,
                hand_back_after,
                vm_holder_gone_after,
            },
            webhook,
        })
    }
}
