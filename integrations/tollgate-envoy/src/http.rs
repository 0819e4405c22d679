//! Upstream's HTTP endpoints: `/json` (a `RateLimitRequest` in proto3 JSON in, the
//! `RateLimitResponse` out; 200 when OK, 429 when over the limit, 400 `Bad Request` for a body
//! or request it cannot take) and `/healthcheck` (200 `OK`).

use std::convert::Infallible;
use std::future::Future;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::{Request as HttpRequest, Response as HttpResponse, StatusCode};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;

use crate::config::{Metadata, Unit};
use crate::grpc::{self, Service};
use crate::service::{Code, Request, RequestDescriptor, RequestError, Response};
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;

/// The largest `/json` body read (upstream reads any): 4 MiB, gRPC's default message size.
const MAX_BODY: usize = 4 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: u32,
    #[serde(default)]
    unit: Option<Value>,
}

/// A `/json` body as a request, or why it is not one.
pub(crate) fn parse(body: &[u8]) -> Result<Request, String> {
    let r: JsonRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let descriptors = r
        .descriptors
        .into_iter()
        .map(|d| {
            let hits_addend = match d.hits_addend {
                None | Some(Value::Null) => None,
                // proto3 JSON writes a UInt64Value as a string or a number.
                Some(Value::Number(n)) => Some(n.as_u64().ok_or("hitsAddend: not a uint64")?),
                Some(Value::String(s)) => Some(s.parse::<u64>().map_err(|_| "hitsAddend: not a uint64")?),
                Some(_) => return Err("hitsAddend: not a uint64".to_owned()),
            };
            let limit = match d.limit {
                None => None,
                Some(l) => Some((l.requests_per_unit, override_unit(l.unit.as_ref())?)),
            };
            Ok(RequestDescriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Request { domain: r.domain, descriptors, hits_addend: r.hits_addend })
}

/// `envoy.type.v3.RateLimitUnit` by name or number (`None`: UNKNOWN), read as the gRPC
/// request's is.
fn override_unit(unit: Option<&Value>) -> Result<Option<Unit>, String> {
    use grpc::WEEK;
    let known = match unit {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(name)) if name == "WEEK" => Some(WEEK),
        Some(Value::String(name)) => RateLimitUnit::from_str_name(name).map(|u| u as i32),
        Some(Value::Number(n)) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|&n| n == WEEK || RateLimitUnit::try_from(n).is_ok()),
        Some(_) => None,
    };
    let unit = unit.map_or_else(String::new, Value::to_string);
    known.map(grpc::override_unit).ok_or_else(|| format!("limit.unit: {unit} is not a RateLimitUnit"))
}

fn code_name(c: Code) -> &'static str {
    match c {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// A response in proto3 JSON, as upstream writes it: lowerCamelCase, enums by name, zero
/// values left out, durations as `"58s"`.
pub(crate) fn to_json(r: &Response) -> Value {
    let statuses: Vec<Value> = r
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            o.insert("code".into(), json!(code_name(s.code)));
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), json!(l.name));
                }
                if l.requests_per_unit != 0 {
                    limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                }
                limit.insert("unit".into(), json!(l.unit.name()));
                o.insert("currentLimit".into(), Value::Object(limit));
            }
            if s.limit_remaining != 0 {
                o.insert("limitRemaining".into(), json!(s.limit_remaining));
            }
            if let Some(d) = s.duration_until_reset {
                o.insert("durationUntilReset".into(), json!(format!("{}s", d.as_secs())));
            }
            Value::Object(o)
        })
        .collect();
    let mut o = Map::new();
    o.insert("overallCode".into(), json!(code_name(r.overall_code)));
    if !statuses.is_empty() {
        o.insert("statuses".into(), Value::Array(statuses));
    }
    if !r.headers.is_empty() {
        let headers = r.headers.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
        o.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(m) = &r.dynamic_metadata {
        o.insert("dynamicMetadata".into(), json_value(m));
    }
    Value::Object(o)
}

/// A metadata value in proto3 JSON (a `google.protobuf.Value` is its plain JSON).
fn json_value(m: &Metadata) -> Value {
    match m {
        Metadata::Null => Value::Null,
        Metadata::Bool(b) => json!(b),
        Metadata::Number(n) => json!(n),
        Metadata::String(s) => json!(s),
        Metadata::List(items) => Value::Array(items.iter().map(json_value).collect()),
        Metadata::Struct(fields) => {
            Value::Object(fields.iter().map(|(k, v)| (k.clone(), json_value(v))).collect())
        }
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> HttpResponse<Full<Bytes>> {
    let mut r = HttpResponse::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// One HTTP request to the service's endpoints.
async fn handle(
    service: Service,
    req: HttpRequest<Incoming>,
) -> Result<HttpResponse<Full<Bytes>>, Infallible> {
    match req.uri().path() {
        "/healthcheck" => Ok(text(StatusCode::OK, "OK")),
        "/json" => {
            let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => return Ok(text(StatusCode::BAD_REQUEST, "Bad Request\n")),
            };
            let Ok(request) = parse(&body) else { return Ok(text(StatusCode::BAD_REQUEST, "Bad Request\n")) };
            let response = match service.limits().should_rate_limit_async(&request).await {
                Ok(response) => response,
                Err(e @ RequestError::Unavailable(_)) => {
                    return Ok(text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")))
                }
                Err(_) => return Ok(text(StatusCode::BAD_REQUEST, "Bad Request\n")),
            };
            let status = match response.overall_code {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            let mut r = HttpResponse::new(Full::new(Bytes::from(to_json(&response).to_string())));
            *r.status_mut() = status;
            r.headers_mut()
                .insert("content-type", hyper::header::HeaderValue::from_static("application/json"));
            Ok(r)
        }
        _ => Ok(text(StatusCode::NOT_FOUND, "404 page not found\n")),
    }
}

impl Service {
    /// Serves `/json` and `/healthcheck` over HTTP/1.1 on `listener` until `shutdown`
    /// completes (connections already open finish their request).
    pub async fn serve_http(&self, listener: TcpListener, shutdown: impl Future<Output = ()> + Send) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(_) => continue,
                },
                () = &mut shutdown => return,
            };
            // Answers go out at once, not after the client's delayed ACK.
            let _ = stream.set_nodelay(true);
            let service = self.clone();
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let svc = hyper::service::service_fn(move |req| handle(service.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proto3_json_in_both_spellings() {
        let r = parse(br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":"3","limit":{"requestsPerUnit":5,"unit":"HOUR"}}],"hitsAddend":2}"#).unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries, [("k".to_owned(), "v".to_owned())]);
        assert_eq!(r.descriptors[0].hits_addend, Some(3));
        assert_eq!(r.descriptors[0].limit, Some((5, Some(Unit::Hour))));
        assert!(parse(br#"{"domain":"d","surprise":1}"#).is_err());
        assert!(parse(b"").is_err());
        assert_eq!(
            parse(br#"{"descriptors":[{"limit":{"unit":"WEEK"}}]}"#).unwrap().descriptors[0].limit,
            Some((0, Some(Unit::Week)))
        );
        assert!(parse(br#"{"descriptors":[{"limit":{"unit":"FORTNIGHT"}}]}"#).is_err());
        assert!(parse(br#"{"descriptors":[{"limit":{"unit":8}}]}"#).is_err());
        assert_eq!(
            parse(br#"{"descriptors":[{"limit":{"unit":0}}]}"#).unwrap().descriptors[0].limit,
            Some((0, None))
        );
    }
}
