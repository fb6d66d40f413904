//! The one rustls crypto provider (ring) for kube, reqwest and the servers.

/// Installs ring as the process-wide rustls provider. Installing twice is
/// harmless: the first one stays; returns whether this call installed it.
pub fn install_provider() -> bool {
    rustls::crypto::CryptoProvider::get_default().is_none()
        && rustls::crypto::ring::default_provider()
            .install_default()
            .is_ok()
}
