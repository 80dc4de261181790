//! Traces: a request's spans reach a local OTLP/HTTP (protobuf) receiver,
//! joined to the caller's trace and sampled as the caller decided, carrying
//! the tenant; the backend receives a `traceparent` whose parent is the
//! gateway's upstream span.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use support::*;

const COMPLETION: &str = r#"{"id":"c1","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}"#;

/// Every span the collector received, decoded from OTLP/HTTP protobuf.
fn exported_spans(exported: &Seen) -> Vec<Span> {
    exported
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(headers, body)| {
            assert_eq!(headers["content-type"], "application/x-protobuf");
            let req = ExportTraceServiceRequest::decode(body.as_ref()).expect("OTLP protobuf");
            req.resource_spans
                .into_iter()
                .flat_map(|rs| {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| string_value(a.value.as_ref()));
                    assert_eq!(service.as_deref(), Some("fairway-test"));
                    rs.scope_spans.into_iter().flat_map(|ss| ss.spans)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn string_value(v: Option<&AnyValue>) -> Option<String> {
    match v?.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(i) => Some(i.to_string()),
        _ => None,
    }
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| string_value(a.value.as_ref()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn traced_policy(
    collector: std::net::SocketAddr,
    backend: std::net::SocketAddr,
    extra: &str,
) -> String {
    format!(
        r#"{SERVER}
[telemetry]
otlp_endpoint = "http://{collector}"
service_name = "fairway-test"
{extra}

[[pools]]
model = "m"
[[pools.backends]]
url = "http://{backend}"
metrics = "none"

[[tenants]]
name = "api"
api_keys = ["k-api"]
"#
    )
}

/// The traceparent the backend received with each inference request.
fn backend_traceparents(received: &Seen) -> Vec<String> {
    received
        .lock()
        .unwrap()
        .iter()
        .filter(|(h, _)| h.contains_key("content-length"))
        .map(|(h, _)| h["traceparent"].to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn spans_reach_the_collector_and_the_backend_gets_traceparent() {
    let (collector, exported) = recorder("").await;
    let (backend, received) = recorder(COMPLETION).await;
    let gw = gateway(&traced_policy(collector, backend, ""), &[]).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let mut req = post(
        gw.addr(),
        "/v1/chat/completions",
        Some("k-api"),
        chat("m", 4, false),
    );
    let h = req.headers_mut();
    h.insert(
        "traceparent",
        format!("00-{trace}-{caller_span}-01").parse().unwrap(),
    );
    h.insert("tracestate", "vendor=opaque".parse().unwrap());
    h.insert("x-request-id", "trace-req-1".parse().unwrap());
    let r = send(&client(), req).await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Shutdown flushes the batch.
    gw.shutdown().await;

    let spans = exported_spans(&exported);
    let by_name = |n: &str| {
        spans
            .iter()
            .find(|s| s.name == n)
            .unwrap_or_else(|| panic!("no span {n} in {spans:#?}"))
    };
    let root = by_name("fairway.request");
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == trace),
        "{spans:#?}"
    );
    assert_eq!(hex(&root.parent_span_id), caller_span);
    assert_eq!(root.kind, 2, "server span");
    assert_eq!(attr(root, "fairway.tenant").as_deref(), Some("api"));
    assert_eq!(attr(root, "fairway.model").as_deref(), Some("m"));
    assert_eq!(attr(root, "fairway.outcome").as_deref(), Some("served"));
    assert_eq!(
        attr(root, "fairway.request_id").as_deref(),
        Some("trace-req-1")
    );
    assert_eq!(
        attr(root, "http.response.status_code").as_deref(),
        Some("200")
    );
    for child in [
        "fairway.admission",
        "fairway.queue",
        "fairway.upstream",
        "fairway.stream",
    ] {
        let c = by_name(child);
        assert_eq!(c.parent_span_id, root.span_id, "{child}");
        assert!(
            c.start_time_unix_nano >= root.start_time_unix_nano,
            "{child}"
        );
        assert!(c.end_time_unix_nano <= root.end_time_unix_nano, "{child}");
    }
    let stream = by_name("fairway.stream");
    assert_eq!(
        attr(stream, "gen_ai.usage.output_tokens").as_deref(),
        Some("1")
    );
    // The backend's parent is the upstream span, in the caller's trace,
    // sampled; the caller's tracestate goes along.
    let upstream = by_name("fairway.upstream");
    assert_eq!(upstream.kind, 3, "client span");
    assert_eq!(
        backend_traceparents(&received),
        [format!("00-{trace}-{}-01", hex(&upstream.span_id))]
    );
    let seen = received.lock().unwrap();
    let (h, _) = seen
        .iter()
        .find(|(h, _)| h.contains_key("content-length"))
        .unwrap();
    assert_eq!(h["tracestate"], "vendor=opaque");
}

#[tokio::test]
async fn the_callers_sampled_flag_decides_and_the_ratio_governs_new_traces() {
    let (collector, exported) = recorder("").await;
    let (backend, received) = recorder(COMPLETION).await;
    let gw = gateway(
        &traced_policy(collector, backend, "sample_ratio = 0.0"),
        &[],
    )
    .await;
    let c = client();
    let send_with = async |traceparent: Option<&str>| {
        let mut req = post(
            gw.addr(),
            "/v1/chat/completions",
            Some("k-api"),
            chat("m", 4, false),
        );
        if let Some(tp) = traceparent {
            req.headers_mut().insert("traceparent", tp.parse().unwrap());
        }
        assert_eq!(send(&c, req).await.status, 200);
    };
    let sampled = "11111111111111111111111111111111";
    let unsampled = "22222222222222222222222222222222";
    // A new trace (ratio 0: dropped), a sampled caller (kept), an
    // unsampled caller (dropped).
    send_with(None).await;
    send_with(Some(&format!("00-{sampled}-00f067aa0ba902b7-01"))).await;
    send_with(Some(&format!("00-{unsampled}-00f067aa0ba902b7-00"))).await;
    gw.shutdown().await;

    let traces: std::collections::BTreeSet<String> = exported_spans(&exported)
        .iter()
        .map(|s| hex(&s.trace_id))
        .collect();
    assert_eq!(traces.into_iter().collect::<Vec<_>>(), [sampled]);
    // The backend still joins each trace, with the caller's decision.
    let tps = backend_traceparents(&received);
    assert_eq!(tps.len(), 3);
    assert!(tps[0].ends_with("-00"), "{tps:?}");
    assert!(
        tps[1].starts_with(&format!("00-{sampled}-")) && tps[1].ends_with("-01"),
        "{tps:?}"
    );
    assert!(
        tps[2].starts_with(&format!("00-{unsampled}-")) && tps[2].ends_with("-00"),
        "{tps:?}"
    );
}

#[tokio::test]
async fn without_an_endpoint_the_client_traceparent_passes_through_untouched() {
    let (backend, received) = recorder(COMPLETION).await;
    let text = format!(
        "{SERVER}\n[[pools]]\nmodel = \"m\"\n[[pools.backends]]\nurl = \"http://{backend}\"\nmetrics = \"none\"\n"
    );
    let gw = gateway(&text, &[]).await;
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let mut req = post(gw.addr(), "/v1/chat/completions", None, chat("m", 4, false));
    req.headers_mut().insert("traceparent", tp.parse().unwrap());
    assert_eq!(send(&client(), req).await.status, 200);
    let seen = received.lock().unwrap();
    let posts: Vec<_> = seen
        .iter()
        .filter(|(h, _)| h.contains_key("content-length"))
        .collect();
    assert_eq!(posts.last().unwrap().0["traceparent"], tp);
}
