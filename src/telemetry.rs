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
        let handle = match builder.install_recorder() {
            Ok(h) => h,
            // Another recorder is installed (an embedding program's): render ours unattached.
            Err(_) => PrometheusBuilder::new().build_recorder().handle(),
        };
        // Histogram samples wait in per-series buffers until upkeep folds them into the
        // buckets; a recorder installed this way gets no upkeep task of its own, and without
        // one nothing but a scrape drains them: an unscraped service grew about 1 MiB a minute
        // at 250 tasks/s. One thread for the process, whatever runtime is (or is not) running.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_secs(5));
            upkeep.run_upkeep();
        });
        if let Err(e) = spawned {
            eprintln!("subagentd: cannot start the metrics upkeep thread: {e}");
        }
        handle
    })
}

/// Every metric family: name, HELP text. (Its type is the macro that records it.)
pub const COUNTERS: &[(&str, &str)] = &[
    ("subagentd_tasks_finished_total", "Tasks that reached a terminal state, by status."),
    ("subagentd_claims_total", "Claim statements that took at least one task."),
    (
        "subagentd_direct_starts_total",
        "Tasks started in the process that accepted them (a waiting request's shortcut).",
    ),
    ("subagentd_rescued_total", "Tasks whose lease expired, by what became of them (queued again, or failed)."),
    ("subagentd_pauses_total", "Runs that paused for a decision or a caller's tool output."),
    ("subagentd_actions_answered_total", "Answers to pending actions, by answer (approve, deny, output)."),
    ("subagentd_budget_refusals_total", "Refusals on a budget, by limit and stage (admission, in_flight)."),
    ("subagentd_budget_waits_total", "Provider calls that waited for others' reservations to settle, by limit."),
    ("subagentd_llm_calls_total", "Provider call attempts, by provider, model and outcome."),
    ("subagentd_llm_retries_total", "Provider call attempts that were retries, by provider and model."),
    ("subagentd_llm_errors_total", "Provider call attempts that failed, by provider, model and HTTP status."),
    (
        "subagentd_model_fallbacks_total",
        "Calls moved to a run's next fallback model, by the model that could not serve it, the next one, and why.",
    ),
    ("subagentd_output_deltas_total", "Live output sent to a running task's subscribers (coalesced deltas)."),
    ("subagentd_tokens_total", "Tokens of provider calls, by model and kind (input, output, cached: read from the cache, cache_write: written to it)."),
    ("subagentd_cost_microusd_total", "Cost of provider calls in millionths of a US dollar, by model."),
    ("subagentd_webhook_attempts_total", "Webhook delivery attempts, by outcome and event."),
    (
        "subagentd_builtin_tool_calls_total",
        "Calls of the built-in tools (web_fetch, web_search), by tool and outcome (ok, error, refused).",
    ),
    ("subagentd_rate_limited_total", "API requests refused with 429 for a tenant's request rate, by tenant."),
    ("subagentd_http_requests_total", "HTTP requests served, by method, route template and status."),
    ("subagentd_write_batches_total", "Group commits made, by kind of write (turn, reserve, events)."),
    ("subagentd_writes_total", "Runs' writes made in group commits, by kind: writes / batches is the mean batch."),
    (
        "subagentd_hold_refusals_total",
        "Streams refused (429) and waits answered at once on this replica because their tenant held its limit, by tenant and limit (max_streams, max_waits).",
    ),
    (
        "subagentd_connections_refused_total",
        "Connections answered 503 at_capacity on this replica because it served its connection cap.",
    ),
    (
        "subagentd_stream_stalls_total",
        "Connections of this replica closed because their client stopped reading for SUBAGENTD_STREAM_STALL_SECONDS.",
    ),
];

pub const GAUGES: &[(&str, &str)] = &[
    (
        "subagentd_tasks",
        "Open tasks across all replicas, by status (scheduled, queued, running, requires_action), read at scrape.",
    ),
    ("subagentd_active_runs", "Sub-agents running in this process now."),
    (
        "subagentd_history_partitions_ahead_days",
        "How many whole days ahead (UTC) every history table has its day partitions, measured at start and hourly.",
    ),
    (
        "subagentd_waiters",
        "Requests of this process waiting for a task to end or pause (wait=true); event streams are not counted here.",
    ),
    ("subagentd_open_streams", "Event streams open on this replica now, by tenant."),
    ("subagentd_open_waits", "Waiting requests held open on this replica now, by tenant."),
    ("subagentd_connections", "Connections this replica serves now."),
    (
        "subagentd_connection_cap",
        "Connections this replica serves at most (the descriptor budget, or SUBAGENTD_MAX_CONNECTIONS).",
    ),
    ("subagentd_budget_waiting", "Queued tasks waiting for their tenant's reservations to settle, read at scrape."),
];

pub const HISTOGRAMS: &[(&str, &str)] = &[
    ("subagentd_queue_wait_seconds", "Time from a task's creation to its first claim."),
    ("subagentd_run_duration_seconds", "Time from a task's first start to its end."),
    ("subagentd_budget_wait_seconds", "Time a task waited for budget before it was woken."),
    ("subagentd_llm_call_duration_seconds", "Provider call latency, by provider, model and outcome."),
    ("subagentd_http_request_duration_seconds", "HTTP request latency, by method and route template."),
    (
        "subagentd_sandbox_slot_wait_seconds",
        "Time a sandboxed command waited for a slot (the process's cap, its tenant's share).",
    ),
    (
        "subagentd_write_queue_seconds",
        "Time a run's write (turn, reserve, events) waited for its group commit to start, by kind.",
    ),
];

/// Describe every family (`# HELP`), and give the counters and histograms whose labels are
/// known ahead a zero series, so that alerts see 0 rather than no data: `models` are the
/// configured (provider, `provider/model`) pairs — each provider also once with an empty model.
pub fn register_metrics(providers: &[String], models: &[(String, String)]) {
    for (name, help) in COUNTERS {
        metrics::describe_counter!(*name, *help);
    }
    for (name, help) in GAUGES {
        metrics::describe_gauge!(*name, *help);
    }
    for (name, help) in HISTOGRAMS {
        metrics::describe_histogram!(*name, metrics::Unit::Seconds, *help);
    }
    let zero = |name: &'static str, labels: &[(&'static str, String)]| {
        let labels: Vec<metrics::Label> = labels.iter().map(|(k, v)| metrics::Label::new(*k, v.clone())).collect();
        metrics::counter!(name, labels).increment(0);
    };
    for status in ["completed", "incomplete", "failed", "cancelled"] {
        zero("subagentd_tasks_finished_total", &[("status", status.into())]);
    }
    for name in ["subagentd_claims_total", "subagentd_direct_starts_total", "subagentd_pauses_total"] {
        zero(name, &[]);
    }
    // (Tenants come and go: the family is there from the start with an empty tenant.)
    zero("subagentd_rate_limited_total", &[("tenant", String::new())]);
    zero(
        "subagentd_model_fallbacks_total",
        &[("from", String::new()), ("to", String::new()), ("reason", String::new())],
    );
    zero("subagentd_output_deltas_total", &[]);
    for tool in crate::kinds::BuiltinTool::ALL {
        for outcome in ["ok", "error", "refused"] {
            zero("subagentd_builtin_tool_calls_total", &[("tool", tool.as_str().into()), ("outcome", outcome.into())]);
        }
    }
    for limit in ["max_streams", "max_waits"] {
        zero("subagentd_hold_refusals_total", &[("tenant", String::new()), ("limit", limit.into())]);
    }
    for name in ["subagentd_connections_refused_total", "subagentd_stream_stalls_total"] {
        zero(name, &[]);
    }
    for name in ["subagentd_open_streams", "subagentd_open_waits"] {
        metrics::gauge!(name, "tenant" => "").set(0.0);
    }
    for to in ["queued", "failed"] {
        zero("subagentd_rescued_total", &[("to", to.into())]);
    }
    for answer in ["approve", "deny", "output"] {
        zero("subagentd_actions_answered_total", &[("answer", answer.into())]);
    }
    for limit in ["usd_per_day", "usd_per_month", "tokens_per_day"] {
        zero("subagentd_budget_waits_total", &[("limit", limit.into())]);
        for stage in ["admission", "in_flight"] {
            zero("subagentd_budget_refusals_total", &[("limit", limit.into()), ("stage", stage.into())]);
        }
    }
    for event in crate::kinds::WebhookEvent::ALL {
        for outcome in ["delivered", "failed"] {
            zero("subagentd_webhook_attempts_total", &[("outcome", outcome.into()), ("event", event.as_str().into())]);
        }
    }
    let pairs = providers.iter().map(|p| (p.clone(), String::new())).chain(models.iter().cloned());
    for (provider, model) in pairs {
        let pm = [("provider", provider.clone()), ("model", model.clone())];
        zero("subagentd_llm_calls_total", &[pm[0].clone(), pm[1].clone(), ("outcome", "ok".into())]);
        zero("subagentd_llm_retries_total", &pm);
        zero("subagentd_llm_errors_total", &[pm[0].clone(), pm[1].clone(), ("http_status", "none".into())]);
        for kind in ["input", "output", "cached", "cache_write"] {
            zero("subagentd_tokens_total", &[("model", model.clone()), ("kind", kind.into())]);
        }
        zero("subagentd_cost_microusd_total", &[("model", model.clone())]);
    }
    for name in [
        "subagentd_queue_wait_seconds",
        "subagentd_run_duration_seconds",
        "subagentd_budget_wait_seconds",
        "subagentd_sandbox_slot_wait_seconds",
    ] {
        let _ = metrics::histogram!(name);
    }
    for kind in ["turn", "reserve", "events"] {
        zero("subagentd_write_batches_total", &[("kind", kind.into())]);
        zero("subagentd_writes_total", &[("kind", kind.into())]);
        let _ = metrics::histogram!("subagentd_write_queue_seconds", "kind" => kind);
    }
    for provider in providers.iter().cloned().chain(models.iter().map(|m| m.0.clone())) {
        let _ = metrics::histogram!("subagentd_llm_call_duration_seconds", "provider" => provider, "model" => "", "outcome" => "ok");
    }
    for name in ["subagentd_active_runs", "subagentd_waiters", "subagentd_budget_waiting", "subagentd_connections"] {
        metrics::gauge!(name).set(0.0);
    }
}

/// Whether the text logs are coloured: only on a terminal (a file or a log collector would keep
/// the escape codes), and never with `NO_COLOR` set to anything but "" (no-color.org).
pub fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
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
        use std::io::IsTerminal;
        let ansi = colour(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
        tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr).with_filter(filter).boxed()
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

/// A new trace, sampled: for a task submitted without a caller's trace, so that it has one.
pub fn new_traceparent() -> String {
    use rand::RngCore;
    let (mut t, mut s) = ([0u8; 16], [0u8; 8]);
    rand::thread_rng().fill_bytes(&mut t);
    rand::thread_rng().fill_bytes(&mut s);
    t[0] |= 1; // never all zeros
    s[0] |= 1;
    format!("00-{}-{}-01", hex::encode(t), hex::encode(s))
}

/// Mark `span` failed, the way trace backends find failures: status ERROR with `description`,
/// and `error.type` (OpenTelemetry's semantic conventions).
pub fn span_error(span: &tracing::Span, error_type: &str, description: &str) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    span.set_attribute("error.type", error_type.to_string());
    span.set_status(opentelemetry::trace::Status::error(description.to_string()));
}

/// A string-list attribute (tracing's fields cannot carry lists).
pub fn span_strings(span: &tracing::Span, key: &'static str, values: &[&str]) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let list: Vec<opentelemetry::StringValue> = values.iter().map(|v| v.to_string().into()).collect();
    span.set_attribute(key, opentelemetry::Value::Array(list.into()));
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
    fn logs_are_coloured_only_on_a_terminal_and_never_with_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(!colour(false, None), "a pipe or a file gets no escape codes");
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(colour(true, Some(OsStr::new(""))), "an empty NO_COLOR is as if unset");
    }

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
        let fresh = new_traceparent();
        assert_eq!(parse_traceparent(&fresh).as_deref(), Some(fresh.as_str()));
        assert_ne!(trace_id(&fresh), trace_id(&new_traceparent()));
    }
}
