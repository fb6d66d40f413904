//! CIDR blocks of `ipBlock` peers (pure), IPv4 and IPv6, read as Go's
//! `net.ParseCIDR` reads them (the parser Kubernetes and the CNIs use):
//! host bits are ignored, and an IPv4-mapped IPv6 block of /96 or longer
//! is the IPv4 block it maps.

use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(raw: &str) -> Result<Cidr, String> {
        let bad = |why: &str| format!("ipBlock {raw:?}: {why}");
        let (addr, len) = raw.split_once('/').ok_or_else(|| bad("not a CIDR block"))?;
        let addr: IpAddr = addr.parse().map_err(|_| bad("not an IP address"))?;
        // Digits only: `u8::from_str` would take a leading `+`.
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad("the prefix length is not a number"));
        }
        let prefix: u8 = len.parse().map_err(|_| bad("prefix length out of range"))?;
        let (addr, prefix) = match addr {
            IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => (IpAddr::V4(v4), prefix - 96),
                None => (addr, prefix),
            },
            _ => (addr, prefix),
        };
        if prefix > max_prefix(addr) {
            return Err(bad("prefix length out of range"));
        }
        Ok(Cidr {
            network: mask(addr, prefix),
            prefix,
        })
    }

    /// Whether `ip` is in the block; an address of the other family never
    /// is. An IPv4-mapped IPv6 address counts as its IPv4 address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.network.is_ipv4() && mask(ip, self.prefix) == self.network
    }
}

fn max_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// `ip` with all but its first `prefix` bits cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & keep).into())
        }
        IpAddr::V6(v6) => {
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & keep).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("a test address")
    }

    fn inside(cidr: &str, addr: &str) -> bool {
        Cidr::parse(cidr).expect("a test CIDR").contains(ip(addr))
    }

    #[test]
    fn ipv4_blocks_hold_their_addresses_only() {
        assert!(inside("10.1.0.0/16", "10.1.0.0"));
        assert!(inside("10.1.0.0/16", "10.1.255.255"));
        assert!(!inside("10.1.0.0/16", "10.2.0.0"));
        assert!(!inside("10.1.0.0/16", "10.0.255.255"));
        assert!(inside("10.1.2.3/32", "10.1.2.3"));
        assert!(!inside("10.1.2.3/32", "10.1.2.2"));
        assert!(!inside("10.1.2.3/32", "10.1.2.4"));
        assert!(inside("0.0.0.0/0", "203.0.113.9"));
        assert!(inside("128.0.0.0/1", "255.0.0.1"));
        assert!(!inside("128.0.0.0/1", "127.255.255.255"));
        assert!(inside("10.1.2.0/31", "10.1.2.1"));
        assert!(!inside("10.1.2.0/31", "10.1.2.2"));
    }

    #[test]
    fn ipv6_blocks_hold_their_addresses_only() {
        assert!(inside("2001:db8::/32", "2001:db8:ffff::1"));
        assert!(!inside("2001:db8::/32", "2001:db9::1"));
        assert!(inside("::/0", "fe80::1"));
        assert!(inside("2001:db8::1/128", "2001:db8::1"));
        assert!(!inside("2001:db8::1/128", "2001:db8::2"));
        assert!(!inside("2001:db8::1/128", "2001:db8::"));
        assert!(inside("8000::/1", "ffff::1"));
        assert!(!inside("8000::/1", "7fff::1"));
        assert!(inside("2001:db8::/127", "2001:db8::1"));
        assert!(!inside("2001:db8::/127", "2001:db8::2"));
    }

    #[test]
    fn families_never_mix() {
        assert!(!inside("0.0.0.0/0", "::1"));
        assert!(!inside("::/0", "10.0.0.1"));
        assert!(
            !inside("::/96", "10.0.0.1"),
            "IPv4-compatible is not mapped"
        );
    }

    #[test]
    fn mapped_addresses_and_blocks_are_ipv4() {
        assert!(inside("10.0.0.0/8", "::ffff:10.9.9.9"));
        assert!(!inside("10.0.0.0/8", "::ffff:11.9.9.9"));
        assert!(inside("::ffff:10.0.0.0/104", "10.200.0.1"));
        assert!(!inside("::ffff:10.0.0.0/104", "11.0.0.1"));
        assert!(inside("::ffff:0.0.0.0/96", "192.0.2.1"));
        // Shorter than /96 the block is IPv6 (and holds no IPv4 address).
        assert!(!inside("::ffff:0.0.0.0/95", "192.0.2.1"));
    }

    #[test]
    fn host_bits_are_ignored() {
        assert!(inside("10.1.2.3/24", "10.1.2.200"));
        assert!(!inside("10.1.2.3/24", "10.1.3.3"));
        assert!(inside("2001:db8::5/64", "2001:db8::ffff"));
    }

    #[test]
    fn malformed_blocks_are_refused() {
        for raw in [
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            "10.0.0/8",
            "2001:db8::/129",
            "::ffff:10.0.0.0/129",
            "10.0.0.0/256",
            "x/8",
            "",
        ] {
            assert!(Cidr::parse(raw).is_err(), "{raw:?} accepted");
        }
        assert_eq!(
            Cidr::parse("10.0.0.0/33"),
            Err("ipBlock \"10.0.0.0/33\": prefix length out of range".to_string())
        );
        assert!(Cidr::parse("10.0.0.0/32").is_ok());
        assert!(Cidr::parse("::/128").is_ok());
    }
}
