use std::fmt::Write as _;

use proptest::prelude::{
    Just, ProptestConfig, Strategy, any, prop_assert, prop_assert_eq, prop_oneof, proptest,
};

use super::*;
use crate::config::policy::MetricsDialect;
use crate::core::time::Instant;
use crate::poller::dialect::Decoder;

fn one(line: &str) -> Sample {
    let expo = parse_strict(line).unwrap();
    assert_eq!(expo.samples.len(), 1, "{line:?}");
    expo.samples.into_iter().next().unwrap()
}

fn kind(line: &str) -> ErrorKind {
    parse_strict(line).unwrap_err().kind
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn names_with_colons_and_labels() {
    let s = one(r#"vllm:num_requests_running{engine="0",model_name="m"} 14.0"#);
    assert_eq!(s.name, "vllm:num_requests_running");
    assert_eq!(s.labels, labels(&[("engine", "0"), ("model_name", "m")]));
    assert_eq!(s.value, 14.0);
    assert_eq!(s.timestamp, None);
    assert_eq!(s.label("engine"), Some("0"));
    assert_eq!(s.label("nope"), None);
}

#[test]
fn no_labels_empty_labels_trailing_comma_and_blanks() {
    assert_eq!(one("up 1").labels, vec![]);
    assert_eq!(one("up{} 1").labels, vec![]);
    assert_eq!(one(r#"up{a="b",} 1"#).labels, labels(&[("a", "b")]));
    assert_eq!(
        one("  up { a = \"b\" ,\tc=\"d\" , }\t 2 ").labels,
        labels(&[("a", "b"), ("c", "d")])
    );
}

#[test]
fn escapes_in_label_values() {
    let s = one(r#"x{path="C:\\dir",q="say \"hi\"",nl="a\nb",brace="}{,="} 1"#);
    assert_eq!(s.label("path"), Some(r"C:\dir"));
    assert_eq!(s.label("q"), Some(r#"say "hi""#));
    assert_eq!(s.label("nl"), Some("a\nb"));
    assert_eq!(s.label("brace"), Some("}{,="));
    assert_eq!(kind(r#"x{a="\t"} 1"#), ErrorKind::BadEscape);
    assert_eq!(kind(r#"x{a="open} 1"#), ErrorKind::Unterminated);
    assert_eq!(kind(r#"x{a="\"#), ErrorKind::Unterminated);
}

#[test]
fn special_values_and_number_forms() {
    assert!(one("x NaN").value.is_nan());
    assert_eq!(one("x +Inf").value, f64::INFINITY);
    assert_eq!(one("x -Inf").value, f64::NEG_INFINITY);
    assert_eq!(one("x 8.128902e+06").value, 8_128_902.0);
    assert_eq!(one("x -0.5").value, -0.5);
    assert_eq!(one("x 1e-3").value, 0.001);
    assert_eq!(kind("x abc"), ErrorKind::BadValue);
    assert_eq!(kind("x"), ErrorKind::MissingValue);
    assert_eq!(kind("x{}"), ErrorKind::MissingValue);
}

#[test]
fn timestamps_and_exemplars() {
    assert_eq!(one("x 1 1700000000000").timestamp, Some(1.7e12));
    assert_eq!(one("x 1 1700000000.25").timestamp, Some(1_700_000_000.25));
    let s = one(r#"foo_bucket{le="0.5"} 8 # {trace_id="abc"} 0.43 1700000000.1"#);
    assert_eq!((s.value, s.timestamp), (8.0, None));
    let s = one(r#"foo_bucket{le="0.5"} 8 123 # {trace_id="abc"} 0.43"#);
    assert_eq!((s.value, s.timestamp), (8.0, Some(123.0)));
    assert_eq!(kind("x 1 NaN"), ErrorKind::BadTimestamp);
    assert_eq!(kind("x 1 2 3"), ErrorKind::TrailingText);
}

#[test]
fn quoted_utf8_names() {
    let s = one(r#"{"my.metric", "a.label"="v", b="w"} 1"#);
    assert_eq!(s.name, "my.metric");
    assert_eq!(s.labels, labels(&[("a.label", "v"), ("b", "w")]));
    assert_eq!(kind(r#"x{"also.name"} 1"#), ErrorKind::BadLabels);
    assert_eq!(kind(r#"{a="b", "late.name"} 1"#), ErrorKind::BadLabels);
    assert_eq!(kind(r#"{a="b"} 1"#), ErrorKind::MissingName);
    assert_eq!(kind(r#"{""} 1"#), ErrorKind::BadLabels);
}

#[test]
fn malformed_label_sets() {
    for line in [
        "x{a} 1",
        "x{a=b} 1",
        "x{,} 1",
        "x{a=\"b\"\"c\"} 1",
        "x{a=\"b\" 1",
        "x{9a=\"b\"} 1",
        "x{a:b=\"c\"} 1",
    ] {
        assert!(parse_strict(line).is_err(), "{line:?}");
    }
    assert_eq!(kind("9x 1"), ErrorKind::MissingName);
}

#[test]
fn help_type_comments_eof_and_crlf() {
    let text = "# HELP vllm:x Some \\n help.\r\n\
                # TYPE vllm:x gauge\r\n\
                #  a comment\r\n\
                #\r\n\
                \r\n\
                vllm:x{engine=\"0\"} 1\r\n\
                # TYPE h histogram\n\
                # UNIT h seconds\n\
                h_bucket{le=\"+Inf\"} 3\n\
                # EOF\n\
                this is ignored\n";
    let expo = parse_strict(text).unwrap();
    assert_eq!(expo.samples.len(), 2);
    assert_eq!(expo.samples[0].labels, labels(&[("engine", "0")]));
    assert_eq!(expo.metric_type("vllm:x"), Some(MetricType::Gauge));
    assert_eq!(expo.metric_type("h"), Some(MetricType::Histogram));
    assert!(expo.eof);
    assert_eq!(expo.malformed, 0);
    assert_eq!(kind("# TYPE x bogus"), ErrorKind::BadType);
    assert_eq!(kind("# TYPE x"), ErrorKind::BadType);
    assert_eq!(kind("# HELP"), ErrorKind::BadHelp);
    assert_eq!(
        parse_strict("# TYPE \"a.b\" unknown").unwrap().types,
        vec![("a.b".to_string(), MetricType::Untyped)]
    );
}

#[test]
fn lenient_parse_skips_and_counts_bad_lines() {
    let text = "good 1\nbad{ 2\nalso bad\ngood2 3\n";
    let expo = parse(text).unwrap();
    assert_eq!(expo.samples.len(), 2);
    assert_eq!(expo.malformed, 2);
    assert_eq!(
        expo.first_error,
        Some(ParseError {
            line: 2,
            kind: ErrorKind::BadLabels
        })
    );
    assert_eq!(parse_strict(text).unwrap_err().line, 2);
}

#[test]
fn garbage_is_an_error_and_empty_is_not() {
    assert!(parse("<html><body>502 Bad Gateway</body></html>").is_err());
    assert!(parse("{\"kv_usage\": 0.5}").is_err());
    assert!(parse("\u{0}\u{1}\u{fffd}").is_err());
    assert_eq!(parse("").unwrap(), Exposition::default());
    assert!(parse("# just a comment\n\n").unwrap().samples.is_empty());
}

/// A realistic multi-dialect scrape used as the seed for mutation fuzzing.
pub(crate) const REALISTIC: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 14.0
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.8125
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7562e+09
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 120.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="m"} 138.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 140.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 140.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 9.83
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="27418"} 1.0
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"} 0.5
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
nv_gpu_memory_used_bytes{gpu_uuid="GPU-3c1f"} 7.2e+10
sglang:token_usage{model_name="m"} 0.25
llamacpp:requests_processing 2
foo_bucket{le="0.5"} 8 # {trace_id="abc"} 0.43 1700000000.1
x{path="C:\\dir",q="say \"hi\"",} NaN 1700000000000
# EOF
"#;

/// Characters that matter to the grammar, to make mutations bite.
fn interesting_char() -> impl Strategy<Value = char> {
    prop_oneof![
        any::<char>(),
        proptest::sample::select(vec![
            '{', '}', '"', ',', '=', '\\', '#', '\n', '\r', ' ', '\t', '+', '-', 'e', '.', ':',
            '_', 'I', 'N', '0', '9', 'é', '\u{0}',
        ]),
    ]
}

/// An edit: (position, character, operation 0 insert / 1 delete / 2 replace).
fn mutate(text: &str, edits: &[(usize, char, u8)]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for &(pos, c, op) in edits {
        if chars.is_empty() {
            chars.push(c);
            continue;
        }
        let i = pos % chars.len();
        match op {
            0 => chars.insert(i, c),
            1 => {
                chars.remove(i);
            }
            _ => chars[i] = c,
        }
    }
    chars.into_iter().collect()
}

fn exercise(text: &str) {
    let lenient = parse(text);
    let strict = parse_strict(text);
    if let Ok(strict) = &strict {
        assert_eq!(strict.malformed, 0);
        if !strict.samples.is_empty() {
            let lenient = lenient.as_ref().unwrap();
            assert_eq!(lenient.samples.len(), strict.samples.len());
        }
    }
    for dialect in [
        MetricsDialect::Vllm,
        MetricsDialect::Triton,
        MetricsDialect::Sglang,
        MetricsDialect::Llamacpp,
        MetricsDialect::Agent,
        MetricsDialect::None,
    ] {
        let mut d = Decoder::new(dialect);
        let _ = d.decode(text, Instant::ZERO);
        let _ = d.decode(text, Instant::from_nanos(1));
    }
}

fn is_legacy_name(s: &str, colons: bool) -> bool {
    let mut bytes = s.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || (colons && b == b':'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || (colons && b == b':'))
}

fn escape(s: &str) -> String {
    s.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
}

fn render_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v:?}")
    }
}

/// Renders samples as exposition text, with comments and the given line end.
fn render(samples: &[Sample], crlf: bool) -> String {
    let end = if crlf { "\r\n" } else { "\n" };
    let mut out = String::new();
    for s in samples {
        let _ = write!(out, "# HELP x doc{end}{end}");
        let mut items = Vec::new();
        if is_legacy_name(&s.name, true) {
            out.push_str(&s.name);
        } else {
            items.push(format!("\"{}\"", escape(&s.name)));
        }
        for (k, v) in &s.labels {
            let key = if is_legacy_name(k, false) {
                k.clone()
            } else {
                format!("\"{}\"", escape(k))
            };
            items.push(format!("{key}=\"{}\"", escape(v)));
        }
        if !items.is_empty() {
            let _ = write!(out, "{{{}}}", items.join(","));
        }
        let _ = write!(out, " {}", render_float(s.value));
        if let Some(ts) = s.timestamp {
            let _ = write!(out, " {}", ts as i64);
        }
        out.push_str(end);
    }
    out
}

fn same(a: &Sample, b: &Sample) -> bool {
    a.name == b.name
        && a.labels == b.labels
        && a.timestamp == b.timestamp
        && (a.value == b.value || (a.value.is_nan() && b.value.is_nan()))
}

fn name_strategy(colons: bool) -> impl Strategy<Value = String> {
    let legacy = if colons {
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,20}"
    } else {
        "[a-zA-Z_][a-zA-Z0-9_]{0,12}"
    };
    prop_oneof![
        3 => proptest::string::string_regex(legacy).unwrap(),
        1 => any::<String>().prop_filter("non-empty", |s| !s.is_empty()),
    ]
}

fn sample_strategy() -> impl Strategy<Value = Sample> {
    let value = prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (0u32..1000).prop_map(f64::from),
    ];
    (
        name_strategy(true),
        proptest::collection::vec((name_strategy(false), any::<String>()), 0..4),
        value,
        proptest::option::of(any::<i64>()),
    )
        .prop_map(|(name, labels, value, ts)| Sample {
            name,
            labels,
            value,
            timestamp: ts.map(|t| t as f64),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        exercise(&text);
    }

    #[test]
    fn line_shaped_strings_never_panic(text in "[a-z_:{}\",=\\\\# \\-+.0-9eEINaf\\n\\r]{0,200}") {
        exercise(&text);
    }

    #[test]
    fn mutated_realistic_text_never_panics(
        edits in proptest::collection::vec((any::<usize>(), interesting_char(), 0u8..3), 0..24)
    ) {
        exercise(&mutate(REALISTIC, &edits));
    }

    #[test]
    fn rendered_samples_parse_back_equal(
        samples in proptest::collection::vec(sample_strategy(), 0..8),
        crlf in any::<bool>(),
    ) {
        let text = render(&samples, crlf);
        let expo = parse_strict(&text);
        prop_assert!(expo.is_ok(), "{:?}\n{}", expo, text);
        let expo = expo.unwrap();
        prop_assert_eq!(expo.samples.len(), samples.len());
        for (got, want) in expo.samples.iter().zip(&samples) {
            prop_assert!(same(got, want), "{:?} != {:?}\n{}", got, want, text);
        }
    }
}

#[test]
fn realistic_text_parses_without_errors() {
    let expo = parse_strict(REALISTIC).unwrap();
    assert_eq!(expo.samples.len(), 17);
    assert!(expo.eof);
}
