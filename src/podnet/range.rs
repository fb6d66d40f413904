//! The Pod address range (`--pod-cidr`) and which address a new sandbox
//! gets from it (pure). IPv4 only: sandboxd's guests and the relay are
//! IPv4 today, and a dual-stack Pod needs one address per family.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// An IPv4 CIDR block Pod addresses are taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodRange {
    base: u32,
    prefix: u8,
}

impl PodRange {
    /// `a.b.c.d/n`, with `n` from 8 to 30 (a /31 or /32 holds no Pod
    /// address besides the network's own; a range wider than /8 is a
    /// typo). The address must be the network's (no host bits).
    pub fn parse(raw: &str) -> Result<PodRange, String> {
        let (addr, len) = raw
            .split_once('/')
            .ok_or_else(|| format!("{raw:?} is not a CIDR block (want a.b.c.d/n)"))?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| {
            if addr.contains(':') {
                format!("{raw:?} is IPv6; Pod addresses are IPv4 only")
            } else {
                format!("{raw:?}: {addr:?} is not an IPv4 address")
            }
        })?;
        let prefix: u8 = len
            .parse()
            .map_err(|_| format!("{raw:?}: prefix {len:?} is not a number"))?;
        if !(8..=30).contains(&prefix) {
            return Err(format!(
                "{raw:?}: prefix /{prefix} is out of range (want /8 to /30)"
            ));
        }
        let base = u32::from(addr);
        let range = PodRange { base, prefix };
        if base & !range.mask() != 0 {
            return Err(format!("{raw:?} has host bits set; the block is {}", range));
        }
        Ok(range)
    }

    fn mask(&self) -> u32 {
        u32::MAX << (32 - u32::from(self.prefix))
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == self.base
    }

    /// How many addresses a Pod may get: all but the network's and the
    /// broadcast address.
    pub fn size(&self) -> u32 {
        (1u32 << (32 - u32::from(self.prefix))) - 2
    }

    /// The `n`th Pod address (0-based), `n < size()`.
    fn nth(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.base + 1 + n)
    }

    fn index_of(&self, ip: Ipv4Addr) -> Option<u32> {
        let i = u32::from(ip).checked_sub(self.base + 1)?;
        (self.contains(ip) && i < self.size()).then_some(i)
    }

    /// The first Pod address: a probe bind there tells whether the range
    /// is local to the namespace the relay listens in.
    pub fn first(&self) -> Ipv4Addr {
        self.nth(0)
    }
}

impl std::fmt::Display for PodRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

/// Round-robin with a cool-down: a released address is not given again
/// while a client may still hold it (a cached Endpoint, a DNS answer, an
/// open connection's retry), and never while a row holds it.
#[derive(Debug)]
pub struct Picker {
    range: PodRange,
    cooldown: Duration,
    /// Where the round-robin goes on from.
    next: u32,
    /// Addresses seen in use at the last look, and those released since,
    /// with when they were first seen free.
    seen: HashSet<Ipv4Addr>,
    cooling: HashMap<Ipv4Addr, Instant>,
}

impl Picker {
    /// `in_use`: the addresses the claims file holds at start; the
    /// round-robin goes on after the highest of them (the cooling list of
    /// the process before is not kept, so what it released last is not
    /// given first).
    pub fn new(range: PodRange, cooldown: Duration, in_use: &HashSet<Ipv4Addr>) -> Picker {
        let next = in_use
            .iter()
            .filter_map(|ip| range.index_of(*ip))
            .max()
            .map_or(0, |i| (i + 1) % range.size());
        Picker {
            range,
            cooldown,
            next,
            seen: in_use.clone(),
            cooling: HashMap::new(),
        }
    }

    pub fn range(&self) -> PodRange {
        self.range
    }

    /// Takes note of the addresses in use now: those that were and are
    /// no more start cooling down.
    pub fn observe(&mut self, in_use: &HashSet<Ipv4Addr>, now: Instant) {
        for gone in self.seen.difference(in_use) {
            self.cooling.entry(*gone).or_insert(now);
        }
        for held in in_use {
            self.cooling.remove(held);
        }
        self.seen = in_use.clone();
        let cooldown = self.cooldown;
        self.cooling
            .retain(|_, since| now.saturating_duration_since(*since) < cooldown);
    }

    /// The addresses cooling down now, in order.
    pub fn cooling(&self) -> Vec<Ipv4Addr> {
        let mut v: Vec<Ipv4Addr> = self.cooling.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The next free address, not held and not cooling down; `None` when
    /// the range is full. The address counts as in use from now on.
    pub fn pick(&mut self, in_use: &HashSet<Ipv4Addr>, now: Instant) -> Option<Ipv4Addr> {
        self.observe(in_use, now);
        let size = self.range.size();
        for step in 0..size {
            let i = (self.next + step) % size;
            let ip = self.range.nth(i);
            if in_use.contains(&ip) || self.cooling.contains_key(&ip) {
                continue;
            }
            self.next = (i + 1) % size;
            self.seen.insert(ip);
            return Some(ip);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().expect("ip")
    }

    fn set(ips: &[&str]) -> HashSet<Ipv4Addr> {
        ips.iter().map(|s| ip(s)).collect()
    }

    #[test]
    fn a_range_is_a_network_block_of_useful_size() {
        let r = PodRange::parse("10.244.7.0/24").expect("range");
        assert_eq!(r.to_string(), "10.244.7.0/24");
        assert_eq!(r.size(), 254);
        assert_eq!(r.first(), ip("10.244.7.1"));
        assert!(r.contains(ip("10.244.7.255")));
        assert!(!r.contains(ip("10.244.8.1")));
        assert_eq!(PodRange::parse("10.0.0.0/30").expect("/30").size(), 2);
        for (bad, says) in [
            ("10.244.7.0", "not a CIDR"),
            ("10.244.7.1/24", "host bits"),
            ("10.244.7.0/31", "out of range"),
            ("10.0.0.0/7", "out of range"),
            ("fd00::/64", "IPv6"),
            ("10.244.7.x/24", "not an IPv4"),
            ("10.244.7.0/x", "not a number"),
        ] {
            let e = PodRange::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn addresses_go_round_skipping_held_ones() {
        let r = PodRange::parse("10.0.0.0/29").expect("range");
        let now = Instant::now();
        let mut p = Picker::new(r, Duration::from_secs(300), &HashSet::new());
        let held = set(&["10.0.0.2"]);
        assert_eq!(p.pick(&held, now), Some(ip("10.0.0.1")));
        let held = set(&["10.0.0.1", "10.0.0.2"]);
        assert_eq!(p.pick(&held, now), Some(ip("10.0.0.3")));
        // Network (.0) and broadcast (.7) are never given.
        let held = set(&["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]);
        assert_eq!(p.pick(&held, now), Some(ip("10.0.0.6")));
        let all = set(&[
            "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6",
        ]);
        assert_eq!(p.pick(&all, now), None, "a full range gives nothing");
    }

    #[test]
    fn a_released_address_cools_down_before_it_is_given_again() {
        let r = PodRange::parse("10.0.0.0/30").expect("range");
        let t0 = Instant::now();
        let cool = Duration::from_secs(300);
        let mut p = Picker::new(r, cool, &set(&["10.0.0.1", "10.0.0.2"]));
        // .1 released: it cools; .2 is held; nothing to give.
        assert_eq!(p.pick(&set(&["10.0.0.2"]), t0), None);
        let later = t0 + Duration::from_secs(299);
        assert_eq!(p.pick(&set(&["10.0.0.2"]), later), None);
        let cooled = t0 + cool;
        assert_eq!(p.pick(&set(&["10.0.0.2"]), cooled), Some(ip("10.0.0.1")));
    }

    #[test]
    fn after_a_restart_the_round_goes_on_after_the_highest_held() {
        let r = PodRange::parse("10.0.0.0/28").expect("range");
        let held = set(&["10.0.0.2", "10.0.0.9"]);
        let mut p = Picker::new(r, Duration::from_secs(300), &held);
        assert_eq!(p.pick(&held, Instant::now()), Some(ip("10.0.0.10")));
        // Addresses outside the range are ignored.
        let mut p = Picker::new(r, Duration::from_secs(300), &set(&["192.0.2.1"]));
        assert_eq!(
            p.pick(&HashSet::new(), Instant::now()),
            Some(ip("10.0.0.1"))
        );
    }
}
