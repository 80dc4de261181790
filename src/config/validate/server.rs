//! `[server]`: the client and admin listeners, their limits and timeouts,
//! TLS files, the trusted tenant header and the admin token.

use std::time::Duration;

use super::reader::{self, Reader, Table, Zero};
use super::{EnvLookup, tenants};
use crate::config::policy::{ServerPolicy, TlsPolicy};

pub(super) const SERVER_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "max_body_bytes",
    "max_upload_bytes",
    "drain_timeout",
    "trust_tenant_header",
    "trusted_hops",
    "tls",
    "max_connections",
    "max_connections_per_client",
    "max_requests",
    "header_read_timeout",
    "workers",
    "idle_timeout",
    "body_read_timeout",
    "admin_token_env",
    "cache_salt_secret_env",
    "admin_token_file",
    "admin_token_for_metrics",
];
/// Default `[server] max_connections`: open client connections.
const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default `[server] workers`: one per core.
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
/// Default `[server] max_requests`: client requests in flight at once.
const DEFAULT_MAX_REQUESTS: usize = 4096;
const TLS_KEYS: &[&str] = &["cert", "key"];

pub(super) fn read_server(
    r: &mut Reader<'_>,
    t: &Table<'_, '_>,
    env: EnvLookup<'_>,
) -> ServerPolicy {
    r.check_keys(t, SERVER_KEYS);
    let listen = r
        .opt(t, "listen", Reader::socket_addr)
        .unwrap_or_else(|| ([127, 0, 0, 1], 8080).into());
    let admin_listen = r
        .opt(t, "admin_listen", Reader::socket_addr)
        .unwrap_or_else(|| ([127, 0, 0, 1], 9090).into());
    // Port 0 asks the OS for a free port: two of those never collide.
    if listen == admin_listen
        && listen.port() != 0
        && let Some((value, path)) = t.get("admin_listen").or_else(|| t.get("listen"))
    {
        r.error(
            value.span(),
            &path,
            format!("admin_listen must differ from listen (both are {listen})"),
        );
    }
    ServerPolicy {
        listen,
        admin_listen,
        max_body_bytes: r
            .opt(t, "max_body_bytes", Reader::positive_int)
            .unwrap_or(10 * 1024 * 1024),
        max_upload_bytes: r
            .opt(t, "max_upload_bytes", Reader::positive_int)
            .unwrap_or(25 * 1024 * 1024),
        drain_timeout: r
            .opt(t, "drain_timeout", |r, v, p| {
                r.duration(v, p, Zero::Allowed)
            })
            .unwrap_or(Duration::from_secs(30)),
        trust_tenant_header: r.opt(t, "trust_tenant_header", read_header_name),
        trusted_hops: r
            .opt(t, "trusted_hops", Reader::non_negative_int)
            .unwrap_or(0),
        tls: r.opt(t, "tls", read_tls),
        max_connections: r
            .opt(t, "max_connections", Reader::positive_int)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS),
        max_connections_per_client: r.opt(t, "max_connections_per_client", Reader::positive_int),
        max_requests: r
            .opt(t, "max_requests", Reader::positive_int)
            .unwrap_or(DEFAULT_MAX_REQUESTS),
        header_read_timeout: r
            .opt(t, "header_read_timeout", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(10)),
        workers: r
            .opt(t, "workers", Reader::positive_int)
            .unwrap_or_else(default_workers),
        idle_timeout: r
            .opt(t, "idle_timeout", |r, v, p| r.duration(v, p, Zero::Refused))
            .unwrap_or(Duration::from_secs(60)),
        body_read_timeout: r
            .opt(t, "body_read_timeout", |r, v, p| {
                r.duration(v, p, Zero::Refused)
            })
            .unwrap_or(Duration::from_secs(30)),
        admin_token: read_admin_token(r, t, env),
        cache_salt_secret: r.opt(t, "cache_salt_secret_env", |r, v, p| {
            secret_from_env(r, v, p, env)
        }),
        admin_token_for_metrics: r
            .opt(t, "admin_token_for_metrics", Reader::boolean)
            .unwrap_or(false),
    }
}

/// A lowercase HTTP header name (RFC 9110 token characters).
fn read_header_name(r: &mut Reader<'_>, v: &reader::Value<'_>, path: &str) -> Option<String> {
    let name = r.non_empty(v, path)?;
    let is_tchar = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !name.chars().all(is_tchar) {
        r.error(
            v.span(),
            path,
            format!(
                "\"{name}\" is not a valid HTTP header name (letters, digits and -, no spaces)"
            ),
        );
        return None;
    }
    if name.chars().any(|c| c.is_ascii_uppercase()) {
        r.error(
            v.span(),
            path,
            format!(
                "header names must be lowercase; write \"{}\"",
                name.to_ascii_lowercase()
            ),
        );
        return None;
    }
    Some(name)
}

/// The SHA-256 of the secret in the environment variable `v` names; an
/// error where it is unset or empty.
fn secret_from_env(
    r: &mut Reader<'_>,
    v: &reader::Value<'_>,
    p: &str,
    env: EnvLookup<'_>,
) -> Option<[u8; 32]> {
    let var = r.non_empty(v, p)?;
    match env(&var).map(|k| k.trim().to_owned()) {
        Some(secret) if !secret.is_empty() => Some(tenants::sha256(&secret)),
        _ => {
            r.error(
                v.span(),
                p,
                format!("environment variable `{var}` is not set or empty"),
            );
            None
        }
    }
}

/// The admin token's SHA-256, from `admin_token_env` (a variable's name)
/// or `admin_token_file` (a file holding the token; relative to the policy
/// file's directory; read again at each reload, so replacing the file and
/// reloading rotates the token).
fn read_admin_token(r: &mut Reader<'_>, t: &Table<'_, '_>, env: EnvLookup<'_>) -> Option<[u8; 32]> {
    let from_env = r.opt(t, "admin_token_env", |r, v, p| {
        secret_from_env(r, v, p, env)
    });
    let from_file = r.opt(t, "admin_token_file", |r, v, p| {
        let name = r.non_empty(v, p)?;
        let file = std::path::Path::new(&name);
        let file = match std::path::Path::new(r.file()).parent() {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file.to_path_buf(),
        };
        // At most 4 KiB: a token, not whatever the path points at.
        let mut text = String::new();
        let read = std::fs::File::open(&file).and_then(|f| {
            std::io::Read::read_to_string(&mut std::io::Read::take(f, 4096), &mut text)
        });
        match read {
            Ok(_) if !text.trim().is_empty() => Some(tenants::sha256(text.trim())),
            Ok(_) => {
                r.error(v.span(), p, format!("`{}` is empty", file.display()));
                None
            }
            Err(e) => {
                r.error(
                    v.span(),
                    p,
                    format!("cannot read `{}`: {e}", file.display()),
                );
                None
            }
        }
    });
    if from_env.is_some()
        && let Some((v, p)) = t.get("admin_token_file")
    {
        r.error(
            v.span(),
            &p,
            "set `admin_token_env` or `admin_token_file`, not both",
        );
    }
    from_env.or(from_file)
}

pub(super) fn read_tls(r: &mut Reader<'_>, v: &reader::Value<'_>, path: &str) -> Option<TlsPolicy> {
    let t = r.table(v, path)?;
    r.check_keys(&t, TLS_KEYS);
    let cert = r.req(
        &t,
        "cert",
        "path to the PEM certificate chain",
        Reader::non_empty,
    );
    let key = r.req(&t, "key", "path to the PEM private key", Reader::non_empty);
    Some(TlsPolicy {
        cert: cert?.into(),
        key: key?.into(),
    })
}
