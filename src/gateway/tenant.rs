//! Which tenant a request belongs to: its API key (stored as SHA-256
//! digests, compared in constant time), or the operator's trusted tenant
//! header, or the one "default" tenant when the policy declares none.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::core::ids::TenantId;
use crate::gateway::live_policy::Live;
use crate::protocol::error::ApiError;

/// Finds the tenant: API key (Bearer, `api-key`, or Anthropic's
/// `x-api-key`), or the trusted tenant
/// header when the operator enabled it, or "default" when no tenants exist.
pub fn authenticate(live: &Live, headers: &HeaderMap) -> Result<TenantId, ApiError> {
    if let Some(t) = live.default_tenant {
        return Ok(t);
    }
    if let Some(h) = &live.policy.server.trust_tenant_header
        && let Some(name) = headers.get(h.as_str()).and_then(|v| v.to_str().ok())
    {
        return live
            .tenant_names
            .get(name)
            .copied()
            .ok_or(ApiError::Auth("Unknown tenant in trusted tenant header."));
    }
    let key = crate::net::headers::bearer(headers)
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .ok_or(ApiError::Auth(
            "Missing API key. Send `Authorization: Bearer KEY`.",
        ))?;
    // Keys are stored as SHA-256 digests: the lookup is on the digest, and
    // the final comparison is constant-time, so timing reveals nothing about
    // the stored keys.
    let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    match live.keys.get_key_value(&digest) {
        Some((stored, t)) if constant_time_eq(stored, &digest) => Ok(*t),
        _ => Err(ApiError::Auth("Incorrect API key provided.")),
    }
}

/// Compares two digests in constant time.
pub(crate) fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
