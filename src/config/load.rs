//! Loading a policy file from disk: read it, append the tenant resources
//! it names, validate it, and resolve its relative paths.

use std::path::Path;

use super::file::ConfigError;
use super::policy::Policy;

/// Reads and validates the policy file at `path`, returning the policy and
/// the source text (kept for reload diffs and `/admin/policy`): the file
/// with the tenant resources it names appended ([`read_source`]).
///
/// An unreadable file is one error at 1:1. Relative TLS paths are resolved
/// against the policy file's directory, so a policy means the same thing
/// whatever the working directory of `fairway serve`.
pub fn load_policy(path: &Path) -> Result<(Policy, String), Vec<ConfigError>> {
    load_policy_with_env(path, &|name| std::env::var(name).ok())
}

/// [`load_policy`] with the environment `env` instead of the process's
/// (for `api_key_env` and the admin token's variable).
pub fn load_policy_with_env(
    path: &Path,
    env: super::validate::EnvLookup<'_>,
) -> Result<(Policy, String), Vec<ConfigError>> {
    let file = path.display().to_string();
    let source = read_source(path)?;
    let mut policy = super::validate::parse_policy_with_env(&source.text, &file, env)
        .map_err(|errors| super::resources::relocate(&source, errors))?;
    if let Some(dir) = path.parent() {
        let tls = [policy.server.tls.as_mut(), policy.placement.tls.as_mut()];
        for tls in tls.into_iter().flatten() {
            if tls.cert.is_relative() {
                tls.cert = dir.join(&tls.cert);
            }
            if tls.key.is_relative() {
                tls.key = dir.join(&tls.key);
            }
        }
    }
    Ok((policy, source.text))
}

/// The policy file at `path` with the `TokenBucketAdmission` resources its
/// `tenant_resources` names appended as `[[tenants]]` tables
/// ([`super::resources`]): what [`load_policy`] validates and reload hashes.
pub fn read_source(path: &Path) -> Result<super::resources::Source, Vec<ConfigError>> {
    let text = std::fs::read_to_string(path).map_err(|err| {
        vec![ConfigError {
            file: path.display().to_string(),
            line: 1,
            column: 1,
            path: String::new(),
            message: format!("cannot read the policy file: {err}"),
        }]
    })?;
    super::resources::expand(path, text)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn repo(path: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
    }

    fn temp(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("fairway-resources-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The CRD example is the same policy as config/acme-corp.toml.
    #[test]
    fn the_admission_resource_is_the_same_policy_as_its_toml_twin() {
        let toml_path = repo("config/acme-corp.toml");
        let text = std::fs::read_to_string(&toml_path).unwrap();
        let (before_tenants, _) = text.split_once("\n[[tenants]]").unwrap();
        let yaml = repo("deploy/kubernetes/examples/tokenbucketadmission-acme-corp.yaml");
        let twin = format!(
            "tenant_resources = [\"{}\"]\n{before_tenants}",
            yaml.display()
        );
        let twin_path = temp("twin").join("acme-corp.toml");
        std::fs::write(&twin_path, twin).unwrap();
        let (from_toml, _) = load_policy(&toml_path).unwrap();
        let (from_yaml, source) = load_policy(&twin_path).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(from_yaml, from_toml);
        assert!(
            source.contains("# TokenBucketAdmission acme-corp from"),
            "{source}"
        );
    }

    #[test]
    fn resource_errors_name_the_file_the_resource_and_the_crd_field() {
        let dir = temp("errors");
        let policy = dir.join("p.toml");
        std::fs::write(
            &policy,
            "tenant_resources = [\"tenants.d\"]\n[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://127.0.0.1:9\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(dir.join("tenants.d")).unwrap();
        let good = "apiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nmetadata: {name: ok}\n\
                    spec: {apiKeySha256: [246c6a889938d703aa7ba351c2a6abcbba304db0c338c25b9939a23cafb13851]}\n";
        let bad_rate = "apiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nmetadata: {name: neg}\n\
                        spec:\n  apiKeySha256: [146c6a889938d703aa7ba351c2a6abcbba304db0c338c25b9939a23cafb13851]\n  perTenantRate: -1\n";
        std::fs::write(
            dir.join("tenants.d/a.yaml"),
            format!("{good}---\n{bad_rate}"),
        )
        .unwrap();
        let errors = load_policy(&policy).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        let e = &errors[0];
        assert!(e.file.ends_with("tenants.d/a.yaml"), "{e}");
        assert_eq!(
            (e.line, e.path.as_str()),
            (6, "TokenBucketAdmission neg: spec.perTenantRate"),
            "{e}"
        );

        for (yaml, line, path, message) in [
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
                1,
                "kind",
                "expected apiVersion slo.fairway.dev/v1",
            ),
            (
                "apiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nmetadata: {name: x}\nspec: {perTenantRat: 5}\n",
                1,
                "TokenBucketAdmission x: spec.perTenantRat",
                "unknown field",
            ),
            (
                "apiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nspec: {}\n",
                1,
                "metadata.name",
                "needs a name",
            ),
            (
                "# keys\napiVersion: slo.fairway.dev/v1\nkind: TokenBucketAdmission\nmetadata: {name: nokey}\nspec: {weight: 2}\n",
                2,
                "TokenBucketAdmission nokey: spec",
                "no API key",
            ),
            ("a: [1\n", 2, "", "not YAML"),
        ] {
            std::fs::write(dir.join("tenants.d/a.yaml"), yaml).unwrap();
            let errors = load_policy(&policy).unwrap_err();
            assert_eq!(errors.len(), 1, "{yaml}: {errors:?}");
            let e = &errors[0];
            assert!(
                e.line == line && e.path == path && e.message.contains(message),
                "{yaml}: {e}"
            );
        }
        std::fs::remove_dir_all(dir.join("tenants.d")).unwrap();
        let errors = load_policy(&policy).unwrap_err();
        assert!(
            errors[0].message.contains("cannot read tenant resources"),
            "{errors:?}"
        );
    }
}
