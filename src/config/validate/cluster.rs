//! `[cluster]`: the shared store that several gateway replicas use.

use std::time::Duration;

use super::EnvLookup;
use super::reader::{Reader, Table, Zero};
use super::url::UrlError;
use crate::config::policy::{ClusterPolicy, Secret, SentinelStore, StoreFailure};

pub(super) const CLUSTER_KEYS: &[&str] = &[
    "store",
    "password_env",
    "replica",
    "key_prefix",
    "sync_interval",
    "replica_ttl",
    "lease_ahead",
    "on_store_failure",
];
const FAILURE_MODES: &[(&str, StoreFailure)] = &[
    ("local", StoreFailure::Local),
    ("closed", StoreFailure::Closed),
];

/// Reads `[cluster]`; `None` when the section is absent.
pub(super) fn read_cluster(
    r: &mut Reader<'_>,
    root: &Table<'_, '_>,
    env: EnvLookup<'_>,
) -> Option<ClusterPolicy> {
    let t = r.opt(root, "cluster", Reader::table)?;
    r.check_keys(&t, CLUSTER_KEYS);
    let store = r.req(
        &t,
        "store",
        "the store's URL: redis://host:port, rediss://host:port (TLS), or redis+sentinel://host:port,host:port/name (the primary Redis Sentinel names)",
        |r, v, p| {
            let url = r.non_empty(v, p)?;
            match check_store_url(&url) {
                Ok(()) => Some(url),
                Err(e) => {
                    r.error(v.span(), p, e.to_string());
                    None
                }
            }
        },
    );
    let password = r.opt(&t, "password_env", |r, v, p| {
        let var = r.non_empty(v, p)?;
        match env(&var) {
            Some(pw) if !pw.is_empty() => Some(Secret(pw)),
            _ => {
                r.error(
                    v.span(),
                    p,
                    format!("environment variable `{var}` is not set or empty"),
                );
                None
            }
        }
    });
    let replica = r.opt(&t, "replica", |r, v, p| {
        let name = r.non_empty(v, p)?;
        if name.chars().all(|c| c.is_ascii_graphic()) {
            Some(name)
        } else {
            r.error(v.span(), p, "a replica name is visible ASCII, no spaces");
            None
        }
    });
    let key_prefix = r
        .opt(&t, "key_prefix", Reader::non_empty)
        .unwrap_or_else(|| "fairway".to_owned());
    let sync_interval = r
        .opt(&t, "sync_interval", |r, v, p| {
            r.duration(v, p, Zero::Refused)
        })
        .unwrap_or(Duration::from_secs(1));
    let replica_ttl = r
        .opt(&t, "replica_ttl", |r, v, p| {
            let ttl = r.duration(v, p, Zero::Refused)?;
            if ttl <= sync_interval {
                r.error(
                    v.span(),
                    p,
                    "must be longer than `sync_interval` (a live replica renews once per interval)",
                );
                return None;
            }
            Some(ttl)
        })
        .unwrap_or(sync_interval * 3);
    let lease_ahead = r
        .opt(&t, "lease_ahead", |r, v, p| {
            let ahead = r.duration(v, p, Zero::Refused)?;
            if ahead < sync_interval {
                r.error(
                    v.span(),
                    p,
                    "must be at least `sync_interval` (a lease lasts until the next sync)",
                );
                return None;
            }
            Some(ahead)
        })
        .unwrap_or(sync_interval * 2);
    let on_store_failure = r
        .opt(&t, "on_store_failure", |r, v, p| {
            r.choice(v, p, FAILURE_MODES)
        })
        .unwrap_or(StoreFailure::Local);
    Some(ClusterPolicy {
        store: store?,
        password,
        replica,
        key_prefix,
        sync_interval,
        replica_ttl,
        lease_ahead,
        on_store_failure,
    })
}

/// `redis://host[:port][/db]` or `rediss://…`, with no password in it (it
/// would show in `/admin/policy`; `password_env` holds it).
fn check_store_url(url: &str) -> Result<(), UrlError> {
    if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") {
        let Some(SentinelStore { hosts, .. }) = SentinelStore::parse(url) else {
            return Err(UrlError::NotSentinel {
                url: url.to_owned(),
            });
        };
        for h in &hosts {
            check_store_url(&format!("redis://{h}"))?;
        }
        return Ok(());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(UrlError::NotStoreUrl {
            url: url.to_owned(),
        });
    };
    if scheme != "redis" && scheme != "rediss" {
        return Err(UrlError::StoreScheme {
            scheme: scheme.to_owned(),
        });
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some((userinfo, _)) = authority.rsplit_once('@')
        && userinfo.contains(':')
    {
        return Err(UrlError::Password);
    }
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() || host.starts_with(':') {
        return Err(UrlError::NoHost {
            url: url.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_store_url;
    use crate::config::policy::SentinelStore;

    #[test]
    fn store_urls() {
        assert!(check_store_url("redis://127.0.0.1:6379").is_ok());
        assert!(check_store_url("rediss://cache.internal:6380/2").is_ok());
        assert!(check_store_url("redis://user@h:1").is_ok());
        assert!(check_store_url("redis://:pw@h:1").is_err());
        assert!(check_store_url("redis://u:pw@h:1").is_err());
        assert!(check_store_url("http://h:1").is_err());
        assert!(check_store_url("h:1").is_err());
        assert!(check_store_url("redis://:6379").is_err());
        assert!(check_store_url("redis+sentinel://s0:26379,s1:26379/fairway").is_ok());
        assert!(check_store_url("rediss+sentinel://s0:26379/fairway").is_ok());
        assert!(check_store_url("redis+sentinel://s0:26379").is_err());
        assert!(check_store_url("redis+sentinel://:pw@s0:26379/m").is_err());
        let s = SentinelStore::parse("redis+sentinel://s0:26379, s1:26379/fairway").unwrap();
        assert_eq!(
            (s.tls, s.hosts, s.name.as_str()),
            (false, vec!["s0:26379".into(), "s1:26379".into()], "fairway")
        );
        assert!(
            SentinelStore::parse("rediss+sentinel://s0:26379/m/")
                .unwrap()
                .tls
        );
        assert_eq!(SentinelStore::parse("redis://h:6379"), None);
        assert_eq!(SentinelStore::parse("redis+sentinel://s0:26379/"), None);
        assert_eq!(SentinelStore::parse("redis+sentinel:///m"), None);
    }
}
