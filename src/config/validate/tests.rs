use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::{Just, ProptestConfig, any, prop_assert, prop_oneof, proptest};

use super::tenants::sha256;
use super::url::parse_http_url;
use super::{parse_policy, parse_policy_with_env, summary};
use crate::config::EngineParams;
use crate::config::file::ConfigError;
use crate::config::load::load_policy;
use crate::config::policy::*;
use crate::core::spec::Api;

/// One pool with one remote backend: the smallest valid policy.
const POOL: &str = "[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(src: &str) -> Result<Policy, Vec<ConfigError>> {
    parse_policy_with_env(src, "p.toml", &no_env)
}

fn errors(src: &str) -> Vec<ConfigError> {
    match parse(src) {
        Ok(p) => panic!("expected errors, got {p:?}"),
        Err(errs) => errs,
    }
}

/// Asserts `src` has exactly one error, at `line:column` and `path`, whose
/// message contains `needle`.
#[track_caller]
fn assert_one(src: &str, line: usize, column: usize, path: &str, needle: &str) {
    let errs = errors(src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = &errs[0];
    assert_eq!(
        (e.line, e.column, e.path.as_str()),
        (line, column, path),
        "{e}"
    );
    assert!(e.message.contains(needle), "{e}");
}

// --- positions and format ---------------------------------------------------

#[test]
fn error_displays_as_file_line_column_path_message() {
    let e = ConfigError {
        file: "p.toml".into(),
        line: 3,
        column: 7,
        path: "tenants[1].weight".into(),
        message: "must be greater than zero, found 0".into(),
    };
    assert_eq!(
        e.to_string(),
        "p.toml:3:7: tenants[1].weight: must be greater than zero, found 0"
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"ключ\", \"\"]\n");
    assert_one(&src, 7, 21, "tenants[0].api_keys[1]", "must not be empty");
}

#[test]
fn syntax_error_is_reported_at_its_own_position() {
    let src = format!("{POOL}[queue]\ndiscipline = \"drf\nmax_wait = \"1s\"\n");
    let errs = errors(&src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(
        (errs[0].line, errs[0].path.as_str()),
        (6, ""),
        "{}",
        errs[0]
    );
    assert!(errs[0].message.starts_with("invalid TOML"), "{}", errs[0]);
    assert!(!errs[0].to_string().contains(": :"), "{}", errs[0]);
}

#[test]
fn duplicate_toml_key_is_a_syntax_error() {
    let src = format!("{POOL}timeout = \"1s\"\ntimeout = \"2s\"\n");
    let errs = errors(&src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].line, errs[0].column), (6, 1), "{}", errs[0]);
}

// --- unknown keys -----------------------------------------------------------

#[test]
fn unknown_key_is_reported_at_the_key_with_a_suggestion() {
    let src = format!("{POOL}[queue]\ndiscpline = \"drf\"\n");
    assert_one(
        &src,
        6,
        1,
        "queue.discpline",
        "unknown key `discpline`; did you mean `discipline`?",
    );
}

#[test]
fn unknown_key_without_a_close_match_lists_the_expected_keys() {
    let src = format!("{POOL}[poller]\nbanana = 1\n");
    assert_one(
        &src,
        6,
        1,
        "poller.banana",
        "expected one of: interval, timeout",
    );
}

#[test]
fn crd_style_key_suggests_the_policy_key() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nperTenantRate = 5\n");
    assert_one(
        &src,
        8,
        1,
        "tenants[0].perTenantRate",
        "did you mean `rate`?",
    );
    let src =
        format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\ngpuSecondsPerHour = 5\n");
    assert_one(
        &src,
        8,
        1,
        "tenants[0].gpuSecondsPerHour",
        "did you mean `gpu_seconds_per_hour`?",
    );
}

#[test]
fn unknown_root_and_nested_keys_are_reported() {
    let src = format!("tenant = []\n{POOL}sim = {{ max_num_seq = 4 }}\n");
    let errs = errors(&src);
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.line, e.column, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, 1, "tenant"),
            (6, 7, "pools[0].backends[0].sim"),
            (6, 9, "pools[0].backends[0].sim.max_num_seq"),
        ],
        "{errs:#?}"
    );
    assert!(errs[0].message.contains("did you mean `tenants`?"));
    assert!(errs[1].message.contains("not both"));
    assert!(errs[2].message.contains("did you mean `max_num_seqs`?"));
}

// --- types and values -------------------------------------------------------

#[test]
fn wrong_type_is_reported_at_the_value() {
    let src = format!("[server]\nmax_body_bytes = \"big\"\n{POOL}");
    assert_one(
        &src,
        2,
        18,
        "server.max_body_bytes",
        "expected a positive integer, found a string",
    );
}

#[test]
fn pools_written_as_a_table_is_a_wrong_type() {
    assert_one(
        "[pools]\nmodel = \"m\"\n",
        1,
        1,
        "pools",
        "expected an array of tables (`[[pools]]`), found a table",
    );
}

#[test]
fn duration_without_a_unit_is_refused() {
    let src = format!("[poller]\ninterval = \"250\"\n{POOL}");
    assert_one(&src, 2, 12, "poller.interval", "invalid duration \"250\"");
    let src = format!("[poller]\ninterval = 250\n{POOL}");
    assert_one(&src, 2, 12, "poller.interval", "a duration needs a unit");
}

#[test]
fn bad_duration_in_a_tenant_slo_is_reported_with_its_path() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nslo = {{ ttft = \"fast\" }}\n"
    );
    assert_one(
        &src,
        8,
        16,
        "tenants[0].slo.ttft",
        "invalid duration \"fast\"",
    );
}

#[test]
fn zero_interval_is_refused() {
    let src = format!("[poller]\ninterval = \"0s\"\n{POOL}");
    assert_one(&src, 2, 12, "poller.interval", "longer than zero");
}

#[test]
fn in_flight_credit_outside_zero_to_one_is_refused() {
    let src = format!("[queue]\nin_flight_credit = 1.5\n{POOL}");
    assert_one(
        &src,
        2,
        20,
        "queue.in_flight_credit",
        "from 0 to 1, found 1.5",
    );
}

#[test]
fn invalid_listen_address_is_reported() {
    let src = format!("[server]\nlisten = \"localhost\"\n{POOL}");
    assert_one(
        &src,
        2,
        10,
        "server.listen",
        "expected an IP address and port",
    );
}

#[test]
fn admin_listen_equal_to_listen_is_refused() {
    let src = format!("[server]\nlisten = \"0.0.0.0:80\"\nadmin_listen = \"0.0.0.0:80\"\n{POOL}");
    assert_one(
        &src,
        3,
        16,
        "server.admin_listen",
        "must differ from listen",
    );
}

#[test]
fn listen_equal_to_the_default_admin_listen_is_refused() {
    let src = format!("[server]\nlisten = \"127.0.0.1:9090\"\n{POOL}");
    assert_one(&src, 2, 10, "server.listen", "must differ from listen");
}

#[test]
fn backends_written_as_a_table_names_the_right_header() {
    let src = "[[pools]]\nmodel = \"m\"\n[pools.backends]\nurl = \"http://h:1\"\n";
    assert_one(
        src,
        3,
        1,
        "pools[0].backends",
        "expected an array of tables (`[[pools.backends]]`), found a table",
    );
}

#[test]
fn tenant_header_must_be_a_lowercase_header_name() {
    let src = format!("[server]\ntrust_tenant_header = \"X-Tenant\"\n{POOL}");
    assert_one(
        &src,
        2,
        23,
        "server.trust_tenant_header",
        "write \"x-tenant\"",
    );
    let src = format!("[server]\ntrust_tenant_header = \"x tenant\"\n{POOL}");
    assert_one(
        &src,
        2,
        23,
        "server.trust_tenant_header",
        "not a valid HTTP header name",
    );
}

#[test]
fn tls_needs_cert_and_key() {
    let src = format!("[server]\ntls = {{ cert = \"c.pem\" }}\n{POOL}");
    assert_one(&src, 2, 7, "server.tls.key", "missing required key `key`");
}

#[test]
fn non_positive_numbers_are_refused() {
    let tenant = |line: &str| {
        format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nrate = 10\n{line}\n")
    };
    assert_one(
        &tenant("weight = 0"),
        9,
        10,
        "tenants[0].weight",
        "greater than zero, found 0",
    );
    assert_one(
        &tenant("weight = -1.5"),
        9,
        10,
        "tenants[0].weight",
        "found -1.5",
    );
    assert_one(
        &tenant("gpu_seconds_per_hour = 0"),
        9,
        24,
        "tenants[0].gpu_seconds_per_hour",
        "greater than zero",
    );
    assert_one(
        &tenant("burst = 0"),
        9,
        9,
        "tenants[0].burst",
        "greater than zero",
    );
    assert_one(
        &tenant("burst = 0.5"),
        9,
        9,
        "tenants[0].burst",
        "at least 1",
    );
    assert_one(
        &tenant("max_concurrency = 0"),
        9,
        19,
        "tenants[0].max_concurrency",
        "positive integer, found 0",
    );
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nrate = -5\n");
    assert_one(&src, 8, 8, "tenants[0].rate", "greater than zero, found -5");
    let src = format!("{POOL}gpus = 0\n");
    assert_one(
        &src,
        5,
        8,
        "pools[0].backends[0].gpus",
        "positive integer, found 0",
    );
    let src = format!("[queue]\nmax_queued_per_tenant = -1\n{POOL}");
    assert_one(
        &src,
        2,
        25,
        "queue.max_queued_per_tenant",
        "positive integer",
    );
}

#[test]
fn integer_too_large_for_its_field_is_refused() {
    let src = format!("{POOL}max_inflight = 5000000000\n");
    assert_one(
        &src,
        5,
        16,
        "pools[0].backends[0].max_inflight",
        "too large",
    );
}

#[test]
fn burst_without_rate_is_refused() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nburst = 10\n");
    assert_one(&src, 8, 9, "tenants[0].burst", "needs `rate`");
}

#[test]
fn kv_high_watermark_must_be_in_zero_one() {
    let at = |v: &str| {
        format!(
            "[[pools]]\nmodel = \"m\"\nkv_high_watermark = {v}\n[[pools.backends]]\nurl = \"http://h:1\"\n"
        )
    };
    assert_one(
        &at("0"),
        3,
        21,
        "pools[0].kv_high_watermark",
        "greater than 0 and at most 1",
    );
    assert_one(&at("1.5"), 3, 21, "pools[0].kv_high_watermark", "found 1.5");
    assert_eq!(parse(&at("1")).unwrap().pools[0].kv_high_watermark, 1.0);
}

#[test]
fn unknown_choices_are_reported_with_a_suggestion() {
    let src = format!("[queue]\ndiscipline = \"dfr\"\n{POOL}");
    assert_one(&src, 2, 14, "queue.discipline", "did you mean \"drf\"?");
    let src = format!("[queue]\ndiscipline = \"lottery\"\n{POOL}");
    assert_one(
        &src,
        2,
        14,
        "queue.discipline",
        "expected one of: fifo, priority, wfq, drf",
    );
    let src = "[[pools]]\nmodel = \"m\"\nrouting = \"least_loaded\"\n[[pools.backends]]\nurl = \"http://h:1\"\n";
    assert_one(src, 3, 11, "pools[0].routing", "least_outstanding");
    let src = format!("{POOL}metrics = \"prometheus\"\n");
    assert_one(
        &src,
        5,
        11,
        "pools[0].backends[0].metrics",
        "vllm, triton, trtllm, sglang, llamacpp, agent, none",
    );
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\npriority = \"high\"\n");
    assert_one(&src, 8, 12, "tenants[0].priority", "interactive, batch");
}

// --- pools and backends -----------------------------------------------------

#[test]
fn missing_pools_is_reported_at_the_start_of_the_file() {
    assert_one("[queue]\n", 1, 1, "pools", "at least one pool");
    assert_one("pools = []\n", 1, 9, "pools", "at least one pool");
}

#[test]
fn pool_without_backends_is_reported_at_its_header() {
    let src = format!("{POOL}[[pools]]\nmodel = \"n\"\n");
    assert_one(
        &src,
        5,
        1,
        "pools[1].backends",
        "at least one [[pools.backends]]",
    );
    let src = "[[pools]]\nmodel = \"n\"\nbackends = []\n";
    assert_one(src, 3, 12, "pools[0].backends", "at least one");
}

#[test]
fn missing_model_is_reported_at_the_pool_header() {
    let src = "[[pools]]\nrouting = \"p2c\"\n[[pools.backends]]\nurl = \"http://h:1\"\n";
    assert_one(src, 1, 1, "pools[0].model", "missing required key `model`");
}

#[test]
fn two_pools_for_one_model_are_refused() {
    let src = format!(
        "{POOL}[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://10.0.0.6:8000\"\n"
    );
    assert_one(
        &src,
        6,
        9,
        "pools[1].model",
        "already has a pool (pools[0])",
    );
}

#[test]
fn invalid_urls_are_refused_with_the_reason() {
    let at = |url: &str| format!("[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"{url}\"\n");
    let path = "pools[0].backends[0].url";
    assert_one(&at("http://h:8000/v1"), 4, 7, path, "no path");
    assert_one(
        &at("https://h:8000"),
        4,
        7,
        path,
        "https backends are not supported yet",
    );
    assert_one(&at("http://h"), 4, 7, path, "missing port");
    assert_one(&at("h:8000"), 4, 7, path, "expected http://host:port");
    assert_one(&at("http://h:99999"), 4, 7, path, "invalid port");
    assert_one(&at("http://u:p@h:1"), 4, 7, path, "credentials");
}

#[test]
fn url_keeps_only_the_authority() {
    assert_eq!(
        parse_http_url("http://10.0.0.5:8000").unwrap(),
        "10.0.0.5:8000"
    );
    assert_eq!(
        parse_http_url("HTTP://gpu-0.local:80/").unwrap(),
        "gpu-0.local:80"
    );
    assert_eq!(parse_http_url("http://[::1]:8000").unwrap(), "[::1]:8000");
    assert!(parse_http_url("http://[::g]:8000").is_err());
    assert!(parse_http_url("http://:8000").is_err());
    assert!(parse_http_url("http://h:8000?x=1").is_err());
    assert!(parse_http_url("http://é:1").is_err());
}

#[test]
fn url_and_sim_together_or_neither_are_refused() {
    let src = format!("{POOL}sim = {{}}\n");
    assert_one(&src, 5, 7, "pools[0].backends[0].sim", "not both");
    let src = "[[pools]]\nmodel = \"m\"\n[[pools.backends]]\ngpus = 2\n";
    assert_one(src, 3, 1, "pools[0].backends[0]", "needs `url");
}

#[test]
fn duplicate_backend_names_are_refused() {
    let src = format!("{POOL}[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n");
    assert_one(
        &src,
        6,
        7,
        "pools[0].backends[1].url",
        "set `name` to tell them apart",
    );
    let src = format!(
        "{POOL}name = \"gpu\"\n[[pools]]\nmodel = \"n\"\n[[pools.backends]]\nname = \"gpu\"\nurl = \"http://h:1\"\n"
    );
    assert_one(
        &src,
        9,
        8,
        "pools[1].backends[0].name",
        "already used by pools[0].backends[0]",
    );
}

#[test]
fn bad_sim_parameters_are_reported() {
    let src = "[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nsim = { block_size = 0, decode_step_base = \"fast\" }\n";
    let errs = errors(src);
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.line, e.column, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (4, 22, "pools[0].backends[0].sim.block_size"),
            (4, 44, "pools[0].backends[0].sim.decode_step_base"),
        ],
        "{errs:#?}"
    );
}

// --- tenants and keys -------------------------------------------------------

#[test]
fn duplicate_tenant_names_are_refused() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k1\"]\n[[tenants]]\nname = \"a\"\napi_keys = [\"k2\"]\n"
    );
    assert_one(
        &src,
        9,
        8,
        "tenants[1].name",
        "tenant \"a\" is already defined (tenants[0])",
    );
}

#[test]
fn invalid_tenant_name_is_refused() {
    let src = format!("{POOL}[[tenants]]\nname = \"Acme Corp\"\napi_keys = [\"k\"]\n");
    assert_one(&src, 6, 8, "tenants[0].name", "lowercase letters");
}

#[test]
fn missing_tenant_name_is_reported_at_the_tenant_header() {
    let src = format!("{POOL}[[tenants]]\napi_keys = [\"k\"]\n");
    assert_one(&src, 5, 1, "tenants[0].name", "missing required key `name`");
}

#[test]
fn duplicate_api_key_across_tenants_is_refused_without_echoing_it() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"sk-same\"]\n[[tenants]]\nname = \"b\"\napi_keys = [\"sk-other\", \"sk-same\"]\n"
    );
    let errs = errors(&src);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = &errs[0];
    assert_eq!(
        (e.line, e.column, e.path.as_str()),
        (10, 25, "tenants[1].api_keys[1]"),
        "{e}"
    );
    assert!(
        e.message.contains("tenant \"a\" (tenants[0].api_keys[0])"),
        "{e}"
    );
    assert!(!e.to_string().contains("sk-same"), "{e}");
}

#[test]
fn duplicate_api_key_within_a_tenant_is_refused() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\", \"k\"]\n");
    assert_one(
        &src,
        7,
        18,
        "tenants[0].api_keys[1]",
        "already used by this tenant",
    );
}

#[test]
fn clear_key_matching_a_digest_is_a_duplicate() {
    // sha256("test")
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"test\"]\n[[tenants]]\nname = \"b\"\napi_key_sha256 = \"9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08\"\n"
    );
    assert_one(&src, 10, 18, "tenants[1].api_key_sha256", "tenant \"a\"");
}

#[test]
fn bad_sha256_hex_is_refused() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_key_sha256 = [\"abc\"]\n");
    assert_one(
        &src,
        7,
        19,
        "tenants[0].api_key_sha256[0]",
        "64 hex characters",
    );
    let bad = "g".repeat(64);
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_key_sha256 = \"{bad}\"\n");
    assert_one(
        &src,
        7,
        18,
        "tenants[0].api_key_sha256",
        "64 hex characters",
    );
}

#[test]
fn unset_api_key_env_is_refused() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_key_env = \"FAIRWAY_TEST_SURELY_UNSET_6D1F0B\"\n"
    );
    let errs = parse_policy(&src, "p.toml").unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(
        (errs[0].line, errs[0].column, errs[0].path.as_str()),
        (7, 15, "tenants[0].api_key_env")
    );
    assert!(
        errs[0]
            .message
            .contains("`FAIRWAY_TEST_SURELY_UNSET_6D1F0B` is not set")
    );
}

#[test]
fn empty_api_key_env_value_is_refused() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_key_env = \"EMPTY\"\n");
    let env = |_: &str| Some("  \n".to_owned());
    let errs = parse_policy_with_env(&src, "p.toml", &env).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].message.contains("is empty"), "{}", errs[0]);
}

#[test]
fn api_key_env_reads_the_process_environment() {
    // Cargo sets CARGO_PKG_NAME for test binaries; `set_var` is unsafe in
    // edition 2024 and this crate forbids unsafe code.
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_key_env = \"CARGO_PKG_NAME\"\n");
    let policy = parse_policy(&src, "p.toml").unwrap();
    assert_eq!(
        policy.tenants[0].key_digests,
        vec![sha256(env!("CARGO_PKG_NAME"))]
    );
}

#[test]
fn api_key_env_array_reads_each_variable_trimmed() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_key_env = [\"FW_KEY_ONE\", \"FW_KEY_TWO\"]\n"
    );
    let env = |name: &str| match name {
        "FW_KEY_ONE" => Some("sk-one\n".to_owned()),
        "FW_KEY_TWO" => Some("sk-two".to_owned()),
        _ => None,
    };
    let policy = parse_policy_with_env(&src, "p.toml", &env).unwrap();
    assert_eq!(
        policy.tenants[0].key_digests,
        vec![sha256("sk-one"), sha256("sk-two")]
    );
}

#[test]
fn tenant_without_a_key_is_refused_unless_the_header_is_trusted() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\n");
    assert_one(&src, 5, 1, "tenants[0]", "tenant has no API key");
    let trusted = format!("[server]\ntrust_tenant_header = \"x-fairway-tenant\"\n{src}");
    let policy = parse(&trusted).unwrap();
    assert!(policy.tenants[0].key_digests.is_empty());
    assert_eq!(
        policy.server.trust_tenant_header.as_deref(),
        Some("x-fairway-tenant")
    );
}

#[test]
fn keys_are_kept_only_as_sha256_digests() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"sk-live-secret-123\"]\n");
    let policy = parse(&src).unwrap();
    assert_eq!(
        policy.tenants[0].key_digests,
        vec![sha256("sk-live-secret-123")]
    );
    // sha256("abc"), a known vector.
    assert_eq!(sha256("abc")[..4], [0xba, 0x78, 0x16, 0xbf]);
    let debug = format!("{policy:?}");
    assert!(!debug.contains("sk-live-secret-123"));
    let json = serde_json::to_string(&policy).unwrap();
    assert!(!json.contains("sk-live"), "{json}");
}

#[test]
fn slo_ttft_longer_than_e2e_is_refused() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nslo = {{ ttft = \"40s\" }}\n"
    );
    assert_one(
        &src,
        8,
        16,
        "tenants[0].slo.ttft",
        "longer than slo.e2e (30s)",
    );
}

// --- whole files --------------------------------------------------------------

#[test]
fn every_error_in_a_file_is_reported_in_file_order() {
    let src = "\
[server]
listen = \"nowhere\"
[queue]
discipline = \"lottery\"
[[pools]]
model = \"m\"
[[pools.backends]]
url = \"https://h:1\"
[[tenants]]
name = \"a\"
weight = 0
api_keys = [\"k\"]
[[tenants]]
name = \"a\"
api_keys = [\"k\"]
slo = { ttft = \"soon\" }
colour = \"blue\"
";
    let errs = errors(src);
    let got: Vec<_> = errs
        .iter()
        .map(|e| (e.line, e.column, e.path.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (2, 10, "server.listen"),
            (4, 14, "queue.discipline"),
            (8, 7, "pools[0].backends[0].url"),
            (11, 10, "tenants[0].weight"),
            (14, 8, "tenants[1].name"),
            (15, 13, "tenants[1].api_keys[0]"),
            (16, 16, "tenants[1].slo.ttft"),
            (17, 1, "tenants[1].colour"),
        ],
        "{errs:#?}"
    );
    assert!(
        errs[5]
            .message
            .contains("already used by tenant \"a\" (tenants[0].api_keys[0])"),
        "{}",
        errs[5]
    );
}

#[test]
fn minimal_file_gets_every_default() {
    let policy = parse(POOL).unwrap();
    let expected = Policy {
        server: ServerPolicy {
            listen: "127.0.0.1:8080".parse().unwrap(),
            admin_listen: "127.0.0.1:9090".parse().unwrap(),
            max_body_bytes: 10_485_760,
            max_upload_bytes: 26_214_400,
            drain_timeout: Duration::from_secs(30),
            trust_tenant_header: None,
            trusted_hops: 0,
            tls: None,
            max_connections: 4096,
            max_connections_per_client: None,
            max_requests: 4096,
            header_read_timeout: Duration::from_secs(10),
            workers: std::thread::available_parallelism().map_or(1, usize::from),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            admin_token: None,
            cache_salt_secret: None,
            admin_token_for_metrics: false,
        },
        poller: PollerPolicy {
            interval: Duration::from_millis(250),
            timeout: Duration::from_secs(1),
        },
        cluster: None,
        batch: None,
        placement: crate::config::PlacementPolicy {
            max_free_fraction: 0.8,
            ttft_p99_threshold: Duration::from_millis(150),
            max_models_per_gpu: 2,
            shared_memory_fraction: 0.7,
            stale_after: Duration::from_secs(30),
            on_stale: crate::config::OnStale::Allow,
            listen: "0.0.0.0:9443".parse().unwrap(),
            tls: None,
            agents: Vec::new(),
            agents_dns: Vec::new(),
            poll_interval: Duration::from_secs(2),
            reservation_ttl: Duration::from_secs(600),
        },
        telemetry: TelemetryPolicy {
            otlp_endpoint: None,
            service_name: "fairway".into(),
            fairness_window: Duration::from_secs(10),
            sample_ratio: None,
            per_tenant_histograms: TenantHistograms::Auto,
        },
        queue: QueuePolicy {
            discipline: Discipline::Drf,
            max_wait: Duration::from_secs(30),
            max_queued_per_tenant: 10_000,
            output_token_weight: 1.0,
            in_flight_credit: crate::config::validate::DEFAULT_IN_FLIGHT_CREDIT,
            prefill_charge: PrefillCharge::Full,
            locality: 1.0,
        },
        preemption: PreemptionPolicy {
            enabled: true,
            min_wait: Duration::from_millis(250),
            migration_threshold: Duration::from_secs(300),
        },
        pools: vec![PoolPolicy {
            model: "m".into(),
            routing: Strategy::PrefixAware,
            timeout: Duration::from_secs(60),
            kv_high_watermark: 0.8,
            ttft_p99_threshold: Duration::from_millis(150),
            outlier: OutlierPolicy {
                eject_after_failures: 5,
                ejection_time: Duration::from_secs(10),
                max_ejection_time: Duration::from_secs(300),
                max_ejected_share: 0.5,
                success_rate_gap: 0.3,
                success_rate_min_requests: 20,
                success_rate_interval: Duration::from_secs(10),
            },
            adapters: Vec::new(),
            adapter_affinity: true,
            prefix: Default::default(),
            tokenizer: None,
            backends: vec![BackendPolicy {
                name: "10.0.0.5:8000".into(),
                target: BackendTarget::Url {
                    authority: "10.0.0.5:8000".into(),
                },
                gpus: 1,
                max_inflight: 64,
                metrics: MetricsDialect::Vllm,
                metrics_url: None,
                health_path: "/health".into(),
                kv_tokens: 65_536,
                protocol: Api::OpenAi,
                served_model: None,
                kv_events: None,
            }],
        }],
        tenants: vec![],
    };
    assert_eq!(policy, expected);
}

#[test]
fn full_file_parses_to_the_expected_policy() {
    let src = "\
[server]
listen = \"0.0.0.0:8000\"
admin_listen = \"[::1]:9000\"
max_body_bytes = 1_024
max_upload_bytes = 2_048
drain_timeout = \"0s\"
tls = { cert = \"c.pem\", key = \"k.pem\" }
[poller]
interval = \"1s 500ms\"
[queue]
discipline = \"wfq\"
max_wait = \"2m\"
max_queued_per_tenant = 0x10
output_token_weight = 2
in_flight_credit = 1
prefill_charge = \"uncached\"
[[pools]]
model = \"m\"
routing = \"p2c\"
timeout = \"5s\"
kv_high_watermark = 0.9
ttft_p99_threshold = \"300ms\"
[[pools.backends]]
sim = { max_num_seqs = 8, time_scale = 10, decode_step_per_seq = \"0s\" }
[[pools.backends]]
name = \"b\"
url = \"http://gpu:8000/\"
gpus = 4
max_inflight = 32
metrics = \"triton\"
kv_tokens = 1000
[[tenants]]
name = \"t-1\"
api_keys = [\"k1\", \"k2\"]
weight = 2.5
priority = \"batch\"
rate = 10
max_concurrency = 7
gpu_seconds_per_hour = 60
slo = { ttft = \"200ms\", e2e = \"2s\" }
[[tenants]]
name = \"t_2\"
api_key_sha256 = \"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\"
rate = 0.5
burst = 3
";
    let p = parse(src).unwrap();
    assert_eq!(p.server.listen, "0.0.0.0:8000".parse().unwrap());
    assert_eq!(p.server.admin_listen, "[::1]:9000".parse().unwrap());
    assert_eq!(p.server.max_body_bytes, 1024);
    assert_eq!(p.server.max_upload_bytes, 2048);
    assert_eq!(p.server.drain_timeout, Duration::ZERO);
    assert_eq!(
        p.server.tls,
        Some(TlsPolicy {
            cert: PathBuf::from("c.pem"),
            key: PathBuf::from("k.pem")
        })
    );
    assert_eq!(p.poller.interval, Duration::from_millis(1500));
    assert_eq!(
        p.queue,
        QueuePolicy {
            discipline: Discipline::Wfq,
            max_wait: Duration::from_secs(120),
            max_queued_per_tenant: 16,
            output_token_weight: 2.0,
            in_flight_credit: 1.0,
            prefill_charge: PrefillCharge::Uncached,
            locality: 1.0,
        }
    );
    let pool = &p.pools[0];
    assert_eq!(pool.routing, Strategy::P2c);
    assert_eq!(pool.timeout, Duration::from_secs(5));
    assert_eq!(pool.kv_high_watermark, 0.9);
    assert_eq!(pool.ttft_p99_threshold, Duration::from_millis(300));
    let params = EngineParams {
        max_num_seqs: 8,
        time_scale: 10.0,
        decode_step_per_seq: Duration::ZERO,
        ..EngineParams::default()
    };
    assert_eq!(
        pool.backends[0],
        BackendPolicy {
            name: "m-sim-0".into(),
            target: BackendTarget::Sim { params },
            gpus: 1,
            max_inflight: 64,
            metrics: MetricsDialect::Vllm,
            metrics_url: None,
            health_path: "/health".into(),
            kv_tokens: 65_536,
            protocol: Api::OpenAi,
            served_model: None,
            kv_events: None,
        }
    );
    assert_eq!(
        pool.backends[1],
        BackendPolicy {
            name: "b".into(),
            target: BackendTarget::Url {
                authority: "gpu:8000".into()
            },
            gpus: 4,
            max_inflight: 32,
            metrics: MetricsDialect::Triton,
            metrics_url: None,
            health_path: "/health/ready".into(),
            kv_tokens: 1000,
            protocol: Api::OpenAi,
            served_model: None,
            kv_events: None,
        }
    );
    assert_eq!(
        p.tenants[0],
        TenantPolicy {
            name: "t-1".into(),
            key_digests: vec![sha256("k1"), sha256("k2")],
            weight: 2.5,
            priority: Priority::Batch,
            rate: Some(10.0),
            burst: Some(10.0),
            max_concurrency: Some(7),
            gpu_seconds_per_hour: Some(60.0),
            slo: Slo {
                ttft: Duration::from_millis(200),
                e2e: Duration::from_secs(2)
            },
            on_late: OnLate::BestEffort,
            adapters: None,
            cache_namespace: Some("tenant:t-1".into()),
        }
    );
    assert_eq!(
        p.tenants[1],
        TenantPolicy {
            name: "t_2".into(),
            key_digests: vec![sha256("test")],
            weight: 1.0,
            priority: Priority::Interactive,
            rate: Some(0.5),
            burst: Some(3.0),
            max_concurrency: None,
            gpu_seconds_per_hour: None,
            slo: Slo {
                ttft: Duration::from_secs(1),
                e2e: Duration::from_secs(30)
            },
            on_late: OnLate::Refuse,
            adapters: None,
            cache_namespace: Some("tenant:t_2".into()),
        }
    );
}

#[test]
fn prefix_cache_namespaces() {
    let src = format!(
        "{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\n\
         [[tenants]]\nname = \"b\"\napi_keys = [\"l\"]\nprefix_cache = \"shared\"\n\
         [[tenants]]\nname = \"c\"\napi_keys = [\"m\"]\nprefix_cache = \"group:evals\"\n"
    );
    let ns: Vec<_> = parse(&src)
        .unwrap()
        .tenants
        .into_iter()
        .map(|t| t.cache_namespace)
        .collect();
    assert_eq!(
        ns,
        [Some("tenant:a".into()), None, Some("group:evals".into())]
    );
    let src =
        format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nprefix_cache = \"group:\"\n");
    let errs = parse(&src).unwrap_err();
    assert!(
        errs[0].to_string().contains("prefix-cache namespace"),
        "{}",
        errs[0]
    );
}

#[test]
fn burst_defaults_to_rate_and_at_least_one() {
    let src = format!("{POOL}[[tenants]]\nname = \"a\"\napi_keys = [\"k\"]\nrate = 0.2\n");
    assert_eq!(parse(&src).unwrap().tenants[0].burst, Some(1.0));
}

/// A key for every `api_key_env` variable the example files name.
fn example_env(name: &str) -> Option<String> {
    name.contains("API_KEY")
        .then(|| format!("sk-example-{name}"))
}

#[test]
fn demo_default_parses_to_the_documented_policy() {
    let p = parse_policy_with_env(
        include_str!("../../../config/fairway.toml"),
        "fairway.toml",
        &no_env,
    )
    .unwrap();
    assert_eq!(p.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(p.server.admin_listen, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(p.pools.len(), 1);
    assert_eq!(p.pools[0].model, "llama-3.1-8b-sim");
    let params = EngineParams {
        max_num_seqs: 16,
        kv_tokens: 32_768,
        ..EngineParams::default()
    };
    let names: Vec<_> = p.pools[0]
        .backends
        .iter()
        .map(|b| b.name.as_str())
        .collect();
    assert_eq!(names, ["vllm-sim-0", "vllm-sim-1", "triton-sim"]);
    // Two vLLM-like backends and a Triton one.
    let protocols: Vec<_> = p.pools[0].backends.iter().map(|b| b.protocol).collect();
    assert_eq!(protocols, [Api::OpenAi, Api::OpenAi, Api::Triton]);
    for b in &p.pools[0].backends {
        assert_eq!(
            b.target,
            BackendTarget::Sim {
                params: params.clone()
            }
        );
        assert_eq!((b.max_inflight, b.kv_tokens), (16, 32_768));
    }
    let t = |name: &str| p.tenants.iter().find(|t| t.name == name).unwrap();
    assert_eq!(p.tenants.len(), 3);
    let api = t("api");
    assert_eq!((api.weight, api.priority), (3.0, Priority::Interactive));
    assert_eq!(api.key_digests, vec![sha256("sk-demo-api")]);
    assert_eq!(
        api.slo,
        Slo {
            ttft: Duration::from_millis(500),
            e2e: Duration::from_secs(10)
        }
    );
    let chat = t("chat");
    assert_eq!((chat.weight, chat.rate), (1.0, None));
    assert_eq!(chat.key_digests, vec![sha256("sk-demo-chat")]);
    let evals = t("evals");
    assert_eq!((evals.weight, evals.priority), (1.0, Priority::Batch));
    assert_eq!((evals.rate, evals.burst), (Some(50.0), Some(100.0)));
    assert_eq!(evals.key_digests, vec![sha256("sk-demo-evals")]);
    assert_eq!(
        evals.slo,
        Slo {
            ttft: Duration::from_secs(30),
            e2e: Duration::from_secs(300)
        }
    );
    assert_eq!(
        summary(&p),
        "1 pool (llama-3.1-8b-sim), 3 backends, 3 simulated, 3 tenants (api, chat, evals), discipline drf"
    );
}

#[test]
fn production_template_parses() {
    let p = parse_policy_with_env(
        include_str!("../../../config/production.toml"),
        "production.toml",
        &example_env,
    )
    .unwrap();
    assert_eq!(p.pools.len(), 2);
    assert!(
        p.pools
            .iter()
            .flat_map(|pool| &pool.backends)
            .all(|b| matches!(b.target, BackendTarget::Url { .. }))
    );
    assert_eq!(p.tenants[0].key_digests.len(), 2);
}

#[test]
fn acme_corp_example_mirrors_the_crd() {
    let p = parse_policy_with_env(
        include_str!("../../../config/acme-corp.toml"),
        "acme-corp.toml",
        &no_env,
    )
    .unwrap();
    let acme = &p.tenants[0];
    assert_eq!(acme.name, "acme-corp");
    assert_eq!(acme.rate, Some(5000.0));
    assert_eq!(acme.burst, Some(2000.0));
    assert_eq!(acme.gpu_seconds_per_hour, Some(3600.0));
    assert_eq!(acme.max_concurrency, Some(2000));
    assert_eq!(acme.key_digests, vec![sha256("sk-acme-example")]);
    assert_eq!(p.pools[0].backends[0].name, "10.0.0.5:8000");
}

#[test]
fn summary_lists_at_most_ten_names() {
    let tenants: String = (0..25)
        .map(|i| format!("[[tenants]]\nname = \"t{i}\"\napi_keys = [\"sk-{i}\"]\n"))
        .collect();
    let s = summary(&parse(&format!("{POOL}{tenants}")).unwrap());
    assert!(
        s.ends_with(
            "25 tenants (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9, and 15 more), discipline drf"
        ),
        "{s}"
    );
}

#[test]
fn summary_without_tenants_says_auth_is_off() {
    assert_eq!(
        summary(&parse(POOL).unwrap()),
        "1 pool (m), 1 backend, no tenants (auth off, every request is tenant \"default\"), discipline drf"
    );
}

#[test]
fn unreadable_file_is_one_error_at_the_start() {
    let errs = load_policy(Path::new("/nonexistent/fairway-policy.toml")).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!((errs[0].line, errs[0].column), (1, 1));
    assert_eq!(errs[0].file, "/nonexistent/fairway-policy.toml");
    assert!(errs[0].message.contains("cannot read"), "{}", errs[0]);
}

#[test]
fn loaded_policy_resolves_tls_paths_against_its_directory() {
    let dir = std::env::temp_dir().join(format!("fairway-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("p.toml");
    let src = format!("[server]\ntls = {{ cert = \"c.pem\", key = \"/abs/k.pem\" }}\n{POOL}");
    std::fs::write(&path, &src).unwrap();
    let (policy, text) = load_policy(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(text, src);
    let tls = policy.server.tls.unwrap();
    assert_eq!(tls.cert, dir.join("c.pem"));
    assert_eq!(tls.key, PathBuf::from("/abs/k.pem"));
}

// --- robustness -------------------------------------------------------------

const VALID: &str = include_str!("../../../config/fairway.toml");

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let src = String::from_utf8_lossy(&bytes);
        let _ = parse(&src);
    }

    #[test]
    fn mutated_valid_file_never_panics(
        at in 0usize..VALID.len(),
        len in 0usize..64,
        insert in "[ -~\n\"\\[\\]{}=.,#ü]{0,16}",
    ) {
        let mut src = VALID.to_owned();
        let start = (0..=at).rev().find(|&i| src.is_char_boundary(i)).unwrap_or(0);
        let end = (start + len).min(src.len());
        let end = (end..=src.len()).find(|&i| src.is_char_boundary(i)).unwrap_or(src.len());
        src.replace_range(start..end, &insert);
        if let Err(errs) = parse(&src) {
            prop_assert!(!errs.is_empty());
            for e in &errs {
                prop_assert!(e.line >= 1 && e.column >= 1);
            }
        }
    }

    #[test]
    fn mutated_values_of_a_valid_file_never_panic(
        line in 0usize..200,
        value in prop_oneof![
            Just("0".to_owned()), Just("-1".to_owned()), Just("1e400".to_owned()),
            Just("nan".to_owned()), Just("\"\"".to_owned()), Just("[]".to_owned()),
            Just("{}".to_owned()), Just("9999999999999999999999".to_owned()),
            Just("\"http://[::1\"".to_owned()), Just("1979-05-27".to_owned()),
            "\"[a-z0-9:/.]{0,12}\"",
        ],
    ) {
        let lines: Vec<&str> = VALID.lines().collect();
        let i = line % lines.len();
        let mut out = String::new();
        for (n, l) in lines.iter().enumerate() {
            match l.split_once(" = ") {
                Some((key, _)) if n == i && !l.starts_with('#') => {
                    out.push_str(key);
                    out.push_str(" = ");
                    out.push_str(&value);
                }
                _ => out.push_str(l),
            }
            out.push('\n');
        }
        let _ = parse(&out);
    }
}

#[test]
fn otlp_endpoint_comes_from_the_key_or_the_otel_variable_checked_alike() {
    let env = |url: &'static str| {
        move |name: &str| (name == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| url.to_owned())
    };
    let from_env = parse_policy_with_env(POOL, "p.toml", &env("http://otel:4318/")).unwrap();
    assert_eq!(
        from_env.telemetry.otlp_endpoint.as_deref(),
        Some("otel:4318")
    );
    // The key wins over the variable.
    let src = format!("{POOL}[telemetry]\notlp_endpoint = \"http://10.0.0.9:4318\"\n");
    let keyed = parse_policy_with_env(&src, "p.toml", &env("http://otel:4318")).unwrap();
    assert_eq!(
        keyed.telemetry.otlp_endpoint.as_deref(),
        Some("10.0.0.9:4318")
    );
    // A bad variable is the same clear error as a bad key.
    let errs = parse_policy_with_env(POOL, "p.toml", &env("https://otel:4318")).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert!(
        errs[0]
            .message
            .starts_with("OTEL_EXPORTER_OTLP_ENDPOINT: invalid OTLP endpoint"),
        "{}",
        errs[0].message
    );
    assert_eq!(parse(POOL).unwrap().telemetry.otlp_endpoint, None);
}

#[test]
fn preemption_section_is_read_and_checked() {
    let p = parse(&format!(
        "[preemption]\nenabled = false\nmin_wait = \"0s\"\nmigration_threshold = \"10m\"\n{POOL}"
    ))
    .unwrap();
    assert_eq!(
        p.preemption,
        PreemptionPolicy {
            enabled: false,
            min_wait: Duration::ZERO,
            migration_threshold: Duration::from_secs(600),
        }
    );
    let errs = parse(&format!(
        "[preemption]\nenabled = \"yes\"\nmigration_threshold = \"0s\"\nmigrate_after = 1\n{POOL}"
    ))
    .unwrap_err();
    let paths: Vec<_> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "preemption.enabled",
            "preemption.migration_threshold",
            "preemption.migrate_after"
        ],
        "{errs:#?}"
    );
    assert!(errs[0].message.contains("a boolean"), "{}", errs[0]);
}

#[test]
fn fairness_window_is_read_and_at_least_a_second() {
    let p = parse(&format!("{POOL}[telemetry]\nfairness_window = \"30s\"\n")).unwrap();
    assert_eq!(p.telemetry.fairness_window, Duration::from_secs(30));
    let errs = parse(&format!("{POOL}[telemetry]\nfairness_window = \"500ms\"\n")).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "telemetry.fairness_window");
    assert!(errs[0].message.contains("at least 1s"), "{}", errs[0]);
}

#[test]
fn listener_caps_and_header_timeout_are_read_and_checked() {
    let p = parse(&format!(
        "[server]\nmax_connections = 100\nmax_requests = 50\nheader_read_timeout = \"2s\"\nbody_read_timeout = \"5s\"\n{POOL}"
    ))
    .unwrap();
    assert_eq!(p.server.body_read_timeout, Duration::from_secs(5));
    assert_eq!(p.server.max_connections, 100);
    assert_eq!(p.server.max_requests, 50);
    assert_eq!(p.server.header_read_timeout, Duration::from_secs(2));
    let errs = parse(&format!(
        "[server]\nmax_connections = 0\nmax_requests = -1\nheader_read_timeout = \"0s\"\n{POOL}"
    ))
    .unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.max_connections",
            "server.max_requests",
            "server.header_read_timeout"
        ],
        "{errs:#?}"
    );
}

#[test]
fn sample_ratio_is_a_share_between_zero_and_one() {
    let p = parse(&format!("{POOL}[telemetry]\nsample_ratio = 0.25\n")).unwrap();
    assert_eq!(p.telemetry.sample_ratio, Some(0.25));
    assert_eq!(parse(POOL).unwrap().telemetry.sample_ratio, None);
    let errs = parse(&format!("{POOL}[telemetry]\nsample_ratio = 1.5\n")).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(errs[0].path, "telemetry.sample_ratio");
    assert!(errs[0].message.contains("between 0 and 1"), "{}", errs[0]);
}

#[test]
fn per_tenant_histograms_is_auto_unless_set() {
    let h = |v: &str| {
        parse(&format!("{POOL}[telemetry]\nper_tenant_histograms = {v}\n"))
            .map(|p| p.telemetry.per_tenant_histograms)
    };
    assert_eq!(
        parse(POOL).unwrap().telemetry.per_tenant_histograms,
        TenantHistograms::Auto
    );
    assert_eq!(h("\"auto\"").unwrap(), TenantHistograms::Auto);
    assert_eq!(h("true").unwrap(), TenantHistograms::ByTenant);
    assert_eq!(h("false").unwrap(), TenantHistograms::ByModel);
    let errs = h("\"sometimes\"").unwrap_err();
    assert_eq!(errs[0].path, "telemetry.per_tenant_histograms");
    assert!(errs[0].message.contains("\"auto\""), "{}", errs[0]);
    assert!(TenantHistograms::Auto.by_tenant(100));
    assert!(!TenantHistograms::Auto.by_tenant(101));
}

#[test]
fn the_admin_token_is_read_from_the_environment_and_kept_as_a_digest() {
    let env = |k: &str| (k == "ADMIN_TOKEN").then(|| " s3cret \n".to_owned());
    let src = format!(
        "[server]\nadmin_token_env = \"ADMIN_TOKEN\"\nadmin_token_for_metrics = true\n{POOL}"
    );
    let p = parse_policy_with_env(&src, "p.toml", &env).unwrap();
    assert_eq!(p.server.admin_token, Some(super::tenants::sha256("s3cret")));
    assert!(p.server.admin_token_for_metrics);
    let src = format!("[server]\nadmin_token_env = \"UNSET_VAR\"\n{POOL}");
    let errs = parse_policy_with_env(&src, "p.toml", &env).unwrap_err();
    assert_eq!(errs[0].path, "server.admin_token_env", "{errs:#?}");
    // The digest is never shown in /admin/policy.
    let shown = serde_json::to_string(&parse(POOL).unwrap()).unwrap();
    assert!(!shown.contains("admin_token\""), "{shown}");
}

#[test]
fn the_admin_token_may_come_from_a_file_beside_the_policy() {
    let dir = std::env::temp_dir().join(format!("fairway-admin-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("token"), "t0ken-from-file\n").unwrap();
    std::fs::write(dir.join("empty"), "\n").unwrap();
    let policy_file = dir.join("fairway.toml");
    let policy_file = policy_file.to_str().unwrap();
    let no_env = |_: &str| None;
    let with = |extra: &str| format!("[server]\n{extra}\n{POOL}");
    // Relative to the policy file's directory.
    let p =
        parse_policy_with_env(&with("admin_token_file = \"token\""), policy_file, &no_env).unwrap();
    assert_eq!(
        p.server.admin_token,
        Some(super::tenants::sha256("t0ken-from-file"))
    );
    for (extra, says) in [
        ("admin_token_file = \"empty\"", "is empty"),
        ("admin_token_file = \"missing\"", "cannot read"),
    ] {
        let errs = parse_policy_with_env(&with(extra), policy_file, &no_env).unwrap_err();
        assert_eq!(errs[0].path, "server.admin_token_file", "{errs:#?}");
        assert!(errs[0].message.contains(says), "{}", errs[0]);
    }
    let env = |k: &str| (k == "T").then(|| "x".to_owned());
    let both = with("admin_token_env = \"T\"\nadmin_token_file = \"token\"");
    let errs = parse_policy_with_env(&both, policy_file, &env).unwrap_err();
    assert!(errs[0].message.contains("not both"), "{errs:#?}");
}

#[test]
fn eject_after_failures_is_a_whole_number_and_zero_turns_it_off() {
    let pool = |v: &str| {
        format!(
            "[[pools]]\nmodel = \"m\"\neject_after_failures = {v}\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n"
        )
    };
    assert_eq!(
        parse(&pool("0")).unwrap().pools[0]
            .outlier
            .eject_after_failures,
        0
    );
    assert_eq!(
        parse(&pool("7")).unwrap().pools[0]
            .outlier
            .eject_after_failures,
        7
    );
    for bad in ["-1", "2.5"] {
        let errs = parse(&pool(bad)).unwrap_err();
        assert_eq!(
            errs[0].path, "pools[0].eject_after_failures",
            "{bad}: {errs:#?}"
        );
    }
}

#[test]
fn the_cluster_section_is_checked_and_its_password_never_shown() {
    let env = |k: &str| (k == "REDIS_PW").then(|| "pw-secret".to_owned());
    let src = format!(
        "{POOL}[cluster]\nstore = \"rediss://cache:6380/1\"\npassword_env = \"REDIS_PW\"\nreplica = \"gw-a\"\nsync_interval = \"500ms\"\n"
    );
    let p = parse_policy_with_env(&src, "p.toml", &env).unwrap();
    let c = p.cluster.as_ref().unwrap();
    assert_eq!(c.store, "rediss://cache:6380/1");
    assert_eq!(c.replica.as_deref(), Some("gw-a"));
    assert_eq!(c.replica_ttl, Duration::from_millis(1500));
    assert_eq!(c.key_prefix, "fairway");
    let shown = serde_json::to_string(&p).unwrap();
    assert!(
        !shown.contains("pw-secret") && shown.contains("gw-a"),
        "{shown}"
    );
    assert!(!format!("{p:?}").contains("pw-secret"));
    for (cluster, path) in [
        ("store = \"redis://u:pw@h:1\"", "cluster.store"),
        ("store = \"http://h:1\"", "cluster.store"),
        ("replica = \"x\"", "cluster.store"),
        (
            "store = \"redis://h:1\"\npassword_env = \"UNSET\"",
            "cluster.password_env",
        ),
        (
            "store = \"redis://h:1\"\nsync_interval = \"1s\"\nreplica_ttl = \"1s\"",
            "cluster.replica_ttl",
        ),
        (
            "store = \"redis://h:1\"\non_store_failure = \"maybe\"",
            "cluster.on_store_failure",
        ),
        ("store = \"redis://h:1\"\nlease = 3", "cluster.lease"),
    ] {
        let errs = parse_policy_with_env(&format!("{POOL}[cluster]\n{cluster}\n"), "p.toml", &env)
            .unwrap_err();
        assert_eq!(errs[0].path, path, "{cluster}: {errs:#?}");
    }
}

#[test]
fn triton_backends_name_their_protocol_and_served_model() {
    let src = "[[pools]]\nmodel = \"llama\"\n\
               [[pools.backends]]\nurl = \"http://vllm:8000\"\n\
               [[pools.backends]]\nurl = \"http://triton:8000\"\nprotocol = \"triton\"\nserved_model = \"ensemble\"\n";
    let p = parse(src).unwrap();
    let b = &p.pools[0].backends;
    assert_eq!((b[0].protocol, b[1].protocol), (Api::OpenAi, Api::Triton));
    assert_eq!(b[1].served_model.as_deref(), Some("ensemble"));
    // A Triton backend is read and probed as Triton.
    assert_eq!(b[1].metrics, MetricsDialect::Triton);
    assert_eq!(b[1].health_path, "/v2/health/ready");
    // One scheduler pool per protocol.
    let spec = p.scheduler_spec();
    let pools: Vec<_> = spec
        .pools
        .iter()
        .map(|p| (p.model.as_str(), p.api, p.backends.len()))
        .collect();
    assert_eq!(
        pools,
        vec![("llama", Api::OpenAi, 1), ("llama", Api::Triton, 1)]
    );

    let bad = format!("{POOL}protocol = \"grpc\"\n");
    assert_one(&bad, 5, 12, "pools[0].backends[0].protocol", "openai");
    let bad = format!("{POOL}served_model = \"a/b\"\n");
    assert_one(&bad, 5, 16, "pools[0].backends[0].served_model", "URL path");
}

#[test]
fn placement_is_read_and_checked() {
    let p = parse(&format!(
        "[placement]\nmax_free_fraction = 0.5\nttft_p99_threshold = \"200ms\"\nmax_models_per_gpu = 1\n\
         shared_memory_fraction = 0.6\nstale_after = \"10s\"\non_stale = \"refuse\"\n{POOL}"
    ))
    .unwrap();
    let spec = p.placement.spec();
    assert_eq!(spec.max_free_fraction, 0.5);
    assert_eq!(spec.ttft_p99_threshold, Duration::from_millis(200));
    assert_eq!(spec.max_models_per_gpu, 1);
    assert_eq!(spec.shared_memory_fraction, 0.6);
    assert_eq!(spec.stale_after, Duration::from_secs(10));
    assert_eq!(spec.on_stale, crate::config::OnStale::Refuse);
    let errs = parse(&format!(
        "[placement]\nmax_free_fraction = 0\nshared_memory_fraction = 1.5\nmax_models_per_gpu = 0\n\
         on_stale = \"maybe\"\nstale_after = \"0s\"\nspread = true\n{POOL}"
    ))
    .unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    for key in [
        "max_free_fraction",
        "shared_memory_fraction",
        "max_models_per_gpu",
        "on_stale",
        "stale_after",
        "spread",
    ] {
        let path = format!("placement.{key}");
        assert_eq!(
            paths.iter().filter(|p| **p == path).count(),
            1,
            "{path}: {errs:?}"
        );
    }
}

#[test]
fn placement_service_keys_are_read_and_checked() {
    let p = parse(&format!(
        "[placement]\nlisten = \"127.0.0.1:9443\"\ntls = {{ cert = \"c.pem\", key = \"k.pem\" }}\n\
         agents = [\"http://10.0.0.1:9400/\"]\nagents_dns = [\"fairway-agent.fairway.svc:9400\"]\n\
         poll_interval = \"1s\"\nreservation_ttl = \"5m\"\n{POOL}"
    ))
    .unwrap();
    let pl = &p.placement;
    assert_eq!(pl.listen.to_string(), "127.0.0.1:9443");
    assert_eq!(pl.tls.as_ref().unwrap().cert.to_str(), Some("c.pem"));
    assert_eq!(pl.agents, ["http://10.0.0.1:9400"]);
    assert_eq!(pl.agents_dns, ["fairway-agent.fairway.svc:9400"]);
    assert_eq!(pl.poll_interval, Duration::from_secs(1));
    assert_eq!(pl.reservation_ttl, Duration::from_secs(300));
    let errs = parse(&format!(
        "[placement]\nagents = [\"https://a:1\", \"http://a\", \"http://a:1/x\"]\n\
         agents_dns = [\"svc\", \"svc:0\"]\npoll_interval = \"0s\"\n{POOL}"
    ))
    .unwrap_err();
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "placement.agents[0]",
            "placement.agents[1]",
            "placement.agents[2]",
            "placement.agents_dns[0]",
            "placement.agents_dns[1]",
            "placement.poll_interval"
        ],
        "{errs:?}"
    );
}

#[test]
fn prefix_routing_keys_default_and_are_bounded() {
    let p = parse(POOL).unwrap();
    assert_eq!(p.pools[0].prefix, PrefixSpec::default());
    let src = "[[pools]]\nmodel = \"m\"\nrouting = \"prefix_aware\"\nprefix_block_tokens = 32\nprefix_index_blocks = 1000\nprefix_ttl = \"30s\"\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";
    let p = parse(src).unwrap();
    assert_eq!(p.pools[0].routing, Strategy::PrefixAware);
    assert_eq!(
        p.pools[0].prefix,
        PrefixSpec {
            block_tokens: 32,
            index_blocks: 1000,
            ttl: Duration::from_secs(30),
        }
    );
    let src = "[[pools]]\nmodel = \"m\"\nprefix_block_tokens = 5000\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";
    assert_one(src, 3, 23, "pools[0].prefix_block_tokens", "at most 4096");
    let src = "[[pools]]\nmodel = \"m\"\nprefix_index_blocks = 0\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";
    assert_one(src, 3, 23, "pools[0].prefix_index_blocks", "positive");
}

#[test]
fn kv_events_name_an_engines_publisher_and_need_prefix_routing() {
    let head = "[[pools]]\nmodel = \"m\"\nrouting = \"prefix_aware\"\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";
    let p = parse(&format!("{head}kv_events = \"tcp://10.0.0.5:5557\"\n")).unwrap();
    assert_eq!(
        p.pools[0].backends[0].kv_events,
        Some(KvEventsSource {
            endpoint: "tcp://10.0.0.5:5557".into(),
            replay: None,
            topic: String::new(),
        })
    );
    let p = parse(&format!(
        "{head}kv_events = {{ endpoint = \"tcp://e:5557\", replay = \"tcp://e:5558\", topic = \"kv@a@m\" }}\n"
    ))
    .unwrap();
    let k = p.pools[0].backends[0].kv_events.clone().unwrap();
    assert_eq!(
        (k.replay.as_deref(), k.topic.as_str()),
        (Some("tcp://e:5558"), "kv@a@m")
    );
    // vLLM binds `tcp://*:5557`; Fairway connects and needs the host.
    assert_one(
        &format!("{head}kv_events = \"tcp://*:5557\"\n"),
        6,
        13,
        "pools[0].backends[0].kv_events",
        "name its host",
    );
    assert_one(
        &format!("{head}kv_events = {{ replay = \"tcp://e:1\" }}\n"),
        6,
        13,
        "pools[0].backends[0].kv_events.endpoint",
        "missing required key",
    );
    // Prefix-aware by default; not under another routing.
    let plain = "[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\nkv_events = \"tcp://e:5557\"\n";
    assert!(parse(plain).is_ok());
    let plain = plain.replace(
        "model = \"m\"",
        "model = \"m\"\nrouting = \"least_outstanding\"",
    );
    let errs = errors(&plain);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].message.contains("prefix_aware"), "{errs:#?}");
}

#[test]
fn a_pools_tokenizer_is_loaded_from_files_beside_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("tok");
    std::fs::create_dir_all(&tok).unwrap();
    let tokenizer = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hi":1},"unk_token":"[UNK]"}}"#;
    std::fs::write(tok.join("tokenizer.json"), tokenizer).unwrap();
    std::fs::write(
        tok.join("tokenizer_config.json"),
        r#"{"chat_template":"{% for m in messages %}{{ m.content }} {% endfor %}"}"#,
    )
    .unwrap();
    let write = |text: &str| {
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, text).unwrap();
        p
    };
    let head = "[[pools]]\nmodel = \"m\"\n";
    let tail = "[[pools.backends]]\nurl = \"http://10.0.0.5:8000\"\n";
    let p = write(&format!("{head}tokenizer = \"tok/tokenizer.json\"\n{tail}"));
    let (policy, _) = load_policy(&p).unwrap();
    let t = policy.pools[0].tokenizer.as_ref().unwrap();
    assert_eq!(
        t.config.as_deref(),
        Some(tok.join("tokenizer_config.json").as_path())
    );
    assert!(t.loaded.has_template());
    let ids = t
        .loaded
        .prompt_ids(br#"{"messages":[{"role":"user","content":"hi there"}]}"#)
        .unwrap();
    assert_eq!(ids.ids, vec![1, 0]);
    // A file that is not there: an error at the key, naming it.
    let p = write(&format!("{head}tokenizer = \"tok/nope.json\"\n{tail}"));
    let errs = load_policy(&p).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert_eq!(
        (errs[0].line, errs[0].path.as_str()),
        (3, "pools[0].tokenizer")
    );
    assert!(errs[0].message.contains("nope.json"), "{errs:#?}");
    // A template without a tokenizer.
    let p = write(&format!("{head}chat_template = \"t.jinja\"\n{tail}"));
    let errs = load_policy(&p).unwrap_err();
    assert!(errs[0].message.contains("need `tokenizer`"), "{errs:#?}");
}

#[test]
fn kv_events_true_is_for_a_simulated_backend() {
    let head = "[[pools]]\nmodel = \"m\"\nrouting = \"prefix_aware\"\n[[pools.backends]]\n";
    let p = parse(&format!("{head}sim = {{}}\nkv_events = true\n")).unwrap();
    let k = p.pools[0].backends[0].kv_events.clone().unwrap();
    assert!(k.endpoint.is_empty(), "{k:?}");
    let p = parse(&format!("{head}sim = {{}}\nkv_events = false\n")).unwrap();
    assert_eq!(p.pools[0].backends[0].kv_events, None);
    assert_one(
        &format!("{head}url = \"http://10.0.0.5:8000\"\nkv_events = true\n"),
        6,
        13,
        "pools[0].backends[0].kv_events",
        "simulated backend",
    );
}

/// The README's configuration table names every key the validator reads,
/// section by section (docs/policy.md has each one's meaning).
#[test]
fn the_readme_lists_every_key() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let row = |section: &str| {
        let start = format!("| `{section}` |");
        readme
            .lines()
            .find(|l| l.starts_with(&start))
            .unwrap_or_else(|| panic!("no row for {section} in the README's table"))
            .to_owned()
    };
    for (section, keys) in [
        ("[server]", super::server::SERVER_KEYS),
        ("[poller]", super::POLLER_KEYS),
        ("[queue]", super::QUEUE_KEYS),
        ("[preemption]", super::PREEMPTION_KEYS),
        ("[placement]", super::PLACEMENT_KEYS),
        ("[cluster]", super::cluster::CLUSTER_KEYS),
        ("[[pools]]", super::pools::POOL_KEYS),
        ("[[pools.backends]]", super::pools::BACKEND_KEYS),
        ("[[tenants]]", super::tenants::TENANT_KEYS),
        ("[telemetry]", super::TELEMETRY_KEYS),
        ("[batch]", super::batch::BATCH_KEYS),
    ] {
        let row = row(section);
        // `backends` is the next row's table.
        for key in keys.iter().filter(|k| **k != "backends") {
            assert!(
                row.contains(&format!("`{key}`")) || row.contains(&format!("`{key} ")),
                "the README's {section} row lacks `{key}`: {row}"
            );
        }
    }
    assert!(row("[[tenants]]").contains("`tenant_resources"));
}

#[test]
fn the_shared_batch_store_needs_an_s3_url_and_the_cluster_store() {
    let shared = "[batch]\nobject_store = \"s3://bucket/batches\"\nobject_store_endpoint = \"http://minio:9000\"\n";
    let p = parse(&format!(
        "{POOL}[cluster]\nstore = \"redis://r:6379\"\n{shared}"
    ))
    .unwrap();
    let b = p.batch.unwrap();
    assert_eq!(b.object_store.as_deref(), Some("s3://bucket/batches"));
    assert_eq!(
        b.object_store_endpoint.as_deref(),
        Some("http://minio:9000")
    );
    let errs = errors(&format!("{POOL}{shared}"));
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(
        errs[0].message.contains("add a [cluster] section"),
        "{}",
        errs[0]
    );
    let errs = errors(&format!(
        "{POOL}[cluster]\nstore = \"redis://r:6379\"\n[batch]\nobject_store = \"/var/b\"\nobject_store_endpoint = \"minio:9000\"\n"
    ));
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        errs[0].message.contains("expected s3://bucket[/prefix]"),
        "{}",
        errs[0]
    );
    assert!(
        errs[1].message.contains("not an http:// or https:// URL"),
        "{}",
        errs[1]
    );
}
