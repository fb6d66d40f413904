//! vk-sandbox's NetworkPolicy verdicts (`netpol::verdict`) against an
//! independent oracle: Cyclonus (github.com/mattfenwick/cyclonus, built by
//! `e2e/cyclonus.sh`), which answers "is this traffic allowed" for policy
//! files and traffic tuples with no cluster. A few hundred seeded cases:
//! policy sets with every `policyTypes` variant, empty and absent
//! selectors, matchExpressions, ipBlock with except (IPv4 and IPv6), named
//! and ranged ports, other protocols, several policies selecting one Pod;
//! sources in and out of the target's namespace, address-only sources and
//! addresses shared by several Pods. Any disagreement fails with the case.
//!
//! Shapes left out, and why (docs/networkpolicy.md#the-cyclonus-check):
//! - `NotIn` on a key the object lacks: Kubernetes' selectors match it,
//!   Cyclonus' do not; so `NotIn` is generated only on keys every object
//!   carries (the verdict's own table tests cover the absent key).
//! - `matchLabels` with an empty value: Cyclonus reads an absent key as
//!   the empty value; no empty value is generated.
//! - Absent `policyTypes`: Cyclonus refuses such a file, while the
//!   apiserver defaults the field (Ingress, plus Egress with egress
//!   rules). Cyclonus gets the defaulted policy, vk-sandbox the original.
//! - What the apiserver refuses (invalid selectors, CIDRs, port ranges):
//!   Cyclonus panics on it; it never reaches vk-sandbox from a cluster.
//! - Egress: Cyclonus' answer is ingress and egress together, so every
//!   namespace gets an allow-all egress policy (given to both sides).
//!
//! `VK_NETPOL_SEED` picks another seed, `VK_NETPOL_CASES` another count.
//! Without Cyclonus the test skips, unless `VK_REQUIRE_CLUSTER=1` (set by
//! `make test`), when it fails.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use vk_sandbox::netpol::selector::Labels;
use vk_sandbox::netpol::verdict::{
    DeclaredPort, NAMESPACE_NAME_LABEL, Source, SourcePod, Target, evaluate,
};

const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const TARGET_NS: &str = "x";
const TARGET_IP: &str = "10.0.9.9";

fn cyclonus() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("e2e/cyclonus.sh"))
        .arg("which")
        .output()
        .expect("run e2e/cyclonus.sh which");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        return Some(PathBuf::from(text));
    }
    let why = format!("{text} (e2e/cyclonus.sh build, or make deps, builds it)");
    if std::env::var("VK_REQUIRE_CLUSTER").is_ok_and(|v| v == "1") {
        panic!("Cyclonus is required (VK_REQUIRE_CLUSTER=1) but {why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

fn pick<T: Clone>(rng: &mut StdRng, from: &[T]) -> T {
    from[rng.random_range(0..from.len())].clone()
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Pod labels: `app` always (so `NotIn app` is comparable), `role` and
/// `tier` sometimes.
fn pod_labels(rng: &mut StdRng) -> Labels {
    let app = pick(rng, &["web", "api", "db"]);
    let mut l = labels(&[("app", app)]);
    if rng.random_bool(0.5) {
        l.insert("role".into(), pick(rng, &["client", "admin"]).into());
    }
    if rng.random_bool(0.4) {
        l.insert("tier".into(), pick(rng, &["front", "back"]).into());
    }
    l
}

/// Namespace labels: the name label and `team` always, `env` sometimes.
fn namespace_labels(rng: &mut StdRng, name: &str) -> Labels {
    let team = pick(rng, &["a", "b"]);
    let mut l = labels(&[(NAMESPACE_NAME_LABEL, name), ("team", team)]);
    if rng.random_bool(0.5) {
        l.insert("env".into(), pick(rng, &["prod", "dev"]).into());
    }
    l
}

/// A selector over `keys` (each: the key, its values, whether every
/// object has it).
fn selector(rng: &mut StdRng, keys: &[(&str, &[&str], bool)]) -> Value {
    let mut s = json!({});
    if rng.random_bool(0.25) {
        return s;
    }
    if rng.random_bool(0.6) {
        let (k, vs, _) = pick(rng, keys);
        s["matchLabels"] = json!({k: pick(rng, vs)});
    }
    if rng.random_bool(0.5) {
        let mut exprs = vec![];
        for _ in 0..rng.random_range(1..=2) {
            let (k, vs, always) = pick(rng, keys);
            let mut ops = vec!["In", "Exists", "DoesNotExist"];
            if always {
                ops.push("NotIn");
            }
            let op = pick(rng, &ops);
            let mut e = json!({"key": k, "operator": op});
            if op == "In" || op == "NotIn" {
                let n = rng.random_range(1..=vs.len());
                e["values"] = json!(vs[..n].to_vec());
            }
            exprs.push(e);
        }
        s["matchExpressions"] = json!(exprs);
    }
    s
}

const POD_KEYS: &[(&str, &[&str], bool)] = &[
    ("app", &["web", "api", "db"], true),
    ("role", &["client", "admin"], false),
    ("tier", &["front", "back"], false),
];
const NS_KEYS: &[(&str, &[&str], bool)] = &[
    (NAMESPACE_NAME_LABEL, &["x", "y", "z"], true),
    ("team", &["a", "b"], true),
    ("env", &["prod", "dev"], false),
];

/// Address blocks near the generated source addresses, each with the
/// excepts that may go with it (inside it, as the apiserver requires).
const BLOCKS: &[(&str, &[&str])] = &[
    ("10.0.0.0/16", &["10.0.1.0/24", "10.0.0.5/32"]),
    ("10.0.1.0/24", &["10.0.1.0/28"]),
    ("0.0.0.0/0", &["10.0.0.0/8", "192.168.0.0/16"]),
    ("192.168.0.0/16", &["192.168.1.0/24"]),
    ("10.0.0.5/32", &[]),
    ("2001:db8::/32", &["2001:db8:1::/48"]),
    ("::/0", &["2001:db8::/32"]),
];

fn peer(rng: &mut StdRng) -> Value {
    match rng.random_range(0..4) {
        0 => json!({"podSelector": selector(rng, POD_KEYS)}),
        1 => json!({"namespaceSelector": selector(rng, NS_KEYS)}),
        2 => json!({"namespaceSelector": selector(rng, NS_KEYS),
                    "podSelector": selector(rng, POD_KEYS)}),
        _ => {
            let (cidr, excepts) = pick(rng, BLOCKS);
            let mut b = json!({"cidr": cidr});
            if !excepts.is_empty() && rng.random_bool(0.6) {
                let n = rng.random_range(1..=excepts.len());
                b["except"] = json!(excepts[..n].to_vec());
            }
            json!({"ipBlock": b})
        }
    }
}

fn port(rng: &mut StdRng) -> Value {
    let mut p = match rng.random_range(0..5) {
        0 => json!({"port": pick(rng, &[80, 443, 8080, 9090, 53])}),
        1 => {
            let start = pick(rng, &[80, 8000, 8080, 9000]);
            json!({"port": start, "endPort": start + pick(rng, &[0, 5, 100, 1000])})
        }
        2 => json!({"port": pick(rng, &["http", "metrics", "admin", "dns", "grpc"])}),
        3 => json!({}),
        _ => json!({"port": pick(rng, &[80, 8080])}),
    };
    if rng.random_bool(0.3) {
        p["protocol"] = json!(pick(rng, &["TCP", "UDP", "SCTP"]));
    }
    if p.as_object().is_some_and(|o| o.is_empty()) {
        // A port entry needs a port or a protocol to mean anything here.
        p["protocol"] = json!(pick(rng, &["TCP", "UDP"]));
    }
    p
}

fn list(rng: &mut StdRng, max: usize, item: fn(&mut StdRng) -> Value) -> Option<Value> {
    match rng.random_range(0..6) {
        0 => None,
        1 => Some(json!([])),
        _ => Some(json!(
            (0..rng.random_range(1..=max))
                .map(|_| item(rng))
                .collect::<Vec<_>>()
        )),
    }
}

fn rule(rng: &mut StdRng) -> Value {
    let mut r = json!({});
    if let Some(from) = list(rng, 3, peer) {
        r["from"] = from;
    }
    if let Some(ports) = list(rng, 3, port) {
        r["ports"] = ports;
    }
    r
}

fn policy(rng: &mut StdRng, name: &str) -> Value {
    // Mostly in the target's namespace, so most policies take part.
    let ns = if rng.random_bool(0.8) { TARGET_NS } else { "y" };
    let mut spec = json!({});
    if rng.random_bool(0.85) {
        spec["podSelector"] = selector(rng, POD_KEYS);
    }
    match rng.random_range(0..5) {
        0 => {}
        1 => spec["policyTypes"] = json!(["Ingress"]),
        2 => spec["policyTypes"] = json!(["Egress"]),
        3 => spec["policyTypes"] = json!(["Ingress", "Egress"]),
        _ => spec["policyTypes"] = json!(["Egress", "Ingress"]),
    }
    if let Some(rules) = list(rng, 3, rule) {
        spec["ingress"] = rules;
    }
    if rng.random_bool(0.3) {
        spec["egress"] = json!([{}]);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": name}, "spec": spec,
    })
}

/// The policy as the apiserver stores it: `policyTypes` defaulted.
fn defaulted(p: &Value) -> Value {
    let mut p = p.clone();
    let spec = &mut p["spec"];
    let empty = spec["policyTypes"].as_array().is_none_or(|t| t.is_empty());
    if empty {
        let mut types = vec!["Ingress"];
        if spec["egress"].as_array().is_some_and(|e| !e.is_empty()) {
            types.push("Egress");
        }
        spec["policyTypes"] = json!(types);
    }
    p
}

fn allow_all_egress(ns: &str) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"namespace": ns, "name": "oracle-allow-all-egress"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]},
    })
}

#[derive(Debug, Clone)]
struct Pod {
    namespace: &'static str,
    labels: Labels,
}

#[derive(Debug, Clone)]
struct Query {
    ip: IpAddr,
    pods: Vec<Pod>,
    port: u16,
}

struct Case {
    policies: Vec<Value>,
    ns_labels: BTreeMap<&'static str, Labels>,
    target_labels: Labels,
    ports: Vec<DeclaredPort>,
    queries: Vec<Query>,
}

fn case(rng: &mut StdRng) -> Case {
    let ns_labels: BTreeMap<_, _> = NAMESPACES
        .iter()
        .map(|n| (*n, namespace_labels(rng, n)))
        .collect();
    let mut policies: Vec<Value> = (0..rng.random_range(1..=4))
        .map(|i| policy(rng, &format!("p{i}")))
        .collect();
    policies.extend(NAMESPACES.iter().map(|n| allow_all_egress(n)));
    let declared = [
        ("http", 8080, "TCP"),
        ("metrics", 9090, "TCP"),
        ("admin", 8443, "TCP"),
        ("dns", 53, "UDP"),
    ];
    let ports = declared
        .iter()
        .filter(|_| rng.random_bool(0.6))
        .map(|(name, number, protocol)| DeclaredPort {
            name: name.to_string(),
            number: *number,
            protocol: protocol.to_string(),
        })
        .collect();
    let addresses = [
        "10.0.0.1",
        "10.0.0.5",
        "10.0.1.3",
        "10.0.1.200",
        "10.0.2.7",
        "192.168.1.9",
        "192.168.7.1",
        "172.16.0.1",
        "2001:db8::5",
        "2001:db8:1::5",
        "fd00::1",
    ];
    let query_ports = [53, 80, 81, 443, 8000, 8005, 8080, 8443, 9090, 9500, 65535];
    let queries = (0..rng.random_range(8..=14))
        .map(|_| {
            let pods = match rng.random_range(0..6) {
                0 => vec![],
                // Pods sharing a node's address (hostNetwork).
                1 => (0..rng.random_range(2..=3))
                    .map(|_| Pod {
                        namespace: pick(rng, &NAMESPACES),
                        labels: pod_labels(rng),
                    })
                    .collect(),
                _ => vec![Pod {
                    namespace: pick(rng, &NAMESPACES),
                    labels: pod_labels(rng),
                }],
            };
            Query {
                ip: pick(rng, &addresses).parse().unwrap(),
                pods,
                port: pick(rng, &query_ports),
            }
        })
        .collect();
    Case {
        policies,
        ns_labels,
        target_labels: pod_labels(rng),
        ports,
        queries,
    }
}

impl Case {
    fn ours(&self, q: &Query) -> vk_sandbox::netpol::verdict::Verdict {
        let policies: Vec<NetworkPolicy> = self
            .policies
            .iter()
            .map(|p| serde_json::from_value(p.clone()).expect("generated policy"))
            .collect();
        let pods: Vec<SourcePod> = q
            .pods
            .iter()
            .map(|p| SourcePod {
                namespace: p.namespace,
                labels: &p.labels,
                namespace_labels: &self.ns_labels[p.namespace],
            })
            .collect();
        let target = Target {
            namespace: TARGET_NS,
            labels: &self.target_labels,
            ports: &self.ports,
        };
        let source = Source {
            ip: q.ip,
            pods: &pods,
        };
        evaluate(&policies, &target, &source, q.port)
    }

    /// The traffic tuples of one query: one per Pod at the address (the
    /// address is allowed if any is), or the bare address.
    fn traffic(&self, q: &Query) -> Vec<Value> {
        let name = self
            .ports
            .iter()
            .find(|d| d.number == i32::from(q.port) && d.protocol == "TCP")
            .map(|d| d.name.clone())
            .unwrap_or_default();
        let destination = json!({
            "Internal": {"PodLabels": self.target_labels, "Namespace": TARGET_NS,
                         "NamespaceLabels": self.ns_labels[TARGET_NS]},
            "IP": TARGET_IP,
        });
        let tuple = |source: Value| {
            json!({"Source": source, "Destination": destination,
                   "ResolvedPort": q.port, "ResolvedPortName": name, "Protocol": "TCP"})
        };
        if q.pods.is_empty() {
            return vec![tuple(json!({"IP": q.ip.to_string()}))];
        }
        q.pods
            .iter()
            .map(|p| {
                tuple(json!({
                    "Internal": {"PodLabels": p.labels, "Namespace": p.namespace,
                                 "NamespaceLabels": self.ns_labels[p.namespace]},
                    "IP": q.ip.to_string(),
                }))
            })
            .collect()
    }

    /// Cyclonus' verdict on each query.
    fn oracle(&self, cyclonus: &Path, dir: &Path) -> Vec<bool> {
        let policies = dir.join("policies");
        let _ = std::fs::remove_dir_all(&policies);
        std::fs::create_dir_all(&policies).unwrap();
        for (i, p) in self.policies.iter().enumerate() {
            let text = serde_json::to_string_pretty(&defaulted(p)).unwrap();
            std::fs::write(policies.join(format!("{i}.yaml")), text).unwrap();
        }
        let tuples: Vec<Vec<Value>> = self.queries.iter().map(|q| self.traffic(q)).collect();
        let flat: Vec<&Value> = tuples.iter().flatten().collect();
        let traffic = dir.join("traffic.json");
        std::fs::write(&traffic, serde_json::to_string(&flat).unwrap()).unwrap();
        let out = Command::new(cyclonus)
            .args([
                "analyze",
                "--mode",
                "query-traffic",
                "--simplify-policies=false",
            ])
            .arg("--policy-path")
            .arg(&policies)
            .arg("--traffic-path")
            .arg(&traffic)
            .output()
            .expect("run cyclonus");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cyclonus failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let answers: Vec<bool> = stdout
            .lines()
            .filter(|l| l.contains("| IS ALLOWED? |"))
            .map(|l| {
                let cell = l.split('|').nth(2).unwrap_or_default().trim();
                match cell {
                    "TRUE" => true,
                    "FALSE" => false,
                    other => panic!("unexpected Cyclonus answer {other:?} in {l:?}"),
                }
            })
            .collect();
        assert_eq!(answers.len(), flat.len(), "one answer per tuple:\n{stdout}");
        let mut at = 0;
        tuples
            .iter()
            .map(|t| {
                let one_query = &answers[at..at + t.len()];
                at += t.len();
                one_query.contains(&true)
            })
            .collect()
    }

    fn describe(&self, q: &Query) -> String {
        let pods: Vec<String> = q
            .pods
            .iter()
            .map(|p| {
                format!(
                    "{}/{:?} (ns labels {:?})",
                    p.namespace, p.labels, self.ns_labels[p.namespace]
                )
            })
            .collect();
        format!(
            "source {} with Pods [{}] to TCP port {}\ntarget x/{:?} declaring {:?}\npolicies:\n{}",
            q.ip,
            pods.join(", "),
            q.port,
            self.target_labels,
            self.ports,
            serde_json::to_string_pretty(&self.policies).unwrap()
        )
    }
}

#[test]
fn verdicts_agree_with_cyclonus() {
    let Some(cyclonus) = cyclonus() else {
        return;
    };
    let seed: u64 = std::env::var("VK_NETPOL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261206);
    let count: usize = std::env::var("VK_NETPOL_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    eprintln!(
        "netpol oracle: {count} cases, seed {seed} (VK_NETPOL_SEED), {}",
        cyclonus.display()
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (mut queries, mut allowed, mut by_rule, mut unselected) = (0, 0, 0, 0);
    let mut disagreements = vec![];
    for n in 0..count {
        let c = case(&mut rng);
        let oracle = c.oracle(&cyclonus, dir.path());
        for (q, theirs) in c.queries.iter().zip(oracle) {
            let ours = c.ours(q);
            queries += 1;
            allowed += usize::from(ours.allowed);
            by_rule += usize::from(ours.why.starts_with("allowed by"));
            unselected += usize::from(ours.why.starts_with("no NetworkPolicy"));
            if ours.allowed != theirs {
                disagreements.push(format!(
                    "case {n}: vk-sandbox says {} ({}), Cyclonus says {theirs}\n{}",
                    ours.allowed,
                    ours.why,
                    c.describe(q)
                ));
            }
        }
    }
    eprintln!(
        "netpol oracle: {queries} connections: {allowed} allowed ({by_rule} by a rule, \
         {unselected} with no policy selecting the Pod), {} denied; {} disagreements",
        queries - allowed,
        disagreements.len()
    );
    assert!(
        disagreements.is_empty(),
        "{} of {queries} verdicts differ from Cyclonus (seed {seed}); the first:\n\n{}",
        disagreements.len(),
        disagreements
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    // The cases must exercise all three outcomes, or agreement means little.
    for (what, n) in [
        ("allowed by a rule", by_rule),
        ("allowed with no policy selecting", unselected),
        ("denied", queries - allowed),
    ] {
        assert!(
            n * 10 >= queries,
            "only {n} of {queries} connections {what}"
        );
    }
}
