//! What a provider create does next for a Pod, decided from the claim row
//! its key holds (if any), the Pod and the time, and what a failed claim
//! call makes of the create. Pure; `create.rs` carries each step out and
//! asks again, until a step ends the create.

use jiff::Timestamp;

use super::CreateFailure;
use crate::claims::{Claim, ClaimState, OwnerRef};
use crate::pods::failure::Cause;
use crate::pods::handback::Shortfall;
use crate::pods::pod::Pod;
use crate::pods::{annotations, authority};
use crate::sandboxd::{ClaimRequest, SandboxdError, Token};

/// One step of a create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateStep {
    /// The Pod cannot be claimed for (another runtime, or annotations that
    /// make no claim request): why.
    Refuse(String),
    /// The row is from the previous run and sandboxd has not vouched for
    /// it yet: list sandboxd, which lifts or drops it.
    Verify,
    /// A settled row past its cached deadline: sandboxd decides whether the
    /// sandbox lives (then it is adopted with the listed deadline) or not
    /// (then the row goes).
    ConfirmDeadline,
    /// A settled row: the sandbox outlived its previous Pod, adopt it.
    /// `wake`: vk-sandbox hibernated its VM (its owner was suspended), so
    /// it is woken before the Pod is reported Running.
    Adopt { wake: bool },
    /// A settled row made or adopted for this same Pod (a restart): resume
    /// it, nothing changed hands (`wake` as for [`CreateStep::Adopt`]).
    Resume { wake: bool },
    /// A settled row whose VM serves another owner generation: the row
    /// records an owner, and this (new) Pod's controller is another object
    /// (a Sandbox deleted and re-created under the same name, or no
    /// controller at all). The VM, its memory and files are not handed
    /// over: the recorded owner is asked; gone, its VM is released and a
    /// fresh one claimed; alive or in doubt, the Pod waits.
    Supersede(OwnerRef),
    /// A tentative row without a credential: a recovered claim whose commit
    /// failed. The sandbox is the Pod's, not ours to return: drop the row
    /// and recover it again.
    DropUnrecorded,
    /// A tentative row with a credential: an earlier commit and its undo
    /// both failed. Return the sandbox with it, then drop the row.
    ReturnStranded(Token),
    /// No row, and the Pod says it runs on sandbox `id` (its claim-id
    /// annotation): the claims state was lost or replaced while its VM kept
    /// serving. Adopt it if sandboxd lists it under this Pod's key, else
    /// claim (`then`).
    Recover { id: String, then: Box<CreateStep> },
    /// No row: claim a new sandbox.
    Claim(ClaimRequest),
}

/// The next step for `pod`, whose key holds `row`, at `now`.
pub fn next_step(row: Option<(&Claim, ClaimState)>, pod: &Pod, now: Timestamp) -> CreateStep {
    if let Err(why) = annotations::runtime_gate(pod) {
        return CreateStep::Refuse(why);
    }
    let Some((claim, state)) = row else {
        let claim_new = match annotations::claim_request(pod) {
            Ok(request) => CreateStep::Claim(request),
            Err(why) => CreateStep::Refuse(why),
        };
        return match pod.annotation(annotations::CLAIM_ID) {
            Some(id) => CreateStep::Recover {
                id: id.to_string(),
                then: Box::new(claim_new),
            },
            None => claim_new,
        };
    };
    match state {
        ClaimState::Quarantined => CreateStep::Verify,
        ClaimState::Settled if let Some(owner) = other_generation(claim, pod) => {
            CreateStep::Supersede(owner.clone())
        }
        ClaimState::Settled if claim.deadline.is_some_and(|d| d <= now) => {
            CreateStep::ConfirmDeadline
        }
        ClaimState::Settled => adoption(claim, pod),
        ClaimState::Tentative => match &claim.token {
            Some(token) => CreateStep::ReturnStranded(token.clone()),
            None => CreateStep::DropUnrecorded,
        },
    }
}

/// The owner recorded for `claim` when `pod`, a Pod other than the one
/// the row was made or last adopted for, has another controller (by UID):
/// the row's VM belongs to another owner generation. A row without a
/// recorded owner (made before owners were recorded) has none to compare.
fn other_generation<'a>(claim: &'a Claim, pod: &Pod) -> Option<&'a OwnerRef> {
    let recorded = claim.lifecycle.owner.as_ref()?;
    let same_pod = !claim.pod_uid.is_empty() && claim.pod_uid == pod.uid();
    let controller = authority::controller_ref(pod).map(|r| r.uid.as_str());
    (!same_pod && controller != Some(recorded.uid.as_str())).then_some(recorded)
}

/// Adopting a settled row: [`CreateStep::Resume`] when it was made or last
/// adopted for this very Pod, else [`CreateStep::Adopt`]; a VM vk-sandbox
/// hibernated (or meant to) is woken first.
pub fn adoption(claim: &Claim, pod: &Pod) -> CreateStep {
    let wake = claim.lifecycle.vm.needs_wake();
    if !claim.pod_uid.is_empty() && claim.pod_uid == pod.uid() {
        CreateStep::Resume { wake }
    } else {
        CreateStep::Adopt { wake }
    }
}

/// A claim call for `k` (template `template`) that failed with `e`: the
/// claim's trouble ([`Cause::Claim`]), never vk-sandbox's. A capacity miss
/// (no warm VM, a quota, a draining node) is `NoWarmCapacity`, which the
/// Pod waits out; any other failure is `ProviderFailed`. A miss, or no
/// reply, is this node's [`Shortfall`] (the Pod may be handed back).
pub fn claim_failed(k: &str, template: &str, e: &SandboxdError) -> CreateFailure {
    let reason = if e.is_capacity_miss() {
        "NoWarmCapacity"
    } else {
        "ProviderFailed"
    };
    CreateFailure {
        reason,
        message: format!("claim sandbox for {k} (template {template}): {e}"),
        cause: Cause::Claim,
        shortfall: shortfall_of(e),
    }
}

/// Strays of earlier claims for `k` not checked (`e`): nothing claimed.
pub fn strays_unchecked(k: &str, e: &SandboxdError) -> CreateFailure {
    CreateFailure {
        shortfall: shortfall_of(e),
        ..CreateFailure::ours(format!(
            "cannot check for, or return, a sandbox an earlier claim for {k} may have left \
             behind; refusing to claim twice: {e}"
        ))
    }
}

/// Whether `e` says this node has no capacity, or no sandboxd to ask.
pub fn shortfall_of(e: &SandboxdError) -> Option<Shortfall> {
    match e {
        SandboxdError::CapacityMiss { .. } => Some(Shortfall::NoCapacity),
        SandboxdError::Transport { .. } => Some(Shortfall::Unreachable),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::annotations::{CLAIM_ID, RUNTIME, TEMPLATE};
    use crate::sandboxd::Op;

    fn ts(s: &str) -> Timestamp {
        s.parse().expect("ts")
    }

    fn claim(pod_uid: &str, token: Option<&str>, deadline: Option<&str>) -> Claim {
        Claim {
            id: "sb_1".into(),
            token: token.and_then(Token::new),
            address: String::new(),
            pod_uid: pod_uid.into(),
            claimed_at: ts("2026-01-01T00:00:00Z"),
            deadline: deadline.map(ts),
            lifecycle: Default::default(),
        }
    }

    fn pod(uid: &str, annotations: &[(&str, &str)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ns".into());
        p.metadata.name = Some("p".into());
        p.metadata.uid = Some(uid.into());
        p.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        p
    }

    fn request(uid: &str) -> ClaimRequest {
        ClaimRequest {
            template: "base".into(),
            ttl_seconds: annotations::DEFAULT_TTL_SECONDS,
            claim_ref: format!("ns/p#vk-sandbox:{uid}"),
            ..Default::default()
        }
    }

    #[test]
    fn next_step_table() {
        use ClaimState::{Quarantined, Settled, Tentative};
        use CreateStep::{
            Adopt, ConfirmDeadline, DropUnrecorded, Recover, Refuse, Resume, ReturnStranded, Verify,
        };
        let claim_new = |uid: &str| CreateStep::Claim(request(uid));
        let now = ts("2026-06-01T00:00:00Z");
        let plain = pod("u", &[(TEMPLATE, "base")]);
        let running = pod("u", &[(TEMPLATE, "base"), (CLAIM_ID, "sb_9")]);
        let no_template = pod("u", &[]);
        let other_runtime = pod("u", &[(TEMPLATE, "base"), (RUNTIME, "vk-cocoon")]);
        let mine = claim("u", Some("t"), None);
        let earlier_pod = claim("u0", Some("t"), None);
        let unknown_pod = claim("", Some("t"), None);
        let past = claim("u", Some("t"), Some("2026-05-31T23:59:59Z"));
        let at_now = claim("u", Some("t"), Some("2026-06-01T00:00:00Z"));
        let future = claim("u0", Some("t"), Some("2026-06-01T00:00:01Z"));
        let recovered = claim("u", None, None);
        let since = ts("2026-05-01T00:00:00Z");
        let with_vm = |c: Claim, vm: crate::claims::VmState| Claim {
            lifecycle: Box::new(crate::claims::Lifecycle {
                vm,
                ..Default::default()
            }),
            ..c
        };
        let hibernated_mine = with_vm(
            mine.clone(),
            crate::claims::VmState::Hibernated {
                why: "suspended".into(),
                since,
            },
        );
        let pending_earlier = with_vm(
            earlier_pod.clone(),
            crate::claims::VmState::Hibernating {
                why: "suspended".into(),
                since,
            },
        );
        let archived_earlier = with_vm(
            earlier_pod.clone(),
            crate::claims::VmState::Archived { since },
        );
        let refused_runtime =
            Refuse("pod ns/p requests runtime \"vk-cocoon\"; this node serves \"sandboxd\"".into());
        type Case<'a> = (
            &'a str,
            Option<(&'a Claim, ClaimState)>,
            &'a Pod,
            CreateStep,
        );
        let cases: Vec<Case> = vec![
            (
                "settled, hibernated by us, this Pod: wake, resume",
                Some((&hibernated_mine, Settled)),
                &plain,
                Resume { wake: true },
            ),
            (
                "settled, hibernate pending, a new Pod: wake, adopt",
                Some((&pending_earlier, Settled)),
                &plain,
                Adopt { wake: true },
            ),
            (
                "settled, archived: wake from the archive",
                Some((&archived_earlier, Settled)),
                &plain,
                Adopt { wake: true },
            ),
            ("no row: claim", None, &plain, claim_new("u")),
            (
                "no row, no template: refuse",
                None,
                &no_template,
                Refuse(format!("missing {TEMPLATE} annotation")),
            ),
            (
                "no row, runs on a sandbox: recover, else claim",
                None,
                &running,
                Recover {
                    id: "sb_9".into(),
                    then: Box::new(claim_new("u")),
                },
            ),
            (
                "another runtime: refuse first",
                None,
                &other_runtime,
                refused_runtime.clone(),
            ),
            (
                "another runtime, even with a row",
                Some((&mine, Settled)),
                &other_runtime,
                refused_runtime,
            ),
            (
                "quarantined: verify",
                Some((&mine, Quarantined)),
                &plain,
                Verify,
            ),
            (
                "quarantined past deadline: verify first",
                Some((&past, Quarantined)),
                &plain,
                Verify,
            ),
            (
                "settled, this Pod: resume",
                Some((&mine, Settled)),
                &plain,
                Resume { wake: false },
            ),
            (
                "settled, an earlier Pod: adopt",
                Some((&earlier_pod, Settled)),
                &plain,
                Adopt { wake: false },
            ),
            (
                "settled, no recorded Pod: adopt",
                Some((&unknown_pod, Settled)),
                &plain,
                Adopt { wake: false },
            ),
            (
                "settled, deadline passed: confirm",
                Some((&past, Settled)),
                &plain,
                ConfirmDeadline,
            ),
            (
                "settled, deadline now: confirm",
                Some((&at_now, Settled)),
                &plain,
                ConfirmDeadline,
            ),
            (
                "settled, deadline ahead: adopt",
                Some((&future, Settled)),
                &plain,
                Adopt { wake: false },
            ),
            (
                "tentative with a token: return it",
                Some((&mine, Tentative)),
                &plain,
                ReturnStranded(Token::new("t").expect("token")),
            ),
            (
                "tentative without a token: drop, recover again",
                Some((&recovered, Tentative)),
                &running,
                DropUnrecorded,
            ),
            (
                "settled without a token: resume",
                Some((&recovered, Settled)),
                &plain,
                Resume { wake: false },
            ),
        ];
        for (name, row, pod, want) in cases {
            assert_eq!(next_step(row, pod, now), want, "{name}");
        }
    }

    fn owned_by(mut p: Pod, uid: &str) -> Pod {
        p.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "agents.x-k8s.io/v1beta1".into(),
                kind: "Sandbox".into(),
                name: "p".into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: None,
            },
        ]);
        p
    }

    /// A row's VM goes to a new Pod only under the same owner generation
    /// (defect review 2026-12-b, finding 6: a Sandbox re-created under the
    /// same name woke and adopted the old one's VM).
    #[test]
    fn a_vm_is_adopted_only_by_its_owner_generation() {
        use ClaimState::Settled;
        let now = ts("2026-06-01T00:00:00Z");
        let recorded = OwnerRef {
            api_version: "agents.x-k8s.io/v1beta1".into(),
            kind: "Sandbox".into(),
            name: "p".into(),
            uid: "o1".into(),
        };
        let held = |pod_uid: &str, deadline: Option<&str>| Claim {
            lifecycle: Box::new(crate::claims::Lifecycle {
                owner: Some(recorded.clone()),
                ..Default::default()
            }),
            ..claim(pod_uid, Some("t"), deadline)
        };
        let plain = pod("u", &[(TEMPLATE, "base")]);
        let (earlier, mine) = (held("u0", None), held("u", None));
        let past = held("u0", Some("2026-05-31T00:00:00Z"));
        let unrecorded = claim("u0", Some("t"), None);
        let supersede = CreateStep::Supersede(recorded.clone());
        let cases: Vec<(&str, &Claim, Pod, CreateStep)> = vec![
            (
                "same owner, a new Pod: adopt",
                &earlier,
                owned_by(plain.clone(), "o1"),
                CreateStep::Adopt { wake: false },
            ),
            (
                "another owner generation: not adopted",
                &earlier,
                owned_by(plain.clone(), "o2"),
                supersede.clone(),
            ),
            (
                "a new Pod without a controller: not adopted",
                &earlier,
                plain.clone(),
                supersede.clone(),
            ),
            (
                "another generation, past its deadline: not confirmed for it",
                &past,
                owned_by(plain.clone(), "o2"),
                supersede,
            ),
            (
                "the very Pod the row serves (a restart): resumed",
                &mine,
                owned_by(plain.clone(), "o2"),
                CreateStep::Resume { wake: false },
            ),
            (
                "no owner recorded (an older row): adopt",
                &unrecorded,
                owned_by(plain.clone(), "o2"),
                CreateStep::Adopt { wake: false },
            ),
        ];
        for (name, row, pod, want) in cases {
            assert_eq!(next_step(Some((row, Settled)), &pod, now), want, "{name}");
        }
    }

    #[test]
    fn a_failed_claim_is_the_claims_trouble_and_only_a_miss_waits_for_capacity() {
        let cases = [
            (
                SandboxdError::CapacityMiss {
                    message: "node claim quota reached".into(),
                },
                "NoWarmCapacity",
                "sandboxd claim: node at capacity or draining: node claim quota reached",
                Some(Shortfall::NoCapacity),
            ),
            (
                SandboxdError::Http {
                    op: Op::Claim,
                    status: 500,
                    message: "boot failed".into(),
                },
                "ProviderFailed",
                "sandboxd claim: unexpected status 500: boot failed",
                None,
            ),
            (
                SandboxdError::Decode {
                    op: Op::Claim,
                    status: 200,
                    message: "reply body is not a JSON object".into(),
                },
                "ProviderFailed",
                "sandboxd claim: decode (status 200): reply body is not a JSON object",
                None,
            ),
        ];
        for (e, reason, why, shortfall) in cases {
            assert_eq!(
                claim_failed("ns/p", "base", &e),
                CreateFailure {
                    reason,
                    message: format!("claim sandbox for ns/p (template base): {why}"),
                    cause: Cause::Claim,
                    shortfall,
                },
                "{e}"
            );
        }
    }
}
