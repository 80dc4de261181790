//! Tenants' prefix caches kept apart by the gateway.
//!
//! An engine's prefix cache is shared by every request it serves, and a
//! hit shows in the time to the first token: a tenant can tell whether
//! another sent a prompt (vLLM's advisory GHSA-4qjh-9fv9-r85r,
//! CVE-2025-46570). vLLM's `cache_salt` keeps requests with different
//! salts from sharing any block, but a client can set it to anything,
//! another tenant's salt included: only the gateway, which knows the
//! tenant, can set it so that it isolates.
//!
//! Each tenant's requests are salted into its namespace (`prefix_cache`
//! in the policy: its own, a named group, or none): the salt is a digest
//! of the namespace and the client's own salt, so that a client's salt
//! still separates its own requests and never reaches another
//! namespace's blocks (no client salt makes one namespace's digest equal
//! another's). The prefix index keys requests by the same salt, so it
//! follows the same namespaces. Replicas of one policy compute the same
//! salts, so they share each tenant's cached prefixes. An optional secret
//! (`cache_salt_secret_env`) also keeps the salts from whoever could reach
//! the engines without the gateway and knows a namespace's name.

use sha2::{Digest, Sha256};

/// The salt of a request in `namespace` whose client sent `client`, under
/// the policy's `secret` if it has one: 32 hex digits.
pub fn salt(secret: Option<&[u8; 32]>, namespace: &str, client: Option<&str>) -> String {
    let mut h = Sha256::new();
    h.update(b"fairway cache_salt\0");
    if let Some(secret) = secret {
        h.update(secret);
    }
    // Length-prefixed parts: no two (namespace, salt) pairs hash alike.
    for part in [Some(namespace), client] {
        match part {
            Some(p) => {
                h.update((p.len() as u64).to_le_bytes());
                h.update(p.as_bytes());
            }
            None => h.update(u64::MAX.to_le_bytes()),
        }
    }
    crate::hex::hex(&h.finalize()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_and_client_salts_never_meet() {
        let s = Some(&[7u8; 32]);
        let a = salt(s, "tenant:a", None);
        assert_eq!(a, salt(s, "tenant:a", None));
        assert_eq!(a.len(), 32);
        assert_ne!(a, salt(s, "tenant:b", None));
        // A client's salt separates its own requests, inside its namespace.
        assert_ne!(a, salt(s, "tenant:a", Some("x")));
        assert_ne!(
            salt(s, "tenant:a", Some("x")),
            salt(s, "tenant:b", Some("x"))
        );
        // No splice of the parts collides.
        assert_ne!(salt(s, "tenant:ab", None), salt(s, "tenant:a", Some("b")));
        // The secret matters; without one, replicas still agree.
        assert_ne!(a, salt(Some(&[8u8; 32]), "tenant:a", None));
        assert_eq!(salt(None, "tenant:a", None), salt(None, "tenant:a", None));
        assert_ne!(salt(None, "tenant:a", None), salt(None, "tenant:b", None));
    }
}
