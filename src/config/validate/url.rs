//! The URLs a policy names: backends' and collectors' `http://host:port`,
//! and the cluster store's `redis://…`. Each problem is a [`UrlError`],
//! whose message is the one the operator reads.

use std::net::Ipv6Addr;

/// What the operator is told a backend URL looks like.
const EXPECTED: &str = "expected http://host:port, e.g. \"http://10.0.0.5:8000\"";

/// Why a URL in the policy is not one Fairway takes: the policy's fault,
/// fixed only by editing it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// `https://`: TLS to backends is not built.
    #[error(
        "https backends are not supported yet (TLS to backends is not built); use http://host:port"
    )]
    Https,
    /// Not `http://`.
    #[error("{}", EXPECTED)]
    NotHttp,
    /// `user:password@` in a backend URL.
    #[error("credentials in the url are not supported; {}", EXPECTED)]
    Credentials,
    #[error("unclosed `[` in the host; {}", EXPECTED)]
    UnclosedBracket,
    /// A bracketed host that is not an IPv6 address.
    #[error("\"{ip}\" is not an IPv6 address")]
    NotIpv6 { ip: String },
    #[error("missing or invalid host; {}", EXPECTED)]
    BadHost,
    #[error("missing port; {}", EXPECTED)]
    NoPort,
    /// Not a port number from 1 to 65535.
    #[error("invalid port \"{port}\"; {}", EXPECTED)]
    BadPort { port: String },
    /// A path, query or fragment where Fairway adds the path itself.
    #[error(
        "a backend url has no path, query or fragment (found \"{tail}\"): Fairway adds the API path itself; {}",
        EXPECTED
    )]
    HasPath { tail: String },
    /// A Sentinel store URL without its hosts or the primary's name.
    #[error(
        "\"{url}\": expected redis+sentinel://host:port[,host:port…]/name (the sentinels, and the name they know the primary by)"
    )]
    NotSentinel { url: String },
    /// A store URL with no `scheme://`.
    #[error("\"{url}\" is not a URL; expected redis://host:port")]
    NotStoreUrl { url: String },
    /// A store URL of another scheme than Redis'.
    #[error(
        "scheme `{scheme}` is not supported; use redis://, rediss:// (TLS) or redis+sentinel://"
    )]
    StoreScheme { scheme: String },
    /// A password in the store's URL (it would show in `/admin/policy`).
    #[error("put the password in the variable `password_env` names, not in the URL")]
    Password,
    /// A store URL with no host.
    #[error("\"{url}\" has no host")]
    NoHost { url: String },
}

/// Parses `http://host:port[/]` into `host:port`.
pub(super) fn parse_http_url(url: &str) -> Result<String, UrlError> {
    let (authority, tail) = split_http_url(url)?;
    if !tail.is_empty() && tail != "/" {
        return Err(UrlError::HasPath {
            tail: tail.to_owned(),
        });
    }
    Ok(authority)
}

/// Splits `http://host:port<tail>` into a checked `host:port` and the tail
/// (path, query, fragment; possibly empty).
pub(super) fn split_http_url(url: &str) -> Result<(String, &str), UrlError> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return Err(UrlError::Https);
    }
    let Some(rest) = lower
        .starts_with("http://")
        .then(|| &url["http://".len()..])
    else {
        return Err(UrlError::NotHttp);
    };
    let (authority, tail) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err(UrlError::Credentials);
    }
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((ip, port)) = bracketed.split_once(']') else {
            return Err(UrlError::UnclosedBracket);
        };
        if ip.parse::<Ipv6Addr>().is_err() {
            return Err(UrlError::NotIpv6 { ip: ip.to_owned() });
        }
        (&authority[..ip.len() + 2], port.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let is_host_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
    if host.is_empty() || (!host.starts_with('[') && !host.chars().all(is_host_char)) {
        return Err(UrlError::BadHost);
    }
    let Some(port) = port.filter(|p| !p.is_empty()) else {
        return Err(UrlError::NoPort);
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((format!("{host}:{p}"), tail)),
        _ => Err(UrlError::BadPort {
            port: port.to_owned(),
        }),
    }
}
