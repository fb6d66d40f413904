//! Serving certificate of the kubelet API (docs/architecture.md,
//! "Kubelet API"; `#decision-kubelet-api`).
//!
//! When `--tls-cert` and `--tls-key` both name regular files the pair is
//! loaded (a parse failure is a start-up error); otherwise a self-signed
//! ECDSA P-256 certificate is generated in memory. The current certificate
//! sits behind [`ReloadingResolver`]; [`KubeletTls::watch`] polls the files
//! and swaps in a new pair when they change, so new connections see it
//! without a restart. A bad new pair keeps the old certificate (and is
//! logged and counted).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls::RootCertStore;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::TlsFiles;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::periodic::{Beat, First, Next, Periodic, Turn};

/// How often the certificate files are checked for changes.
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(5);

/// The crypto provider of every server here (ring, the one the whole
/// process uses).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Hands rustls the current certificate; swapped on reload.
#[derive(Debug)]
pub struct ReloadingResolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingResolver {
    pub fn new(key: CertifiedKey) -> Self {
        ReloadingResolver {
            current: RwLock::new(Arc::new(key)),
        }
    }

    /// The certificate new handshakes get.
    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    pub fn set(&self, key: CertifiedKey) {
        let key = Arc::new(key);
        match self.current.write() {
            Ok(mut g) => *g = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Load a PEM certificate chain and private key into a rustls key,
/// checking the key matches the leaf.
pub fn load_pair(cert_path: &Path, key_path: &Path) -> std::result::Result<CertifiedKey, String> {
    let cert_pem = std::fs::read(cert_path)
        .map_err(|e| format!("read --tls-cert {}: {e}", cert_path.display()))?;
    let key_pem = std::fs::read(key_path)
        .map_err(|e| format!("read --tls-key {}: {e}", key_path.display()))?;
    pair_from_pem(&cert_pem, &key_pem).map_err(|e| {
        format!(
            "--tls-cert {} / --tls-key {}: {e}",
            cert_path.display(),
            key_path.display()
        )
    })
}

/// [`load_pair`] on bytes already read.
pub fn pair_from_pem(cert_pem: &[u8], key_pem: &[u8]) -> std::result::Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| format!("the certificate is not valid PEM: {e}"))?;
    if chain.is_empty() {
        return Err("the certificate file holds no CERTIFICATE block".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("the key file holds no usable PEM private key: {e}"))?;
    CertifiedKey::from_der(chain, key, &provider())
        .map_err(|e| format!("the key does not fit the certificate or is unsupported: {e}"))
}

/// Both paths set and both regular files (a half-configured pair is a
/// configuration error, not a reason to self-sign).
pub fn usable_pair(files: &TlsFiles) -> Option<(PathBuf, PathBuf)> {
    let (cert, key) = (files.cert.as_ref()?, files.key.as_ref()?);
    let regular = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
    (regular(cert) && regular(key)).then(|| (cert.clone(), key.clone()))
}

/// A self-signed serving certificate: ECDSA P-256, CN
/// `vk-sandbox`, random 128-bit serial, valid from now − 1 h for 3650 days,
/// digitalSignature + serverAuth, CA=false, SANs node name (DNS or IP),
/// node IP (IP, else DNS; skipped when empty) and 127.0.0.1. Returns the
/// key and the certificate PEM.
pub fn self_signed(node_name: &str, node_ip: Option<&str>) -> Result<(CertifiedKey, String)> {
    let fail = |what: &str, e: rcgen::Error| {
        Error::Config(format!(
            "self-signing the kubelet serving certificate: {what}: {e}"
        ))
    };
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| fail("key generation", e))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "vk-sandbox");
    params.distinguished_name = dn;
    let mut sans = Vec::new();
    for name in std::iter::once(node_name)
        .chain(node_ip.filter(|ip| !ip.is_empty()))
        .chain(std::iter::once("127.0.0.1"))
    {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(
                name.try_into()
                    .map_err(|e| fail(&format!("SAN {name:?} (from --node-name/--node-ip)"), e))?,
            ),
        };
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    params.subject_alt_names = sans;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.is_ca = IsCa::ExplicitNoCa;
    let mut serial: [u8; 16] = rand::random();
    serial[0] &= 0x7f; // positive
    serial[0] |= 0x01; // and exactly 16 bytes long
    params.serial_number = Some(SerialNumber::from_slice(&serial));
    let cert = params.self_signed(&key).map_err(|e| fail("signing", e))?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let certified = CertifiedKey::from_der(vec![cert.der().clone()], key_der, &provider())
        .map_err(|e| Error::Internal(format!("self-signed kubelet certificate unusable: {e}")))?;
    Ok((certified, cert.pem()))
}

/// Size, mtime, inode and device of a file (following symlinks), to notice
/// replacement by rename or rewrite in place.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fingerprint(Option<(u64, Option<SystemTime>, u64, u64)>);

fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    Fingerprint(
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.len(), m.modified().ok(), m.ino(), m.dev())),
    )
}

/// The kubelet API's TLS material (and the placement webhook's, which is
/// managed the same way: [`KubeletTls::from_files`]).
#[derive(Debug, Clone)]
pub struct KubeletTls {
    resolver: Arc<ReloadingResolver>,
    /// The configured pair, watched for changes (both flags non-empty).
    files: Option<(PathBuf, PathBuf)>,
    self_signed: bool,
    /// Whose certificate, in logs: "kubelet" or "webhook".
    role: &'static str,
}

impl KubeletTls {
    /// Load `--tls-cert/--tls-key` when both are regular files (parse
    /// failure = error), else self-sign for `node_name`/`node_ip`.
    #[tracing::instrument(skip_all, fields(node = node_name))]
    pub fn init(files: &TlsFiles, node_name: &str, node_ip: Option<&str>) -> Result<KubeletTls> {
        let watched = match (&files.cert, &files.key) {
            (Some(c), Some(k)) => Some((c.clone(), k.clone())),
            _ => None,
        };
        if let Some((cert, key)) = usable_pair(files) {
            let pair = load_pair(&cert, &key).map_err(|e| {
                Error::Config(format!(
                    "{e}; fix the files or unset --tls-cert/--tls-key (env VK_TLS_CERT/VK_TLS_KEY) \
                     to self-sign"
                ))
            })?;
            tracing::info!(cert = %cert.display(), key = %key.display(), "kubelet serving certificate loaded");
            return Ok(KubeletTls {
                resolver: Arc::new(ReloadingResolver::new(pair)),
                files: watched,
                self_signed: false,
                role: "kubelet",
            });
        }
        tracing::info!("kubelet cert absent; self-signing");
        let (pair, _) = self_signed(node_name, node_ip)?;
        Ok(KubeletTls {
            resolver: Arc::new(ReloadingResolver::new(pair)),
            files: watched,
            self_signed: true,
            role: "kubelet",
        })
    }

    /// A pair that must be given, loaded and then watched like the
    /// kubelet API's, never self-signed: the placement webhook's, which
    /// the apiserver verifies against the `caBundle` of its
    /// configuration (docs/placement.md). `role` names it in logs.
    pub fn from_files(cert: &Path, key: &Path, role: &'static str) -> Result<KubeletTls> {
        let pair =
            load_pair(cert, key).map_err(|e| Error::Config(format!("{role} certificate: {e}")))?;
        tracing::info!(cert = %cert.display(), key = %key.display(), role, "serving certificate loaded");
        Ok(KubeletTls {
            resolver: Arc::new(ReloadingResolver::new(pair)),
            files: Some((cert.to_path_buf(), key.to_path_buf())),
            self_signed: false,
            role,
        })
    }

    /// Wrap an already-built key (tests, or a caller with its own source).
    pub fn from_key(key: CertifiedKey) -> KubeletTls {
        KubeletTls {
            resolver: Arc::new(ReloadingResolver::new(key)),
            files: None,
            self_signed: false,
            role: "kubelet",
        }
    }

    pub fn resolver(&self) -> Arc<ReloadingResolver> {
        Arc::clone(&self.resolver)
    }

    /// Whether the current certificate was generated in memory.
    pub fn is_self_signed(&self) -> bool {
        self.self_signed
    }

    /// The rustls server configuration: TLS 1.2 and 1.3, ALPN h2 and
    /// http/1.1, this certificate, and — when `client_roots` is given —
    /// client certificates requested (not required) and verified against
    /// those roots.
    pub fn server_config(
        &self,
        client_roots: Option<Arc<RootCertStore>>,
    ) -> Result<Arc<rustls::ServerConfig>> {
        let provider = provider();
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| Error::Internal(format!("kubelet TLS versions: {e}")))?;
        let builder = match client_roots {
            Some(roots) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| Error::Internal(format!("kubelet client CA unusable: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(self.resolver());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Poll the configured files every `interval` until `stop` is
    /// cancelled; on a change load the pair and swap it in. Returns at once
    /// when no pair is configured. A pair that fails to load keeps the
    /// current certificate.
    pub async fn watch(self, interval: Duration, metrics: Arc<Metrics>, stop: CancellationToken) {
        let Some((cert, key)) = self.files.clone() else {
            return;
        };
        let span = tracing::info_span!("cert_watch", role = self.role, cert = %cert.display(), key = %key.display());
        let seen = (fingerprint(&cert), fingerprint(&key));
        let watch = CertWatch {
            resolver: self.resolver,
            cert,
            key,
            role: self.role,
            metrics,
            seen,
            last_failed: None,
        };
        // The first look is one period in: the pair was just loaded.
        let name = if self.role == "kubelet" {
            "kubelet certificate watch"
        } else {
            "webhook certificate watch"
        };
        Periodic::new(name, interval)
            .first(First::AfterPeriod)
            .run(None, &stop, watch)
            .instrument(span)
            .await
    }
}

/// The certificate files, polled for a change.
struct CertWatch {
    resolver: Arc<ReloadingResolver>,
    cert: PathBuf,
    key: PathBuf,
    role: &'static str,
    metrics: Arc<Metrics>,
    /// The files as last loaded.
    seen: (Fingerprint, Fingerprint),
    /// The files as they were when loading last failed (logged once).
    last_failed: Option<(Fingerprint, Fingerprint)>,
}

impl Turn for CertWatch {
    async fn turn(&mut self, _: &Beat) -> Next {
        let now = (fingerprint(&self.cert), fingerprint(&self.key));
        if now == self.seen {
            return Next::Period;
        }
        let regular = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
        if !(regular(&self.cert) && regular(&self.key)) {
            if self.last_failed.as_ref() != Some(&now) {
                tracing::warn!(
                    role = self.role,
                    "certificate files missing or not regular files; keeping the current certificate"
                );
                self.last_failed = Some(now);
            }
            return Next::Period;
        }
        match load_pair(&self.cert, &self.key) {
            Ok(pair) => {
                self.resolver.set(pair);
                self.seen = now;
                self.last_failed = None;
                self.metrics.cert_reloaded(true);
                tracing::info!(role = self.role, "serving certificate reloaded");
            }
            Err(e) => {
                // Often a half-written rotation: retried on the next
                // change, logged once per distinct state.
                if self.last_failed.as_ref() != Some(&now) {
                    self.metrics.cert_reloaded(false);
                    tracing::warn!(error = %e, role = self.role, "certificate reload failed; keeping the current certificate");
                    self.last_failed = Some(now);
                }
            }
        }
        Next::Period
    }
}

/// Parse a PEM CA bundle into client-certificate roots. `source` names
/// where it came from for messages.
pub fn roots_from_pem(pem: &[u8], source: &str) -> Result<Arc<RootCertStore>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("client CA from {source} is not valid PEM: {e}")))?;
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(Error::Config(format!(
            "client CA from {source} holds no usable certificate ({ignored} ignored); give a PEM \
             CA bundle with --client-ca-file (env VK_CLIENT_CA_FILE) or turn kubelet API auth off \
             with --kubelet-auth=false"
        )));
    }
    if ignored > 0 {
        tracing::warn!(
            source,
            ignored,
            "some client CA certificates could not be parsed"
        );
    }
    Ok(Arc::new(roots))
}

#[cfg(test)]
mod tests;
