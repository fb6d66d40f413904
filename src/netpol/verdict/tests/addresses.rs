//! Addresses and ports: pods at an address, ipBlocks, port numbers, ranges, protocols and named ports.

use super::*;

#[test]
fn one_allowed_pod_at_an_address_is_enough() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"podSelector": {"matchLabels": {"role": "client"}}}]),
    );
    let client = labels(&[("role", "client")]);
    let host = labels(&[("role", "node-agent")]);
    let pods = [
        w.pod("other", &client),
        w.pod("shop", &host),
        w.pod("shop", &client),
    ];
    assert!(w.allows(one(&p), "10.0.0.1", &pods, 80));
    assert!(!w.allows(&[p], "10.0.0.1", &pods[..2], 80));
}

#[test]
fn an_ip_block_matches_the_address_whatever_the_pods() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24", "10.0.2.7/32"]}}]),
    );
    let any = labels(&[]);
    assert!(w.allows(one(&p), "10.0.0.1", &[], 80));
    assert!(w.allows(one(&p), "10.0.0.1", &[w.pod("other", &any)], 80));
    assert!(w.allows(one(&p), "10.0.255.255", &[], 80));
    assert!(w.allows(one(&p), "10.0.2.6", &[], 80));
    assert!(!w.allows(one(&p), "10.0.1.9", &[], 80));
    assert!(!w.allows(one(&p), "10.0.2.7", &[], 80));
    assert!(!w.allows(one(&p), "10.1.0.1", &[w.pod("shop", &any)], 80));
    assert!(
        w.allows(one(&p), "::ffff:10.0.0.1", &[], 80),
        "a mapped address is IPv4"
    );
    assert!(!w.allows(&[p], "::ffff:10.0.1.1", &[], 80));
}

#[test]
fn an_ipv6_block_matches_ipv6_addresses() {
    let w = world();
    let p = ingress_from(
        "shop",
        json!([{"ipBlock": {"cidr": "2001:db8::/32", "except": ["2001:db8:1::/48"]}}]),
    );
    assert!(w.allows(one(&p), "2001:db8::5", &[], 80));
    assert!(!w.allows(one(&p), "2001:db8:1::5", &[], 80));
    assert!(!w.allows(one(&p), "2001:db9::5", &[], 80));
    assert!(!w.allows(&[p], "10.0.0.1", &[], 80));
}

#[test]
fn ports_match_by_number_and_range() {
    let w = world();
    let p = ingress_ports(json!([{"port": 80}, {"port": 8000, "endPort": 8010}]));
    for (port, allowed) in [
        (80, true),
        (79, false),
        (81, false),
        (8000, true),
        (8005, true),
        (8010, true),
        (7999, false),
        (8011, false),
    ] {
        assert_eq!(
            w.allows(one(&p), "192.0.2.1", &[], port),
            allowed,
            "port {port}"
        );
    }
    let top = ingress_ports(json!([{"port": 65535}, {"port": 1, "endPort": 1}]));
    assert!(w.allows(one(&top), "192.0.2.1", &[], 65535));
    assert!(w.allows(one(&top), "192.0.2.1", &[], 1));
    assert!(!w.allows(&[top], "192.0.2.1", &[], 2));
}

#[test]
fn a_port_without_a_number_is_every_port_of_its_protocol() {
    let w = world();
    let tcp = ingress_ports(json!([{"protocol": "TCP"}]));
    assert!(w.allows(&[tcp], "192.0.2.1", &[], 4242));
    let udp = ingress_ports(json!([{"protocol": "UDP"}]));
    assert!(!w.allows(&[udp], "192.0.2.1", &[], 4242));
}

#[test]
fn only_tcp_rules_allow_a_tcp_connection() {
    let w = world();
    for proto in ["UDP", "SCTP", "tcp"] {
        let p = ingress_ports(json!([{"port": 80, "protocol": proto}]));
        assert!(!w.allows(&[p], "192.0.2.1", &[], 80), "{proto}");
    }
    let defaulted = ingress_ports(json!([{"port": 80}]));
    assert!(w.allows(&[defaulted], "192.0.2.1", &[], 80));
    let both =
        ingress_ports(json!([{"port": 80, "protocol": "UDP"}, {"port": 80, "protocol": "TCP"}]));
    assert!(w.allows(&[both], "192.0.2.1", &[], 80));
}

#[test]
fn named_ports_resolve_against_the_targets_declared_ports() {
    let w = world();
    let http = ingress_ports(json!([{"port": "http"}]));
    assert!(w.allows(one(&http), "192.0.2.1", &[], 8080));
    assert!(
        !w.allows(one(&http), "192.0.2.1", &[], 9090),
        "metrics is another name"
    );
    assert!(!w.allows(&[http], "192.0.2.1", &[], 80));
    // Declared for UDP: no TCP port of that name.
    let dns = ingress_ports(json!([{"port": "dns"}]));
    assert!(!w.allows(one(&dns), "192.0.2.1", &[], 53));
    let dns_udp = ingress_ports(json!([{"port": "dns", "protocol": "UDP"}]));
    assert!(!w.allows(&[dns_udp], "192.0.2.1", &[], 53));
    let unknown = ingress_ports(json!([{"port": "grpc"}]));
    assert!(!w.allows(&[unknown], "192.0.2.1", &[], 8080));
    // Another Pod declaring no ports: the name resolves to nothing.
    let bare = Target {
        namespace: "shop",
        labels: &w.target_labels,
        ports: &[],
    };
    let src = Source {
        ip: ip("192.0.2.1"),
        pods: &[],
    };
    let v = evaluate(
        &[ingress_ports(json!([{"port": "http"}]))],
        &bare,
        &src,
        8080,
    );
    assert!(!v.allowed);
}

#[test]
fn source_and_port_must_both_match_in_one_rule() {
    let w = world();
    let p = policy(
        "shop",
        "p",
        json!({"podSelector": {}, "ingress": [
            {"from": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 80}]},
            {"from": [{"ipBlock": {"cidr": "192.0.2.0/24"}}], "ports": [{"port": 443}]},
        ]}),
    );
    assert!(w.allows(one(&p), "10.1.1.1", &[], 80));
    assert!(w.allows(one(&p), "192.0.2.1", &[], 443));
    assert!(!w.allows(one(&p), "10.1.1.1", &[], 443));
    assert!(!w.allows(&[p], "192.0.2.1", &[], 80));
}
