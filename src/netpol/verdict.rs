//! Whether an ingress connection to a sandbox Pod is allowed, with
//! Kubernetes' NetworkPolicy semantics (networking.k8s.io/v1; pure, no
//! I/O). Policies are compiled once per version ([`Policy::compile`]) and
//! [`decide`] runs on every connection the Pod-IP relay accepts
//! (docs/networkpolicy.md).
//!
//! - A policy selects the Pod when it is in the Pod's namespace, its
//!   `podSelector` matches the Pod's labels (absent or empty: every Pod)
//!   and its effective `policyTypes` include Ingress (absent or empty:
//!   Ingress, as the apiserver defaults it).
//! - No policy selects the Pod: allowed. Otherwise allowed iff some ingress
//!   rule of some selecting policy allows the source and the port.
//! - A rule allows a source when its `from` is empty or absent, or one of
//!   its peers matches: `ipBlock` on the address, selectors on the Pods
//!   known to have that address; and a port when its `ports` is empty or
//!   absent, or one of them matches the TCP port (the relay carries TCP
//!   only).
//!
//! What the apiserver would refuse (an invalid selector, CIDR or port)
//! matches nothing and is reported by `compile`; nothing here panics.

use std::fmt::Write as _;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::cidr::Cidr;
use super::selector::{Labels, Selector};

/// The label every namespace carries with its own name (set by the
/// apiserver), which a namespace known only by name is given.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A port a container of the target Pod declares (`containerPorts`), for
/// named ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredPort {
    pub name: String,
    pub number: i32,
    /// `TCP`, `UDP` or `SCTP` (the API's default is `TCP`).
    pub protocol: String,
}

/// The Pod a connection is for.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub namespace: &'a str,
    pub labels: &'a Labels,
    pub ports: &'a [DeclaredPort],
}

/// A Pod known to have the source address.
#[derive(Debug, Clone, Copy)]
pub struct SourcePod<'a> {
    pub namespace: &'a str,
    pub labels: &'a Labels,
    pub namespace_labels: &'a Labels,
}

/// Where a connection comes from: its address and every Pod known to have
/// it (none for a node or an outside address, several for hostNetwork
/// Pods sharing a node's). It is allowed if the bare address or any of the
/// Pods is.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub ip: IpAddr,
    pub pods: &'a [SourcePod<'a>],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// One short line: the policy and rule that allowed, or how many
    /// policies select the Pod and that none allows this source and port.
    pub why: String,
}

/// A NetworkPolicy as the verdict reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub namespace: String,
    pub name: String,
    /// `None`: the selector is invalid and selects no Pod.
    selector: Option<Selector>,
    /// `None`: not an ingress policy.
    ingress: Option<Vec<Rule>>,
    /// What it says about the selected Pods' egress (enforced by no one
    /// here: sandboxd's lane decides, [`super::egress`] reports the gap).
    pub egress: EgressRules,
}

/// A policy's egress part, as far as sandboxd's lane can be compared
/// with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressRules {
    /// `Egress` is not among its effective `policyTypes`.
    None,
    /// A rule with no `to` and no `ports`: every destination, every port.
    AllowsAll,
    /// It limits where the Pods may connect (no rules at all: nowhere).
    Restricts,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    /// `None`: every source.
    from: Option<Vec<Peer>>,
    /// `None`: every port.
    ports: Option<Vec<PortMatch>>,
}

/// One `from` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// Pods matching `pods` in the namespaces `namespaces` names.
    Pods {
        namespaces: Namespaces,
        pods: Selector,
    },
    Block {
        cidr: Cidr,
        except: Vec<Cidr>,
    },
    /// Refused by `compile` (reported there): matches nothing.
    Invalid,
}

/// The namespaces a Pod peer looks in.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Namespaces {
    /// No `namespaceSelector`: the policy's own.
    Own(String),
    /// A `namespaceSelector` (empty: every namespace).
    Selected(Selector),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum PortMatch {
    /// Every TCP port.
    AnyTcp,
    /// TCP ports `first..=last`.
    Range { first: i32, last: i32 },
    /// A TCP port the target declares under this name.
    Named(String),
    /// Another protocol, or refused by `compile`: matches no TCP port.
    Never,
}

impl Policy {
    /// The policy as the verdict reads it, and what the apiserver would
    /// have refused in it (each such part matches nothing).
    pub fn compile(np: &NetworkPolicy) -> (Policy, Vec<String>) {
        let mut problems = Vec::new();
        let namespace = np.metadata.namespace.clone().unwrap_or_default();
        let name = np.metadata.name.clone().unwrap_or_default();
        let spec = np.spec.clone().unwrap_or_default();
        let selector = match spec.pod_selector.as_ref().map(Selector::compile) {
            None => Some(Selector::default()),
            Some(Ok(s)) => Some(s),
            Some(Err(why)) => {
                problems.push(format!("podSelector: {why}"));
                None
            }
        };
        let types = spec.policy_types.unwrap_or_default();
        let ingress = (types.is_empty() || types.iter().any(|t| t == "Ingress")).then(|| {
            let rules = spec.ingress.unwrap_or_default();
            rules
                .iter()
                .enumerate()
                .map(|(i, r)| compile_rule(&namespace, r, i, &mut problems))
                .collect()
        });
        let egress = egress_rules(&types, spec.egress.as_deref());
        let policy = Policy {
            namespace,
            name,
            selector,
            ingress,
            egress,
        };
        (policy, problems)
    }

    /// Whether the policy decides on ingress to `target`.
    pub fn selects(&self, target: &Target) -> bool {
        self.ingress.is_some()
            && self.namespace == target.namespace
            && self
                .selector
                .as_ref()
                .is_some_and(|s| s.matches(target.labels))
    }

    /// Whether the policy limits the egress of Pods of `namespace` with
    /// `labels`.
    pub fn restricts_egress_of(&self, namespace: &str, labels: &Labels) -> bool {
        self.egress == EgressRules::Restricts
            && self.namespace == namespace
            && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }

    /// Whether the policy decides on ingress to Pods of `namespace` with
    /// `labels` (as [`selects`](Self::selects), without ports).
    pub fn selects_pod(&self, namespace: &str, labels: &Labels) -> bool {
        self.selects(&Target {
            namespace,
            labels,
            ports: &[],
        })
    }

    /// The Pod peers of its ingress rules: what must be watched to know
    /// the Pods behind a source address.
    pub fn pod_peers(&self) -> impl Iterator<Item = (&Namespaces, &Selector)> {
        self.ingress
            .iter()
            .flatten()
            .flat_map(|r| r.from.iter().flatten())
            .filter_map(|p| match p {
                Peer::Pods { namespaces, pods } => Some((namespaces, pods)),
                _ => None,
            })
    }

    /// The index of the first rule allowing `source` to `port`.
    fn allowing_rule(&self, target: &Target, source: &Source, port: u16) -> Option<usize> {
        self.ingress
            .iter()
            .flatten()
            .position(|r| r.allows_port(target, port) && r.allows_source(source))
    }
}

/// Effective `policyTypes` as the apiserver defaults them: absent or empty
/// means Ingress, plus Egress when the policy has egress rules.
fn egress_rules(types: &[String], rules: Option<&[NetworkPolicyEgressRule]>) -> EgressRules {
    let rules = rules.unwrap_or_default();
    let egress = if types.is_empty() {
        !rules.is_empty()
    } else {
        types.iter().any(|t| t == "Egress")
    };
    let open = |r: &NetworkPolicyEgressRule| {
        r.to.as_ref().is_none_or(Vec::is_empty) && r.ports.as_ref().is_none_or(Vec::is_empty)
    };
    if !egress {
        EgressRules::None
    } else if rules.iter().any(open) {
        EgressRules::AllowsAll
    } else {
        EgressRules::Restricts
    }
}

fn compile_rule(
    namespace: &str,
    r: &NetworkPolicyIngressRule,
    index: usize,
    problems: &mut Vec<String>,
) -> Rule {
    let from = r.from.as_ref().filter(|f| !f.is_empty()).map(|peers| {
        peers
            .iter()
            .enumerate()
            .map(|(j, p)| {
                compile_peer(namespace, p).unwrap_or_else(|why| {
                    problems.push(format!("ingress[{index}].from[{j}]: {why}"));
                    Peer::Invalid
                })
            })
            .collect()
    });
    let ports = r.ports.as_ref().filter(|p| !p.is_empty()).map(|ports| {
        ports
            .iter()
            .enumerate()
            .map(|(j, p)| {
                compile_port(p).unwrap_or_else(|why| {
                    problems.push(format!("ingress[{index}].ports[{j}]: {why}"));
                    PortMatch::Never
                })
            })
            .collect()
    });
    Rule { from, ports }
}

fn compile_peer(namespace: &str, p: &NetworkPolicyPeer) -> Result<Peer, String> {
    match (&p.ip_block, &p.namespace_selector, &p.pod_selector) {
        (Some(block), None, None) => {
            let cidr = Cidr::parse(&block.cidr)?;
            let except = block.except.iter().flatten();
            let except = except.map(|e| Cidr::parse(e)).collect::<Result<_, _>>()?;
            Ok(Peer::Block { cidr, except })
        }
        (Some(_), _, _) => Err("ipBlock with a selector".into()),
        (None, None, None) => Err("no ipBlock, namespaceSelector or podSelector".into()),
        (None, ns, pods) => {
            let namespaces = match ns {
                None => Namespaces::Own(namespace.to_string()),
                Some(s) => Namespaces::Selected(
                    Selector::compile(s).map_err(|why| format!("namespaceSelector: {why}"))?,
                ),
            };
            let pods = match pods {
                None => Selector::default(),
                Some(s) => Selector::compile(s).map_err(|why| format!("podSelector: {why}"))?,
            };
            Ok(Peer::Pods { namespaces, pods })
        }
    }
}

fn compile_port(p: &NetworkPolicyPort) -> Result<PortMatch, String> {
    let tcp = p.protocol.as_deref().is_none_or(|proto| proto == "TCP");
    let m = match (&p.port, p.end_port) {
        (None, None) => PortMatch::AnyTcp,
        (None, Some(_)) => return Err("endPort without port".into()),
        (Some(IntOrString::Int(n)), end) => {
            let last = end.unwrap_or(*n);
            if !(1..=65535).contains(n) || last < *n || last > 65535 {
                return Err(format!("port range {n}-{last}"));
            }
            PortMatch::Range { first: *n, last }
        }
        (Some(IntOrString::String(_)), Some(_)) => {
            return Err("endPort with a named port".into());
        }
        (Some(IntOrString::String(name)), None) => PortMatch::Named(name.clone()),
    };
    Ok(if tcp { m } else { PortMatch::Never })
}

impl Rule {
    fn allows_port(&self, target: &Target, port: u16) -> bool {
        let Some(ports) = &self.ports else {
            return true;
        };
        let port = i32::from(port);
        ports.iter().any(|m| match m {
            PortMatch::AnyTcp => true,
            PortMatch::Range { first, last } => (*first..=*last).contains(&port),
            PortMatch::Named(name) => target
                .ports
                .iter()
                .any(|d| d.name == *name && d.number == port && d.protocol == "TCP"),
            PortMatch::Never => false,
        })
    }

    fn allows_source(&self, source: &Source) -> bool {
        let Some(peers) = &self.from else {
            return true;
        };
        peers.iter().any(|p| p.matches(source))
    }
}

impl Peer {
    fn matches(&self, source: &Source) -> bool {
        match self {
            Peer::Block { cidr, except } => {
                cidr.contains(source.ip) && !except.iter().any(|e| e.contains(source.ip))
            }
            Peer::Pods { namespaces, pods } => source.pods.iter().any(|s| {
                pods.matches(s.labels)
                    && match namespaces {
                        Namespaces::Own(ns) => s.namespace == ns,
                        Namespaces::Selected(sel) => sel.matches(s.namespace_labels),
                    }
            }),
            Peer::Invalid => false,
        }
    }
}

/// The verdict on a TCP connection from `source` to `target`'s `port`,
/// under `policies` (any namespace's; those of others select nothing).
pub fn decide<'p>(
    policies: impl IntoIterator<Item = &'p Policy>,
    target: &Target,
    source: &Source,
    port: u16,
) -> Verdict {
    let source = Source {
        ip: source.ip.to_canonical(),
        pods: source.pods,
    };
    let mut selecting = 0usize;
    let mut names = String::new();
    for p in policies.into_iter().filter(|p| p.selects(target)) {
        if let Some(rule) = p.allowing_rule(target, &source, port) {
            return Verdict {
                allowed: true,
                why: format!(
                    "allowed by NetworkPolicy {}/{} ingress[{rule}]",
                    p.namespace, p.name
                ),
            };
        }
        selecting += 1;
        // The first few names: enough to find them, short enough to log.
        if selecting <= 3 {
            let sep = if selecting > 1 { ", " } else { "" };
            let _ = write!(names, "{sep}{}", p.name);
        }
    }
    if selecting == 0 {
        return Verdict {
            allowed: true,
            why: "no NetworkPolicy selects the Pod".into(),
        };
    }
    let more = if selecting > 3 { ", ..." } else { "" };
    let (noun, verb) = if selecting == 1 {
        ("NetworkPolicy", "selects")
    } else {
        ("NetworkPolicies", "select")
    };
    Verdict {
        allowed: false,
        why: format!(
            "{selecting} {noun} {verb} the Pod ({names}{more}); none allows {} to TCP port {port}",
            source.ip
        ),
    }
}

/// [`decide`] on policies as the API serves them (compiled here; what
/// `compile` reports is dropped): for tests and one-off checks.
pub fn evaluate(
    policies: &[NetworkPolicy],
    target: &Target,
    source: &Source,
    port: u16,
) -> Verdict {
    let compiled: Vec<Policy> = policies.iter().map(|p| Policy::compile(p).0).collect();
    decide(&compiled, target, source, port)
}

#[cfg(test)]
mod tests;
