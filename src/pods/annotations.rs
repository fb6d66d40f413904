//! The Pod contract: what a sandbox Pod's annotations ask of sandboxd
//! (docs/pod-contract.md): runtime gate, TTL, template, claim body. Pure.

use super::pod::Pod;

use crate::sandboxd::ClaimRequest;

pub const RUNTIME: &str = "sandbox.cocoonstack.io/runtime";
pub const TEMPLATE: &str = "sandbox.cocoonstack.io/template";
pub const NET: &str = "sandbox.cocoonstack.io/net";
pub const SIZE: &str = "sandbox.cocoonstack.io/size";
pub const TTL_SECONDS: &str = "sandbox.cocoonstack.io/ttl-seconds";
pub const CLAIM_ID: &str = "sandbox.cocoonstack.io/claim-id";
/// The runtime this node serves.
pub const SANDBOXD: &str = "sandboxd";
/// TTL sent when the Pod does not ask for one (24 h, sandboxd's cap).
pub const DEFAULT_TTL_SECONDS: u64 = 86_400;

/// The Pod must ask for the sandboxd runtime (absent means sandboxd).
pub fn runtime_gate(pod: &Pod) -> Result<(), String> {
    match pod.annotation(RUNTIME) {
        None | Some(SANDBOXD) => Ok(()),
        Some(other) => Err(format!(
            "pod {} requests runtime {other:?}; this node serves \"{SANDBOXD}\"",
            pod.key()
        )),
    }
}

/// The claim request, or why the Pod cannot be claimed for.
pub fn claim_request(pod: &Pod) -> Result<ClaimRequest, String> {
    let ttl_seconds = match pod.annotation(TTL_SECONDS) {
        None => DEFAULT_TTL_SECONDS,
        // Go's strconv.Atoi, as the original: `+600` and `-0` are numbers,
        // anything past i64 is not.
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| {
                format!("invalid {TTL_SECONDS}={raw:?}: want a whole number of seconds >= 0")
            })?,
    };
    let template = pod
        .annotation(TEMPLATE)
        .ok_or_else(|| format!("missing {TEMPLATE} annotation"))?
        .to_string();
    Ok(ClaimRequest {
        template,
        net: pod.annotation(NET).unwrap_or_default().to_string(),
        size: pod.annotation(SIZE).unwrap_or_default().to_string(),
        ttl_seconds,
        claim_ref: super::claim_ref::for_pod(&pod.key(), pod.uid()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ann: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some("p".into());
        p.metadata.annotations = Some(
            ann.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    #[test]
    fn runtime_absent_empty_or_sandboxd_pass() {
        assert!(runtime_gate(&pod(&[])).is_ok());
        assert!(runtime_gate(&pod(&[(RUNTIME, "")])).is_ok());
        assert!(runtime_gate(&pod(&[(RUNTIME, "sandboxd")])).is_ok());
        let e = runtime_gate(&pod(&[(RUNTIME, "vk-cocoon")])).unwrap_err();
        assert!(e.contains("vk-cocoon") && e.contains("ns/p"), "{e}");
    }

    #[test]
    fn template_required() {
        assert!(claim_request(&pod(&[])).unwrap_err().contains(TEMPLATE));
        assert!(claim_request(&pod(&[(TEMPLATE, "")])).is_err());
    }

    #[test]
    fn ttl_rules() {
        let req = |ttl: Option<&str>| {
            let mut a = vec![(TEMPLATE, "base:24.04")];
            if let Some(t) = ttl {
                a.push((TTL_SECONDS, t));
            }
            claim_request(&pod(&a))
        };
        assert_eq!(req(None).unwrap().ttl_seconds, 86_400);
        assert_eq!(req(Some("")).unwrap().ttl_seconds, 86_400);
        assert_eq!(req(Some("600")).unwrap().ttl_seconds, 600);
        assert_eq!(req(Some("0")).unwrap().ttl_seconds, 0);
        assert!(req(Some("-1")).is_err());
        assert!(req(Some("abc")).is_err());
        // Found with the annotations fuzz target's checks: the parse is Go's
        // strconv.Atoi (the original's), not Rust's u64 parse.
        assert_eq!(req(Some("-0")).unwrap().ttl_seconds, 0);
        assert_eq!(req(Some("+600")).unwrap().ttl_seconds, 600);
        assert_eq!(req(Some("007")).unwrap().ttl_seconds, 7);
        assert_eq!(
            req(Some("9223372036854775807")).unwrap().ttl_seconds,
            9_223_372_036_854_775_807
        );
        for bad in [
            "9223372036854775808",
            "18446744073709551615",
            " 600",
            "6_00",
            "+",
            "1e3",
        ] {
            let e = req(Some(bad)).unwrap_err();
            assert!(
                e.contains(TTL_SECONDS) && e.contains(&format!("{bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn request_carries_key_net_size() {
        let r = claim_request(&pod(&[
            (TEMPLATE, "base:24.04"),
            (NET, "egress"),
            (SIZE, "medium"),
        ]))
        .unwrap();
        assert_eq!(r.claim_ref, "ns/p");
        assert_eq!(r.template, "base:24.04");
        assert_eq!((r.net.as_str(), r.size.as_str()), ("egress", "medium"));
        let mut with_uid = pod(&[(TEMPLATE, "base:24.04")]);
        with_uid.metadata.uid = Some("u-1".into());
        let r = claim_request(&with_uid).unwrap();
        assert_eq!(r.claim_ref, "ns/p#vk-sandbox:u-1");
    }
}
