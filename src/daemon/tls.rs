//! TLS to the broker: rustls with the ring provider, the CA file of the configuration as the
//! only trust root, and an optional client certificate.

use super::config::TlsConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// Most bytes of one PEM file read (a CA bundle is far smaller).
const MAX_PEM_BYTES: u64 = 1 << 20;

fn read_pem(key: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{key} {}: {e}", path.display()))?
        .len();
    if len > MAX_PEM_BYTES {
        return Err(format!(
            "{key} {}: {len} bytes is too large for a PEM file",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("{key} {}: {e}", path.display()))
}

/// The client configuration for `t`; errors name the key and the file.
pub fn client_config(t: &TlsConfig) -> Result<Arc<rustls::ClientConfig>, String> {
    let ca = read_pem("mqtt.tls.ca_file", &t.ca_file)?;
    let mut roots = rustls::RootCertStore::empty();
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| format!("mqtt.tls.ca_file {}: {e}", t.ca_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("mqtt.tls.ca_file {}: {e}", t.ca_file.display()))?;
        n += 1;
    }
    if n == 0 {
        return Err(format!(
            "mqtt.tls.ca_file {}: no certificate in it",
            t.ca_file.display()
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let cfg = match (&t.cert_file, &t.key_file) {
        (Some(cert), Some(key)) => {
            let pem = read_pem("mqtt.tls.cert_file", cert)?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("mqtt.tls.cert_file {}: {e}", cert.display()))?;
            let key_pem = read_pem("mqtt.tls.key_file", key)?;
            let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                .map_err(|e| format!("mqtt.tls.key_file {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("mqtt.tls.cert_file / key_file: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}
