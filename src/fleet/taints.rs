//! The Node's taint list with ours in it (pure): every taint whose key is
//! not one of [`OWNED_TAINTS`] stays as it is, in its place (`kubectl
//! taint`, the provider taint, the node lifecycle controller's).

use k8s_openapi::api::core::v1::Taint;

use super::decide::{FleetTaint, OWNED_TAINTS};

fn owned(t: &Taint) -> bool {
    OWNED_TAINTS.contains(&t.key.as_str())
}

/// `current` with our taints replaced by `want`; `None` when that is what
/// `current` already holds (nothing to write).
pub fn merged(current: &[Taint], want: &[FleetTaint]) -> Option<Vec<Taint>> {
    let ours: Vec<(&str, &str)> = current
        .iter()
        .filter(|t| owned(t))
        .map(|t| (t.key.as_str(), t.effect.as_str()))
        .collect();
    let wanted: Vec<(&str, &str)> = want.iter().map(|t| (t.key, t.effect)).collect();
    let same = ours.len() == wanted.len() && wanted.iter().all(|w| ours.contains(w));
    if same {
        return None;
    }
    let mut out: Vec<Taint> = current.iter().filter(|t| !owned(t)).cloned().collect();
    out.extend(want.iter().map(|t| Taint {
        key: t.key.into(),
        value: None,
        effect: t.effect.into(),
        time_added: None,
    }));
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::decide::{TAINT_AT_CAPACITY, TAINT_DRAINING, TAINT_NO_WARM};

    fn t(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: None,
            effect: effect.into(),
            time_added: None,
        }
    }

    fn ft(key: &'static str, effect: &'static str) -> FleetTaint {
        FleetTaint { key, effect }
    }

    #[test]
    fn others_taints_stay_in_place_and_only_ours_change() {
        let user = t("dedicated", "NoSchedule");
        let provider = Taint {
            value: Some("sandboxd".into()),
            ..t("virtual-kubelet.io/provider", "NoSchedule")
        };
        let current = vec![
            provider.clone(),
            t(TAINT_DRAINING, "NoSchedule"),
            user.clone(),
        ];
        let out = merged(&current, &[ft(TAINT_AT_CAPACITY, "NoSchedule")]).expect("changed");
        assert_eq!(
            out,
            vec![
                provider.clone(),
                user.clone(),
                t(TAINT_AT_CAPACITY, "NoSchedule")
            ]
        );
        // Ours gone: the others only.
        let out = merged(&current, &[]).expect("changed");
        assert_eq!(out, vec![provider, user]);
    }

    #[test]
    fn nothing_to_write_when_ours_are_in_place_in_any_order() {
        let current = vec![
            t("a", "NoSchedule"),
            t(TAINT_NO_WARM, "PreferNoSchedule"),
            t(TAINT_DRAINING, "NoSchedule"),
        ];
        let want = [
            ft(TAINT_DRAINING, "NoSchedule"),
            ft(TAINT_NO_WARM, "PreferNoSchedule"),
        ];
        assert_eq!(merged(&current, &want), None);
        assert_eq!(merged(&[t("a", "NoSchedule")], &[]), None);
        // The same key with another effect is a change.
        assert!(
            merged(
                &current,
                &[
                    ft(TAINT_DRAINING, "NoSchedule"),
                    ft(TAINT_NO_WARM, "NoSchedule")
                ]
            )
            .is_some()
        );
    }

    #[test]
    fn a_taint_of_a_key_we_do_not_own_under_our_prefix_is_left_alone() {
        let current = vec![t("sandbox.cocoonstack.io/maintenance", "NoSchedule")];
        assert_eq!(merged(&current, &[]), None);
        let out = merged(&current, &[ft(TAINT_DRAINING, "NoSchedule")]).expect("changed");
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].key, "sandbox.cocoonstack.io/maintenance");
    }
}
