//! Tenants kept as `TokenBucketAdmission` resources (the admission CRD of
//! the field guide, `deploy/kubernetes/crd/`), in YAML files the policy
//! names with `tenant_resources = ["tenants.yaml", "tenants.d"]` (paths
//! relative to the policy file; a folder means its `*.yaml` and `*.yml`
//! files in name order).
//!
//! Each resource becomes a `[[tenants]]` table appended to the policy text,
//! so that it passes the very same validation as a tenant written in TOML.
//! Errors found there are moved back to the YAML file and the resource, with
//! the CRD's field names. The text returned is what reload hashes, so an
//! edit to a resource file reloads the policy like an edit to the policy.
//!
//! Files are read, not the API server: the gateway needs no Kubernetes
//! credentials, and operators keep one source of truth with one validation
//! (`fairway check`) and one hot reload (deploy/kubernetes/README.md).

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use super::file::ConfigError;

/// The resource's `apiVersion` and `kind`.
pub const API_VERSION: &str = "slo.fairway.dev/v1";
pub const KIND: &str = "TokenBucketAdmission";

/// `spec` field → `[[tenants]]` key. `namespaceSelector` is accepted and
/// not used: the gateway tells tenants apart by API key, not namespace.
const FIELDS: &[(&str, &str)] = &[
    ("perTenantRate", "rate"),
    ("perTenantBurst", "burst"),
    ("gpuSecondsPerHour", "gpu_seconds_per_hour"),
    ("maxConcurrency", "max_concurrency"),
    ("weight", "weight"),
    ("priority", "priority"),
    ("apiKeyEnv", "api_key_env"),
    ("apiKeySha256", "api_key_sha256"),
    ("slo", "slo"),
    ("onLate", "on_late"),
    ("adapters", "adapters"),
];
const IGNORED: &[&str] = &["namespaceSelector"];

/// The policy text with its resources appended, and where each came from.
#[derive(Clone, Debug, Default)]
pub struct Source {
    pub text: String,
    blocks: Vec<Block>,
}

/// The lines of `text` one resource became.
#[derive(Clone, Debug)]
struct Block {
    lines: std::ops::RangeInclusive<usize>,
    file: String,
    line: usize,
    name: String,
}

/// The policy text `text` (read from `path`) with the resources its
/// `tenant_resources` names appended as `[[tenants]]` tables.
pub fn expand(path: &Path, text: String) -> Result<Source, Vec<ConfigError>> {
    let names = listed(&text);
    let mut source = Source {
        text,
        blocks: Vec::new(),
    };
    if names.is_empty() {
        return Ok(source);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut errors = Vec::new();
    for name in names {
        let at = dir.join(&name);
        match files(&at) {
            Ok(files) => {
                for file in files {
                    if let Err(mut e) = append_file(&mut source, &file) {
                        errors.append(&mut e);
                    }
                }
            }
            Err(e) => {
                let message = format!("cannot read tenant resources: {e}");
                errors.push(error(&at.display().to_string(), 1, 1, "", message));
            }
        }
    }
    if errors.is_empty() {
        Ok(source)
    } else {
        Err(errors)
    }
}

/// Moves errors found in the appended tables to their resource.
pub fn relocate(source: &Source, errors: Vec<ConfigError>) -> Vec<ConfigError> {
    errors
        .into_iter()
        .map(
            |e| match source.blocks.iter().find(|b| b.lines.contains(&e.line)) {
                Some(b) => {
                    // `tenants[3].rate` → `spec.perTenantRate`.
                    let key = e.path.split_once("].").map_or("", |(_, k)| k);
                    let top = key.split(['.', '[']).next().unwrap_or("");
                    let field = FIELDS
                        .iter()
                        .find(|(_, k)| *k == top)
                        .map(|(f, _)| format!("spec.{f}{}", &key[top.len()..]))
                        .unwrap_or_else(|| "spec".to_owned());
                    ConfigError {
                        file: b.file.clone(),
                        line: b.line,
                        column: 1,
                        path: format!("{KIND} {}: {field}", b.name),
                        message: e.message,
                    }
                }
                None => e,
            },
        )
        .collect()
}

/// `tenant_resources` of the TOML text, if it reads as a list of strings
/// (the validator reports anything else).
fn listed(text: &str) -> Vec<String> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    match table.get("tenant_resources") {
        Some(toml::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// A file, or a folder's YAML files in name order.
fn files(at: &Path) -> std::io::Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(at)?;
    if !meta.is_dir() {
        return Ok(vec![at.to_owned()]);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(at)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    found.sort();
    Ok(found)
}

fn error(file: &str, line: usize, column: usize, path: &str, message: String) -> ConfigError {
    ConfigError {
        file: file.to_owned(),
        line,
        column,
        path: path.to_owned(),
        message,
    }
}

/// The 1-based line where each YAML document of `text` starts (the first
/// one at its first line that is not a comment).
fn document_lines(text: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut content_seen = false;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            starts.push(i + 2);
            content_seen = true;
        } else if !content_seen && !trimmed.is_empty() && !trimmed.starts_with('#') {
            starts.push(i + 1);
            content_seen = true;
        }
    }
    starts
}

fn append_file(source: &mut Source, path: &Path) -> Result<(), Vec<ConfigError>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![error(
            &file,
            1,
            1,
            "",
            format!("cannot read tenant resources: {e}"),
        )]
    })?;
    let starts = document_lines(&text);
    let mut errors = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let line = starts.get(i).copied().unwrap_or(1);
        let value = match <Json as serde::Deserialize>::deserialize(doc) {
            Ok(Json::Null) => continue,
            Ok(v) => v,
            Err(e) => {
                let (l, c) = e.location().map_or((line, 1), |l| (l.line(), l.column()));
                errors.push(error(&file, l, c, "", format!("not YAML: {e}")));
                break;
            }
        };
        match tenant(&value) {
            Ok((name, table)) => {
                let first = source.text.lines().count() + 2;
                let mut doc = toml::Table::new();
                doc.insert("tenants".into(), toml::Value::Array(vec![table.into()]));
                let block = toml::to_string(&doc).unwrap_or_default();
                source
                    .text
                    .push_str(&format!("\n# {KIND} {name} from {file}\n{block}"));
                let last = source.text.lines().count();
                source.blocks.push(Block {
                    lines: first..=last,
                    file: file.clone(),
                    line,
                    name,
                });
            }
            Err((path, message)) => errors.push(error(&file, line, 1, &path, message)),
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// One resource as a `[[tenants]]` table, or the field and what is wrong.
fn tenant(doc: &Json) -> Result<(String, toml::Table), (String, String)> {
    let str_at = |p: &str| doc.pointer(p).and_then(Json::as_str);
    if str_at("/apiVersion") != Some(API_VERSION) || str_at("/kind") != Some(KIND) {
        return Err((
            "kind".into(),
            format!(
                "expected apiVersion {API_VERSION}, kind {KIND}; got {}, {}",
                str_at("/apiVersion").unwrap_or("none"),
                str_at("/kind").unwrap_or("none")
            ),
        ));
    }
    let name = str_at("/metadata/name")
        .filter(|n| !n.is_empty())
        .ok_or((
            "metadata.name".to_owned(),
            "a resource needs a name (the tenant's)".to_owned(),
        ))?
        .to_owned();
    let at = |field: &str| format!("{KIND} {name}: {field}");
    let Some(spec) = doc.get("spec").and_then(Json::as_object) else {
        return Err((
            at("spec"),
            "expected a spec with the tenant's limits".into(),
        ));
    };
    let mut table = toml::Table::new();
    table.insert("name".into(), toml::Value::String(name.clone()));
    for (field, value) in spec {
        if IGNORED.contains(&field.as_str()) {
            continue;
        }
        let Some((_, key)) = FIELDS.iter().find(|(f, _)| f == field) else {
            let known: Vec<&str> = FIELDS
                .iter()
                .map(|(f, _)| *f)
                .chain(IGNORED.iter().copied())
                .collect();
            return Err((
                at(&format!("spec.{field}")),
                format!("unknown field; known: {}", known.join(", ")),
            ));
        };
        let value =
            to_toml(value).ok_or((at(&format!("spec.{field}")), "must not be null".to_owned()))?;
        table.insert((*key).to_owned(), value);
    }
    Ok((name, table))
}

fn to_toml(v: &Json) -> Option<toml::Value> {
    Some(match v {
        Json::Null => return None,
        Json::Bool(b) => toml::Value::Boolean(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => toml::Value::Integer(i),
            None => toml::Value::Float(n.as_f64()?),
        },
        Json::String(s) => toml::Value::String(s.clone()),
        Json::Array(items) => toml::Value::Array(items.iter().map(to_toml).collect::<Option<_>>()?),
        Json::Object(map) => toml::Value::Table(
            map.iter()
                .map(|(k, v)| Some((k.clone(), to_toml(v)?)))
                .collect::<Option<_>>()?,
        ),
    })
}
