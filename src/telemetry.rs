//! Logging and tracing setup (text or JSON logs, optional OTLP export of spans), Prometheus
//! metrics (the `metrics` facade with its Prometheus exporter) and W3C trace context helpers.
//!
//! A leaf: imports nothing of this crate.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process-wide recorder, installed on first use.
pub fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let buckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
        let builder = PrometheusBuilder::new().set_buckets(&buckets).unwrap_or_else(|_| PrometheusBuilder::new());
        match builder.install_recorder() {
            Ok(h) => h,
            // Another recorder is installed (an embedding program's): render ours unattached.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        }
    })
}

/// Install the tracing subscriber: logs to stderr (`text` or `json`; JSON lines carry the
/// fields of their span — task_id, attempt, trace_id), and, when `otlp` is set, an OpenTelemetry
/// layer exporting spans over OTLP/HTTP to `<otlp>/v1/traces`. Returns the provider to flush
/// at exit.
pub fn init_tracing(
    format: &str,
    otlp: Option<&str>,
) -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    // RUST_LOG filters the logs; exported spans are the service's own, at info and above.
    let fmt: Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync> = if format == "json" {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter).boxed()
    };
    let (otel, provider) = match otlp {
        Some(base) => {
            let endpoint = if base.ends_with("/v1/traces") {
                base.to_string()
            } else {
                format!("{}/v1/traces", base.trim_end_matches('/'))
            };
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| format!("OTLP exporter: {e}"))?;
            let resource = opentelemetry_sdk::Resource::builder().with_service_name("subagentd").build();
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource)
                .build();
            let tracer = provider.tracer("subagentd");
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(tracing_subscriber::EnvFilter::new("subagentd=info"));
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    tracing_subscriber::registry().with(fmt).with(otel).try_init().map_err(|e| e.to_string())?;
    Ok(provider)
}

/// Make `span` a child of the W3C trace context `traceparent` (for OTLP export).
pub fn continue_trace(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::propagation::TextMapPropagator;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let carrier: std::collections::HashMap<String, String> =
        [("traceparent".to_string(), traceparent.to_string())].into();
    let cx = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}

/// A valid `traceparent` (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`), lower-cased.
pub fn parse_traceparent(v: &str) -> Option<String> {
    let v = v.trim().to_ascii_lowercase();
    let parts: Vec<&str> = v.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    let ok = parts.len() == 4
        && hex(parts[0], 2)
        && parts[0] != "ff"
        && hex(parts[1], 32)
        && parts[1] != "0".repeat(32)
        && hex(parts[2], 16)
        && parts[2] != "0".repeat(16)
        && hex(parts[3], 2);
    ok.then_some(v)
}

pub fn trace_id(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).unwrap_or("")
}

/// The same trace, a new span: what an outbound call carries.
pub fn child(traceparent: &str) -> String {
    use rand::RngCore;
    let mut b = [0u8; 8];
    rand::thread_rng().fill_bytes(&mut b);
    let flags = traceparent.split('-').nth(3).unwrap_or("01");
    format!("00-{}-{}-{flags}", trace_id(traceparent), hex::encode(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_validated_and_children_keep_the_trace() {
        let tp = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        let p = parse_traceparent(tp).unwrap();
        assert_eq!(trace_id(&p), "4bf92f3577b34da6a3ce929d0e0e4736");
        let c = child(&p);
        assert_eq!(trace_id(&c), trace_id(&p));
        assert_ne!(c, p);
        assert!(parse_traceparent(&c).is_some());
        assert!(parse_traceparent("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none());
        assert!(parse_traceparent("garbage").is_none());
    }
}
