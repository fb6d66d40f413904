//! The tracked Pods: which are claimed for, and which version of a Pod the provider keeps.

use super::*;

/// The tracked Pods (the kubelet API's view and the sweeps') are the Pods
/// claimed for, sorted by key; untracking needs the same UID.
#[tokio::test(flavor = "multi_thread")]
async fn tracked_pods_and_keys_are_the_pods_claimed_for() {
    let (_sim, provider, _dir) = provider_with_token().await;
    assert!(provider.tracked_pods().is_empty());
    assert!(provider.tracked_keys().is_empty());
    for (name, uid) in [("b", "ub"), ("a", "ua")] {
        provider
            .create(&Arc::new(pod_named(name, uid)))
            .await
            .expect("claim");
    }
    let uids: Vec<String> = provider
        .tracked_pods()
        .iter()
        .map(|p| p.uid().to_string())
        .collect();
    assert_eq!(uids, ["ua", "ub"], "sorted by key");
    let mut keys = provider.tracked_keys();
    keys.sort();
    assert_eq!(keys, ["ns/a", "ns/b"]);
    assert!(provider.holds("ns/a") && !provider.holds("ns/c"));

    provider.untrack("ns/a", "another-uid");
    assert!(
        provider.tracked("ns/a").is_some(),
        "another UID untracks nothing"
    );
    provider.untrack("ns/a", "ua");
    assert!(provider.tracked("ns/a").is_none());
    assert_eq!(provider.tracked_keys(), ["ns/b"]);
}

/// The tracked copy follows the Pod's versions forward only, and
/// `newest` prefers it only when it is a later version of the same Pod.
#[tokio::test(flavor = "multi_thread")]
async fn the_tracked_copy_is_the_newest_version_of_the_same_pod() {
    let (_sim, provider, _dir) = provider_with_token().await;
    let at = |uid: &str, rv: &str, label: &str| {
        let mut p = pod_named("a", uid);
        p.metadata.resource_version = Some(rv.into());
        p.metadata
            .labels
            .get_or_insert_default()
            .insert("v".into(), label.into());
        Arc::new(p)
    };
    let label = |p: &Pod| p.metadata.labels.as_ref().and_then(|l| l.get("v").cloned());
    provider
        .create(&at("ua", "7", "seven"))
        .await
        .expect("claim");
    assert_eq!(
        label(&provider.tracked("ns/a").expect("tracked")).as_deref(),
        Some("seven")
    );

    // A later version replaces the tracked copy; an older one does not.
    provider.update_tracked(&at("ua", "9", "nine"));
    assert_eq!(
        label(&provider.tracked("ns/a").expect("tracked")).as_deref(),
        Some("nine")
    );
    provider.update_tracked(&at("ua", "8", "eight"));
    assert_eq!(
        label(&provider.tracked("ns/a").expect("tracked")).as_deref(),
        Some("nine")
    );
    // The same version replaces it (the cache's copy, shared with it).
    let cached = at("ua", "9", "nine-cached");
    provider.update_tracked(&cached);
    assert!(Arc::ptr_eq(
        &provider.tracked("ns/a").expect("tracked"),
        &cached
    ));
    // Another Pod under the key never does.
    provider.update_tracked(&at("ub", "99", "other"));
    assert_eq!(provider.tracked("ns/a").expect("tracked").uid(), "ua");

    // newest: the tracked copy when it is later, else the Pod asked about.
    let older = at("ua", "8", "eight");
    assert!(Arc::ptr_eq(&provider.newest(&older), &cached));
    let later = at("ua", "10", "ten");
    assert!(Arc::ptr_eq(&provider.newest(&later), &later));
    let same = at("ua", "9", "nine-again");
    assert!(Arc::ptr_eq(&provider.newest(&same), &same));
    let other = at("ub", "1", "other");
    assert!(Arc::ptr_eq(&provider.newest(&other), &other));
    let untracked = Arc::new(pod_named("zz", "uz"));
    assert!(Arc::ptr_eq(&provider.newest(&untracked), &untracked));
}

/// After an etcd restore the Pod's resourceVersions go back: the watch
/// cache shows versions older than our own last write, for good. The
/// tracked copy (that write) gives way once the cache has shown an older
/// version for a resync period; until then it is the echo still on its
/// way. Before, it stayed "newest" for ever and drift was never written
/// again until a restart.
#[tokio::test(flavor = "multi_thread")]
async fn an_older_version_cached_for_a_resync_period_replaces_the_tracked_copy() {
    let (_sim, provider, _dir) = provider_with_token().await;
    let at = |rv: &str| {
        let mut p = pod_named("a", "ua");
        p.metadata.resource_version = Some(rv.into());
        Arc::new(p)
    };
    provider.create(&at("7")).await.expect("claim");
    let written = at("1000");
    provider.update_tracked(&written);
    let t0 = Instant::now();
    // The restored history: versions below our write.
    let restored = at("900");
    provider.update_tracked_at(&restored, t0);
    assert!(
        Arc::ptr_eq(&provider.newest(&restored), &written),
        "the echo may lag"
    );
    provider.update_tracked_at(&restored, t0 + Duration::from_secs(30));
    assert!(Arc::ptr_eq(&provider.newest(&restored), &written));
    let later = at("901");
    provider.update_tracked_at(&later, t0 + crate::pods::pod::BEHIND_LIMIT);
    assert!(
        Arc::ptr_eq(&provider.newest(&later), &later),
        "the cache's history is the Pod's now"
    );
    assert!(Arc::ptr_eq(
        &provider.tracked("ns/a").expect("tracked"),
        &later
    ));
    // From then on the tracked copy follows the restored history, and an
    // older version caught up with is a fresh lag again.
    provider.update_tracked_at(&at("950"), t0 + crate::pods::pod::BEHIND_LIMIT * 2);
    let lagging = at("949");
    provider.update_tracked_at(&lagging, t0 + crate::pods::pod::BEHIND_LIMIT * 2);
    assert_eq!(
        provider
            .newest(&lagging)
            .metadata
            .resource_version
            .as_deref(),
        Some("950")
    );
}
